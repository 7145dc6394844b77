"""``gpuscale rightsize --prometheus URL`` end to end against a real Prometheus holding a history backfilled with
``promtool tsdb create-blocks-from openmetrics``: two pods of one Deployment, a StatefulSet pod and DCGM framebuffer
memory; the command discovers the workloads, pools their pods and prints the recommendations."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

from click.testing import CliRunner

from gpuscale.cli import main
from gpuscale.core.autoscale.rightsize import Histogram
from prom_harness import prometheus, tool

STEPS = 120  # two hours a minute apart
PODS = {"llm-5d8f7c9b4-abcde": 1.0, "llm-5d8f7c9b4-fghij": 2.0, "db-0": 0.2}


def _history(start: float) -> str:
    lines = ["# TYPE container_cpu_usage_seconds counter"]
    for pod, cores in PODS.items():
        sel = f'namespace="inf",pod="{pod}",container="main"'
        lines += [
            f"container_cpu_usage_seconds_total{{{sel}}} {cores * 60 * i} {start + 60 * i:.0f}" for i in range(STEPS)
        ]
    lines += ["# TYPE container_memory_working_set_bytes gauge"]
    for pod in PODS:
        sel = f'namespace="inf",pod="{pod}",container="main"'
        mib = 300 if pod == "db-0" else 6000 + 10 * (pod[-1] == "j")
        lines += [
            f"container_memory_working_set_bytes{{{sel}}} {mib * 2**20} {start + 60 * i:.0f}" for i in range(STEPS)
        ]
    dcgm = 'namespace="inf",pod="llm-5d8f7c9b4-abcde",gpu="0",modelName="NVIDIA L4"'
    lines += ["# TYPE DCGM_FI_DEV_FB_USED gauge"]
    lines += [f"DCGM_FI_DEV_FB_USED{{{dcgm}}} {3000 + (i % 10) * 100} {start + 60 * i:.0f}" for i in range(STEPS)]
    lines += ["# TYPE DCGM_FI_DEV_FB_FREE gauge"]
    lines += [
        f"DCGM_FI_DEV_FB_FREE{{{dcgm}}} {22528 - 3000 - (i % 10) * 100} {start + 60 * i:.0f}" for i in range(STEPS)
    ]
    return "\n".join([*lines, "# EOF", ""])


def test_rightsize_from_a_real_prometheus(tmp_path: Path) -> None:
    promtool = tool("promtool")
    start = (time.time() // 60) * 60 - 60 * (STEPS + 5)
    om, data = tmp_path / "history.om", tmp_path / "data"
    om.write_text(_history(start))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    with prometheus(tmp_path, [], data=data) as p:
        result = CliRunner().invoke(
            main, ["rightsize", "--json", "--prometheus", p.url, "--namespace", "inf", "--window", "3h"]
        )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    rows = {(c["workload"], c["container"]): c for c in out["containers"]}
    assert set(rows) == {("inf/llm", "main"), ("inf/db", "main")}  # two pods of the Deployment pooled
    cpu, mem = Histogram(0.01, 86_400), Histogram(10.0, 86_400)
    # the llm pods run at 1 and 2 cores: the 90th percentile is the 2-core bucket's end, plus the 15 % margin
    assert rows[("inf/llm", "main")]["cpu"]["target"] == f"{math.ceil(cpu.start(cpu.bucket(2.0) + 1) * 1150)}m"
    assert rows[("inf/db", "main")]["memory"]["target"] == f"{math.ceil(mem.start(mem.bucket(300.0) + 1) * 1.15)}Mi"
    (gpu,) = out["gpus"]
    assert gpu["workload"] == "inf/llm" and gpu["gpuMemoryMiB"] == 22528 and gpu["verdict"] == "fractional"
    assert gpu["peakMiB"] == 3900
