"""GPR workloads in the simulator: a seeded stream of GPU Provisioning Requests served by the real
:class:`~gpuscale.gpr.manager.GprManager` (and so :func:`gpuscale.core.gpr.plan_gprs`) on the virtual clock, with the
simulated cloud (:class:`~gpuscale.sim.cloud.SimCloud`) as its provider and an in-memory :class:`GprStore`.

The workload of each request is modelled at the request level: once its nodes are ready it keeps its GPUs busy, and
may stop using them after a while (``workloadStops``) or be released early by its user (``earlyRelease``); requests
with an ``idleTimeOutDuration`` are then released by the manager's idle timeout. The report gives the wait time by
priority class, GPU-hours billed / held / used / idle, the cost from the simulated cloud's accounting, and outcomes.

The simulator sits above :mod:`gpuscale.gpr` in the layers (it drives the GPR manager); the GPR server never imports
it and reaches the simulated cloud through :mod:`gpuscale.providers.registry`. This module reads scenarios and
generates requests; :mod:`gpuscale.sim.gpr.run` runs them.

Scenario YAML (every field optional except ``requests``; durations like ``90s``, ``30m``, ``1h30m``, ``2d``)::

    name: gpr-week
    seed: 7
    duration: 7d                 # simulated time
    catalog: linode              # a shipped catalog (NAME or NAME:REGION) or a catalog YAML path
    reconcileInterval: 30s       # the fastest the controller reacts; it also wakes on its own deadlines
    manager:                     # GprConfig: the same knobs as the controller's environment variables
      enableDynamicNode: true    # ENABLE_DYNAMIC_NODE
      maxNodes: 16               # MAX_NODE_COUNT
      maxDelayedCount: 72        # MAX_DELAYED_COUNT (0: never give up)
      delayInterval: 5m
      maxRetryCount: 3
      provisioningTimeout: 30m
      scaleUpLatency: 3m
      idleGpuThreshold: 0.05
      unavailableTtl: 10m
    cloud: {...}                 # as in `gpuscale simulate` scenarios (latencies, capacity rules, faults)
    inventory:                   # existing GPU nodes GPRs may borrow
      - {instanceType: g2-gpu-rtx4000a4-s, count: 2}
    requests:
      ratePerHour: 1.5           # Poisson arrivals
      start: 0s
      until: 6d                  # default: the scenario duration
      limit: 1000
      priorities: {low: 0.5, medium: 0.3, high: 0.2}
      shapes:                    # EGS spec fields (validated against the catalog) and a weight
        - {weight: 3, gpuShape: RTX4000-Ada, numberOfGPUs: 1}
        - {weight: 1, gpuShape: RTX4000-Ada, numberOfGPUs: 4, numberOfGPUNodes: 2}
      exitDuration: {distribution: lognormal, median: 4h, sigma: 0.5}
      idleTimeout: {fraction: 0.5, duration: 30m}
      workloadStops: {fraction: 0.4, after: {distribution: uniform, min: 30m, max: 4h}}
      earlyRelease: {fraction: 0.1, after: {distribution: uniform, min: 1h, max: 3h}}
      enableEviction: 0.5        # share of low- and medium-priority requests that allow eviction
      requeueOnFailure: 0.5
      busyUtilization: 0.9
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscale.core.gpr import (
    PRIORITY_MAX,
    GprConfig,
    GprValidationError,
    parse_gpr_spec,
)
from gpuscale.core.model import Catalog
from gpuscale.inputs import read_text
from gpuscale.manifests.problems import did_you_mean
from gpuscale.resources import example
from gpuscale.sim.cloud import CloudBehaviour
from gpuscale.sim.engine import Dist, stream
from gpuscale.sim.scenario import MAX_ARRIVALS, _catalog, _cloud
from gpuscale.sim.scenario_fields import FieldReader as _V
from gpuscale.sim.scenario_fields import load_yaml_lines

DEFAULT_SCENARIO = example("gpr-scenario.yaml")
"""The shipped scenario (``gpuscale/examples/gpr-scenario.yaml``, read through :mod:`gpuscale.resources`)."""

BANDS = ("low", "medium", "high")
_BAND_RANGE = {"low": (1, 100), "medium": (101, 200), "high": (201, PRIORITY_MAX)}

TOP_FIELDS = ("name", "description", "seed", "duration", "catalog", "reconcileInterval", "manager", "cloud",
              "inventory", "requests")  # fmt: skip
MANAGER_FIELDS = {
    "enableDynamicNode": "enable_dynamic_node",
    "maxNodes": "max_nodes",
    "maxDelayedCount": "max_delayed_count",
    "delayInterval": "delay_interval_s",
    "maxRetryCount": "max_retry_count",
    "provisioningTimeout": "provisioning_timeout_s",
    "scaleUpLatency": "scale_up_latency_s",
    "idleGpuThreshold": "idle_gpu_threshold",
    "unavailableTtl": "unavailable_ttl_s",
}
INVENTORY_FIELDS = ("instanceType", "count")
REQUEST_FIELDS = ("ratePerHour", "start", "until", "limit", "priorities", "shapes", "exitDuration", "idleTimeout",
                  "workloadStops", "earlyRelease", "enableEviction", "requeueOnFailure", "busyUtilization")  # fmt: skip
SHAPE_FIELDS = ("weight", "clusterName", "instanceType", "gpuShape", "enableAutoGpuSelection", "numberOfGPUs",
                "numberOfGPUNodes", "memoryPerGpu", "enableDynamicNodePool")  # fmt: skip
"""What a request shape may set; priority, durations and flags come from the generator."""


# ----------------------------------------------------------------------------------------------------- scenario
@dataclass(frozen=True, slots=True)
class RequestShape:
    """A partial EGS spec (the request's size and GPU) and its relative weight."""

    fields: Mapping[str, Any]
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class RequestStream:
    """The synthetic GPR arrival process. Fractions are probabilities per request."""

    shapes: tuple[RequestShape, ...]
    rate_per_hour: float = 1.0
    start_s: float = 0.0
    until_s: float | None = None
    limit: int | None = None
    priorities: Mapping[str, float] = field(default_factory=lambda: {"low": 0.5, "medium": 0.3, "high": 0.2})
    exit_duration: Dist = field(default_factory=lambda: Dist("lognormal", 4 * 3600.0, 0.5))
    idle_timeout_fraction: float = 0.0
    idle_timeout_s: float = 1800.0
    stop_fraction: float = 0.0
    stop_after: Dist = field(default_factory=lambda: Dist("uniform", 1800.0, 4 * 3600.0))
    early_release_fraction: float = 0.0
    early_release_after: Dist = field(default_factory=lambda: Dist("uniform", 3600.0, 3 * 3600.0))
    eviction_fraction: float = 0.0
    requeue_fraction: float = 0.0
    busy_utilization: float = 0.9


@dataclass(frozen=True)
class GprScenario:
    """A validated GPR simulation scenario (see the module docstring)."""

    name: str
    catalog: Catalog
    requests: RequestStream
    seed: int = 0
    duration_s: float = 7 * 86400.0
    reconcile_interval_s: float = 30.0
    manager: GprConfig = field(default_factory=lambda: GprConfig(provider="sim"))
    cloud: CloudBehaviour = field(default_factory=CloudBehaviour)
    inventory: tuple[tuple[str, int], ...] = ()
    source: str = "<scenario>"
    description: str = ""


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One generated GPR: when it arrives, its EGS spec, and how its workload behaves once served."""

    at: float
    spec: Mapping[str, Any]
    stops_after_s: float | None = None
    release_after_s: float | None = None


def load_gpr_scenario(path: str | Path) -> GprScenario:
    """Read and validate a GPR scenario file; raises :class:`InputError` naming file, line and field."""
    p = Path(path)
    text = read_text(p, what="scenario file")
    return parse_gpr_scenario(text, source=str(p), base_dir=p.parent)


def parse_gpr_scenario(
    text: str | Mapping[str, Any], *, source: str = "<scenario>", base_dir: Path | None = None
) -> GprScenario:
    """Validate scenario YAML text (or an already loaded mapping); unknown fields, wrong types and bad values raise
    :class:`InputError` naming the field (and the line, for text)."""
    lines: dict[str, int] = {}
    if isinstance(text, str):
        data, lines = load_yaml_lines(text, source)
    else:
        data = dict(text)
    v = _V(source, lines)
    if data is None:
        raise v.fail("", "the scenario is empty", fix="see examples/gpr-scenario.yaml for the format")
    top = v.mapping(data, "", TOP_FIELDS)
    base = base_dir or Path.cwd()
    catalog = _catalog(v, top.get("catalog", "linode"), base)
    duration = v.duration(top.get("duration", "7d"), "duration")
    if duration <= 0:
        raise v.fail("duration", "must be longer than zero", top.get("duration"))
    interval = v.duration(top.get("reconcileInterval", 30.0), "reconcileInterval")
    if interval <= 0:
        raise v.fail("reconcileInterval", "must be longer than zero", top.get("reconcileInterval"))
    if "requests" not in top:
        raise v.fail("requests", "is required", fix="describe the GPR arrivals (see examples/gpr-scenario.yaml)")
    return GprScenario(
        name=v.string(top.get("name"), "name") or Path(source).stem,
        catalog=catalog,
        requests=_requests(v, top["requests"], catalog, duration),
        seed=v.integer(top.get("seed", 0), "seed", maximum=2**63 - 1),
        duration_s=duration,
        reconcile_interval_s=interval,
        manager=_manager(v, top.get("manager")),
        cloud=_cloud(v, top.get("cloud"), catalog),
        inventory=_inventory(v, top.get("inventory"), catalog),
        source=source,
        description=v.string(top.get("description"), "description"),
    )


def _manager(v: _V, raw: object) -> GprConfig:
    m = v.mapping(raw, "manager", tuple(MANAGER_FIELDS))
    d = GprConfig()
    kw: dict[str, Any] = {"provider": "sim"}
    for key, attr in MANAGER_FIELDS.items():
        if m.get(key) is None:
            continue
        path = f"manager.{key}"
        if key == "enableDynamicNode":
            kw[attr] = v.boolean(m[key], path)
        elif key in ("maxNodes",):
            kw[attr] = v.integer(m[key], path, minimum=1)
        elif key in ("maxDelayedCount", "maxRetryCount"):
            kw[attr] = v.integer(m[key], path)
        elif key == "idleGpuThreshold":
            kw[attr] = v.probability(m[key], path)
        else:
            kw[attr] = v.duration(m[key], path)
    if kw.get("provisioning_timeout_s", d.provisioning_timeout_s) <= 0:
        raise v.fail("manager.provisioningTimeout", "must be longer than zero", m.get("provisioningTimeout"))
    return GprConfig(**kw)


def _inventory(v: _V, raw: object, catalog: Catalog) -> tuple[tuple[str, int], ...]:
    types = catalog.by_name()
    out: list[tuple[str, int]] = []
    for i, item in enumerate(v.listing(raw, "inventory")):
        path = f"inventory[{i}]"
        m = v.mapping(item, path, INVENTORY_FIELDS)
        name = v.string(m.get("instanceType"), f"{path}.instanceType", required=True)
        if name not in types:
            raise v.fail(
                f"{path}.instanceType", "is not an instance type of the catalog", name, did_you_mean(name, types)
            )
        if not types[name].gpu_count:
            raise v.fail(f"{path}.instanceType", "has no GPUs", name)
        out.append((name, v.integer(m.get("count", 1), f"{path}.count", minimum=1)))
    return tuple(out)


def _share_after(v: _V, raw: object, path: str, default: Dist) -> tuple[float, Dist]:
    """``{fraction, after}``: the share of requests concerned and when (after their nodes are ready)."""
    m = v.mapping(raw, path, ("fraction", "after"))
    frac = v.probability(m.get("fraction", 0.0), f"{path}.fraction")
    return frac, v.dist(m["after"], f"{path}.after") if m.get("after") is not None else default


def _idle_timeout(v: _V, raw: object, default_s: float) -> tuple[float, float]:
    """``{fraction, duration}``: the share of requests with an idle timeout, and the timeout."""
    path = "requests.idleTimeout"
    m = v.mapping(raw, path, ("fraction", "duration"))
    frac = v.probability(m.get("fraction", 0.0), f"{path}.fraction")
    seconds = v.duration(m["duration"], f"{path}.duration") if m.get("duration") is not None else default_s
    if seconds < 60:
        raise v.fail(f"{path}.duration", "must be at least 1m (GPR durations have minute resolution)", seconds)
    return frac, seconds


def _requests(v: _V, raw: object, catalog: Catalog, duration: float) -> RequestStream:
    m = v.mapping(raw, "requests", REQUEST_FIELDS)
    rate = v.number(m.get("ratePerHour", 1.0), "requests.ratePerHour")
    if rate <= 0:
        raise v.fail("requests.ratePerHour", "must be greater than zero", rate)
    prios = v.mapping(m.get("priorities"), "requests.priorities", BANDS)
    weights = {b: v.number(prios[b], f"requests.priorities.{b}") for b in BANDS if b in prios} if prios else {}
    if prios and sum(weights.values()) <= 0:
        raise v.fail("requests.priorities", "needs at least one positive weight", prios)
    shapes = [
        _shape(v, s, f"requests.shapes[{i}]", catalog)
        for i, s in enumerate(v.listing(m.get("shapes"), "requests.shapes"))
    ]
    if not shapes or sum(sh.weight for sh in shapes) <= 0:
        raise v.fail("requests.shapes", "needs at least one request shape with a positive weight",
                     fix="e.g. - {gpuShape: RTX4000-Ada}")  # fmt: skip
    defaults = RequestStream(shapes=())
    idle_frac, idle = _idle_timeout(v, m.get("idleTimeout"), defaults.idle_timeout_s)
    stop_frac, stop = _share_after(v, m.get("workloadStops"), "requests.workloadStops", defaults.stop_after)
    early_frac, early = _share_after(v, m.get("earlyRelease"), "requests.earlyRelease", defaults.early_release_after)
    until = v.duration(m["until"], "requests.until") if m.get("until") is not None else duration
    limit = v.integer(m["limit"], "requests.limit", minimum=1) if m.get("limit") is not None else None
    start = v.duration(m.get("start", 0.0), "requests.start")
    expected = min(rate * max(0.0, until - start) / 3600, limit or math.inf)
    if expected > MAX_ARRIVALS:
        raise v.fail("requests.ratePerHour", f"would generate about {expected:,.0f} requests (at most "
                     f"{MAX_ARRIVALS:,})", rate, "lower the rate or the duration, or set requests.limit")  # fmt: skip
    exit_d = v.dist(m["exitDuration"], "requests.exitDuration") if "exitDuration" in m else defaults.exit_duration
    if exit_d.mean < 60:
        raise v.fail("requests.exitDuration", "must average at least 1m", m.get("exitDuration"))
    return RequestStream(
        shapes=tuple(shapes),
        rate_per_hour=rate,
        start_s=start,
        until_s=until,
        limit=limit,
        priorities=weights or dict(defaults.priorities),
        exit_duration=exit_d,
        idle_timeout_fraction=idle_frac,
        idle_timeout_s=idle,
        stop_fraction=stop_frac,
        stop_after=stop,
        early_release_fraction=early_frac,
        early_release_after=early,
        eviction_fraction=v.probability(m.get("enableEviction", 0.0), "requests.enableEviction"),
        requeue_fraction=v.probability(m.get("requeueOnFailure", 0.0), "requests.requeueOnFailure"),
        busy_utilization=v.probability(m.get("busyUtilization", 0.9), "requests.busyUtilization"),
    )


def _shape(v: _V, raw: object, path: str, catalog: Catalog) -> RequestShape:
    m = v.mapping(raw, path, SHAPE_FIELDS)
    weight = v.number(m.get("weight", 1.0), f"{path}.weight")
    fields = {k: val for k, val in m.items() if k != "weight"}
    try:
        parse_gpr_spec({"requestName": "probe", "exitDuration": "1h", **fields}, catalog)
    except GprValidationError as exc:
        first = exc.errors[0]
        raise v.fail(f"{path}.{first.field}", first.message, fields.get(first.field)) from None
    return RequestShape(fields, weight)


# ---------------------------------------------------------------------------------------------------- generator
def generate_requests(scenario: GprScenario) -> list[SimRequest]:
    """The scenario's GPR arrivals: a Poisson process, each request drawn from independent seeded streams."""
    rs = scenario.requests
    seed = scenario.seed
    r_at, r_shape, r_prio, r_dur = (stream(seed, f"gpr.{n}") for n in ("arrivals", "shapes", "priority", "duration"))
    r_idle, r_stop, r_early, r_flags = (stream(seed, f"gpr.{n}") for n in ("idle", "stop", "early", "flags"))
    end = min(rs.until_s if rs.until_s is not None else scenario.duration_s, scenario.duration_s)
    shape_w = [s.weight for s in rs.shapes]
    bands = [b for b in BANDS if rs.priorities.get(b, 0.0) > 0]
    band_w = [rs.priorities[b] for b in bands]
    out: list[SimRequest] = []
    t = rs.start_s
    while rs.limit is None or len(out) < rs.limit:
        t += r_at.expovariate(rs.rate_per_hour / 3600.0)
        if t >= end:
            break
        shape = r_shape.choices(rs.shapes, shape_w)[0]
        band = r_prio.choices(bands, band_w)[0]
        lo, hi = _BAND_RANGE[band]
        exit_s = max(60.0, rs.exit_duration.sample(r_dur))
        spec: dict[str, Any] = {
            **shape.fields,
            "requestName": f"sim-{len(out) + 1:05d}",
            "priority": r_prio.randint(lo, hi),
            "exitDuration": f"{max(1, round(exit_s / 60))}m",
        }
        if r_idle.random() < rs.idle_timeout_fraction:
            spec["idleTimeOutDuration"] = f"{max(1, round(rs.idle_timeout_s / 60))}m"
        if band != "high" and r_flags.random() < rs.eviction_fraction:
            spec["enableEviction"] = True
        if r_flags.random() < rs.requeue_fraction:
            spec["requeueOnFailure"] = True
        stops = rs.stop_after.sample(r_stop) if r_stop.random() < rs.stop_fraction else None
        early = rs.early_release_after.sample(r_early) if r_early.random() < rs.early_release_fraction else None
        out.append(SimRequest(t, spec, stops, early))
    return out
