"""Check that a speed change leaves the openb replay's results identical, and time the planner alone.

Usage (``GPUSCALE_DATA_DIR=/work/shared/data``; put a worktree's ``src`` first on ``PYTHONPATH`` to run another
commit)::

    .venv/bin/python benchmarks/replay_fingerprint.py fingerprint OUT.json   # then diff two OUT.json files
    .venv/bin/python benchmarks/replay_fingerprint.py record PLANS.pkl       # every planner input of the replay
    .venv/bin/python benchmarks/replay_fingerprint.py plans PLANS.pkl [N]    # re-plan them: CPU (min of N), digest

``fingerprint`` digests every event, every cloud node with its times, every reconcile time, every pod's bind time
and node, and the report without its wall time. ``plans`` re-runs the recorded plans in order (memos warm after the
first pass): a CPU figure for the planner with far less noise than the whole replay, and a digest of the plans that
must not change.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_sim
from gpuscale.core.planner import driver
from gpuscale.sim import cluster


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def fingerprint(out: str) -> None:
    binds: list[tuple[str, str, float | None]] = []
    bind = cluster.SimCluster._bind

    def recording(self: Any, sp: Any, slot: int, placement: Any = None) -> None:
        bind(self, sp, slot, placement)
        binds.append((sp.pod.key, sp.node.name, sp.bound_at))

    cluster.SimCluster._bind = recording  # type: ignore[method-assign]
    t0 = time.process_time()
    res, wall = bench_sim._openb("gpuscale")
    cpu = time.process_time() - t0
    report = {k: v for k, v in res.report.items() if k != "wallSeconds"}
    fp = {
        "events": _digest([(e.at, e.kind, e.object, e.reason, e.message) for e in res.cluster.events]),
        "cloud": _digest([repr(n) for n in res.cloud.launched()]),
        "reconciles": _digest(res.reconcile_times),
        "binds": _digest(binds),
        "report": hashlib.sha256(json.dumps(report, sort_keys=True, default=str).encode()).hexdigest(),
        "counts": [len(res.cluster.events), len(res.cloud.launched()), len(res.reconcile_times), len(binds)],
        "costUsd": res.report["costUsd"],
    }
    Path(out).write_text(json.dumps(fp, indent=1) + "\n")
    print(f"{out}: {fp['counts']} ${fp['costUsd']:,.2f}; {wall:.2f} s wall, {cpu:.2f} s CPU")


def record(out: str) -> None:
    inputs: list[tuple[Any, Any, float]] = []
    init = driver.Planner.__init__

    def recording(self: Any, snapshot: Any, config: Any, now: float) -> None:
        inputs.append((snapshot, config, now))
        init(self, snapshot, config, now)

    driver.Planner.__init__ = recording  # type: ignore[method-assign]
    bench_sim._openb("gpuscale")
    Path(out).write_bytes(pickle.dumps(inputs))
    print(f"{out}: {len(inputs)} plans")


def plans(path: str, passes: int) -> None:
    inputs = pickle.loads(Path(path).read_bytes())  # a file this script wrote
    best = float("inf")
    out: list[Any] = []
    for _ in range(passes):
        t0 = time.process_time()
        out = [driver.Planner(s, c, now).run() for s, c, now in inputs]
        best = min(best, time.process_time() - t0)
    print(f"{len(inputs)} plans in {best:.3f} s CPU (min of {passes}); digest {_digest(out)[:16]}")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "fingerprint":
        fingerprint(argv[1])
    elif len(argv) >= 2 and argv[0] == "record":
        record(argv[1])
    elif len(argv) >= 2 and argv[0] == "plans":
        plans(argv[1], int(argv[2]) if len(argv) > 2 else 3)
    else:
        usage = __doc__.split("::\n\n")[1].split("\n\n")[0]
        print("usage:\n" + textwrap.dedent(usage), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
