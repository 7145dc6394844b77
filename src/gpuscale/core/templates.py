"""What a node launched from a pool would look like: its labels, taints and allocatable capacity."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuscale.core import labels as L
from gpuscale.core.memo import Memo
from gpuscale.core.model import Catalog, InstanceType, Node, NodePool, Offering
from gpuscale.core.predicates import match_requirement
from gpuscale.core.resources import DEFAULT_MAX_PODS, Resources


def template_labels(pool: NodePool, itype: InstanceType, offering: Offering) -> dict[str, str]:
    """Labels a node of ``itype`` bought as ``offering`` in ``pool`` carries (well-known, GPU Feature Discovery, pool).

    Pool labels come first, so the well-known labels always win over a pool label with the same key.
    """
    out = dict(pool.labels)
    out.update(
        {
            L.INSTANCE_TYPE: itype.name,
            L.ZONE: offering.zone,
            L.ARCH: itype.arch,
            L.OS: "linux",
            L.CAPACITY_TYPE: str(offering.capacity_type),
            L.POOL: pool.name,
            L.PROVIDER: itype.provider,
        }
    )
    if itype.region:
        out[L.REGION] = itype.region
    if itype.family:
        out[L.INSTANCE_FAMILY] = itype.family
    if itype.gpu_count and itype.gpu_model:
        out[L.GPU_PRODUCT] = itype.gpu_model
        out[L.GPU_COUNT] = str(itype.gpu_count)
        if itype.gpu_memory_mib:
            out[L.GPU_MEMORY] = str(itype.gpu_memory_mib)
    return out


def template_allocatable(pool: NodePool, itype: InstanceType) -> Resources:
    """Capacity left for workload pods on such a node: the instance's capacity minus the pool's DaemonSet overhead."""
    overhead = pool.daemonset_overhead
    return Resources(
        cpu_milli=max(0, itype.vcpus * 1000 - overhead.cpu_milli),
        memory_mib=max(0, itype.memory_mib - overhead.memory_mib),
        gpus=itype.gpu_count,
        pods=max(0, DEFAULT_MAX_PODS - overhead.pods),
    )


@dataclass(frozen=True, slots=True)
class Template:
    """One offering a pool may use, with the node it yields (whatever its availability or capacity type)."""

    itype: InstanceType
    offering: Offering
    labels: dict[str, str]
    """Shared between callers: read-only."""
    alloc: Resources


def pool_templates(pool: NodePool, catalog: Catalog) -> tuple[Template, ...]:
    """Every offering of the pool's allowed instance types in its zones that meets its requirements, in catalog order.

    Capacity types, availability and prices are left to the caller. Memoised per (pool, catalog) object pair, since
    planners ask for the same pools many times.
    """
    return _TEMPLATES.get(lambda: _pool_templates(pool, catalog), objects=(pool, catalog))


def _pool_templates(pool: NodePool, catalog: Catalog) -> tuple[Template, ...]:
    allowed = set(pool.instance_types)
    out: list[Template] = []
    for it in catalog.instance_types:
        if allowed and it.name not in allowed:
            continue
        alloc = template_allocatable(pool, it)
        for off in it.offerings:
            if pool.zones and off.zone not in pool.zones:
                continue
            labels = template_labels(pool, it, off)
            if all(match_requirement(r, labels) for r in pool.requirements):
                out.append(Template(it, off, labels, alloc))
    return tuple(out)


_TEMPLATES: Memo[tuple[Template, ...]] = Memo(512)


def pool_totals(nodes: Iterable[Node], catalog: Catalog) -> tuple[dict[str, int], dict[str, Resources]]:
    """Per pool: how many of ``nodes`` it has, and their raw capacity (the instance type's when the node's label names
    one in ``catalog``, else its allocatable; pod slots not counted), the unit pool ``limits`` are counted in."""
    types = catalog.by_name()
    counts: dict[str, int] = {}
    sums: dict[str, list[int]] = {}  # cpu milli, memory MiB, GPUs (plain ints: far cheaper than adding Resources)
    raw: dict[str, tuple[int, int, int]] = {}  # per instance type in the catalog
    for n in nodes:
        pool = n.pool
        if pool is None:
            continue
        counts[pool] = counts.get(pool, 0) + 1
        name = n.labels.get(L.INSTANCE_TYPE, "")
        cap = raw.get(name)
        if cap is None:
            it = types.get(name)
            if it is not None:
                cap = raw[name] = (it.vcpus * 1000, it.memory_mib, it.gpu_count)
            else:
                a = n.allocatable
                cap = (a.cpu_milli, a.memory_mib, a.gpus)
        acc = sums.get(pool)
        if acc is None:
            sums[pool] = list(cap)
        else:
            acc[0] += cap[0]
            acc[1] += cap[1]
            acc[2] += cap[2]
    return counts, {pool: Resources(c, m, g, 0) for pool, (c, m, g) in sums.items()}
