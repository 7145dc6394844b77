"""Right-sizing, pure: CPU and memory requests from usage history as the VPA recommender computes them, and GPU
memory advice (a larger GPU near out-of-memory; a smaller or fractional one, ``gpuscale.io/gpu-milli``, when far
below).

As the VPA recommender: samples go into histograms with exponential buckets (5 % wide) weighted by an exponential
decay (half-life 24 h); CPU uses every sample, memory the peak of each 24 h interval. Target, lower and upper bounds
are the 90th, 50th and 95th percentiles (the end of the bucket holding it) plus a 15 % safety margin; the lower bound
is scaled by ``(1 + 0.001/confidence)^-2`` and the upper by ``(1 + 1/confidence)``, with ``confidence`` the history's
length in days (see :func:`confidence_days`). Each bound is at least the pod minimum (25 millicores, 250 MiB) shared
among the pod's containers, then kept within ``minAllowed``/``maxAllowed``.

GPU model and GPU count are never changed: the advice says what to change and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class RightsizeConfig:
    margin: float = 0.15
    target_percentile: float = 0.9
    lower_percentile: float = 0.5
    upper_percentile: float = 0.95
    pod_min_cpu_milli: float = 25.0
    pod_min_memory_mib: float = 250.0
    half_life_s: float = DAY_S
    memory_interval_s: float = DAY_S
    gpu_oom_fraction: float = 0.95
    """Peak GPU memory at or above this fraction of the GPU's: it needs a larger GPU."""
    gpu_small_fraction: float = 0.5
    """95th-percentile GPU memory (with the margin) at or below this fraction: a smaller or shared GPU would do."""


@dataclass(frozen=True, slots=True)
class Limits:
    cpu_milli: float | None = None
    memory_mib: float | None = None


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container of a workload: its samples ``(t, value)`` over all the workload's pods."""

    workload: str
    container: str
    cpu_cores: Sequence[tuple[float, float]]
    memory_mib: Sequence[tuple[float, float]]
    containers_in_pod: int = 1
    requests: Limits = Limits()
    min_allowed: Limits = Limits()
    max_allowed: Limits = Limits()


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """GPU memory of a workload's pods: samples ``(t, MiB used per GPU)`` and the GPU's memory."""

    workload: str
    used_mib: Sequence[tuple[float, float]]
    total_mib: float
    gpus_per_pod: int = 1


@dataclass(frozen=True, slots=True)
class Bounds:
    lower: float
    target: float
    upper: float


@dataclass(frozen=True, slots=True)
class Recommendation:
    workload: str
    container: str
    cpu_milli: Bounds
    memory_mib: Bounds
    requests: Limits
    confidence_days: float
    notes: tuple[str, ...] = ()


class GpuVerdict(StrEnum):
    LARGER = "larger"
    FRACTIONAL = "fractional"
    SMALLER = "smaller"
    FITS = "fits"
    NO_DATA = "no-data"


@dataclass(frozen=True, slots=True)
class GpuAdvice:
    workload: str
    verdict: GpuVerdict
    peak_mib: float
    p95_mib: float
    total_mib: float
    gpu_milli: int | None
    """For FRACTIONAL: the ``gpuscale.io/gpu-milli`` share that would hold the 95th percentile with the margin."""
    reason: str


@dataclass(slots=True)
class Histogram:
    """A decaying histogram with exponential buckets (first bucket ``first``, each 5 % wider)."""

    first: float
    half_life_s: float
    ratio: float = 1.05
    buckets: int = 1000
    weights: dict[int, float] = field(default_factory=dict)
    reference: float | None = None

    def start(self, i: int) -> float:
        return self.first * (self.ratio**i - 1) / (self.ratio - 1)

    def bucket(self, value: float) -> int:
        if value < self.first:
            return 0
        i = math.floor(math.log(value * (self.ratio - 1) / self.first + 1) / math.log(self.ratio))
        return min(max(i, 0), self.buckets - 1)

    def add(self, t: float, value: float) -> None:
        if self.reference is None:
            self.reference = t
        w = 2.0 ** ((t - self.reference) / self.half_life_s)
        b = self.bucket(max(value, 0.0))
        self.weights[b] = self.weights.get(b, 0.0) + w

    def percentile(self, p: float) -> float:
        """The end of the bucket where the cumulative weight reaches ``p`` of the total (0 when empty)."""
        total = sum(self.weights.values())
        if total <= 0:
            return 0.0
        acc, threshold = 0.0, p * total
        last = 0
        for b in sorted(self.weights):
            acc += self.weights[b]
            last = b
            if acc >= threshold:
                break
        return self.start(last + 1) if last < self.buckets - 1 else self.start(last)


def confidence_days(samples: Sequence[tuple[float, float]]) -> float:
    """History length in days, at most the sample count times the median sample spacing (the VPA counts samples
    over 1,440, i.e. one a minute; the spacing keeps an hourly history from looking like 72 minutes)."""
    if len(samples) < 2:
        return 0.0
    times = sorted(t for t, _ in samples)
    gaps = sorted(b - a for a, b in pairwise(times))
    spacing = gaps[len(gaps) // 2]
    return min((times[-1] - times[0]) / DAY_S, len(samples) * spacing / DAY_S)


def _estimate(h: Histogram, conf: float, cfg: RightsizeConfig) -> Bounds:
    m = 1 + cfg.margin
    lower = h.percentile(cfg.lower_percentile) * m
    target = h.percentile(cfg.target_percentile) * m
    upper = h.percentile(cfg.upper_percentile) * m
    c = max(conf, 1e-9)
    return Bounds(lower * (1 + 0.001 / c) ** -2.0, target, upper * (1 + 1.0 / c))


def _memory_peaks(samples: Sequence[tuple[float, float]], interval: float) -> list[tuple[float, float]]:
    peaks: dict[int, tuple[float, float]] = {}
    start = min((t for t, _ in samples), default=0.0)
    for t, v in samples:
        k = int((t - start) // interval)
        if k not in peaks or v > peaks[k][1]:
            peaks[k] = (t, v)
    return [peaks[k] for k in sorted(peaks)]


def _clamp(b: Bounds, floor: float, lo: float | None, hi: float | None, what: str, notes: list[str]) -> Bounds:
    vals = [max(v, floor) for v in (b.lower, b.target, b.upper)]
    if lo is not None and any(v < lo for v in vals):
        notes.append(f"{what} raised to minAllowed")
        vals = [max(v, lo) for v in vals]
    if hi is not None and any(v > hi for v in vals):
        notes.append(f"{what} capped at maxAllowed")
        vals = [min(v, hi) for v in vals]
    return Bounds(*vals)


def recommend(usage: ContainerUsage, cfg: RightsizeConfig = RightsizeConfig()) -> Recommendation:
    """Lower bound, target and upper bound of CPU (millicores) and memory (MiB) requests for one container."""
    cpu = Histogram(0.01, cfg.half_life_s)
    for t, v in sorted(usage.cpu_cores):
        cpu.add(t, v)
    mem = Histogram(10.0, cfg.half_life_s)
    for t, v in _memory_peaks(sorted(usage.memory_mib), cfg.memory_interval_s):
        mem.add(t, v)
    notes: list[str] = []
    conf_cpu, conf_mem = confidence_days(usage.cpu_cores), confidence_days(usage.memory_mib)
    if not usage.cpu_cores or not usage.memory_mib:
        notes.append("no CPU samples" if not usage.cpu_cores else "no memory samples")
    per = max(usage.containers_in_pod, 1)
    c = _estimate(cpu, conf_cpu, cfg)
    cpu_b = _clamp(Bounds(c.lower * 1000, c.target * 1000, c.upper * 1000), cfg.pod_min_cpu_milli / per,
                   usage.min_allowed.cpu_milli, usage.max_allowed.cpu_milli, "CPU", notes)  # fmt: skip
    mem_b = _clamp(_estimate(mem, conf_mem, cfg), cfg.pod_min_memory_mib / per, usage.min_allowed.memory_mib,
                   usage.max_allowed.memory_mib, "memory", notes)  # fmt: skip
    if min(conf_cpu, conf_mem) < 1:
        notes.append(f"less than a day of history ({min(conf_cpu, conf_mem) * 24:.1f} h): wide bounds")
    return Recommendation(usage.workload, usage.container, cpu_b, mem_b, usage.requests, min(conf_cpu, conf_mem),
                          tuple(notes))  # fmt: skip


def _percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = max(math.ceil(p * len(ordered)) - 1, 0)
    return ordered[k]


def gpu_advice(usage: GpuUsage, cfg: RightsizeConfig = RightsizeConfig()) -> GpuAdvice:
    """Whether a workload's GPU memory use calls for a larger, smaller or fractional GPU."""
    values = [v for _, v in usage.used_mib]
    total = usage.total_mib
    if not values or total <= 0:
        return GpuAdvice(usage.workload, GpuVerdict.NO_DATA, 0, 0, total, None, "no GPU memory samples")
    peak, p95 = max(values), _percentile(values, 0.95)
    need = p95 * (1 + cfg.margin)
    pct = 100 * peak / total
    if peak >= cfg.gpu_oom_fraction * total:
        want = math.ceil(peak * (1 + cfg.margin))
        return GpuAdvice(usage.workload, GpuVerdict.LARGER, peak, p95, total, None,
                         f"peak GPU memory {peak:,.0f} of {total:,.0f} MiB ({pct:.0f} %) is near out-of-memory: use a "
                         f"GPU with at least {want:,} MiB")  # fmt: skip
    if need <= cfg.gpu_small_fraction * total:
        if usage.gpus_per_pod == 1:
            milli = min(1000, max(100, math.ceil(1000 * need / total / 100) * 100))
            return GpuAdvice(usage.workload, GpuVerdict.FRACTIONAL, peak, p95, total, milli,
                             f"95th percentile {p95:,.0f} of {total:,.0f} MiB: a share would do, "
                             f'gpuscale.io/gpu-milli: "{milli}" (or a GPU with {math.ceil(need):,} MiB)')  # fmt: skip
        return GpuAdvice(usage.workload, GpuVerdict.SMALLER, peak, p95, total, None,
                         f"95th percentile {p95:,.0f} of {total:,.0f} MiB per GPU: GPUs with {math.ceil(need):,} MiB "
                         f"would do")  # fmt: skip
    return GpuAdvice(usage.workload, GpuVerdict.FITS, peak, p95, total, None,
                     f"peak {peak:,.0f} of {total:,.0f} MiB ({pct:.0f} %): the GPU fits")  # fmt: skip
