"""The pure decisions of one scale-up (gpuscale.core.reconcile.scaleup): the gate, the launch orders of a plan, what
a launch outcome means, the re-plan bound, effective pools and minNodes; a property test over random observations
with the real planner."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscale.core.model import (
    CapacityType,
    Catalog,
    InstanceType,
    Node,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
    PoolLimits,
    Snapshot,
)
from gpuscale.core.plan import Blocked, BlockReason, Launch, PlannerConfig, ScaleUpPlan
from gpuscale.core.planner import plan
from gpuscale.core.reconcile import Outcome
from gpuscale.core.reconcile.scaleup import (
    Gate,
    LaunchOrder,
    PlanningMemo,
    Step,
    after_launch,
    decide_scale_up,
    effective_pools,
    gate_scale_up,
    launch_orders,
    min_node_orders,
    plan_signature,
    pool_limit_refusal,
    scale_up_wake_times,
)
from gpuscale.core.resources import Request, Resources
from gpuscale.core.templates import template_allocatable, template_labels

OD, SPOT = CapacityType.ON_DEMAND, CapacityType.SPOT
CFG = PlannerConfig(exact_solver=False)


def _it(name: str, gpus: int, price: float) -> InstanceType:
    offers = (Offering("z1", OD, price), Offering("z1", SPOT, price / 3))
    return InstanceType(name, "t", 8 * gpus, 32 * gpus * 1024, gpus, "A10", 24576, offerings=offers)


CATALOG = Catalog("decide", (_it("g1", 1, 1.0), _it("g4", 4, 3.6)))
POOL = NodePool("gpu", instance_types=("g1", "g4"), capacity_types=(OD,))


def gpod(name: str, gpus: int = 1, node: str | None = None) -> Pod:
    return Pod(name, request=Request(cpu_milli=1000, memory_mib=1024, gpus=gpus), node_name=node,
               phase="Running" if node else "Pending")  # fmt: skip


def launching(name: str, type_name: str = "g1") -> Node:
    it = CATALOG.by_name()[type_name]
    labels = template_labels(POOL, it, it.offerings[0])
    return Node(name, template_allocatable(POOL, it), labels, (), False, "gpu", True, it.offerings[0].hourly_price)


def node(name: str, *, unschedulable: bool = False) -> Node:
    return Node(name, Resources(8000, 32768, 1), {}, (), unschedulable, "gpu")


NO_MEMO = PlanningMemo()


def gate(real: list[Pod], memo: PlanningMemo = NO_MEMO, **kw: Any) -> Gate:
    args: dict[str, Any] = {
        "batch_closed": True,
        "force": False,
        "in_flight_pods": (),
        "coming_up": (),
        "nodes": {},
        "signature": lambda todo: "sig",
        "now": 100.0,
        "replan_interval_s": 30.0,
    }
    args.update(kw)
    virtual = args.pop("virtual", [])
    return gate_scale_up(real, virtual, memo, **args).gate


# ------------------------------------------------------------------------------------------------------ the gate
def test_gate_table() -> None:
    a, b = gpod("a"), gpod("b")
    A = a.key
    planned = PlanningMemo(last_plan_at=90.0, signature="sig", planned_on_node={A: "n1"})
    nodes = {"n1": node("n1"), "n2": node("n2", unschedulable=True)}
    assert gate([]) is Gate.IDLE
    assert gate([a], batch_closed=False) is Gate.WAIT
    assert gate([a], batch_closed=False, force=True) is Gate.PLAN
    assert gate([a]) is Gate.PLAN
    assert gate([a], in_flight_pods={A}) is Gate.COVERED
    assert gate([a, b], in_flight_pods={A}) is Gate.PLAN
    assert gate([a], in_flight_pods={A}, virtual=[gpod("v")]) is Gate.PLAN  # a leaving node's pods to move
    assert gate([a], in_flight_pods={A}, force=True) is Gate.PLAN
    # planned onto an existing node: covered while the plan is fresh, or while the node is still coming up
    assert gate([a], planned, nodes=nodes, signature=lambda t: "other") is Gate.COVERED
    assert gate([a], planned, nodes=nodes, now=200.0) is Gate.PLAN
    assert gate([a], planned, nodes=nodes, now=200.0, coming_up={"n1"}) is Gate.COVERED
    assert gate([a], replace(planned, planned_on_node={A: "n2"}), nodes=nodes, coming_up={"n2"}) is Gate.UNCHANGED
    # the same inputs within replanInterval: skipped; later, or forced, or changed: planned
    assert gate([b], planned) is Gate.UNCHANGED
    assert gate([b], planned, now=121.0) is Gate.PLAN
    assert gate([b], planned, force=True) is Gate.PLAN
    assert gate([b], planned, signature=lambda t: "changed") is Gate.PLAN


def test_gate_memo_updates_and_lazy_signature() -> None:
    a, b = gpod("a"), gpod("b")
    memo = PlanningMemo(planned_on_node={a.key: "n1"}, static_blocked=frozenset({a.key, "gone"}))
    idle = gate_scale_up([], [], memo, batch_closed=True, force=False, in_flight_pods=(), coming_up=(), nodes={},
                         signature=lambda t: None, now=0.0, replan_interval_s=30.0)  # fmt: skip
    assert idle.memo.planned_on_node == {} and idle.memo.static_blocked == memo.static_blocked
    calls: list[tuple[str, ...]] = []

    def sig(todo: object) -> object:
        calls.append(tuple(p.key for p in todo))  # type: ignore[attr-defined]
        return "x"

    empty = gate_scale_up([a], [], memo, batch_closed=True, force=False, in_flight_pods=(), coming_up=(), nodes={},
                          signature=sig, now=0.0, replan_interval_s=30.0)  # fmt: skip
    assert empty.gate is Gate.EMPTY and empty.memo.static_blocked == {a.key} and empty.pending == {a.key}
    stale = gate_scale_up([a, b], [], memo, batch_closed=True, force=False, in_flight_pods=(), coming_up=(), nodes={},
                          signature=sig, now=1000.0, replan_interval_s=30.0)  # fmt: skip
    assert stale.gate is Gate.PLAN and [p.key for p in stale.real] == [b.key] and calls == []  # not fresh: not called
    fresh = replace(memo, last_plan_at=990.0)
    gate_scale_up([a, b], [], fresh, batch_closed=True, force=False, in_flight_pods=(), coming_up=(), nodes={},
                  signature=sig, now=1000.0, replan_interval_s=30.0)  # fmt: skip
    assert calls == [(b.key,)]


def test_plan_signature_ignores_order() -> None:
    one = plan_signature(["a", "b"], [], [("k", 1)], [], ["n"], [], [])
    assert one == plan_signature(["b", "a"], [], [("k", 1)], [], ["n"], [], [])
    assert one != plan_signature(["a"], [], [("k", 1)], [], ["n"], [], [])


# ------------------------------------------------------------------------------------------------ launch orders
def test_launch_orders_seed_group_and_placements() -> None:
    p = ScaleUpPlan(
        launches=(
            Launch("L0", "gpu", "g4", OD, "z1", 2, 7.2, ("c", "a", "b")),
            Launch("L1", "gpu", "g1", SPOT, "z1", 1, 0.3),
        ),
        placements={"a": "L0/0", "b": "L0/0", "c": "L0/1", "d": "node-1"},
        blocked=(Blocked("e", BlockReason.TOO_LARGE, "too large"),),
    )
    orders, placed = launch_orders(p)
    assert orders == (
        LaunchOrder(("up", "gpu", "g4", "z1", "on-demand", "a", "b"), "gpu", "g4", "z1", OD, ("a", "b"), "ScaleUp", 0),
        LaunchOrder(("up", "gpu", "g4", "z1", "on-demand", "c"), "gpu", "g4", "z1", OD, ("c",), "ScaleUp", 0),
        LaunchOrder(("up", "gpu", "g1", "z1", "spot", "0"), "gpu", "g1", "z1", SPOT, (), "ScaleUp", 1),
    )
    assert placed == {"d": "node-1"}


@pytest.mark.parametrize(("attempt", "bound", "may"), [(0, 1, False), (0, 0, False), (0, 6, True), (4, 6, True),
                                                       (5, 6, False), (6, 6, False)])  # fmt: skip
def test_the_replan_bound(attempt: int, bound: int, may: bool) -> None:
    d = decide_scale_up(Snapshot(), lambda s, c, n: ScaleUpPlan(), CFG, 0.0, attempt=attempt, max_replans=bound)
    assert (d.attempt, d.may_replan) == (attempt, may)


def test_after_launch_table() -> None:
    up = LaunchOrder(("up",), "gpu", "g1", "z1", OD, ("a",), "ScaleUp", 0)
    low = replace(up, reason="MinNodes")
    table = {
        Outcome.OK: (Step.NEXT, Step.NEXT),
        Outcome.RETRY: (Step.NEXT, Step.NEXT),
        Outcome.FAILED: (Step.SKIP_GROUP, Step.SKIP_GROUP),
        Outcome.GUARD: (Step.SKIP_GROUP, Step.SKIP_GROUP),
        Outcome.BURNT: (Step.SKIP_GROUP, Step.SKIP_GROUP),
        Outcome.CAPACITY: (Step.REPLAN, Step.SKIP_GROUP),
        Outcome.QUOTA: (Step.REPLAN, Step.SKIP_GROUP),
    }
    assert set(table) == set(Outcome)
    for outcome, (for_up, for_min) in table.items():
        assert (after_launch(up, outcome), after_launch(low, outcome)) == (for_up, for_min), outcome


# ------------------------------------------------------------------------------------------ pools and minNodes
def test_effective_pools() -> None:
    spot_only = NodePool("s", capacity_types=(SPOT,), allow_spot_fallback=True)
    no_fallback = NodePool("t", capacity_types=(SPOT,), allow_spot_fallback=False)
    pools = [spot_only, no_fallback, POOL]
    nodes = [node("n1"), node("n2"), replace(node("n3"), pool="s")]
    out = effective_pools(pools, nodes, fallback={"s", "t"}, backed_off={"gpu"})
    assert out[0].capacity_types == (SPOT, OD)
    assert out[1] is no_fallback
    assert out[2].max_nodes == 2 and out[2].capacity_types == (OD,)
    assert effective_pools(pools, nodes, (), ()) == pools


def test_min_node_orders() -> None:
    a = NodePool("a", instance_types=("g1",), capacity_types=(OD,), min_nodes=3)
    b = NodePool("b", instance_types=("g4",), capacity_types=(OD,), min_nodes=1)
    c = NodePool("c", instance_types=("g1",), capacity_types=(OD,), min_nodes=2)
    gone = {OfferingKey("g4", "z1", OD): 50.0}
    out = min_node_orders([a, b, c], {"a": 1, "b": 0}, CATALOG, gone, (), {"c"}, 0.0)
    assert [o.seed for o in out.launches] == [("min", "a", "g1", "z1", "on-demand", "1"),
                                              ("min", "a", "g1", "z1", "on-demand", "2")]  # fmt: skip
    assert {o.reason for o in out.launches} == {"MinNodes"} and {o.group for o in out.launches} == {0}
    assert out.blocked == ("b",)  # g4 is marked unavailable; c is backed off
    assert min_node_orders([a, b, c], {"a": 1, "b": 0}, CATALOG, gone, (), {"c"}, 60.0).blocked == ()
    assert min_node_orders([a], {"a": 3}, CATALOG, {}, (), (), 0.0).launches == ()


@pytest.mark.parametrize(
    ("max_nodes", "limits", "count", "used_gpus", "refusal"),
    [
        (None, PoolLimits(), 50, 50, None),
        (3, PoolLimits(), 2, 2, None),
        (3, PoolLimits(), 3, 3, "pool gpu has 3 of maxNodes=3 nodes"),
        (None, PoolLimits(gpus=8), 1, 4, None),  # 4 + a g4's 4 = 8: fits
        (None, PoolLimits(gpus=8), 1, 5, "a g4 would exceed the limits of pool gpu"),
        (None, PoolLimits(cpu_milli=40_000), 1, 0, None),  # 8 CPUs used + 32 = 40
        (None, PoolLimits(cpu_milli=39_999), 1, 0, "a g4 would exceed the limits of pool gpu"),
    ],
)
def test_pool_limit_refusal(
    max_nodes: int | None, limits: PoolLimits, count: int, used_gpus: int, refusal: str | None
) -> None:
    pool = replace(POOL, max_nodes=max_nodes, limits=limits)
    used = Resources(8000, 32768, used_gpus)
    assert pool_limit_refusal(pool, CATALOG.by_name()["g4"], count, used) == refusal


def test_scale_up_wake_times() -> None:
    assert scale_up_wake_times(None, False, [5.0]) == []
    assert scale_up_wake_times(3.0, False, [5.0]) == [3.0]  # nothing pending: mark expiries change nothing
    assert scale_up_wake_times(None, True, [5.0, 9.0]) == [5.0, 9.0]
    assert scale_up_wake_times(3.0, True, [5.0]) == [3.0, 5.0]


# ---------------------------------------------------------------------------------------- random observations
@st.composite
def observations(draw: st.DrawFn) -> tuple[list[Pod], list[Node], set[str], frozenset[str]]:
    """Pending pods (some too large), claims in flight as launching nodes (each launched for some of the pods,
    with room for them) and pods bound to running nodes."""
    sizes = draw(st.lists(st.sampled_from([1, 1, 2, 4, 8]), min_size=1, max_size=12))
    pending = [gpod(f"p{i}", g) for i, g in enumerate(sizes)]
    claims = draw(st.lists(st.sampled_from(["g1", "g4"]), max_size=4))
    nodes: list[Node] = []
    covered: set[str] = set()
    free = [p for p in pending if p.request.gpus <= 4]
    for i, t in enumerate(claims):
        n = launching(f"nodeclaim-{i}", t)
        room = n.allocatable.gpus
        for p in list(free):
            if p.request.gpus <= room and draw(st.booleans()):
                room -= p.request.gpus
                covered.add(p.key)
                free.remove(p)
        nodes.append(n)
    return pending, nodes, covered, frozenset(p.key for p in pending if p.request.gpus > 4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(observations())
def test_every_pending_pod_is_launched_for_covered_or_given_a_reason(
    obs: tuple[list[Pod], list[Node], set[str], frozenset[str]],
) -> None:
    pending, nodes, covered, too_large = obs
    verdict = gate_scale_up(pending, [], PlanningMemo(), batch_closed=True, force=False, in_flight_pods=covered,
                            coming_up=(), nodes={}, signature=lambda t: None, now=0.0,
                            replan_interval_s=30.0)  # fmt: skip
    if verdict.gate is Gate.COVERED:
        assert set(p.key for p in pending) <= covered  # nothing launched for pods claims in flight were launched for
        return
    assert verdict.gate is Gate.PLAN
    snap = Snapshot(pods=tuple(verdict.real), nodes=tuple(nodes), pools=(POOL,), catalog=CATALOG)
    d = decide_scale_up(snap, plan, CFG, 0.0)
    launched = [p for o in d.launches for p in o.pods]
    assert len(launched) == len(set(launched))  # never two launches for one pod
    assert not set(launched) & set(d.placed)
    blocked = {b.pod: b.reason for b in d.blocked}
    assert not set(launched) & set(blocked)
    for p in pending:
        assert p.key in set(launched) | set(d.placed) | set(blocked), p.key
    assert {k for k, r in blocked.items() if r is BlockReason.TOO_LARGE} == too_large
    # room in flight is used before anything is bought: a pod a claim in flight was launched for is launched for
    # again only when a pod no claim covers took its room in flight (the planner packs, it does not pin pods)
    gpus = {p.key: p.request.gpus for p in pending}
    moved_in = sum(gpus[k] for k, v in d.placed.items() if v.startswith("nodeclaim-") and k not in covered)
    assert sum(gpus[k] for k in covered & set(launched)) <= moved_in
    assert all(d.placed[k].startswith("nodeclaim-") for k in covered if k not in set(launched))
    assert len({o.seed for o in d.launches}) == len(d.launches)  # distinct request-id seeds
