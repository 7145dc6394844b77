"""A small integer program's answer without the solver, when the answer is beyond doubt.

The planner's integer programs (:mod:`gpuscale.core.planner.milp`) are covering programs: minimise ``cost @ x`` over
integer ``0 <= x <= upper`` with rows ``matrix @ x >= lo`` (pods of a class to hold) and ``matrix @ x <= hi`` (a
pool's room), every coefficient and price non-negative. A replay's programs are tiny (a few classes, a few pods),
yet solving one needs SciPy, whose import alone costs far more than the solve. :func:`unique_optimum` enumerates the
solutions whose cost is near the least (branch and bound over the columns in order) and answers only when exactly
one solution is within the solver's stopping gaps of the optimum: the solver (HiGHS, relative gap 1e-4, absolute gap
1e-6) stops at a solution at most that far above the optimum, so it can return no other. Otherwise (several near
ties, an infeasible program, a program too large to enumerate or with more than :data:`MAX_COLUMNS` columns, or rows
of another shape) it answers None and the caller runs the solver.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

REL_GAP = 2e-4
"""Twice HiGHS's default relative MIP gap (1e-4): solutions this close to the optimum count as ties."""
ABS_GAP = 1e-5
"""Ten times HiGHS's default absolute MIP gap (1e-6)."""
NODE_LIMIT = 20_000
"""Branch-and-bound nodes before giving up (the solver then runs)."""
MAX_COLUMNS = 200
"""Larger programs go to the solver (the search recurses once per column)."""


def unique_optimum(
    cost: npt.NDArray[np.float64],
    matrix: npt.NDArray[np.float64],
    lo: npt.NDArray[np.float64],
    hi: npt.NDArray[np.float64],
    upper: npt.NDArray[np.float64],
) -> npt.NDArray[np.int64] | None:
    """The program's optimal ``x`` when it is the only solution within :data:`REL_GAP` / :data:`ABS_GAP` of the
    optimum, else None (see the module docstring)."""
    ncol = cost.size
    if (
        ncol == 0
        or ncol > MAX_COLUMNS
        or matrix.shape[1] != ncol
        or (matrix < 0).any()
        or (cost <= 0).any()
        or (upper < 0).any()
    ):
        return None
    cover_rows: list[int] = []
    pack_rows: list[int] = []
    for r in range(matrix.shape[0]):
        if lo[r] > 0:  # a class's pods to hold
            if np.isfinite(hi[r]):
                return None
            cover_rows.append(r)
        elif np.isfinite(hi[r]):  # a pool's room (coefficients are not negative: a lower bound <= 0 always holds)
            pack_rows.append(r)
    if (matrix[cover_rows] != np.round(matrix[cover_rows])).any() or (upper != np.round(upper)).any():
        return None
    prices = [float(c) for c in cost]
    bounds = [int(u) for u in upper]
    cover = [[int(v) for v in matrix[r]] for r in cover_rows]
    pack = [[float(v) for v in matrix[r]] for r in pack_rows]
    need0 = [math.ceil(float(lo[r])) for r in cover_rows]
    room0 = [float(hi[r]) for r in pack_rows]
    # the least price per unit of each cover row among columns j.. (a lower bound of what the rest must spend)
    per_unit = [[math.inf] * (ncol + 1) for _ in cover]
    for i, row in enumerate(cover):
        for j in range(ncol - 1, -1, -1):
            unit = prices[j] / row[j] if row[j] > 0 else math.inf
            per_unit[i][j] = min(unit, per_unit[i][j + 1])

    found: list[tuple[float, list[int]]] = []
    best = [math.inf]
    nodes = [0]
    counts = [0] * ncol

    def limit() -> float:
        return best[0] * (1 + REL_GAP) + ABS_GAP

    def search(j: int, spent: float, need: list[int], room: list[float]) -> bool:
        """False if the node limit was reached."""
        nodes[0] += 1
        if nodes[0] > NODE_LIMIT:
            return False
        if not any(need):
            best[0] = min(best[0], spent)
            found.append((spent, list(counts)))
            return True
        if j == ncol:
            return True
        floor = max(n * per_unit[i][j] for i, n in enumerate(need))
        if spent + floor > limit():
            return True
        col = [row[j] for row in cover]
        use = [row[j] for row in pack]
        most = bounds[j]
        if not any(col):
            most = 0  # a column that covers nothing only adds cost
        for n in range(most, -1, -1):
            left = [room[i] - n * u for i, u in enumerate(use)]
            if any(v < -1e-9 for v in left):
                continue
            counts[j] = n
            ok = search(j + 1, spent + n * prices[j], [max(0, d - n * c) for d, c in zip(need, col, strict=True)], left)
            counts[j] = 0
            if not ok:
                return False
        return True

    if not search(0, 0.0, need0, room0) or not found:
        return None
    near = [x for spent, x in found if spent <= limit()]
    # a solution not found holds more than some solution found (the search stops once the pods are held), so it
    # costs at least the cheapest column more
    if (
        len(near) != 1
        or best[0] + min((p for p, b in zip(prices, bounds, strict=True) if b > 0), default=math.inf) <= limit()
    ):
        return None
    return np.array(near[0], dtype=np.int64)
