"""The small integer programs answered without the solver: whenever :func:`unique_optimum` answers, HiGHS (as the
planner calls it) returns the very same solution; it declines near ties, infeasible programs and other row shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.planner.smallip import unique_optimum

scipy_optimize = pytest.importorskip("scipy.optimize")


def _highs(
    cost: np.ndarray, matrix: np.ndarray, lo: np.ndarray, hi: np.ndarray, upper: np.ndarray
) -> np.ndarray | None:
    res = scipy_optimize.milp(
        c=cost,
        constraints=scipy_optimize.LinearConstraint(matrix, lo, hi),
        integrality=np.ones(cost.size),
        bounds=scipy_optimize.Bounds(np.zeros(cost.size), upper),
        options={"time_limit": 2.0, "presolve": True},
    )
    return None if res.x is None else np.round(res.x).astype(int)


@st.composite
def programs(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
    ncol = draw(st.integers(1, 8))
    classes = draw(st.integers(1, 3))
    prices = draw(
        st.lists(st.sampled_from((0.17, 0.26, 0.33, 0.5, 0.66, 0.84, 1.0, 1.53)), min_size=ncol, max_size=ncol)
    )
    cover = [draw(st.lists(st.integers(0, 3), min_size=ncol, max_size=ncol)) for _ in range(classes)]
    demand = draw(st.lists(st.integers(1, 4), min_size=classes, max_size=classes))
    rows, lo, hi = [list(map(float, r)) for r in cover], [float(d) for d in demand], [np.inf] * classes
    if draw(st.booleans()):  # a pool with maxNodes
        rows.append([1.0] * ncol)
        lo.append(-np.inf)
        hi.append(float(draw(st.integers(0, 5))))
    upper = np.full(ncol, float(max(demand)))
    return np.array(prices), np.array(rows), np.array(lo), np.array(hi), upper


@settings(max_examples=150, deadline=None)
@given(programs())
def test_an_answer_is_the_solvers_answer(program: tuple[np.ndarray, ...]) -> None:
    got = unique_optimum(*program)
    if got is not None:
        want = _highs(*program)
        assert want is not None
        assert got.tolist() == want.tolist()


def test_clear_optimum_is_answered() -> None:
    # two classes: one node holding both ($0.33) beats one node each ($0.17 + $0.17)
    cost = np.array([0.17, 0.17, 0.33])
    matrix = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    got = unique_optimum(cost, matrix, np.array([1.0, 1.0]), np.array([np.inf, np.inf]), np.ones(3))
    assert got is not None and got.tolist() == [0, 0, 1]


@pytest.mark.parametrize(
    ("cost", "why"),
    [
        ([0.2, 0.2], "two columns tie exactly"),
        ([0.2, 0.20001], "within the relative gap"),
    ],
)
def test_near_ties_go_to_the_solver(cost: list[float], why: str) -> None:
    got = unique_optimum(np.array(cost), np.array([[1.0, 1.0]]), np.array([1.0]), np.array([np.inf]), np.ones(2))
    assert got is None, why


def test_infeasible_and_other_shapes_go_to_the_solver() -> None:
    one = np.array([[1.0]])
    assert unique_optimum(np.array([1.0]), one, np.array([3.0]), np.array([np.inf]), np.ones(1)) is None  # too few
    assert unique_optimum(np.array([1.0]), one, np.array([1.0]), np.array([2.0]), np.ones(1)) is None  # two-sided
    assert unique_optimum(np.array([1.0]), -one, np.array([-np.inf]), np.array([1.0]), np.ones(1)) is None
    assert unique_optimum(np.array([0.0]), one, np.array([1.0]), np.array([np.inf]), np.ones(1)) is None  # free


def test_wide_programs_go_to_the_solver() -> None:
    n = 2000
    cost = np.linspace(1.0, 2.0, n)
    got = unique_optimum(cost, np.ones((1, n)), np.array([1.0]), np.array([np.inf]), np.ones(n))
    assert got is None
