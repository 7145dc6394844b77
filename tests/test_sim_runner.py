"""Scenario files, the simulation driver and reports, driven by a small stateful test controller."""

from __future__ import annotations

import contextlib
import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from builders import OD, catalog, itype
from gpuscale.controller.backend import ClusterBackend
from gpuscale.core.model import CapacityType, Catalog, NodePool
from gpuscale.errors import InputError, ProviderError
from gpuscale.providers.base import CloudNodeState, LaunchRequest, Provider, ProviderEventKind
from gpuscale.sim.cloud import CloudBehaviour
from gpuscale.sim.engine import Dist, SimClock
from gpuscale.sim.report import format_report, write_outputs
from gpuscale.sim.runner import ControllerCrash, RunnerConfig, run_simulation
from gpuscale.sim.scenario import Scenario, WorkloadSpec, parse_scenario
from gpuscale.sim.workloads import PodShape, burst

CAT = catalog(itype("gpu-1", 8, 32, 1, "T4", price=1.0), itype("gpu-4", 32, 128, 4, "T4", price=3.6))


class ToyController:
    """Launches nodes of one type for pending GPU demand not covered by in-flight nodes; deletes nodes empty for a
    minute; drains spot-noticed nodes. Stateless apart from a request counter, like a controller that rebuilds its
    state from the cluster and the cloud."""

    def __init__(
        self,
        *,
        backend: ClusterBackend,
        provider: Provider,
        pools: Sequence[NodePool],
        catalog: Catalog,
        clock: SimClock,
        config: Mapping[str, Any],
    ) -> None:
        self.backend, self.provider, self.pool, self.clock = backend, provider, pools[0], clock
        self.itype = catalog.by_name()[str(config.get("instanceType", "gpu-1"))]
        self.n = 0
        self.empty_since: dict[str, float] = {}

    def reconcile(self) -> None:
        now = self.clock.now()
        cloud = [c for c in self.provider.list_nodes() if c.state is not CloudNodeState.DELETING]
        for ev in self.provider.poll_errors():
            if ev.kind is ProviderEventKind.SPOT_INTERRUPTION:
                name = next((c.node_name for c in cloud if c.node_id == ev.node_id), "")
                self.backend.cordon(name)
                for p in self.backend.list_pods():
                    if p.node_name == name:
                        self.backend.evict(p.key)
        pods = self.backend.list_pods()
        nodes = {n.name: n for n in self.backend.list_nodes()}
        pending = sum(p.request.gpus + (1 if p.request.gpu_milli else 0) for p in pods if p.node_name is None)
        inflight = sum(
            self.itype.gpu_count for c in cloud if c.node_name not in nodes or nodes[c.node_name].allocatable.gpus == 0
        )
        if pending > inflight:
            self.n += 1
            count = math.ceil((pending - inflight) / self.itype.gpu_count)
            with contextlib.suppress(ProviderError):
                self.provider.launch(LaunchRequest(f"toy-{self.n}", self.pool.name, self.itype.name, "z1", OD, count))
        used = {p.node_name for p in pods if p.node_name}
        for c in cloud:
            node = nodes.get(c.node_name)
            if node is None or node.allocatable.gpus == 0 or c.node_name in used:
                self.empty_since.pop(c.node_name, None)
                continue
            since = self.empty_since.setdefault(c.node_name, now)
            if now - since >= 60 and pending == 0:
                self.backend.delete_node(c.node_name)
                self.provider.delete_node(c.node_id)

    def next_wakeup(self) -> float | None:
        now = self.clock.now()
        return min((s + 60 for s in self.empty_since.values() if s + 60 > now), default=None)


class NoTimerToy(ToyController):
    next_wakeup = None  # type: ignore[assignment]


def burst_scenario(count: int = 64, delay: float = 120.0, **cloud: Any) -> Scenario:
    behaviour = CloudBehaviour(
        launch_latency=Dist("lognormal", 40, 0.3),
        registration_latency=Dist("lognormal", 50, 0.3),
        device_plugin_delay=Dist.const(delay),
        **cloud,
    )
    arrivals = burst(count, at=10.0, shape=PodShape(cpu_milli=2000, memory_mib=4096, gpus=1), runtime=Dist.const(3600))
    return Scenario(
        "burst",
        seed=4,
        catalog=CAT,
        pools=(NodePool("gpu"),),
        cloud=behaviour,
        workload=(WorkloadSpec("burst", lambda seed: arrivals),),
        policy={"name": "toy"},
    )


def strip(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "wallSeconds"}


def test_burst_from_zero_with_a_slow_device_plugin_launches_no_duplicates() -> None:
    result = run_simulation(burst_scenario(), ToyController)
    r = result.report
    assert r["podsArrived"] == r["podsCompleted"] == 64
    assert r["nodesLaunched"] == 64 and r["duplicateLaunches"] == 0 and r["unusedNodes"] == 0
    assert r["nodesAliveAtEnd"] == 0 and r["podsPending"] == 0
    assert 120 < r["pendingP50s"] < 400  # launch + registration + 120 s device plugin
    assert r["gpuHoursRequested"] == pytest.approx(64.0)
    assert r["gpuHoursBought"] > 64.0
    assert r["costUsd"] == pytest.approx(r["gpuHoursBought"] * 1.0, rel=1e-9)
    assert r["gpuUtilization"] == pytest.approx(64.0 / r["gpuHoursBought"])
    assert result.reconciles < 200  # event-driven: no per-second ticks
    assert "total cost" in format_report(r)


def test_runs_are_deterministic_for_a_seed() -> None:
    a = run_simulation(burst_scenario(count=20, spot_interruptions_per_hour=0.0), ToyController)
    b = run_simulation(burst_scenario(count=20, spot_interruptions_per_hour=0.0), ToyController)
    assert strip(a.report) == strip(b.report)
    assert a.reconcile_times == b.reconcile_times


def test_a_controller_without_timers_is_reconciled_until_the_cluster_settles() -> None:
    result = run_simulation(burst_scenario(count=8), NoTimerToy, config=RunnerConfig(settle_s=120.0))
    assert result.report["nodesAliveAtEnd"] == 0 and result.report["podsCompleted"] == 8


def test_a_crashed_controller_is_rebuilt_and_nothing_is_duplicated_or_leaked() -> None:
    scenario = burst_scenario(count=16, launch_failure_rate=0.0)
    calls = {"n": 0}

    def factory(**kw: Any) -> ToyController:
        ctl = ToyController(**kw)
        cloud = kw["provider"]

        def hook(point: str) -> None:
            calls["n"] += 1
            # die before the first launch takes effect, then right after the retried launch took effect
            if calls["n"] in (1, 3):
                raise ControllerCrash(point)

        cloud.hook = hook
        return ctl

    result = run_simulation(scenario, factory)
    r = result.report
    assert result.restarts == 2
    assert r["podsCompleted"] == 16 and r["nodesAliveAtEnd"] == 0
    # the rebuilt controller counts the nodes of the launch that took effect as in flight and launches no more
    assert r["cloud"]["launch_calls"] == 1 and r["nodesLaunched"] == 16 and r["cloud"]["duplicate_nodes"] == 0


class TimerController:
    """Asks to be woken at fixed times and records when it was."""

    def __init__(self, *, clock: SimClock, **_: Any) -> None:
        self.clock = clock
        self.timers = [123.4, 124.0, 5000.0]
        self.calls: list[float] = []

    def reconcile(self) -> None:
        now = self.clock.now()
        self.calls.append(now)
        self.timers = [t for t in self.timers if t > now]

    def next_wakeup(self) -> float | None:
        return self.timers[0] if self.timers else None


def test_timers_are_honoured_on_time_with_a_minimum_spacing_and_idle_time_is_skipped() -> None:
    scenario = burst_scenario(count=0)
    scenario = Scenario(**{**scenario.__dict__, "duration_s": 6000.0})
    result = run_simulation(scenario, TimerController)
    calls = result.controller.calls  # type: ignore[attr-defined]
    assert calls == [0.0, 123.4, 124.4, 5000.0]  # 124.0 comes within min_spacing_s (1 s) of 123.4
    result = run_simulation(scenario, TimerController, config=RunnerConfig(min_spacing_s=30.0))
    assert result.controller.calls == [0.0, 123.4, 133.4, 5000.0]  # type: ignore[attr-defined]  # spacing <= interval


def test_progress_and_outputs(tmp_path: Path) -> None:
    seen: list[float] = []
    result = run_simulation(burst_scenario(count=4), ToyController, progress=seen.append)
    assert seen[-1] == 1.0 and seen == sorted(seen)
    paths = write_outputs(result.report, result.series, tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert data["podsCompleted"] == 4 and data["policy"] == "toy"
    rows = list(csv.reader(paths["csv"].open()))
    assert rows[0][:6] == ["time_s", "pending_pods", "running_pods", "nodes", "gpus", "cost_usd_per_hour"]
    assert "nodes[gpu]" in rows[0] and max(int(r[1]) for r in rows[1:]) == 4
    assert float(rows[-1][0]) == result.report["simulatedSeconds"]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SCENARIO = """\
name: full
seed: 9
duration: 1d2h
catalog: {catalog}
pools:
  - name: gpu
    instanceTypes: [gpu-1, gpu-4]
    maxNodes: 10
    disruption: {{consolidationPolicy: WhenEmpty, consolidateAfter: 5m}}
cloud:
  launchLatency: {{distribution: lognormal, median: 40s, sigma: 0.3}}
  registrationLatency: {{distribution: uniform, min: 20s, max: 1m}}
  devicePluginDelay: 2m
  instanceTypes:
    gpu-4: {{devicePluginDelay: {{distribution: exponential, mean: 3m}}}}
  capacity:
    - {{instanceType: gpu-4, capacityType: on-demand, maxNodes: 2, from: 1h, until: 2h}}
  spotInterruptionsPerHour: 0.1
  faults: {{rateLimited: 0.01, serverError: 0.02, timeout: 0.03, retryAfter: 5s}}
cluster:
  gpuUtilization: {{busy: 0.9, noise: 0.05}}
  podDisruptionBudgets: [{{name: web, selector: {{app: web}}, maxUnavailable: 1}}]
workload:
  - source: burst
    count: 5
    shape: {{cpu: 500m, memory: 2Gi, gpus: 1, labels: {{app: web}}, tolerations: [{{operator: Exists}}]}}
  - source: steady
    ratePerHour: 10
    duration: 2h
    shapes: [{{gpuMilli: 250, weight: 2, gpuUtilization: 0.4}}, {{gpus: 2}}]
    runtime: {{distribution: exponential, mean: 30m}}
  - source: gangs
    ratePerHour: 1
    duration: 5h
    sizes: [2]
policy:
  name: gpuscale
  reconcileInterval: 10s
"""


@pytest.fixture
def catalog_file(tmp_path: Path) -> Path:
    f = tmp_path / "cat.yaml"
    f.write_text(
        "apiVersion: gpuscale.io/v1alpha1\nkind: InstanceCatalog\nname: test\nregion: r1\ninstanceTypes:\n"
        "  - {name: gpu-1, vcpus: 8, memory: 32Gi, gpu: {model: T4, count: 1},"
        " offerings: [{zone: z1, price: 1.0}]}\n"
        "  - {name: gpu-4, vcpus: 32, memory: 128Gi, gpu: {model: T4, count: 4},"
        " offerings: [{zone: z1, price: 3.6}]}\n"
    )
    return f


def test_a_full_scenario_parses(tmp_path: Path) -> None:
    sc = parse_scenario(SCENARIO.format(catalog="x"), source="s.yaml", base_dir=tmp_path, catalog=CAT)
    assert sc.name == "full" and sc.seed == 9 and sc.duration_s == 26 * 3600
    (pool,) = sc.pools
    assert pool.instance_types == ("gpu-1", "gpu-4") and pool.max_nodes == 10
    assert pool.disruption.consolidate_after_s == 300
    c = sc.cloud
    assert c.launch_latency == Dist("lognormal", 40, 0.3)
    assert c.registration_latency == Dist("uniform", 20, 60)
    assert c.device_plugin_delay == Dist.const(120)
    assert c.per_type["gpu-4"].device_plugin == Dist("exponential", 180)
    (rule,) = c.capacity
    assert (rule.instance_type, rule.capacity_type, rule.max_nodes, rule.start, rule.end) == (
        "gpu-4",
        CapacityType.ON_DEMAND,
        2,
        3600,
        7200,
    )
    assert c.faults.retry_after_s == 5 and c.faults.timeout == 0.03
    assert sc.cluster.busy == 0.9 and sc.pdbs[0].selector == {"app": "web"} and sc.pdbs[0].namespace == "default"
    arr = sc.arrivals()
    assert sum(1 for a in arr if a.pod.name.startswith("burst0")) == 5
    web = next(a for a in arr if a.pod.name.startswith("burst0"))
    assert web.pod.request.cpu_milli == 500 and web.pod.request.memory_mib == 2048 and web.pod.labels == {"app": "web"}
    assert any(a.pod.request.gpu_milli == 250 and a.gpu_util == 0.4 for a in arr)
    assert all(a.pod.gang_size == 2 for a in arr if a.pod.gang)
    assert [(a.at, a.pod.name) for a in arr] == [(a.at, a.pod.name) for a in sc.arrivals()]
    assert sc.policy == {"name": "gpuscale", "reconcileInterval": "10s"}
    assert sc.reconcile_interval_s == 10.0 and sc.settle_s is None


def test_catalog_paths_resolve_against_the_scenario(catalog_file: Path) -> None:
    sc = parse_scenario(SCENARIO.format(catalog="cat.yaml"), source="s.yaml", base_dir=catalog_file.parent)
    assert {it.name for it in sc.catalog.instance_types} == {"gpu-1", "gpu-4"}


@pytest.mark.parametrize(
    ("old", "new", "where", "message"),
    [
        ("seed: 9", "sed: 9", "s.yaml:2 sed", "unknown field"),
        ("duration: 1d2h", "duration: soon", "s.yaml:3 duration", "not a valid duration"),
        ("devicePluginDelay: 2m", "devicePluginDelay: {distribution: gamma}", "cloud.devicePluginDelay", "gamma"),
        ("median: 40s, sigma: 0.3", "median: 40s", "cloud.launchLatency.sigma", "is required"),
        ("instanceType: gpu-4, capacityType", "instanceType: gpu-9, capacityType", "capacity[0].instanceType", "gpu-9"),
        ("rateLimited: 0.01", "rateLimited: 2", "cloud.faults.rateLimited", "between"),
        ("source: steady", "source: poisson", "workload[1].source", "poisson"),
        ("gpus: 2}]", "gpus: 2, gpuMilli: 10}]", "workload[1].shapes[1]", "not both"),
        ("cpu: 500m", "cpu: lots", "workload[0].shape.cpu", "quantity"),
        ("maxNodes: 10", "maxNodes: ten", "spec.maxNodes", "integer"),
        ("busy: 0.9", "bussy: 0.9", "s.yaml:21 cluster.gpuUtilization.bussy", "did you mean busy"),
        ("  name: gpuscale", "  name: gpuscale\n  name: other", "s.yaml", "duplicate key"),
    ],
)
def test_scenario_errors_name_the_file_line_and_field(old: str, new: str, where: str, message: str) -> None:
    text = SCENARIO.format(catalog="x")
    assert old in text
    with pytest.raises(InputError) as exc:
        parse_scenario(text.replace(old, new, 1), source="s.yaml", catalog=CAT)
    assert where in str(exc.value) and message in str(exc.value)


def test_missing_sections_are_input_errors() -> None:
    with pytest.raises(InputError, match="empty"):
        parse_scenario("", source="s.yaml", catalog=CAT)
    with pytest.raises(InputError, match="at least one pool"):
        parse_scenario("workload: {source: burst, count: 1}\n", source="s.yaml", catalog=CAT)
    with pytest.raises(InputError, match="workload"):
        parse_scenario("pools: [{name: gpu}]\n", source="s.yaml", catalog=CAT)
    with pytest.raises(InputError, match="unknown catalog"):
        parse_scenario("catalog: nowhere\npools: [{name: gpu}]\n", source="s.yaml")
