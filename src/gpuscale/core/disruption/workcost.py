"""Eviction-cost awareness (an option, off by default): a consolidation that evicts running pods throws away the work
they did since they started (or since their last checkpoint), which has to be done again. :func:`weigh_actions`
keeps an *Underutilized* delete or replace whose lost work costs more than what it saves over a horizon.

* **Lost work** of a pod (:func:`lost_work_usd`): hours it has run since ``max(start, checkpoint)`` times its share
  of the node (GPU share on GPU nodes, else the larger of CPU and memory share) times the node's $/h: what re-running
  that work costs at the node's own rate. The start is when the pod was first seen bound (the caller keeps it); a
  checkpoint is the annotation ``gpuscale.io/checkpointed-at`` (seconds since the epoch, or RFC 3339 UTC).
* **Saving**: the action's ``savings_per_hour`` times ``horizon_s``.
* Only Underutilized actions are weighed: empty nodes lose nothing and drifted nodes must go whatever it costs.

Pure: times come from the caller; nothing is read from a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuscale.core.disruption.candidates import node_price
from gpuscale.core.disruption.values import (
    DisruptionAction,
    DisruptionPlan,
    DisruptionReason,
    KeepReason,
    Kept,
)
from gpuscale.core.model import Catalog, Node, Pod
from gpuscale.core.resources import MILLI_PER_GPU

CHECKPOINT_ANNOTATION = "gpuscale.io/checkpointed-at"
"""When the pod last saved its progress: work before it is not lost by an eviction."""


@dataclass(frozen=True, slots=True)
class WorkCostRule:
    """``horizon_s``: how long a consolidation's hourly saving is counted against the work it throws away."""

    horizon_s: float = 3600.0


def checkpoint_time(pod: Pod) -> float | None:
    """The pod's ``gpuscale.io/checkpointed-at`` as seconds since the epoch (None when absent or unreadable)."""
    raw = pod.annotations.get(CHECKPOINT_ANNOTATION)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            value = datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return value if math.isfinite(value) else None


def pod_share(pod: Pod, node: Node) -> float:
    """The pod's share of the node: GPU share on a GPU node, else the larger of its CPU and memory shares."""
    a, r = node.allocatable, pod.request
    if a.gpus > 0:
        return min(1.0, r.gpu_demand_milli / (a.gpus * MILLI_PER_GPU))
    cpu = r.cpu_milli / a.cpu_milli if a.cpu_milli else 0.0
    mem = r.memory_mib / a.memory_mib if a.memory_mib else 0.0
    return min(1.0, max(cpu, mem))


def lost_work_usd(pod: Pod, node: Node, hourly_price: float, started_at: float | None, now: float) -> float:
    """$ of work an eviction of ``pod`` from ``node`` (at ``hourly_price``) throws away now (see the module doc)."""
    if started_at is None:
        return 0.0
    since = started_at
    ckpt = checkpoint_time(pod)
    if ckpt is not None and ckpt > since:
        since = ckpt
    hours = max(0.0, now - since) / 3600.0
    return hours * pod_share(pod, node) * hourly_price


@dataclass(frozen=True, slots=True)
class Weighed:
    """One action's verdict: the work it would lose, what it saves over the horizon, and whether it goes ahead."""

    action: DisruptionAction
    lost_usd: float
    saving_usd: float

    @property
    def worth_it(self) -> bool:
        """True if the saving over the horizon covers the lost work."""
        return self.lost_usd <= self.saving_usd


def weigh_action(
    action: DisruptionAction,
    node: Node,
    pods: Mapping[str, Pod],
    started: Mapping[str, float],
    catalog: Catalog,
    rule: WorkCostRule,
    now: float,
) -> Weighed:
    """Lost work against the saving over ``rule.horizon_s`` for one action (see the module docstring)."""
    price = node_price(node, catalog)
    lost = sum(
        lost_work_usd(p, node, price, started.get(k), now) for k in action.pods if (p := pods.get(k)) is not None
    )
    return Weighed(action, lost, max(0.0, action.savings_per_hour) * rule.horizon_s / 3600.0)


def weigh_actions(
    plan: DisruptionPlan,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    started: Mapping[str, float],
    catalog: Catalog,
    rule: WorkCostRule,
    now: float,
) -> DisruptionPlan:
    """``plan`` without the Underutilized actions whose lost work exceeds their saving; those nodes are kept with
    :attr:`KeepReason.WORK_LOST <gpuscale.core.disruption.values.KeepReason>`.

    Dropping an action is always safe for the others: the pass simulated its pods taking room elsewhere, which only
    made the later decisions harder."""
    by_name = {n.name: n for n in nodes}
    pod_by_key = {p.key: p for p in pods}
    actions: list[DisruptionAction] = []
    kept = list(plan.kept)
    for a in plan.actions:
        node = by_name.get(a.node)
        if a.reason is not DisruptionReason.UNDERUTILIZED or node is None or not a.pods:
            actions.append(a)
            continue
        w = weigh_action(a, node, pod_by_key, started, catalog, rule, now)
        if w.worth_it:
            actions.append(a)
            continue
        msg = (
            f"underutilized, but evicting its {len(a.pods)} pod(s) throws away ${w.lost_usd:.2f} of work, more than "
            f"the ${w.saving_usd:.2f} it saves in {rule.horizon_s / 3600:.3g} h"
        )
        kept.append(Kept(a.node, a.pool, KeepReason.WORK_LOST, msg, a.reason))
    if len(actions) == len(plan.actions):
        return plan
    return DisruptionPlan(tuple(actions), tuple(kept), plan.since)
