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

import yaml

from bench_sim import KEYS, _openb_workload, _with_options
from gpuscale.controller.options import options_controller
from gpuscale.manifests.quantity import parse_duration
from gpuscale.sim.runner import run_simulation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=YAML", help="a gpuscale policy setting")
    parser.add_argument(
        "--pool-wait", action="append", default=[], metavar="KEY=DURATION", help="consolidate(Empty)After of the pools"
    )
    args = parser.parse_args(argv)
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
