"""The openb replay with the consolidation gate's check mode on: every round also runs the uncached reference and
records where the cached decisions differ (the gate's invariant: there are none; see controller/consolidation.py).

Usage: ``GPUSCALE_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/gate_check.py`` (about twice the replay's
time). Prints the replay's figures and each mismatch; exits 1 if there is any. ``--set KEY=YAML`` and ``--pool-wait
KEY=DURATION`` set gpuscale's options and its pools' waits as in ``bench_sim.py``, e.g. ``--set 'emptyWait=
{waitCostPerGpuHour: 4, maxWait: 1h}' --pool-wait consolidateEmptyAfter=0s``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sim import KEYS, _openb_workload, _with_options, add_option_args, parse_option_args
from gpuscale.controller.options import options_controller
from gpuscale.sim.runner import run_simulation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option_args(parser)
    options, waits = parse_option_args(parser, parser.parse_args(argv))
    made: list[Any] = []

    def factory(**kw: Any) -> Any:
        ctrl = options_controller(**kw)
        ctrl.gate.check = True
        made.append(ctrl)
        return ctrl

    scenario, work = _openb_workload()
    scenario = _with_options(scenario, "gpuscale", options, waits)
    res = run_simulation(scenario, factory, arrivals=list(work), policy_name="gpuscale")
    print({k: res.report[k] for k in KEYS})
    mismatches = made[0].gate.mismatches
    print(f"check mode: {len(mismatches)} round(s) where the cached decisions differ from the uncached reference")
    for m in mismatches:
        print(f"  t={m.at}: {m.what}: cached {m.cached}, reference {m.reference}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
