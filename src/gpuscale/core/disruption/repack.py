"""Two optional consolidation rules about *which pods* an Underutilized consolidation may move (both off by default).

* **Old pods stay** (:func:`hold_old_pods`, ``evictMaxPodAge``): an Underutilized delete or replace that would evict
  a pod bound for longer than ``max_age_s`` is dropped; the node is kept (``WorkLostExceedsSaving``). Runtimes are
  heavy-tailed: a pod that has run for hours will likely run for hours more, and its eviction throws all of that
  work away.
* **Repack at scale-up** (:func:`repack_inputs`, :func:`young_nodes`, ``repack``): while new nodes are being
  launched anyway, their room not taken by the pods they were launched for is a destination too, but only for the
  pods of underutilised nodes whose pods are all young (bound at most ``max_age_s``): such a node can go now instead
  of after the new nodes are up and ``consolidateAfter`` has passed again, and little work is lost. The caller runs
  this second pass only when the ordinary pass decided nothing, and keeps only its deletions.

Pure: when pods were bound and the time come from the caller.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuscale.core.disruption.values import (
    ActionKind,
    DisruptionAction,
    DisruptionPlan,
    DisruptionReason,
    KeepReason,
    Kept,
)
from gpuscale.core.model import Node, Pod
from gpuscale.core.resources import Resources


@dataclass(frozen=True, slots=True)
class PodAgeRule:
    """``max_age_s``: Underutilized consolidations never evict a pod bound for longer than this."""

    max_age_s: float


@dataclass(frozen=True, slots=True)
class RepackRule:
    """``max_age_s``: only nodes whose pods were all bound at most this long ago move them onto nodes in flight."""

    max_age_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class InFlight:
    """A node being launched: the room it will offer and the pending pods it was launched for (they take room
    first)."""

    allocatable: Resources
    pods: tuple[str, ...] = ()


def pod_age(key: str, started: Mapping[str, float], now: float) -> float | None:
    """Seconds since the pod was first seen bound (None if unknown)."""
    t = started.get(key)
    return None if t is None else max(0.0, now - t)


def oldest(keys: Sequence[str], started: Mapping[str, float], now: float) -> tuple[str, float] | None:
    """The pod of ``keys`` bound longest, with its age (None if no age is known)."""
    best: tuple[str, float] | None = None
    for k in keys:
        age = pod_age(k, started, now)
        if age is not None and (best is None or age > best[1]):
            best = (k, age)
    return best


def hold_old_pods(plan: DisruptionPlan, started: Mapping[str, float], rule: PodAgeRule, now: float) -> DisruptionPlan:
    """``plan`` without the Underutilized actions that would evict a pod older than ``rule.max_age_s``; those nodes
    are kept with :attr:`KeepReason.WORK_LOST`. Dropping an action is safe for the others (the pass only took room
    for its pods). Pods whose age is unknown count as young."""
    actions: list[DisruptionAction] = []
    kept = list(plan.kept)
    for a in plan.actions:
        old = oldest(a.pods, started, now) if a.reason is DisruptionReason.UNDERUTILIZED else None
        if old is None or old[1] <= rule.max_age_s:
            actions.append(a)
            continue
        msg = (
            f"underutilized, but pod {old[0]} has run {old[1] / 3600:.2f} h (more than "
            f"{rule.max_age_s / 3600:.3g} h: it will likely run long, and evicting it loses that work)"
        )
        kept.append(Kept(a.node, a.pool, KeepReason.WORK_LOST, msg, a.reason))
    if len(actions) == len(plan.actions):
        return plan
    return DisruptionPlan(tuple(actions), tuple(kept), plan.since)


def young_nodes(
    names: Collection[str],
    by_node: Mapping[str, Sequence[Pod]],
    started: Mapping[str, float],
    rule: RepackRule,
    now: float,
) -> set[str]:
    """The nodes of ``names`` running at least one workload pod, every one bound (as far as known) at most
    ``rule.max_age_s`` ago. A pod whose bind time is unknown is not young."""
    out: set[str] = set()
    for name in names:
        pods = [p for p in by_node.get(name, ()) if not p.is_daemonset]
        if not pods:
            continue
        ages = [pod_age(p.key, started, now) for p in pods]
        if all(a is not None and a <= rule.max_age_s for a in ages):
            out.add(name)
    return out


def repack_inputs(
    nodes: Sequence[Node], pods: Sequence[Pod], flight: Mapping[str, InFlight]
) -> tuple[list[Node], list[Pod]]:
    """The disruption pass's nodes and pods with the nodes of ``flight`` (by node name) as destinations: not
    launching, with their full room (a registered node's GPUs before its device plugin is ready), and the still
    pending pods each was launched for bound to it, so only the room left after them takes moved pods."""
    if not flight:
        return list(nodes), list(pods)
    out_nodes = [
        replace(n, launching=False, allocatable=f.allocatable) if (f := flight.get(n.name)) is not None else n
        for n in nodes
    ]
    owner = {k: name for name, f in flight.items() for k in f.pods}
    out_pods = [
        replace(p, node_name=owner[p.key]) if p.node_name is None and p.pending and p.key in owner else p for p in pods
    ]
    return out_nodes, out_pods


def repack_deletions(plan: DisruptionPlan, young: Collection[str]) -> tuple[DisruptionAction, ...]:
    """The deletions of a repack pass that may be carried out: Underutilized deletes of ``young`` nodes."""
    return tuple(
        a
        for a in plan.actions
        if a.kind is ActionKind.DELETE and a.reason is DisruptionReason.UNDERUTILIZED and a.node in young
    )


def empty_nodes(nodes: Sequence[Node], pods: Sequence[Pod], disrupting: Collection[str]) -> set[str]:
    """The schedulable, ready nodes of a pool with no workload pod bound (pending pods planned onto a node count as
    bound there) and not being disrupted: where an Underutilized move would only swap which node is empty."""
    busy = {p.node_name for p in pods if p.node_name is not None and not p.is_daemonset}
    return {
        n.name
        for n in nodes
        if n.pool is not None
        and not n.launching
        and not n.unschedulable
        and n.name not in busy
        and n.name not in disrupting
    }


def without_destinations(nodes: Sequence[Node], names: Collection[str]) -> list[Node]:
    """``nodes`` with ``names`` cordoned (a pass neither moves pods onto them nor considers them)."""
    return [replace(n, unschedulable=True) if n.name in names else n for n in nodes]
