"""Workload sources: the openb and Alibaba 2025 traces, and the seeded synthetic generators."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscale.errors import InputError
from gpuscale.sim.engine import Dist
from gpuscale.sim.workloads import (
    Arrival,
    PodShape,
    alibaba2025_arrivals,
    alibaba2025_file,
    burst,
    diurnal,
    gangs,
    gpu_demand_hours,
    openb_arrivals,
    openb_file,
    steady,
)

needs_data = pytest.mark.skipif(not openb_file().is_file(), reason="shared data not available")


@needs_data
def test_openb_default_replays_with_its_timestamps() -> None:
    arr = openb_arrivals()
    assert len(arr) == 8152
    assert [a.at for a in arr] == sorted(a.at for a in arr)
    by_name = {a.pod.name: a for a in arr}
    p0, p1 = by_name["openb-pod-0000"], by_name["openb-pod-0001"]
    assert p0.at == 0 and p0.duration == 12537496 and p0.deadline is None
    assert p1.at == 427061 and p1.pod.request.gpu_milli == 460 and p1.pod.request.gpus == 0
    never = by_name["openb-pod-0061"]  # Pending in the trace: created 10001278, deleted 10001403
    assert never.deadline == 10001403 and never.duration == 125
    assert sum(1 for a in arr if a.deadline is not None) == 897
    assert all(a.pod.namespace == "openb" and a.pod.labels["app"] == "openb" for a in arr)
    assert not any(a.pod.request.gpu_models for a in arr)  # the default list constrains no GPU model


@needs_data
def test_openb_window_scale_and_model_options() -> None:
    full = openb_arrivals()
    window = openb_arrivals(start=10_000_000, end=11_000_000, time_scale=0.5)
    expected = [a for a in full if 10_000_000 <= a.at < 11_000_000]
    assert len(window) == len(expected) > 0
    assert window[0].at == pytest.approx((expected[0].at - 10_000_000) * 0.5)
    assert window[0].duration == pytest.approx(expected[0].duration * 0.5)
    spec = openb_file("gpuspec10")
    assert sum(1 for a in openb_arrivals(spec) if a.pod.request.gpu_models) == 732
    assert not any(a.pod.request.gpu_models for a in openb_arrivals(spec, gpu_models="ignore"))
    mapped = openb_arrivals(spec, model_map={"T4": "Tesla-T4"})
    models = set().union(*(a.pod.request.gpu_models or () for a in mapped))
    assert "Tesla-T4" in models and "T4" not in models
    assert len(openb_arrivals(limit=10)) == 10
    with pytest.raises(InputError):
        openb_arrivals(gpu_models="maybe")


@needs_data
def test_openb_files_without_timestamps_are_refused() -> None:
    with pytest.raises(InputError, match="no timestamps"):
        openb_arrivals(openb_file("multigpu20"))


@needs_data
def test_alibaba_2025_inference_trace() -> None:
    gpu = alibaba2025_arrivals()
    assert len(gpu) == 7386 and all(a.pod.request.gpus == 1 for a in gpu)
    everything = alibaba2025_arrivals(include_cpu_only=True)
    assert len(everything) == 23871
    first = next(a for a in gpu if a.pod.name == "instance_0")
    # 12 cores, 120 GiB, no timestamps: there before the window, still there after it
    assert first.at == 0 and first.pod.request.cpu_milli == 12000 and first.pod.request.memory_mib == 120 * 1024
    last = max(a.at + a.duration for a in everything)
    assert first.duration == pytest.approx(last) == pytest.approx(2677541.0)  # the window ends at the last timestamp
    assert first.pod.labels == {"app": "app_0", "role": "HN"}
    short = alibaba2025_arrivals(window_end=86400.0)
    assert all(a.at < 86400.0 and a.at + a.duration <= 86400.0 + 1e-6 for a in short)
    assert alibaba2025_file().name.endswith(".csv.gz")


def test_alibaba_bad_rows_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text(
        "instance_sn,role,app_name,cpu_request,gpu_request,memory_request,creation_time,scheduled_time,deletion_time\n"
        "i0,HN,a,8,1,40,,,\n"
        "i1,HN,a,8,x,40,,,\n"
    )
    with pytest.raises(InputError, match=r"t\.csv:3"):
        alibaba2025_arrivals(f)


def test_steady_is_poisson_and_deterministic() -> None:
    a = steady(60.0, 100 * 3600.0, runtime=Dist.const(10.0), seed=1)
    b = steady(60.0, 100 * 3600.0, runtime=Dist.const(10.0), seed=1)
    c = steady(60.0, 100 * 3600.0, runtime=Dist.const(10.0), seed=2)
    assert [(x.at, x.pod.name) for x in a] == [(x.at, x.pod.name) for x in b]
    assert [x.at for x in a] != [x.at for x in c]
    assert 6000 * 0.93 < len(a) < 6000 * 1.07
    assert all(0 <= x.at < 100 * 3600 for x in a)


def test_shapes_are_drawn_by_weight() -> None:
    shapes = (PodShape(gpus=1, weight=3.0), PodShape(gpus=0, gpu_milli=500, weight=1.0, gpu_util=0.3))
    arr = steady(600.0, 10 * 3600.0, shapes, seed=4)
    frac = sum(1 for a in arr if a.pod.request.gpu_milli) / len(arr)
    assert frac == pytest.approx(0.25, abs=0.03)
    assert {a.gpu_util for a in arr if a.pod.request.gpu_milli} == {0.3}


def test_diurnal_peaks_at_its_peak_hour() -> None:
    arr = diurnal(120.0, 0.0, 20 * 86400.0, seed=3, peak_at_s=12 * 3600.0)
    hours = [int(a.at % 86400 // 3600) for a in arr]
    near_peak = sum(1 for h in hours if 10 <= h < 14)
    near_trough = sum(1 for h in hours if h >= 22 or h < 2)
    assert near_peak > 10 * max(near_trough, 1)
    assert diurnal(0.0, 0.0, 3600.0) == []


def test_burst_from_zero_and_spread() -> None:
    arr = burst(64, at=100.0, runtime=Dist.const(600.0))
    assert len(arr) == 64 and {a.at for a in arr} == {100.0} and {a.duration for a in arr} == {600.0}
    assert len({a.pod.key for a in arr}) == 64
    spread = burst(10, at=0.0, spread_s=60.0, seed=2)
    assert all(0 <= a.at <= 60 for a in spread) and len({a.at for a in spread}) == 10
    assert gpu_demand_hours(arr) == pytest.approx(64 * 600 / 3600)


def test_gangs_share_arrival_runtime_and_size() -> None:
    arr = gangs(10.0, 24 * 3600.0, sizes=(2, 4), seed=5)
    groups: dict[str, list[Arrival]] = {}
    for a in arr:
        assert a.pod.gang is not None
        groups.setdefault(a.pod.gang, []).append(a)
    assert len(groups) > 100
    for members in groups.values():
        assert len(members) == members[0].pod.gang_size in (2, 4)
        assert len({m.at for m in members}) == 1 and len({m.duration for m in members}) == 1
    with pytest.raises(InputError):
        gangs(1.0, 10.0, sizes=(0,))
