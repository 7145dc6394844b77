"""The disruption pass: :func:`plan_disruption` (rules in :mod:`gpuscale.core.disruption`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuscale.core.disruption.budgets import allowed_disruptions, pdb_allowances
from gpuscale.core.disruption.candidates import (
    do_not_disrupt,
    find_candidates,
    free_room,
    is_live,
    sort_pods,
)
from gpuscale.core.disruption.replacement import Market, find_replacement, split_replacement
from gpuscale.core.disruption.values import (
    ActionKind,
    DisruptionAction,
    DisruptionPlan,
    DisruptionReason,
    FreeRoom,
    KeepReason,
    Kept,
    PodDisruptionBudget,
    Receiver,
    Replacement,
)
from gpuscale.core.model import (
    Catalog,
    Node,
    NodePool,
    OfferingKey,
    Pod,
)
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.state import ClusterState, fits_room, gpu_room


@dataclass(slots=True)
class _Sim:
    """Free capacity of the destination nodes, with a mask of rows that may take pods."""

    nodes: list[Node]
    state: ClusterState
    usable: np.typing.NDArray[np.bool_]
    received: set[int] = field(default_factory=set)
    """Rows that took pods from a node disrupted this round (no longer candidates this round)."""

    def fit_elsewhere(self, pods: Sequence[Pod], exclude: int) -> tuple[ClusterState, list[Pod], set[int]]:
        """Place ``pods`` best-fit on usable rows other than ``exclude``.

        Returns the new state, the pods left over and the rows that received pods.
        """
        dests: set[int] = set()
        st = self.state.copy()
        mask = self.usable.copy()
        if exclude >= 0:
            mask[exclude] = False
        left: list[Pod] = []
        for pod in sort_pods(pods):
            ok = st.fits(pod.request) & mask
            rows = np.flatnonzero(ok)
            rows = np.array(
                [r for r in rows if static_fit(pod, self.nodes[r].labels, self.nodes[r].taints) is None],
                dtype=np.int64,
            )
            if rows.size == 0:
                left.append(pod)
                continue
            best = _best_fit(st, pod.request, rows)
            st.place(pod.request, best)
            dests.add(best)
        return st, left, dests


def _best_fit(st: ClusterState, req: Request, rows: np.typing.NDArray[np.int64]) -> int:
    gcap = np.maximum(st.gpu_cap[rows] * MILLI_PER_GPU, 1)
    score = (
        (st.cpu_free[rows] - req.cpu_milli) / np.maximum(st.cpu_cap[rows], 1)
        + (st.mem_free[rows] - req.memory_mib) / np.maximum(st.mem_cap[rows], 1)
        + (st.gpu_free_milli[rows] - req.gpu_demand_milli) / gcap
    )
    return int(rows[int(np.argmin(score))])


def plan_disruption(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    pools: Sequence[NodePool],
    catalog: Catalog,
    now: float,
    *,
    since: Mapping[str, float] | None = None,
    candidates: Collection[str] | None = None,
    disrupting: Collection[str] = (),
    protected: Collection[str] = (),
    pdbs: Sequence[PodDisruptionBudget] = (),
    utilization: Mapping[str, float] | None = None,
    unavailable: Mapping[OfferingKey, float] | None = None,
    allow_replace: bool = True,
) -> DisruptionPlan:
    """Decide which nodes to delete or replace now (see the module docstring for the rules).

    ``nodes``/``pods`` are the whole cluster (launching nodes included, marked ``launching``). ``candidates``
    restricts which nodes may be disrupted (None: every non-launching, schedulable node of a pool in ``pools``);
    ``disrupting`` names nodes already being drained or deleted (they count against budgets and take no pods);
    ``protected`` names nodes that must be kept this round (e.g. pending pods were just planned onto them).
    ``since`` maps node names to the time they became candidates; the result carries the updated map.
    ``allow_replace=False`` only ever deletes (a node whose pods do not all fit elsewhere is kept).
    """
    since = since or {}
    utilization = utilization or {}
    pool_by_name = {p.name: p for p in pools}
    disrupting_set = set(disrupting)
    live = [p for p in pods if is_live(p)]
    by_node: dict[str, list[Pod]] = {}
    for p in live:
        if p.node_name is not None:
            by_node.setdefault(p.node_name, []).append(p)

    dest = [n for n in nodes if not n.launching and not n.unschedulable and n.name not in disrupting_set]
    row: dict[str, int] = {}  # simulated destination rows, by node name (filled when the simulation is built)
    lazy: list[_Sim] = []
    removed: set[str] = set()
    # Free room per destination and in total: an upper bound that rules out most hopeless moves without simulating.
    free_of = {n.name: free_room(n, by_node.get(n.name, ())) for n in dest}
    total = [0, 0, 0, 0]
    for f in free_of.values():
        for dim in range(4):
            if f[dim] > 0:
                total[dim] += f[dim]
    free_total = FreeRoom(*total)

    def may_fit_elsewhere(n: Node, wl: Sequence[Pod]) -> bool:
        own = free_of.get(n.name, FreeRoom(0, 0, 0, 0))
        need = (
            sum(p.request.cpu_milli for p in wl),
            sum(p.request.memory_mib for p in wl),
            sum(p.request.gpu_demand_milli for p in wl),
            len(wl),
        )
        return all(need[k] <= free_total[k] - max(0, own[k]) for k in range(4))

    receivers: list[list[Receiver]] = []

    def may_receive() -> list[Receiver]:
        """The destinations that might take a candidate's pod, with their room before this pass (free CPU, memory,
        entirely free GPUs, largest free GPU share).

        A node without the CPU, memory or pod slot the smallest candidate pod needs never takes a pod this pass (room
        only shrinks), so it is left out; the order of the others (which breaks ties) is kept."""
        if not receivers:
            movers = [p.request for c in cands for p in c.pods]
            lo_cpu = min((r.cpu_milli for r in movers), default=0)
            lo_mem = min((r.memory_mib for r in movers), default=0)
            out = []
            for n in dest:
                f = free_of[n.name]
                cpu, mem = max(0, f.cpu_milli), max(0, f.memory_mib)
                if f.pods >= 1 and cpu >= lo_cpu and mem >= lo_mem:
                    full, top = gpu_room(n.allocatable.gpus, [p.request for p in by_node.get(n.name, ())])
                    out.append(Receiver(n, cpu, mem, full, top))
            receivers.append(out)
        return receivers[0]

    def any_may_move(n: Node, wl: Sequence[Pod]) -> bool:
        """False if no pod of ``wl`` fits any other destination even before this pass took room (then simulating
        would move none of them)."""
        for p in wl:
            for m, cpu, mem, full, top in may_receive():
                if (
                    m.name != n.name
                    and fits_room(p.request, cpu, mem, 1, full, top, m.gpu_model)
                    and static_fit(p, m.labels, m.taints) is None
                ):
                    return True
        return False

    def simulation() -> _Sim:
        """The destination nodes' free capacity (built only once a candidate passes the cheap checks)."""
        if not lazy:
            rows = [r.node for r in may_receive()]
            row.update((n.name, i) for i, n in enumerate(rows))
            state = ClusterState.of([n.name for n in rows], [n.allocatable for n in rows], [n.gpu_model for n in rows])
            state.occupy_all([[p.request for p in by_node.get(n.name, ())] for n in rows])
            usable = np.ones(len(rows), dtype=bool)
            usable[[row[name] for name in removed if name in row]] = False
            lazy.append(_Sim(rows, state, usable))
        return lazy[0]

    cands, new_since = find_candidates(dest, pool_by_name, by_node, catalog, now, since, candidates, utilization)

    # Budgets and counts per pool.
    counts: dict[str, int] = {}
    totals_all: dict[str, int] = {}
    disrupting_by_pool: dict[str, int] = {}
    for n in nodes:
        if n.launching or n.pool is None:
            continue
        totals_all[n.pool] = totals_all.get(n.pool, 0) + 1
        if n.name in disrupting_set:
            disrupting_by_pool[n.pool] = disrupting_by_pool.get(n.pool, 0) + 1
        else:
            counts[n.pool] = counts.get(n.pool, 0) + 1
    market = Market(tuple(pools), catalog, now, unavailable or {}, nodes)

    pdb_left = pdb_allowances(pdbs, live)
    pdb_of = {f"{b.namespace}/{b.name}": b for b in pdbs}

    actions: list[DisruptionAction] = []
    kept: list[Kept] = []

    def keep(n: Node, pool: NodePool, why: KeepReason, msg: str, cand: DisruptionReason) -> None:
        kept.append(Kept(n.name, pool.name, why, msg, cand))

    for c in cands:
        n, pool, reason, msg, wl = c.node, c.pool, c.reason, c.message, c.pods
        if lazy and row.get(n.name, -1) in lazy[0].received:
            continue
        d = pool.disruption
        after = d.wait_s(reason is DisruptionReason.EMPTY)
        if reason is not DisruptionReason.DRIFTED and now - new_since[n.name] < after:
            wait = after - (now - new_since[n.name])
            setting = (
                "consolidateEmptyAfter"
                if reason is DisruptionReason.EMPTY and d.consolidate_empty_after_s is not None
                else "consolidateAfter"
            )
            keep(n, pool, KeepReason.WAITING, f"{reason.value.lower()} ({msg}); {setting} in {wait:.0f}s", reason)
            continue
        if n.name in protected:
            keep(n, pool, KeepReason.PODS_DO_NOT_FIT, "pending pods were just planned onto this node", reason)
            continue
        blocker = next((p for p in wl if do_not_disrupt(p)), None)
        if blocker is not None:
            keep(n, pool, KeepReason.DO_NOT_DISRUPT, f"pod {blocker.key} is annotated do-not-disrupt", reason)
            continue
        need: dict[str, int] = {}
        for p in wl:
            for key, pdb in pdb_of.items():
                if pdb.matches(p):
                    need[key] = need.get(key, 0) + 1
        short = next((k for k, c in need.items() if pdb_left.get(k, 0) < c), None)
        if short is not None:
            keep(
                n,
                pool,
                KeepReason.PDB,
                f"PodDisruptionBudget {short} allows {pdb_left.get(short, 0)} eviction(s)",
                reason,
            )
            continue
        verdict = allowed_disruptions(
            pool, reason, totals_all.get(pool.name, 0), disrupting_by_pool.get(pool.name, 0), now
        )
        if verdict.allowed is not None and verdict.allowed <= 0:
            b = verdict.budget
            what = f"budget nodes={b.nodes}" if b is not None else "budget"
            if b is not None and b.schedule:
                what += f" (schedule {b.schedule!r})"
            keep(n, pool, KeepReason.BUDGET, f"{reason} disruptions of pool {pool.name} exhausted by {what}", reason)
            continue

        if may_fit_elsewhere(n, wl) and any_may_move(n, wl):
            sim = simulation()
            new_state, left, dests = sim.fit_elsewhere(wl, row.get(n.name, -1))
        else:
            new_state, left, dests = None, list(wl), set()
        price = c.price
        replacements: tuple[Replacement, ...] = ()
        if left and not allow_replace:
            keep(
                n, pool, KeepReason.PODS_DO_NOT_FIT, f"{reason.value.lower()} ({msg}) but its pods fit nowhere", reason
            )
            continue
        if left:
            single = find_replacement(n, pool, reason, left, price, market)
            replacements = (single,) if single is not None else ()
            if reason is DisruptionReason.UNDERUTILIZED and len(left) > 1:
                split = split_replacement(n, pool, left, single.hourly_price if single else price, market)
                if split:
                    replacements = split
            if not replacements:
                why = KeepReason.PODS_DO_NOT_FIT if reason is DisruptionReason.DRIFTED else KeepReason.NO_REPLACEMENT
                detail = (
                    "no conforming offering is available for its pods"
                    if reason is DisruptionReason.DRIFTED
                    else f"{len(left)} pod(s) fit neither elsewhere nor on cheaper new nodes"
                )
                keep(n, pool, why, f"{reason.value.lower()} ({msg}) but {detail}", reason)
                continue
        stays_in_pool = any(r.pool == pool.name for r in replacements)
        if not stays_in_pool and counts.get(pool.name, 0) - 1 < pool.min_nodes:
            keep(n, pool, KeepReason.MIN_NODES, f"pool {pool.name} would drop below minNodes={pool.min_nodes}", reason)
            continue

        # Commit.
        if new_state is not None:
            sim = simulation()
            sim.state = new_state
            sim.received |= dests
        removed.add(n.name)
        if lazy and n.name in row:
            lazy[0].usable[row[n.name]] = False
        if not stays_in_pool:
            counts[pool.name] = counts.get(pool.name, 0) - 1
        disrupting_by_pool[pool.name] = disrupting_by_pool.get(pool.name, 0) + 1
        for k, count in need.items():
            pdb_left[k] -= count
        pod_keys = tuple(p.key for p in sort_pods(wl))
        if not replacements:
            actions.append(
                DisruptionAction(
                    ActionKind.DELETE,
                    n.name,
                    pool.name,
                    reason,
                    f"{reason.value.lower()} ({msg}); "
                    + (f"its {len(wl)} pod(s) fit on other nodes" if wl else "nothing to move"),
                    pod_keys,
                    (),
                    price,
                )
            )
        else:
            for r in replacements:
                market.bought(r)
            new_price = sum(r.hourly_price for r in replacements)
            r0 = replacements[0]
            what = (
                f"{r0.instance_type} {r0.capacity_type} in {r0.zone}"
                if len(replacements) == 1
                else f"{len(replacements)} nodes (" + ", ".join(sorted(r.instance_type for r in replacements)) + ")"
            )
            actions.append(
                DisruptionAction(
                    ActionKind.REPLACE,
                    n.name,
                    pool.name,
                    reason,
                    f"{reason.value.lower()} ({msg}); replace by {what} (${new_price:.4g}/h instead of ${price:.4g}/h)",
                    pod_keys,
                    replacements,
                    price - new_price,
                )
            )
    return DisruptionPlan(tuple(actions), tuple(kept), new_since)
