"""The placement scorer interface.

A scorer ranks candidate nodes for one request. The planner, the scheduling simulation and the openb benchmark all
call scorers through this interface, so a scorer written once is used everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuscale.core.memo import Memo
from gpuscale.core.resources import Request
from gpuscale.core.state import ClusterState, FloatArray, IntArray


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """One kind of request in the expected workload, with its share of arrivals (weights sum to 1)."""

    request: Request
    weight: float


@dataclass(frozen=True, slots=True)
class Workload:
    """The expected distribution of requests (used by fragmentation-aware scorers)."""

    classes: tuple[WorkloadClass, ...]

    @staticmethod
    def from_requests(requests: Sequence[Request], top: int = 64) -> Workload:
        """Empirical distribution of ``requests``, keeping the ``top`` most frequent shapes (the same object for the
        same counts while memoised, so that scorers can memoise what they derive from it by identity)."""
        counts: dict[Request, int] = {}
        for r in requests:
            counts[r] = counts.get(r, 0) + 1
        return _WORKLOADS.get(lambda: _ranked(counts, top), (frozenset(counts.items()), top))


def _ranked(counts: dict[Request, int], top: int) -> Workload:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], _sort_key(kv[0])))[:top]
    total = sum(c for _, c in ranked) or 1
    return Workload(tuple(WorkloadClass(r, c / total) for r, c in ranked))


_WORKLOADS: Memo[Workload] = Memo(1024)
"""Workloads by their request counts (the ranking depends on nothing else): a controller plans again and again with
the same pods pending and running."""


def _sort_key(r: Request) -> tuple[int, int, int, int, str]:
    return (r.gpus, r.gpu_milli, r.cpu_milli, r.memory_mib, "|".join(sorted(r.gpu_models or ())))


class Scorer(Protocol):
    """Ranks candidate nodes for a request; higher scores are better.

    ``prepare`` is called once before a run with the cluster and the expected workload (it may precompute);
    ``score`` returns one float per entry of ``candidates`` (row indices where the request fits). Ties are broken by
    the caller toward the lowest row index, which keeps every run deterministic. ``prepare`` reads only the state's
    rows, capacities and GPU models (not its free capacity). A scorer whose ``score`` advances a random stream has a
    true ``draws`` attribute; for any other, a caller may skip asking about a single candidate. The score of a
    candidate depends on its row's values (capacities, free capacity, GPU columns, GPU model) and the rest of the
    state, never on its index. A scorer with a true ``rowwise`` attribute also computes each row's score from that
    row alone by the same floating-point operations whatever the other candidates, so that rows equal in every
    column score alike to the last bit after any history of calls, and a caller may take the first of them without
    asking (the planner does; tests/test_scorer_alike_rows.py). Scorers whose matrix products mix rows in
    batch-dependent order (fgd, fill-reserve, fill-pair) may score equal rows a few ulps apart once their per-row
    caches were filled in different batches, so they are not ``rowwise``.
    """

    name: str

    def prepare(self, state: ClusterState, workload: Workload | None) -> None: ...

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray: ...


def select(scorer: Scorer, state: ClusterState, req: Request, candidates: IntArray) -> int | None:
    """The best candidate row for ``req`` by ``scorer`` (first on ties), or None if there is none.

    A lone candidate wins without asking the scorer, unless the scorer ``draws`` (its random stream must advance as
    if it were asked): the simulator's scheduler has one candidate in 62 % of its choices on the openb replay.
    """
    if candidates.size <= 1:
        if candidates.size == 0:
            return None
        if not getattr(scorer, "draws", False):
            return int(candidates[0])
    scores = scorer.score(state, req, candidates)
    return int(candidates[int(scores.argmax())])  # the method: np.argmax's Python-level dispatch skipped
