"""Run every shipped scorer on every shared openb workload (10 seeds each) and print one table per workload.

Usage: ``.venv/bin/python benchmarks/bench_openb.py [--seeds 42-51] [--file-order] [--json OUT.json]``
(the same as ``.venv/bin/gpuscale bench openb --scorer all --pods ...`` for each workload).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from gpuscale.bench.openb import DATA_DIR, DEFAULT_NODES, load_workload, parse_seeds, render_table, run_bench
from gpuscale.core.scoring import SCORERS
from gpuscale.errors import InputError

WORKLOADS = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--file-order", action="store_true", help="place the file's pods in file order")
    parser.add_argument("--json", type=Path, help="also write all results to this JSON file")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args(argv)
    console = Console()
    try:
        seeds = parse_seeds(args.seeds)
        out = []
        for workload in args.workloads.split(","):
            shapes, requests = load_workload(DEFAULT_NODES, DATA_DIR / f"openb_pod_list_{workload}.csv.gz")
            results = [
                run_bench(shapes, requests, name, seeds, workload=workload, shuffle=not args.file_order)
                for name in sorted(SCORERS)
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
