"""Where the agent's GPU readings come from: NVML on a real node, or a seeded simulation following a load curve.

Both backends implement :class:`GpuBackend`; the exporter (:mod:`.agent`) only formats what they read.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuscale.clock import Clock
from gpuscale.errors import GpuscaleError, InputError

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod (and container) using a GPU."""

    namespace: str
    pod: str
    container: str = ""

    @classmethod
    def parse(cls, text: str, where: str = "--pod") -> PodRef:
        """``NAMESPACE/POD[/CONTAINER]``."""
        parts = text.split("/")
        if not 2 <= len(parts) <= 3 or not all(parts):
            raise InputError("expected NAMESPACE/POD or NAMESPACE/POD/CONTAINER", where=where, value=text)
        return cls(*parts)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant, in the DCGM exporter's units. ``None`` means the backend cannot read that field."""

    index: int
    uuid: str
    minor: int
    model: str
    util_pct: float
    fb_used_mib: float
    fb_free_mib: float
    mem_copy_util_pct: float | None
    power_w: float | None
    temp_c: float | None
    gr_engine_active: float | None = None
    pod: PodRef | None = None


class GpuBackend(Protocol):
    """Reads every GPU of this node."""

    def read(self) -> list[GpuReading]: ...


class NoDriver(GpuscaleError):
    """No NVIDIA driver (NVML library) on this machine."""


# -- simulation ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuModel:
    """What the simulation needs to know of a GPU model."""

    name: str
    memory_mib: int
    idle_w: float
    max_w: float


MODELS: Mapping[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("NVIDIA A100-SXM4-40GB", 40960, 55.0, 400.0),
        GpuModel("NVIDIA A100-SXM4-80GB", 81920, 60.0, 400.0),
        GpuModel("NVIDIA H100 80GB HBM3", 81559, 70.0, 700.0),
        GpuModel("NVIDIA L4", 23034, 16.0, 72.0),
        GpuModel("NVIDIA A10", 23028, 20.0, 150.0),
        GpuModel("Tesla T4", 15360, 10.0, 70.0),
        GpuModel("NVIDIA RTX 4000 Ada Generation", 20475, 12.0, 130.0),
    )
}
"""Simulated models by their NVML name (memory as NVML reports it, idle and maximum board power)."""
SHORT_NAMES = {
    "a100": "NVIDIA A100-SXM4-40GB",
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "h100": "NVIDIA H100 80GB HBM3",
    "l4": "NVIDIA L4",
    "a10": "NVIDIA A10",
    "t4": "Tesla T4",
    "rtx4000ada": "NVIDIA RTX 4000 Ada Generation",
}


def find_model(name: str) -> GpuModel:
    """A model by NVML name or short name (case-insensitive)."""
    key = SHORT_NAMES.get(name.lower(), name)
    for full, model in MODELS.items():
        if full.lower() == key.lower():
            return model
    raise InputError(
        "unknown GPU model", where="--model", value=name, fix=f"use one of {', '.join(sorted(SHORT_NAMES))}"
    )


@dataclass(frozen=True, slots=True)
class LoadCurve:
    """Utilisation (%) over time: ``points`` ``(t_seconds, percent)``, linear between points, held after the last
    (or repeated every ``period`` seconds when set). Without points: a sine between 10 % and 90 % over ``period``."""

    points: tuple[tuple[float, float], ...] = ()
    period: float | None = None

    @classmethod
    def parse(cls, text: str, *, period: float | None = None, where: str = "--curve") -> LoadCurve:
        """``T:PCT,T:PCT,...`` with ``T`` ascending from 0 and ``PCT`` in [0, 100]."""
        points: list[tuple[float, float]] = []
        for item in filter(None, (p.strip() for p in text.split(","))):
            t_text, sep, v_text = item.partition(":")
            try:
                t, v = float(t_text), float(v_text)
            except ValueError:
                t = v = math.nan
            if not sep or not (math.isfinite(t) and math.isfinite(v)) or t < 0 or not 0 <= v <= 100:
                raise InputError(
                    "expected T:PERCENT with T >= 0 seconds and 0 <= PERCENT <= 100",
                    where=where,
                    value=item,
                    fix="e.g. --curve 0:20,60:95,120:40",
                )
            if points and t <= points[-1][0]:
                raise InputError("times must increase", where=where, value=item)
            points.append((t, v))
        if not points:
            raise InputError("no points", where=where, value=text, fix="e.g. --curve 0:20,60:95,120:40")
        if period is not None and period <= points[-1][0]:
            raise InputError("the period must be longer than the last point's time", where="--period", value=period)
        return cls(tuple(points), period)

    def at(self, t: float) -> float:
        """Utilisation at ``t`` seconds since the start."""
        if not self.points:
            period = self.period or 600.0
            return 50.0 - 40.0 * math.cos(2 * math.pi * t / period)
        if self.period:
            t %= self.period
        pts = self.points
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, v0), (t1, v1) in itertools.pairwise(pts):
            if t < t1:
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return pts[-1][1]


def _uuid(seed: int, hostname: str, index: int) -> str:
    r = random.Random(f"{seed}/{hostname}/{index}")
    h = f"{r.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class SimulatedBackend:
    """``count`` GPUs of ``model`` whose utilisation follows ``curve`` (seconds since the backend was made, on
    ``clock``), plus seeded noise of up to ``noise`` percentage points per GPU and second. Memory use, power and
    temperature follow utilisation. Same seed, same clock reading: same readings."""

    clock: Clock
    count: int
    model: GpuModel
    curve: LoadCurve = field(default_factory=LoadCurve)
    seed: int = 0
    noise: float = 0.0
    hostname: str = "localhost"
    pods: Mapping[int, PodRef] = field(default_factory=dict)
    start: float = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 64:
            raise InputError("the GPU count must be between 1 and 64", where="--gpus", value=self.count)
        if not 0 <= self.noise <= 50:
            raise InputError("noise must be between 0 and 50 percentage points", where="--noise", value=self.noise)
        bad = sorted(i for i in self.pods if not 0 <= i < self.count)
        if bad:
            raise InputError(f"no GPU {bad[0]} among {self.count}", where="--pod", value=bad[0])
        self.start = self.clock.now()

    def read(self) -> list[GpuReading]:
        """Every simulated GPU now."""
        t = self.clock.now() - self.start
        base = self.curve.at(t)
        m = self.model
        out = []
        for i in range(self.count):
            jitter = random.Random(f"{self.seed}/{i}/{math.floor(t)}").uniform(-self.noise, self.noise)
            util = min(100.0, max(0.0, base + jitter))
            used = round(m.memory_mib * (0.05 + 0.85 * util / 100))
            out.append(
                GpuReading(
                    index=i,
                    uuid=_uuid(self.seed, self.hostname, i),
                    minor=i,
                    model=m.name,
                    util_pct=round(util),
                    fb_used_mib=used,
                    fb_free_mib=m.memory_mib - used,
                    mem_copy_util_pct=round(util * 0.6),
                    power_w=round(m.idle_w + (m.max_w - m.idle_w) * util / 100, 3),
                    temp_c=round(30 + 50 * util / 100),
                    gr_engine_active=round(util / 100, 6),
                    pod=self.pods.get(i),
                )
            )
        return out


# -- NVML ----------------------------------------------------------------------------------------------------------


class NvmlBackend:
    """Real GPUs through NVML (``nvidia-ml-py``; ``nvml`` replaces the module in tests). Raises :class:`NoDriver`
    when the driver library is absent or not loaded. A field the GPU does not support (NVML ``NotSupported``, e.g.
    power on some boards) is left out; a GPU that fails to answer at all is left out of that scrape.
    ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` needs DCGM's profiling counters, which NVML does not offer: it is left out."""

    def __init__(self, pods: Mapping[int, PodRef] | None = None, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as exc:
            raise NoDriver("no NVIDIA driver on this machine (NVML library not found)") from exc
        except nvml.NVMLError_DriverNotLoaded as exc:
            raise NoDriver("the NVIDIA driver is not loaded (NVML: driver not loaded)") from exc
        except nvml.NVMLError as exc:
            raise NoDriver(f"NVML failed to start: {exc}") from exc
        self.pods = dict(pods or {})

    def close(self) -> None:
        """Release NVML."""
        self._nvml.nvmlShutdown()

    def _optional(self, read: Callable[..., float], *args: Any) -> float | None:
        try:
            return float(read(*args))
        except self._nvml.NVMLError_NotSupported:
            return None

    def read(self) -> list[GpuReading]:
        """Every GPU NVML reports now."""
        nv = self._nvml
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                reading = GpuReading(
                    index=i,
                    uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    minor=nv.nvmlDeviceGetMinorNumber(h),
                    model=_text(nv.nvmlDeviceGetName(h)),
                    util_pct=float(util.gpu),
                    fb_used_mib=mem.used // MIB,
                    fb_free_mib=mem.free // MIB,
                    mem_copy_util_pct=float(util.memory),
                    power_w=_div(self._optional(nv.nvmlDeviceGetPowerUsage, h), 1000.0),
                    temp_c=self._optional(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    pod=self.pods.get(i),
                )
            except nv.NVMLError:  # lost or resetting: leave it out of this scrape
                continue
            out.append(reading)
        return out


def _div(value: float | None, by: float) -> float | None:
    return None if value is None else value / by


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def parse_pods(specs: Sequence[str]) -> dict[int, PodRef]:
    """``GPU=NAMESPACE/POD[/CONTAINER]`` options -> GPU index -> pod."""
    pods: dict[int, PodRef] = {}
    for spec in specs:
        gpu, sep, ref = spec.partition("=")
        if not sep or not gpu.isdigit():
            raise InputError(
                "expected GPU=NAMESPACE/POD[/CONTAINER]",
                where="--pod",
                value=spec,
                fix="e.g. --pod 0=ml/llama-0/server",
            )
        pods[int(gpu)] = PodRef.parse(ref)
    return pods
