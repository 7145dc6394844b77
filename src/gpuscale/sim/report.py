"""Simulation reports: the metrics dict (``--json``), a CSV time series and PNG plots.

Metric definitions:

* ``costUsd``: exact, node-seconds from launch until the node is gone, times its offering's hourly price.
* ``gpuHoursBought``: GPUs × billed hours; ``gpuHoursRequested``: GPU share held by running pods × hours;
  ``gpuUtilization`` is their ratio.
* ``pendingP50s/P95s/P99s``: over every pending episode (arrival or re-pend after a disruption, until bound); pods
  still pending at the end, or dropped at their deadline, count with the time they waited.
* ``duplicateLaunches``: nodes launched although the pods they were launched for were already covered:
  ``cloud.duplicate_nodes`` (nodes created twice for one request id, impossible by design) plus
  ``redundantLaunches``.
* ``redundantLaunches``: nodes created by ``SimCloud.launch`` (idempotent replays create nothing) whose
  ``LaunchRequest.pods`` named at least one pod pending at that moment, when at that moment every pending pod of the
  cluster (DaemonSet pods excluded) could be placed, by first-fit-decreasing (largest GPU demand, then CPU, first),
  into the free room of

  - the registered nodes that take pods (not cordoned; nodes being deleted have already left the cluster), their
    GPUs counted at the template capacity even while the device plugin has not advertised them, and
  - the nodes launched but not registered yet, at their template allocatable, labels and taints,

  not counting the node being launched, nor nodes whose launch or GPU initialisation failed. Placement uses the
  scheduler's predicates (``core.predicates.static_fit``) and per-GPU milli accounting (``core.state.ClusterState``),
  so fractions, selectors, affinity, taints and GPU models are honoured. Launches with no ``pods`` (``minNodes``,
  replacements) are never redundant. Capacity in flight counts as capacity: a controller that launches for pods a
  slow device plugin is still hiding scores here. The names are in ``SimCloud.redundant_nodes``.
* ``unusedNodes``: nodes bought that never ran a pod (launch and GPU-initialisation failures excluded). Not a
  duplicate count: in a busy cluster a node launched for a pending pod often stays empty because a running pod
  completed meanwhile and the scheduler put the pending pod on the freed room.
* ``failedLaunches``: launch calls that raised plus asynchronous launch failures.
* ``disruptions``: pods that lost their node (eviction, node deletion, spot reclaim).
* ``spotInterruptionsSurvived``: spot notices whose node was empty when it left the cluster.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster


@dataclass(slots=True)
class Sample:
    """The state at one instant."""

    t: float
    pending: int
    running: int
    cost_rate: float
    nodes: dict[str, int]
    gpus: dict[str, int]


@dataclass(slots=True)
class TimeSeries:
    """Step-function samples, recorded only when something changed."""

    samples: list[Sample] = field(default_factory=list)
    pools: set[str] = field(default_factory=set)

    def record(self, t: float, cloud: SimCloud, cluster: SimCluster, *, force: bool = False) -> None:
        """Append the state at ``t`` if it differs from the last sample (or always, with ``force``)."""
        pending, running, rate = cluster.pending_count(), cluster.running_count(), cloud.hourly_rate
        rate = rate if rate > 0.0 else 0.0  # max(0.0, rate)
        nodes, gpus = cloud.pool_counts()
        samples = self.samples
        if not samples:
            samples.append(Sample(t, pending, running, rate, dict(nodes), dict(gpus)))
            self.pools.update(nodes)
            return
        last = samples[-1]
        same_pools = last.nodes == nodes and last.gpus == gpus
        if (
            same_pools
            and last.pending == pending
            and last.running == running
            and (last.cost_rate == rate or round(last.cost_rate, 9) == round(rate, 9))  # equal: no rounding
            and not (force and t > last.t)
        ):
            return
        if same_pools:  # the last sample's counts again: its dicts are shared (samples are never changed)
            s = Sample(t, pending, running, rate, last.nodes, last.gpus)
        else:
            s = Sample(t, pending, running, rate, dict(nodes), dict(gpus))
            self.pools.update(nodes)
        if last.t == t:
            samples[-1] = s
        else:
            samples.append(s)

    def write_csv(self, path: Path) -> None:
        """One row per sample: time, pending, running, nodes, GPUs, $/h, then nodes and GPUs per pool."""
        pools = sorted(self.pools)
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(
                ["time_s", "pending_pods", "running_pods", "nodes", "gpus", "cost_usd_per_hour"]
                + [f"nodes[{p}]" for p in pools]
                + [f"gpus[{p}]" for p in pools]
            )
            for s in self.samples:
                w.writerow(
                    [
                        f"{s.t:.3f}",
                        s.pending,
                        s.running,
                        sum(s.nodes.values()),
                        sum(s.gpus.values()),
                        f"{s.cost_rate:.6f}",
                    ]
                    + [s.nodes.get(p, 0) for p in pools]
                    + [s.gpus.get(p, 0) for p in pools]
                )


def _pct(values: Sequence[float], q: float) -> float:
    """``np.percentile(values, q)`` (its default, linear method), computed as numpy does it, in Python floats: the
    sorted values at floor and ceiling of the virtual index ``(n - 1) * q / 100``, mixed by its fraction ``t`` as
    ``a + (b - a) * t``, or ``b - (b - a) * (1 - t)`` from ``t = 0.5`` on. The same value, bit for bit
    (tests/test_sim_report.py), without the first call's import of ``numpy.ma`` (~9 ms in every simulation)."""
    n = len(values)
    if not n:
        return 0.0
    ordered = sorted(float(v) for v in values)
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return ordered[-1]
    low = math.floor(virtual) if virtual > 0 else 0
    a, b = ordered[low], ordered[low + 1]
    t = virtual - low
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def build_report(
    cloud: SimCloud,
    cluster: SimCluster,
    *,
    scenario: str = "",
    policy: str = "",
    seed: int = 0,
    now: float | None = None,
    wall_s: float = 0.0,
    reconciles: int = 0,
    restarts: int = 0,
) -> dict[str, Any]:
    """The metrics of a finished (or running) simulation, as a JSON-ready dict (see the module docstring)."""
    t = cloud.engine.now() if now is None else now
    cost = cloud.cost_by_pool_type(t)
    by_pool: dict[str, float] = {}
    by_type: dict[str, float] = {}
    for (pool, itype), usd in sorted(cost.items()):
        by_pool[pool] = by_pool.get(pool, 0.0) + usd
        by_type[itype] = by_type.get(itype, 0.0) + usd
    bought = cloud.gpu_hours_bought(t)
    requested = cluster.gpu_hours_requested(t)
    waits = cluster.pending_durations(t)
    unused = unused_nodes(cloud, cluster)
    cc, kc = cloud.counters, cluster.counters
    return {
        "scenario": scenario,
        "policy": policy,
        "seed": seed,
        "simulatedSeconds": round(t, 3),
        "wallSeconds": round(wall_s, 3),
        "costUsd": round(sum(cost.values()), 6),
        "costByPool": {k: round(v, 6) for k, v in by_pool.items()},
        "costByInstanceType": {k: round(v, 6) for k, v in by_type.items()},
        "gpuHoursBought": round(bought, 6),
        "gpuHoursRequested": round(requested, 6),
        "gpuUtilization": round(requested / bought, 6) if bought > 0 else 0.0,
        "nodeHours": round(cloud.node_hours(t), 6),
        "pendingP50s": round(_pct(waits, 50), 3),
        "pendingP95s": round(_pct(waits, 95), 3),
        "pendingP99s": round(_pct(waits, 99), 3),
        "pendingMaxS": round(max(waits), 3) if waits else 0.0,
        "nodesLaunched": cc.nodes_launched,
        "duplicateLaunches": cc.duplicate_nodes + cc.redundant_launches,
        "redundantLaunches": cc.redundant_launches,
        "unusedNodes": len(unused),
        "failedLaunches": cc.failed_launches,
        "disruptions": kc.disruptions,
        "spotInterruptions": kc.spot_interruptions,
        "spotInterruptionsSurvived": kc.spot_interruptions_survived,
        "podsArrived": kc.pods_arrived,
        "podsCompleted": kc.pods_completed,
        "podsRunning": cluster.running_count(),
        "podsPending": cluster.pending_count(),
        "podsCancelled": kc.pods_cancelled,
        "doNotDisruptViolations": kc.do_not_disrupt_violations,
        "nodesAliveAtEnd": len(cloud.alive()),
        "reconciles": reconciles,
        "controllerRestarts": restarts,
        "cloud": cc.as_dict(),
        "cluster": kc.as_dict(),
    }


def unused_nodes(cloud: SimCloud, cluster: SimCluster) -> list[str]:
    """Names of nodes bought that never ran a pod (launch and GPU-initialisation failures excluded)."""
    return [n for n in cloud.launched_node_names(include_failed=False) if n not in cluster.used_nodes]


def format_report(report: Mapping[str, Any]) -> str:
    """A short human-readable summary of a report."""
    lines = [
        f"scenario {report['scenario']} · policy {report['policy'] or '-'} · seed {report['seed']}",
        f"  simulated {report['simulatedSeconds'] / 3600:.1f} h in {report['wallSeconds']:.2f} s wall",
        f"  total cost          ${report['costUsd']:.2f}",
        f"  GPU-hours           {report['gpuHoursBought']:.1f} bought, {report['gpuHoursRequested']:.1f} requested"
        f" ({100 * report['gpuUtilization']:.1f} % utilised)",
        f"  pending time        p50 {report['pendingP50s']:.0f} s · p95 {report['pendingP95s']:.0f} s"
        f" · p99 {report['pendingP99s']:.0f} s",
        f"  nodes launched      {report['nodesLaunched']} ({report['duplicateLaunches']} duplicate,"
        f" {report['unusedNodes']} never used, {report['failedLaunches']} failed launches)",
        f"  disruptions         {report['disruptions']} pods",
        f"  spot interruptions  {report['spotInterruptions']} ({report['spotInterruptionsSurvived']} survived)",
        f"  pods                {report['podsArrived']} arrived, {report['podsCompleted']} completed,"
        f" {report['podsRunning']} running, {report['podsPending']} pending, {report['podsCancelled']} cancelled",
    ]
    return "\n".join(lines)


def plot_timeline(series: TimeSeries, path: Path, title: str = "") -> None:
    """Nodes and GPUs by pool, pending pods and cost rate over time, as one PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = series.samples
    span = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    unit, div = ("days", 86400.0) if span > 3 * 86400 else ("hours", 3600.0)
    t = [s.t / div for s in samples] or [0.0]
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    pools = sorted(series.pools)
    for ax, what, label in ((axes[0], "nodes", "nodes"), (axes[1], "gpus", "GPUs")):
        for p in pools:
            ys = [getattr(s, what).get(p, 0) for s in samples] or [0]
            ax.step(t, ys, where="post", label=p)
        ax.set_ylabel(f"{label} by pool")
        if pools:
            ax.legend(loc="upper right", fontsize="small")
    axes[2].step(t, [s.pending for s in samples] or [0], where="post", color="tab:red")
    axes[2].set_ylabel("pending pods")
    axes[3].step(t, [s.cost_rate for s in samples] or [0.0], where="post", color="tab:green")
    axes[3].set_ylabel("cost ($/h)")
    axes[3].set_xlabel(f"time ({unit})")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(report: Mapping[str, Any], series: TimeSeries, out_dir: str | Path) -> dict[str, Path]:
    """Write ``report.json``, ``timeseries.csv`` and ``timeline.png`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "csv": out / "timeseries.csv", "png": out / "timeline.png"}
    paths["json"].write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    series.write_csv(paths["csv"])
    plot_timeline(series, paths["png"], title=f"{report.get('scenario', '')} · {report.get('policy', '')}")
    return paths
