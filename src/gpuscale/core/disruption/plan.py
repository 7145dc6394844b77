"""The disruption pass: :func:`plan_disruption` (rules in :mod:`gpuscale.core.disruption`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import compress
from operator import attrgetter, is_, is_not

from gpuscale.core.disruption.budgets import allowed_disruptions, pdb_allowances
from gpuscale.core.disruption.candidates import (
    do_not_disrupt,
    find_candidates,
    is_live,
    sort_pods,
)
from gpuscale.core.disruption.passmemo import Destinations, Judged, PassMemo, fits_total, rows_of
from gpuscale.core.disruption.replacement import Market, find_replacement, split_replacement
from gpuscale.core.disruption.values import (
    ActionKind,
    BudgetVerdict,
    Candidate,
    DisruptionAction,
    DisruptionPlan,
    DisruptionReason,
    KeepReason,
    Kept,
    PodDisruptionBudget,
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
from gpuscale.core.state import best_gpu, fresh_gpu_row
from gpuscale.core.templates import pool_totals

_NONE: frozenset[tuple[OfferingKey, float]] = frozenset()  # (the memo key of "no offering unavailable")
_NAME = attrgetter("name")
# Enum members read per judged candidate, as module constants (a global is cheaper than an Enum class attribute in
# Python 3.11), and each reason's value in lower case (``reason.value`` is a Python-level descriptor call)
_EMPTY, _DRIFTED = DisruptionReason.EMPTY, DisruptionReason.DRIFTED
_WAITING = KeepReason.WAITING
_LOWER = {r: r.value.lower() for r in DisruptionReason}


class _Rows:
    """Free room of the simulated destination rows, as plain lists (a pass moves a handful of pods over a few dozen
    rows: list arithmetic beats array set-up). Per row: free CPU milli, memory MiB and pod slots, the free milli-GPU
    of each physical GPU, entirely free GPUs and the largest free milli-GPU on one GPU (-1 without GPUs), with the
    same accounting as :class:`~gpuscale.core.state.ClusterState` (``occupy_all`` for the pods already bound,
    ``place`` for moved ones)."""

    __slots__ = ("cpu", "full", "gpu", "mem", "pods", "top")

    def __init__(
        self, cpu: list[int], mem: list[int], pods: list[int], gpu: list[list[int]], full: list[int], top: list[int]
    ) -> None:
        self.cpu = cpu
        self.mem = mem
        self.pods = pods
        self.gpu = gpu
        """Per-GPU free milli-GPU per row; shared with the cache of fresh rows until written (copy on write)."""
        self.full = full
        self.top = top

    @classmethod
    def of(cls, nodes: Sequence[Node], by_node: Mapping[str, Sequence[Pod]]) -> _Rows:
        """The rows of ``nodes`` with the pods of ``by_node`` bound (never below 0); a pass builds the same rows from
        the room it already computed."""
        cpu, mem, slots, gpu, full, top = [], [], [], [], [], []
        for n in nodes:
            a = n.allocatable
            bound = by_node.get(n.name, ())
            cpu.append(max(0, a.cpu_milli - sum(p.request.cpu_milli for p in bound)))
            mem.append(max(0, a.memory_mib - sum(p.request.memory_mib for p in bound)))
            slots.append(max(0, a.pods - len(bound)))
            fractions = tuple(p.request.gpu_milli for p in bound if p.request.gpu_milli)
            g_row, g_full, g_top = fresh_gpu_row(a.gpus, sum(p.request.gpus for p in bound), fractions)
            gpu.append(g_row)
            full.append(g_full)
            top.append(g_top)
        return cls(cpu, mem, slots, gpu, full, top)

    def copy(self) -> _Rows:
        return _Rows(list(self.cpu), list(self.mem), list(self.pods), list(self.gpu), list(self.full), list(self.top))

    def place(self, req: Request, i: int) -> None:
        """Take ``req`` on row ``i`` (it fits): whole GPUs the lowest entirely free ones, a fraction the best-fitting
        GPU (:meth:`ClusterState.place <gpuscale.core.state.ClusterState.place>`)."""
        self.cpu[i] -= req.cpu_milli
        self.mem[i] -= req.memory_mib
        self.pods[i] -= 1
        if req.gpus:
            row = list(self.gpu[i])
            for g in [g for g, v in enumerate(row) if v == MILLI_PER_GPU][: req.gpus]:
                row[g] -= MILLI_PER_GPU
        elif req.gpu_milli:
            row = list(self.gpu[i])
            row[best_gpu(row, req.gpu_milli)] -= req.gpu_milli
        else:
            return
        self.gpu[i] = row
        self.full[i] = row.count(MILLI_PER_GPU)
        self.top[i] = max(row)


class _Sim:
    """Free capacity of the destination nodes, with the rows that may take pods."""

    __slots__ = ("cpu_cap", "gpu_cap", "mem_cap", "models", "nodes", "received", "state", "usable", "workloads")

    def __init__(
        self,
        nodes: list[Node],
        models: list[str | None],
        state: _Rows,
        usable: list[bool],
        workloads: Mapping[str, Mapping[str, str]] | None = None,
        caps: tuple[list[int], list[int], list[int]] | None = None,
    ) -> None:
        self.nodes = nodes
        self.models = models
        self.state = state
        self.usable = usable
        self.received: set[int] = set()
        """Rows that took pods from a node disrupted this round (no longer candidates this round)."""
        self.workloads = workloads
        """The active GPRs' workload selectors: their nodes take only their workloads' pods."""
        if caps is None:  # (a pass gives its rows' scales, kept with each row)
            caps = (
                [max(n.allocatable.cpu_milli, 1) for n in nodes],
                [max(n.allocatable.memory_mib, 1) for n in nodes],
                [max(n.allocatable.gpus * MILLI_PER_GPU, 1) for n in nodes],
            )
        self.cpu_cap, self.mem_cap, self.gpu_cap = caps
        """The allocatable CPU, memory and milli-GPU of each row, at least 1 (the best-fit score's scales)."""

    def fit_elsewhere(self, pods: Sequence[Pod], exclude: int) -> tuple[_Rows, list[Pod], set[int]]:
        """Place ``pods`` best-fit on usable rows other than ``exclude``: among the rows a pod fits (room, GPU model,
        labels and taints), the one with the least free CPU, memory and GPU share left after it (first on ties).

        Returns the new state, the pods left over and the rows that received pods.
        """
        dests: set[int] = set()
        st = self.state.copy()
        cpu, mem, slots, gpu, full, top = st.cpu, st.mem, st.pods, st.gpu, st.full, st.top
        nodes, models, workloads = self.nodes, self.models, self.workloads
        cpu_cap, mem_cap, gpu_cap = self.cpu_cap, self.mem_cap, self.gpu_cap
        open_rows = [i for i, ok in enumerate(self.usable) if ok and i != exclude]
        left: list[Pod] = []
        for pod in sort_pods(pods):
            req = pod.request
            r_cpu, r_mem, r_gpus, r_milli = req.cpu_milli, req.memory_mib, req.gpus, req.gpu_milli
            r_demand = r_gpus * MILLI_PER_GPU + r_milli
            want = req.gpu_models if (r_gpus or r_milli) else None
            best = -1
            best_score = 0.0
            for i in open_rows:
                if cpu[i] < r_cpu or mem[i] < r_mem or slots[i] < 1:
                    continue
                if r_gpus:
                    if full[i] < r_gpus:
                        continue
                elif r_milli and top[i] < r_milli:
                    continue
                if want is not None and models[i] not in want:
                    continue
                n = nodes[i]
                if static_fit(pod, n.labels, n.taints, False, workloads) is not None:
                    continue
                score = (
                    (cpu[i] - r_cpu) / cpu_cap[i]
                    + (mem[i] - r_mem) / mem_cap[i]
                    + (sum(v for v in gpu[i] if v > 0) - r_demand) / gpu_cap[i]
                )
                if best < 0 or score < best_score:
                    best, best_score = i, score
            if best < 0:
                left.append(pod)
                continue
            st.place(req, best)
            dests.add(best)
        return st, left, dests


def destinations(
    nodes: Sequence[Node], disrupting: set[str], memo: PassMemo | None
) -> tuple[list[Node], dict[str, int], dict[str, int], dict[str, int]]:
    """The destinations (not launching, cordoned or being disrupted), and node counts per pool for budgets and
    minNodes: those not being disrupted (counts), every node that is not launching (totals) and those being
    disrupted. ``memo``: the last answer is reused while the nodes are the same objects in the same order and the
    nodes being disrupted are the same, and patched where only a few positions differ (:func:`_patched`); the
    counts are copies (a pass changes them)."""
    if memo is not None:
        last = memo.destinations
        if last is not None and len(last[0]) == len(nodes):
            if last[1] == disrupting and all(map(is_, last[0], nodes)):
                return last[2], dict(last[3]), last[4], dict(last[5])
            made = _patched(last, nodes, disrupting)
            if made is not None:
                memo.destinations = made
                return made[2], dict(made[3]), made[4], dict(made[5])
    counts: dict[str, int] = {}
    totals_all: dict[str, int] = {}
    disrupting_by_pool: dict[str, int] = {}
    flags: list[bool] = []  # per node: a destination
    for n in nodes:
        if n.launching:
            flags.append(False)
            continue
        leaving = n.name in disrupting
        on = n.pool
        if on is not None:
            totals_all[on] = totals_all.get(on, 0) + 1
            if leaving:
                disrupting_by_pool[on] = disrupting_by_pool.get(on, 0) + 1
            else:
                counts[on] = counts.get(on, 0) + 1
        flags.append(not leaving and not n.unschedulable)
    dest = list(compress(nodes, flags))
    if memo is not None:
        memo.destinations = (
            list(nodes),
            set(disrupting),
            dest,
            dict(counts),
            totals_all,
            dict(disrupting_by_pool),
            flags,
        )
    return dest, counts, totals_all, disrupting_by_pool


def _patched(last: Destinations, nodes: Sequence[Node], disrupting: set[str]) -> Destinations | None:
    """:func:`destinations`' memo for ``nodes`` (as many as ``last``'s) and ``disrupting``, made from ``last`` by
    taking back the part of each position whose node object or being-disrupted status changed and adding its new
    part (None if more than a quarter of the positions changed: counted afresh). Each node's part depends on that
    node and whether its name is being disrupted alone, so the counts and the destination flags equal a fresh count
    (a count that drops to zero is removed, as a fresh count never makes it; key order may differ: only looked up)."""
    last_nodes, last_disrupting = last[0], last[1]
    redo = set(compress(range(len(nodes)), map(is_not, last_nodes, nodes)))
    if last_disrupting != disrupting:  # the positions of the names that started or stopped being disrupted
        flipped = last_disrupting ^ disrupting
        redo.update(compress(range(len(nodes)), map(flipped.__contains__, map(_NAME, nodes))))
    if len(redo) * 4 > len(nodes):
        return None
    counts, totals_all, by_pool, flags = dict(last[3]), dict(last[4]), dict(last[5]), list(last[6])
    for i in redo:
        for n, leaving, step in (
            (last_nodes[i], last_nodes[i].name in last_disrupting, -1),
            (nodes[i], nodes[i].name in disrupting, 1),
        ):
            if n.launching:
                flags[i] = False
                continue
            on = n.pool
            if on is not None:
                for d in (totals_all, by_pool if leaving else counts):
                    if v := d.get(on, 0) + step:
                        d[on] = v
                    else:
                        del d[on]
            flags[i] = not leaving and not n.unschedulable
    return (list(nodes), set(disrupting), list(compress(nodes, flags)), counts, totals_all, by_pool, flags)


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
    workloads: Mapping[str, Mapping[str, str]] | None = None,
    memo: PassMemo | None = None,
    by_node: Mapping[str, Sequence[Pod]] | None = None,
) -> DisruptionPlan:
    """Decide which nodes to delete or replace now (see the module docstring for the rules).

    ``nodes``/``pods`` are the whole cluster (launching nodes included, marked ``launching``). ``candidates``
    restricts which nodes may be disrupted (None: every non-launching, schedulable node of a pool in ``pools``);
    ``disrupting`` names nodes already being drained or deleted (they count against budgets and take no pods);
    ``protected`` names nodes that must be kept this round (e.g. pending pods were just planned onto them).
    ``since`` maps node names to the time they became candidates; the result carries the updated map.
    ``allow_replace=False`` only ever deletes (a node whose pods do not all fit elsewhere is kept).
    ``workloads`` (the active GPRs' workload selectors): a node held by one of them is room only for pods its
    selector matches. ``memo`` (one per caller, given to every call): reuses the last pass's rows and, when provably
    the same, its plan (:mod:`~gpuscale.core.disruption.passmemo`); the result is the same without it.
    ``by_node``: the live pods of ``pods`` bound to each node, in ``pods``' order, if the caller has them already
    (computed from ``pods`` when None).
    """
    since = since or {}
    utilization = utilization or {}
    pools_t = tuple(pools)
    # the pools by name and whether one has maxNodes or limits: kept while the pools are the same objects, in order
    kept_pools = memo.pools if memo is not None else None
    if kept_pools is not None and len(kept_pools[0]) == len(pools_t) and all(map(is_, kept_pools[0], pools_t)):
        pool_by_name, bounded = kept_pools[1], kept_pools[2]
    else:
        pool_by_name = {p.name: p for p in pools}
        bounded = any(p.max_nodes is not None or p.limits.bounded for p in pools)
        if memo is not None:
            memo.pools = (pools_t, pool_by_name, bounded)
    disrupting_set = set(disrupting)
    if by_node is None:
        grouped: dict[str, list[Pod]] = {}
        for p in pods:
            phase = p.phase
            if phase == "Pending" or phase == "Running" or phase == "":  # is_live, inlined (every pod, every pass)
                on = p.node_name
                if on is not None:
                    lst = grouped.get(on)
                    if lst is None:
                        grouped[on] = [p]
                    else:
                        lst.append(p)
        by_node = grouped
    dest, counts, totals_all, disrupting_by_pool = destinations(nodes, disrupting_set, memo)
    row: dict[str, int] = {}  # simulated destination rows, by node name (filled when the simulation is built)
    lazy: list[_Sim] = []
    removed: set[str] = set()
    # Free room per destination (CPU milli, memory MiB, milli-GPU, pod slots, as free_room counts them; GPU rows) and
    # in total: an upper bound that rules out most hopeless moves without simulating.
    room, changed, free_total = rows_of(dest, by_node, memo)

    looked_at: Sequence[Node] = dest
    if candidates is not None and len(room) == len(dest):
        # the named candidates' rows give their nodes (the destinations' names are unique): find_candidates walks
        # those only, not every destination (it keeps the same ones and sorts them by a key that ends with the name)
        looked_at = [kept_row.node for name in candidates if (kept_row := room.get(name)) is not None]

    def verdict_for(pool: NodePool, reason: DisruptionReason) -> BudgetVerdict:
        """:func:`allowed_disruptions` for the pool's node counts of this pass (the memo keeps the verdicts of pools
        without scheduled budgets: nothing but these inputs decides them)."""
        total, busy = totals_all.get(pool.name, 0), disrupting_by_pool.get(pool.name, 0)
        if memo is None:
            return allowed_disruptions(pool, reason, total, busy, now)
        return memo.verdict(pool, reason, total, busy, now)

    cands, new_since = find_candidates(
        looked_at,
        pool_by_name,
        by_node,
        catalog,
        now,
        since,
        candidates,
        utilization,
        memo.candidates if memo else None,
    )

    memo_key: tuple[object, ...] = ()
    valid: dict[str, Judged] = {}
    budgets: dict[str, tuple[int, int]] = {}
    if memo is not None and not pdbs:
        memo_key = (
            pools_t,
            catalog,
            allow_replace,
            workloads,
            frozenset([(k, t) for k, t in unavailable.items() if t > now]) if unavailable else _NONE,
            # the pools' totals (launching nodes too) decide replacements only under maxNodes or limits
            pool_totals(nodes, catalog) if bounded else None,
        )

        def verdict_of(c: Candidate) -> BudgetVerdict:
            return verdict_for(c.pool, c.reason)

        budgets = {name: (total, disrupting_by_pool.get(name, 0)) for name, total in totals_all.items()}
        valid = memo.valid(
            now,
            memo_key,
            room,
            changed,
            free_total,
            cands,
            new_since,
            protected,
            verdict_of,
            counts,
            budgets,
            workloads,
        )
        if len(valid) == len(cands):  # every candidate kept as before: no action, nothing else to judge
            memo.hits += 1
            memo.reused += len(cands)
            memo.remember(now, memo_key, room, free_total, valid, counts, budgets)
            return DisruptionPlan((), tuple(valid[c.node.name].kept for c in cands), new_since)

    # (the helpers of a pass that judges candidates, made only past the memo's all-kept answer)
    def may_fit_elsewhere(n: Node, wl: Sequence[Pod]) -> bool:
        return fits_total(free_total, room.get(n.name), wl)

    receivers: list[list[tuple[Node, int, int, int, int, str | None, list[int], int, int, int]]] = []

    def may_receive() -> list[tuple[Node, int, int, int, int, str | None, list[int], int, int, int]]:
        """The destinations that might take a candidate's pod, with their room before this pass (free CPU, memory,
        entirely free GPUs, largest free GPU share), GPU model and free milli-GPU per GPU (as
        :meth:`~gpuscale.core.state.ClusterState.occupy_all` accounts the pods bound to them) and the best-fit
        score's scales (:attr:`~gpuscale.core.disruption.passmemo.Row.recv`).

        A node without the CPU, memory or pod slot the smallest candidate pod needs never takes a pod this pass (room
        only shrinks), so it is left out; the order of the others (which breaks ties) is kept."""
        if not receivers:
            movers = [p.request for c in cands for p in c.pods]
            lo_cpu = min((r.cpu_milli for r in movers), default=0)
            lo_mem = min((r.memory_mib for r in movers), default=0)
            out = []
            for n in dest:
                f = room[n.name]
                recv = f.recv  # (node, free CPU and memory at least 0, ...)
                if f.slots >= 1 and recv[1] >= lo_cpu and recv[2] >= lo_mem:
                    out.append(recv)
            receivers.append(out)
        return receivers[0]

    def any_may_move(n: Node, wl: Sequence[Pod]) -> bool:
        """False if no pod of ``wl`` fits any other destination even before this pass took room (then simulating
        would move none of them). The room test is :func:`~gpuscale.core.state.fits_room`'s, inlined."""
        recv = may_receive()
        name = n.name
        for p in wl:
            r = p.request
            r_cpu, r_mem, r_gpus, r_milli = r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli
            models = r.gpu_models if (r_gpus > 0 or r_milli > 0) else None
            for m, cpu, mem, full, top, model, _, _, _, _ in recv:
                if cpu < r_cpu or mem < r_mem:
                    continue
                if r_gpus:
                    if full < r_gpus:
                        continue
                elif r_milli and top < r_milli:
                    continue
                if models is not None and model not in models:
                    continue
                if m.name != name and static_fit(p, m.labels, m.taints, False, workloads) is None:
                    return True
        return False

    def simulation() -> _Sim:
        """The destination nodes' free capacity (built only once a candidate passes the cheap checks)."""
        if not lazy:
            recv = may_receive()
            rows = [r[0] for r in recv]
            row.update({n.name: i for i, n in enumerate(rows)})
            # the room of the pods already bound, never below 0 (a receiver has CPU, memory and a pod slot left)
            state = _Rows(
                [r[1] for r in recv],
                [r[2] for r in recv],
                [room[n.name].slots for n in rows],
                [r[6] for r in recv],
                [r[3] for r in recv],
                [r[4] for r in recv],
            )
            usable = [True] * len(rows)
            for name in removed:
                if name in row:
                    usable[row[name]] = False
            caps = ([r[7] for r in recv], [r[8] for r in recv], [r[9] for r in recv])
            lazy.append(_Sim(rows, [r[5] for r in recv], state, usable, workloads=workloads or None, caps=caps))
        return lazy[0]

    judged: dict[str, Judged] = {}
    fresh: list[tuple[Candidate, int]] = []  # candidates judged here before any action, with their kept index
    fits: dict[str, bool] = {}
    verdicts: dict[str, BudgetVerdict] = {}
    market = Market(pools_t, catalog, now, unavailable or {}, nodes)

    pdb_left = pdb_allowances(pdbs, [p for p in pods if is_live(p)]) if pdbs else {}
    # replacement searches kept across passes (only when the memo key stands for the market's inputs)
    searched = memo.searched if memo is not None and memo_key else None
    if searched is not None and len(searched) > 4 * len(cands) + 64:  # (entries of nodes long gone)
        searched.clear()
    bought = False
    pdb_of = {f"{b.namespace}/{b.name}": b for b in pdbs}

    actions: list[DisruptionAction] = []
    kept: list[Kept] = []

    def keep(n: Node, pool: NodePool, why: KeepReason, msg: str, cand: DisruptionReason) -> None:
        kept.append(Kept(n.name, pool.name, why, msg, cand))

    for c in cands:
        n, pool, reason, msg, wl = c.node, c.pool, c.reason, c.message, c.pods
        if lazy and row.get(n.name, -1) in lazy[0].received:
            continue
        if not actions:  # nothing changed the simulated cluster yet: judged as the last pass did, or judge it now
            j = valid.get(n.name)
            if j is not None:
                assert memo is not None
                memo.reused += 1
                kept.append(j.kept)
                judged[n.name] = j
                continue
            if memo_key:
                fresh.append((c, len(kept)))
        d = pool.disruption
        after = d.wait_s(reason is _EMPTY)
        if reason is not _DRIFTED and now - new_since[n.name] < after:
            wait = after - (now - new_since[n.name])
            setting = (
                "consolidateEmptyAfter"
                if reason is _EMPTY and d.consolidate_empty_after_s is not None
                else "consolidateAfter"
            )
            keep(n, pool, _WAITING, f"{_LOWER[reason]} ({msg}); {setting} in {wait:.0f}s", reason)
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
        verdict = verdict_for(pool, reason)
        verdicts[n.name] = verdict
        if verdict.allowed is not None and verdict.allowed <= 0:
            b = verdict.budget
            what = f"budget nodes={b.nodes}" if b is not None else "budget"
            if b is not None and b.schedule:
                what += f" (schedule {b.schedule!r})"
            keep(n, pool, KeepReason.BUDGET, f"{reason} disruptions of pool {pool.name} exhausted by {what}", reason)
            continue

        fits[n.name] = fit = may_fit_elsewhere(n, wl)
        if fit and any_may_move(n, wl):
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
            # the last search for this node, reused for the same node, pool, reason, price and pods left over while
            # the market is as at the start of the pass (no replacement bought yet) under the same shared inputs
            known = searched.get(n.name) if searched is not None and not bought else None
            if (
                known is not None
                and known[0] is n
                and known[1] is pool
                and known[2] is reason
                and known[3] == price
                and known[5] == memo_key
                and len(known[4]) == len(left)
                and all(map(is_, known[4], left))
            ):
                replacements = known[6]
            else:
                single = find_replacement(n, pool, reason, left, price, market)
                replacements = (single,) if single is not None else ()
                if reason is DisruptionReason.UNDERUTILIZED and len(left) > 1:
                    split = split_replacement(n, pool, left, single.hourly_price if single else price, market)
                    if split:
                        replacements = split
                if searched is not None and not bought:
                    searched[n.name] = (n, pool, reason, price, left, memo_key, replacements)
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
            bought = True  # (the market's counts change: no search is reused or kept for the rest of the pass)
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
    plan = DisruptionPlan(tuple(actions), tuple(kept), new_since)
    if memo is not None:
        for c, i in fresh:  # kept (not waiting) before any action: judged against the starting rows
            name = c.node.name
            if i < len(kept) and kept[i].node == name and kept[i].reason is not _WAITING:
                judged[name] = Judged(
                    c, new_since[name], name in protected, kept[i], fits.get(name), verdicts.get(name)
                )
        memo.remember(now, memo_key, room, free_total, judged, counts, budgets)
    return plan
