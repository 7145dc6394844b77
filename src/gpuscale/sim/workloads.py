"""Workload sources for the simulator: pod arrivals with their run time.

Every source returns a list of :class:`Arrival` sorted by time (ties by pod name), and is deterministic for its seed:

* :func:`openb_arrivals`: the Alibaba ``cluster-trace-gpu-v2023`` (openb) pod list with its timestamps. A pod
  arrives at ``creation_time`` and, once bound, runs ``deletion_time - scheduled_time`` seconds. A pod the original
  cluster never scheduled (empty ``scheduled_time``) gets ``deadline = deletion_time``: its owner deleted it then, so
  the simulated one is dropped if it is still pending at that moment; bound earlier, it runs for its lifetime
  (``deletion_time - creation_time``).
* :func:`alibaba2025_arrivals`: the Alibaba ``cluster-trace-gpu-v2025`` disaggregated DLRM inference trace
  (long-running serving instances). Empty ``creation_time`` means the instance existed before the window (arrives at
  0); empty ``deletion_time`` means it outlives the window (runs until ``window_end``).
* synthetic generators: :func:`steady` (Poisson), :func:`diurnal` (Poisson with a daily cosine rate), :func:`burst`
  (N pods at once, e.g. from zero) and :func:`gangs` (all-or-nothing groups).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuscale.core.model import Pod, Toleration
from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.errors import InputError
from gpuscale.resources import data_dir
from gpuscale.sim.engine import Dist, stream
from gpuscale.traces.openb import load_pods


def openb_file(variant: str = "default") -> Path:
    """The openb pod list of a variant (``default``, ``cpu050``, ``gpushare40``, ``gpuspec10``)."""
    return data_dir() / "openb" / f"openb_pod_list_{variant}.csv.gz"


def alibaba2025_file() -> Path:
    """The Alibaba 2025 DLRM inference trace."""
    return data_dir() / "alibaba-misc" / "gpu-v2025_disaggregated_DLRM_trace.csv.gz"


@dataclass(frozen=True, slots=True)
class Arrival:
    """A pod arriving at ``at``; once bound it runs ``duration`` seconds. ``deadline`` (absolute) drops it if it is
    still pending then. ``gpu_util`` is its measured GPU utilisation (None: the cluster's default)."""

    at: float
    pod: Pod
    duration: float
    deadline: float | None = None
    gpu_util: float | None = None


def _sorted(arrivals: list[Arrival]) -> list[Arrival]:
    arrivals.sort(key=lambda a: (a.at, a.pod.name))
    return arrivals


# ---------------------------------------------------------------------------------------------------------- openb
def openb_arrivals(
    path: str | Path | None = None,
    *,
    start: float = 0.0,
    end: float | None = None,
    time_scale: float = 1.0,
    gpu_models: str = "keep",
    model_map: Mapping[str, str] | None = None,
    namespace: str = "openb",
    limit: int | None = None,
) -> list[Arrival]:
    """Arrivals of an openb pod list (see the module docstring).

    Only pods created in ``[start, end)`` (trace seconds) are kept, shifted so that ``start`` is time 0; all times
    are then multiplied by ``time_scale``. ``gpu_models`` is ``keep`` (the trace's ``gpu_spec`` constrains the GPU
    model, optionally renamed through ``model_map``) or ``ignore``. ``limit`` keeps the first N arrivals.
    """
    if gpu_models not in ("keep", "ignore"):
        raise InputError("gpu_models must be 'keep' or 'ignore'", where="workload.gpuModels", value=gpu_models)
    if time_scale <= 0:
        raise InputError("must be positive", where="workload.timeScale", value=time_scale)
    out: list[Arrival] = []
    path = openb_file() if path is None else path
    for tp in load_pods(path):
        if tp.creation_time is None or tp.deletion_time is None:
            raise InputError(
                "the pod list has no timestamps",
                where=f"{path} pod {tp.name}",
                fix="use a pod list with creation_time/deletion_time columns (e.g. openb_pod_list_default)",
            )
        c = tp.creation_time
        if c < start or (end is not None and c >= end):
            continue
        req = tp.request
        models = req.gpu_models
        if models is not None:
            if gpu_models == "ignore":
                req = Request(req.cpu_milli, req.memory_mib, req.gpus, req.gpu_milli, None)
            elif model_map:
                req = Request(
                    req.cpu_milli,
                    req.memory_mib,
                    req.gpus,
                    req.gpu_milli,
                    frozenset(model_map.get(m, m) for m in models),
                )
        ran_from = tp.scheduled_time if tp.scheduled_time is not None else c
        duration = max(0.0, tp.deletion_time - ran_from) * time_scale
        deadline = None if tp.scheduled_time is not None else start_rel(tp.deletion_time, start, time_scale)
        labels = {"app": "openb", "qos": tp.qos} if tp.qos else {"app": "openb"}
        pod = Pod(name=tp.name, namespace=namespace, request=req, labels=labels)
        out.append(Arrival(start_rel(c, start, time_scale), pod, duration, deadline))
    out = _sorted(out)
    return out[:limit] if limit is not None else out


def start_rel(t: float, start: float, scale: float) -> float:
    """Trace time ``t`` relative to ``start``, scaled."""
    return (t - start) * scale


# ------------------------------------------------------------------------------------------------ alibaba 2025
_ALI_COLUMNS = ("instance_sn", "role", "app_name", "cpu_request", "gpu_request", "memory_request", "creation_time")


_ASCII_NUMBER = re.compile(r"^[+-]?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][+-]?[0-9]{1,3})?$")
_MAX_TRACE_VALUE = 1e15


def _ali_float(row: dict[str, str], col: str, where: str) -> float | None:
    text = (row.get(col) or "").strip()
    if not text:
        return None
    if not _ASCII_NUMBER.match(text):  # float() would take "٣", "1_0", "inf" and 6,000-digit strings
        raise InputError(f"column {col!r} is not a number", where=where, value=text)
    v = float(text)
    if not math.isfinite(v) or v < 0 or v > _MAX_TRACE_VALUE:
        raise InputError(f"column {col!r} must be a number from 0 to 1e15", where=where, value=text)
    return v


def alibaba2025_arrivals(
    path: str | Path | None = None,
    *,
    include_cpu_only: bool = False,
    window_end: float | None = None,
    time_scale: float = 1.0,
    namespace: str = "inference",
    limit: int | None = None,
) -> list[Arrival]:
    """Arrivals of the Alibaba 2025 DLRM inference trace (see the module docstring).

    CPU in cores and memory in GiB become millicores and MiB; ``gpu_request`` is whole GPUs. CPU-only instances
    (role ``CN``) are skipped unless ``include_cpu_only``. ``window_end`` defaults to the last timestamp in the file.
    ``max_instance_per_node`` (anti-affinity) is not modelled.
    """
    p = alibaba2025_file() if path is None else Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror}", where=str(p), fix="check the path") from exc
    text = gzip.decompress(raw).decode("utf-8") if raw[:2] == b"\x1f\x8b" else raw.decode("utf-8")
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _ALI_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}", where=str(p))
    rows: list[tuple[str, dict[str, str], float | None, float | None, float | None]] = []
    last = 0.0
    for line, row in enumerate(reader, start=2):
        where = f"{p}:{line}"
        c = _ali_float(row, "creation_time", where)
        s = _ali_float(row, "scheduled_time", where)
        d = _ali_float(row, "deletion_time", where)
        last = max(last, *(x for x in (c, s, d) if x is not None), 0.0)
        rows.append((where, row, c, s, d))
    end = last if window_end is None else window_end
    out: list[Arrival] = []
    for where, row, c, s, d in rows:
        gpus_f = _ali_float(row, "gpu_request", where) or 0.0
        if gpus_f and gpus_f != int(gpus_f):
            raise InputError("gpu_request must be a whole number", where=where, value=row["gpu_request"])
        gpus = int(gpus_f)
        if not gpus and not include_cpu_only:
            continue
        at = c if c is not None else 0.0
        if at >= end:
            continue
        ran_from = s if s is not None else at
        stop = min(d, end) if d is not None else end
        cpu = round((_ali_float(row, "cpu_request", where) or 0.0) * 1000)
        mem = round((_ali_float(row, "memory_request", where) or 0.0) * 1024)
        pod = Pod(
            name=row["instance_sn"],
            namespace=namespace,
            request=Request(cpu_milli=cpu, memory_mib=mem, gpus=gpus),
            labels={"app": row.get("app_name", ""), "role": row.get("role", "")},
        )
        out.append(Arrival(at * time_scale, pod, max(0.0, stop - ran_from) * time_scale))
    out = _sorted(out)
    return out[:limit] if limit is not None else out


# ---------------------------------------------------------------------------------------------------- synthetic
@dataclass(frozen=True, slots=True)
class PodShape:
    """One kind of synthetic pod, drawn with probability proportional to ``weight``."""

    cpu_milli: int = 1000
    memory_mib: int = 4096
    gpus: int = 0
    gpu_milli: int = 0
    weight: float = 1.0
    gpu_models: frozenset[str] | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    gpu_util: float | None = None

    def request(self) -> Request:
        """The core request of this shape."""
        return Request(self.cpu_milli, self.memory_mib, self.gpus, self.gpu_milli, self.gpu_models)


ONE_GPU = PodShape(cpu_milli=4000, memory_mib=16384, gpus=1)
HOURLY_RUNTIME = Dist("exponential", 3600.0)
GANG_RUNTIME = Dist("exponential", 7200.0)
ONE_HOUR = Dist.const(3600.0)


def _pick(shapes: Sequence[PodShape], x: float) -> PodShape:
    total = sum(s.weight for s in shapes)
    acc = 0.0
    for s in shapes:
        acc += s.weight / total
        if x < acc:
            return s
    return shapes[-1]


def _check_shapes(shapes: Sequence[PodShape]) -> None:
    if not shapes:
        raise InputError("at least one pod shape is needed", where="workload.shapes")
    if any(s.weight < 0 for s in shapes) or sum(s.weight for s in shapes) <= 0:
        raise InputError("shape weights must be non-negative and not all zero", where="workload.shapes")


def _pod(shape: PodShape, name: str, namespace: str, gang: str | None = None, gang_size: int = 0) -> Pod:
    return Pod(
        name=name,
        namespace=namespace,
        request=shape.request(),
        node_selector=dict(shape.node_selector),
        tolerations=shape.tolerations,
        priority=shape.priority,
        labels=dict(shape.labels),
        annotations=dict(shape.annotations),
        gang=gang,
        gang_size=gang_size,
    )


def steady(
    rate_per_hour: float,
    duration_s: float,
    shapes: Sequence[PodShape] = (ONE_GPU,),
    runtime: Dist = HOURLY_RUNTIME,
    *,
    seed: int = 0,
    start: float = 0.0,
    prefix: str = "steady",
    namespace: str = "default",
) -> list[Arrival]:
    """Poisson arrivals at ``rate_per_hour`` during ``duration_s`` from ``start``."""
    return diurnal(
        rate_per_hour, rate_per_hour, duration_s, shapes, runtime, seed=seed, start=start, prefix=prefix,
        namespace=namespace,
    )  # fmt: skip


def diurnal(
    peak_per_hour: float,
    trough_per_hour: float,
    duration_s: float,
    shapes: Sequence[PodShape] = (ONE_GPU,),
    runtime: Dist = HOURLY_RUNTIME,
    *,
    seed: int = 0,
    start: float = 0.0,
    period_s: float = 86400.0,
    peak_at_s: float = 14 * 3600.0,
    prefix: str = "diurnal",
    namespace: str = "default",
) -> list[Arrival]:
    """Poisson arrivals whose rate follows a cosine between ``trough_per_hour`` and ``peak_per_hour`` (peak at
    ``peak_at_s`` into each ``period_s``), by thinning."""
    if peak_per_hour < 0 or trough_per_hour < 0 or duration_s < 0:
        raise InputError("rates and duration must not be negative", where="workload", value=(peak_per_hour, duration_s))
    _check_shapes(shapes)
    lo, hi = sorted((trough_per_hour, peak_per_hour))
    if hi <= 0:
        return []
    rng = stream(seed, f"workload.{prefix}")
    out: list[Arrival] = []
    t, n, lam = start, 0, hi / 3600.0
    while True:
        t += rng.expovariate(lam)
        if t >= start + duration_s:
            break
        phase = 2 * math.pi * ((t - peak_at_s) % period_s) / period_s
        rate = lo + (hi - lo) * (1 + math.cos(phase)) / 2
        accept = rng.random() < rate / hi
        shape = _pick(shapes, rng.random())
        run = runtime.sample(rng)
        if accept:
            n += 1
            out.append(Arrival(t, _pod(shape, f"{prefix}-{n:06d}", namespace), run, gpu_util=shape.gpu_util))
    return _sorted(out)


def burst(
    count: int,
    at: float = 0.0,
    shape: PodShape = ONE_GPU,
    runtime: Dist = ONE_HOUR,
    *,
    seed: int = 0,
    spread_s: float = 0.0,
    prefix: str = "burst",
    namespace: str = "default",
) -> list[Arrival]:
    """``count`` pods arriving at ``at`` (uniformly over ``spread_s`` seconds if given), e.g. a burst from zero."""
    if count < 0 or spread_s < 0:
        raise InputError("count and spread must not be negative", where="workload", value=(count, spread_s))
    rng = stream(seed, f"workload.{prefix}")
    out = []
    for i in range(count):
        t = at + (rng.uniform(0.0, spread_s) if spread_s else 0.0)
        out.append(
            Arrival(t, _pod(shape, f"{prefix}-{i + 1:06d}", namespace), runtime.sample(rng), gpu_util=shape.gpu_util)
        )
    return _sorted(out)


def gangs(
    rate_per_hour: float,
    duration_s: float,
    sizes: Sequence[int] = (2, 4, 8),
    shape: PodShape = ONE_GPU,
    runtime: Dist = GANG_RUNTIME,
    *,
    seed: int = 0,
    start: float = 0.0,
    prefix: str = "gang",
    namespace: str = "default",
) -> list[Arrival]:
    """Poisson arrivals of gangs (size drawn uniformly from ``sizes``) whose members must all run together; members
    share one run time."""
    if rate_per_hour < 0 or duration_s < 0:
        raise InputError("rate and duration must not be negative", where="workload", value=(rate_per_hour, duration_s))
    if not sizes or any(s < 1 for s in sizes):
        raise InputError("gang sizes must be positive integers", where="workload.sizes", value=list(sizes))
    if rate_per_hour == 0:
        return []
    rng = stream(seed, f"workload.{prefix}")
    out: list[Arrival] = []
    t, g = start, 0
    while True:
        t += rng.expovariate(rate_per_hour / 3600.0)
        if t >= start + duration_s:
            break
        g += 1
        size = sizes[rng.randrange(len(sizes))]
        run = runtime.sample(rng)
        gang = f"{prefix}-{g:05d}"
        for m in range(size):
            out.append(Arrival(t, _pod(shape, f"{gang}-{m}", namespace, gang, size), run, gpu_util=shape.gpu_util))
    return _sorted(out)


def gpu_demand_hours(arrivals: Sequence[Arrival]) -> float:
    """GPU-hours the arrivals would hold if each ran its full duration once."""
    return sum(a.pod.request.gpu_demand_milli / MILLI_PER_GPU * a.duration for a in arrivals) / 3600.0
