"""CPU-only pods stay put rather than hop between empty nodes (``cpuPodsOntoEmpty: false``, off by default).

A GPU node running only CPU-only pods is an ``Empty`` candidate (it holds a GPU nobody uses; the catalog may have no
CPU-only type): the pass deletes it when its pods fit on other nodes. When the only room is on *empty* nodes (kept
warm by the pool's empty wait, ``emptyWait`` or room bought ahead), the move only swaps which node is empty: the pods
run their whole duration again, and their new node is in turn a GPU node running only CPU-only pods, deleted the
same way at the next pass. On the openb replay one 12.5-CPU pod was moved so 1,282 times, from one warm one-GPU node
to the next, and never finished.

:func:`keep_cpu_pods` changes a pass's plan so: an ``Empty`` delete of a node with workload pods stands when those
pods fit, together, on nodes that run workload pods (not empty, not leaving, not cordoned; the room taken by earlier
such deletions of the plan counted). Otherwise it is dropped and, if ``swap``, one of the empty nodes its pods would
have gone to is deleted instead (of the same pool and ``releasable``: consolidatable, not held for planned pods), the
best-fitting one as the scheduler would have chosen (cheapest, then by name): the cluster is left with the same
nodes as after the move, and the pods keep their work (the node they stay on keeps its free GPU as room). The fit is
a first-fit of the pods, largest CPU first, over free CPU, memory and pod slots (the pods ask for no GPU), with the
pods' node selectors, affinities and tolerations checked (:func:`~gpuscale.core.predicates.static_fit`). Dropping a
deletion is safe for the plan's other actions (the pass only took room for its pods). Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gpuscale.core.disruption.candidates import free_room, is_live, node_price
from gpuscale.core.disruption.values import ActionKind, DisruptionAction, DisruptionPlan, DisruptionReason
from gpuscale.core.model import Catalog, Node, Pod
from gpuscale.core.predicates import static_fit

Row = tuple[Node, list[int]]
"""A destination node and its free [CPU milli, memory MiB, pod slots]."""


def _is_target(a: DisruptionAction) -> bool:
    """An Empty deletion that evicts pods (a GPU node running only CPU-only pods)."""
    return a.kind is ActionKind.DELETE and a.reason is DisruptionReason.EMPTY and bool(a.pods)


def keep_cpu_pods(
    plan: DisruptionPlan,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    disrupting: Collection[str],
    releasable: Collection[str] = (),
    catalog: Catalog | None = None,
    *,
    swap: bool = True,
) -> tuple[DisruptionPlan, tuple[str, ...]]:
    """``plan`` with the Empty deletions whose pods fit only on empty nodes dropped, each replaced (``swap``) by the
    deletion of one such empty node of ``releasable`` (see the module docstring), and the nodes of the deletions
    dropped (in plan order). ``pods``: the pass's pods (pending pods planned onto a node count as bound there);
    ``disrupting``: nodes being disrupted (never destinations); ``catalog``: prices the empty nodes (by name
    without it)."""
    if not any(_is_target(a) for a in plan.actions):
        return plan, ()
    leaving = set(disrupting) | {a.node for a in plan.actions}
    on: dict[str, list[Pod]] = {}
    for p in pods:
        if p.node_name is not None and is_live(p):
            on.setdefault(p.node_name, []).append(p)
    by_key = {p.key: p for p in pods}
    busy: list[Row] = []
    empty: list[Row] = []
    for n in nodes:
        bound = on.get(n.name, ())
        if n.name in leaving or n.unschedulable or n.launching:
            continue
        room = free_room(n, bound)
        if any(not p.is_daemonset for p in bound):
            busy.append((n, [room.cpu_milli, room.memory_mib, room.pods]))
        elif n.pool is not None and n.name in releasable:
            empty.append((n, [room.cpu_milli, room.memory_mib, room.pods]))
    empty.sort(key=lambda r: (node_price(r[0], catalog) if catalog is not None else 0.0, r[0].name))
    actions: list[DisruptionAction] = []
    dropped: list[tuple[DisruptionAction, list[Pod]]] = []
    for a in plan.actions:
        if not _is_target(a):
            actions.append(a)
            continue
        moved = [by_key[k] for k in a.pods if k in by_key]
        taken = _first_fit(moved, _copy(busy)) if len(moved) == len(a.pods) else None
        if taken is None:
            dropped.append((a, moved))
            continue
        busy = taken
        actions.append(a)
    if swap and not any(a.pods for a in actions):  # (no pod of the plan is moved: any empty node may go)
        for a, moved in dropped:
            if len(moved) != len(a.pods):  # some of its pods are not the pass's: nothing stands in for it
                continue
            for i, (n, free) in enumerate(empty):
                if n.pool == a.pool and _first_fit(moved, [(n, list(free))]) is not None:
                    del empty[i]
                    actions.append(_release(n, a, catalog))
                    break
    if not dropped:
        return plan, ()
    acted = {a.node for a in actions}
    kept = tuple(k for k in plan.kept if k.node not in acted)
    return DisruptionPlan(tuple(actions), kept, plan.since), tuple(a.node for a, _ in dropped)


def _release(n: Node, instead_of: DisruptionAction, catalog: Catalog | None) -> DisruptionAction:
    """The Empty deletion of ``n`` in place of ``instead_of`` (which would have moved its CPU-only pods onto ``n``)."""
    msg = (
        f"empty; deleted instead of moving the CPU-only pods of {instead_of.node} onto it (they stay and keep their "
        f"work; {instead_of.node}'s free GPU stays as room)"
    )
    price = node_price(n, catalog) if catalog is not None else 0.0
    return DisruptionAction(
        ActionKind.DELETE, n.name, n.pool or instead_of.pool, DisruptionReason.EMPTY, msg, (), (), price
    )


def _copy(rows: list[Row]) -> list[Row]:
    return [(n, list(free)) for n, free in rows]


def _first_fit(pods: Sequence[Pod], rows: list[Row]) -> list[Row] | None:
    """``rows`` after placing every pod of ``pods`` (largest CPU first) on the first row it fits, or None."""
    for p in sorted(pods, key=lambda p: (-p.request.cpu_milli, -p.request.memory_mib, p.key)):
        r = p.request
        if r.gpu_demand_milli:
            return None
        for n, free in rows:
            fits = free[0] >= r.cpu_milli and free[1] >= r.memory_mib and free[2] >= 1
            if fits and static_fit(p, n.labels, n.taints) is None:
                free[0] -= r.cpu_milli
                free[1] -= r.memory_mib
                free[2] -= 1
                break
        else:
            return None
    return rows
