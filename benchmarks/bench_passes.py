"""Time the consolidation passes of the openb replay alone, with and without their memo, and check they agree.

Usage (``GPUSCALE_DATA_DIR=/work/shared/data``)::

    .venv/bin/python benchmarks/bench_passes.py record PASSES.pkl     # every plan_disruption call of the replay
    .venv/bin/python benchmarks/bench_passes.py run PASSES.pkl [N]    # re-run them: CPU (min of N), reuse, equality

``run`` re-runs the recorded passes in order twice per round: without a memo and with one
(:class:`~gpuscale.core.disruption.passmemo.PassMemo`, as the controller's gate keeps it), and prints each CPU
figure (min of N rounds; the cyclic garbage collector frozen after loading, so the figure is the passes' own), the
passes and candidates the memo answered, and how many results differ from the recorded ones (must be 0).
"""

from __future__ import annotations

import gc
import pickle
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_sim
from gpuscale.controller import scaledown
from gpuscale.core.disruption import plan_disruption
from gpuscale.core.disruption.passmemo import PassMemo


def record(out: str) -> None:
    calls: list[tuple[Any, ...]] = []
    original = plan_disruption

    def recording(*args: Any, **kw: Any) -> Any:
        result = original(*args, **kw)
        kw = {k: v for k, v in kw.items() if k != "memo"}
        kw["since"] = dict(kw["since"])  # the gate's clocks change after the call
        calls.append((args, kw, result))
        return result

    vars(scaledown)["plan_disruption"] = recording  # the controller's passes call it through this global
    bench_sim._openb("gpuscale")
    Path(out).write_bytes(pickle.dumps(calls))
    print(f"{out}: {len(calls)} passes")


def run(path: str, rounds: int) -> int:
    calls = pickle.loads(Path(path).read_bytes())  # a file this script wrote
    gc.collect()
    gc.freeze()
    bad = 0
    for use in (False, True):
        best = float("inf")
        memo = None
        for _ in range(rounds):
            memo = PassMemo() if use else None
            t0 = time.process_time()
            out = [plan_disruption(*args, **kw, memo=memo) for args, kw, _ in calls]
            best = min(best, time.process_time() - t0)
        differ = sum(1 for got, (_, _, want) in zip(out, calls, strict=True) if got != want)
        bad += differ
        reuse = f", {memo.hits} passes and {memo.reused} candidates answered by the memo" if memo else ""
        print(f"{'with' if use else 'without'} memo: {len(calls)} passes in {best:.3f} s CPU{reuse}; {differ} differ")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "record":
        record(argv[1])
        return 0
    if len(argv) >= 2 and argv[0] == "run":
        return run(argv[1], int(argv[2]) if len(argv) > 2 else 3)
    usage = __doc__.split("::\n\n")[1].split("\n\n")[0]
    print("usage:\n" + textwrap.dedent(usage), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
