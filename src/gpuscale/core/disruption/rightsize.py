"""Right-sizing young nodes (the ``rightsize`` option, off by default).

A pod that lands on a node larger than it needs (an empty node kept warm, room bought ahead, a node a bigger pod
left) pays that node's price for its whole run, and the ordinary consolidation never moves it: the node is not
underutilised once the pod takes its GPUs (a one-GPU pod on a one-GPU, 28-vCPU node), and a spot node is never
replaced by another spot node. Runtimes are heavy-tailed (on the openb trace the median pod runs 8 minutes, the mean
7 hours, and a pod that has run 5 minutes runs 12 hours more on average), so a pod's first minutes are the cheap time
to move it: little work is lost and most of its run is still to come.

:func:`rightsize` picks, among the given nodes whose workload pods were all bound between ``min_pod_age_s`` and
``max_pod_age_s`` ago, the one whose cheapest replacement saves the most $/h. The replacement is one node of the
node's pool, of the node's capacity type, taking all its pods (no other node's room is used); it is taken when

* it costs at most ``(1 - min_saving)`` of the node's price, and
* the saving over ``horizon_s`` pays for the work the move throws away (the pods' share of the node x its price x
  the longest time one of them has run) and for the replacement's boot (its price x ``cold_start_s``).

Blockers (checked here, as the node is not a consolidation candidate): a pod annotated do-not-disrupt, a pod any
PodDisruptionBudget selects, the pool's disruption budget for ``Underutilized``, pools with ``limits``, ``maxNodes``
(:func:`movable_nodes`, shared with the replacement of sets of such nodes, :mod:`.rightsize_multi`). Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuscale.core import labels as L
from gpuscale.core.disruption.budgets import allowed_disruptions
from gpuscale.core.disruption.candidates import do_not_disrupt, node_price, request_share
from gpuscale.core.disruption.replacement import one_node_for
from gpuscale.core.disruption.values import (
    ActionKind,
    DisruptionAction,
    DisruptionReason,
    PodDisruptionBudget,
    Replacement,
)
from gpuscale.core.model import CapacityType, Catalog, Node, NodePool, OfferingKey, Pod

REASON = DisruptionReason.UNDERUTILIZED
"""The budget reason a right-sizing counts against (a node too large for its pods)."""


@dataclass(frozen=True, slots=True)
class RightsizeRule:
    """``rightsize``'s settings (see the module docstring)."""

    min_pod_age_s: float = 300.0
    max_pod_age_s: float = 3600.0
    min_saving: float = 0.2
    horizon_s: float = 3600.0
    cold_start_s: float = 200.0
    max_set: int = 1
    """Replace sets of up to this many nodes together (:mod:`gpuscale.core.disruption.rightsize_multi`); 1: one
    node at a time only."""
    keep_one: bool = False
    """A set whose cheapest new node is of the type of one of its own nodes keeps that node and moves the others'
    pods onto it instead (no launch, and that node's pods keep their work); False: replaced like any set."""


def pod_ages(pods: Sequence[Pod], started: Mapping[str, float], now: float) -> list[float] | None:
    """How long each pod has been bound (``started``: first-bound times); None if one is unknown."""
    out = []
    for p in pods:
        t = started.get(p.key)
        if t is None:
            return None
        out.append(now - t)
    return out


def cheapest_fit(
    node: Node,
    pool: NodePool,
    pods: Sequence[Pod],
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
) -> Replacement | None:
    """The cheapest offering of ``pool`` with the node's capacity type that takes all ``pods`` on one node."""
    ct = node.labels.get(L.CAPACITY_TYPE)
    types = [c for c in CapacityType if str(c) == ct]
    if not types:
        return None
    return one_node_for(pods, pool, catalog, now, unavailable, types)


def pays(price: float, new_price: float, share: float, ages: Sequence[float], rule: RightsizeRule) -> bool:
    """True if replacing a node of ``price`` $/h by one of ``new_price`` pays (see the module docstring); ``share``:
    what the pods request of the node (its GPU share on a GPU node), ``ages``: how long each has run (s)."""
    if new_price > price * (1.0 - rule.min_saving):
        return False
    lost = share * price * max(ages, default=0.0) / 3600.0
    boot = new_price * rule.cold_start_s / 3600.0
    return (price - new_price) * rule.horizon_s / 3600.0 > lost + boot


@dataclass(frozen=True, slots=True)
class Movable:
    """A node whose workload pods may all be moved now (see :func:`movable_nodes`)."""

    node: Node
    pool: NodePool
    pods: list[Pod]
    ages: list[float]
    price: float
    share: float
    """What the pods request of the node (:func:`~gpuscale.core.disruption.candidates.request_share`)."""


Movables = tuple[list[Movable], dict[str, int], dict[str, int | None]]
"""What :func:`movable_nodes` returns."""


def movable_nodes(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    eligible: Collection[str],
    pools: Mapping[str, NodePool],
    catalog: Catalog,
    now: float,
    rule: RightsizeRule,
    started: Mapping[str, float],
    disrupting: Collection[str],
    pdbs: Sequence[PodDisruptionBudget] = (),
) -> Movables:
    """The ``eligible`` nodes with workload pods all bound between ``min_pod_age_s`` and ``max_pod_age_s`` ago and
    no blocker (see the module docstring), in the given order; the nodes per pool; the disruptions each pool's
    budget still allows (None: unlimited)."""
    by_node: dict[str, list[Pod]] = {}
    for p in pods:
        if p.node_name is not None and not p.is_daemonset and p.phase in ("Running", "Pending", ""):
            by_node.setdefault(p.node_name, []).append(p)
    totals: dict[str, int] = {}
    leaving: dict[str, int] = {}
    for n in nodes:
        if n.pool is not None:
            totals[n.pool] = totals.get(n.pool, 0) + 1
            if n.name in disrupting:
                leaving[n.pool] = leaving.get(n.pool, 0) + 1
    allowed: dict[str, int | None] = {}
    out: list[Movable] = []
    for n in nodes:
        wl = by_node.get(n.name)
        pool = pools.get(n.pool) if n.pool is not None else None
        if not wl or pool is None or n.name not in eligible or n.name in disrupting or n.unschedulable:
            continue
        if pool.limits.bounded or (pool.max_nodes is not None and totals.get(pool.name, 0) + 1 > pool.max_nodes):
            continue
        ages = pod_ages(wl, started, now)
        if ages is None or min(ages) < rule.min_pod_age_s or max(ages) > rule.max_pod_age_s:
            continue
        if any(do_not_disrupt(p) for p in wl) or any(b.matches(p) for b in pdbs for p in wl):
            continue
        if pool.name not in allowed:
            allowed[pool.name] = allowed_disruptions(
                pool, REASON, totals.get(pool.name, 0), leaving.get(pool.name, 0), now
            ).allowed
        budget = allowed[pool.name]
        if budget is not None and budget <= 0:
            continue
        out.append(Movable(n, pool, wl, ages, node_price(n, catalog), request_share(n, wl)))
    return out, totals, allowed


def rightsize(
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
) -> DisruptionAction | None:
    """The replacement of the ``eligible`` node that saves the most $/h and pays (see the module docstring), or None.
    ``disrupting``: nodes being disrupted (not eligible; they count against the budgets). ``found``:
    :func:`movable_nodes` of the same inputs, if already computed."""
    if found is None:
        found = movable_nodes(nodes, pods, eligible, pools, catalog, now, rule, started, disrupting, pdbs)
    movable = found[0]
    best: tuple[float, DisruptionAction] | None = None
    for m in movable:
        n, pool, wl, ages, price = m.node, m.pool, m.pods, m.ages, m.price
        r = cheapest_fit(n, pool, wl, catalog, now, unavailable)
        if r is None or not pays(price, r.hourly_price, m.share, ages, rule):
            continue
        saving = price - r.hourly_price
        if best is None or saving > best[0]:
            msg = (
                f"rightsize: replace by {r.instance_type} {r.capacity_type} in {r.zone} (${r.hourly_price:.4g}/h "
                f"instead of ${price:.4g}/h; its {len(wl)} pod(s) bound at most {max(ages) / 60:.0f} min ago)"
            )
            best = (saving, DisruptionAction(ActionKind.REPLACE, n.name, pool.name, REASON, msg, r.pods, (r,), saving))
    return None if best is None else best[1]


def next_look(
    pods: Sequence[Pod], eligible: Collection[str], started: Mapping[str, float], now: float, rule: RightsizeRule
) -> float | None:
    """The earliest time after ``now`` a pod on an eligible node reaches ``min_pod_age_s`` (None: none will)."""
    out: float | None = None
    for p in pods:
        if p.node_name in eligible and not p.is_daemonset and (t := started.get(p.key)) is not None:
            at = t + rule.min_pod_age_s
            if at > now and (out is None or at < out):
                out = at
    return out
