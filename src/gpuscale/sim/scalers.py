"""Scalers and GPU budgets driving inference workloads in the simulator, and the three policies ``compare`` sets
side by side on the same request curves.

Every ``inference.step`` (default 15 s, the HPA's sync period) the driver samples each model's metrics
(:mod:`gpuscale.sim.inference`), then asks the policy for each model's replicas and applies them: a scale-up adds
pending pods, which the gpuscale node controller (the same one every simulator policy runs) provisions nodes for,
with the cloud's launch, registration and device-plugin latencies; a replica is ready ``coldStart`` after it is
bound. A scale-down deletes pending pods first, then loading ones, then the newest ready ones (as a ReplicaSet does).

Policies (all on the gpuscale node engine underneath):

* ``hpa-cpu``: the HPA algorithm (:func:`gpuscale.core.autoscale.hpa.decide`) on CPU utilisation against the
  model's ``hpaCpuTarget``, default behaviour, replicas ``max(1, minReplicaCount)..maxReplicaCount``;
* ``keda-dcgm``: the model's scaler (KEDA semantics) on the simulated DCGM metrics, no budget;
* ``gpuscale-budget``: the same, then each ``GPUBudget`` arbitrates its members' desired replicas; a model gets
  ``min(desired, granted)``.

Both run the in-cluster controller's pure round (:func:`gpuscale.core.autoscale.fleet.plan`): a scaler reads its
metrics when its ``pollingInterval`` is due and holds its last desired count in between.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscale.core.autoscale.budget import Arbitration, Budget
from gpuscale.core.autoscale.fleet import Member, Membership, due, plan
from gpuscale.core.autoscale.hpa import Behavior, HpaSpec, HpaState, MetricKind, MetricTarget, PodCounts, Sample, decide
from gpuscale.core.autoscale.keda import EMPTY, ScalerState
from gpuscale.errors import InputError
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine
from gpuscale.sim.inference import Backlog, InferenceModel, InferenceSpec, trigger_value, weighted_percentile
from gpuscale.sim.runner import ControllerFactory, SimResult, run_simulation
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.workloads import _pod

INFERENCE_POLICIES = ("hpa-cpu", "keda-dcgm", "gpuscale-budget")
REPLICA_LIFETIME_S = 10 * 365 * 86_400.0
"""A replica runs until it is scaled down."""


@dataclass(slots=True)
class ModelRun:
    """One model's replicas, scaler memory and measurements during a run."""

    model: InferenceModel
    pods: dict[str, float] = field(default_factory=dict)
    """Pod key -> creation time, oldest first."""
    seq: int = 0
    keda: ScalerState = field(default_factory=ScalerState)
    wanted: int | None = None
    """What the scaler wanted at its last poll (fleet.Member.last_desired)."""
    hpa: HpaState = field(default_factory=HpaState)
    backlog: Backlog = field(default_factory=Backlog)
    delays: list[tuple[float, float]] = field(default_factory=list)
    """(delay proxy s, requests) per step."""
    pending: list[float] = field(default_factory=list)
    """Seconds each replica waited for a node (bound replicas)."""
    seen_bound: set[str] = field(default_factory=set)
    gpu_s: float = 0.0
    replica_s: float = 0.0
    requests: float = 0.0
    max_replicas: int = 0
    max_nodes: int = 0
    """Most nodes holding this model's replicas at once."""
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)
    """(t, replicas, ready, requests/s) per step."""


@dataclass(slots=True)
class ArbiterMoves:
    arbitrations: int = 0
    refused_replicas: int = 0
    lends: int = 0
    reclaims: int = 0
    max_used_gpus: int = 0
    over_budget: int = 0
    """Steps where a budget's members held more GPUs than its total (must stay 0)."""


class InferenceDriver:
    """Samples metrics and applies a policy's replicas every step (see the module docstring)."""

    def __init__(self, spec: InferenceSpec, policy: str, cluster: SimCluster, engine: Engine, seed: int,
                 end: float) -> None:  # fmt: skip
        if policy not in INFERENCE_POLICIES:
            raise InputError("unknown inference policy", value=policy, fix=f"use {', '.join(INFERENCE_POLICIES)}")
        self.spec, self.policy, self.cluster, self.engine, self.end = spec, policy, cluster, engine, end
        self.runs = {m.name: ModelRun(m) for m in spec.models}
        self.rngs = {m.name: spec.noise_stream(seed, m.name) for m in spec.models}
        self.budgets: dict[str, Budget] = {b.name: b for b in spec.scalers.budgets}
        self.previous: dict[str, Arbitration] = {}
        self.moves = ArbiterMoves()
        for run in self.runs.values():
            self._scale(run, self._initial(run.model), 0.0)
        engine.at(0.0, self.tick)

    def _initial(self, m: InferenceModel) -> int:
        n = m.initial_replicas if m.initial_replicas is not None else m.scaler.spec.min_replicas
        if self.policy == "hpa-cpu":
            n = max(n, 1)
        return min(n, m.scaler.spec.max_replicas)

    # ------------------------------------------------------------------------------------------------ a step
    def tick(self) -> None:
        now, dt = self.engine.now(), self.spec.step_s
        readings: dict[str, tuple[dict[str, float | None], PodCounts, float]] = {}
        where = {p.key: p.node_name for p in self.cluster.list_pods() if p.node_name}
        for name, run in self.runs.items():
            readings[name] = self._observe(run, now, dt)
            run.max_nodes = max(run.max_nodes, len({where[k] for k in run.pods if k in where}))
        if self.policy == "hpa-cpu":
            desired = {name: self._hpa_cpu(run, *readings[name], now) for name, run in self.runs.items()}
        else:
            desired = self._round(readings, now)
        for name, run in self.runs.items():
            self._scale(run, desired[name], now)
        if self.policy == "gpuscale-budget":
            self._check_budgets()
        if now + dt < self.end:
            self.engine.at(now + dt, self.tick)

    def _observe(self, run: ModelRun, now: float, dt: float) -> tuple[dict[str, float | None], PodCounts, float]:
        m = run.model
        bound = ready = 0
        for key, created in run.pods.items():
            at = self.cluster.bound_at(key)
            if at is None:
                continue
            bound += 1
            if key not in run.seen_bound:
                run.seen_bound.add(key)
                run.pending.append(at - created)
            if at + m.cold_start_s <= now:
                ready += 1
        rate = m.rate.at(now, self.rngs[m.name])
        delay = run.backlog.advance(now, dt, rate, ready, m.service_rate)
        run.delays.append((delay, rate * dt))
        run.requests += rate * dt
        run.gpu_s += bound * m.shape.gpus * dt
        run.replica_s += len(run.pods) * dt
        run.max_replicas = max(run.max_replicas, len(run.pods))
        run.timeline.append((now, len(run.pods), ready, rate))
        per_pod = m.metrics(rate, ready)
        values: dict[str, float | None] = {}
        for t in m.scaler.spec.triggers:
            query = m.scaler.queries.get(t.name, ("", ""))[1]
            v = trigger_value(query, per_pod, ready, t.metric.kind is MetricKind.POD_AVERAGE)
            values[t.name] = EMPTY if v is None else v  # no pod reports yet: an empty result
        values["cpu"] = per_pod["cpu"] if ready else None
        pods = PodCounts(ready, len(run.pods) - ready)
        return values, pods, rate

    def _hpa_cpu(self, run: ModelRun, values: dict[str, float | None], pods: PodCounts, rate: float,
                 now: float) -> int:  # fmt: skip
        """The HPA on CPU utilisation: one sync every step (the HPA's sync period)."""
        m, current = run.model, len(run.pods)
        spec = HpaSpec(max(1, m.scaler.spec.min_replicas), m.scaler.spec.max_replicas,
                       (MetricTarget("cpu", MetricKind.POD_AVERAGE, m.hpa_cpu_target),), Behavior())  # fmt: skip
        cpu = values.get("cpu")
        d = decide(spec, current, {"cpu": Sample(cpu)} if cpu is not None else {}, pods, run.hpa, now)
        run.hpa = d.state
        return d.desired

    def _round(self, readings: Mapping[str, tuple[dict[str, float | None], PodCounts, float]],
               now: float) -> dict[str, int]:  # fmt: skip
        """The in-cluster controller's pure round (:func:`gpuscale.core.autoscale.fleet.plan`): a scaler reads its
        metrics when due (``pollingInterval``); with ``gpuscale-budget`` every budget is arbitrated each round."""
        members = []
        for name, run in self.runs.items():
            values, pods, _ = readings[name]
            spec, ref = run.model.scaler.spec, run.model.scaler.budget
            ship = None
            if ref is not None and self.policy == "gpuscale-budget":
                ship = Membership(ref.name, ref.model, ref.gpus_per_replica)
            trig = {k: v for k, v in values.items() if k != "cpu"}
            members.append(Member(name, spec, run.keda, len(run.pods), trig if due(spec, run.keda, now) else None,
                                  pods, run.model.scaler.priority, ship, run.wanted))  # fmt: skip
        budgets = self.budgets if self.policy == "gpuscale-budget" else {}
        rp = plan(members, budgets, self.previous, now)
        self.previous.update(rp.arbitrations)
        mv = self.moves
        for arb in rp.arbitrations.values():
            mv.arbitrations += 1
            mv.max_used_gpus = max(mv.max_used_gpus, arb.used_gpus)
            for g in arb.grants:
                mv.refused_replicas += g.refused
                mv.lends += len(g.borrowed)
                mv.reclaims += sum(1 for why in g.reasons if "reclaimed by" in why)
        out = {}
        for o in rp.outcomes:
            run = self.runs[o.key]
            run.keda, run.wanted = o.state, o.wanted
            out[o.key] = o.target
        return out

    def _check_budgets(self) -> None:
        """Count steps where a budget's members hold more GPUs (pods, pending or not) than its total."""
        for bname, budget in self.budgets.items():
            held = sum(len(r.pods) * _gpus(r) for r in self.runs.values()
                       if r.model.scaler.budget and r.model.scaler.budget.name == bname)  # fmt: skip
            if held > budget.total_gpus:
                self.moves.over_budget += 1

    # ------------------------------------------------------------------------------------------------ scaling
    def _scale(self, run: ModelRun, n: int, now: float) -> None:
        m = run.model
        while len(run.pods) < n:
            run.seq += 1
            pod = _pod(m.shape, f"{m.scaler.target_name}-{run.seq}", m.namespace)
            run.pods[pod.key] = now
            self.cluster.add_pod(pod, REPLICA_LIFETIME_S, gpu_util=None)
        if len(run.pods) > n:
            for key in self._victims(run, now)[: len(run.pods) - n]:
                self.cluster.remove_pod(key)
                del run.pods[key]

    def _victims(self, run: ModelRun, now: float) -> list[str]:
        """Pods in the order a ReplicaSet deletes them: unscheduled, then not ready, then newest."""

        def rank(item: tuple[str, float]) -> tuple[int, float]:
            key, created = item
            at = self.cluster.bound_at(key)
            state = 0 if at is None else (1 if at + run.model.cold_start_s > now else 2)
            return (state, -created)

        return [k for k, _ in sorted(run.pods.items(), key=rank)]


def _gpus(run: ModelRun) -> int:
    ref = run.model.scaler.budget
    return ref.gpus_per_replica if ref is not None else run.model.shape.gpus


# ---------------------------------------------------------------------------------------------------- running
@dataclass
class InferenceResult:
    policy: str
    sim: SimResult
    driver: InferenceDriver

    def row(self) -> dict[str, Any]:
        """The ``compare --json`` row of this policy."""
        rep = self.sim.report
        models: dict[str, Any] = {}
        pend: list[float] = []
        for name, run in self.driver.runs.items():
            p95 = weighted_percentile(run.delays, 0.95)
            pend.extend(run.pending)
            horizon = max(len(run.timeline) * self.driver.spec.step_s, 1e-9)
            models[name] = {
                "gpuHours": round(run.gpu_s / 3600, 4),
                "replicasAvg": round(run.replica_s / horizon, 3),
                "replicasMax": run.max_replicas,
                "gpusMax": run.max_replicas * run.model.shape.gpus,
                "nodesMax": run.max_nodes,
                "queueDelayP95s": _finite(p95),
                "slaQueueDelayS": run.model.sla_queue_delay_s,
                "slaMet": p95 <= run.model.sla_queue_delay_s,
                "requests": round(run.requests, 1),
                "replicaPendingP95s": _finite(_pct(run.pending, 0.95)),
            }
        mv = self.driver.moves
        return {
            "policy": self.policy,
            "costUsd": rep["costUsd"],
            "gpuHoursBought": rep["gpuHoursBought"],
            "gpuHoursUsed": round(sum(m["gpuHours"] for m in models.values()), 4),
            "nodesLaunched": rep["nodesLaunched"],
            "replicaPendingP95s": _finite(_pct(pend, 0.95)),
            "queueDelayP95s": max((m["queueDelayP95s"] for m in models.values()), default=0.0),
            "slaMet": all(m["slaMet"] for m in models.values()),
            "models": models,
            "arbiter": {"arbitrations": mv.arbitrations, "refusedReplicas": mv.refused_replicas, "lends": mv.lends,
                        "reclaims": mv.reclaims, "maxUsedGPUs": mv.max_used_gpus, "overBudget": mv.over_budget},
        }  # fmt: skip


def _pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _finite(x: float) -> float:
    return round(x, 3) if math.isfinite(x) else -1.0


def run_inference(scenario: Scenario, spec: InferenceSpec, policy: str) -> InferenceResult:
    """Run ``scenario``'s inference models under ``policy`` on the gpuscale node controller."""
    from gpuscale.sim.policies import factory_for

    end = scenario.duration_s
    if end is None:
        raise InputError("an inference scenario needs a duration", where=f"{scenario.source} duration",
                         fix="e.g. duration: 24h")  # fmt: skip
    base: ControllerFactory = factory_for("gpuscale", [])
    holder: list[InferenceDriver] = []

    def factory(**kw: Any) -> Any:
        cluster = kw["backend"]
        if not holder:  # once per run (a crash-rebuilt controller keeps the same workloads)
            holder.append(InferenceDriver(spec, policy, cluster, cluster.engine, scenario.seed, end))
        return base(**kw)

    sim = run_simulation(scenario, factory, arrivals=scenario.arrivals() if scenario.workload else [],
                         policy_name=policy)  # fmt: skip
    return InferenceResult(policy, sim, holder[0])


def compare_inference(scenario: Scenario, spec: InferenceSpec,
                      policies: Sequence[str] = INFERENCE_POLICIES) -> list[dict[str, Any]]:  # fmt: skip
    """One row per policy on the same curves and seed."""
    return [run_inference(scenario, spec, p).row() for p in policies]


def plot_inference(results: Sequence[InferenceResult], path: Path, title: str) -> None:
    """``compare --out``: per model, its request rate and each policy's replicas over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results[0].driver.runs) if results else []
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 2.6 * max(1, len(models))), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], models, strict=True):
        rate = ax.twinx()
        first = results[0].driver.runs[name].timeline
        rate.plot([t / 3600 for t, *_ in first], [r for *_, r in first], color="#bbbbbb", linewidth=0.8)
        rate.set_ylabel("requests/s", color="#888888")
        for res in results:
            tl = res.driver.runs[name].timeline
            ax.step([t / 3600 for t, *_ in tl], [n for _, n, _, _ in tl], where="post", label=res.policy)
        ax.set_ylabel("replicas")
        ax.set_title(name, fontsize=10)
        ax.set_zorder(rate.get_zorder() + 1)
        ax.patch.set_visible(False)
    if models:
        axes[0, 0].legend(loc="upper left", fontsize=8)
        axes[-1, 0].set_xlabel("hours")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def spec_of(scenario: Scenario) -> InferenceSpec | None:
    """The scenario's ``inference`` section, if any."""
    spec = getattr(scenario, "inference", None)
    return spec if isinstance(spec, InferenceSpec) else None


def flat_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``--csv``: one row per policy and model."""
    out = []
    for r in rows:
        for name, m in r["models"].items():
            out.append({"policy": r["policy"], "model": name, "costUsd": r["costUsd"],
                        "gpuHoursBought": r["gpuHoursBought"], **m, **r["arbiter"]})  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------------- output
_SUMMARY = (("policy", "policy", ""), ("cost $", "costUsd", ",.2f"), ("GPU-h", "gpuHoursBought", ",.1f"),
            ("used", "gpuHoursUsed", ",.1f"), ("nodes", "nodesLaunched", "d"),
            ("p95 delay s", "queueDelayP95s", ".2f"), ("SLA", "slaMet", ""),
            ("pend p95", "replicaPendingP95s", ".0f"))  # fmt: skip
_PER_MODEL = (("policy", "policy", ""), ("model", "model", ""), ("repl", "replicasAvg", ".1f"),
              ("max", "replicasMax", "d"), ("GPUs", "gpusMax", "d"),
              ("nodes", "nodesMax", "d"), ("GPU-h", "gpuHours", ",.1f"),
              ("p95 delay", "queueDelayP95s", ".2f"), ("SLA", "slaMet", ""))  # fmt: skip
_ARBITER = (("policy", "policy", ""), ("arbitrations", "arbitrations", "d"), ("refused", "refusedReplicas", "d"),
            ("lends", "lends", "d"), ("reclaims", "reclaims", "d"), ("max GPUs", "maxUsedGPUs", "d"),
            ("over budget", "overBudget", "d"))  # fmt: skip


def _cell(value: Any, fmt: str) -> str:
    if isinstance(value, bool):
        return "met" if value else "MISSED"
    if isinstance(value, float) and value < 0:
        return "inf"
    return format(value, fmt)


def _table(columns: Sequence[tuple[str, str, str]], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    cells = [[_cell(r[k], f) for _, k, f in columns] for r in rows]
    heads = [h for h, _, _ in columns]
    widths = [max(len(c) for c in col) for col in zip(heads, *cells, strict=True)]
    lines = []
    for row in (heads, *cells):
        parts = [f"{c:<{w}}" if i < 2 and not c[:1].isdigit() else f"{c:>{w}}"
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]  # fmt: skip
        lines.append("  ".join(parts).rstrip())
    return lines


def format_inference(rows: Sequence[Mapping[str, Any]], title: str) -> str:
    """The inference ``compare`` report: totals per policy, then per model, then the arbiter's moves (80 columns
    with the shipped policy names; numbers are never cut)."""
    per_model = [{"policy": r["policy"], "model": n, **m} for r in rows for n, m in r["models"].items()]
    arbiter = [{"policy": r["policy"], **r["arbiter"]} for r in rows if r["arbiter"]["arbitrations"]]
    out = [f"{title}: workload scaling policies on the same request curves",
           "(cost USD; GPU-h bought, used by replicas;",
           "delay: queueing delay, the SLA proxy; pend: replica wait for a node, s;",
           "per model: repl = average replicas; max replicas, GPUs and nodes at once)", ""]  # fmt: skip
    blocks = [_table(_SUMMARY, rows), _table(_PER_MODEL, per_model)]
    if arbiter:
        blocks.append(["GPU budget arbiter:", *_table(_ARBITER, arbiter)])
    for i, b in enumerate(blocks):
        out.extend(b if i == 0 else ["", *b])
    return "\n".join(out)


def inference_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """``compare --csv``: one line per policy and model."""
    import csv
    import io

    flat = flat_rows(rows)
    buf = io.StringIO()
    if flat:
        writer = csv.DictWriter(buf, fieldnames=list(flat[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
    return buf.getvalue()


def compare_inference_file(path: str, policies: str | None, as_json: bool, as_csv: bool, out: str | None,
                           seed: int | None) -> bool:  # fmt: skip
    """``gpuscale compare`` on a scenario with an ``inference`` section (False, doing nothing, for any other file):
    the workload scaling policies (:data:`INFERENCE_POLICIES`, or ``--policies``) on the same curves."""
    import dataclasses
    import json

    import click

    from gpuscale.inputs import load_yaml_text, read_text
    from gpuscale.sim.scenario import load_scenario

    data, _ = load_yaml_text(read_text(path, what="scenario file"), source=path)
    if not isinstance(data, dict) or data.get("inference") is None:
        return False
    names = [p.strip() for p in (policies or ",".join(INFERENCE_POLICIES)).split(",") if p.strip()]
    unknown = [p for p in names if p not in INFERENCE_POLICIES]
    if unknown or not names:
        raise InputError("unknown policy for an inference scenario", where="--policies",
                         value=(unknown[0] if unknown else str(policies))[:60],
                         fix=f"use {', '.join(INFERENCE_POLICIES)}")  # fmt: skip
    scen = load_scenario(path)
    if seed is not None:
        scen = dataclasses.replace(scen, seed=seed)
    spec = spec_of(scen)
    assert spec is not None
    results = [run_inference(scen, spec, p) for p in names]
    rows = [r.row() for r in results]
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "compare.json").write_text(json.dumps(rows, indent=2))
        plot_inference(results, Path(out) / "compare.png", scen.name)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif as_csv:
        click.echo(inference_csv(rows), nl=False)
    else:
        click.echo(format_inference(rows, scen.name))
        if out:
            click.echo(f"wrote {Path(out) / 'compare.json'}, {Path(out) / 'compare.png'}")
    return True


def simulate_inference(scenario: Scenario, policy: str | None, as_json: bool, out: str | None) -> None:
    """``gpuscale simulate`` on a scenario with an ``inference`` section: the ``gpuscale-budget`` policy, reported
    as one ``compare`` row (the other policies: ``gpuscale compare --policies``)."""
    import json

    import click

    if policy is not None:
        fix = f"drop --policy, or run gpuscale compare --policies {','.join(INFERENCE_POLICIES)}"
        raise InputError("--policy names a node policy; a scenario with an inference section runs gpuscale-budget",
                         where="--policy", value=policy, fix=fix)  # fmt: skip
    spec = spec_of(scenario)
    assert spec is not None
    rows = [run_inference(scenario, spec, "gpuscale-budget").row()]
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "report.json").write_text(json.dumps(rows[0], indent=2))
    click.echo(json.dumps(rows[0], indent=2) if as_json else format_inference(rows, scenario.name))
