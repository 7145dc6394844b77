"""The planner's shortcuts and memos change speed, never plans: each one switched off (or its memo emptied) gives
the same plan on random snapshots (pools bounded or not, several classes, gangs, existing nodes)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import itype, node, pod, pool
from gpuscale.core.model import Catalog, Snapshot
from gpuscale.core.plan import PlannerConfig, ScaleUpPlan
from gpuscale.core.planner import driver, existing, milp, packer
from gpuscale.core.resources import Request
from gpuscale.core.scoring import Scorer, base, fillfrag, make_scorer, select
from gpuscale.core.scoring.fillfrag import FillFrag
from gpuscale.core.state import ClusterState, IntArray
from test_planner_properties import snapshots

CONFIGS = (PlannerConfig(), PlannerConfig(exact_solver=False, scorer="best-fit"))


class _AlwaysAsked(FillFrag):
    """fill-frag, marked as drawing: the planner then asks it about every candidate set, even of one node."""

    draws = True


def _slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch every shortcut off: memos always recompute, single candidates are scored, all pool totals counted."""
    for memo in (packer._ALONE, base._WORKLOADS, fillfrag._WASTE_MODELS):
        monkeypatch.setattr(memo, "get", lambda make, values=(), objects=(): make())
    monkeypatch.setattr(driver, "unbounded", lambda _pool: False)
    monkeypatch.setattr(milp, "_cover_cost", lambda *_: -math.inf)
    monkeypatch.setattr(milp, "unique_optimum", lambda *_: None)
    monkeypatch.setattr(existing, "make_scorer", lambda name: _AlwaysAsked() if name == "fill-frag" else _make(name))


_make = make_scorer


def _plans(s: Snapshot) -> list[ScaleUpPlan]:
    return [driver.plan(s, cfg, 0.0) for cfg in CONFIGS]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_shortcuts_never_change_a_plan(s: Snapshot) -> None:
    fast = _plans(s)
    again = _plans(s)  # memos warm
    with pytest.MonkeyPatch.context() as mp:
        _slow(mp)
        slow = _plans(s)
    assert fast == again == slow


def _cluster(free_nodes: int) -> Snapshot:
    cat = Catalog(
        "c",
        (
            itype("small", 8, 32, 1, "T4", price=0.5, zones=("z1",)),
            itype("big", 32, 128, 4, "T4", price=1.7, zones=("z1",)),
        ),
    )
    nodes = [node(f"n{i}", 8000, 32768, 1, "T4", pool="p") for i in range(free_nodes)]
    busy = [pod(f"b{i}", 4000, 1024, milli=600, node=f"n{i}") for i in range(free_nodes)]
    pending = [pod(f"q{i}", 2000, 1024, milli=300) for i in range(3)]
    return Snapshot(tuple(busy + pending), tuple(nodes), (pool("p"),), cat)


@pytest.mark.parametrize("free_nodes", [0, 1, 2, 5])
def test_one_candidate_node_is_taken_without_scoring(free_nodes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One node left that fits: the pod goes there and the scorer is neither prepared nor asked; several: it is."""
    s = _cluster(free_nodes)
    asked: list[int] = []
    real_select = select

    def counting(scorer: Scorer, state: ClusterState, req: Request, cand: IntArray) -> int | None:
        asked.append(int(cand.size))
        return real_select(scorer, state, req, cand)

    monkeypatch.setattr(existing, "select", counting)
    fast = driver.plan(s, PlannerConfig(), 0.0)
    assert all(n > 1 for n in asked)
    with pytest.MonkeyPatch.context() as mp:
        _slow(mp)
        assert driver.plan(s, PlannerConfig(), 0.0) == fast
    on_nodes = sum(1 for v in fast.placements.values() if v.startswith("n"))
    assert on_nodes == min(free_nodes, 3)


def test_workload_memo_gives_the_same_object_for_the_same_counts() -> None:
    a, b = pod("a", 1000, 1024, milli=500).request, pod("b", 2000, 1024, gpus=1).request
    w1 = base.Workload.from_requests([a, b, a])
    w2 = base.Workload.from_requests([b, a, a])
    assert w1 is w2
    assert w1 == base._ranked({a: 2, b: 1}, 64)
    assert base.Workload.from_requests([a, b, b]) != w1


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.1, 5.0), st.integers(0, 3), st.integers(0, 3)).filter(lambda c: c[1] or c[2]),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 3),
    st.integers(1, 3),
)
def test_cover_cost_is_the_least_cost_of_any_cover(cols: list[tuple[float, int, int]], d0: int, d1: int) -> None:
    """The integer program's skip bound: the exact least cost of copies of the columns holding the demand."""
    columns = [(price, {0: a, 1: b}) for price, a, b in cols]
    best = math.inf
    for counts in itertools.product(range(d0 + d1 + 1), repeat=len(cols)):
        if (
            sum(n * a for n, (_, a, _) in zip(counts, cols, strict=True)) >= d0
            and sum(n * b for n, (_, _, b) in zip(counts, cols, strict=True)) >= d1
        ):
            best = min(best, sum(n * price for n, (price, _, _) in zip(counts, cols, strict=True)))
    got = milp._cover_cost(columns, [0, 1], {0: d0, 1: d1})
    assert got == pytest.approx(best) if math.isfinite(best) else got == math.inf


def test_cover_cost_gives_no_bound_on_large_demands() -> None:
    assert milp._cover_cost([(1.0, {0: 1})], [0], {0: 5000}) == -math.inf
