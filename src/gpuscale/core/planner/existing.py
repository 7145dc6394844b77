"""Placement on the nodes the cluster already has: existing nodes first, then nodes being launched. While a GPR
is active (``Snapshot.workloads``) its nodes take only pods its ``workloadSelector`` matches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from operator import attrgetter

import numpy as np

from gpuscale.core.gpr.spec import GPR_LABEL
from gpuscale.core.model import Node, Pod, Snapshot
from gpuscale.core.planner.classes import PodClass, referenced_keys
from gpuscale.core.planner.context import Context
from gpuscale.core.predicates import static_failure
from gpuscale.core.scoring import SCORERS, Scorer, Workload, make_scorer, select
from gpuscale.core.state import ClusterState, IntArray, RowArena, occupied_row

_KEY = attrgetter("key")
_LAUNCHING_NAME = attrgetter("launching", "name")
"""Existing nodes before launching ones, then by name."""
_BOUND = ("Pending", "Running")
"""Phases of a pod bound to a node that take its room."""

_Row = tuple[Node, int, list[Pod]]

_ROWS: dict[int, tuple[RowArena, dict[str, _Row]]] = {}
"""Per GPU width, the rows the plans of that width built, in a :class:`~gpuscale.core.state.RowArena`, and per node
name the last one: (node, its slot, the pods bound to it in the snapshot's order; they are accounted in key order).
A row depends on nothing else (the node's allocatable and GPU model, the pods' requests, the width), so it is reused
while the node is the same object and its pods are equal in the same order (a controller plans again and again with
most nodes and their pods the same objects, listed in the same order; pods listed in another order only cost a new
row); a node whose row differs gets a new slot. Everything is forgotten once ``_ROWS_SIZE`` rows are stored."""
_ROWS_SIZE = 8192
_ROWS_LOCK = threading.Lock()


def _rows_table(width: int) -> tuple[RowArena, dict[str, _Row]]:
    """The arena and rows by node name of ``width`` (see ``_ROWS``)."""
    got = _ROWS.get(width)
    if got is None or got[0].size >= _ROWS_SIZE:
        if sum(a.size for a, _ in _ROWS.values()) >= _ROWS_SIZE:
            _ROWS.clear()
        got = _ROWS[width] = (RowArena(width), {})
    return got


class ExistingNodes:
    """The snapshot's nodes (existing before launching, then by name), which classes may use them, and the scorer
    that picks among the feasible ones."""

    def __init__(self, snapshot: Snapshot, scorer: str) -> None:
        self.snapshot = snapshot
        if scorer not in SCORERS:
            make_scorer(scorer)  # raises the KeyError naming the known scorers
        self._scorer_name = scorer
        self.scorer: Scorer | None = None
        """Made on first use (most plans place nothing on existing nodes, or on a lone candidate)."""
        self.nodes: list[Node] = sorted(snapshot.nodes, key=_LAUNCHING_NAME)
        self.names = [n.name for n in self.nodes]
        self.node_index = {name: i for i, name in enumerate(self.names)}
        self._launching_from: int | None = None
        """The first launching node's row (they come last; made on first use)."""
        self._rows_cache: dict[int, tuple[IntArray, IntArray]] = {}
        self._groups_cache: dict[tuple[str, ...], list[IntArray]] = {}
        self._all_rows: tuple[IntArray, IntArray] | None = None
        """(existing rows, launching rows) of all nodes, for the classes that may use every node."""
        self._scorer_ready = False
        self._pure_scores = not getattr(SCORERS[scorer], "draws", False)
        """The scorer's answers depend on its inputs alone (no random stream that a skipped call would not
        advance). Its ``prepare`` reads only the state's rows, capacities and GPU models, never the free capacity,
        so preparing it after some placements gives the same scorer."""
        self._rowwise = self._pure_scores and getattr(SCORERS[scorer], "rowwise", False)
        """Equal rows get equal scores, to the last bit, whatever was asked before (see ``_alike``)."""
        self.workloads = snapshot.workloads or None
        """The active GPRs' workload selectors (None: no GPR is active, the rule costs nothing)."""
        self._arena: RowArena | None = None
        self._slots: list[int] = []
        """The arena and slot of each row of the initial state (its rows as stored, before any placement)."""
        self._placed_rows: set[int] = set()
        """Rows a placement of this run changed (a gang's trial included): they may differ from their stored row."""

    def initial_state(self) -> ClusterState:
        """The nodes' free capacity after the pods already bound to them (rows remembered in ``_ROWS``)."""
        nodes = self.nodes
        index = self.node_index
        bound: list[list[Pod]] = [[] for _ in nodes]
        gangs = False
        for p in self.snapshot.pods:
            i = index.get(p.node_name)  # type: ignore[arg-type]
            if i is not None:
                if p.phase in _BOUND:
                    bound[i].append(p)
            elif p.gang and p.node_name is None and p.phase == "Pending":
                gangs = True
        width = max(max([n.allocatable.gpus for n in nodes], default=1), 1)
        slots: list[int] = []
        with _ROWS_LOCK:  # planners in other threads share the table: a slot is taken by one row only
            arena, rows = _rows_table(width)
            for n, pods in zip(nodes, bound, strict=True):
                row = rows.get(n.name)
                if row is None or row[0] is not n or row[2] != pods:
                    ordered = sorted(pods, key=_KEY) if len(pods) > 1 else pods  # accounted in key order
                    v, gpus = occupied_row(n.allocatable, width, [p.request for p in ordered])
                    row = rows[n.name] = (n, arena.add(v, gpus, n.gpu_model), pods)
                slots.append(row[1])
            state = arena.state(list(self.names), slots)  # == ClusterState.occupied(...) of these rows
        self._arena, self._slots = arena, slots
        self._placed_rows = set()
        self._scorer_ready = False
        if gangs:
            self._prepare_scorer(state)  # gang trials change the state before the first placement
        return state

    def _rows(self, cls: PodClass) -> tuple[IntArray, IntArray]:
        """Rows of existing and of launching nodes that pass the class's label/taint predicates."""
        cached = self._rows_cache.get(cls.index)
        if cached is not None:
            return cached
        pod = cls.example
        keys = referenced_keys(pod)
        if self.workloads:  # the class key tells apart pods the GPR rule treats differently; nodes by their GPR too
            keys = tuple(sorted({*keys, GPR_LABEL}))
        groups = self._node_groups(keys)
        nodes, workloads = self.nodes, self.workloads
        passing = []
        for rows in groups:
            n = nodes[rows[0]]
            if static_failure(pod, n.labels, n.taints, n.unschedulable, workloads) is None:
                passing.append(rows)
        if len(passing) == len(groups):  # the class may use every node (the common case): one split per plan
            if self._all_rows is None:
                k = self._launching_row()
                self._all_rows = (np.arange(k), np.arange(k, len(nodes)))
            result = self._all_rows
        else:
            ok = np.zeros(len(nodes), dtype=bool)
            for rows in passing:
                ok[rows] = True
            k = self._launching_row()
            result = (ok[:k].nonzero()[0], ok[k:].nonzero()[0] + k)  # nonzero()[0]: np.flatnonzero without a ravel
        self._rows_cache[cls.index] = result
        return result

    def _launching_row(self) -> int:
        """The row of the first launching node (the number of existing nodes): launching nodes sort last."""
        if self._launching_from is None:
            self._launching_from = next((i for i, n in enumerate(self.nodes) if n.launching), len(self.nodes))
        return self._launching_from

    def _node_groups(self, keys: tuple[str, ...]) -> list[IntArray]:
        """Node rows grouped by their labels on ``keys``, taints and cordon state (cached per key set)."""
        got = self._groups_cache.get(keys)
        if got is None:
            groups: dict[tuple[object, ...], list[int]] = {}
            for i, n in enumerate(self.nodes):
                sig = (
                    (tuple(n.labels.get(k) for k in keys), n.taints, n.unschedulable)
                    if keys
                    else (n.taints, n.unschedulable)
                )
                groups.setdefault(sig, []).append(i)
            got = [np.array(v, dtype=np.int64) for v in groups.values()]
            self._groups_cache[keys] = got
        return got

    def _prepare_scorer(self, state: ClusterState) -> None:
        """Give the scorer the cluster and the expected workload (all pending and running pods' requests)."""
        scoring_requests = [p.request for p in self.snapshot.pods if p.phase in ("Pending", "Running")]
        if self.scorer is None:
            self.scorer = make_scorer(self._scorer_name)
        self.scorer.prepare(state, Workload.from_requests(scoring_requests) if scoring_requests else None)
        self._scorer_ready = True

    def _alike(self, cand: IntArray) -> bool:
        """True if the candidate rows are still their stored rows and those are equal in every value, GPU column
        and GPU model. A ``rowwise`` scorer scores such rows alike, to the last bit, whatever it was asked before
        (:class:`~gpuscale.core.scoring.base.Scorer`), and ``select`` takes the first (on 676 of the 877 choices
        among several existing nodes of the openb replay, most of them launching nodes of one type: neither the
        scorer's preparation nor its scores are needed)."""
        rows = cand.tolist()
        if self._arena is None or not self._placed_rows.isdisjoint(rows):
            return False
        slots = self._slots
        with _ROWS_LOCK:
            return self._arena.alike([slots[r] for r in rows])

    def place(self, ctx: Context, pods: Sequence[Pod], class_of: Callable[[Pod], PodClass]) -> list[Pod]:
        """Place pods on existing, then launching nodes; return those left."""
        left: list[Pod] = []
        exhausted: set[tuple[int, int]] = set()
        for pod in pods:
            cls = class_of(pod)
            placed = False
            if (cls.index, 0) in exhausted and (cls.index, 1) in exhausted:
                left.append(pod)
                continue
            ok = ctx.state.fits(pod.request)  # over every row, once for both phases
            if not np.count_nonzero(ok):  # no row has room: the label/taint rows of the class need not be made
                exhausted.add((cls.index, 0))
                exhausted.add((cls.index, 1))
                left.append(pod)
                continue
            for phase, rows in enumerate(self._rows(cls)):
                if (cls.index, phase) in exhausted or rows.size == 0:
                    continue
                cand = rows[ok[rows]]
                if cand.size == 0:
                    exhausted.add((cls.index, phase))  # capacity only shrinks during planning
                    continue
                if cand.size == 1 and self._pure_scores:
                    i = int(cand[0])  # the scores of one candidate choose nothing: neither prepared nor asked
                elif self._rowwise and self._alike(cand):
                    i = int(cand[0])  # rows equal in every column score alike: the first wins, as in select
                else:
                    if not self._scorer_ready:  # prepared on first use: most plans place nothing on existing nodes
                        self._prepare_scorer(ctx.state)
                    assert self.scorer is not None
                    got = select(self.scorer, ctx.state, pod.request, cand)
                    assert got is not None
                    i = got
                ctx.state.place(pod.request, i)
                self._placed_rows.add(i)
                ctx.placements[pod.key] = self.nodes[i].name
                placed = True
                break
            if not placed:
                left.append(pod)
        return left
