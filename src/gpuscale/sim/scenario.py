"""Scenario files: one YAML document describing a simulation, validated strictly.

Every unknown key, wrong type or bad value raises :class:`~gpuscale.errors.InputError` naming the file, the line and
the field path, with the fix. Durations are seconds (a number) or strings such as ``"90s"``, ``"5m"``, ``"1h30m"``,
``"2d"``; quantities are Kubernetes quantities (``cpu: "500m"``, ``memory: 16Gi``). Example::

    name: burst-from-zero
    seed: 7
    duration: 6h                 # optional: default is until the workload has drained
    catalog: linode              # a shipped catalog (NAME or NAME:REGION) or a catalog YAML path
    pools:                       # GPUNodePool specs: `name` plus the CRD's spec fields (or full documents)
      - name: gpu
        instanceTypes: [g1-gpu-rtx6000-1]
        disruption: {consolidationPolicy: WhenEmpty, consolidateAfter: 5m}
    cloud:
      launchLatency: {distribution: lognormal, median: 40s, sigma: 0.3}
      devicePluginDelay: 120s
      capacity: [{instanceType: g1-gpu-rtx6000-1, maxNodes: 40}]
      spotInterruptionsPerHour: 0.05
      faults: {rateLimited: 0.01, serverError: 0.01, timeout: 0.01}
    cluster:
      gpuUtilization: {busy: 0.9, noise: 0.05}
      podDisruptionBudgets: [{name: web, namespace: default, selector: {app: web}, maxUnavailable: 1}]
    workload:                    # one source or a list of sources
      - source: burst
        count: 64
        shape: {cpu: 4, memory: 16Gi, gpus: 1}
        runtime: 2h
    policy:                      # passed to the controller factory as its config (the controller validates it)
      name: gpuscale
      reconcileInterval: 10s     # simulator: least time between reconciles caused by changes (default 10s)
      settle: 2m                 # simulator: only for controllers without next_wakeup()

Workload sources: ``openb`` (``file``, ``start``, ``end``, ``timeScale``, ``gpuModels``, ``modelMap``, ``limit``),
``alibaba2025`` (``file``, ``includeCpuOnly``, ``windowEnd``, ``timeScale``, ``limit``), ``steady``
(``ratePerHour``, ``duration``, ``start``, ``runtime``, ``shapes``), ``diurnal`` (``peakPerHour``,
``troughPerHour``, ``duration``, ``start``, ``period``, ``peakAt``, ``runtime``, ``shapes``), ``burst`` (``count``,
``at``, ``spread``, ``runtime``, ``shape``) and ``gangs`` (``ratePerHour``, ``duration``, ``start``, ``sizes``,
``runtime``, ``shape``). Runtimes are distributions like the cloud latencies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscale.catalogs import load_catalog
from gpuscale.controller.backend import PodDisruptionBudget
from gpuscale.controller.loop import ControllerConfig
from gpuscale.core.model import CapacityType, Catalog, NodePool, Toleration
from gpuscale.core.scoring import SCORERS
from gpuscale.errors import InputError
from gpuscale.inputs import read_text
from gpuscale.manifests.fields import toleration
from gpuscale.manifests.pools import read_pool
from gpuscale.manifests.problems import Doc, ManifestError, did_you_mean
from gpuscale.manifests.quantity import cpu_milli, memory_mib
from gpuscale.sim.cloud import ApiRateLimit, CapacityRule, CloudBehaviour, Faults, TypeLatencies
from gpuscale.sim.cluster import ClusterBehaviour
from gpuscale.sim.engine import Dist
from gpuscale.sim.profiles import PROFILES, CloudProfile, profile_of_catalog, retarget_pools
from gpuscale.sim.scenario_fields import FieldReader as _V
from gpuscale.sim.scenario_fields import load_yaml_lines
from gpuscale.sim.workloads import (
    Arrival,
    PodShape,
    alibaba2025_arrivals,
    alibaba2025_file,
    burst,
    diurnal,
    gangs,
    openb_arrivals,
    openb_file,
    steady,
)

TOP_FIELDS = (
    "name", "description", "seed", "duration", "catalog", "pools", "cloud", "cluster", "workload", "policy",
    "inference", "gprs",
)  # fmt: skip
CLOUD_FIELDS = (
    "provider",
    "launchLatency",
    "registrationLatency",
    "devicePluginDelay",
    "deletionLatency",
    "instanceTypes",
    "capacity",
    "iceProbability",
    "quotaNodes",
    "spotInterruptionsPerHour",
    "spotNotice",
    "spotProtection",
    "apiRateLimit",
    "faults",
    "launchFailureRate",
    "gpuInitFailureRate",
    "maxNodesPerLaunch",
)
TYPE_LATENCY_FIELDS = ("launchLatency", "registrationLatency", "devicePluginDelay")
CAPACITY_FIELDS = ("instanceType", "zone", "capacityType", "maxNodes", "from", "until")
RATE_FIELDS = ("burst", "perSecond")
FAULT_FIELDS = ("rateLimited", "serverError", "timeout", "timeoutTookEffect", "retryAfter")
CLUSTER_FIELDS = ("scorer", "gpuUtilization", "podDisruptionBudgets", "recordPodEvents")
UTIL_FIELDS = ("busy", "noise")
PDB_FIELDS = ("name", "namespace", "selector", "maxUnavailable")
SHAPE_FIELDS = (
    "cpu",
    "memory",
    "gpus",
    "gpuMilli",
    "weight",
    "gpuModels",
    "nodeSelector",
    "tolerations",
    "priority",
    "labels",
    "annotations",
    "gpuUtilization",
)
SOURCE_FIELDS: dict[str, tuple[str, ...]] = {
    "openb": ("file", "start", "end", "timeScale", "gpuModels", "modelMap", "limit"),
    "alibaba2025": ("file", "includeCpuOnly", "windowEnd", "timeScale", "limit"),
    "steady": ("ratePerHour", "duration", "start", "runtime", "shapes", "prefix", "namespace"),
    "diurnal": (
        "peakPerHour", "troughPerHour", "duration", "start", "period", "peakAt", "runtime", "shapes", "prefix",
        "namespace",
    ),
    "burst": ("count", "at", "spread", "runtime", "shape", "prefix", "namespace"),
    "gangs": ("ratePerHour", "duration", "start", "sizes", "runtime", "shape", "prefix", "namespace"),
}  # fmt: skip

MAX_ARRIVALS = 1_000_000
"""Most pods (or GPRs) a workload source may be expected to generate (rate x duration)."""
MAX_PATH_CHARS = 1024


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One validated workload source: ``build(seed)`` returns its arrivals."""

    source: str
    build: Callable[[int], list[Arrival]]


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (see the module docstring)."""

    name: str
    seed: int
    catalog: Catalog
    pools: tuple[NodePool, ...]
    cloud: CloudBehaviour = field(default_factory=CloudBehaviour)
    cluster: ClusterBehaviour = field(default_factory=ClusterBehaviour)
    pdbs: tuple[PodDisruptionBudget, ...] = ()
    workload: tuple[WorkloadSpec, ...] = ()
    policy: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    source: str = "<scenario>"
    description: str = ""
    reconcile_interval_s: float = 10.0
    """``policy.reconcileInterval``: minimum time between reconciles caused by changes."""
    settle_s: float | None = None
    """``policy.settle``: for controllers without timers, how long to keep reconciling after a change."""
    inference: Any = None
    """The ``inference`` section (:class:`gpuscale.sim.inference.InferenceSpec`): models scaled by their scalers."""
    provider: str | None = None
    """The provider profile (``cloud.provider``, or the one ``compare --providers`` ran it on); None: none."""
    gprs: tuple[Any, ...] = ()
    """The ``gprs`` section (:class:`gpuscale.sim.gpr.mixed.GprArrival`): GPRs submitted beside the pods."""

    def arrivals(self) -> list[Arrival]:
        """Every arrival of every workload source, merged in time order (pod keys must be unique)."""
        out: list[Arrival] = []
        for spec in self.workload:
            out.extend(spec.build(self.seed))
        out.sort(key=lambda a: (a.at, a.pod.namespace, a.pod.name))
        seen: set[str] = set()
        for a in out:
            if a.pod.key in seen:
                raise InputError(
                    "two workload sources produce the same pod",
                    where=f"{self.source} workload",
                    value=a.pod.key,
                    fix="give the sources different `prefix` or `namespace` values",
                )
            seen.add(a.pod.key)
        return out


# ---------------------------------------------------------------------------------------------------- readers
def load_scenario(
    path: str | Path, *, catalog: Catalog | None = None, provider: CloudProfile | None = None
) -> Scenario:
    """Read and validate a scenario file. ``catalog`` overrides the file's ``catalog`` (tests, CLI flags);
    ``provider`` runs it on that provider profile (see :func:`parse_scenario`)."""
    p = Path(path)
    text = read_text(p, what="scenario file")
    return parse_scenario(text, source=str(p), base_dir=p.parent, catalog=catalog, provider=provider)


def parse_scenario(
    text: str,
    *,
    source: str = "<scenario>",
    base_dir: Path | None = None,
    catalog: Catalog | None = None,
    provider: CloudProfile | None = None,
) -> Scenario:
    """Validate scenario YAML text; relative paths resolve against ``base_dir`` (default: the current directory).

    ``provider`` runs the scenario on that profile. When it is the scenario's own provider (``cloud.provider``, else
    the one its catalog is from) nothing else changes. Otherwise the scenario's ``cloud`` section and its pools'
    ``instanceTypes`` and ``zones`` (names of the other provider) are dropped, and the catalog is the profile's."""
    data, lines = load_yaml_lines(text, source)
    v = _V(source, lines)
    base = base_dir or Path.cwd()
    top = v.mapping(data, "", TOP_FIELDS)
    if data is None:
        raise v.fail("", "the scenario is empty", fix="see `gpuscale simulate --help` for the format")
    seed = v.integer(top.get("seed", 0), "seed", maximum=2**63 - 1)
    duration = v.duration(top["duration"], "duration") if top.get("duration") is not None else None
    cloud_raw, pools_raw = top.get("cloud"), top.get("pools")
    own = home = _own_profile(v, cloud_raw)
    if provider is not None and own is None and catalog is None and top.get("catalog") is not None:
        home = profile_of_catalog({it.provider for it in _catalog(v, top["catalog"], base).instance_types})
    if provider is not None and provider != home:
        cloud_raw, pools_raw = None, retarget_pools(v.listing(pools_raw, "pools"))
        catalog, own = catalog or _catalog(v, provider.catalog, base), provider
    if catalog is None:
        catalog = _catalog(v, own.catalog if own and top.get("catalog") is None else top.get("catalog"), base)
    pools_raw, pool_headroom = _split_headroom(v, pools_raw)
    pools = _pools(v, pools_raw, catalog, source)
    cloud = _cloud(v, cloud_raw, catalog, own.behaviour if own is not None else CloudBehaviour())
    cluster, pdbs = _cluster(v, top.get("cluster"))
    inference = None
    if top.get("inference") is not None:  # inference models and their scalers (gpuscale.sim.inference)
        from gpuscale.sim.inference import parse_inference

        inference = parse_inference(v, top["inference"], base)
    workload = () if inference is not None and top.get("workload") is None else _workloads(v, top.get("workload"), base)
    gprs: tuple[Any, ...] = ()
    if top.get("gprs") is not None:  # GPU Provisioning Requests beside the pods (gpuscale.sim.gpr.mixed)
        from gpuscale.sim.gpr.mixed import parse_gprs

        gprs = parse_gprs(v, top["gprs"], catalog)
    policy = v.mapping(top.get("policy"), "policy", _AnyKeys())
    interval = v.duration(policy.get("reconcileInterval", 10.0), "policy.reconcileInterval")
    if interval <= 0:
        raise v.fail("policy.reconcileInterval", "must be positive", policy.get("reconcileInterval"))
    settle = v.duration(policy["settle"], "policy.settle") if policy.get("settle") is not None else None
    policy = _merge_headroom(v, policy, pool_headroom, {p.name for p in pools})
    try:  # every policy runs the gpuscale controller loop: its settings are checked here, with the file's lines
        ControllerConfig.from_policy(policy)
    except InputError as exc:
        raise v.fail(exc.where or "policy", exc.reason, exc.value, exc.fix) from None
    return Scenario(
        name=v.string(top.get("name"), "name") or Path(source).stem,
        seed=seed,
        catalog=catalog,
        pools=pools,
        cloud=cloud,
        cluster=cluster,
        pdbs=pdbs,
        workload=workload,
        policy=dict(policy),
        duration_s=duration,
        source=source,
        description=v.string(top.get("description"), "description"),
        reconcile_interval_s=interval,
        settle_s=settle,
        inference=inference,
        provider=getattr(own or home, "name", None),
        gprs=gprs,
    )


def _split_headroom(v: _V, raw: object) -> tuple[object, dict[str, Any]]:
    """The pools without their ``headroom`` key (gpuscale's predictive warm headroom, an option of the simulated
    controller), and each pool's checked headroom setting by pool name."""
    if not isinstance(raw, list) or not any(isinstance(i, dict) and "headroom" in i for i in raw):
        return raw, {}
    from gpuscale.controller.policyopts import headroom_spec

    out: list[object] = []
    found: dict[str, Any] = {}
    for i, item in enumerate(raw):
        if isinstance(item, dict) and "headroom" in item:
            item = dict(item)
            value = item.pop("headroom")
            path = f"pools[{i}].headroom"
            try:
                headroom_spec(value, path)
            except InputError as exc:
                raise v.fail(exc.where or path, exc.reason, exc.value, exc.fix) from None
            name = item.get("name") or (item.get("metadata") or {}).get("name")
            found[str(name)] = value
        out.append(item)
    return out, found


def _merge_headroom(v: _V, policy: dict[str, Any], from_pools: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """``policy`` with the pools' ``headroom`` settings in ``policy.headroom``; a pool named there must exist."""
    given = policy.get("headroom")
    if isinstance(given, Mapping):
        for name in given:
            if name not in names:
                known = ", ".join(sorted(names))
                raise v.fail(f"policy.headroom.{name}", "no such pool", name, fix=f"use one of {known}")
    if not from_pools:
        return policy
    merged = dict(given) if isinstance(given, Mapping) else {}
    merged.update(from_pools)
    return {**policy, "headroom": merged}


def _own_profile(v: _V, raw: object) -> CloudProfile | None:
    """The profile named by ``cloud.provider`` (None without one)."""
    name = raw.get("provider") if isinstance(raw, dict) else None
    if name is None:
        return None
    if not isinstance(name, str) or name not in PROFILES:
        raise v.fail("cloud.provider", "unknown provider profile", name, f"use one of {', '.join(PROFILES)}")
    return PROFILES[name]


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or a NUL
        return False


def _expected(v: _V, path: str, rate_per_hour: float, duration_s: float, per_arrival: int = 1) -> None:
    """Refuse a source expected to generate more than :data:`MAX_ARRIVALS` pods."""
    expected = rate_per_hour * duration_s / 3600 * per_arrival
    if expected > MAX_ARRIVALS:
        raise v.fail(
            path, f"would generate about {expected:,.0f} pods (at most {MAX_ARRIVALS:,})",
            fix="lower the rate or the duration",
        )  # fmt: skip


class _AnyKeys(tuple[str, ...]):
    """Accepts every key (policy settings are validated by the controller)."""

    def __contains__(self, key: object) -> bool:
        return True


def _catalog(v: _V, raw: object, base: Path) -> Catalog:
    name = v.string(raw, "catalog", required=True, max_len=MAX_PATH_CHARS)
    candidate = base / name
    target = str(candidate) if (name.endswith((".yaml", ".yml")) and _is_file(candidate)) else name
    try:
        return load_catalog(target)
    except InputError as exc:
        raise v.fail("catalog", str(exc), name) from exc


def _pools(v: _V, raw: object, catalog: Catalog, source: str) -> tuple[NodePool, ...]:
    items = v.listing(raw, "pools")
    if not items:
        raise v.fail("pools", "at least one pool is required", fix="add a pool with `name` and `instanceTypes`")
    types = catalog.by_name()
    zones = frozenset(o.zone for it in catalog.instance_types for o in it.offerings)
    problems: list[InputError] = []
    pools: list[NodePool] = []
    for i, item in enumerate(items):
        path = f"pools[{i}]"
        if not isinstance(item, dict):
            raise v.fail(path, "must be a mapping", item)
        if "spec" in item or "metadata" in item:
            obj = dict(item)
        else:
            rest = {k: val for k, val in item.items() if k != "name"}
            obj = {"metadata": {"name": item.get("name")}, "spec": rest}
        doc = Doc(source=source, index=1, line=v.lines.get(path), problems=problems, item=i, kind="GPUNodePool")
        pool = read_pool(doc, obj, types, zones)
        if pool is not None:
            pools.append(pool)
    if problems:
        raise ManifestError(source, problems)
    names = [p.name for p in pools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise v.fail("pools", "pool names must be unique", dup)
    return tuple(pools)


def _cloud(v: _V, raw: object, catalog: Catalog, defaults: CloudBehaviour | None = None) -> CloudBehaviour:
    """The ``cloud`` section over ``defaults`` (default: its ``provider``'s profile, else the simulator's defaults)."""
    m = v.mapping(raw, "cloud", CLOUD_FIELDS)
    if defaults is None:
        own = _own_profile(v, raw)
        defaults = own.behaviour if own is not None else CloudBehaviour()
    types = catalog.by_name()

    def d(key: str, default: Dist) -> Dist:
        return v.dist(m[key], f"cloud.{key}") if m.get(key) is not None else default

    per_type: dict[str, TypeLatencies] = {}
    for name, spec in v.mapping(m.get("instanceTypes"), "cloud.instanceTypes", _AnyKeys()).items():
        path = f"cloud.instanceTypes.{name}"
        if name not in types:
            raise v.fail(path, "is not an instance type of the catalog", name, did_you_mean(str(name), types))
        t = v.mapping(spec, path, TYPE_LATENCY_FIELDS)
        per_type[name] = TypeLatencies(
            *(v.dist(t[k], f"{path}.{k}") if t.get(k) is not None else None for k in TYPE_LATENCY_FIELDS)
        )
    rules: list[CapacityRule] = []
    for i, r in enumerate(v.listing(m.get("capacity"), "cloud.capacity")):
        path = f"cloud.capacity[{i}]"
        c = v.mapping(r, path, CAPACITY_FIELDS)
        if "maxNodes" not in c:
            raise v.fail(f"{path}.maxNodes", "is required")
        it = v.string(c.get("instanceType"), f"{path}.instanceType") or None
        if it is not None and it not in types:
            raise v.fail(f"{path}.instanceType", "is not an instance type of the catalog", it, did_you_mean(it, types))
        ct = c.get("capacityType")
        if ct is not None and ct not in [str(x) for x in CapacityType]:
            raise v.fail(f"{path}.capacityType", "is not a capacity type", ct, "use on-demand or spot")
        start = v.duration(c["from"], f"{path}.from") if c.get("from") is not None else 0.0
        end = v.duration(c["until"], f"{path}.until") if c.get("until") is not None else math.inf
        rules.append(
            CapacityRule(
                v.integer(c["maxNodes"], f"{path}.maxNodes"),
                it,
                v.string(c.get("zone"), f"{path}.zone") or None,
                CapacityType(ct) if ct is not None else None,
                start,
                end,
            )
        )
    f = v.mapping(m.get("faults"), "cloud.faults", FAULT_FIELDS)
    probs = {k: v.probability(f[k], f"cloud.faults.{k}") for k in ("rateLimited", "serverError", "timeout") if k in f}
    if sum(probs.values()) > 1:
        raise v.fail("cloud.faults", "rateLimited + serverError + timeout must be at most 1", probs)
    faults = Faults(
        rate_limited=probs.get("rateLimited", 0.0),
        server_error=probs.get("serverError", 0.0),
        timeout=probs.get("timeout", 0.0),
        timeout_took_effect=v.probability(f.get("timeoutTookEffect", 0.5), "cloud.faults.timeoutTookEffect"),
        retry_after_s=v.duration(f.get("retryAfter", 1.0), "cloud.faults.retryAfter"),
    )
    api_rate = defaults.api_rate
    if m.get("apiRateLimit") is not None:
        r = v.mapping(m["apiRateLimit"], "cloud.apiRateLimit", RATE_FIELDS)
        if set(r) != set(RATE_FIELDS):
            raise v.fail("cloud.apiRateLimit", "needs burst and perSecond", r, "e.g. {burst: 20, perSecond: 0.5}")
        api_rate = ApiRateLimit(
            v.number(r["burst"], "cloud.apiRateLimit.burst", minimum=1.0),
            v.number(r["perSecond"], "cloud.apiRateLimit.perSecond"),
        )
    quota = m.get("quotaNodes", defaults.quota_nodes)

    def num(key: str, default: float) -> float:
        return v.number(m.get(key, default), f"cloud.{key}")

    def prob(key: str, default: float) -> float:
        return v.probability(m.get(key, default), f"cloud.{key}")

    def dur(key: str, default: float) -> float:
        return v.duration(m.get(key, default), f"cloud.{key}")

    return CloudBehaviour(
        launch_latency=d("launchLatency", defaults.launch_latency),
        registration_latency=d("registrationLatency", defaults.registration_latency),
        device_plugin_delay=d("devicePluginDelay", defaults.device_plugin_delay),
        deletion_latency=d("deletionLatency", defaults.deletion_latency),
        per_type=per_type if "instanceTypes" in m else defaults.per_type,
        capacity=tuple(rules) if "capacity" in m else defaults.capacity,
        ice_probability=prob("iceProbability", defaults.ice_probability),
        quota_nodes=v.integer(quota, "cloud.quotaNodes") if quota is not None else None,
        spot_interruptions_per_hour=num("spotInterruptionsPerHour", defaults.spot_interruptions_per_hour),
        spot_notice_s=dur("spotNotice", defaults.spot_notice_s),
        spot_protection_s=dur("spotProtection", defaults.spot_protection_s),
        faults=faults if "faults" in m else defaults.faults,
        launch_failure_rate=prob("launchFailureRate", defaults.launch_failure_rate),
        gpu_init_failure_rate=prob("gpuInitFailureRate", defaults.gpu_init_failure_rate),
        max_nodes_per_launch=v.integer(
            m.get("maxNodesPerLaunch", defaults.max_nodes_per_launch), "cloud.maxNodesPerLaunch", minimum=1
        ),
        api_rate=api_rate,
    )


def _cluster(v: _V, raw: object) -> tuple[ClusterBehaviour, tuple[PodDisruptionBudget, ...]]:
    m = v.mapping(raw, "cluster", CLUSTER_FIELDS)
    scorer = m.get("scorer", "best-fit")
    if not isinstance(scorer, str) or scorer not in SCORERS:
        raise v.fail("cluster.scorer", "unknown scorer", scorer, did_you_mean(str(scorer), SCORERS))
    u = v.mapping(m.get("gpuUtilization"), "cluster.gpuUtilization", UTIL_FIELDS)
    pdbs: list[PodDisruptionBudget] = []
    for i, r in enumerate(v.listing(m.get("podDisruptionBudgets"), "cluster.podDisruptionBudgets")):
        path = f"cluster.podDisruptionBudgets[{i}]"
        p = v.mapping(r, path, PDB_FIELDS)
        pdbs.append(
            PodDisruptionBudget(
                name=v.string(p.get("name"), f"{path}.name", required=True),
                namespace=v.string(p.get("namespace", "default"), f"{path}.namespace", required=True),
                selector=_str_map(v, p.get("selector"), f"{path}.selector"),
                max_unavailable=v.integer(p.get("maxUnavailable", 0), f"{path}.maxUnavailable"),
            )
        )
    behaviour = ClusterBehaviour(
        scorer=scorer,
        busy=v.probability(u.get("busy", 1.0), "cluster.gpuUtilization.busy"),
        utilization_noise=v.number(u.get("noise", 0.0), "cluster.gpuUtilization.noise", maximum=1.0),
        record_pod_events=v.boolean(m.get("recordPodEvents", False), "cluster.recordPodEvents"),
    )
    return behaviour, tuple(pdbs)


def _str_map(v: _V, raw: object, path: str) -> dict[str, str]:
    m = v.mapping(raw, path, _AnyKeys())
    return {v.string(k, f"{path} key", required=True): v.string(val, f"{path}.{k}") for k, val in m.items()}


def _shape(v: _V, raw: object, path: str) -> PodShape:
    m = v.mapping(raw, path, SHAPE_FIELDS)
    gpus = v.integer(m.get("gpus", 0), f"{path}.gpus")
    milli = v.integer(m.get("gpuMilli", 0), f"{path}.gpuMilli")
    if milli >= 1000:
        raise v.fail(
            f"{path}.gpuMilli", "must be below 1000 (a fraction of one GPU)", milli, "ask for whole gpus instead"
        )
    if gpus and milli:
        raise v.fail(path, "set gpus or gpuMilli, not both", {"gpus": gpus, "gpuMilli": milli})
    models = tuple(
        v.string(x, f"{path}.gpuModels[{i}]", required=True)
        for i, x in enumerate(v.listing(m.get("gpuModels"), f"{path}.gpuModels"))
    )
    tols: list[Toleration] = []
    problems: list[InputError] = []
    doc = Doc(source=v.source, index=1, line=v.lines.get(path), problems=problems)
    for i, t in enumerate(v.listing(m.get("tolerations"), f"{path}.tolerations")):
        tol = toleration(doc, t, f"{path}.tolerations[{i}]")
        if tol is not None:
            tols.append(tol)
    if problems:
        raise problems[0]
    util = m.get("gpuUtilization")
    return PodShape(
        cpu_milli=v.quantity(m.get("cpu", 1), f"{path}.cpu", cpu_milli),
        memory_mib=v.quantity(m.get("memory", "4Gi"), f"{path}.memory", memory_mib),
        gpus=gpus,
        gpu_milli=milli,
        weight=v.number(m.get("weight", 1.0), f"{path}.weight"),
        gpu_models=frozenset(models) if models else None,
        node_selector=_str_map(v, m.get("nodeSelector"), f"{path}.nodeSelector"),
        tolerations=tuple(tols),
        priority=v.integer(m.get("priority", 0), f"{path}.priority", minimum=-(2**31), maximum=2**31 - 1),
        labels=_str_map(v, m.get("labels"), f"{path}.labels"),
        annotations=_str_map(v, m.get("annotations"), f"{path}.annotations"),
        gpu_util=v.probability(util, f"{path}.gpuUtilization") if util is not None else None,
    )


def _file(v: _V, raw: object, path: str, base: Path, default: Path, kind: str) -> Path:
    if raw is None:
        return default
    text = v.string(raw, path, required=True, max_len=MAX_PATH_CHARS)
    if kind == "openb" and text.startswith("openb:"):
        return openb_file(text.partition(":")[2])
    p = Path(text)
    p = p if p.is_absolute() else base / p
    if not _is_file(p):
        raise v.fail(path, "file not found", str(p), "give a path relative to the scenario file")
    return p


def _workloads(v: _V, raw: object, base: Path) -> tuple[WorkloadSpec, ...]:
    items = [raw] if isinstance(raw, dict) else v.listing(raw, "workload")
    if not items:
        raise v.fail("workload", "a workload is required", fix=f"add a source: one of {', '.join(SOURCE_FIELDS)}")
    single = len(items) == 1
    specs = []
    for i, item in enumerate(items):
        path = "workload" if isinstance(raw, dict) else f"workload[{i}]"
        if not isinstance(item, dict):
            raise v.fail(path, "must be a mapping", item)
        kind = item.get("source")
        if not isinstance(kind, str) or kind not in SOURCE_FIELDS:
            raise v.fail(
                f"{path}.source", "unknown or missing workload source", kind, did_you_mean(str(kind), SOURCE_FIELDS)
            )
        m = v.mapping(item, path, ("source", *SOURCE_FIELDS[kind]))
        specs.append(_workload(v, kind, m, path, base, kind if single else f"{kind}{i}"))
    return tuple(specs)


def _workload(v: _V, kind: str, m: dict[str, Any], path: str, base: Path, prefix_default: str) -> WorkloadSpec:
    def dur(key: str, default: float | None = None) -> float:
        if m.get(key) is None:
            if default is None:
                raise v.fail(f"{path}.{key}", "is required")
            return default
        return v.duration(m[key], f"{path}.{key}")

    def runtime(default: Dist) -> Dist:
        return v.dist(m["runtime"], f"{path}.runtime") if m.get("runtime") is not None else default

    def limit() -> int | None:
        return v.integer(m["limit"], f"{path}.limit") if m.get("limit") is not None else None

    scale = v.number(m.get("timeScale", 1.0), f"{path}.timeScale", minimum=1e-9)
    prefix = v.string(m.get("prefix"), f"{path}.prefix") or prefix_default
    ns = v.string(m.get("namespace"), f"{path}.namespace") or "default"
    if kind == "openb":
        f = _file(v, m.get("file"), f"{path}.file", base, openb_file(), kind)
        mode = m.get("gpuModels", "keep")
        if mode not in ("keep", "ignore"):
            raise v.fail(f"{path}.gpuModels", "must be keep or ignore", mode)
        mm = _str_map(v, m.get("modelMap"), f"{path}.modelMap")
        start, end = dur("start", 0.0), (dur("end") if m.get("end") is not None else None)
        lim = limit()
        return WorkloadSpec(
            kind,
            lambda seed: openb_arrivals(
                f, start=start, end=end, time_scale=scale, gpu_models=mode, model_map=mm, limit=lim
            ),
        )
    if kind == "alibaba2025":
        f = _file(v, m.get("file"), f"{path}.file", base, alibaba2025_file(), kind)
        cpu = v.boolean(m.get("includeCpuOnly", False), f"{path}.includeCpuOnly")
        wend = dur("windowEnd") if m.get("windowEnd") is not None else None
        lim = limit()
        return WorkloadSpec(
            kind,
            lambda seed: alibaba2025_arrivals(f, include_cpu_only=cpu, window_end=wend, time_scale=scale, limit=lim),
        )
    if kind in ("steady", "diurnal"):
        shapes_raw = v.listing(m.get("shapes"), f"{path}.shapes")
        shapes = tuple(_shape(v, s, f"{path}.shapes[{j}]") for j, s in enumerate(shapes_raw)) or (PodShape(gpus=1),)
        run = runtime(Dist("exponential", 3600.0))
        duration, start = dur("duration"), dur("start", 0.0)
        if kind == "steady":
            rate = v.number(m.get("ratePerHour"), f"{path}.ratePerHour")
            _expected(v, f"{path}.ratePerHour", rate, duration)
            return WorkloadSpec(
                kind,
                lambda seed: steady(rate, duration, shapes, run, seed=seed, start=start, prefix=prefix, namespace=ns),
            )
        peak = v.number(m.get("peakPerHour"), f"{path}.peakPerHour")
        trough = v.number(m.get("troughPerHour", 0.0), f"{path}.troughPerHour")
        _expected(v, f"{path}.peakPerHour", max(peak, trough), duration)
        period, peak_at = dur("period", 86400.0), dur("peakAt", 14 * 3600.0)
        return WorkloadSpec(
            kind,
            lambda seed: diurnal(
                peak, trough, duration, shapes, run, seed=seed, start=start, period_s=period, peak_at_s=peak_at,
                prefix=prefix, namespace=ns,
            ),
        )  # fmt: skip
    shape = _shape(v, m.get("shape"), f"{path}.shape") if m.get("shape") is not None else PodShape(gpus=1)
    if kind == "burst":
        count = v.integer(m.get("count"), f"{path}.count")
        at, spread = dur("at", 0.0), dur("spread", 0.0)
        run = runtime(Dist.const(3600.0))
        return WorkloadSpec(
            kind,
            lambda seed: burst(count, at, shape, run, seed=seed, spread_s=spread, prefix=prefix, namespace=ns),
        )
    rate = v.number(m.get("ratePerHour"), f"{path}.ratePerHour")
    sizes = tuple(
        v.integer(s, f"{path}.sizes[{j}]", minimum=1) for j, s in enumerate(v.listing(m.get("sizes"), f"{path}.sizes"))
    ) or (2, 4, 8)
    duration, start = dur("duration"), dur("start", 0.0)
    _expected(v, f"{path}.ratePerHour", rate, duration, max(sizes))
    run = runtime(Dist("exponential", 7200.0))
    return WorkloadSpec(
        kind,
        lambda seed: gangs(rate, duration, sizes, shape, run, seed=seed, start=start, prefix=prefix, namespace=ns),
    )
