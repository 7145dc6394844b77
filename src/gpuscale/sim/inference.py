"""Inference workloads in the simulator: request-rate curves, per-replica service, DCGM-like metrics, a queueing
SLA proxy, and the scenario's ``inference`` section.

A model deployment receives requests at ``rate(t)`` per second (a diurnal cosine with seeded noise and bursts, or a
step list). Each *ready* replica (bound to a node whose GPUs are allocatable, plus the model's ``coldStart`` load
time) serves ``serviceRate`` requests per second. From that, per ready replica:

* ``DCGM_FI_DEV_GPU_UTIL`` = 100 u, where u = min(lambda, c mu) / (c mu) is the served load per replica;
* ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` = 0.95 u (a fraction, as DCGM reports it); ``DCGM_FI_DEV_MEM_COPY_UTIL`` = 40 u;
* ``DCGM_FI_DEV_FB_USED`` = weights + u x KV cache (MiB), ``DCGM_FI_DEV_FB_FREE`` = GPU memory - used;
* CPU utilisation (percent of the pod's request) = ``cpu.idle`` + u x ``cpu.perLoad`` (5 + 15 u by default): an
  inference server's CPU stays low while its GPU saturates, so an HPA on CPU under-scales.

**SLA proxy: queueing delay.** Requests beyond capacity pile up in a fluid backlog Q (Q grows by
(lambda - c mu) dt, drains at c mu). The delay of a step is the M/M/c mean wait (Erlang C, while lambda < c mu) plus
the backlog's drain time Q / (c mu) at the middle of the step; with no ready replica it is the age of the backlog.
The p95 is taken over requests (each step weighted by lambda dt).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpuscale.manifests.scaler import ScalerFile, ScalerManifest, load_scalers, parse_scalers
from gpuscale.sim.engine import stream
from gpuscale.sim.workloads import PodShape

if TYPE_CHECKING:
    from gpuscale.sim.scenario_fields import FieldReader as _V

INFERENCE_FIELDS = ("scalers", "step", "models")
MODEL_FIELDS = (
    "name", "scaler", "shape", "serviceRate", "coldStart", "rate", "cpu", "gpuMemory", "slaQueueDelay",
    "hpaCpuTarget", "initialReplicas",
)  # fmt: skip
RATE_FIELDS = ("base", "peak", "period", "peakAt", "noise", "bursts")
BURST_FIELDS = ("at", "duration", "factor")
CPU_FIELDS = ("idle", "perLoad")
GPU_MEMORY_FIELDS = ("totalMiB", "weightsMiB", "kvCacheMiB")
DEFAULT_STEP_S = 15.0
"""The HPA's sync period: metrics are sampled and scalers stepped this often."""


# ------------------------------------------------------------------------------------------------ rate curves
@dataclass(frozen=True, slots=True)
class Burst:
    at: float
    duration: float
    factor: float


@dataclass(frozen=True, slots=True)
class RateCurve:
    """Requests per second over time: ``points`` (a step function of ``(t, rps)``) when given, else
    ``base + (peak - base) (1 + cos(2 pi (t - peakAt) / period)) / 2``, times the factor of any open burst, times
    ``1 + noise x N(0, 1)`` (clipped at 0) drawn per step from the seeded stream."""

    base: float = 0.0
    peak: float = 0.0
    period: float = 86_400.0
    peak_at: float = 0.0
    noise: float = 0.0
    bursts: tuple[Burst, ...] = ()
    points: tuple[tuple[float, float], ...] = ()

    def clean(self, t: float) -> float:
        """The rate at ``t`` without noise."""
        if self.points:
            rps = 0.0
            for at, r in self.points:
                if at > t:
                    break
                rps = r
            return rps
        x = self.base + (self.peak - self.base) * (1 + math.cos(2 * math.pi * (t - self.peak_at) / self.period)) / 2
        for b in self.bursts:
            if b.at <= t < b.at + b.duration:
                x *= b.factor
        return x

    def at(self, t: float, rng: random.Random) -> float:
        """The rate at ``t`` with this step's noise (one draw from ``rng`` when ``noise`` > 0)."""
        x = self.clean(t)
        if self.noise > 0:
            x *= max(0.0, 1 + self.noise * rng.gauss(0.0, 1.0))
        return x


# ------------------------------------------------------------------------------------------------ queueing
def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with ``servers`` and offered load ``offered`` = lambda/mu
    (Erlang B by its recurrence, then C = B / (1 - rho (1 - B))); 1 when the queue is unstable."""
    if servers <= 0 or offered >= servers:
        return 1.0
    if offered <= 0:
        return 0.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho * (1 - b))


def mmc_wait(servers: int, arrival: float, service: float) -> float:
    """Mean queueing delay (seconds) of M/M/c: C(c, a) / (c mu - lambda); infinite when lambda >= c mu."""
    if arrival <= 0:
        return 0.0
    cap = servers * service
    if servers <= 0 or arrival >= cap:
        return math.inf
    return erlang_c(servers, arrival / service) / (cap - arrival)


@dataclass(slots=True)
class Backlog:
    """The fluid backlog of one model (requests beyond capacity) and since when it has had no server."""

    queued: float = 0.0
    since: float | None = None

    def advance(self, t: float, dt: float, arrival: float, servers: int, service: float) -> float:
        """Move ``dt`` seconds from ``t`` at ``arrival`` requests/s with ``servers`` ready replicas; returns the
        step's delay proxy (see the module docstring)."""
        cap = servers * service
        before = self.queued
        self.queued = max(0.0, before + (arrival - cap) * dt)
        if servers <= 0:
            if self.queued <= 0:
                self.since = None
                return 0.0
            if self.since is None:
                self.since = t
            return t + dt / 2 - self.since
        self.since = None
        mid = (before + self.queued) / 2
        wait = mmc_wait(servers, arrival, service) if arrival < cap else 0.0
        return wait + mid / cap


def weighted_percentile(samples: Sequence[tuple[float, float]], q: float) -> float:
    """The ``q`` (0..1) percentile of ``(value, weight)`` samples: the smallest value whose cumulative weight
    reaches ``q`` of the total (0 when there is no weight)."""
    total = sum(w for _, w in samples)
    if total <= 0:
        return 0.0
    acc = 0.0
    for value, w in sorted(samples):
        acc += w
        if acc >= q * total - 1e-12:
            return value
    return max(v for v, _ in samples)


# ------------------------------------------------------------------------------------------------ the model
@dataclass(frozen=True, slots=True)
class GpuMemory:
    total_mib: float = 24_576.0
    weights_mib: float = 14_000.0
    kv_cache_mib: float = 8_000.0


@dataclass(frozen=True, slots=True)
class InferenceModel:
    """One model deployment of a scenario's ``inference`` section."""

    name: str
    scaler: ScalerManifest
    shape: PodShape
    service_rate: float
    rate: RateCurve
    cold_start_s: float = 60.0
    cpu_idle: float = 5.0
    cpu_per_load: float = 15.0
    gpu_memory: GpuMemory = field(default_factory=GpuMemory)
    sla_queue_delay_s: float = 1.0
    hpa_cpu_target: float = 60.0
    initial_replicas: int | None = None

    @property
    def namespace(self) -> str:
        return self.scaler.namespace

    def metrics(self, arrival: float, ready: int) -> dict[str, float]:
        """The per-ready-replica readings (DCGM field names, ``cpu`` in percent of the request) at ``arrival``
        requests/s with ``ready`` replicas; all idle values when none is ready."""
        u = min(arrival, ready * self.service_rate) / (ready * self.service_rate) if ready > 0 else 0.0
        m = self.gpu_memory
        used = min(m.total_mib, m.weights_mib + u * m.kv_cache_mib)
        return {
            "DCGM_FI_DEV_GPU_UTIL": 100 * u,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.95 * u,
            "DCGM_FI_DEV_MEM_COPY_UTIL": 40 * u,
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_FREE": m.total_mib - used,
            "cpu": self.cpu_idle + u * self.cpu_per_load,
        }


def trigger_value(query: str, per_pod: Mapping[str, float], ready: int, pod_average: bool) -> float | None:
    """What the trigger's PromQL ``query`` reads in the simulator: the DCGM field it names, as a per-pod average
    (percent, as the ``dcgm`` shortcuts write it), or summed over the ready pods when the query starts with
    ``sum(`` and is not a per-pod metric. None (the query fails) when no pod reports, as Prometheus would
    return nothing."""
    if ready <= 0:
        return None
    if "DCGM_FI_DEV_FB_USED" in query:
        used, free = per_pod["DCGM_FI_DEV_FB_USED"], per_pod["DCGM_FI_DEV_FB_FREE"]
        return 100 * used / (used + free)
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_GPU_UTIL"):
        if name in query:
            value = per_pod[name] * (100 if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" else 1)
            if not pod_average and query.replace(" ", "").startswith("sum("):
                return value * ready
            return value
    return None


def simulated_query(query: str) -> bool:
    """Whether the simulator can answer ``query`` (it names a DCGM field it simulates)."""
    return any(n in query for n in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                                    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_GPU_UTIL"))  # fmt: skip


@dataclass(frozen=True, slots=True)
class InferenceSpec:
    """A scenario's ``inference`` section: models, their scalers and the budgets those name."""

    models: tuple[InferenceModel, ...]
    scalers: ScalerFile
    step_s: float = DEFAULT_STEP_S

    def noise_stream(self, seed: int, model: str) -> random.Random:
        return stream(seed, f"inference.rate.{model}")


# ------------------------------------------------------------------------------------------------ parsing
def parse_inference(v: _V, raw: object, base: Path) -> InferenceSpec:
    """Validate the ``inference`` section (``v`` is the scenario's validator, for file lines in errors)."""
    from gpuscale.sim.scenario import _shape

    top = v.mapping(raw, "inference", INFERENCE_FIELDS)
    step = v.duration(top.get("step", DEFAULT_STEP_S), "inference.step")
    if step <= 0:
        raise v.fail("inference.step", "must be positive", top.get("step"), "e.g. 15s (the HPA sync period)")
    scalers = _scaler_file(v, top.get("scalers"), base)
    by_name = {s.name: s for s in scalers.scalers}
    models: list[InferenceModel] = []
    items = v.listing(top.get("models"), "inference.models")
    if not items:
        raise v.fail("inference.models", "at least one model is required", fix="add {name, shape, serviceRate, rate}")
    for i, item in enumerate(items):
        path = f"inference.models[{i}]"
        m = v.mapping(item, path, MODEL_FIELDS)
        name = v.string(m.get("name"), f"{path}.name", required=True)
        scaler_name = v.string(m.get("scaler"), f"{path}.scaler") or name
        scaler = by_name.get(scaler_name)
        if scaler is None:
            raise v.fail(f"{path}.scaler", f"no GPUWorkloadScaler or ScaledObject named {scaler_name!r}",
                         scaler_name, f"scalers: {', '.join(sorted(by_name)) or 'none'}")  # fmt: skip
        for t in scaler.spec.triggers:
            q = scaler.queries.get(t.name, ("", ""))[1]
            if not simulated_query(q):
                raise v.fail(f"{path}.scaler", f"trigger {t.name!r} of {scaler_name} queries {q[:60]!r}, which the "
                             "simulator cannot answer", scaler_name,
                             "use a dcgm trigger or a query on a DCGM_FI_* field")  # fmt: skip
        shape = _shape(v, m.get("shape"), f"{path}.shape")
        if shape.gpus < 1:
            raise v.fail(f"{path}.shape.gpus", "an inference replica needs at least one GPU", shape.gpus)
        service = v.number(m.get("serviceRate"), f"{path}.serviceRate")
        if service <= 0:
            raise v.fail(f"{path}.serviceRate", "must be positive (requests/s one ready replica serves)", service)
        cpu = v.mapping(m.get("cpu"), f"{path}.cpu", CPU_FIELDS)
        mem = v.mapping(m.get("gpuMemory"), f"{path}.gpuMemory", GPU_MEMORY_FIELDS)
        memory = GpuMemory(
            v.number(mem.get("totalMiB", 24_576), f"{path}.gpuMemory.totalMiB"),
            v.number(mem.get("weightsMiB", 14_000), f"{path}.gpuMemory.weightsMiB"),
            v.number(mem.get("kvCacheMiB", 8_000), f"{path}.gpuMemory.kvCacheMiB"),
        )
        if memory.total_mib <= 0:
            raise v.fail(f"{path}.gpuMemory.totalMiB", "must be positive", memory.total_mib)
        initial = m.get("initialReplicas")
        models.append(
            InferenceModel(
                name=name,
                scaler=scaler,
                shape=shape,
                service_rate=service,
                rate=_rate(v, m.get("rate"), f"{path}.rate"),
                cold_start_s=v.duration(m.get("coldStart", 60.0), f"{path}.coldStart"),
                cpu_idle=v.number(cpu.get("idle", 5.0), f"{path}.cpu.idle", maximum=100),
                cpu_per_load=v.number(cpu.get("perLoad", 15.0), f"{path}.cpu.perLoad", maximum=100),
                gpu_memory=memory,
                sla_queue_delay_s=v.duration(m.get("slaQueueDelay", 1.0), f"{path}.slaQueueDelay"),
                hpa_cpu_target=_positive(v, m.get("hpaCpuTarget", 60.0), f"{path}.hpaCpuTarget"),
                initial_replicas=None if initial is None else v.integer(initial, f"{path}.initialReplicas"),
            )
        )
    names = [x.name for x in models]
    if len(set(names)) != len(names):
        raise v.fail("inference.models", "model names must be unique", names)
    budgets = {b.name for b in scalers.budgets}
    for x in models:
        ref = x.scaler.budget
        if ref is not None and ref.name not in budgets:
            raise v.fail("inference.scalers", f"scaler {x.scaler.name} names GPUBudget {ref.name!r}, which is not "
                         "among the scalers' documents", ref.name, "add the GPUBudget document")  # fmt: skip
    return InferenceSpec(tuple(models), scalers, step)


def _positive(v: _V, raw: object, path: str) -> float:
    x = v.number(raw, path)
    if x <= 0:
        raise v.fail(path, "must be positive", x)
    return x


def _scaler_file(v: _V, raw: object, base: Path) -> ScalerFile:
    if isinstance(raw, str):
        p = Path(raw) if Path(raw).is_absolute() else base / raw
        if not p.is_file():
            raise v.fail("inference.scalers", "file not found", raw, f"a path relative to the scenario's folder {base}")
        return load_scalers(p)
    docs = v.listing(raw, "inference.scalers")
    if not docs:
        raise v.fail("inference.scalers", "required: a file of GPUWorkloadScalers/ScaledObjects/GPUBudgets, or "
                     "those documents inline as a list", fix="e.g. scalers: scalers.yaml")  # fmt: skip
    return parse_scalers(yaml.safe_dump_all(docs, sort_keys=False), source=v.where("inference.scalers"))


def _rate(v: _V, raw: object, path: str) -> RateCurve:
    if isinstance(raw, list):
        points: list[tuple[float, float]] = []
        for i, p in enumerate(raw):
            if not isinstance(p, list) or len(p) != 2:
                raise v.fail(f"{path}[{i}]", "must be [t, requestsPerSecond]", p, "e.g. [10m, 4.5]")
            points.append((v.duration(p[0], f"{path}[{i}][0]"), v.number(p[1], f"{path}[{i}][1]")))
        if [t for t, _ in points] != sorted(t for t, _ in points):
            raise v.fail(path, "times must increase", [t for t, _ in points])
        return RateCurve(points=tuple(points))
    m = v.mapping(raw, path, RATE_FIELDS)
    if raw is None:
        raise v.fail(path, "is required", fix="e.g. {base: 1, peak: 10, period: 24h, peakAt: 14h} or [[0, 2], [1h, 8]]")
    period = v.duration(m.get("period", 86_400.0), f"{path}.period")
    if period <= 0:
        raise v.fail(f"{path}.period", "must be positive", period)
    bursts = []
    for i, b in enumerate(v.listing(m.get("bursts", []), f"{path}.bursts")):
        bm = v.mapping(b, f"{path}.bursts[{i}]", BURST_FIELDS)
        bursts.append(Burst(v.duration(bm.get("at"), f"{path}.bursts[{i}].at"),
                            v.duration(bm.get("duration"), f"{path}.bursts[{i}].duration"),
                            v.number(bm.get("factor", 2.0), f"{path}.bursts[{i}].factor")))  # fmt: skip
    return RateCurve(
        base=v.number(m.get("base", 0.0), f"{path}.base"),
        peak=v.number(m.get("peak", m.get("base", 0.0)), f"{path}.peak"),
        period=period,
        peak_at=v.duration(m.get("peakAt", 0.0), f"{path}.peakAt"),
        noise=v.number(m.get("noise", 0.0), f"{path}.noise", maximum=10),
        bursts=tuple(bursts),
    )


def describe(spec: InferenceSpec) -> list[dict[str, Any]]:
    """One line of facts per model (for reports)."""
    return [{"model": m.name, "scaler": m.scaler.name, "gpusPerReplica": m.shape.gpus,
             "serviceRate": m.service_rate, "slaQueueDelayS": m.sla_queue_delay_s} for m in spec.models]  # fmt: skip
