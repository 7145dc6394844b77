"""The consolidation gate (controller.consolidation): its clocks and skips, and the invariant that its caches never
change a decision (check mode runs the uncached reference beside every round over random simulated clusters)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate, pod_moves
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.disruption import PodDisruptionBudget
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    Disruption,
    DisruptionBudget,
    InstanceType,
    NodePool,
    Offering,
    Pod,
)
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.resources import Request
from gpuscale.sim.cloud import CloudBehaviour, SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Dist, Engine

OD = CapacityType.ON_DEMAND


def _it(name: str, vcpus: int, gpus: int, price: float) -> InstanceType:
    offers = (Offering("z1", OD, price), Offering("z2", OD, price * 1.05))
    return InstanceType(name, "sim", vcpus, vcpus * 4096, gpus, "A10" if gpus else None, 24576 if gpus else 0,
                        offerings=offers)  # fmt: skip


CATALOG = Catalog("gate", (_it("g1", 8, 1, 1.0), _it("g2", 16, 2, 1.9), _it("g4", 32, 4, 3.6)))
FAST = CloudBehaviour(
    launch_latency=Dist.const(5.0),
    registration_latency=Dist.const(10.0),
    device_plugin_delay=Dist.const(10.0),
    deletion_latency=Dist.const(5.0),
)
CONFIG = ControllerConfig(planner=PlannerConfig(exact_solver=False), disruption_interval_s=5.0)


def _pool(budget: str, after: float) -> NodePool:
    d = Disruption(consolidate_after_s=after, budgets=(DisruptionBudget(budget),))
    return NodePool("gpu", instance_types=("g1", "g2", "g4"), capacity_types=(OD,), disruption=d)


def _pod(name: str, gpus: int, cpu: int, labels: dict[str, str]) -> Pod:
    return Pod(name, request=Request(cpu_milli=cpu, memory_mib=4096, gpus=gpus), labels=labels)


def _run(pods: list[tuple[float, float, int, int, bool]], budget: str, after: float, with_pdb: bool) -> Controller:
    pool = _pool(budget, after)
    pdbs = [PodDisruptionBudget("web", "default", {"app": "web"}, max_unavailable=0)] if with_pdb else []
    engine = Engine()
    cluster = SimCluster(engine, CATALOG, [pool], seed=1, pdbs=pdbs)
    cloud = SimCloud(engine, CATALOG, FAST, seed=1, listener=cluster)
    ctrl = Controller(cluster, cloud, [pool], CATALOG, engine.clock, CONFIG, check_gate=True)
    for i, (at, duration, gpus, cpu, web) in enumerate(pods):
        labels = {"app": "web"} if web else {}
        engine.at(at, cluster.add_pod, _pod(f"p{i}", gpus, cpu, labels), duration)
    t = 0.0
    while t < 900.0:
        t += 2.0
        engine.run_until(t)
        ctrl.reconcile()
    return ctrl


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.floats(0, 300),  # arrival
            st.floats(30, 700),  # run time
            st.integers(0, 2),  # GPUs
            st.sampled_from([1000, 3000, 6000]),  # CPU
            st.booleans(),  # under a PDB
        ),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from(["100%", "1", "50%"]),
    st.sampled_from([0.0, 20.0, 60.0]),
    st.booleans(),
)
def test_cached_decisions_equal_the_uncached_reference(
    pods: list[tuple[float, float, int, int, bool]], budget: str, after: float, with_pdb: bool
) -> None:
    ctrl = _run(pods, budget, after, with_pdb)
    assert ctrl.gate.mismatches == []


def test_the_reference_check_sees_a_pass_and_can_fail() -> None:
    """The check compares real passes (the property above is not vacuous), and a planted difference is caught."""
    pods = [(0.0, 120.0, 1, 1000, False), (0.0, 800.0, 1, 1000, False), (5.0, 120.0, 1, 1000, False)]
    ctrl = _run(pods, "100%", 20.0, False)
    assert ctrl.gate.mismatches == []
    events = ctrl.backend.events  # type: ignore[attr-defined]
    assert any(e.kind == str(EventKind.CONSOLIDATE) for e in events)
    gate = ctrl.gate
    gate.compare(1.0, {("n", "Delete", "Empty")}, set())
    assert len(gate.mismatches) == 1


def test_open_pass_keeps_the_pass_rate_and_says_when_to_wake() -> None:
    gate = ConsolidationGate({}, replace(CONFIG, disruption_interval_s=10.0))
    assert not gate.open_pass([], 0.0) and not gate.skipped
    assert gate.open_pass(["n1"], 0.0)
    assert not gate.open_pass(["n1"], 5.0) and gate.skipped
    assert gate.wake_times(lambda _: None) == [10.0]
    assert gate.open_pass(["n1"], 10.0) and not gate.skipped


def test_unchanged_inputs_skip_until_the_refresh() -> None:
    gate = ConsolidationGate({}, replace(CONFIG, consolidation_refresh_s=300.0))
    assert gate.inputs_changed(("a",), 0.0, lambda _: None)
    assert not gate.inputs_changed(("a",), 100.0, lambda _: None)
    assert gate.inputs_changed(("b",), 101.0, lambda _: None)
    assert gate.inputs_changed(("b",), 401.0, lambda _: None)  # refresh period passed


def test_pod_moves() -> None:
    a, b = _pod("a", 1, 1000, {}), _pod("b", 1, 1000, {})
    left, moved = pod_moves({"n1": [a, b]}, {"n1": [a], "n2": [b]})
    assert left == {"n1"} and moved == {"n1", "n2"}
