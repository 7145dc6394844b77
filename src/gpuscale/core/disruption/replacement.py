"""Replacement search: the offerings a pool may launch now, the cheapest single node for a candidate's pods, and a
cheaper split over several new nodes (the scale-up planner's greedy packing)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuscale.core import labels as L
from gpuscale.core.disruption.candidates import is_spot_fallback, sort_pods
from gpuscale.core.disruption.values import DisruptionReason, PoolOffering, Replacement
from gpuscale.core.memo import Memo
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    Node,
    NodePool,
    OfferingKey,
    Pod,
    PoolLimits,
    Snapshot,
    Taint,
)
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner import plan
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import MILLI_PER_GPU, Resources
from gpuscale.core.state import ABSENT_GPU, best_gpu, fits_room
from gpuscale.core.templates import pool_templates, pool_totals, template_allocatable


def pool_offerings(
    pool: NodePool,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float] | None = None,
    capacity_types: Collection[CapacityType] | None = None,
) -> list[PoolOffering]:
    """The pool's launchable offerings, cheapest first: allowed types, requirements, zones and capacity types,
    available in the catalog and not marked unavailable past ``now``. ``capacity_types`` overrides the pool's.

    Memoised per (pool, catalog) objects, capacity types and the offerings unavailable at ``now``."""
    unavailable = unavailable or {}
    values = (
        tuple(capacity_types) if capacity_types is not None else None,
        frozenset((k, t) for k, t in unavailable.items() if t > now),
    )
    found = _OFFERINGS.get(
        lambda: tuple(_pool_offerings(pool, catalog, now, unavailable, capacity_types)), values, objects=(pool, catalog)
    )
    return list(found)


_OFFERINGS: Memo[tuple[PoolOffering, ...]] = Memo(1024)


def _pool_offerings(
    pool: NodePool,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
    capacity_types: Collection[CapacityType] | None,
) -> list[PoolOffering]:
    cts = set(capacity_types if capacity_types is not None else pool.capacity_types)
    out: list[PoolOffering] = []
    for t in pool_templates(pool, catalog):
        off = t.offering
        if not off.available or (cts and off.capacity_type not in cts):
            continue
        if unavailable and unavailable.get(OfferingKey(t.itype.name, off.zone, off.capacity_type), -math.inf) > now:
            continue
        out.append(PoolOffering(pool, t.itype, off, t.labels, t.alloc))
    out.sort(
        key=lambda po: (po.price, -pool.weight, po.instance_type.name, po.offering.zone, po.offering.capacity_type)
    )
    return out


def fits_one_node(pods: Sequence[Pod], labels: Mapping[str, str], taints: tuple[Taint, ...], alloc: Resources) -> bool:
    if (
        sum(p.request.cpu_milli for p in pods) > alloc.cpu_milli
        or sum(p.request.memory_mib for p in pods) > alloc.memory_mib
        or len(pods) > alloc.pods
        or sum(p.request.gpu_demand_milli for p in pods) > alloc.gpus * MILLI_PER_GPU
    ):
        return False
    if any(static_fit(p, labels, taints) is not None for p in pods):
        return False
    # bind them one by one on a fresh node, as ClusterState.fits_one and place would (plain ints: one row)
    model = labels.get(L.GPU_PRODUCT)
    cpu, mem, slots = alloc.cpu_milli, alloc.memory_mib, alloc.pods
    row = [MILLI_PER_GPU] * alloc.gpus if alloc.gpus > 0 else [ABSENT_GPU]
    full, top = row.count(MILLI_PER_GPU), max(row)
    for p in sort_pods(pods):
        r = p.request
        if not fits_room(r, cpu, mem, slots, full, top, model):
            return False
        cpu -= r.cpu_milli
        mem -= r.memory_mib
        slots -= 1
        if r.gpus:
            for g in [g for g, v in enumerate(row) if v == MILLI_PER_GPU][: r.gpus]:
                row[g] -= MILLI_PER_GPU
        elif r.gpu_milli:
            row[best_gpu(row, r.gpu_milli)] -= r.gpu_milli
        full, top = row.count(MILLI_PER_GPU), max(row)
    return True


def one_node_for(
    pods: Sequence[Pod],
    pool: NodePool,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
    types: Collection[CapacityType],
    ceiling: float = math.inf,
) -> Replacement | None:
    """The cheapest offering of ``pool`` among capacity ``types`` that takes all ``pods`` on one node and costs at
    most ``ceiling`` $/h (None if there is none)."""
    for po in pool_offerings(pool, catalog, now, unavailable, types):
        if po.price > ceiling:
            return None
        if fits_one_node(pods, po.labels, pool.taints, po.allocatable):
            return Replacement(
                pool.name,
                po.instance_type.name,
                po.offering.zone,
                po.offering.capacity_type,
                po.price,
                po.allocatable,
                tuple(p.key for p in sort_pods(pods)),
            )
    return None


@dataclass(slots=True)
class Market:
    """The new nodes a disruption pass may still buy: pools, catalog and offerings unavailable at ``now``, with the
    nodes per pool (launching ones included, for ``maxNodes``) and their raw capacity per pool (for ``limits``, as the
    planner and the launcher count it). Replacements decided in the pass are added."""

    pools: tuple[NodePool, ...]
    catalog: Catalog
    now: float
    unavailable: Mapping[OfferingKey, float]
    nodes: Sequence[Node]
    _totals: tuple[dict[str, int], dict[str, Resources]] | None = None

    def _get(self) -> tuple[dict[str, int], dict[str, Resources]]:
        if self._totals is None:
            self._totals = pool_totals(self.nodes, self.catalog)
        return self._totals

    def counts(self) -> dict[str, int]:
        """Nodes per pool."""
        return self._get()[0]

    def capacity(self) -> dict[str, Resources]:
        """Raw capacity per pool."""
        return self._get()[1]

    def bought(self, r: Replacement) -> None:
        """Count a replacement decided in this pass."""
        counts, capacity = self._get()
        counts[r.pool] = counts.get(r.pool, 0) + 1
        cap = replace(self.catalog.by_name()[r.instance_type].capacity, pods=0)
        capacity[r.pool] = capacity.get(r.pool, Resources(pods=0)) + cap


def split_replacement(
    node: Node, pool: NodePool, pods: Sequence[Pod], ceiling: float, market: Market
) -> tuple[Replacement, ...]:
    """Two or more new nodes for ``pods`` costing less than ``ceiling`` $/h in all, or () (see module docstring).

    The pods are packed by the scale-up planner's greedy packing (no integer program) into the pools' remaining room
    in ``market``; a spot node is not replaced by spot nodes, and a spot-fallback node only by spot nodes.
    """
    pools, catalog, now, unavailable = market.pools, market.catalog, market.now, market.unavailable
    fallback = is_spot_fallback(node, pool)
    no_spot = node.labels.get(L.CAPACITY_TYPE) == str(CapacityType.SPOT)
    room = _pools_with_room(pools, market, fallback, no_spot)
    if not room:
        return ()
    values = (
        tuple((p.key, p.request, tuple(sorted(p.node_selector.items())), p.affinity, p.tolerations) for p in pods),
        frozenset((k, t) for k, t in unavailable.items() if t > now),
    )
    found = _SPLITS.get(lambda: pack_new_nodes(pods, room, catalog, now, unavailable), values, objects=(*room, catalog))
    if len(found) < 2 or sum(r.hourly_price for r in found) >= ceiling - 1e-9:
        return ()
    return found


_SPLITS: Memo[tuple[Replacement, ...]] = Memo(1024)
"""Split packings by (pods and their scheduling shapes, unavailable offerings, pools, catalog)."""


def _pools_with_room(
    pools: Sequence[NodePool],
    market: Market,
    only_spot: bool,
    no_spot: bool,
) -> tuple[NodePool, ...]:
    """The pools as the planner should see them for new nodes: room left under maxNodes (less the market's node
    counts) and limits (less the raw capacity already used), capacity types restricted. Pools needing no change are
    passed as they are (the planner memoises per pool object). The market's totals are counted only for a pool with
    maxNodes or limits."""
    out: list[NodePool] = []
    for p in pools:
        changes: dict[str, Any] = {}
        if p.max_nodes is not None:
            left = p.max_nodes - market.counts().get(p.name, 0)
            if left <= 0:
                continue
            changes["max_nodes"] = left
        lim = p.limits
        if p.limits.bounded:
            used = market.capacity().get(p.name, Resources(pods=0))
            changes["limits"] = PoolLimits(
                None if lim.cpu_milli is None else lim.cpu_milli - used.cpu_milli,
                None if lim.memory_mib is None else lim.memory_mib - used.memory_mib,
                None if lim.gpus is None else lim.gpus - used.gpus,
            )
        if only_spot or no_spot:
            types = p.capacity_types or tuple(CapacityType)
            types = tuple(t for t in types if (t is CapacityType.SPOT) == only_spot) if only_spot else types
            types = tuple(t for t in types if t is not CapacityType.SPOT) if no_spot else types
            if not types:
                continue
            changes["capacity_types"] = types
        out.append(_derived(p, changes) if changes else p)
    return tuple(out)


def _derived(pool: NodePool, changes: dict[str, Any]) -> NodePool:
    """``replace(pool, **changes)``, the same object for the same changes (so the planner's per-pool memos hold)."""
    return _DERIVED.get(lambda: replace(pool, **changes), tuple(sorted(changes.items())), objects=(pool,))


_DERIVED: Memo[NodePool] = Memo(1024)


def pack_new_nodes(
    pods: Sequence[Pod],
    pools: tuple[NodePool, ...],
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
) -> tuple[Replacement, ...]:
    """The planner's greedy new nodes for ``pods`` (every pod placed), as replacements; () if some pod is left."""

    snap = Snapshot(
        pods=tuple(replace(p, node_name=None, phase="Pending") for p in pods),
        pools=pools,
        catalog=catalog,
        unavailable=unavailable,
    )
    result = plan(snap, PlannerConfig(exact_solver=False), now)
    if result.blocked or len(result.placements) != len(pods):
        return ()
    by_node: dict[str, list[str]] = {}
    for pod_key, where in result.placements.items():
        by_node.setdefault(where, []).append(pod_key)
    launch_of = {launch.id: launch for launch in result.launches}
    pool_of = {p.name: p for p in pools}
    types = catalog.by_name()
    out: list[Replacement] = []
    for where in sorted(by_node):
        launch = launch_of.get(where.rsplit("/", 1)[0])
        if launch is None:
            return ()
        per_node = launch.hourly_cost / launch.count
        alloc = template_allocatable(pool_of[launch.pool], types[launch.instance_type])
        out.append(
            Replacement(
                launch.pool,
                launch.instance_type,
                launch.zone,
                launch.capacity_type,
                per_node,
                alloc,
                tuple(sorted(by_node[where])),
            )
        )
    return tuple(out)


def find_replacement(
    node: Node,
    pool: NodePool,
    reason: DisruptionReason,
    pods: Sequence[Pod],
    price: float,
    market: Market,
) -> Replacement | None:
    """The cheapest single node for ``pods`` (see module docstring), or None."""
    pools, catalog, now, unavailable = market.pools, market.catalog, market.now, market.unavailable
    drifted = reason is DisruptionReason.DRIFTED
    node_is_spot = node.labels.get(L.CAPACITY_TYPE) == str(CapacityType.SPOT)
    only: tuple[CapacityType, ...] | None = (CapacityType.SPOT,) if is_spot_fallback(node, pool) else None
    best: PoolOffering | None = None
    for cand_pool in [pool] if drifted else sorted(pools, key=lambda p: (-p.weight, p.name)):
        if cand_pool.max_nodes is not None and market.counts().get(cand_pool.name, 0) + 1 > cand_pool.max_nodes:
            continue
        limits = cand_pool.limits if cand_pool.limits.bounded else None  # the pool's totals only when it has limits
        for po in pool_offerings(cand_pool, catalog, now, unavailable, only):
            if best is not None and po.price >= best.price:
                break
            if not drifted:
                if po.price >= price:
                    break
                if node_is_spot and po.offering.capacity_type is CapacityType.SPOT:
                    continue
            if limits is not None:
                used = market.capacity().get(cand_pool.name, Resources(pods=0)) + po.instance_type.capacity
                if not limits.allows(used):
                    continue
            if fits_one_node(pods, po.labels, cand_pool.taints, po.allocatable):
                best = po
                break
    if best is None:
        return None
    return Replacement(
        best.pool.name,
        best.instance_type.name,
        best.offering.zone,
        best.offering.capacity_type,
        best.price,
        best.allocatable,
        tuple(p.key for p in sort_pods(pods)),
    )
