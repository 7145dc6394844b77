"""``select`` and the shared scorer features: a lone candidate wins without asking a scorer that does not draw, and
every scorer's run over a random placement sequence is the same whether lone candidates are scored or not."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.core.resources import Request, Resources
from gpuscale.core.scoring import SCORERS, make_scorer, select
from gpuscale.core.scoring.features import gpu_left
from gpuscale.core.state import ClusterState, FloatArray, IntArray, NodeShape


class CountingScorer:
    """Scores rows by minus their index and counts how often it is asked."""

    name = "counting"

    def __init__(self, draws: bool = False) -> None:
        self.draws = draws
        self.asked = 0

    def prepare(self, state: ClusterState, workload: object) -> None:
        pass

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        self.asked += 1
        out: FloatArray = -candidates.astype(np.float64)
        return out


def _state() -> ClusterState:
    return ClusterState(
        [
            NodeShape(f"n{i}", Resources(cpu_milli=8000, memory_mib=32768, gpus=g), "T4" if g else None)
            for i, g in enumerate([0, 1, 2, 4, 8])
        ]
    )


def test_lone_candidate_is_not_scored_unless_the_scorer_draws() -> None:
    st, req = _state(), Request(cpu_milli=100)
    quiet, drawing = CountingScorer(), CountingScorer(draws=True)
    assert select(quiet, st, req, np.array([3], dtype=np.int64)) == 3
    assert quiet.asked == 0
    assert select(drawing, st, req, np.array([3], dtype=np.int64)) == 3
    assert drawing.asked == 1
    assert select(quiet, st, req, np.array([], dtype=np.int64)) is None
    assert select(quiet, st, req, np.array([2, 4], dtype=np.int64)) == 2
    assert quiet.asked == 1


def _run(name: str, seed: int, score_lone: bool) -> list[int | None]:
    """Place random requests one by one on a random cluster, each on the row ``select`` picks among the rows it
    fits (scoring lone candidates too when ``score_lone``); the chosen rows."""
    rng = np.random.default_rng(seed)
    shapes = [
        NodeShape(
            f"n{i}",
            Resources(int(rng.integers(4, 64)) * 1000, int(rng.integers(8, 256)) * 1024, int(g)),
            ("T4", "V100")[i % 2] if g else None,
        )
        for i, g in enumerate(rng.choice([0, 1, 2, 4, 8], size=12))
    ]
    st = ClusterState(shapes)
    scorer = make_scorer(name)
    scorer.prepare(st, None)
    chosen: list[int | None] = []
    for _ in range(150):
        kind = rng.integers(0, 3)
        cpu, mem = int(rng.integers(100, 16000)), int(rng.integers(128, 65536))
        if kind == 0:
            req = Request(cpu_milli=cpu, memory_mib=mem)
        elif kind == 1:
            req = Request(cpu_milli=cpu, memory_mib=mem, gpu_milli=int(rng.integers(50, 1000)))
        else:
            req = Request(cpu_milli=cpu, memory_mib=mem, gpus=int(rng.integers(1, 4)))
        cands = np.flatnonzero(st.fits(req)).astype(np.int64)
        if score_lone and cands.size == 1:
            scores = scorer.score(st, req, cands)  # what select did before lone candidates were skipped
            got: int | None = int(cands[int(np.argmax(scores))])
        else:
            got = select(scorer, st, req, cands)
        chosen.append(got)
        if got is not None:
            st.place(req, got)
    return chosen


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_skipping_lone_candidates_changes_no_choice(name: str) -> None:
    for seed in range(3):
        assert _run(name, seed, score_lone=False) == _run(name, seed, score_lone=True)


def test_gpu_left_is_the_free_milli_gpu_with_absent_slots_as_zero() -> None:
    st = _state()
    st.place(Request(gpu_milli=300), 2)
    st.place(Request(gpus=2), 3)
    rows = np.array([0, 2, 3, 4], dtype=np.int64)
    got = gpu_left(st, rows)
    g = st.gpu_free[rows]
    assert got.dtype == np.int64
    assert (got == np.where(g > 0, g, 0)).all()
