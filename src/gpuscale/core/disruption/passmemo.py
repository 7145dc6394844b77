"""What one disruption pass hands the next: the destination rows it built and, after a pass that kept every
candidate, proof material that the next pass would keep them all again (:class:`PassMemo`).

A caller that runs :func:`~gpuscale.core.disruption.plan_disruption` round after round over a cluster that changes
a little passes one :class:`PassMemo` to every call. The results are those of a pass without it:

- **rows** (:class:`Row`): each destination node's free room with its bound pods (CPU, memory, milli-GPU, pod
  slots; per-GPU free milli-GPU, entirely free GPUs, the largest free share), reused while the node object and its
  bound pods are the same (equal, in the same order; anything else builds the row again).
- **the last all-kept pass** (:class:`KeptPass`): a pass whose every candidate was kept (no action, none waiting out
  consolidateAfter) is returned again when the new pass provably decides the same. With no action, no candidate's
  evaluation changes the simulated cluster, so each candidate is judged alone against the pass's starting rows:
  its node, pods, reason, price and clock (:class:`~gpuscale.core.disruption.values.Candidate`, ``since``), the
  protected, disrupting and candidate sets, the pools' node counts, the budgets' verdicts, the offerings available
  now (and the pools' totals when a pool has maxNodes or limits) decide everything except where its pods fit. Where
  they fit is the best-fit packing over the rows, after two cheap filters (the total free room, and some pod fitting
  some row). So the result holds when, besides the equal inputs above, the total-room filter gives the same answer
  and every row that changed (new, gone or with other room) could take none of the candidate's pods, before or
  after the change: such a row is never chosen, the other rows are the same in the same order, so the packing
  places every pod as before and leaves the same pods over. Rows taking pods only ever lose room during a packing,
  so "could take none" is judged on the row as it stands.

Passes with PodDisruptionBudgets are never reused (their allowances count every pod in the cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuscale.core.disruption.candidates import CandidateMemo
from gpuscale.core.disruption.values import BudgetVerdict, Candidate, DisruptionPlan, KeepReason
from gpuscale.core.model import DisruptionBudget, Node, NodePool, Pod
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import MILLI_PER_GPU
from gpuscale.core.state import fresh_gpu_row


@dataclass(frozen=True, slots=True, eq=False)
class Row:
    """A destination node's room with its bound pods (free CPU, memory and milli-GPU may be negative when
    overcommitted), as a pass accounts it. Compared by identity: a row reused from the last pass is the same
    object."""

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


def build_row(node: Node, pods: Sequence[Pod]) -> Row:
    """The row of ``node`` with its live bound ``pods`` (in order)."""
    a = node.allocatable
    cpu, mem, gpu = a.cpu_milli, a.memory_mib, a.gpus * MILLI_PER_GPU
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
    pos = (max(0, cpu), max(0, mem), max(0, gpu), max(0, slots))
    return Row(node, pods, cpu, mem, gpu, slots, g_row, full, top, pos)


def rows_of(
    dest: Sequence[Node], by_node: Mapping[str, Sequence[Pod]], memo: PassMemo | None
) -> tuple[dict[str, Row], set[str], tuple[int, int, int, int]]:
    """The rows of ``dest`` (by name, in order), the rows that differ from ``memo``'s last ones (new, gone or
    rebuilt) and the total free room (the sum of ``pos``). A row is reused while its node is the same object and its
    pods are equal, in the same order."""
    out: dict[str, Row] = {}
    cached = memo.rows if memo is not None else {}
    get = cached.get
    changed: set[str] = set()
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


@dataclass(slots=True)
class KeptPass:
    """The last pass that kept every candidate, with what its result depended on."""

    now: float
    key: tuple[object, ...]
    """Inputs that must be equal (pools, catalog, options, protected candidates, offerings unavailable now)."""
    order: list[str]
    """The destination rows' names in order."""
    cands: list[Candidate]
    since: dict[str, float]
    fits: dict[str, bool]
    """Candidate -> the total-room filter's answer (candidates the pass judged that far)."""
    verdicts: dict[str, BudgetVerdict]
    """Candidate -> the budget verdict (candidates the pass judged that far)."""
    counts: dict[str, int]
    """Nodes per pool not being disrupted (minNodes)."""
    budgets: dict[str, tuple[int, int]]
    """Pool -> (its nodes, those being disrupted): a budget verdict's inputs besides the time."""
    plan: DisruptionPlan


class PassMemo:
    """Carried by a caller from one :func:`~gpuscale.core.disruption.plan_disruption` call to the next (see the
    module docstring): the last pass's rows and total free room, its candidates by node, and that pass if it kept
    every candidate."""

    __slots__ = ("candidates", "hits", "kept", "rows", "total")

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.total: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.candidates: dict[str, CandidateMemo] = {}
        """Node name -> its candidate (or None) and what it was computed from (``find_candidates``' cache)."""
        self.kept: KeptPass | None = None
        self.hits = 0
        """Passes answered from the last all-kept pass (for tests and benchmarks)."""

    def recall(
        self,
        now: float,
        key: tuple[object, ...],
        rows: dict[str, Row],
        changed: set[str],
        free_total: tuple[int, int, int, int],
        cands: Sequence[Candidate],
        since: Mapping[str, float],
        verdict: Callable[[Candidate], BudgetVerdict],
        counts: Mapping[str, int],
        budgets: Mapping[str, tuple[int, int]],
        workloads: Mapping[str, Mapping[str, str]] | None,
    ) -> DisruptionPlan | None:
        """The last all-kept pass's plan if this pass provably decides the same, else None (see the module
        docstring; ``changed``: the rows that differ from the last pass's)."""
        last = self.kept
        if last is None or now < last.now or key != last.key or cands != last.cands:
            return None
        for c in cands:
            name = c.node.name
            if since[name] != last.since[name] or name in changed:
                return None
            for other in changed:
                for r in (rows.get(other), self.rows.get(other)):
                    if r is not None and any(may_take(r, p, workloads) for p in c.pods):
                        return None
        order = list(rows)
        if order != last.order and [n for n in order if n not in changed] != [
            n for n in last.order if n not in changed
        ]:  # the unchanged rows' order breaks best-fit ties: the same among the rows some candidate pod may take?
            for c in cands:
                if _takers(order, changed, rows, c, workloads) != _takers(last.order, changed, rows, c, workloads):
                    return None
        for c in cands:
            name = c.node.name
            fits = last.fits.get(name)
            if fits is not None and fits_total(free_total, rows.get(name), c.pods) != fits:
                return None
            v = last.verdicts.get(name)
            if v is not None:
                pool = c.pool  # a verdict reads the time only through scheduled budgets
                same = budgets.get(pool.name) == last.budgets.get(pool.name) and not _scheduled(pool)
                if not same and _blocks(verdict(c)) != _blocks(v):
                    return None
        if counts != last.counts and any(k.reason is KeepReason.MIN_NODES for k in last.plan.kept):
            return None
        self.hits += 1
        self.rows, self.total = rows, free_total
        last.now, last.order, last.counts, last.budgets = now, order, dict(counts), dict(budgets)
        return DisruptionPlan(last.plan.actions, last.plan.kept, {c.node.name: since[c.node.name] for c in cands})

    def remember(self, rows: dict[str, Row], free_total: tuple[int, int, int, int], kept: KeptPass | None) -> None:
        """Keep this pass's rows and total, and the pass itself if it kept every candidate (``kept``)."""
        self.rows, self.total, self.kept = rows, free_total, kept


def _scheduled(pool: NodePool) -> bool:
    return any(b.schedule is not None for b in pool.disruption.budgets)


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
    o = (own.cpu, own.mem, own.gpu, own.slots) if own is not None else (0, 0, 0, 0)
    need = (cpu, mem, gpu, len(pods))
    return all(need[k] <= free_total[k] - max(0, o[k]) for k in range(4))
