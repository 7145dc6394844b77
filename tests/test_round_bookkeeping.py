"""The round's incremental bookkeeping gives what recomputing it would: the controller's wake-up time (candidates
kept for the round, the answer kept while it is in the future), the deadline check skipped while no claim is past
its deadline, and the simulator's bind that spells out ``dataclasses.replace``; the run's collector settings."""

from __future__ import annotations

import gc
import math
from bisect import bisect_right
from dataclasses import fields, replace
from typing import Any

from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.loop import Controller
from gpuscale.controller.shell import World
from gpuscale.core.model import CapacityType, NodePool, Pod, SelectorTerm, Toleration
from gpuscale.core.nodeclaim import TIMED_PHASES
from gpuscale.core.reconcile import expire_deadlines
from gpuscale.core.resources import Request
from gpuscale.sim.cloud import CloudBehaviour
from gpuscale.sim.cluster_records import placed
from gpuscale.sim.engine import Dist
from gpuscale.sim.runner import FULL_COLLECTION_EVERY, run_simulation
from gpuscale.sim.scenario import Scenario, WorkloadSpec
from gpuscale.sim.workloads import Arrival, PodShape, burst
from test_sim_runner import CAT, ToyController, burst_scenario


def _scenario() -> Scenario:
    """Bursts of GPU pods on a cloud whose launches and GPU initialisations sometimes fail and whose spot nodes get
    interrupted: claims time out, launches are retried, nodes are drained, consolidated and deleted."""
    behaviour = CloudBehaviour(
        launch_latency=Dist("lognormal", 40, 0.3),
        registration_latency=Dist("lognormal", 50, 0.3),
        device_plugin_delay=Dist.const(30.0),
        launch_failure_rate=0.1,
        gpu_init_failure_rate=0.15,
        spot_interruptions_per_hour=0.5,
    )
    shape = PodShape(cpu_milli=2000, memory_mib=4096, gpus=1)
    waves: list[Arrival] = []
    for i, at in enumerate((10.0, 1500.0, 4000.0)):
        waves += burst(6 + 4 * i, at=at, shape=shape, runtime=Dist("uniform", 300, 1800), seed=i, prefix=f"w{i}")
    spot = (CapacityType.SPOT, CapacityType.ON_DEMAND)
    return Scenario(
        "bookkeeping",
        seed=7,
        catalog=CAT,
        pools=(NodePool("gpu", capacity_types=spot),),
        cloud=behaviour,
        workload=(WorkloadSpec("waves", lambda seed: sorted(waves, key=lambda a: a.at)),),
        policy={"name": "gpuscale"},
    )


class Checked(Controller):
    """The controller, checking each incremental answer against the recomputed one."""

    wakeups = 0
    expiring = 0

    def next_wakeup(self) -> float | None:
        got = super().next_wakeup()
        times = sorted(t for t in self._timer_candidates() if t < math.inf)
        i = bisect_right(times, self.clock.now())
        assert got == (times[i] if i < len(times) else None)
        Checked.wakeups += got is not None
        return got

    def _check_deadlines(self, w: World) -> None:
        timed = self.claims.in_phases(TIMED_PHASES)
        expires = bool(timed) and bool(expire_deadlines(timed, self._rules, w.now).actions)
        before = self.claims.version
        super()._check_deadlines(w)
        assert (self.claims.version != before) == expires  # skipped exactly when nothing would expire
        Checked.expiring += expires


def _factory(cls: type[Controller]) -> Any:
    def make(**kw: Any) -> Controller:
        cfg = ControllerConfig.from_policy(kw["config"])
        return cls(kw["backend"], kw["provider"], kw["pools"], kw["catalog"], kw["clock"], cfg)

    return make


def test_wakeups_and_deadline_checks_match_their_recomputation() -> None:
    Checked.wakeups = Checked.expiring = 0
    checked = run_simulation(_scenario(), _factory(Checked))
    plain = run_simulation(_scenario(), _factory(Controller))
    assert Checked.wakeups > 50 and Checked.expiring > 0  # the run has timers and claims timing out
    assert checked.reconcile_times == plain.reconcile_times
    assert checked.cluster.events == plain.cluster.events


def test_placed_copies_every_field_of_the_pod() -> None:
    pod = Pod(
        "p",
        "ns",
        Request(cpu_milli=100, memory_mib=64, gpus=1),
        node_selector={"a": "b"},
        affinity=(SelectorTerm(),),
        tolerations=(Toleration("k"),),
        priority=5,
        labels={"app": "x"},
        annotations={"n": "v"},
        gang="g",
        gang_size=2,
        is_daemonset=True,
    )
    bound = placed(pod, "node-1", "Running")
    assert bound == replace(pod, node_name="node-1", phase="Running") and bound.key == "ns/p"
    assert placed(bound, None, "Pending") == pod
    changed = {"node_name", "phase", "key", "pending"}
    copied = {"name", "namespace", "request", "node_selector", "affinity", "tolerations", "priority", "labels"}
    copied |= {"annotations", "gang", "gang_size", "is_daemonset"}
    assert {f.name for f in fields(Pod)} == changed | copied, "a new Pod field: copy it in placed()"
    assert all(getattr(bound, f) == getattr(pod, f) for f in copied)


def test_full_collections_are_rarer_during_a_run_only() -> None:
    seen: list[tuple[int, int, int]] = []

    class Probe(ToyController):
        def reconcile(self) -> None:
            seen.append(gc.get_threshold())
            super().reconcile()

    assert gc.get_freeze_count() == 0  # (a run inside a frozen heap changes nothing)
    before = gc.get_threshold()
    run_simulation(burst_scenario(count=4), Probe)
    assert seen and set(seen) == {(before[0], before[1], max(before[2], FULL_COLLECTION_EVERY))}
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
