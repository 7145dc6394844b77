"""Right-sizing sets of young nodes together (``rightsize: {maxSet: N}``, off unless N >= 2).

:func:`~gpuscale.core.disruption.rightsize.rightsize` replaces one node by the cheapest single node that holds its
pods. Two half-used nodes cannot be improved that way when each already is the cheapest node for its own pods, yet
one node may hold the pods of both (two CPU-heavy pods on two one-GPU nodes, the small pods of three nodes kept warm
for others). :func:`replace_set` looks for a set of 2 to ``max_set`` nodes of one pool and capacity type whose
workload pods are all young and movable (exactly the nodes ``rightsize`` would consider,
:func:`~gpuscale.core.disruption.rightsize.movable_nodes`) and the cheapest new nodes that hold all their pods: one
node, or the mix the scale-up planner's greedy packing buys for them, whichever costs less. A set is taken when

* the new nodes cost at most ``(1 - min_saving)`` of the set's price, and
* the saving over ``horizon_s`` pays for the work the moves throw away (per node: the pods' share of it x its price x
  the longest time one of its pods has run) and for the new nodes' boot (their price x ``cold_start_s``);

among those, the set whose saving over the horizon exceeds its costs by the most. The pool's budget must allow the
whole set, ``maxNodes`` the new nodes beside the old ones (pools with ``limits`` are left alone, as by
``rightsize``).

With ``keep_one`` (``rightsize: {keepOne: true}``), a set whose cheapest new nodes are one node of the instance type
and capacity type of one of its own nodes, at no lower price, keeps that node and moves the other nodes' pods onto
it (:attr:`SetReplacement.kept`): the others are deleted, nothing is launched, and the kept node's pods are not
evicted. It is valued as a set whose new node costs nothing and boots at once, less the work the moves throw away
on the deleted nodes only, and taken when the kept node holds every pod of the set (its own as they are bound and
daemonsets counted).

The search is greedy and bounded: per pool and capacity type the movable nodes are sorted by how full they are
(the largest of their CPU, memory and GPU shares), emptiest first; from each of the first :data:`SEEDS` nodes a set
grows by adding, in that order among the first :data:`WIDTH`, each node that raises the set's net value, until it has
``max_set`` nodes. At most :data:`MAX_PACKS` packings per call; packings are memoised by the pods' shapes. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuscale.core import labels as L
from gpuscale.core.disruption.replacement import fits_one_node, one_node_for, pack_new_nodes
from gpuscale.core.disruption.rightsize import REASON, Movable, Movables, RightsizeRule, movable_nodes
from gpuscale.core.disruption.values import ActionKind, DisruptionAction, PodDisruptionBudget, Replacement
from gpuscale.core.memo import Memo
from gpuscale.core.model import CapacityType, Catalog, Node, NodePool, OfferingKey, Pod
from gpuscale.core.resources import MILLI_PER_GPU

SEEDS = 6
"""Sets are grown from this many of the emptiest movable nodes per pool and capacity type."""
WIDTH = 12
"""Only the emptiest this many movable nodes per pool and capacity type join a set."""
MAX_PACKS = 64
"""At most this many candidate sets are priced per call."""


@dataclass(frozen=True, slots=True)
class SetReplacement:
    """Replace ``nodes`` (one pool, one capacity type) by ``replacements``; ``actions``: one per old node."""

    nodes: tuple[str, ...]
    pool: str
    replacements: tuple[Replacement, ...]
    price: float
    """$/h of the old nodes."""
    new_price: float
    """$/h of the new nodes."""
    value: float
    """Saving over the horizon less the work lost and the boot ($)."""
    actions: tuple[DisruptionAction, ...]
    kept: str | None = None
    """``keep_one``: the set's node that stays and takes the others' pods (then ``replacements`` is empty and each
    action deletes one other node)."""

    @property
    def saving_per_hour(self) -> float:
        """$/h saved once the old nodes are gone."""
        return self.price - self.new_price


def fill(node: Node, pods: Sequence[Pod]) -> float:
    """How full ``pods`` make ``node``: the largest of their CPU, memory and GPU shares of its allocatable."""
    a = node.allocatable
    shares = [0.0]
    if a.cpu_milli:
        shares.append(sum(p.request.cpu_milli for p in pods) / a.cpu_milli)
    if a.memory_mib:
        shares.append(sum(p.request.memory_mib for p in pods) / a.memory_mib)
    if a.gpus:
        shares.append(sum(p.request.gpu_demand_milli for p in pods) / (a.gpus * MILLI_PER_GPU))
    return max(shares)


def cheapest_mix(
    pods: Sequence[Pod],
    pool: NodePool,
    capacity_type: CapacityType,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
) -> tuple[Replacement, ...]:
    """The cheapest new nodes of ``pool`` and ``capacity_type`` holding all ``pods``: one node, or the planner's
    greedy packing of them, whichever costs less in all; () if neither holds them. Memoised."""
    values = (
        str(capacity_type),
        tuple((p.key, p.request, tuple(sorted(p.node_selector.items())), p.affinity, p.tolerations) for p in pods),
        frozenset((k, t) for k, t in unavailable.items() if t > now),
    )
    return _MIXES.get(
        lambda: _cheapest_mix(pods, pool, capacity_type, catalog, now, unavailable), values, objects=(pool, catalog)
    )


_MIXES: Memo[tuple[Replacement, ...]] = Memo(4096)
_POOLS: Memo[NodePool] = Memo(256)


def _cheapest_mix(
    pods: Sequence[Pod],
    pool: NodePool,
    capacity_type: CapacityType,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
) -> tuple[Replacement, ...]:
    one = one_node_for(pods, pool, catalog, now, unavailable, (capacity_type,))
    only = _POOLS.get(lambda: replace(pool, capacity_types=(capacity_type,)), str(capacity_type), objects=(pool,))
    packed = pack_new_nodes(pods, (only,), catalog, now, unavailable)
    if one is not None and (not packed or one.hourly_price <= sum(r.hourly_price for r in packed) + 1e-9):
        return (one,)
    return packed


@dataclass(frozen=True, slots=True)
class _Priced:
    members: tuple[Movable, ...]
    mix: tuple[Replacement, ...]
    value: float
    kept: Movable | None = None


def _price_set(
    members: tuple[Movable, ...],
    ct: CapacityType,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
    rule: RightsizeRule,
    room: int | None,
    daemons: Mapping[str, Sequence[Pod]] | None = None,
) -> _Priced | None:
    """The set's cheapest new nodes and net value, or None if they do not pay (see the module docstring).
    ``daemons``: the daemonset pods per node (``keep_one``'s fit on a kept node; None: ``keep_one`` off)."""
    pool = members[0].pool
    pods = [p for m in members for p in m.pods]
    mix = cheapest_mix(pods, pool, ct, catalog, now, unavailable)
    if daemons is not None and len(mix) == 1 and (kept := _keeper(members, mix[0], pods, daemons)) is not None:
        return _keep_one(members, kept, rule)
    if not mix or (room is not None and len(mix) > room):
        return None
    price = sum(m.price for m in members)
    new_price = sum(r.hourly_price for r in mix)
    if new_price > price * (1.0 - rule.min_saving):
        return None
    lost = sum(m.share * m.price * max(m.ages, default=0.0) for m in members) / 3600.0
    boot = new_price * rule.cold_start_s / 3600.0
    value = (price - new_price) * rule.horizon_s / 3600.0 - lost - boot
    return _Priced(members, mix, value) if value > 0 else None


def _keeper(
    members: tuple[Movable, ...], new: Replacement, pods: Sequence[Pod], daemons: Mapping[str, Sequence[Pod]]
) -> Movable | None:
    """The member of the instance type and capacity type of ``new``, no dearer, that holds all ``pods`` (with its
    daemonset pods), dearest first; None if there is none."""
    same = [
        m
        for m in members
        if m.node.labels.get(L.INSTANCE_TYPE) == new.instance_type
        and m.node.labels.get(L.CAPACITY_TYPE) == str(new.capacity_type)
        and m.price <= new.hourly_price + 1e-9
    ]
    for m in sorted(same, key=lambda m: (-m.price, m.node.name)):
        if fits_one_node([*daemons.get(m.node.name, ()), *pods], m.node.labels, m.node.taints, m.node.allocatable):
            return m
    return None


def _keep_one(members: tuple[Movable, ...], kept: Movable, rule: RightsizeRule) -> _Priced | None:
    """The set kept on ``kept`` (see the module docstring), or None if it does not pay."""
    gone = [m for m in members if m is not kept]
    price = sum(m.price for m in members)
    if kept.price > price * (1.0 - rule.min_saving):
        return None
    lost = sum(m.share * m.price * max(m.ages, default=0.0) for m in gone) / 3600.0
    value = sum(m.price for m in gone) * rule.horizon_s / 3600.0 - lost
    return _Priced(members, (), value, kept) if value > 0 else None


def replace_set(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    eligible: Collection[str],
    pools: Mapping[str, NodePool],
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
    rule: RightsizeRule,
    started: Mapping[str, float],
    disrupting: Collection[str],
    pdbs: Sequence[PodDisruptionBudget] = (),
    *,
    found: Movables | None = None,
) -> SetReplacement | None:
    """The set of 2 to ``rule.max_set`` ``eligible`` nodes whose replacement pays the most (see the module
    docstring), or None. ``disrupting``: nodes being disrupted (not eligible; they count against the budgets).
    ``found``: :func:`~gpuscale.core.disruption.rightsize.movable_nodes` of the same inputs, if already computed."""
    if rule.max_set < 2:
        return None
    if found is None:
        found = movable_nodes(nodes, pods, eligible, pools, catalog, now, rule, started, disrupting, pdbs)
    movable, totals, allowed = found
    daemons: dict[str, list[Pod]] | None = None
    if rule.keep_one:
        daemons = {}
        for p in pods:
            if p.is_daemonset and p.node_name is not None:
                daemons.setdefault(p.node_name, []).append(p)
    groups: dict[tuple[str, str], list[Movable]] = {}
    for m in movable:
        groups.setdefault((m.pool.name, m.node.labels.get(L.CAPACITY_TYPE, "")), []).append(m)
    best: _Priced | None = None
    packs = 0
    for (pool_name, ct_label), group in sorted(groups.items()):
        cts = [c for c in CapacityType if str(c) == ct_label]
        budget = allowed.get(pool_name)
        size = rule.max_set if budget is None else min(rule.max_set, budget)
        if not cts or size < 2 or len(group) < 2:
            continue
        pool = group[0].pool
        room = None if pool.max_nodes is None else pool.max_nodes - totals.get(pool_name, 0)
        order = sorted(group, key=lambda m: (fill(m.node, m.pods), -m.price, m.node.name))[:WIDTH]
        for seed in order[:SEEDS]:
            chosen: tuple[Movable, ...] = (seed,)
            value = 0.0
            for other in order:
                if len(chosen) >= size or packs >= MAX_PACKS:
                    break
                if any(other is c for c in chosen):
                    continue
                packs += 1
                priced = _price_set((*chosen, other), cts[0], catalog, now, unavailable, rule, room, daemons)
                if priced is not None and priced.value > value:
                    chosen, value = priced.members, priced.value
                    if best is None or value > best.value + 1e-9:
                        best = priced
            if packs >= MAX_PACKS:
                break
    return None if best is None else _as_replacement(best)


def _as_replacement(p: _Priced) -> SetReplacement:
    if p.kept is not None:
        return _as_kept(p, p.kept)
    members = p.members
    price = sum(m.price for m in members)
    new_price = sum(r.hourly_price for r in p.mix)
    names = tuple(m.node.name for m in members)
    kinds = ", ".join(f"{r.instance_type} {r.capacity_type}" for r in p.mix)
    oldest = max(max(m.ages) for m in members)
    actions = []
    for i, m in enumerate(members):
        msg = (
            f"rightsize set: {len(members)} nodes ({', '.join(names)}) replaced by {len(p.mix)} ({kinds}; "
            f"${new_price:.4g}/h instead of ${price:.4g}/h; their pods bound at most {oldest / 60:.0f} min ago)"
        )
        saving = price - new_price if i == 0 else 0.0
        keys = tuple(q.key for q in m.pods)
        actions.append(DisruptionAction(ActionKind.REPLACE, m.node.name, m.pool.name, REASON, msg, keys, p.mix, saving))
    return SetReplacement(names, members[0].pool.name, p.mix, price, new_price, p.value, tuple(actions))


def _as_kept(p: _Priced, kept: Movable) -> SetReplacement:
    members = p.members
    price = sum(m.price for m in members)
    names = tuple(m.node.name for m in members)
    keeper = kept.node.name
    oldest = max(max(m.ages) for m in members if m is not kept)
    actions = []
    for m in members:
        if m is kept:
            continue
        msg = (
            f"rightsize set: {len(members)} nodes ({', '.join(names)}) onto {keeper}, which stays (${kept.price:.4g}/h "
            f"instead of ${price:.4g}/h; the moved pods bound at most {oldest / 60:.0f} min ago)"
        )
        keys = tuple(q.key for q in m.pods)
        actions.append(DisruptionAction(ActionKind.DELETE, m.node.name, m.pool.name, REASON, msg, keys, (), m.price))
    return SetReplacement(names, members[0].pool.name, (), price, kept.price, p.value, tuple(actions), keeper)
