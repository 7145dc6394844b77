"""Draining, deletion and orphan decisions of one round, as pure functions.

- :func:`drain_step` goes through the claims on their way out: a Draining claim's remaining pods are evicted
  (never past a PodDisruptionBudget's allowance, never a do-not-disrupt pod in a voluntary drain) and, once none is
  left or its grace period (:func:`drain_grace_s`, counted from the first accepted eviction) has passed, the claim is
  Drained and its node deleted (a voluntary drain never forces out a do-not-disrupt pod); a Failed claim's node is
  deleted (or, without one, the claim is Gone); a Deleting claim's delete is repeated when due.
- :func:`orphan_step` finds Node objects labelled with a request id that neither a claim nor the provider knows;
  after ``grace_s`` they are removed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuscale.core.disruption import PodDisruptionBudget, do_not_disrupt, pdb_allowances
from gpuscale.core.model import INVOLUNTARY_GRACE_S, Node, Pod
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL, ClaimEvent, ClaimPhase, NodeClaim, transition
from gpuscale.core.reconcile.records import (
    Decisions,
    DeleteNode,
    EventKind,
    Evict,
    EvictBlocked,
    FinishClaim,
    Note,
    RemoveOrphan,
    SetClaim,
    find_node,
)


@dataclass(slots=True)
class OrphanScan:
    """:func:`orphan_step`'s answer: removals, and since when each remaining orphan has been seen."""

    remove: list[RemoveOrphan] = field(default_factory=list)
    since: dict[str, float] = field(default_factory=dict)


def drain_grace_s(pool_grace_s: float | None, involuntary: bool) -> float | None:
    """How long a drain waits for its pods after the first accepted eviction (None: without limit): the pool's
    ``terminationGracePeriod``, else none for a voluntary drain and :data:`INVOLUNTARY_GRACE_S` for an involuntary
    one."""
    if pool_grace_s is not None:
        return pool_grace_s
    return INVOLUNTARY_GRACE_S if involuntary else None


def drain_step(
    leaving: Iterable[tuple[str, NodeClaim]],
    by_node: Mapping[str, Sequence[Pod]],
    nodes: Mapping[str, Node],
    pods: Sequence[Pod],
    pdbs: Sequence[PodDisruptionBudget],
    involuntary: Collection[str],
    delete_due: Mapping[str, float],
    now: float,
    *,
    evicting_since: Mapping[str, float] | None = None,
    pool_grace_s: Mapping[str, float | None] | None = None,
) -> Decisions:
    """The drain and delete decisions for ``leaving`` (claims Draining, Deleting or Failed, in table order).

    ``involuntary`` names claims drained for a reason the pods cannot veto (spot interruption, node failure);
    ``delete_due`` when a Deleting claim's delete is to be repeated. Each eviction decided uses up the PDB allowance
    it needs, so the evictions of one round never exceed what the budgets allow together. ``evicting_since`` is when
    the backend first accepted an eviction from each Draining claim's node, ``pool_grace_s`` each pool's
    ``terminationGracePeriod`` (missing: None): past :func:`drain_grace_s` the node is deleted with its pods.
    """
    out = Decisions()
    allow: dict[str, int] | None = None
    since = evicting_since or {}
    graces = pool_grace_s or {}
    for key, c in leaving:
        if c.phase is ClaimPhase.DRAINING:
            node = find_node(c, nodes)
            left = [p for p in by_node.get(node.name, ()) if not p.is_daemonset] if node is not None else []
            if not left or node is None:
                out.actions.append(SetClaim(key, transition(c, ClaimEvent.DRAINED, now, reason="no pods left")))
                out.actions.append(DeleteNode(key))
                continue
            voluntary = key not in involuntary
            grace = drain_grace_s(graces.get(c.pool), not voluntary)
            first = since.get(key)
            if (
                grace is not None
                and first is not None
                and now - first >= grace
                and not (voluntary and any(do_not_disrupt(p) for p in left))
            ):
                why = f"terminationGracePeriod {grace:.0f}s passed with {len(left)} pod(s) left"
                out.actions.append(SetClaim(key, transition(c, ClaimEvent.DRAINED, now, reason=why)))
                out.actions.append(
                    Note(EventKind.DELETE, f"node/{node.name}", "TerminationGracePeriod", why, {"request_id": key})
                )
                out.actions.append(DeleteNode(key))
                continue
            if allow is None:
                allow = pdb_allowances(pdbs, pods)
            for p in left:
                if voluntary and do_not_disrupt(p):
                    out.actions.append(EvictBlocked(p.key, "DoNotDisrupt", "annotated do-not-disrupt"))
                    continue
                keys = [f"{b.namespace}/{b.name}" for b in pdbs if b.matches(p)]
                if any(allow.get(k, 0) < 1 for k in keys):
                    out.actions.append(EvictBlocked(p.key, "PodDisruptionBudget", "PDB allows none now"))
                    continue
                for k in keys:
                    allow[k] -= 1
                out.actions.append(Evict(p.key, key, node.name, c.reason))
        elif c.phase is ClaimPhase.FAILED:
            if c.node_id:
                out.actions.append(SetClaim(key, transition(c, ClaimEvent.DELETE, now, reason=c.reason)))
                out.actions.append(DeleteNode(key))
            else:
                out.actions.append(FinishClaim(key, transition(c, ClaimEvent.LOST, now, reason="no node was created")))
        elif c.phase is ClaimPhase.DELETING and delete_due.get(key, -float("inf")) <= now:
            out.actions.append(DeleteNode(key))
    return out


def orphan_step(
    nodes: Iterable[Node],
    claims: Mapping[str, NodeClaim],
    names_node: Callable[[str], bool],
    cloud_request_ids: Collection[str],
    seen_since: Mapping[str, float],
    grace_s: float,
    now: float,
) -> OrphanScan:
    """Node objects labelled with a request id no claim has and the provider does not list, and not named by any
    claim (``names_node``): removed once seen as orphans for ``grace_s``."""
    scan = OrphanScan()
    for n in nodes:
        rid = n.labels.get(REQUEST_ID_LABEL)
        if rid is None or rid in claims or names_node(n.name) or rid in cloud_request_ids:
            continue
        first = seen_since.get(n.name, now)
        if now - first >= grace_s:
            scan.remove.append(RemoveOrphan(n.name, rid))
        else:
            scan.since[n.name] = first
    return scan
