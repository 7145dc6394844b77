"""Run the openb scorers on openb workloads (10 seeds each) and print one table per workload.

Usage: ``.venv/bin/python benchmarks/bench_openb.py [--seeds 42-51] [--workloads default,multigpu30] [--scorers
fgd,fill-reserve] [--file-order] [--json OUT.json]``. A workload is a shipped pod list (``default``, ``cpu050``,
``gpushare40``, ``gpuspec10``, ``multigpu20``) or ``multigpuNN``, built from ``default`` with the openb rule
(``gpuscale bench openb --multigpu NN``) when no such file is shipped. Each table is the same as
``.venv/bin/gpuscale bench openb --scorer NAME --pods ...`` (``--multigpu NN`` for the built variants).

``--bound`` prints, instead, per workload and seed, a fluid bound on the unallocated share at k = 100 for runs that
place every fractional pod arriving before k = 100 (see :func:`fluid_bound`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from gpuscale.bench.openb import (
    DATA_DIR,
    DEFAULT_NODES,
    arrival_sequence,
    load_workload,
    multigpu_variant,
    parse_seeds,
    render_table,
    run_bench,
)
from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.scoring import SCORERS
from gpuscale.core.scoring.fillpair import cutting_stock_prices
from gpuscale.core.state import NodeShape
from gpuscale.errors import InputError

WORKLOADS = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20", "multigpu30", "multigpu40", "multigpu50")


def pods_file(workload: str) -> Path:
    """The shipped pod list of ``workload``."""
    return DATA_DIR / f"openb_pod_list_{workload}.csv.gz"


def workload_requests(workload: str) -> tuple[list[NodeShape], list[Request]]:
    """The cluster and the requests of ``workload``: a shipped pod list, or ``multigpuNN`` built from default."""
    path = pods_file(workload)
    built = re.fullmatch(r"multigpu(\d+)", workload)
    if path.exists() or not built:
        return load_workload(DEFAULT_NODES, path)
    shapes, requests = load_workload(DEFAULT_NODES, pods_file("default"))
    return shapes, multigpu_variant(requests, float(built.group(1)))


def fluid_bound(shapes: Sequence[NodeShape], requests: Sequence[Request], seed: int, shuffle: bool = True) -> float:
    """Unallocated GPU share (%) at k = 100 below which no run goes that places every fractional pod arriving before
    arrived demand reaches the capacity: the remnants of the fewest GPUs (fluid, by the cutting-stock LP, whose
    optimum is what its dual prices pay) that hold those fractions, ignoring CPU, memory and GPU models. Runs that
    let some fractions fail at the end may go below it."""
    capacity = sum(s.capacity.gpus for s in shapes) * MILLI_PER_GPU
    arrived = 0
    counts: Counter[int] = Counter()
    for i in arrival_sequence(requests, capacity, seed, shuffle=shuffle):
        arrived += requests[i].gpu_demand_milli
        if arrived > capacity:
            break
        if requests[i].gpu_milli:
            counts[requests[i].gpu_milli] += 1
    prices = cutting_stock_prices(counts)
    gpus = sum(prices[s] * n for s, n in counts.items())
    return 100.0 * (gpus * MILLI_PER_GPU - sum(s * n for s, n in counts.items())) / capacity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--file-order", action="store_true", help="place the file's pods in file order")
    parser.add_argument("--json", type=Path, help="also write all results to this JSON file")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--scorers", default="all", help="comma-separated scorer names, or all")
    parser.add_argument("--bound", action="store_true", help="print the fluid bound at k=100 per seed instead")
    args = parser.parse_args(argv)
    console = Console()
    try:
        seeds = parse_seeds(args.seeds)
        names = sorted(SCORERS) if args.scorers == "all" else args.scorers.split(",")
        unknown = [n for n in names if n not in SCORERS]
        if unknown:
            raise InputError("unknown scorer", where="--scorers", value=",".join(unknown),
                             fix=f"use names from {', '.join(sorted(SCORERS))}, or all")  # fmt: skip
        out = []
        for workload in args.workloads.split(","):
            shapes, requests = workload_requests(workload)
            if args.bound:
                bounds = [fluid_bound(shapes, requests, s, shuffle=not args.file_order) for s in seeds]
                console.print(f"{workload}: fluid bound at k=100, median {statistics.median(bounds):.2f} %; per seed "
                              + ", ".join(f"{s}: {b:.2f}" for s, b in zip(seeds, bounds, strict=True)))  # fmt: skip
                out.append({"workload": workload, "bound_k100": dict(zip(map(str, seeds), bounds, strict=True))})
                continue
            results = [
                run_bench(shapes, requests, name, seeds, workload=workload, shuffle=not args.file_order)
                for name in names
            ]
            render_table(results, console)
            out += [r.to_json() for r in results]
    except InputError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
