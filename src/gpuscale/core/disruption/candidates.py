"""Which nodes are disruption candidates and why: drift, emptiness, under-utilisation, do-not-disrupt pods."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import attrgetter

from gpuscale.core import labels as L
from gpuscale.core.disruption.values import Candidate, DisruptionReason, FreeRoom
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    ConsolidationPolicy,
    Node,
    NodePool,
    Pod,
)
from gpuscale.core.resources import MILLI_PER_GPU

# Enum members and their strings read per node judged, as module constants (an Enum class attribute is a slow read
# in Python 3.11)
_SPOT = CapacityType.SPOT
_ON_DEMAND_STR = str(CapacityType.ON_DEMAND)
_DRIFTED = DisruptionReason.DRIFTED
_EMPTY = DisruptionReason.EMPTY
_UNDERUTILIZED = DisruptionReason.UNDERUTILIZED
_EMPTY_OR_UNDERUTILIZED = ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED
_LIVE_PHASES = ("Pending", "Running", "")
"""The phases :func:`is_live` accepts."""
_SORT_KEY = attrgetter("sort_key")
"""A candidate's :attr:`~gpuscale.core.disruption.values.Candidate.sort_key` (no lambda frame per candidate)."""

SPOT_FALLBACK_LABEL = "gpuscale.io/spot-fallback"
"""Set to ``"true"`` on an on-demand node launched because spot capacity was unavailable (it drifts back to spot)."""


def is_spot_fallback(node: Node, pool: NodePool) -> bool:
    """True for an on-demand node launched as a spot fallback in a pool that wants spot."""
    return (
        node.labels.get(SPOT_FALLBACK_LABEL) == "true"
        and node.labels.get(L.CAPACITY_TYPE) == _ON_DEMAND_STR
        and _SPOT in pool.capacity_types
    )


def conforms(node: Node, pool: NodePool) -> str | None:
    """None if the node still matches its pool's spec, else a sentence naming what drifted."""
    labels = node.labels
    if (  # (is_spot_fallback, inlined: every node judged)
        labels.get(SPOT_FALLBACK_LABEL) == "true"
        and labels.get(L.CAPACITY_TYPE) == _ON_DEMAND_STR
        and _SPOT in pool.capacity_types
    ):
        return f"on-demand node launched as a spot fallback; pool {pool.name} prefers spot"
    it = labels.get(L.INSTANCE_TYPE)
    if pool.instance_types and it is not None and it not in pool.instance_types:
        return f"instance type {it} is no longer allowed by pool {pool.name}"
    zone = node.labels.get(L.ZONE)
    if pool.zones and zone is not None and zone not in pool.zones:
        return f"zone {zone} is no longer allowed by pool {pool.name}"
    ct = node.labels.get(L.CAPACITY_TYPE)
    if pool.capacity_types and ct is not None and ct not in pool.capacity_types:  # (a StrEnum equals its value)
        return f"capacity type {ct} is not one of pool {pool.name}'s ({', '.join(map(str, pool.capacity_types))})"
    return None


def node_price(node: Node, catalog: Catalog) -> float:
    """$/h of a node: from the catalog offering its labels name, else the node's own ``hourly_cost``."""
    it = catalog.by_name().get(node.labels.get(L.INSTANCE_TYPE, ""))
    if it is not None:
        zone, ct = node.labels.get(L.ZONE), node.labels.get(L.CAPACITY_TYPE)
        for off in it.offerings:
            if off.zone == zone and str(off.capacity_type) == ct:
                return off.hourly_price
    return node.hourly_cost


DO_NOT_DISRUPT_VALUES = frozenset({"true", "True", "TRUE", "1", "yes"})


def do_not_disrupt(pod: Pod) -> bool:
    """True if the pod carries ``gpuscale.io/do-not-disrupt: "true"``."""
    return pod.annotations.get(L.DO_NOT_DISRUPT_ANNOTATION, "") in DO_NOT_DISRUPT_VALUES


def workload_pods(pods: Iterable[Pod]) -> list[Pod]:
    return [p for p in pods if not p.is_daemonset]


def is_live(p: Pod) -> bool:
    return p.phase in ("Pending", "Running") or p.phase == ""


def free_room(node: Node, pods: Iterable[Pod]) -> FreeRoom:
    """Room left on ``node`` by ``pods``' requests (CPU milli, memory MiB, milli-GPU over all GPUs, pod slots)."""
    cpu = mem = gpu = count = 0
    for p in pods:
        cpu += p.request.cpu_milli
        mem += p.request.memory_mib
        gpu += p.request.gpu_demand_milli
        count += 1
    a = node.allocatable
    return FreeRoom(a.cpu_milli - cpu, a.memory_mib - mem, a.gpus * MILLI_PER_GPU - gpu, a.pods - count)


def request_share(node: Node, pods: Sequence[Pod]) -> float:
    """Requested share of the node: GPU share on GPU nodes, else the larger of CPU and memory share."""
    a = node.allocatable
    if a.gpus > 0:
        return sum(p.request.gpu_demand_milli for p in pods) / (a.gpus * MILLI_PER_GPU)
    cpu = sum(p.request.cpu_milli for p in pods) / a.cpu_milli if a.cpu_milli else 0.0
    mem = sum(p.request.memory_mib for p in pods) / a.memory_mib if a.memory_mib else 0.0
    return max(cpu, mem)


def classify(
    node: Node, pool: NodePool, pods: Sequence[Pod], utilization: Mapping[str, float]
) -> tuple[DisruptionReason, str] | None:
    """Why ``node`` (of ``pool``, running the workload ``pods``) is a disruption candidate, with a message, or None."""
    return _judge(node, pool, pods, utilization, True)


def _judge(
    node: Node, pool: NodePool, pods: Sequence[Pod], utilization: Mapping[str, float], explain: bool
) -> tuple[DisruptionReason, str] | None:
    """:func:`classify`; ``explain`` False leaves the message of a node not drifted empty (the same reasons)."""
    drift = conforms(node, pool)
    if drift is not None:
        return _DRIFTED, drift
    if not pods:
        return _EMPTY, "no workload pods"
    if node.allocatable.gpus > 0:
        for p in pods:  # (a loop, not any() over a generator: every node judged)
            if p.request.wants_gpu:
                break
        else:
            return _EMPTY, f"GPU node runs only CPU-only pods ({len(pods)})" if explain else ""
    d = pool.disruption
    if d.consolidation_policy is not _EMPTY_OR_UNDERUTILIZED:
        return None
    share = request_share(node, pods)
    if share >= d.utilization_threshold:
        return None
    msg = f"requests use {share:.0%} of the node (threshold {d.utilization_threshold:.0%})" if explain else ""
    if d.use_measured_gpu_utilization and node.allocatable.gpus > 0 and node.name in utilization:
        measured = utilization[node.name]
        if measured >= d.utilization_threshold:
            return None
        if explain:
            msg += f", measured GPU utilisation {measured:.0%}"
    return _UNDERUTILIZED, msg


def classify_node(
    node: Node, pool: NodePool, pods: Sequence[Pod], utilization: Mapping[str, float] | None = None
) -> DisruptionReason | None:
    """Why ``node`` (of ``pool``, running ``pods``) is a disruption candidate (empty, drifted, underutilised), or None.

    The cheap first step of :func:`plan_disruption`, which callers use to start ``consolidateAfter`` clocks without
    simulating anything."""
    # no message is formatted (only the reason is read); the live workload pods (is_live and workload_pods) in one pass
    live = [p for p in pods if p.phase in _LIVE_PHASES and not p.is_daemonset]
    cls = _judge(node, pool, live, utilization or {}, False)
    return cls[0] if cls is not None else None


def sort_pods(pods: Iterable[Pod]) -> list[Pod]:
    return sorted(pods, key=lambda p: (-p.request.gpu_demand_milli, -p.request.cpu_milli, -p.request.memory_mib, p.key))


def find_candidates(
    nodes: Iterable[Node],
    pool_by_name: Mapping[str, NodePool],
    by_node: Mapping[str, Sequence[Pod]],
    catalog: Catalog,
    now: float,
    since: Mapping[str, float],
    only: Collection[str] | None,
    utilization: Mapping[str, float],
    cache: dict[str, CandidateMemo] | None = None,
) -> tuple[list[Candidate], dict[str, float]]:
    """The candidates among ``nodes`` (of a pool in ``pool_by_name``; in ``only`` unless None) in the order they are
    considered (:attr:`Candidate.sort_key`), and since when each is one (``since``, else ``now``).

    ``cache`` (kept by the caller between calls; replaced by this call's entries): a node's candidate is reused while
    its node, pool, workload pods and the catalog are the same (pools judging measured utilisation are not cached)."""
    new_since: dict[str, float] = {}
    out: list[Candidate] = []
    fresh: dict[str, CandidateMemo] = {}
    get = cache.get if cache is not None else None
    for n in nodes:
        if only is not None and n.name not in only:
            continue
        pool = pool_by_name.get(n.pool or "")
        if pool is None:
            continue
        wl = [p for p in by_node.get(n.name, ()) if not p.is_daemonset]  # (workload_pods, inlined)
        if get is None or pool.disruption.use_measured_gpu_utilization:
            cand = _candidate(n, pool, wl, catalog, utilization)
        else:
            hit = get(n.name)
            if hit is not None and hit[0] is n and hit[1] is pool and hit[2] is catalog and hit[3] == wl:
                cand = hit[4]
            else:
                cand = _candidate(n, pool, wl, catalog, utilization)
            fresh[n.name] = (n, pool, catalog, wl, cand)
        if cand is not None:
            out.append(cand)
    if len(out) > 1:
        out.sort(key=_SORT_KEY)
    for c in out:  # (in the candidates' order: the same map whatever order ``nodes`` came in)
        name = c.node.name
        if name not in new_since:
            new_since[name] = since.get(name, now)
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return out, new_since


CandidateMemo = tuple[Node, NodePool, Catalog, list[Pod], Candidate | None]
"""A node's candidate (or None) with what it was computed from (:func:`find_candidates`' cache)."""


def _candidate(
    n: Node, pool: NodePool, wl: list[Pod], catalog: Catalog, utilization: Mapping[str, float]
) -> Candidate | None:
    cls = classify(n, pool, wl, utilization)
    if cls is None:
        return None
    reason, msg = cls
    return Candidate(n, pool, reason, msg, wl, request_share(n, wl), node_price(n, catalog))
