"""The same workload on several clouds, side by side: cost, pending time, launches and capacity errors.

Each argument is a scenario file; the default pair is burst-from-zero (Linode LKE) and eks-burst (EKS), which replay
the same 64-pod burst on each provider's catalog with that provider's latencies and capacity. Each scenario runs
through ``gpuscale simulate --json``::

    .venv/bin/python benchmarks/providers_side_by_side.py
    .venv/bin/python benchmarks/providers_side_by_side.py benchmarks/scenarios/*.yaml
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = [HERE / "scenarios" / "burst-from-zero.yaml", HERE / "scenarios" / "eks-burst.yaml"]
COLUMNS = (
    ("scenario", lambda r: r["scenario"]),
    ("cost $", lambda r: f"{r['costUsd']:.2f}"),
    ("pending p50 s", lambda r: f"{r['pendingP50s']:.0f}"),
    ("pending p95 s", lambda r: f"{r['pendingP95s']:.0f}"),
    ("nodes", lambda r: str(r["nodesLaunched"])),
    ("capacity errors", lambda r: str(r["cloud"]["insufficient_capacity"])),
    ("duplicates", lambda r: str(r["duplicateLaunches"])),
    ("pods done", lambda r: f"{r['podsCompleted']}/{r['podsArrived']}"),
)


def run(scenario: Path) -> dict:
    exe = Path(sys.executable).with_name("gpuscale")
    out = subprocess.run([str(exe), "simulate", str(scenario), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv: list[str]) -> int:
    reports = [run(Path(a)) for a in (argv or DEFAULT)]
    rows = [[fmt(r) for _, fmt in COLUMNS] for r in reports]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, (h, _) in enumerate(COLUMNS)]
    print("  ".join(h.ljust(w) for (h, _), w in zip(COLUMNS, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
