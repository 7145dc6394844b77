"""The openb replay with the consolidation gate's check mode on: every round also runs the uncached reference and
records where the cached decisions differ (the gate's invariant: there are none; see controller/consolidation.py).

Usage: ``GPUSCALE_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/gate_check.py`` (about twice the replay's
time). Prints the replay's figures and each mismatch; exits 1 if there is any.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sim import KEYS, _openb_workload
from gpuscale.controller.options import options_controller
from gpuscale.sim.runner import run_simulation


def main() -> int:
    made: list[Any] = []

    def factory(**kw: Any) -> Any:
        ctrl = options_controller(**kw)
        ctrl.gate.check = True
        made.append(ctrl)
        return ctrl

    scenario, work = _openb_workload()
    res = run_simulation(scenario, factory, arrivals=list(work), policy_name="gpuscale")
    print({k: res.report[k] for k in KEYS})
    mismatches = made[0].gate.mismatches
    print(f"check mode: {len(mismatches)} round(s) where the cached decisions differ from the uncached reference")
    for m in mismatches:
        print(f"  t={m.at}: {m.what}: cached {m.cached}, reference {m.reference}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
