"""A finer split of an openb replay's money than ``cost_split.py``: each registered node's price, second by second,
split by what its pods request (GPU share used; GPU free behind CPU or memory, of which on GPU nodes running only
CPU-only pods and on nodes running GPU and CPU-only pods; free on every resource; empty), the on-demand premium, the
instance type (binding share at the node's spot price above each pod's cheapest single-node rate), the evictions
(work lost at the GPU share, by the consolidation that caused them; CPU-only pods' evictions and their work at their
CPU or memory share) and two reach estimates, sampled every minute by a greedy first fit: CPU-only nodes whose pods
fit in the spare CPU and memory of nodes running GPU pods, and nodes whose pods all fit in the free room of the other
nodes running pods (by the age of their oldest pod). The tables of docs/policies.md ("Where the money above the bound
goes now") come from it.

Usage: ``GPUSCALE_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/cost_split_fine.py [POLICY] [SEED] [--set
KEY=YAML ...] [--pool-wait KEY=DURATION ...]`` (as ``cost_split.py``). Prints JSON. It wraps the simulated cluster's
methods to watch them (a measuring tool, not a test; it reads the simulator's internals).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_sim
from cost_split import watch
from gpuscale.core.model import CapacityType, Catalog
from gpuscale.core.resources import Request
from gpuscale.sim.commands import simulate_policy

SAMPLE_S = 60.0
"""How often the reach estimates are taken (s of simulated time)."""
OLD_S = 6 * 3600.0
YOUNG_S = 3600.0


class Fine:
    """Running integrals of $ by category, advanced at every change of a node's pods."""

    def __init__(self, catalog: Catalog) -> None:
        self.t = 0.0
        self.usd: defaultdict[str, float] = defaultdict(float)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bound_at: dict[str, float] = {}
        self.lost: defaultdict[str, float] = defaultdict(float)
        self.evictions: list[tuple[float, str, str, float, bool]] = []  # (time, pod, node, age, CPU-only)
        self.last_sample = -1e18
        self.reach_cpu: set[str] = set()
        self.reach_merge: dict[str, str] = {}
        self.spot: dict[str, tuple[float, Any]] = {}
        for it in catalog.instance_types:
            prices = [o.hourly_price for o in it.offerings if o.capacity_type is CapacityType.SPOT]
            if prices:
                self.spot[it.name] = (min(prices), it)
        self._rates: dict[tuple[int, int, int], float] = {}

    def rate(self, r: Request) -> float:
        """A pod's cheapest single-node rate: the least spot price x binding share over the types that hold it."""
        key = (r.cpu_milli, r.memory_mib, r.gpu_demand_milli)
        if key not in self._rates:
            best = 0.0
            for price, it in self.spot.values():
                c = it.capacity
                if r.gpu_demand_milli and not it.gpu_count:
                    continue
                g = r.gpu_demand_milli / (it.gpu_count * 1000) if it.gpu_count else 0.0
                share = max(g, r.cpu_milli / c.cpu_milli, r.memory_mib / c.memory_mib)
                if share <= 1.0 and (best == 0.0 or price * share < best):
                    best = price * share
            self._rates[key] = best
        return self._rates[key]

    def sample(self) -> None:
        """The two reach estimates at ``self.t``."""
        busy = [(name, n) for name, n in self.nodes.items() if n["pods"] and not n["sn"].unschedulable]
        bins = [[n["cpu"] - n["uc"], n["mem"] - n["um"]] for _, n in busy if n["ug"] > 0]
        self.reach_cpu = set()
        for name, n in sorted(busy, key=lambda b: -b[1]["price"]):
            if n["ug"] or not n["gpu"]:
                continue
            trial = [list(b) for b in bins]
            if _place(list(n["pods"].values()), trial, gpu=False):
                bins = trial
                self.reach_cpu.add(name)
        free = {name: [n["cpu"] - n["uc"], n["mem"] - n["um"], n["gpu"] - n["ug"]] for name, n in busy}
        self.reach_merge = {}
        for name, n in sorted(busy, key=lambda b: (-b[1]["price"], b[0])):
            others = {k: list(v) for k, v in free.items() if k != name and k not in self.reach_merge}
            rows = list(others.values())
            if _place(list(n["pods"].values()), rows, gpu=True):
                free.update(others)
                oldest = max(self.t - self.bound_at.get(k, self.t) for k in n["pods"])
                self.reach_merge[name] = "young" if oldest < YOUNG_S else "older"

    def advance(self, now: float) -> None:
        dt = now - self.t
        if dt <= 0:
            return
        if now - self.last_sample >= SAMPLE_S:
            self.sample()
            self.last_sample = now
        h = dt / 3600.0
        u = self.usd
        for name, n in self.nodes.items():
            price = n["price"]
            if not n["pods"]:
                u["empty"] += price * h
                continue
            gpu, cpu, mem = n["gpu"], n["cpu"], n["mem"]
            g = min(1.0, n["ug"] / gpu) if gpu else 1.0
            binding = min(1.0, max(g, n["uc"] / cpu if cpu else 0.0, n["um"] / mem if mem else 0.0))
            u["usedGpuShare"] += price * g * h
            u["allFree"] += price * (1 - binding) * h
            u["gpuFreeBehindCpuOrMemory"] += price * (binding - g) * h
            if gpu and not n["ug"]:
                u["...onCpuOnlyNodes"] += price * binding * h
                u["cpuOnlyNodeHours"] += h
            elif n["cpuPods"]:
                u["...onNodesWithGpuAndCpuOnlyPods"] += price * (binding - g) * h
            spot = self.spot.get(n["type"], (price, None))[0]
            if n["capacityType"] != str(CapacityType.SPOT):
                u["onDemandAboveSpot"] += (price - spot) * binding * h
            u["instanceType"] += (spot * binding - sum(self.rate(r) for r in n["pods"].values())) * h
            if name in self.reach_cpu:
                u["reachCpuOnlyIntoGpuNodes"] += price * h
            if (kind := self.reach_merge.get(name)) is not None:
                u[f"reachMerge.{kind}"] += price * h
        self.t = now

    def add_node(self, sn: Any, itype: Any, hourly_price: float) -> None:
        a = sn.allocatable
        self.nodes[sn.name] = {
            "price": hourly_price,
            "gpu": itype.gpu_count * 1000,
            "cpu": a.cpu_milli,
            "mem": a.memory_mib,
            "ug": 0,
            "uc": 0,
            "um": 0,
            "cpuPods": 0,
            "pods": {},
            "type": itype.name,
            "capacityType": sn.labels.get("karpenter.sh/capacity-type", ""),
            "sn": sn,
        }

    def change(self, sn: Any, sp: Any, sign: int) -> None:
        n = self.nodes[sn.name]
        r = sp.pod.request
        n["ug"] += sign * r.gpu_demand_milli
        n["uc"] += sign * r.cpu_milli
        n["um"] += sign * r.memory_mib
        n["cpuPods"] += 0 if r.gpu_demand_milli else sign
        if sign > 0:
            n["pods"][sp.pod.key] = r
            self.bound_at[sp.pod.key] = self.t
        else:
            n["pods"].pop(sp.pod.key, None)

    def evicted(self, now: float, sp: Any) -> None:
        age = now - sp.bound_at
        r = sp.pod.request
        n = self.nodes.get(sp.node.name)
        if r.gpu_demand_milli:
            usd = age / 3600 * r.gpu_demand_milli / 1000 * sp.node.price / max(1, sp.node.gpu_count)
            self.lost["gpuPodsUsd"] += usd
            self.lost["gpuPodsOver6hUsd"] += usd if age >= OLD_S else 0.0
            self.lost["gpuPodsOver6hEvictions"] += 1 if age >= OLD_S else 0
            self.lost["gpuPodsOver6hGpuHours"] += age / 3600 * r.gpu_demand_milli / 1000 if age >= OLD_S else 0.0
            self.lost["gpuPodsGpuHours"] += age / 3600 * r.gpu_demand_milli / 1000
        elif n is not None:
            share = max(r.cpu_milli / n["cpu"], r.memory_mib / n["mem"])
            self.lost["cpuOnlyPodsUsd"] += age / 3600 * share * sp.node.price
        self.evictions.append((now, sp.pod.key, sp.node.name, age, not r.gpu_demand_milli))


def _place(reqs: list[Request], rows: list[list[int]], *, gpu: bool) -> bool:
    """Place ``reqs`` (largest first) on the first row with room (CPU, memory and, if ``gpu``, milli-GPU in all);
    False if one does not fit (``rows`` are then partly used)."""
    for r in sorted(reqs, key=lambda r: (-r.gpu_demand_milli, -r.cpu_milli)):
        if r.gpu_demand_milli and not gpu:
            return False
        for row in sorted(rows, key=lambda row: (row[2] if gpu else 0, row[0])):
            if row[0] >= r.cpu_milli and row[1] >= r.memory_mib and (not gpu or row[2] >= r.gpu_demand_milli):
                row[0] -= r.cpu_milli
                row[1] -= r.memory_mib
                if gpu:
                    row[2] -= r.gpu_demand_milli
                break
        else:
            return False
    return True


def _cause(message: str) -> str:
    for prefix, name in (("rightsize set", "rightsize set"), ("rightsize", "rightsize")):
        if message.startswith(prefix):
            return name
    if "spot to spot" in message:
        return "spotToSpot"
    return "replace" if "replace by" in message else "delete"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy", nargs="?", default="gpuscale")
    ap.add_argument("seed", nargs="?", type=int, default=1)
    bench_sim.add_option_args(ap)
    args = ap.parse_args(argv)
    options, waits = bench_sim.parse_option_args(ap, args)
    scenario, work = bench_sim._openb_workload()
    fine = Fine(scenario.catalog)
    watch(fine)
    scenario = bench_sim._with_options(dataclasses.replace(scenario, seed=args.seed), args.policy, options, waits)
    res = simulate_policy(scenario, args.policy, work)
    fine.advance(res.engine.now())
    r = res.report
    split = fine.usd
    boot = r["costUsd"] - split["empty"] - split["usedGpuShare"] - split["allFree"] - split["gpuFreeBehindCpuOrMemory"]
    # each eviction's cause: the node's last Consolidate event at or before it
    by_node: defaultdict[str, list[Any]] = defaultdict(list)
    for e in res.cluster.events:
        if e.kind == "Consolidate":
            by_node[e.object.removeprefix("node/")].append(e)
    causes: defaultdict[str, int] = defaultdict(int)
    per_pod: defaultdict[str, int] = defaultdict(int)
    for t, key, node, _, cpu_only in fine.evictions:
        before = [e for e in by_node.get(node, ()) if e.at <= t + 1]
        causes[f"{before[-1].reason}/{_cause(before[-1].message)}" if before else "other"] += 1
        per_pod[key] += 1 if cpu_only else 0
    gpu_ages = [e[3] for e in fine.evictions if not e[4]]
    out = {
        "policy": args.policy,
        "seed": args.seed,
        "costUsd": round(r["costUsd"], 2),
        "pendingP95s": r["pendingP95s"],
        "bootUsd": round(boot, 1),
        **{f"{k}Usd" if not k.endswith("Hours") else k: round(v, 1) for k, v in sorted(split.items())},
        "lostWork": {k: round(v, 1) for k, v in sorted(fine.lost.items())},
        "evictions": len(fine.evictions),
        "evictionsByCause": dict(sorted(causes.items(), key=lambda kv: -kv[1])),
        "gpuPodEvictionAgeMinutesP50": round(sorted(gpu_ages)[len(gpu_ages) // 2] / 60, 1) if gpu_ages else None,
        "cpuOnlyPodEvictions": sum(1 for e in fine.evictions if e[4]),
        "cpuOnlyPodsEvicted": sum(1 for v in per_pod.values() if v),
        "mostEvictionsOfOneCpuOnlyPod": max(per_pod.values(), default=0),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
