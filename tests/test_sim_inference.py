"""Inference workloads, scalers and GPU budgets in the simulator (gpuscale.sim.inference, gpuscale.sim.scalers)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from gpuscale.cli import main
from gpuscale.errors import InputError
from gpuscale.resources import EXAMPLES, example
from gpuscale.sim.engine import Engine
from gpuscale.sim.inference import (
    Backlog,
    InferenceSpec,
    RateCurve,
    erlang_c,
    mmc_wait,
    weighted_percentile,
)
from gpuscale.sim.scalers import InferenceDriver, compare_inference
from gpuscale.sim.scenario import parse_scenario

SCALER = """
    - apiVersion: gpuscale.io/v1alpha1
      kind: GPUWorkloadScaler
      metadata: {{name: {name}, namespace: inference}}
      spec:
        scaleTargetRef: {{name: {name}}}
        minReplicaCount: 1
        maxReplicaCount: {max}
        triggers:
          - {{type: dcgm, name: gpu-util, metadata: {{metric: DCGM_FI_DEV_GPU_UTIL, threshold: "50"}}}}
        priority: {priority}
        gpuBudget: {{name: shared, model: {name}, gpusPerReplica: 1}}
"""


def scenario_text(models: str, scalers: str, duration: str = "1h", total: int = 3) -> str:
    return f"""
name: tiny
seed: 1
duration: {duration}
catalog: linode
pools:
  - name: gpu
    instanceTypes: [g2-gpu-rtx4000a1-m]
inference:
  models:
{models}
  scalers:
    - apiVersion: gpuscale.io/v1alpha1
      kind: GPUBudget
      metadata: {{name: shared, namespace: inference}}
      spec:
        totalGPUs: {total}
        models: [{{name: a, guaranteedGPUs: 1}}, {{name: b, guaranteedGPUs: 1}}]
{scalers}
"""


MODEL_A = """    - name: a
      shape: {cpu: 2, memory: 8Gi, gpus: 1}
      serviceRate: 1
      coldStart: 0
      rate: [[0, 0.5], [60, 3]]
"""
MODEL_B = """    - name: b
      shape: {cpu: 2, memory: 8Gi, gpus: 1}
      serviceRate: 1
      coldStart: 0
      rate: [[0, 3]]
"""


def spec_of(text: str) -> InferenceSpec:
    spec = parse_scenario(text).inference
    assert isinstance(spec, InferenceSpec)
    return spec


class InstantCluster:
    """A stateful stand-in for the simulated cluster whose pods bind the moment they are created (so the scaler
    steps can be computed by hand without node latencies)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.bound: dict[str, float] = {}

    def add_pod(self, pod: object, duration: float, *, gpu_util: float | None = None) -> None:
        key = pod.key  # type: ignore[attr-defined]
        assert key not in self.bound
        self.bound[key] = self.engine.now()

    def remove_pod(self, key: str) -> bool:
        return self.bound.pop(key, None) is not None

    def bound_at(self, key: str) -> float | None:
        return self.bound.get(key)

    def list_pods(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(key=k, node_name=f"node-{k}") for k in self.bound]  # one node per replica


def drive(text: str, policy: str, end: float) -> InferenceDriver:
    engine = Engine()
    driver = InferenceDriver(spec_of(text), policy, InstantCluster(engine), engine, 1, end)  # type: ignore[arg-type]
    engine.run_until(end - 1)
    return driver


# ------------------------------------------------------------------------------------------------ queueing
def test_erlang_c_worked_case_two_servers() -> None:
    # c = 2, a = lambda/mu = 1.5: B(1) = 0.6, B(2) = 0.9/2.9, C = B / (1 - 0.75 (1 - B)) = 9/14
    assert erlang_c(2, 1.5) == pytest.approx(9 / 14)
    # Wq = C / (c mu - lambda) = (9/14) / 0.5
    assert mmc_wait(2, 1.5, 1.0) == pytest.approx(9 / 7)


def test_mm1_wait_and_limits() -> None:
    assert mmc_wait(1, 0.5, 1.0) == pytest.approx(1.0)  # rho / (mu - lambda)
    assert mmc_wait(1, 1.0, 1.0) == math.inf
    assert mmc_wait(3, 0.0, 1.0) == 0.0
    assert erlang_c(0, 1.0) == 1.0


def test_backlog_fluid_and_no_server() -> None:
    b = Backlog()
    # 3 req/s against one server of 1 req/s for 10 s: 20 queued; mid-step backlog 10 drains in 10 s
    assert b.advance(0, 10, 3.0, 1, 1.0) == pytest.approx(10.0)
    assert b.queued == pytest.approx(20.0)
    # the next 10 s at 1 req/s on 3 servers: drains 20 -> 0; mid 10 / 3 plus the M/M/3 wait at a = 1
    expected = mmc_wait(3, 1.0, 1.0) + 10 / 3
    assert b.advance(10, 10, 1.0, 3, 1.0) == pytest.approx(expected)
    assert b.queued == 0
    c = Backlog()
    assert c.advance(0, 10, 1.0, 0, 1.0) == pytest.approx(5.0)  # age of the backlog at mid-step
    assert c.advance(10, 10, 1.0, 0, 1.0) == pytest.approx(15.0)


def test_weighted_percentile() -> None:
    assert weighted_percentile([(1.0, 90), (100.0, 10)], 0.95) == 100.0
    assert weighted_percentile([(1.0, 96), (100.0, 4)], 0.95) == 1.0
    assert weighted_percentile([], 0.95) == 0.0


def test_rate_curve_steps_diurnal_bursts_and_seeded_noise() -> None:
    steps = RateCurve(points=((0, 1.0), (60, 4.0)))
    assert [steps.clean(t) for t in (0, 59, 60, 1e6)] == [1.0, 1.0, 4.0, 4.0]
    from gpuscale.sim.inference import Burst

    d = RateCurve(base=2, peak=10, period=100, peak_at=25, bursts=(Burst(70, 10, 3.0),))
    assert d.clean(25) == pytest.approx(10)
    assert d.clean(75) == pytest.approx(2 * 3)  # the trough, tripled by the burst
    noisy = RateCurve(base=5, peak=5, noise=0.2)
    a = [noisy.at(t, random.Random(3)) for t in range(5)]
    assert a == [noisy.at(t, random.Random(3)) for t in range(5)] and len(set(a)) == 1
    r = random.Random(3)
    assert len({noisy.at(t, r) for t in range(5)}) == 5


def test_metrics_per_ready_replica() -> None:
    m = spec_of(scenario_text(MODEL_A + MODEL_B, SCALER.format(name="a", max=8, priority=1)
                              + SCALER.format(name="b", max=8, priority=1))).models[0]  # fmt: skip
    x = m.metrics(3.0, 4)  # u = 3 / 4
    assert x["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx(75)
    assert x["cpu"] == pytest.approx(5 + 0.75 * 15)
    assert x["DCGM_FI_DEV_FB_USED"] + x["DCGM_FI_DEV_FB_FREE"] == pytest.approx(m.gpu_memory.total_mib)
    assert m.metrics(9.0, 2)["DCGM_FI_DEV_GPU_UTIL"] == 100  # saturated
    assert m.metrics(9.0, 0)["DCGM_FI_DEV_GPU_UTIL"] == 0


def test_trigger_values_from_the_dcgm_shortcut_queries() -> None:
    from gpuscale.manifests.scaler import DCGM_SHORTCUTS
    from gpuscale.sim.inference import trigger_value

    m = spec_of(ONE).models[0]
    per_pod = m.metrics(3.0, 4)  # u = 0.75
    sel = 'namespace="inference",pod=~"a-.*"'
    q = {k: t.format(sel=sel) for k, (t, _) in DCGM_SHORTCUTS.items()}
    assert trigger_value(q["DCGM_FI_DEV_GPU_UTIL"], per_pod, 4, True) == pytest.approx(75)
    assert trigger_value(q["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], per_pod, 4, True) == pytest.approx(100 * 0.95 * 0.75)
    assert trigger_value(q["DCGM_FI_DEV_MEM_COPY_UTIL"], per_pod, 4, True) == pytest.approx(30)
    used = m.gpu_memory.weights_mib + 0.75 * m.gpu_memory.kv_cache_mib
    assert trigger_value(q["memory-pressure"], per_pod, 4, True) == pytest.approx(100 * used / m.gpu_memory.total_mib)
    # an External metric summed over the ready pods (KEDA AverageValue divides it by the threshold)
    assert trigger_value(f"sum(DCGM_FI_DEV_GPU_UTIL{{{sel}}})", per_pod, 4, False) == pytest.approx(300)
    assert trigger_value(q["DCGM_FI_DEV_GPU_UTIL"], per_pod, 0, True) is None  # no pod reports: empty


# ------------------------------------------------------------------------------------------------ policies, by hand
ONE = scenario_text(MODEL_A, SCALER.format(name="a", max=8, priority=1))


def test_keda_dcgm_steps_match_hand_computation() -> None:
    # threshold 50 %, service 1 req/s per replica, instant binding, pollingInterval 30 s (the scaler reads its
    # metrics at t = 0, 30, 60, ...; steps are 15 s), default HPA scale-up (max(4 pods, 100 %) per 15 s):
    # t<60: 0.5 req/s on 1 -> 50 % -> ratio 1: stay at 1
    # t=60: 3 req/s on 1 -> 100 % -> ceil(2 x 1) = 2;  t=90: on 2 -> 100 % -> 4;  t=120: on 4 -> 75 % ->
    # ceil(1.5 x 4) = 6;  t=150: on 6 -> 50 % -> stay at 6.  Between polls the target holds.
    d = drive(ONE, "keda-dcgm", 151)
    replicas = [n for _, n, _, _ in d.runs["a"].timeline]
    assert replicas == [1, 1, 1, 1, 1, 2, 2, 4, 4, 6, 6]
    assert [ready for _, _, ready, _ in d.runs["a"].timeline] == replicas  # bound at once, no cold start
    assert d.runs["a"].max_nodes == 6


def test_hpa_on_cpu_under_scales() -> None:
    # CPU = 5 + 15 u percent stays below the 60 % target even saturated: the HPA never leaves minReplicas 1
    d = drive(ONE, "hpa-cpu", 136)
    assert [n for _, n, _, _ in d.runs["a"].timeline] == [1] * 10
    assert d.runs["a"].backlog.queued > 0


def test_hpa_on_cpu_steps_with_a_low_target() -> None:
    # hpaCpuTarget 10 %, CPU = 5 + 15 u, one sync per 15 s step, default HPA behaviour:
    # t=0: 0.5 req/s on 1, u = .5 -> 12.5 % -> ratio 1.25 -> 2;  t=15..45: on 2, u = .25 -> 8.75 % -> ratio 0.875
    # -> ceil(1.75) = 2 (and the scale-down window holds it anyway);  t=60: 3 req/s on 2, u = 1 -> 20 % -> ratio 2 -> 4
    text = ONE.replace("      coldStart: 0\n", "      coldStart: 0\n      hpaCpuTarget: 10\n", 1)
    d = drive(text, "hpa-cpu", 76)
    assert [n for _, n, _, _ in d.runs["a"].timeline] == [1, 2, 2, 2, 2, 4]


def test_budget_by_priority_never_exceeded() -> None:
    # a and b both saturate; 3 GPUs: each its guarantee (1), the shared GPU to the higher priority b
    text = scenario_text(MODEL_A + MODEL_B, SCALER.format(name="a", max=8, priority=1)
                         + SCALER.format(name="b", max=8, priority=9))  # fmt: skip
    d = drive(text, "gpuscale-budget", 301)
    final = {name: run.timeline[-1][1] for name, run in d.runs.items()}
    assert final == {"a": 1, "b": 2}
    assert d.moves.over_budget == 0 and d.moves.max_used_gpus == 3 and d.moves.refused_replicas > 0
    assert all(n_a + n_b <= 3 for (_, n_a, _, _), (_, n_b, _, _) in zip(d.runs["a"].timeline, d.runs["b"].timeline,
                                                                       strict=True))  # fmt: skip
    free = drive(text, "keda-dcgm", 301)  # without the budget both grow past it
    assert sum(run.timeline[-1][1] for run in free.runs.values()) > 3


# ------------------------------------------------------------------------------------------------ whole runs
def test_end_to_end_replicas_wait_for_real_nodes() -> None:
    text = scenario_text(MODEL_A + MODEL_B, SCALER.format(name="a", max=4, priority=1)
                         + SCALER.format(name="b", max=4, priority=9), duration="40m")  # fmt: skip
    scen = parse_scenario(text)
    rows = compare_inference(scen, scen.inference)
    by = {r["policy"]: r for r in rows}
    assert set(by) == {"hpa-cpu", "keda-dcgm", "gpuscale-budget"}
    for r in rows:
        assert r["costUsd"] > 0 and r["nodesLaunched"] >= 2
        assert r["replicaPendingP95s"] > 30  # a launch, registration and device plugin before a replica binds
    assert by["gpuscale-budget"]["arbiter"]["overBudget"] == 0
    assert by["gpuscale-budget"]["arbiter"]["maxUsedGPUs"] <= 3
    assert by["keda-dcgm"]["models"]["b"]["replicasMax"] == 4
    assert by["hpa-cpu"]["models"]["b"]["replicasMax"] == 1 and not by["hpa-cpu"]["slaMet"]


def test_scenario_errors_name_the_field() -> None:
    bad = ONE.replace("serviceRate: 1", "serviceRat: 1")
    with pytest.raises(InputError, match=r"inference\.models\[0\]\.serviceRat"):
        parse_scenario(bad)
    with pytest.raises(InputError, match="no GPUWorkloadScaler or ScaledObject named 'zz'"):
        parse_scenario(ONE.replace("    - name: a\n", "    - name: a\n      scaler: zz\n"))
    with pytest.raises(InputError, match=r"inference\.scalers: file not found"):
        parse_scenario(ONE[: ONE.index("  scalers:")] + "  scalers: nothere.yaml\n")
    with pytest.raises(InputError, match=r"inference\.scalers:7 \(document 1, GPUBudget shared\) spec\.totalGPUs"):
        parse_scenario(ONE.replace("totalGPUs: 3", "totalGPUs: -1"))
    with pytest.raises(InputError, match="needs a duration"):
        from gpuscale.sim.scalers import run_inference

        scen = parse_scenario(ONE.replace("duration: 1h\n", ""))
        run_inference(scen, scen.inference, "keda-dcgm")


def test_compare_command_on_the_shipped_example(tmp_path: Path) -> None:
    assert "inference-budget.yaml" in EXAMPLES
    text = example("inference-budget.yaml").read_text().replace("duration: 1d", "duration: 3h")
    path = tmp_path / "inf.yaml"
    path.write_text(text)
    runner = CliRunner()
    res = runner.invoke(main, ["compare", str(path)])
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    assert "GPU budget arbiter" in res.output and "embed-small" in res.output
    res = runner.invoke(main, ["compare", str(path), "--policies", "hpa-cpu", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "compare.json").read_text())[0]["policy"] == "hpa-cpu"
    assert (tmp_path / "compare.png").stat().st_size > 1000
    res = runner.invoke(main, ["compare", str(path), "--json", "--policies", "keda-dcgm"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["policy"] for r in rows] == ["keda-dcgm"] and set(rows[0]["models"]) == {"chat-large", "embed-small",
                                                                                      "summarize"}  # fmt: skip
    res = runner.invoke(main, ["compare", str(path), "--csv", "--policies", "hpa-cpu"])
    assert res.exit_code == 0 and res.output.splitlines()[0].startswith("policy,model,")
    assert len(res.output.splitlines()) == 4
    res = runner.invoke(main, ["compare", str(path), "--policies", "karpenter"])
    assert res.exit_code == 2 and "hpa-cpu" in res.output


def test_simulate_runs_the_budget_policy(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(ONE.replace("duration: 1h", "duration: 20m"))
    runner = CliRunner()
    res = runner.invoke(main, ["simulate", str(path), "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)
    assert row["policy"] == "gpuscale-budget" and row["models"]["a"]["replicasMax"] >= 2
    res = runner.invoke(main, ["simulate", str(path), "--policy", "karpenter"])
    assert res.exit_code == 2 and "compare --policies" in res.output
