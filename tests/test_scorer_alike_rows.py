"""Rows equal in every column score alike, and the planner's shortcut that rests on it changes no plan.

A ``rowwise`` scorer computes each row's score from that row alone by the same floating-point operations whatever
the other candidates (the :class:`~gpuscale.core.scoring.base.Scorer` contract): its scores do not depend on which
rows are asked together nor on what was asked before, so equal rows score alike to the last bit. With such a scorer
``ExistingNodes.place`` takes the first of candidate rows that are equal in every column without preparing or
asking the scorer, as ``select`` would (ties go to the first). ``RowArena.alike`` is checked against a comparison of
the stored rows."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node, pod
from gpuscale.core.model import Snapshot
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner.classes import PodClass
from gpuscale.core.planner.context import Context
from gpuscale.core.planner.driver import Planner
from gpuscale.core.planner.existing import ExistingNodes
from gpuscale.core.resources import Request, Resources
from gpuscale.core.scoring import SCORERS, Workload, make_scorer
from gpuscale.core.state import ClusterState, NodeShape, RowArena, occupied_row
from test_planner_properties import snapshots

_PURE = sorted(name for name, factory in SCORERS.items() if not getattr(factory(), "draws", False))
_ROWWISE = sorted(name for name in _PURE if getattr(SCORERS[name], "rowwise", False))

_requests = st.builds(
    Request,
    cpu_milli=st.sampled_from((0, 500, 2000, 6000)),
    memory_mib=st.sampled_from((0, 1024, 8192)),
    gpus=st.sampled_from((0, 0, 1, 2)),
)
_fractions = st.builds(
    Request, cpu_milli=st.sampled_from((500, 2000)), memory_mib=st.just(1024), gpu_milli=st.sampled_from((250, 500))
)
_any_request = st.one_of(_requests, _fractions)
_shape = st.tuples(st.sampled_from((0, 1, 2, 4)), st.sampled_from(("T4", "A100")))


def test_the_rowwise_scorers_are_the_planner_default_and_the_simulator_s() -> None:
    assert {"fill-frag", "best-fit"} <= set(_ROWWISE)
    assert not {"fgd", "fill-reserve", "fill-pair", "random"} & set(_ROWWISE)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(_shape, st.lists(_any_request, max_size=3)), min_size=1, max_size=4),
    st.lists(st.integers(0, 3), min_size=2, max_size=8),
    st.lists(_any_request, min_size=1, max_size=6),
    st.lists(_any_request, min_size=1, max_size=3),
    st.randoms(use_true_random=False),
)
def test_rowwise_scores_depend_on_the_row_alone(
    kinds: list[tuple[tuple[int, str], list[Request]]],
    picks: list[int],
    workload: list[Request],
    requests: list[Request],
    rng: random.Random,
) -> None:
    """A state whose rows repeat a few kinds (shape and bound pods): a rowwise scorer gives every row the same score,
    bit for bit, whether asked about all candidates at once, about a few of them, or after placements elsewhere; and
    equal rows get equal scores."""
    rows = [kinds[i % len(kinds)] for i in picks]
    shapes = [
        NodeShape(f"n{i}", Resources(16000, 65536, gpus, 110), model if gpus else None)
        for i, ((gpus, model), _) in enumerate(rows)
    ]
    state = ClusterState(shapes)
    state.occupy_all([bound for _, bound in rows])
    for name in _ROWWISE:
        history, fresh = make_scorer(name), make_scorer(name)
        history.prepare(state, Workload.from_requests(workload))
        live = state.copy()
        for req in requests:
            cand = np.flatnonzero(live.fits(req)).astype(np.int64)
            if cand.size == 0:
                continue
            whole = history.score(live, req, cand)
            some = np.array(sorted(rng.sample(cand.tolist(), rng.randint(1, cand.size))), dtype=np.int64)
            fresh.prepare(live, Workload.from_requests(workload))
            alone = fresh.score(live, req, some)
            assert whole[np.searchsorted(cand, some)].tobytes() == alone.tobytes(), name
            assert history.score(live, req, some).tobytes() == alone.tobytes(), name
            changed = placed_rows(live, state)
            by_kind: dict[object, float] = {}  # rows no placement changed, by kind: equal rows
            for r, sc in zip(cand.tolist(), whole.tolist(), strict=True):
                if r not in changed:
                    assert by_kind.setdefault((rows[r][0], tuple(rows[r][1])), sc) == sc, name
            live.place(req, int(cand[rng.randrange(cand.size)]))


def placed_rows(live: ClusterState, start: ClusterState) -> set[int]:
    """Rows whose free capacity differs from ``start`` (they are no longer of their kind)."""
    changed = (live.cpu_free != start.cpu_free) | (live.mem_free != start.mem_free)
    changed |= (live.gpu_free != start.gpu_free).any(axis=1)
    return set(np.flatnonzero(changed).tolist())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(_shape, st.lists(_any_request, max_size=2)), min_size=1, max_size=8),
    st.lists(st.integers(0, 7), min_size=1, max_size=6),
)
def test_arena_alike_is_the_comparison_of_the_stored_rows(
    rows: list[tuple[tuple[int, str], list[Request]]], picks: list[int]
) -> None:
    arena = RowArena(4, capacity=2)  # grows while rows are added
    stored = []
    for (gpus, model), bound in rows:
        values, gpu_row = occupied_row(Resources(16000, 65536, gpus, 110), 4, bound)
        stored.append((values, tuple(gpu_row), model if gpus else None))
        arena.add(values, gpu_row, model if gpus else None)
    slots = [p % len(rows) for p in picks]
    assert arena.alike(slots) == (len({stored[s] for s in slots}) == 1)


@st.composite
def _twins(draw: st.DrawFn) -> Snapshot:
    """A random snapshot with each node repeated under other names (some launching): rows that are alike."""
    s = draw(snapshots())
    nodes = []
    for n in s.nodes:
        for k in range(draw(st.integers(1, 3))):
            twin = replace(n, name=f"{n.name}-{k}", launching=draw(st.booleans()))
            nodes.append(replace(twin, labels={**n.labels, "kubernetes.io/hostname": twin.name}))
    return replace(s, nodes=tuple(nodes))


@settings(max_examples=150, deadline=None)
@given(_twins(), st.sampled_from(_PURE))
def test_the_planner_takes_the_first_of_alike_rows_as_the_scorer_would(s: Snapshot, scorer: str) -> None:
    """The plan with the shortcut equals the plan that asks the scorer for every choice among several rows (the
    shortcut is taken with rowwise scorers only: fill-pair's matrix products once chose the third of three equal
    rows, a few ulps apart, after its per-row caches were filled in other batches)."""
    config = PlannerConfig(scorer=scorer)
    got = Planner(s, config, 0.0).run()
    asked = Planner(s, config, 0.0)
    asked.existing._alike = lambda cand: False  # type: ignore[method-assign]
    assert got == asked.run()


def test_alike_rows_are_no_longer_alike_once_one_took_a_pod() -> None:
    """A row a placement of the run changed is not its stored row: the shortcut then asks the scorer."""
    s = Snapshot(nodes=tuple(node(f"n{i}", 8000, 32768, 2, "T4") for i in range(3)))
    existing = ExistingNodes(s, "fill-frag")
    state = existing.initial_state()
    cand = np.arange(3, dtype=np.int64)
    assert existing._alike(cand)
    ctx = Context(state, {}, {}, [], {}, [])
    p = pod("p", cpu=1000, gpus=1)
    cls = PodClass(0, p, key=("k",))
    assert existing.place(ctx, [p], lambda _: cls) == []
    assert ctx.placements == {p.key: "n0"}
    assert not existing._alike(cand)
    assert existing._alike(np.array([1, 2], dtype=np.int64))
