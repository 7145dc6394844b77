"""Controller and simulator targets, measured on shipped scenarios (``benchmarks/scenarios/``).

Usage: ``.venv/bin/python benchmarks/bench_sim.py [replay] [burst] [compare] [seeds] [--json OUT.json]`` (the first
three by default).

* ``replay``: the openb default trace (8,152 pods, ~149 days) replayed with autoscaling by gpuscale: wall time
  (target <= 6 s on 2 cores), reconciles, cost, pending percentiles.
* ``burst``: 64 one-GPU pods on an empty cluster with a 120 s device-plugin delay: duplicate nodes (target 0).
* ``compare``: the openb replay under gpuscale and the cluster-autoscaler-like baseline, plus the offline lower
  bound: gpuscale at least 25 % cheaper than cluster-autoscaler with p95 pending time no worse, and within
  1.15 x the lower bound.
* ``seeds``: the openb replay under gpuscale, cluster-autoscaler and Karpenter-like with seeds 1-4 (cloud latencies
  and faults change with the seed; the workload does not), two runs at a time: cost and p95 pending per seed and
  their means (the mean cost also over the lower bound), so that one lucky or unlucky seed does not decide a
  comparison.
* ``decisions``: seed 1 under gpuscale and Karpenter-like: consolidations by reason and action, pods disrupted,
  nodes launched, GPU-hours bought and requested (why one is cheaper than the other).

``--set KEY=YAML`` adds a gpuscale policy setting (e.g. ``'evictionCost={horizon: 1h}'``, ``'headroom={gpu:
{maxNodes: 2, maxHourlyCost: 4}}'``; the baselines ignore gpuscale's options), ``--pool-wait
consolidateEmptyAfter=5m`` changes gpuscale's pools' waits, ``--policies gpuscale`` limits ``seeds`` to some
policies (see docs/policies.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from gpuscale.manifests.quantity import parse_duration
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.policies import lower_bound
from gpuscale.sim.runner import SimResult
from gpuscale.sim.scenario import Scenario, load_scenario
from gpuscale.sim.workloads import Arrival

HERE = Path(__file__).resolve().parent / "scenarios"
KEYS = ("costUsd", "pendingP50s", "pendingP95s", "pendingP99s", "nodesLaunched", "duplicateLaunches", "disruptions")


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


@functools.cache
def _openb_workload() -> tuple[Scenario, tuple[Arrival, ...]]:
    """The openb replay scenario and its arrivals, parsed once per process."""
    scenario = load_scenario(HERE / "openb-default.yaml")
    return scenario, tuple(scenario.arrivals())


OPTIONS: dict[str, Any] = {}
"""Settings merged into the scenario's ``policy`` mapping for gpuscale (``--set KEY=YAML``; the baselines ignore
gpuscale's own options such as ``evictionCost`` and ``headroom``)."""


POOL_WAITS: dict[str, float] = {}
"""``--pool-wait consolidateAfter=1m`` / ``consolidateEmptyAfter=5m``: gpuscale's pools wait this long instead (the
baselines set their own waits)."""


def _with_options(scenario: Scenario, policy: str, options: dict[str, Any], waits: dict[str, float]) -> Scenario:
    if policy != "gpuscale" or not (options or waits):
        return scenario
    names = {"consolidateAfter": "consolidate_after_s", "consolidateEmptyAfter": "consolidate_empty_after_s"}
    changes: dict[str, Any] = {names[k]: v for k, v in waits.items()}
    pools = tuple(
        dataclasses.replace(p, disruption=dataclasses.replace(p.disruption, **changes)) for p in scenario.pools
    )
    return dataclasses.replace(scenario, policy={**scenario.policy, **options}, pools=pools)


@functools.cache
def _openb(policy: str) -> tuple[SimResult, float]:
    """The openb replay under ``policy`` and its wall time, run once per process (replay and compare share it)."""
    scenario, work = _openb_workload()
    scenario = _with_options(scenario, policy, OPTIONS, POOL_WAITS)
    t0 = time.perf_counter()
    res = simulate_policy(scenario, policy, work)
    return res, time.perf_counter() - t0


@functools.cache
def _openb_bound() -> float:
    """The offline lower bound of the openb replay (the workload does not depend on the seed)."""
    scenario, work = _openb_workload()
    return lower_bound(work, scenario.pools, scenario.catalog)


def replay() -> dict[str, Any]:
    """openb default under gpuscale: wall time."""
    res, wall = _openb("gpuscale")
    pods = res.arrivals
    out = {"pods": pods, "wallSeconds": round(wall, 2), "reconciles": res.reconciles}
    out |= {k: res.report[k] for k in KEYS}
    print(
        f"replay  openb default: {pods} pods, {res.reconciles} reconciles in {wall:.2f} s wall "
        f"(target <= 6 s: {_verdict(wall <= 6)})"
    )
    print(f"        cost ${res.report['costUsd']:,.2f}, p95 pending {res.report['pendingP95s']:.0f} s")
    return out


def burst() -> dict[str, Any]:
    """Burst from zero with a slow device plugin: duplicate nodes."""
    scenario = load_scenario(HERE / "burst-from-zero.yaml")
    res = simulate_policy(scenario, "gpuscale")
    r = res.report
    out = {k: r[k] for k in ("nodesLaunched", "duplicateLaunches", "unusedNodes", "podsRunning", "pendingP95s")}
    print(
        f"burst   64 one-GPU pods, 120 s device plugin: {r['nodesLaunched']} nodes launched, "
        f"{r['duplicateLaunches']} duplicate, {r['unusedNodes']} never used (target 0 duplicates: "
        f"{_verdict(r['duplicateLaunches'] == 0)}), p95 pending {r['pendingP95s']:.0f} s"
    )
    return out


def compare() -> dict[str, Any]:
    """gpuscale vs the cluster-autoscaler-like baseline and the lower bound on the openb replay."""
    rows: dict[str, dict[str, Any]] = {}
    for policy in ("gpuscale", "cluster-autoscaler", "karpenter"):
        res, wall = _openb(policy)
        rows[policy] = {k: res.report[k] for k in KEYS} | {"wallSeconds": round(wall, 2)}
    t0 = time.perf_counter()
    bound = _openb_bound()
    rows["lower-bound"] = {"costUsd": round(bound, 2), "wallSeconds": round(time.perf_counter() - t0, 2)}
    for name, row in rows.items():
        extra = "" if name == "lower-bound" else f"  p95 {row['pendingP95s']:7.1f} s  nodes {row['nodesLaunched']}"
        print(f"compare {name:20s} ${row['costUsd']:12,.2f}{extra}  ({row['wallSeconds']} s)")
    g, ca = rows["gpuscale"], rows["cluster-autoscaler"]
    saving = 1 - g["costUsd"] / ca["costUsd"]
    ratio = g["costUsd"] / bound if bound > 0 else float("inf")
    print(f"        gpuscale {saving:.1%} cheaper than cluster-autoscaler (target >= 25 %: {_verdict(saving >= 0.25)})")
    print(
        f"        p95 pending {g['pendingP95s']:.1f} s vs {ca['pendingP95s']:.1f} s "
        f"(target no worse: {_verdict(g['pendingP95s'] <= ca['pendingP95s'])})"
    )
    print(f"        {ratio:.3f} x the offline lower bound (target <= 1.15: {_verdict(ratio <= 1.15)})")
    return {"rows": rows, "savingVsClusterAutoscaler": round(saving, 4), "costOverLowerBound": round(ratio, 4)}


SEEDS = (1, 2, 3, 4)
SEED_POLICIES = ("gpuscale", "cluster-autoscaler", "karpenter")


def _seed_run(policy: str, seed: int, options: dict[str, Any], waits: dict[str, float]) -> tuple[float, float]:
    scenario, work = _openb_workload()
    scenario = _with_options(dataclasses.replace(scenario, seed=seed), policy, options, waits)
    res = simulate_policy(scenario, policy, work)
    return res.report["costUsd"], res.report["pendingP95s"]


def seeds() -> dict[str, Any]:
    """The openb replay with several seeds per policy: means of cost and p95 pending."""
    jobs = [(policy, seed) for policy in SEED_POLICIES for seed in SEEDS]
    with ProcessPoolExecutor(max_workers=2) as pool:
        runs = pool.map(_seed_run, *zip(*jobs, strict=True), [OPTIONS] * len(jobs), [POOL_WAITS] * len(jobs))
        results = dict(zip(jobs, runs, strict=True))
    bound = _openb_bound()
    out: dict[str, Any] = {"lowerBoundUsd": round(bound, 2), "options": OPTIONS, "poolWaits": POOL_WAITS}
    for policy in SEED_POLICIES:
        costs = [results[(policy, s)][0] for s in SEEDS]
        p95s = [results[(policy, s)][1] for s in SEEDS]
        out[policy] = {
            "seeds": list(SEEDS),
            "costUsd": [round(c, 2) for c in costs],
            "pendingP95s": [round(p, 1) for p in p95s],
            "meanCostUsd": round(statistics.mean(costs), 2),
            "meanPendingP95s": round(statistics.mean(p95s), 1),
            "meanOverLowerBound": round(statistics.mean(costs) / bound, 3),
        }
        cost_text = " ".join(f"{c:9,.0f}" for c in costs)
        p95_text = " ".join(f"{p:5.1f}" for p in p95s)
        mean = statistics.mean(costs)
        print(
            f"seeds   {policy:20s} cost {cost_text}  mean ${mean:,.0f} ({mean / bound:.3f} x the lower bound)"
            f"  p95 {p95_text}  mean {statistics.mean(p95s):.1f} s"
        )
    return out


def decisions() -> dict[str, Any]:
    """Seed 1 of the openb replay under gpuscale and Karpenter-like: what each consolidation decided (by reason and
    action), pods disrupted, nodes launched, GPU-hours bought and requested."""
    out: dict[str, Any] = {}
    for policy in ("gpuscale", "karpenter"):
        res, _ = _openb(policy)
        r = res.report
        kinds = Counter(
            f"{e.reason}/{(e.data or {}).get('action', '')}" for e in res.cluster.events if e.kind == "Consolidate"
        )
        row = {k: r[k] for k in ("costUsd", "pendingP95s", "nodesLaunched", "disruptions")}
        row |= {"gpuHoursBought": round(r["gpuHoursBought"], 1), "gpuHoursRequested": round(r["gpuHoursRequested"], 1)}
        out[policy] = row | {"consolidations": dict(sorted(kinds.items()))}
        print(
            f"decide  {policy:20s} ${r['costUsd']:,.2f}  p95 {r['pendingP95s']:.1f} s  nodes {r['nodesLaunched']}  "
            f"pods disrupted {r['disruptions']}  GPU-h bought {r['gpuHoursBought']:,.0f} "
            f"(requested {r['gpuHoursRequested']:,.0f})"
        )
        print("        consolidations " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    return out


def add_option_args(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=YAML`` and ``--pool-wait KEY=DURATION`` (both repeatable); read with :func:`parse_option_args`."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=YAML",
        help="a gpuscale policy setting for the openb runs, e.g. 'evictionCost={horizon: 1h}' (repeatable)",
    )
    parser.add_argument(
        "--pool-wait",
        action="append",
        default=[],
        metavar="KEY=DURATION",
        help="consolidateAfter or consolidateEmptyAfter of gpuscale's pools for the openb runs (repeatable)",
    )


def parse_option_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, float]]:
    """The gpuscale options and pool waits given by :func:`add_option_args`' flags (a bad one: ``parser.error``)."""
    options: dict[str, Any] = {}
    waits: dict[str, float] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set wants KEY=YAML, got {item!r}")
        options[key] = yaml.safe_load(value)
    for item in args.pool_wait:
        key, sep, value = item.partition("=")
        if key not in ("consolidateAfter", "consolidateEmptyAfter") or not sep:
            parser.error(f"--pool-wait wants consolidateAfter=DURATION or consolidateEmptyAfter=DURATION, got {item!r}")
        waits[key] = parse_duration(value)
    return options, waits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="*", help="replay, burst, compare, seeds, decisions (default: the first three)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    add_option_args(parser)
    parser.add_argument(
        "--policies", help="comma-separated policies for `seeds` (default: gpuscale,cluster-autoscaler,karpenter)"
    )
    args = parser.parse_args(argv)
    options, waits = parse_option_args(parser, args)
    OPTIONS.update(options)
    POOL_WAITS.update(waits)
    if args.policies:
        global SEED_POLICIES
        SEED_POLICIES = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    runs = {"replay": replay, "burst": burst, "compare": compare, "seeds": seeds, "decisions": decisions}
    which = args.which or ["replay", "burst", "compare"]
    unknown = [w for w in which if w not in runs]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(runs)}")
    out = {name: runs[name]() for name in which}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
