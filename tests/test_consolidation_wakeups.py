"""The consolidation gate's resting nodes (controller.consolidation): what lifts a rest (a planned pending pod that
stops holding room elsewhere) and when a quiet controller wakes to look again (retry time, budget window edge)."""

from __future__ import annotations

from dataclasses import replace

from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate, budget_edge
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.model import CapacityType, Disruption, DisruptionBudget, Node, NodePool, Pod
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.resources import Request, Resources
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine
from test_consolidation_gate import CATALOG, FAST

OD = CapacityType.ON_DEMAND
CONFIG = ControllerConfig(planner=PlannerConfig(exact_solver=False), disruption_interval_s=5.0)


def _node(name: str) -> Node:
    return Node(name, Resources(cpu_milli=8000, memory_mib=32768, gpus=1, pods=110), pool="gpu")


def _pod(name: str, node: str | None) -> Pod:
    phase = "Running" if node else "Pending"
    return Pod(name, request=Request(cpu_milli=1000, memory_mib=1024, gpus=0), node_name=node, phase=phase)


def test_a_planned_pod_binding_elsewhere_frees_room_and_lifts_a_rest() -> None:
    """The smallest case of the openb replay's mismatches (e.g. t=10387636, gpu-00486): node a is resting (its pod
    fits nowhere else); pod q, pending, is planned onto b and holds b's room; q then binds to c while the scale-up
    plan still names b. By-node pods of a and b did not change, yet b now has room for a's pod: the uncached
    reference deletes a, so the gate must look at a again."""
    pool = NodePool("gpu", instance_types=("g1",), capacity_types=(OD,), disruption=Disruption(consolidate_after_s=0))
    gate = ConsolidationGate({"gpu": pool}, CONFIG)
    nodes = {n: _node(n) for n in "abc"}
    pa, q = _pod("pa", "a"), _pod("q", None)
    pods = [pa, q]

    def select(by_node: dict[str, list[Pod]], pods: list[Pod], planned: dict[str, str], now: float) -> list[str]:
        return gate.select({"a"}, set(), nodes, by_node, pods, False, {}, frozenset(), now, lambda _: pool, planned)

    assert select({"a": [pa]}, pods, {q.key: "b"}, 0.0) == ["a"]
    gate.rest("a", frozenset({pa.key}), 0.0)
    assert select({"a": [pa]}, pods, {q.key: "b"}, 10.0) == []  # nothing changed: a rests
    bound = replace(q, node_name="c", phase="Running")
    assert select({"a": [pa], "c": [bound]}, [pa, bound], {q.key: "b"}, 20.0) == ["a"]
    assert "a" not in gate.futile


def test_a_planned_pod_still_pending_keeps_the_rest() -> None:
    """The lift is not blanket: the same rounds with q still pending on b leave a resting."""
    pool = NodePool("gpu", instance_types=("g1",), capacity_types=(OD,), disruption=Disruption(consolidate_after_s=0))
    gate = ConsolidationGate({"gpu": pool}, CONFIG)
    nodes = {n: _node(n) for n in "abc"}
    pa, q = _pod("pa", "a"), _pod("q", None)
    for t in (0.0, 10.0, 20.0):
        due = gate.select({"a"}, set(), nodes, {"a": [pa]}, [pa, q], False, {}, frozenset(), t, lambda _: pool,
                          {q.key: "b"})  # fmt: skip
        if t == 0.0:
            gate.rest("a", frozenset({pa.key}), t)
        else:
            assert due == []


def test_a_budget_rest_is_a_wake_up_time() -> None:
    gate = ConsolidationGate({}, replace(CONFIG, consolidation_retry_s=300.0))
    gate.rest("a", frozenset(), 100.0, timed=True)  # kept by a budget
    gate.rest("b", frozenset(), 100.0)  # kept until the cluster changes
    assert gate.wake_times(lambda _: None) == [400.0]


WINDOW = DisruptionBudget("0", schedule="0 * * * *", duration_s=600.0)
"""No disruption in the first 10 minutes of every hour (Unix time 0 is a whole hour)."""


def test_budget_edge() -> None:
    pool = NodePool("gpu", disruption=Disruption(budgets=(WINDOW, DisruptionBudget("1"))))
    assert budget_edge(pool, 100.0) == 600.0  # the window closes
    assert budget_edge(pool, 700.0) == 3600.0  # the next one opens
    assert budget_edge(NodePool("gpu"), 100.0) == float("inf")


def _quiet_run(budgets: tuple[DisruptionBudget, ...], retry_s: float, until: float) -> tuple[Controller, float]:
    """One pod runs 60 s on one node; then nothing happens until t=3000 (an unrelated pod). The loop reconciles only
    at the controller's wake-up times and at simulator events, as the simulator's driver does. Returns the time of
    the empty node's consolidation."""
    d = Disruption(consolidate_after_s=30.0, budgets=budgets)
    pool = NodePool("gpu", instance_types=("g1",), capacity_types=(OD,), disruption=d)
    engine = Engine()
    cluster = SimCluster(engine, CATALOG, [pool], seed=1)
    cloud = SimCloud(engine, CATALOG, FAST, seed=1, listener=cluster)
    cfg = replace(CONFIG, consolidation_retry_s=retry_s)
    ctrl = Controller(cluster, cloud, [pool], CATALOG, engine.clock, cfg, check_gate=True)
    engine.at(1.0, cluster.add_pod, _pod("p0", None), 60.0)
    engine.at(3000.0, cluster.add_pod, _pod("late", None), 60.0)
    engine.run_until(1.0)
    t = 1.0
    while t < until:
        ctrl.reconcile()
        times = [x for x in (engine.peek(), ctrl.next_wakeup()) if x is not None]
        if not times:
            break
        t = min(times)
        engine.run_until(t)
    consolidated = [e.at for e in cluster.events if e.kind == str(EventKind.CONSOLIDATE)]
    assert ctrl.gate.mismatches == []
    return ctrl, consolidated[0] if consolidated else float("inf")


def test_a_budget_blocked_empty_node_goes_when_the_window_closes_not_at_the_next_event() -> None:
    """The node is empty (and due) at about t=100, inside the no-disruption window: kept. Nothing happens in the
    cluster until t=3000, yet the controller wakes when the window closes (t=600) and consolidates it then."""
    _, at = _quiet_run((WINDOW,), retry_s=300.0, until=3500.0)
    assert 600.0 <= at < 610.0


def test_a_kept_node_is_looked_at_again_at_its_retry_time() -> None:
    """With no scheduled edge before it, the retry time itself wakes the controller: the window closes at 600 but a
    retry of 30 s lands first each time, so the node goes at the first retry after 600, long before t=3000."""
    _, at = _quiet_run((WINDOW,), retry_s=30.0, until=3500.0)
    assert 600.0 <= at < 640.0


def _resting_gate() -> tuple[ConsolidationGate, NodePool, dict[str, Node], Pod]:
    pool = NodePool("gpu", instance_types=("g1",), capacity_types=(OD,), disruption=Disruption(consolidate_after_s=0))
    gate = ConsolidationGate({"gpu": pool}, CONFIG)
    nodes = {n: _node(n) for n in "abc"}
    pa = _pod("pa", "a")
    assert gate.select({"a"}, set(), nodes, {"a": [pa]}, [pa], False, {}, frozenset(), 0.0, lambda _: pool) == ["a"]
    gate.rest("a", frozenset({pa.key}), 0.0)
    return gate, pool, nodes, pa


def test_room_where_none_of_its_pods_fit_still_lifts_a_rest() -> None:
    """The pass packs best-fit over every node, so room anywhere can change a resting node's outcome (on the openb
    replay gpu-01376 became replaceable once a small pod left gpu-01436, where none of its pods fit)."""
    gate, pool, nodes, _ = _resting_gate()
    pa = replace(_pod("pa", "a"), request=Request(cpu_milli=6000, memory_mib=1024, gpus=0))
    other, small = (
        Pod(name, request=Request(cpu_milli=cpu, memory_mib=1024, gpus=0), node_name="b", phase="Running")
        for name, cpu in (("other", 4500), ("small", 3000))
    )
    by_node = {"a": [pa], "b": [other, small]}
    gate.select({"a"}, set(), nodes, by_node, [pa, other, small], False, {}, frozenset(), 1.0, lambda _: pool)
    gate.rest("a", frozenset({pa.key}), 1.0)  # (the pods bound to b since the first rest end it: rested again)
    assert gate.select({"a"}, set(), nodes, by_node, [pa, other, small], False, {}, frozenset(), 5.0,
                       lambda _: pool) == []  # fmt: skip
    by_node = {"a": [pa], "b": [other]}  # small left b: 3.5 CPUs free there, pa wants 6
    assert gate.select({"a"}, set(), nodes, by_node, [pa, other], False, {}, frozenset(), 10.0,
                       lambda _: pool) == ["a"]  # fmt: skip


def test_a_node_in_flight_lifts_a_rest() -> None:
    """A launching node raises a percentage budget's total (the pass counts nodes in flight)."""
    gate, pool, nodes, pa = _resting_gate()

    def select(now: float, flying: frozenset[str]) -> list[str]:
        return gate.select({"a"}, set(), nodes, {"a": [pa]}, [pa], False, {}, frozenset(), now, lambda _: pool,
                           None, flying)  # fmt: skip

    assert select(5.0, frozenset()) == []
    assert select(10.0, frozenset({"claim-1"})) == ["a"]
