"""Where an openb replay's money goes: each registered node's price, second by second, split into *empty* (no pod),
*used* (the GPU share its pods request) and *free* (the rest of a node that runs pods; of which *all-free*: the share
no resource binds, i.e. the free room left after the largest of the GPU, CPU and memory shares), plus what
evictions threw away (each evicted pod's run time x its GPU share x its node's price per GPU), for one policy and
seed. Cost not split is boot time (launch to registration).

Usage: ``GPUSCALE_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/cost_split.py [POLICY] [SEED] [--set
KEY=YAML ...] [--pool-wait KEY=DURATION ...]`` (default gpuscale, seed 1; ``--set``/``--pool-wait`` as in
``bench_sim.py``). Prints JSON. It wraps the simulated cluster's bind, unbind, registration, removal and eviction
methods to watch them (a measuring tool, not a test; it reads the simulator's internals).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_sim
from gpuscale.manifests.quantity import parse_duration
from gpuscale.sim import cluster as sim_cluster
from gpuscale.sim.commands import simulate_policy


class Split:
    """Running integrals of $ by category, advanced at every change of a node's pods."""

    def __init__(self) -> None:
        self.t = 0.0
        self.usd: defaultdict[str, float] = defaultdict(float)
        self.nodes: dict[str, list[Any]] = {}  # name -> [price, gpu, cpu, mem, used gpu, cpu, mem, pods, type]
        self.lost: defaultdict[str, float] = defaultdict(float)
        self.ages: list[float] = []

    def advance(self, now: float) -> None:
        dt = now - self.t
        if dt > 0:
            for price, gpu, cpu, mem, ug, uc, um, count, _ in self.nodes.values():
                if count == 0:
                    self.usd["empty"] += price * dt / 3600
                    continue
                g = min(1.0, ug / gpu) if gpu else 1.0
                binding = min(1.0, max(g, uc / cpu if cpu else 0.0, um / mem if mem else 0.0))
                self.usd["used"] += price * g * dt / 3600
                self.usd["free"] += price * (1 - g) * dt / 3600
                self.usd["allFree"] += price * (1 - binding) * dt / 3600
        self.t = now

    def add_node(self, sn: Any, itype: Any, hourly_price: float) -> None:
        a = sn.allocatable
        self.nodes[sn.name] = [hourly_price, itype.gpu_count * 1000, a.cpu_milli, a.memory_mib, 0, 0, 0, 0, itype]

    def change(self, sn: Any, sp: Any, sign: int) -> None:
        n, req = self.nodes[sn.name], sp.pod.request
        n[4] += sign * req.gpu_demand_milli
        n[5] += sign * req.cpu_milli
        n[6] += sign * req.memory_mib
        n[7] += sign

    def evicted(self, now: float, sp: Any) -> None:
        age = now - sp.bound_at
        gpus = sp.pod.request.gpu_demand_milli / 1000
        usd = age / 3600 * gpus * sp.node.price / max(1, sp.node.gpu_count)
        self.lost["usd"] += usd
        self.lost["oldUsd"] += usd if age >= 6 * 3600 else 0.0
        self.ages.append(age)


class Tally(Protocol):
    """What :func:`watch` feeds: a running integral advanced to each change, and the tally's own bookkeeping."""

    nodes: dict[str, Any]

    def advance(self, now: float) -> None: ...

    def add_node(self, sn: Any, itype: Any, hourly_price: float) -> None: ...

    def change(self, sn: Any, sp: Any, sign: int) -> None: ...

    def evicted(self, now: float, sp: Any) -> None: ...


def watch(tally: Tally) -> None:
    """Wrap the simulated cluster's registration, bind, unbind, removal and eviction so that ``tally`` is advanced to
    each change and told of it (a node registered, a pod bound (+1) or unbound (-1), a node gone, a bound pod evicted
    by the controller)."""
    c = sim_cluster.SimCluster
    reg, bind, unbind, remove, repend = c.node_registered, c._bind, c._unbind, c._remove_node, c._repend

    def node_registered(self: Any, node: Any, itype: Any, taints: Any, hourly_price: float, gpu_delay: Any) -> None:
        new = node.node_name not in self._nodes
        reg(self, node, itype, taints, hourly_price, gpu_delay)
        if new:
            tally.advance(self.engine.now())
            tally.add_node(self._nodes[node.node_name], itype, hourly_price)

    def _bind(self: Any, sp: Any, slot: int, placement: Any = None) -> None:
        tally.advance(self.engine.now())
        tally.change(self._slots[slot], sp, 1)
        bind(self, sp, slot, placement)

    def _unbind(self: Any, sp: Any) -> Any:
        tally.advance(self.engine.now())
        tally.change(sp.node, sp, -1)
        return unbind(self, sp)

    def _remove_node(self: Any, sn: Any, reason: str, *, by_controller: bool) -> None:
        remove(self, sn, reason, by_controller=by_controller)
        tally.advance(self.engine.now())
        tally.nodes.pop(sn.name, None)

    def _repend(self: Any, sp: Any, reason: str, *, by_controller: bool) -> None:
        if by_controller and sp.bound_at is not None:
            tally.evicted(self.engine.now(), sp)
        repend(self, sp, reason, by_controller=by_controller)

    c.node_registered, c._bind, c._unbind = node_registered, _bind, _unbind  # type: ignore[method-assign]
    c._remove_node, c._repend = _remove_node, _repend  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy", nargs="?", default="gpuscale")
    ap.add_argument("seed", nargs="?", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=YAML")
    ap.add_argument("--pool-wait", action="append", default=[], metavar="KEY=DURATION")
    args = ap.parse_args(argv)
    options = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    waits = {k: parse_duration(v) for k, _, v in (s.partition("=") for s in args.pool_wait)}
    split = Split()
    watch(split)
    scenario, work = bench_sim._openb_workload()
    scenario = bench_sim._with_options(dataclasses.replace(scenario, seed=args.seed), args.policy, options, waits)
    res = simulate_policy(scenario, args.policy, work)
    split.advance(res.engine.now())
    r = res.report
    ages = sorted(split.ages)
    out = {
        "policy": args.policy,
        "seed": args.seed,
        "costUsd": round(r["costUsd"], 2),
        "pendingP95s": r["pendingP95s"],
        "emptyUsd": round(split.usd["empty"], 1),
        "usedUsd": round(split.usd["used"], 1),
        "freeUsd": round(split.usd["free"], 1),
        "allFreeUsd": round(split.usd["allFree"], 1),
        "bootUsd": round(r["costUsd"] - split.usd["empty"] - split.usd["used"] - split.usd["free"], 1),
        "evictions": len(ages),
        "lostWorkUsd": round(split.lost["usd"], 1),
        "lostWorkOfPodsOver6hUsd": round(split.lost["oldUsd"], 1),
        "evictedAgeMinutes p50/p90": [round(ages[len(ages) // 2] / 60, 1), round(ages[int(0.9 * len(ages))] / 60, 1)]
        if ages
        else [],
        "costByInstanceType": {
            k: round(v, 1) for k, v in sorted(r["costByInstanceType"].items(), key=lambda kv: -kv[1])
        },
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
