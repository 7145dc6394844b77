"""Right-sizing: the VPA recommender's percentiles, margin, confidence, decay, memory peaks, pod minimum and
min/maxAllowed; GPU memory advice; the USAGE.yaml reader; the Prometheus usage source on a stateful fake; and
``gpuscale rightsize``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuscale.cli import main
from gpuscale.core.autoscale.rightsize import (
    DAY_S,
    ContainerUsage,
    GpuUsage,
    GpuVerdict,
    Histogram,
    Limits,
    RightsizeConfig,
    confidence_days,
    gpu_advice,
    recommend,
)
from gpuscale.errors import InputError
from gpuscale.metrics.prometheus import Series
from gpuscale.scaling.usage import FileUsage, PrometheusUsage, workload_of

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "gpuscale" / "examples" / "usage.yaml"


def minutes(days: float, cpu: float, mem: float, start: float = 0.0) -> tuple[list[tuple[float, float]], ...]:
    n = int(days * 1440)
    return [(start + 60.0 * i, cpu) for i in range(n)], [(start + 60.0 * i, mem) for i in range(n)]


def bucket_end(h: Histogram, value: float) -> float:
    return h.start(h.bucket(value) + 1)


def test_histogram_percentile_is_the_end_of_the_bucket() -> None:
    h = Histogram(0.01, DAY_S)
    for i in range(100):
        h.add(0, 0.1 if i < 90 else 2.0)
    assert h.percentile(0.9) == pytest.approx(bucket_end(h, 0.1))
    assert h.percentile(0.95) == pytest.approx(bucket_end(h, 2.0))
    assert 2.0 <= h.percentile(0.95) <= 2.0 * 1.05 + 0.01  # buckets are 5 % wide
    assert Histogram(0.01, DAY_S).percentile(0.5) == 0.0


def test_constant_usage_eight_days() -> None:
    cpu, mem = minutes(8, 1.0, 1000.0)
    r = recommend(ContainerUsage("ns/w", "c", cpu, mem))
    h = Histogram(0.01, DAY_S)
    conf = confidence_days(cpu)
    assert conf == pytest.approx((8 * 1440 - 1) / 1440)
    end = bucket_end(h, 1.0) * 1000
    assert r.cpu_milli.target == pytest.approx(end * 1.15)
    assert r.cpu_milli.lower == pytest.approx(end * 1.15 * (1 + 0.001 / conf) ** -2)
    assert r.cpu_milli.upper == pytest.approx(end * 1.15 * (1 + 1 / conf))
    assert r.memory_mib.target == pytest.approx(bucket_end(Histogram(10.0, DAY_S), 1000.0) * 1.15)
    assert not r.notes


def test_recent_usage_weighs_more_half_life_one_day() -> None:
    """Ten days at 1 core then one day at 4: with a 24 h half-life the last day holds half of the weight
    (2^10 of 2^11 - 1), so the 90th percentile is the 4-core bucket; without decay it holds an eleventh and the 90th
    percentile stays in the 1-core bucket."""
    old, mem1 = minutes(10, 1.0, 500.0)
    new, mem2 = minutes(1, 4.0, 500.0, start=10 * DAY_S)
    usage = ContainerUsage("ns/w", "c", old + new, mem1 + mem2)
    h = Histogram(0.01, DAY_S)
    assert recommend(usage).cpu_milli.target == pytest.approx(bucket_end(h, 4.0) * 1000 * 1.15)
    flat = recommend(usage, RightsizeConfig(half_life_s=1e15))
    assert flat.cpu_milli.target == pytest.approx(bucket_end(h, 1.0) * 1000 * 1.15)


def test_memory_uses_daily_peaks() -> None:
    cpu, _ = minutes(4, 0.5, 0)
    mem = [(t, 1000.0 + (3000.0 if int(t) % 3600 == 0 else 0.0)) for t, _ in cpu]  # an hourly spike to 4000 MiB
    r = recommend(ContainerUsage("ns/w", "c", cpu, mem))
    assert r.memory_mib.target == pytest.approx(bucket_end(Histogram(10.0, DAY_S), 4000.0) * 1.15)


def test_pod_minimum_shared_among_containers_and_allowed_range() -> None:
    cpu, mem = minutes(2, 0.001, 10.0)
    r = recommend(ContainerUsage("ns/w", "c", cpu, mem, containers_in_pod=2))
    assert r.cpu_milli.target == 12.5 and r.memory_mib.target == 125.0
    cpu, mem = minutes(2, 3.0, 8000.0)
    r = recommend(ContainerUsage("ns/w", "c", cpu, mem, min_allowed=Limits(4000, None), max_allowed=Limits(None, 4096)))
    assert r.cpu_milli.lower == 4000 and r.memory_mib.upper == 4096
    assert "CPU raised to minAllowed" in r.notes and "memory capped at maxAllowed" in r.notes


def test_short_history_is_flagged_and_widens_the_bounds() -> None:
    cpu, mem = minutes(0.25, 1.0, 500.0)
    r = recommend(ContainerUsage("ns/w", "c", cpu, mem))
    assert r.cpu_milli.upper > 4 * r.cpu_milli.target
    assert any("less than a day" in n for n in r.notes)


@pytest.mark.parametrize(
    ("used", "total", "gpus", "verdict", "milli"),
    [
        ([70_000, 78_000], 81_920, 1, GpuVerdict.LARGER, None),  # 95 % peak: near OOM
        ([3_000, 4_000], 24_576, 1, GpuVerdict.FRACTIONAL, 200),  # 4000 * 1.15 / 24576 = 0.187 -> 200 milli
        ([3_000, 4_000], 24_576, 2, GpuVerdict.SMALLER, None),  # several GPUs per pod: no fraction, smaller GPUs
        ([12_000, 14_000], 24_576, 1, GpuVerdict.FITS, None),
        ([], 24_576, 1, GpuVerdict.NO_DATA, None),
    ],
)
def test_gpu_advice(used: list[float], total: float, gpus: int, verdict: GpuVerdict, milli: int | None) -> None:
    a = gpu_advice(GpuUsage("ns/w", [(60.0 * i, v) for i, v in enumerate(used)], total, gpus))
    assert a.verdict is verdict and a.gpu_milli == milli
    if milli:
        assert f'gpuscale.io/gpu-milli: "{milli}"' in a.reason


def test_usage_example_reads() -> None:
    u = FileUsage(EXAMPLE).usage()
    assert [(c.workload, c.container) for c in u.containers] == [
        ("inference/llama-70b", "server"), ("inference/llama-70b", "metrics-sidecar"), ("inference/whisper", "server")
    ]  # fmt: skip
    assert u.containers[0].requests == Limits(8000, 65536) and u.containers[0].containers_in_pod == 2
    assert [g.total_mib for g in u.gpus] == [81920, 24576]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("workloads: []\n", "workloads: must list at least one workload"),
        ("workloads:\n  - name: w\n    containers: [{name: c, samples: [[0, 1]]}]\n",
         "u.yaml:3 (document 1) workloads[0].containers[0].samples[0]: must be a list of 3 numbers"),
        ("workloads:\n  - name: w\n    containers: [{name: c, requests: {cpu: lots}, samples: [[0, 1, 2]]}]\n",
         "requests.cpu"),
        ("workloads:\n  - name: w\n    gpuMemory: [[0, 5]]\n    containers: [{name: c, samples: [[0, 1, 2]]}]\n",
         "gpuMemoryMiB: is required with gpuMemory samples"),
        ("workloads:\n  - name: w\n    containers: [{name: c, samples: [[0, -1, 2]]}]\n", "must be between"),
        ("- 1\n", "must be a mapping"),
    ],
)  # fmt: skip
def test_usage_file_errors(tmp_path: Path, text: str, expect: str) -> None:
    f = tmp_path / "u.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as exc:
        FileUsage(f).usage()
    assert expect in str(exc.value).replace(str(tmp_path) + "/", "")


class FakeMetrics:
    """A stateful stand-in for a Prometheus: series by metric name in the query; it records every query."""

    def __init__(self, series: Mapping[str, list[Series]]) -> None:
        self.series = series
        self.queries: list[tuple[str, float, float, float]] = []

    def value(self, query: str, at: float | None = None) -> float:
        raise AssertionError("range queries only")

    def usage(self, query: str, start: float, end: float, step: float) -> list[Series]:
        self.queries.append((query, start, end, step))
        for key, found in self.series.items():
            if key in query:
                return found
        return []


def test_workload_of_pod_names() -> None:
    assert workload_of("llama-70b-7f9c8d6b5-x2x9z") == "llama-70b"
    assert workload_of("redis-0") == "redis" and workload_of("standalone") == "standalone"


def test_prometheus_usage_groups_pods_into_workloads() -> None:
    def s(pod: str, values: list[float], **labels: str) -> Series:
        return Series({"namespace": "inf", "pod": pod, **labels}, tuple((60.0 * i, v) for i, v in enumerate(values)))

    fake = FakeMetrics({
        "container_cpu_usage_seconds_total": [s("m-5d8f7c9b4-abcde", [1.0, 2.0], container="srv"),
                                              s("m-5d8f7c9b4-fghij", [3.0, math.nan], container="srv")],
        "container_memory_working_set_bytes": [s("m-5d8f7c9b4-abcde", [2**30], container="srv")],
        "DCGM_FI_DEV_FB_USED{namespace=\"inf\"} +": [s("m-5d8f7c9b4-abcde", [24576.0])],
        "count by": [s("m-5d8f7c9b4-abcde", [1.0])],
        "DCGM_FI_DEV_FB_USED": [s("m-5d8f7c9b4-abcde", [4000.0, 5000.0])],
    })  # fmt: skip
    u = PrometheusUsage(fake, namespace="inf", end=7200.0, window_s=3600.0, step_s=60.0).usage()
    (c,) = u.containers
    assert (c.workload, c.container) == ("inf/m", "srv")
    assert sorted(v for _, v in c.cpu_cores) == [1.0, 2.0, 3.0]  # two pods merged, NaN dropped
    assert c.memory_mib == [(0.0, 1024.0)]
    (g,) = u.gpus
    assert (g.workload, g.total_mib, g.gpus_per_pod, [v for _, v in g.used_mib]) == ("inf/m", 24576.0, 1, [4000, 5000])
    assert all(q[1:] == (3600.0, 7200.0, 60.0) for q in fake.queries)
    assert all('namespace="inf"' in q[0] for q in fake.queries)
    quoted = FakeMetrics({})
    PrometheusUsage(quoted, namespace='x"} or vector(1) #', end=1.0, window_s=1.0).usage()
    assert all('namespace="x\\"} or vector(1) #"' in q[0] for q in quoted.queries)  # one string literal


def test_rightsize_command(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["rightsize", str(EXAMPLE), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    server = data["containers"][0]
    assert server["workload"] == "inference/llama-70b" and server["requests"] == {"cpu": "8000m", "memory": "65536Mi"}
    assert server["memory"]["upperBound"] == "32768Mi"  # maxAllowed 32Gi
    assert "memory capped at maxAllowed" in server["notes"]
    assert [g["verdict"] for g in data["gpus"]] == ["larger", "fractional"]
    text = runner.invoke(main, ["rightsize", str(EXAMPLE)])
    assert text.exit_code == 0 and "GPU inference/whisper: fractional" in text.stdout
    none = runner.invoke(main, ["rightsize"])
    assert none.exit_code == 2 and "give a USAGE.yaml file or --prometheus URL" in none.stderr
    bad = runner.invoke(main, ["rightsize", "--prometheus", "http://127.0.0.1:9", "--window", "soon"])
    assert bad.exit_code == 2 and "--window" in bad.stderr
