"""The same workload on several clouds, side by side: a thin wrapper of ``gpuscale compare --providers``.

Without arguments it runs burst-from-zero under gpuscale on the LKE, EKS, GKE and ACK profiles of the simulator
(see docs/simulator.md, "Provider profiles"); any arguments are passed on to ``gpuscale compare``::

    .venv/bin/python benchmarks/providers_side_by_side.py
    .venv/bin/python benchmarks/providers_side_by_side.py benchmarks/scenarios/gke-spot.yaml --json
    .venv/bin/gpuscale compare --providers lke,eks,gke,ack benchmarks/scenarios/eks-burst.yaml   # the same
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuscale.cli import main as gpuscale_main

HERE = Path(__file__).resolve().parent
DEFAULT_SCENARIO = HERE / "scenarios" / "burst-from-zero.yaml"
PROVIDERS = "lke,eks,gke,ack"


def main(argv: list[str]) -> int:
    args = list(argv)
    if not any(a.endswith((".yaml", ".yml")) for a in args):
        args.append(str(DEFAULT_SCENARIO))
    if not any(a == "--providers" or a.startswith("--providers=") for a in args):
        args = ["--providers", PROVIDERS, *args]
    gpuscale_main(["compare", *args], prog_name="gpuscale", standalone_mode=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
