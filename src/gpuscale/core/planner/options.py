"""Options: every way to buy a node (pool × instance type × offering) with its node template, in one sorted table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpuscale.core.memo import Memo
from gpuscale.core.model import InstanceType, NodePool, Offering, OfferingKey, Snapshot, Taint
from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources
from gpuscale.core.templates import pool_templates


@dataclass(frozen=True, slots=True)
class Option:
    """One way to buy a node: pool × instance type × offering, with the node template it yields."""

    index: int
    pool: NodePool
    itype: InstanceType
    offering: Offering
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    alloc: Resources
    unavailable_until: float | None
    """None if the offering can be bought now; else until when it cannot (``inf`` for "marked unavailable")."""

    @property
    def price(self) -> float:
        return self.offering.hourly_price

    @property
    def sort_key(self) -> tuple[float, str, str, str, str]:
        return (self.price, self.pool.name, self.itype.name, self.offering.zone, str(self.offering.capacity_type))


def build_options(snapshot: Snapshot, now: float) -> list[Option]:
    """Every option of every pool, sorted by price then names (deterministic)."""
    return list(option_table(snapshot, now))


def option_table(snapshot: Snapshot, now: float) -> tuple[Option, ...]:
    """:func:`build_options` as a shared tuple, memoised per (pools, catalog) objects and the offerings unavailable
    at ``now`` (a controller asks again and again with the same pools); the same tuple object while memoised."""
    blocked = frozenset((k, v) for k, v in snapshot.unavailable.items() if v > now)
    return _OPTIONS.get(
        lambda: tuple(_build_options(snapshot, now)), blocked, objects=(*snapshot.pools, snapshot.catalog)
    )


_OPTIONS: Memo[tuple[Option, ...]] = Memo(256)


def _build_options(snapshot: Snapshot, now: float) -> list[Option]:
    out: list[Option] = []
    for pool in sorted(snapshot.pools, key=lambda p: p.name):
        for t in pool_templates(pool, snapshot.catalog):
            off = t.offering
            if pool.capacity_types and off.capacity_type not in pool.capacity_types:
                continue
            until = snapshot.unavailable.get(OfferingKey(t.itype.name, off.zone, off.capacity_type))
            blocked_until: float | None = None
            if not off.available:
                blocked_until = math.inf
            elif until is not None and until > now:
                blocked_until = until
            out.append(Option(0, pool, t.itype, off, t.labels, pool.taints, t.alloc, blocked_until))
    out.sort(key=lambda o: o.sort_key)
    return [
        Option(i, o.pool, o.itype, o.offering, o.labels, o.taints, o.alloc, o.unavailable_until)
        for i, o in enumerate(out)
    ]


def solo_count(opt: Option, req: Request, limit: int = 1 << 30) -> int:
    """How many pods of ``req`` fit on an empty node of ``opt``."""
    a = opt.alloc
    if req.wants_gpu and req.gpu_models is not None and opt.itype.gpu_model not in req.gpu_models:
        return 0
    n = min(limit, a.pods)
    if req.cpu_milli:
        n = min(n, a.cpu_milli // req.cpu_milli)
    if req.memory_mib:
        n = min(n, a.memory_mib // req.memory_mib)
    if req.gpus:
        n = min(n, a.gpus // req.gpus)
    elif req.gpu_milli:
        n = min(n, a.gpus * (MILLI_PER_GPU // req.gpu_milli))
    return max(0, n)
