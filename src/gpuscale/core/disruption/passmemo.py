"""What one disruption pass hands the next: the destination rows it built and the candidates it kept, with what
lets the next pass keep them again without judging them (:class:`PassMemo`).

A caller that runs :func:`~gpuscale.core.disruption.plan_disruption` round after round over a cluster that changes
a little passes one :class:`PassMemo` to every call. The results are those of a pass without it:

- **rows** (:class:`Row`): each destination node's free room with its bound pods (CPU, memory, milli-GPU, pod
  slots; per-GPU free milli-GPU, entirely free GPUs, the largest free share), reused while the node object and its
  bound pods are the same (equal, in the same order; anything else builds the row again).
- **judged candidates** (:class:`Judged`): a candidate kept (not waiting out consolidateAfter) before the pass
  decided any action was judged against the pass's starting rows, since nothing changes the simulated cluster
  before an action. The next pass keeps it again, without judging it, while it decides no action before it either
  and: the candidate is equal (node, pods, reason, price) with the same clock and protection; the offerings
  available now, pools, catalog and options are the same (and the pools' totals when a pool has maxNodes or
  limits); its budget verdict blocks it or not as before (recomputed when its pool's node counts changed or the
  pool has scheduled budgets); minNodes counts are the same if minNodes kept it; the total-room filter gives the
  same answer; and every row that changed (new, gone or with other room) could take none of its pods, before or
  after the change. Where its pods fit is the best-fit packing over the rows: a row that can take none of them is
  never chosen, the other rows are the same in the same order, so the packing places every pod as before and
  leaves the same pods over for the same replacement search. Rows only lose room during a packing, so "could take
  none" is judged on the row as it stands. A judged candidate stays valid only from one pass to the next: one a
  pass does not see, or sees after an action, is dropped.

- **replacement searches** (:attr:`PassMemo.searched`): a candidate judged again whose pods fit nowhere (or only
  some of them) searches new nodes for the pods left over; the search reads the node (its labels), pool, reason,
  price and those pods, and the market: pools, catalog, the offerings unavailable now and (for pools with maxNodes
  or limits) the pools' totals, all in the memo key, plus the replacements already bought in the pass. So a search
  made before the pass bought any is reused for the same node and pool objects, reason, price and pods left over
  (the same objects, in order) under an equal memo key, while the current pass has bought none either.

Passes with PodDisruptionBudgets reuse nothing (their allowances count every pod in the cluster).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count
from operator import is_not, ne

from gpuscale.core.disruption.budgets import allowed_disruptions
from gpuscale.core.disruption.candidates import CandidateMemo
from gpuscale.core.disruption.values import (
    BudgetVerdict,
    Candidate,
    DisruptionReason,
    KeepReason,
    Kept,
    Replacement,
)
from gpuscale.core.labels import GPU_PRODUCT
from gpuscale.core.model import DisruptionBudget, Node, NodePool, Pod
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import MILLI_PER_GPU
from gpuscale.core.state import fresh_gpu_row

_MIN_NODES = KeepReason.MIN_NODES  # (read per reused candidate: a module constant, not an Enum class attribute)


@dataclass(slots=True, eq=False)
class Row:
    """A destination node's room with its bound pods (free CPU, memory and milli-GPU may be negative when
    overcommitted), as a pass accounts it. Compared by identity: a row reused from the last pass is the same
    object. Never written once built (not frozen only because a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``: a third of :func:`build_row`, ~25 k rows per openb replay)."""

    node: Node
    pods: Sequence[Pod]
    """Its live bound pods, in order."""
    cpu: int
    mem: int
    gpu: int
    slots: int
    g_row: list[int]
    """Free milli-GPU per physical GPU (shared: never written)."""
    full: int
    top: int
    pos: tuple[int, int, int, int]
    """(cpu, mem, gpu, slots), each at least 0: what the row adds to the total free room."""
    recv: tuple[Node, int, int, int, int, str | None, list[int], int, int, int]
    """(node, free CPU and memory at least 0, entirely free GPUs, largest free share, GPU model, ``g_row``, and its
    allocatable CPU, memory and milli-GPU, each at least 1: the best-fit score's scales): the row as a pass's
    receivers list it."""


def build_row(node: Node, pods: Sequence[Pod]) -> Row:
    """The row of ``node`` with its live bound ``pods`` (in order)."""
    a = node.allocatable
    cap_cpu, cap_mem, cap_gpu = cpu, mem, gpu = a.cpu_milli, a.memory_mib, a.gpus * MILLI_PER_GPU
    whole = 0
    fractions: list[int] = []
    for p in pods:
        r = p.request
        cpu -= r.cpu_milli
        mem -= r.memory_mib
        gpu -= r.gpus * MILLI_PER_GPU + r.gpu_milli
        whole += r.gpus
        if r.gpu_milli:
            fractions.append(r.gpu_milli)
    g_row, full, top = fresh_gpu_row(a.gpus, whole, tuple(fractions))
    slots = a.pods - len(pods)
    # (max(0, x) and max(x, 1) as conditional expressions: the same ints, without a builtin call each)
    pos = (cpu if cpu > 0 else 0, mem if mem > 0 else 0, gpu if gpu > 0 else 0, slots if slots > 0 else 0)
    recv = (
        node,
        pos[0],
        pos[1],
        full,
        top,
        node.labels.get(GPU_PRODUCT),  # (Node.gpu_model)
        g_row,
        cap_cpu if cap_cpu > 1 else 1,
        cap_mem if cap_mem > 1 else 1,
        cap_gpu if cap_gpu > 1 else 1,
    )
    return Row(node, pods, cpu, mem, gpu, slots, g_row, full, top, pos, recv)


def rows_of(
    dest: Sequence[Node], by_node: Mapping[str, Sequence[Pod]], memo: PassMemo | None
) -> tuple[dict[str, Row], set[str], tuple[int, int, int, int]]:
    """The rows of ``dest`` (by name, in order), the rows that differ from ``memo``'s last ones (new, gone or
    rebuilt) and the total free room (the sum of ``pos``). A row is reused while its node is the same object and its
    pods are equal, in the same order."""
    cached = memo.rows if memo is not None else {}
    changed: set[str] = set()
    made = memo.made if memo is not None else None
    remade: list[int] | None = None
    if made is not None and made[0] is cached and len(made[1]) == len(dest) and len(cached) == len(dest):
        # the positions whose destination node is another object than the kept rows' (C-level)
        remade = list(compress(count(), map(is_not, made[1], dest)))
        names = made[2]
        if any(dest[i].name != names[i] for i in remade):
            remade = None
    if remade is not None:
        # the same destination names, in the same order, as the rows kept (names unique): only their pods are looked
        # up, and the rows whose node object or pods changed built again (the pods are compared list to list)
        assert memo is not None and made is not None
        bounds = list(map(by_node.get, names))
        last_bounds = made[3]
        if not remade and bounds == last_bounds:
            out = cached
        else:
            out = dict(cached)
            redo = set(compress(count(), map(ne, bounds, last_bounds)))
            redo.update(remade)
            for i in sorted(redo):
                name = names[i]
                out[name] = build_row(dest[i], bounds[i] or ())
                changed.add(name)
        memo.made = (out, list(dest) if remade else made[1], names, bounds)
    else:
        out = {}
        get = cached.get
        for n in dest:
            name = n.name
            bound = by_node.get(name) or ()
            old = get(name)
            if old is not None and old.node is n and old.pods == bound:
                out[name] = old
                continue
            out[name] = build_row(n, bound)
            changed.add(name)
        if len(out) - len(changed) != len(cached):  # some cached row is gone
            changed.update(cached.keys() - out.keys())
        if memo is not None:
            names = list(out)
            memo.made = (out, list(dest), names, list(map(by_node.get, names)) if len(out) == len(dest) else [])
    if memo is None or len(changed) * 2 > len(out):
        cpu, mem, gpu, slots = (sum(x) for x in zip(*[r.pos for r in out.values()], strict=True)) if out else (0,) * 4
    else:  # the last total, corrected by the changed rows
        cpu, mem, gpu, slots = memo.total
        for name in changed:
            for r, sign in ((cached.get(name), -1), (out.get(name), 1)):
                if r is not None:
                    p = r.pos
                    cpu, mem, gpu, slots = cpu + sign * p[0], mem + sign * p[1], gpu + sign * p[2], slots + sign * p[3]
    return out, changed, (cpu, mem, gpu, slots)


def may_take(row: Row, pod: Pod, workloads: Mapping[str, Mapping[str, str]] | None) -> bool:
    """True if a pass could place ``pod`` on ``row``: a pod slot, the pod's room, GPU model, labels and taints."""
    cpu, mem = max(0, row.cpu), max(0, row.mem)
    if row.slots < 1:
        return False
    r = pod.request
    if cpu < r.cpu_milli or mem < r.memory_mib:
        return False
    if r.gpus:
        if row.full < r.gpus:
            return False
    elif r.gpu_milli and row.top < r.gpu_milli:
        return False
    n = row.node
    want = r.gpu_models if (r.gpus or r.gpu_milli) else None
    if want is not None and n.gpu_model not in want:
        return False
    return static_fit(pod, n.labels, n.taints, False, workloads) is None


@dataclass(frozen=True, slots=True)
class Judged:
    """A candidate a pass kept, judged against the pass's starting rows, with what that depended on."""

    cand: Candidate
    since: float
    protected: bool
    kept: Kept
    fits: bool | None
    """The total-room filter's answer (None: the pass did not judge it that far)."""
    verdict: BudgetVerdict | None
    """The budget verdict (None: the pass did not judge it that far)."""


Destinations = tuple[list[Node], set[str], list[Node], dict[str, int], dict[str, int], dict[str, int], list[bool]]
"""(nodes, nodes being disrupted, destinations, nodes per pool not being disrupted, not launching, being disrupted,
whether each node is a destination): :attr:`PassMemo.destinations`."""


class PassMemo:
    """Carried by a caller from one :func:`~gpuscale.core.disruption.plan_disruption` call to the next (see the
    module docstring): the last pass's rows and total free room, its candidates by node, and the candidates it kept
    before deciding any action, with the inputs those verdicts shared."""

    __slots__ = (
        "budgets",
        "candidates",
        "counts",
        "destinations",
        "hits",
        "judged",
        "key",
        "made",
        "now",
        "order",
        "pools",
        "reused",
        "rows",
        "searched",
        "total",
        "verdicts",
    )

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.total: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.made: tuple[dict[str, Row], list[Node], list[str], list[Sequence[Pod] | None]] | None = None
        """(the rows :func:`rows_of` last made, their destination nodes and names in order, each one's pods as
        ``by_node`` gave them): its shortcut holds while those rows are :attr:`rows` (the pass that made them kept
        them) and the destinations are the same objects in the same order."""
        self.candidates: dict[str, CandidateMemo] = {}
        """Node name -> its candidate (or None) and what it was computed from (``find_candidates``' cache)."""
        self.judged: dict[str, Judged] = {}
        """Candidates the last pass kept while no action was decided yet (valid against :attr:`rows`)."""
        self.key: tuple[object, ...] = ()
        """Inputs every verdict shares that must be equal (pools, catalog, options, offerings unavailable now)."""
        self.now = -math.inf
        self.order: list[str] = []
        """The last pass's rows' names in order."""
        self.counts: dict[str, int] = {}
        """Nodes per pool not being disrupted (minNodes)."""
        self.budgets: dict[str, tuple[int, int]] = {}
        """Pool -> (its nodes, those being disrupted): a budget verdict's inputs besides the time."""
        self.destinations: Destinations | None = None
        """The last pass's nodes and nodes being disrupted, with its destinations, node counts per pool and whether
        each node is a destination (:func:`~gpuscale.core.disruption.plan.destinations`' cache)."""
        self.verdicts: dict[tuple[int, DisruptionReason, int, int], tuple[NodePool, BudgetVerdict]] = {}
        """(pool id, reason, its nodes, those being disrupted) -> (the pool, its budget verdict), for pools without
        scheduled budgets (:meth:`verdict`)."""
        self.searched: dict[
            str,
            tuple[Node, NodePool, DisruptionReason, float, list[Pod], tuple[object, ...], tuple[Replacement, ...]],
        ] = {}
        """Node name -> its last replacement search before any replacement was bought in its pass: (node, pool,
        reason, price, pods left over, the pass's memo key, the replacements found, possibly none)."""
        self.pools: tuple[tuple[NodePool, ...], dict[str, NodePool], bool] | None = None
        """(the last pass's pools, them by name, whether one has maxNodes or limits): reused for the same pool objects
        in the same order (a pool is never changed)."""
        self.hits = 0
        """Passes whose every candidate was kept as judged before (for tests and benchmarks)."""
        self.reused = 0
        """Candidates kept as judged before, over all passes."""

    def valid(
        self,
        now: float,
        key: tuple[object, ...],
        rows: dict[str, Row],
        changed: set[str],
        free_total: tuple[int, int, int, int],
        cands: Sequence[Candidate],
        since: Mapping[str, float],
        protected: Collection[str],
        verdict: Callable[[Candidate], BudgetVerdict],
        counts: Mapping[str, int],
        budgets: Mapping[str, tuple[int, int]],
        workloads: Mapping[str, Mapping[str, str]] | None,
    ) -> dict[str, Judged]:
        """The last pass's judged candidates this pass would judge the same while it decided no action yet (see the
        module docstring; ``changed``: the rows that differ from the last pass's)."""
        judged = self.judged
        if not judged or now < self.now or key != self.key:
            return {}
        if rows is self.rows:  # the very rows the last pass kept (never changed since): the same order
            order, reorder = self.order, False
        else:
            order = list(rows)
            reorder = order != self.order and [n for n in order if n not in changed] != [
                n for n in self.order if n not in changed
            ]  # the unchanged rows' order breaks best-fit ties: then only the rows some candidate pod may take count
        # each changed row before and after the change (a row none of a candidate's pods may take leaves it as judged)
        moved = [r for other in changed for r in (rows.get(other), self.rows.get(other)) if r is not None]
        out: dict[str, Judged] = {}
        for c in cands:
            name = c.node.name
            j = judged.get(name)
            if (
                j is None
                or (j.cand is not c and j.cand != c)
                or j.since != since[name]
                or j.protected != (name in protected)
            ):
                continue
            if name in changed:
                continue
            if moved and _any_may_take(moved, c.pods, workloads):
                continue
            if reorder and _takers(order, changed, rows, c, workloads) != _takers(
                self.order, changed, rows, c, workloads
            ):
                continue
            if j.fits is not None and fits_total(free_total, rows.get(name), c.pods) != j.fits:
                continue
            if j.verdict is not None:
                pool = c.pool  # a verdict reads the time only through scheduled budgets
                same = budgets.get(pool.name) == self.budgets.get(pool.name) and not _scheduled(pool)
                if not same and _blocks(verdict(c)) != _blocks(j.verdict):
                    continue
            if j.kept.reason is _MIN_NODES and counts.get(c.pool.name) != self.counts.get(c.pool.name):
                continue
            out[name] = j
        return out

    def verdict(self, pool: NodePool, reason: DisruptionReason, total: int, busy: int, now: float) -> BudgetVerdict:
        """:func:`~gpuscale.core.disruption.budgets.allowed_disruptions`; kept for a pool without scheduled budgets,
        whose verdict depends on its budgets, the reason and the two counts alone (the pool object, immutable, is
        kept with it: a key's id names that object only while it lives)."""
        if _scheduled(pool):
            return allowed_disruptions(pool, reason, total, busy, now)
        key = (id(pool), reason, total, busy)
        kept = self.verdicts.get(key)
        if kept is not None and kept[0] is pool:
            return kept[1]
        v = allowed_disruptions(pool, reason, total, busy, now)
        if len(self.verdicts) >= 1024:  # (counts vary slowly: a bound that is never reached in practice)
            self.verdicts.clear()
        self.verdicts[key] = (pool, v)
        return v

    def remember(
        self,
        now: float,
        key: tuple[object, ...],
        rows: dict[str, Row],
        free_total: tuple[int, int, int, int],
        judged: dict[str, Judged],
        counts: dict[str, int],
        budgets: dict[str, tuple[int, int]],
    ) -> None:
        """Keep this pass's rows, total and judged candidates (``key`` empty: none may be reused)."""
        if rows is not self.rows:  # (the same dict, never changed once made, keeps its order)
            self.order = list(rows)
        self.now, self.key, self.rows, self.total = now, key, rows, free_total
        self.judged = judged if key else {}
        self.counts, self.budgets = counts, budgets


def _any_may_take(rows: Sequence[Row], pods: Sequence[Pod], workloads: Mapping[str, Mapping[str, str]] | None) -> bool:
    """Whether one of ``rows`` may take one of ``pods`` (:func:`may_take`; a loop, not any() over a generator)."""
    for r in rows:
        for p in pods:
            if may_take(r, p, workloads):
                return True
    return False


def _scheduled(pool: NodePool) -> bool:
    for b in pool.disruption.budgets:  # noqa: SIM110 (a loop, not any() over a generator: asked per candidate per pass)
        if b.schedule is not None:
            return True
    return False


def _blocks(v: BudgetVerdict) -> DisruptionBudget | None:
    """What a pass reads of a budget verdict: the budget that blocks the candidate (None if none does)."""
    return v.budget if v.allowed is not None and v.allowed <= 0 else None


def _takers(
    order: Sequence[str],
    changed: Collection[str],
    rows: Mapping[str, Row],
    c: Candidate,
    workloads: Mapping[str, Mapping[str, str]] | None,
) -> list[str]:
    """The unchanged rows, in ``order``, that could take one of ``c``'s pods (other than its own)."""
    own = c.node.name
    return [n for n in order if n not in changed and n != own and any(may_take(rows[n], p, workloads) for p in c.pods)]


def fits_total(free_total: tuple[int, int, int, int], own: Row | None, pods: Collection[Pod]) -> bool:
    """The pass's first filter: ``pods``' total requests within the destinations' total free room less the node's
    own (each dimension; negative room counts as none)."""
    cpu = mem = gpu = 0
    for p in pods:
        r = p.request
        cpu += r.cpu_milli
        mem += r.memory_mib
        gpu += r.gpus * MILLI_PER_GPU + r.gpu_milli
    free_cpu, free_mem, free_gpu, free_slots = free_total
    if own is not None:  # (its own room, where positive, is not room for its pods)
        free_cpu -= own.cpu if own.cpu > 0 else 0
        free_mem -= own.mem if own.mem > 0 else 0
        free_gpu -= own.gpu if own.gpu > 0 else 0
        free_slots -= own.slots if own.slots > 0 else 0
    return cpu <= free_cpu and mem <= free_mem and gpu <= free_gpu and len(pods) <= free_slots
