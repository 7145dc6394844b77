"""The consolidation gate's rests and binds: a pod binding to a node (room shrinking there) can make a resting node
movable, since the pass's best-fit packing is not monotone in the room (issue 15: the openb gate check's two
mismatching rounds with emptyWait). The gate must end the rests such a bind can affect, and only those."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.core import labels as L
from gpuscale.core.disruption import ActionKind, DisruptionPlan, KeepReason, plan_disruption
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    Disruption,
    DisruptionBudget,
    InstanceType,
    Node,
    NodePool,
    Offering,
    Pod,
)
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.resources import Request
from gpuscale.core.templates import template_allocatable, template_labels

OD = CapacityType.ON_DEMAND
# one instance type in two zones: a replacement is never cheaper than the node it replaces
C16 = InstanceType("c16", "t", 16, 64 * 1024, 0, None, offerings=(Offering("z1", OD, 1.9), Offering("z2", OD, 1.9)))
CATALOG = Catalog("t", (C16,))
POOL = NodePool("cpu", disruption=Disruption(consolidate_after_s=0.0, budgets=(DisruptionBudget("100%"),)))
CONFIG = ControllerConfig(planner=PlannerConfig(exact_solver=False), disruption_interval_s=5.0)
T0 = 1_000_000.0


def _node(name: str, zone: str) -> Node:
    off = next(o for o in C16.offerings if o.zone == zone)
    return Node(name, template_allocatable(POOL, C16), template_labels(POOL, C16, off), pool=POOL.name, hourly_cost=1.9)


def _pod(name: str, on: str, cpu: int, zone: str | None = None) -> Pod:
    selector = {L.ZONE: zone} if zone else {}
    return Pod(name, request=Request(cpu_milli=cpu, memory_mib=512), node_name=on, phase="Running",
               node_selector=selector)  # fmt: skip


NODES = {n.name: n for n in (_node("r", "z1"), _node("d", "z1"), _node("y", "z2"), _node("z", "z2"))}
CPU = NODES["d"].allocatable.cpu_milli
# r (the candidate): a 5-CPU pod and a 2-CPU pod that must stay in zone z1. d (z1) has 6 CPUs free, y (z2) 12 and
# z (z2) 3: a's best fit is d, after which b fits nowhere (kept: no cheaper replacement). Once a 2-CPU pod binds to
# d, a no longer fits there and goes to y, and b takes d's remaining 4 CPUs: r is deleted.
BEFORE: dict[str, list[Pod]] = {
    "r": [_pod("a", "r", 5000), _pod("b", "r", 2000, zone="z1")],
    "d": [_pod("d0", "d", CPU - 6000)],
    "y": [_pod("y0", "y", CPU - 12000)],
    "z": [_pod("z0", "z", CPU - 3000)],
}


def _bind(by_node: dict[str, list[Pod]], on: str, cpu: int) -> dict[str, list[Pod]]:
    return {**by_node, on: [*by_node[on], _pod(f"new-{on}", on, cpu)]}


def _pass(by_node: dict[str, list[Pod]], now: float) -> DisruptionPlan:
    pods = [p for ps in by_node.values() for p in ps]
    return plan_disruption(list(NODES.values()), pods, [POOL], CATALOG, now, since={"r": 0.0}, candidates={"r"})


def _select(gate: ConsolidationGate, by_node: Mapping[str, Sequence[Pod]], now: float) -> list[str]:
    return gate.select({"r"}, set(), NODES, by_node, [], False, {}, frozenset(), now, lambda _: POOL)


def _resting_gate() -> ConsolidationGate:
    """A gate whose pass kept ``r`` at T0 (as the controller rests it)."""
    gate = ConsolidationGate({POOL.name: POOL}, CONFIG)
    assert _select(gate, BEFORE, T0) == ["r"]
    (kept,) = _pass(BEFORE, T0).kept
    assert kept.reason is KeepReason.NO_REPLACEMENT
    gate.rest("r", frozenset(p.key for p in BEFORE["r"]), T0, lambda _: POOL)
    assert _select(gate, BEFORE, T0 + 2) == []  # resting while nothing changes
    return gate


def test_a_bind_that_makes_the_resting_node_movable_ends_its_rest() -> None:
    after = _bind(BEFORE, "d", 2000)
    (action,) = _pass(after, T0 + 10).actions  # the uncached pass: less room on d, and r's pods all fit
    assert action.node == "r" and action.kind is ActionKind.DELETE
    gate = _resting_gate()
    assert _select(gate, after, T0 + 10) == ["r"]


def test_a_bind_where_none_of_its_pods_fit_keeps_the_rest() -> None:
    after = _bind(BEFORE, "z", 1000)  # z (z2, 3 CPUs free) takes neither a (5 CPUs) nor b (zone z1)
    assert not _pass(after, T0 + 10).actions
    gate = _resting_gate()
    assert _select(gate, after, T0 + 10) == []


def test_a_pod_planned_onto_a_node_its_pods_fit_ends_the_rest() -> None:
    """A pending pod planned onto d holds room there as the pass sees it: the same shrink as a bind."""
    gate = _resting_gate()
    pending = Pod("new", request=Request(cpu_milli=2000, memory_mib=512))
    by_node: dict[str, Sequence[Pod]] = dict(BEFORE)
    due = gate.select(
        {"r"}, set(), NODES, by_node, [pending], False, {}, frozenset(), T0 + 10, lambda _: POOL, {pending.key: "d"}
    )
    assert due == ["r"]


def test_a_node_leaving_the_destinations_ends_the_rests_its_room_could_serve() -> None:
    """A destination cordoned (or gone) without a pod leaving it is room taken away as well: removing a row r's pods
    could use changes the packing too, so the rest ends (the test is on the room it had)."""
    gate = _resting_gate()
    cordoned = {**NODES, "d": replace(NODES["d"], unschedulable=True)}
    assert gate.select({"r"}, set(), cordoned, BEFORE, [], False, {}, frozenset(), T0 + 10, lambda _: POOL) == ["r"]


def _select_probed(by_node: Mapping[str, Sequence[Pod]], probe: Callable[[set[str]], bool]) -> list[str]:
    gate = _resting_gate()
    return gate.select({"r"}, set(), NODES, by_node, [], False, {}, frozenset(), T0 + 10, lambda _: POOL, None,
                       frozenset(), probe)  # fmt: skip


def test_the_probe_decides_whether_a_hit_rest_ends() -> None:
    """With the controller's probe (a pass over the hit resting nodes alone), a rest ends only if that pass acts."""
    asked: list[set[str]] = []

    def probe(answer: bool) -> Callable[[set[str]], bool]:
        def ask(nodes: set[str]) -> bool:
            asked.append(nodes)
            return answer

        return ask

    after = _bind(BEFORE, "d", 2000)
    assert _select_probed(after, probe(False)) == []
    assert _select_probed(after, probe(True)) == ["r"]
    assert asked == [{"r"}, {"r"}]
    assert _select_probed(_bind(BEFORE, "z", 1000), probe(True)) == []  # a bind none of r's pods could use
    assert len(asked) == 2  # asks nothing
