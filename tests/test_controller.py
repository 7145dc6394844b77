"""The controller against the simulator's SimCloud and SimCluster: batching, in-flight capacity, GPU-init
deadlines, capacity errors, spot, back-off, scale-down, crash-restart safety and property tests of invariants."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from gpuscale.controller.backend import ClusterBackend, Event, PodDisruptionBudget
from gpuscale.controller.loop import Controller, ControllerConfig, EventKind, make_controller
from gpuscale.core import labels as L
from gpuscale.core.disruption import SPOT_FALLBACK_LABEL
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    ConsolidationPolicy,
    Disruption,
    DisruptionBudget,
    InstanceType,
    Node,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
    PoolLimits,
    Taint,
)
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL, ClaimPhase, Deadlines
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.resources import Request
from gpuscale.errors import InputError
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    Provider,
    ProviderCapabilities,
    ProviderEvent,
)
from gpuscale.sim.cloud import CapacityRule, CloudBehaviour, Faults, SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Dist, Engine

OD, SPOT = CapacityType.ON_DEMAND, CapacityType.SPOT


def _it(name: str, vcpus: int, gib: int, gpus: int, od: float, spot: float | None) -> InstanceType:
    offers = [Offering("z1", OD, od), Offering("z2", OD, od * 1.05)]
    if spot is not None:
        offers += [Offering("z1", SPOT, spot), Offering("z2", SPOT, spot * 1.05)]
    return InstanceType(name, "sim", vcpus, gib * 1024, gpus, "A10" if gpus else None, 24576 if gpus else 0,
                        offerings=tuple(offers))  # fmt: skip


CATALOG = Catalog(
    "ctl",
    (_it("c4", 4, 16, 0, 0.2, None), _it("g1", 8, 32, 1, 1.0, 0.4), _it("g4", 32, 128, 4, 3.6, 1.5)),
)
FAST = CloudBehaviour(
    launch_latency=Dist.const(10.0),
    registration_latency=Dist.const(20.0),
    device_plugin_delay=Dist.const(30.0),
    deletion_latency=Dist.const(5.0),
)
CONFIG = ControllerConfig(planner=PlannerConfig(exact_solver=False))


def gpu_pool(**kw: Any) -> NodePool:
    kw.setdefault("instance_types", ("g1", "g4"))
    kw.setdefault("capacity_types", (OD,))
    kw.setdefault("disruption", Disruption(consolidate_after_s=60.0, budgets=(DisruptionBudget("100%"),)))
    return NodePool("gpu", **kw)


def gpod(name: str, gpus: int = 1, cpu: int = 4000, **kw: Any) -> Pod:
    return Pod(name, request=Request(cpu_milli=cpu, memory_mib=4096, gpus=gpus), **kw)


class Harness:
    """SimCloud + SimCluster on one engine, and a controller reconciled every ``step`` seconds."""

    def __init__(
        self,
        pools: Sequence[NodePool],
        *,
        behaviour: CloudBehaviour = FAST,
        config: ControllerConfig = CONFIG,
        pdbs: Sequence[PodDisruptionBudget] = (),
        seed: int = 0,
    ) -> None:
        self.pools = list(pools)
        self.engine = Engine()
        self.cluster = SimCluster(self.engine, CATALOG, pools, seed=seed, pdbs=pdbs)
        self.cloud = SimCloud(self.engine, CATALOG, behaviour, seed=seed, listener=self.cluster)
        self.cluster.spot_notices = self.cloud.spot_notices
        self.config = config
        self.backend: ClusterBackend = self.cluster
        self.provider: Provider = self.cloud
        self.ctrl = self.new_controller()

    def new_controller(self) -> Controller:
        return Controller(self.backend, self.provider, self.pools, CATALOG, self.engine.clock, self.config)

    def add(self, pod: Pod, duration: float = 3600.0) -> None:
        self.cluster.add_pod(pod, duration)

    def run(self, until: float, step: float = 1.0, check: Callable[[Harness], None] | None = None) -> None:
        t = self.engine.now()
        while t < until:
            t = min(until, t + step)
            self.engine.run_until(t)
            self.ctrl.reconcile()
            if check is not None:
                check(self)

    def events(self, kind: EventKind) -> list[Event]:
        return [e for e in self.cluster.events if e.kind == str(kind)]

    def alive(self) -> list[CloudNode]:
        return self.cloud.alive()

    def gpus_launched(self) -> int:
        by_name = CATALOG.by_name()
        return sum(by_name[self.cloud._recs[i].itype.name].gpu_count for i in self.cloud._recs)


# ------------------------------------------------------------------------------------------------------ batching
def test_batch_closes_after_idle_second() -> None:
    h = Harness([gpu_pool()])
    h.engine.at(0.1, h.cluster.add_pod, gpod("a"), 3600.0)
    h.engine.at(0.5, h.cluster.add_pod, gpod("b"), 3600.0)
    h.run(1.25, step=0.25)
    assert h.events(EventKind.SCALE_UP) == []  # b was seen at 0.5: the batch stays open until 1.5
    h.run(1.5, step=0.25)
    ups = h.events(EventKind.SCALE_UP)
    assert ups and {e.at for e in ups} == {1.5}
    assert sorted(p for e in ups for p in e.data["pods"]) == ["default/a", "default/b"]  # type: ignore[attr-defined]


def test_batch_closes_after_ten_seconds_of_arrivals() -> None:
    h = Harness([gpu_pool()])
    for n in range(28):  # a new pod every 0.5 s for 14 s
        h.engine.at(0.1 + 0.5 * n, h.cluster.add_pod, gpod(f"p{n}"), 3600.0)
    h.run(14.0, step=0.5)
    ups = h.events(EventKind.SCALE_UP)
    assert ups and min(e.at for e in ups) == 10.5  # first seen at 0.5, closed 10 s later


# --------------------------------------------------------------------------------- in-flight capacity, GPU init
def test_no_duplicate_launch_while_gpus_initialise() -> None:
    slow = replace(FAST, device_plugin_delay=Dist.const(300.0))
    h = Harness([gpu_pool()], behaviour=slow)
    for i in range(8):
        h.add(gpod(f"p{i}"))
    h.run(500.0, step=2.0)
    assert h.gpus_launched() == 8
    assert h.cloud.counters.duplicate_nodes == 0
    assert h.cluster.running_count() == 8 and h.cluster.pending_count() == 0
    phases = [e.reason for e in h.events(EventKind.INITIALIZED)]
    assert len(phases) == len(h.alive())


def test_burst_from_zero_64_pods_slow_device_plugin() -> None:
    slow = CloudBehaviour(
        launch_latency=Dist("lognormal", 40.0, 0.3),
        registration_latency=Dist("lognormal", 50.0, 0.3),
        device_plugin_delay=Dist.const(120.0),
        deletion_latency=Dist.const(30.0),
    )
    h = Harness([gpu_pool()], behaviour=slow, seed=3)
    rng = random.Random(1)
    for i in range(64):
        h.engine.at(rng.uniform(0, 30), h.cluster.add_pod, gpod(f"p{i}"), 7200.0)
    h.run(900.0, step=1.0)
    assert h.gpus_launched() == 64
    assert h.cloud.counters.duplicate_nodes == 0
    assert h.cluster.running_count() == 64


def _first_node_times_out(broken: CloudBehaviour, deadlines: Deadlines) -> tuple[Harness, CloudNode, CloudNode]:
    """One pod; its first node (g1 in z1) fails under ``broken`` and times out, the cloud then works again. Returns
    the harness at 400 s, the first node and the one that replaced it."""
    cfg = replace(CONFIG, pool_deadlines={"gpu": deadlines})
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=broken, config=cfg)
    h.add(gpod("a"))
    h.run(40.0)
    (first,) = h.alive()
    assert (first.instance_type, first.zone) == ("g1", "z1")
    h.cloud.behaviour = FAST  # the next node comes up
    h.run(400.0)
    (second,) = h.alive()
    assert second.node_id != first.node_id and h.cluster.running_count() == 1
    return h, first, second


def test_gpus_that_never_appear_are_replaced_and_type_zone_marked_unavailable() -> None:
    h, _, second = _first_node_times_out(replace(FAST, gpu_init_failure_rate=1.0), Deadlines(gpu_init_s=120.0))
    timeouts = h.events(EventKind.TIMEOUT)
    assert [e.reason for e in timeouts] == ["GpuInitTimeout"]
    assert all(h.ctrl.unavailable[OfferingKey("g1", "z1", ct)] > 400.0 for ct in CapacityType)
    assert second.zone == "z2"


def test_registration_timeout_marks_the_offering_unavailable_and_replans_elsewhere() -> None:
    never_joins = replace(FAST, registration_latency=Dist.const(10_000.0))
    h, _, second = _first_node_times_out(never_joins, Deadlines(registration_s=120.0))
    assert [e.reason for e in h.events(EventKind.TIMEOUT)] == ["RegistrationTimeout"]
    t = h.events(EventKind.TIMEOUT)[0].at
    assert h.ctrl.unavailable[OfferingKey("g1", "z1", OD)] == t + CONFIG.unavailable_ttl_s
    assert OfferingKey("g1", "z1", SPOT) not in h.ctrl.unavailable  # only the offering that was bought
    assert second.zone == "z2"


def test_launch_timeout_after_retries_marks_no_offering_unavailable() -> None:
    throttled = replace(FAST, faults=Faults(rate_limited=1.0, methods=("launch",)))  # every launch is throttled
    cfg = replace(CONFIG, pool_deadlines={"gpu": Deadlines(launch_s=60.0)})
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=throttled, config=cfg)
    h.add(gpod("a"))
    h.run(100.0)
    assert "LaunchTimeout" in [e.reason for e in h.events(EventKind.TIMEOUT)]
    assert h.events(EventKind.OFFERING_UNAVAILABLE) == [] and not h.ctrl.unavailable  # throttling is not the offering's


# ------------------------------------------------------------------------------------------- provider errors
def test_insufficient_capacity_falls_back_to_next_offering_in_the_same_reconcile() -> None:
    ice = replace(FAST, capacity=(CapacityRule(0, instance_type="g1", zone="z1"),))
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=ice)
    h.add(gpod("a"))
    h.run(2.0)
    (node,) = h.alive()
    assert (node.instance_type, node.zone, node.capacity_type) == ("g1", "z2", OD)
    assert [e.reason for e in h.events(EventKind.LAUNCH_FAILED)] == ["LaunchFailed"]
    assert OfferingKey("g1", "z1", OD) in h.ctrl.unavailable
    assert {e.at for e in h.events(EventKind.SCALE_UP)} == {h.events(EventKind.LAUNCH_FAILED)[0].at}
    h.run(120.0)
    assert h.cluster.running_count() == 1


def test_spot_ice_falls_back_to_on_demand_and_moves_back_to_spot() -> None:
    ice = replace(FAST, capacity=(CapacityRule(0, capacity_type=SPOT, end=300.0),))
    pool = gpu_pool(instance_types=("g1",), capacity_types=(SPOT,))
    h = Harness([pool], behaviour=ice, config=replace(CONFIG, unavailable_ttl_s=200.0))
    h.add(gpod("a"), duration=10_000.0)
    h.run(100.0)
    (od,) = h.alive()
    assert od.capacity_type is OD and od.labels[SPOT_FALLBACK_LABEL] == "true"
    assert [e.reason for e in h.events(EventKind.SPOT_FALLBACK)] == ["SpotUnavailable"]
    assert h.cluster.running_count() == 1
    h.run(1200.0)
    (spot,) = h.alive()
    assert spot.capacity_type is SPOT
    assert h.cluster.running_count() == 1
    drift = [e for e in h.events(EventKind.CONSOLIDATE) if e.reason == "Drifted"]
    assert drift and drift[0].data["action"] == "Replace"


def test_spot_only_pool_without_fallback_waits_for_spot() -> None:
    ice = replace(FAST, capacity=(CapacityRule(0, capacity_type=SPOT, end=300.0),))
    pool = gpu_pool(instance_types=("g1",), capacity_types=(SPOT,), allow_spot_fallback=False)
    h = Harness([pool], behaviour=ice, config=replace(CONFIG, unavailable_ttl_s=100.0))
    h.add(gpod("a"))
    h.run(290.0)
    assert not h.alive() and h.cluster.pending_count() == 1
    assert any(e.reason == "NoOfferingAvailable" for e in h.events(EventKind.BLOCKED))
    h.run(500.0)
    (node,) = h.alive()
    assert node.capacity_type is SPOT and h.cluster.running_count() == 1


def test_quota_backs_off_the_pool() -> None:
    quota = replace(FAST, quota_nodes=1)
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=quota, config=replace(CONFIG, quota_backoff_s=60.0))
    h.add(gpod("a"))
    h.add(gpod("b"))
    h.run(2.0)
    assert len(h.alive()) == 1
    backoffs = h.events(EventKind.BACKOFF)
    assert len(backoffs) == 1 and backoffs[0].object == "pool/gpu"
    calls = h.cloud.counters.launch_calls
    h.run(60.0)
    assert h.cloud.counters.launch_calls == calls  # nothing tried while backed off
    h.run(70.0)
    assert h.cloud.counters.launch_calls > calls
    assert len(h.events(EventKind.BACKOFF)) == 2  # the quota still holds: longer back-off


def test_rate_limits_and_timeouts_never_duplicate() -> None:
    faulty = replace(
        FAST, faults=Faults(rate_limited=0.2, server_error=0.1, timeout=0.3, timeout_took_effect=0.7, retry_after_s=3)
    )
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=faulty, seed=5)
    for i in range(10):
        h.add(gpod(f"p{i}"), duration=600.0)
    h.run(400.0)
    assert h.cluster.running_count() == 10
    assert h.cloud.counters.duplicate_nodes == 0
    assert h.cloud.counters.idempotency_mismatches == 0
    assert h.gpus_launched() == 10
    assert h.events(EventKind.LAUNCH_RETRY)


# ----------------------------------------------------------------------------------------------------------- spot
def test_spot_interruption_cordons_replaces_at_once_and_drains() -> None:
    pool = gpu_pool(instance_types=("g1",), capacity_types=(SPOT,))
    h = Harness([pool])
    h.add(gpod("a"), duration=10_000.0)
    h.run(100.0)
    (node,) = h.alive()
    assert h.cluster.pods_on(node.node_name) == ["default/a"]
    h.cloud.interrupt(node.node_id)
    h.run(101.0)
    n = h.cluster.node(node.node_name)
    assert n is None or n.unschedulable
    notice = h.events(EventKind.SPOT_INTERRUPTION)
    assert len(notice) == 1 and notice[0].at == 101.0
    ups = [e for e in h.events(EventKind.SCALE_UP) if e.at == 101.0]
    assert len(ups) == 1  # the replacement is launched in the same reconcile
    assert [e.object for e in h.events(EventKind.EVICT)] == ["pod/default/a"]
    # the interrupted offering is avoided for a while
    assert OfferingKey("g1", node.zone, SPOT) in h.ctrl.unavailable
    h.run(400.0)
    (replacement,) = h.alive()
    assert replacement.node_id != node.node_id
    assert h.cluster.pods_on(replacement.node_name) == ["default/a"]


# ---------------------------------------------------------------------------------------------------- scale down
def test_scale_down_to_min_nodes_after_consolidate_after() -> None:
    pool = gpu_pool(instance_types=("g1",), min_nodes=1)
    h = Harness([pool])
    for i in range(3):
        h.add(gpod(f"p{i}"), duration=200.0)
    h.run(150.0)
    assert len(h.alive()) == 3
    h.run(250.0)
    assert len(h.alive()) == 3  # pods finished around 200: consolidateAfter (60 s) not yet over
    h.run(400.0)
    assert len(h.alive()) == 1
    assert len(h.cluster.list_nodes()) == 1
    assert {e.reason for e in h.events(EventKind.CONSOLIDATE)} == {"Empty"}


def test_min_nodes_are_launched_without_pods() -> None:
    cpu = NodePool("cpu", instance_types=("c4",), min_nodes=2)
    h = Harness([cpu])
    h.run(60.0)
    assert sorted(n.instance_type for n in h.alive()) == ["c4", "c4"]
    assert {e.reason for e in h.events(EventKind.SCALE_UP)} == {"MinNodes"}
    h.run(200.0)
    assert len(h.alive()) == 2


def test_min_nodes_read_again_when_the_pools_are_replaced() -> None:
    """Whether a pool has minNodes is kept per pools object: pools replaced by another object are read again."""
    h = Harness([NodePool("cpu", instance_types=("c4",))])
    h.run(30.0)
    assert h.alive() == []
    h.ctrl.pools = {"cpu": NodePool("cpu", instance_types=("c4",), min_nodes=1)}
    h.run(90.0)
    assert [n.instance_type for n in h.alive()] == ["c4"]


def test_consolidation_moves_pods_respecting_do_not_disrupt_and_pdbs() -> None:
    d = Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),))
    pool = gpu_pool(instance_types=("g4",), disruption=d)
    pdb = PodDisruptionBudget("web", "default", {"app": "web"}, max_unavailable=0)
    h = Harness([pool], pdbs=[pdb])
    keep = {L.DO_NOT_DISRUPT_ANNOTATION: "true"}
    # three g4 nodes, one long pod each among short ones: pinned (do-not-disrupt), web (PDB), free
    for n, (at, long) in enumerate(
        [(0.0, gpod("pinned", annotations=keep)), (100.0, gpod("web", labels={"app": "web"})), (200.0, gpod("free"))]
    ):
        h.engine.at(at, h.cluster.add_pod, long, 10_000.0)
        for i in range(3):
            h.engine.at(at, h.cluster.add_pod, gpod(f"short{n}-{i}"), 400.0)
    h.run(280.0)
    assert len(h.alive()) == 3
    owner = {p: n.node_name for n in h.alive() for p in h.cluster.pods_on(n.node_name)}
    assert len({owner["default/pinned"], owner["default/web"], owner["default/free"]}) == 3
    h.run(1200.0)
    assert h.cluster.counters.do_not_disrupt_violations == 0
    assert h.cluster.counters.pdb_refusals == 0
    assert h.cluster.running_count() == 3
    # the free pod moved next to pinned or web; their nodes stayed
    alive = {n.node_name for n in h.alive()}
    assert alive == {owner["default/pinned"], owner["default/web"]}
    assert [e.object for e in h.events(EventKind.EVICT)] == ["pod/default/free"]
    blocked = {e.object: e.reason for e in h.events(EventKind.DISRUPTION_BLOCKED)}
    assert blocked[f"node/{owner['default/pinned']}"] == "DoNotDisrupt"
    assert blocked[f"node/{owner['default/web']}"] == "PodDisruptionBudget"


def test_underused_node_is_replaced_by_two_cheaper_nodes_drained_once_both_are_ready() -> None:
    d = Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),))
    h = Harness([gpu_pool(disruption=d)])
    long_gpu, cpu_only = gpod("gpu", cpu=6000), gpod("cpu", gpus=0, cpu=6000)
    for p in (long_gpu, cpu_only):
        h.add(p, duration=10_000.0)
    for i in range(2):
        h.add(gpod(f"short{i}", cpu=6000), duration=300.0)
    h.run(200.0)
    assert [n.instance_type for n in h.alive()] == ["g4"]  # 24 vCPU and 3 GPUs: one g4 ($3.6) beats four g1 ($4)
    old = h.alive()[0].node_name
    # the short pods end at ~300 s: 1 GPU and 12 vCPU remain, more CPU than a g1 has, so no single cheaper node
    # fits them, but one g1 each ($2 in all) does
    h.run(500.0)
    (consolidate,) = h.events(EventKind.CONSOLIDATE)
    assert consolidate.object == f"node/{old}" and "replace by 2 nodes (g1, g1)" in consolidate.message
    assert consolidate.data["savingsPerHour"] == pytest.approx(1.6)
    (drain,) = h.events(EventKind.DRAIN)
    launched = [e.at for e in h.events(EventKind.SCALE_UP) if e.reason == "ReplaceUnderutilized"]
    initialised = sorted(e.at for e in h.events(EventKind.INITIALIZED))[-2:]
    assert len(launched) == 2 and drain.at >= max(initialised)
    assert sorted(n.instance_type for n in h.alive()) == ["g1", "g1"]
    assert h.cluster.running_count() == 2 and h.cluster.pending_count() == 0
    owner = {p: n.node_name for n in h.alive() for p in h.cluster.pods_on(n.node_name)}
    assert owner["default/gpu"] != owner["default/cpu"]


@pytest.mark.parametrize("seed", range(4))
def test_a_ready_replacement_is_not_consolidated_while_its_sibling_starts(seed: int) -> None:
    # GPUs of the two new nodes appear 30-200 s after registration: the first one ready sits empty for a while
    slow = replace(FAST, device_plugin_delay=Dist("uniform", 30.0, 200.0))
    d = Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),))
    h = Harness([gpu_pool(disruption=d)], behaviour=slow, seed=seed)
    h.add(gpod("gpu", cpu=6000), duration=10_000.0)
    h.add(gpod("cpu", gpus=0, cpu=6000), duration=10_000.0)
    for i in range(2):
        h.add(gpod(f"short{i}", cpu=6000), duration=300.0)
    h.run(1500.0)
    assert h.events(EventKind.REPLACE_ABORTED) == []
    assert len(h.events(EventKind.SCALE_UP)) == 3  # the g4, then its two g1 replacements, once
    assert sorted(n.instance_type for n in h.alive()) == ["g1", "g1"]
    assert h.cluster.running_count() == 2


def test_a_pod_landing_on_a_waiting_empty_node_is_packed_on_the_nodes_clock() -> None:
    d = Disruption(consolidate_after_s=60.0, consolidate_empty_after_s=1800.0, budgets=(DisruptionBudget("100%"),))
    h = Harness([gpu_pool(disruption=d)])
    h.add(gpod("first", gpus=4), duration=100.0)  # a g4
    h.run(1000.0)  # "first" ended near 160 s: the g4 has been waiting empty for ~14 minutes, kept warm
    (node,) = h.alive()
    assert h.events(EventKind.CONSOLIDATE) == []
    h.add(gpod("late"), duration=3600.0)  # starts at once on the warm node, which is now Underutilized
    h.run(1500.0)
    # the node has been a candidate since ~160 s, longer than consolidateAfter: "late" moves to a cheaper g1 at once
    (move,) = h.events(EventKind.CONSOLIDATE)
    assert move.object == f"node/{node.node_name}" and "replace by g1" in move.message
    assert 1000.0 <= move.at <= 1000.0 + 15.0
    assert sorted(n.instance_type for n in h.alive()) == ["g1"] and h.cluster.running_count() == 1


def test_split_replacement_aborted_when_only_some_new_nodes_launch() -> None:
    d = Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),))
    h = Harness([gpu_pool(disruption=d)])
    h.add(gpod("gpu", cpu=6000), duration=10_000.0)
    h.add(gpod("cpu", gpus=0, cpu=6000), duration=10_000.0)
    for i in range(2):
        h.add(gpod(f"short{i}", cpu=6000), duration=300.0)
    h.run(200.0)
    old = h.alive()[0].node_name
    h.cloud.add_capacity_rule(CapacityRule(1, instance_type="g1", zone="z1"))  # room for one g1 in z1 only
    h.run(400.0)
    (aborted,) = h.events(EventKind.REPLACE_ABORTED)
    assert aborted.object == f"node/{old}" and "only 1 of 2 replacement nodes launched" in aborted.message
    assert [e for e in h.events(EventKind.DRAIN) if e.object == f"node/{old}" and e.at <= aborted.at] == []
    h.run(2000.0)
    assert h.cluster.running_count() == 2 and h.cluster.pending_count() == 0
    assert sorted(n.instance_type for n in h.alive()) == ["g1", "g1"]  # done later with a g1 in z2; nothing leaked


# ------------------------------------------------------------------------------------------ config and factory
def test_make_controller_from_policy_mapping() -> None:
    engine = Engine()
    cluster = SimCluster(engine, CATALOG, [gpu_pool()])
    cloud = SimCloud(engine, CATALOG, FAST, listener=cluster)
    policy = {
        "name": "gpuscale",
        "reconcileInterval": "10s",
        "batchIdle": "2s",
        "batchMax": 20,
        "deadlines": {"gpuInit": "15m"},
        "poolDeadlines": {"gpu": {"launch": "1m"}},
        "exactSolver": False,
        "consolidation": True,
    }
    ctrl = make_controller(
        backend=cluster, provider=cloud, pools=[gpu_pool()], catalog=CATALOG, clock=engine.clock, config=policy
    )
    cfg = ctrl.config
    assert (cfg.batch_idle_s, cfg.batch_max_s) == (2.0, 20.0)
    assert cfg.deadlines.gpu_init_s == 900.0 and cfg.deadlines_for("gpu").launch_s == 60.0
    assert cfg.planner.exact_solver is False


@pytest.mark.parametrize(
    ("policy", "match"),
    [
        ({"batchIdel": 1}, "unknown policy setting"),
        ({"batchIdle": "soon"}, "duration"),
        ({"batchIdle": -1}, "non-negative"),
        ({"maxReplans": 0}, "positive integer"),
        ({"consolidation": "yes"}, "true or false"),
        ({"deadlines": {"boot": "1m"}}, "unknown deadline"),
    ],
)
def test_bad_policy_is_input_error(policy: Mapping[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match) as info:
        ControllerConfig.from_policy(policy)
    assert "policy." in str(info.value)


# ------------------------------------------------------------------------------------------------- crash safety
class Crash(Exception):
    """The controller process dies here."""


class CrashPlan:
    """Counts mutating calls; raises :class:`Crash` before or after the effect of the chosen ones."""

    def __init__(self, points: Mapping[int, bool]) -> None:
        self.points = dict(points)
        self.calls = 0
        self.fired: list[str] = []

    def around(self, kind: str, effect: Callable[[], object]) -> object:
        self.calls += 1
        after = self.points.pop(self.calls, None)
        if after is False:
            self.fired.append(kind)
            raise Crash(kind)
        out = effect()
        if after is True:
            self.fired.append(kind)
            raise Crash(kind)
        return out


class CrashingProvider:
    """A provider that forwards to a SimCloud and crashes around its mutating calls."""

    def __init__(self, inner: SimCloud, plan: CrashPlan) -> None:
        self.inner, self.plan, self.name = inner, plan, inner.name

    @property
    def capabilities(self) -> ProviderCapabilities:
        return self.inner.capabilities

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        return self.plan.around("launch", lambda: self.inner.launch(request))  # type: ignore[return-value]

    def delete_node(self, node_id: str) -> None:
        self.plan.around("provider-delete", lambda: self.inner.delete_node(node_id))

    def list_nodes(self) -> Sequence[CloudNode]:
        return self.inner.list_nodes()

    def poll_errors(self) -> Sequence[ProviderEvent]:
        return self.inner.poll_errors()


class CrashingBackend:
    """A backend that forwards to a SimCluster and crashes around cordon, evict and delete."""

    def __init__(self, inner: SimCluster, plan: CrashPlan) -> None:
        self.inner, self.plan = inner, plan

    def list_pods(self) -> Sequence[Pod]:
        return self.inner.list_pods()

    def list_nodes(self) -> Sequence[Node]:
        return self.inner.list_nodes()

    def list_pdbs(self) -> Sequence[PodDisruptionBudget]:
        return self.inner.list_pdbs()

    def gpu_utilization(self) -> Mapping[str, float]:
        return self.inner.gpu_utilization()

    def cordon(self, node_name: str) -> None:
        self.plan.around("cordon", lambda: self.inner.cordon(node_name))

    def uncordon(self, node_name: str) -> None:
        self.plan.around("uncordon", lambda: self.inner.uncordon(node_name))

    def evict(self, pod_key: str) -> bool:
        return bool(self.plan.around("evict", lambda: self.inner.evict(pod_key)))

    def delete_node(self, node_name: str) -> None:
        self.plan.around("node-delete", lambda: self.inner.delete_node(node_name))

    def update_node(
        self,
        node_name: str,
        labels: Mapping[str, str | None],
        taints: Sequence[Taint] = (),
        untaint: Sequence[str] = (),
    ) -> None:
        self.plan.around("node-update", lambda: self.inner.update_node(node_name, labels, taints, untaint))

    def record(self, event: Event) -> None:
        self.inner.record(event)


CRASH_POOL = gpu_pool(
    disruption=Disruption(consolidate_after_s=20.0, budgets=(DisruptionBudget("100%"),)),
)


def crash_run(seed: int, points: Mapping[int, bool]) -> tuple[Harness, CrashPlan, int, int]:
    """Two waves of one-GPU pods with mixed runtimes (scale-up, consolidation drains, empty deletes), crashing at
    ``points``; returns the harness, the crash plan, the restarts and the nodes launched in the first wave."""
    plan = CrashPlan(points)
    h = Harness([CRASH_POOL], seed=seed)
    h.backend = CrashingBackend(h.cluster, plan)
    h.provider = CrashingProvider(h.cloud, plan)
    h.ctrl = h.new_controller()
    rng = random.Random(seed)
    pods = [(0.0, gpod(f"a{i}"), rng.choice([150.0, 400.0, 900.0])) for i in range(10)]
    pods += [(500.0, gpod(f"b{i}"), rng.choice([100.0, 300.0])) for i in range(5)]
    for at, pod, duration in pods:
        h.engine.at(at, h.cluster.add_pod, pod, duration)
    restarts = 0
    first_wave = 0
    t = 0.0
    while t < 2400.0:
        t += 2.0
        h.engine.run_until(t)
        try:
            h.ctrl.reconcile()
        except Crash:
            restarts += 1
            h.ctrl = h.new_controller()  # rebuilt from cluster + cloud alone
        if t == 200.0:
            first_wave = h.cloud.counters.nodes_launched
    return h, plan, restarts, first_wave


def test_crash_restart_at_200_seeded_points() -> None:
    fired: list[str] = []
    for workload in range(4):
        _, baseline, _, base_first = crash_run(workload, {})
        total_calls = baseline.calls
        assert total_calls > 10
        for k in range(12):
            rng = random.Random(1000 * workload + k)
            points = {rng.randint(1, total_calls): rng.random() < 0.5 for _ in range(7)}
            h, plan, restarts, first = crash_run(workload, points)
            where = (workload, k, plan.fired)
            fired += plan.fired
            assert restarts == len(plan.fired) > 0
            # no duplicate: the first wave buys exactly what the crash-free run bought
            assert first == base_first, where
            assert h.cloud.counters.duplicate_nodes == 0
            assert h.cloud.counters.idempotency_mismatches == 0
            # all pods ran to completion
            assert h.cluster.counters.pods_completed == 15 and h.cluster.pending_count() == 0, where
            # nothing leaked: every node is gone from the cloud and from the cluster
            assert not h.alive(), where
            assert not h.cluster.list_nodes(), where
    assert len(fired) >= 200
    kinds = {k: fired.count(k) for k in sorted(set(fired))}
    assert {"launch", "cordon", "evict", "provider-delete"} <= set(kinds), kinds
    assert min(kinds[k] for k in ("launch", "cordon", "evict", "provider-delete")) >= 10, kinds


def test_adopted_claims_resume_from_cloud_and_cluster_state() -> None:
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=replace(FAST, device_plugin_delay=Dist.const(200.0)))
    for i in range(3):
        h.add(gpod(f"p{i}"))
    h.run(50.0)
    before = {c.request_id: c.phase for c in h.ctrl.claims.values()}
    assert set(before.values()) == {ClaimPhase.REGISTERED}
    h.ctrl = h.new_controller()
    h.run(51.0)
    assert {c.request_id: c.phase for c in h.ctrl.claims.values()} == before
    assert len(h.events(EventKind.ADOPTED)) == 3
    h.run(400.0)
    assert len(h.alive()) == 3 and h.cluster.running_count() == 3
    for node in h.cluster.list_nodes():
        assert node.labels[REQUEST_ID_LABEL] in h.ctrl.claims


def test_orphan_node_object_is_removed() -> None:
    h = Harness([gpu_pool(instance_types=("g1",))])
    h.add(gpod("a"), duration=50.0)
    h.run(40.0)
    (node,) = h.alive()
    # the provider forgets the node (deleted out of band) while its Node object stays; the controller restarts
    h.cloud._end(h.cloud._recs[node.node_id])
    h.ctrl = h.new_controller()
    h.run(300.0)
    assert h.cluster.node(node.node_name) is None
    (orphan,) = h.events(EventKind.ORPHAN)
    assert orphan.object == f"node/{node.node_name}" and orphan.at >= 40.0 + CONFIG.orphan_grace_s
    # the same pods hash to the same request id, which the provider still knows: a fresh id is used
    assert [e.reason for e in h.events(EventKind.LAUNCH_RETRY)] == ["RequestIdUsed"]
    assert h.events(EventKind.LAUNCH_FAILED) == []
    assert h.cluster.counters.pods_completed == 1 and not h.alive()


class ForgetfulProvider:
    """Forwards to a SimCloud, but acknowledges the first ``lose`` delete requests without acting on them."""

    def __init__(self, inner: SimCloud, lose: int) -> None:
        self.inner, self.name, self.lose = inner, inner.name, lose
        self.deletes: list[float] = []

    @property
    def capabilities(self) -> ProviderCapabilities:
        return self.inner.capabilities

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        return self.inner.launch(request)

    def delete_node(self, node_id: str) -> None:
        self.deletes.append(self.inner.engine.now())
        if self.lose > 0:
            self.lose -= 1
            return
        self.inner.delete_node(node_id)

    def list_nodes(self) -> Sequence[CloudNode]:
        return self.inner.list_nodes()

    def poll_errors(self) -> Sequence[ProviderEvent]:
        return self.inner.poll_errors()


@pytest.mark.parametrize("lose", [0, 1])
def test_accepted_delete_is_looked_at_again_after_delete_recheck(lose: int) -> None:
    slow = replace(FAST, deletion_latency=Dist.const(400.0))  # deleting for longer than deleteRecheck
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=slow)
    provider = ForgetfulProvider(h.cloud, lose)
    h.provider = provider
    h.ctrl = h.new_controller()
    h.add(gpod("a"), duration=50.0)
    h.run(200.0, step=2.0)
    assert len(provider.deletes) == 1  # empty after ~110 s, consolidateAfter 60 s: one delete
    first = provider.deletes[0]
    assert h.ctrl.next_wakeup() == pytest.approx(first + CONFIG.delete_recheck_s)
    h.run(first + CONFIG.delete_recheck_s + 10.0, step=2.0)
    # a lost request is repeated once deleteRecheck is over; one the provider shows as deleting is not
    assert len(provider.deletes) == 1 + lose
    h.run(first + 1200.0, step=2.0)
    assert not h.alive() and not h.ctrl.claims
    assert len(provider.deletes) == 1 + lose


# --------------------------------------------------------------------------------------------- property tests
class Invariants:
    """Checked after every reconcile."""

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool
        self.max_disrupting = 0

    def __call__(self, h: Harness) -> None:
        by_name = CATALOG.by_name()
        nodes = [n for n in h.cloud.alive() if n.pool == self.pool.name]
        if self.pool.max_nodes is not None:
            assert len(nodes) <= self.pool.max_nodes
        gpus = sum(by_name[n.instance_type].gpu_count for n in nodes)
        assert self.pool.limits.gpus is None or gpus <= self.pool.limits.gpus
        assert h.cluster.counters.do_not_disrupt_violations == 0
        assert h.cluster.counters.pdb_refusals == 0
        draining = sum(1 for n in h.cluster.list_nodes() if n.unschedulable)
        self.max_disrupting = max(self.max_disrupting, draining)
        budget = self.pool.disruption.budgets[0]
        assert draining <= int(budget.nodes)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_nodes=st.integers(1, 5),
    gpu_limit=st.one_of(st.none(), st.integers(1, 12)),
    budget=st.sampled_from([0, 1, 1, 2]),
    policy=st.sampled_from([ConsolidationPolicy.WHEN_EMPTY, *[ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED] * 3]),
    pods=st.lists(
        st.tuples(
            st.sampled_from([1, 1, 1, 2, 4]),  # GPUs
            st.sampled_from([60.0, 100.0, 300.0, 2000.0]),  # runtime
            st.sampled_from([False, False, False, True]),  # do-not-disrupt
            st.sampled_from([False, False, False, True]),  # PDB-protected
            st.sampled_from([0.0, 0.0, 0.0, 300.0, 600.0]),  # arrival (clustered: packed nodes)
        ),
        min_size=3,
        max_size=12,
    ),
)
# known shapes that drain: a packed node whose pods mostly finish is replaced or emptied onto another
@example(5, None, 1, ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED, [(1, 100.0, False, False, 0.0)] * 3 + [
    (1, 2000.0, False, False, 0.0), (1, 2000.0, True, False, 0.0), (1, 100.0, False, False, 0.0),
    (1, 100.0, False, False, 0.0), (1, 2000.0, False, True, 0.0)])  # fmt: skip
@example(5, 8, 2, ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED, [(1, 100.0, False, False, 0.0)] * 6 + [
    (1, 2000.0, False, False, 0.0), (1, 2000.0, False, False, 0.0)])  # fmt: skip
def test_invariants_hold(
    max_nodes: int,
    gpu_limit: int | None,
    budget: int,
    policy: ConsolidationPolicy,
    pods: list[tuple[int, float, bool, bool, float]],
) -> None:
    pool = gpu_pool(
        max_nodes=max_nodes,
        limits=PoolLimits(gpus=gpu_limit),
        disruption=Disruption(policy, 20.0, (DisruptionBudget(str(budget)),)),
    )
    pdb = PodDisruptionBudget("db", "default", {"app": "db"}, max_unavailable=0)
    h = Harness([pool], pdbs=[pdb])
    for i, (gpus, runtime, dnd, protected, at) in enumerate(pods):
        pod = gpod(
            f"p{i}",
            gpus=gpus,
            cpu=1000,
            annotations={L.DO_NOT_DISRUPT_ANNOTATION: "true"} if dnd else {},
            labels={"app": "db"} if protected else {},
        )
        h.engine.at(at, h.cluster.add_pod, pod, runtime)
    check = Invariants(pool)
    g1_ok = gpu_limit is None or gpu_limit >= 1
    g4_ok = gpu_limit is None or gpu_limit >= 4
    satisfiable = sum(1 for g, *_ in pods if (g == 1 and g1_ok) or g4_ok)
    horizon = 600.0 + sum(r for _, r, *_ in pods) + 1500.0  # even one pod at a time would be done by then
    while h.engine.now() < horizon and h.cluster.counters.pods_completed < satisfiable:
        h.run(h.engine.now() + 1000.0, step=10.0, check=check)
    h.run(h.engine.now() + 500.0, step=10.0, check=check)
    event(f"evictions: {min(h.cluster.counters.evictions, 1)}, max draining: {check.max_disrupting}")
    if budget == 0:
        assert h.events(EventKind.CONSOLIDATE) == []
        assert h.cluster.counters.evictions == 0
    # liveness: every pod some node of the pool can hold within its limits ran to completion (with a zero budget an
    # empty node of the wrong shape may hold the pool at maxNodes forever, as configured)
    if budget > 0:
        assert h.cluster.counters.pods_completed == satisfiable
        assert h.cluster.pending_count() == len(pods) - satisfiable
    else:
        assert h.cluster.counters.pods_completed <= satisfiable


def test_cloud_states_are_adopted() -> None:
    # a node the provider reports as deleting is adopted as Deleting and never re-drained
    h = Harness([gpu_pool(instance_types=("g1",))])
    h.add(gpod("a"), duration=30.0)
    h.run(100.0)
    (node,) = h.alive()
    h.cloud.delete_node(node.node_id)
    h.ctrl = h.new_controller()
    h.run(101.0)
    assert [c.phase for c in h.ctrl.claims.values()] == [ClaimPhase.DELETING]
    assert next(iter(h.cloud.alive())).state is CloudNodeState.DELETING
    h.run(120.0)
    assert h.ctrl.claims == {} and not h.alive()


def test_pod_moves_name_nodes_a_pod_left_and_nodes_whose_pods_changed() -> None:
    from gpuscale.controller.consolidation import pod_moves as _pod_moves

    a, b, c = gpod("a"), gpod("b"), gpod("c")
    before = {"n1": [a, b], "n2": [c], "n3": [gpod("d")]}
    after = {"n1": [a], "n2": [gpod("c"), gpod("e")], "n3": before["n3"], "n4": [b]}
    # n1 lost b; n2 gained e (c is an equal new object); n3 is unchanged; n4 is new
    assert _pod_moves(before, after) == ({"n1"}, {"n1", "n2", "n4"})
    assert _pod_moves(after, {}) == ({"n1", "n2", "n3", "n4"}, {"n1", "n2", "n3", "n4"})
    assert _pod_moves(before, dict(before)) == (set(), set())


def test_node_vanishing_after_quiet_rounds_is_noticed_and_its_pod_replanned() -> None:
    h = Harness([gpu_pool(instance_types=("g1",))])
    h.add(gpod("a"), duration=3600.0)
    h.run(200.0)
    (node,) = h.alive()
    assert h.ctrl._synced is not None  # quiet rounds: the claim sync had nothing to learn and is skipped
    h.cloud._end(h.cloud._recs[node.node_id])  # the provider loses the node out of band
    h.run(400.0)
    (lost,) = h.events(EventKind.LOST)
    assert lost.object == f"node/{node.node_name}" and lost.reason == "NodeLost"
    (again,) = h.alive()
    assert again.node_id != node.node_id and h.cluster.running_count() == 1
