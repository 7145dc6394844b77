"""Spot-to-spot replacement (an option, off by default): a consolidation pass never replaces a spot node by another
spot node, so a spot node whose pods are too small for it (a small pod that landed on a big warm node) and fit on no
cheaper on-demand node stays until its pods end. :func:`swap_spot` turns one such kept node per pass into a
replacement by the cheapest spot offering of its pool that takes *all* its pods (so no other node's room is used)
and that costs at most ``(1 - share)`` of the node's price, ``share`` being the node's share its pods request.

Why that bound: runtimes are heavy-tailed, so the pods will likely run about as long again as they have run; the
work lost by evicting them is worth ``share x price`` per hour run, the saving ``price - new price`` per hour to
come. The swap pays on those terms when ``price - new price >= share x price``; no tuning constant.

The caller runs it only on a pass that decided nothing, so budgets and PDBs stand as the pass checked them: a node
kept with ``NoCheaperReplacement`` passed every blocker (wait, do-not-disrupt, PDBs, budgets) before the search.
Pools with ``limits`` are left alone (their totals are the planner's to count). The replacement has room for the
node's pods only, so the controller cordons the node at the decision (:func:`is_spot_swap` tells its replacements
from the pass's: the pass never replaces a spot node by spot nodes). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuscale.core import labels as L
from gpuscale.core.disruption.candidates import node_price, request_share
from gpuscale.core.disruption.replacement import one_node_for
from gpuscale.core.disruption.values import (
    ActionKind,
    DisruptionAction,
    DisruptionPlan,
    DisruptionReason,
    KeepReason,
    Replacement,
)
from gpuscale.core.model import CapacityType, Catalog, Node, NodePool, OfferingKey, Pod
from gpuscale.core.resources import Resources

SPOT = str(CapacityType.SPOT)


@dataclass(frozen=True, slots=True)
class SpotSwapRule:
    """``max_pod_age_s``: only nodes whose pods were all bound at most this long ago (None: any age)."""

    max_pod_age_s: float | None = None


def spot_replacement(
    node: Node,
    pool: NodePool,
    pods: Sequence[Pod],
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
) -> Replacement | None:
    """The cheapest spot offering of ``pool`` taking all ``pods``, cheaper than the node and at most ``(1 - share) x``
    its price."""
    price = node_price(node, catalog)
    ceiling = min(price * (1.0 - request_share(node, pods)), price - 1e-6)  # strictly cheaper
    return one_node_for(pods, pool, catalog, now, unavailable, (CapacityType.SPOT,), ceiling)


def swap_spot(
    plan: DisruptionPlan,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    pools: Mapping[str, NodePool],
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
    rule: SpotSwapRule,
    started: Mapping[str, float],
) -> DisruptionPlan:
    """``plan`` (which decided nothing) with its first kept spot node that has a spot replacement replaced; the
    plan itself if none or if it has actions. The other kept nodes that have one leave the kept list too (they are
    neither acted on nor kept: a later pass takes them, and no caller rests them as if nothing could be done)."""
    if plan.actions:
        return plan
    by_name = {n.name: n for n in nodes}
    counts: dict[str, int] = {}
    for n in nodes:
        if n.pool is not None:
            counts[n.pool] = counts.get(n.pool, 0) + 1
    looked = {
        k.node
        for k in plan.kept
        if k.reason is KeepReason.NO_REPLACEMENT and by_name.get(k.node, _NO_NODE).labels.get(L.CAPACITY_TYPE) == SPOT
    }
    if not looked:
        return plan
    by_node: dict[str, list[Pod]] = {}
    for p in pods:
        if p.node_name in looked and not p.is_daemonset:
            by_node.setdefault(p.node_name, []).append(p)
    action: DisruptionAction | None = None
    swappable: set[str] = set()
    for k in plan.kept:
        if k.node not in looked:
            continue
        node, pool, wl = by_name[k.node], pools.get(k.pool), by_node.get(k.node, [])
        if pool is None or pool.limits.bounded or not wl:
            continue
        if pool.max_nodes is not None and counts.get(pool.name, 0) + 1 > pool.max_nodes:
            continue
        if rule.max_pod_age_s is not None and any(
            (t := started.get(p.key)) is None or now - t > rule.max_pod_age_s for p in wl
        ):
            continue
        r = spot_replacement(node, pool, wl, catalog, now, unavailable)
        if r is None:
            continue
        swappable.add(k.node)
        if action is None:
            price = node_price(node, catalog)
            reason = k.candidate if k.candidate is not None else DisruptionReason.UNDERUTILIZED
            msg = (
                f"{reason.value.lower()}; replace by {r.instance_type} spot in {r.zone} (${r.hourly_price:.4g}/h "
                f"instead of ${price:.4g}/h: spot to spot, at most {1 - request_share(node, wl):.0%} of its price)"
            )
            action = DisruptionAction(
                ActionKind.REPLACE, node.name, pool.name, reason, msg, r.pods, (r,), price - r.hourly_price
            )
    if action is None:
        return plan
    return DisruptionPlan((action,), tuple(k for k in plan.kept if k.node not in swappable), plan.since)


def is_spot_swap(action: DisruptionAction, node: Node) -> bool:
    """True if ``action`` replaces ``node``, a spot node, by spot nodes only (as :func:`swap_spot` does)."""
    return (
        action.kind is ActionKind.REPLACE
        and action.node == node.name
        and node.labels.get(L.CAPACITY_TYPE) == SPOT
        and bool(action.replacements)
        and all(r.capacity_type is CapacityType.SPOT for r in action.replacements)
    )


_NO_NODE = Node(name="", allocatable=Resources())
