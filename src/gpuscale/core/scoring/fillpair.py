"""Fill-reserve plus remnant values ("fill-pair"): fractions go where their GPU's remnant keeps the most value.

On openb, about four fifths of the GPU left free when the cluster is full sits in remnants of shared GPUs: an 810
milli-GPU pod leaves 190 that only rare small pods use, two 470s leave 60, a 320 beside a 470 leaves 210 that almost
nothing fills. Which remnant a fraction leaves is decided when it is placed, so this scorer prices remnants.

**What a remnant is worth.** Take the fractional request sizes of the workload with their frequencies ``n_s`` and
solve the *cutting-stock* linear program: the least number of GPUs (fluid) that holds them, ``min sum_p x_p``
subject to ``sum_p a_sp x_p >= n_s`` over packings ``p`` of one GPU (``a_sp`` pieces of size ``s``, at most 1000
milli-GPU in all). Its dual price ``pi_s`` is the share of a GPU one piece of size ``s`` costs in the best packing
of the whole workload: 1 for an 810 whose remnant nothing fills often enough, 1/2 for a 470 that pairs with another,
0 for small pieces, since remnants for them are plentiful. A remnant of ``r`` milli-GPU is then worth ``V(r)``, the
most the prices of pieces that fit in ``r`` add up to (an unbounded knapsack; ``V(1000) = 1``, a whole GPU). The
scale of ``n`` does not change the prices, so they are computed once, from the workload's distribution.

**What a placement costs.** A fraction ``s`` placed on a GPU with ``f`` milli-GPU free turns a remnant worth
``V(f)`` into one worth ``V(f - s)``; in the best packing that costs exactly ``pi_s``. The excess ``V(f) - V(f - s)
- pi_s >= 0`` (the reduced cost of the move) is what the placement throws away: a 320 on a fresh GPU costs
nothing (a 650 completes it), a 320 on the 530 left by a 470 costs 1/6 of a GPU (the 210 it leaves is worth nothing;
the 470 beside another 470 would have cost nothing). The scorer ranks candidates by ``-weight * 1000 * excess``
first (``weight`` 100 makes it decide whenever excesses differ) and by fill-reserve's score (``fillreserve.py``)
among equals; whole-GPU requests have no excess. The GPU of a fraction is the one :meth:`ClusterState.place` takes
(the fitting GPU with the least free), as in fill-reserve.

The prices ignore CPU, memory and GPU models (fill-reserve's terms see those). The linear program is solved by
column generation with SciPy's HiGHS (the ``solver`` extra); new packings come from a knapsack over 0..1000. With
the 20 fractional sizes of openb that takes about 0.1 s of CPU per ``prepare``; with hundreds of distinct sizes,
seconds (300 random sizes: about 7 s).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.scoring.features import gpu_left
from gpuscale.core.scoring.fillreserve import FillReserve
from gpuscale.core.state import ClusterState, FloatArray, IntArray


def knapsack(prices: Mapping[int, float], capacity: int = MILLI_PER_GPU) -> tuple[FloatArray, IntArray]:
    """``V[c]``: the most the ``prices`` of pieces (size -> price, any number of each) fitting in ``c`` add up to,
    for ``c`` in 0..capacity; and the size of the last piece of a best filling of each ``c`` (0: none)."""
    value = np.zeros(capacity + 1)
    last = np.zeros(capacity + 1, dtype=np.int64)
    items = sorted((s, p) for s, p in prices.items() if 0 < s <= capacity and p > 0)
    size = np.array([s for s, _ in items], dtype=np.int64)
    price = np.array([p for _, p in items], dtype=np.float64)
    fit = np.searchsorted(size, np.arange(capacity + 1), side="right")  # pieces of size <= c
    for c in range(1, capacity + 1):
        value[c], last[c] = value[c - 1], last[c - 1]
        k = int(fit[c])
        if k:
            v = value[c - size[:k]] + price[:k]
            j = int(np.argmax(v))  # the smallest piece among equal best values
            if v[j] > value[c] + 1e-12:
                value[c], last[c] = v[j], size[j]
    return value, last


def _packing(last: IntArray, sizes: list[int], capacity: int) -> list[int]:
    """Counts per size of the best filling of ``capacity`` recorded in ``last`` (from :func:`knapsack`)."""
    counts = dict.fromkeys(sizes, 0)
    c = capacity
    while c > 0:
        if last[c] == 0:
            c -= 1
            continue
        counts[int(last[c])] += 1
        c -= int(last[c])
    return [counts[s] for s in sizes]


def cutting_stock_prices(demand: Mapping[int, float], max_rounds: int = 500) -> dict[int, float]:
    """Dual prices (share of a GPU per piece) of the fluid cutting-stock LP for ``demand`` (size -> count).

    Column generation: start from one-size packings, solve the LP, add the knapsack's best packing while it is worth
    more than one GPU. Sizes outside 1..999 and zero counts are ignored. Needs SciPy.
    """
    try:
        from scipy.optimize import linprog
    except ImportError as exc:  # optional dependency
        raise ImportError("the fill-pair scorer needs SciPy: install gpuscale[solver]") from exc

    sizes = sorted(s for s, n in demand.items() if 0 < s < MILLI_PER_GPU and n > 0)
    if not sizes:
        return {}
    need = np.array([float(demand[s]) for s in sizes])
    need *= 1000.0 / need.sum()
    columns = [[MILLI_PER_GPU // s if j == i else 0 for j in range(len(sizes))] for i, s in enumerate(sizes)]
    prices = np.zeros(len(sizes))
    for _ in range(max_rounds):
        a = np.array(columns, dtype=np.float64).T
        res = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-need, bounds=(0, None), method="highs")
        if res.status != 0:
            break
        prices = np.clip(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0, None)
        value, last = knapsack(dict(zip(sizes, prices.tolist(), strict=True)))
        if value[MILLI_PER_GPU] <= 1.0 + 1e-9:
            break
        column = _packing(last, sizes, MILLI_PER_GPU)
        if column in columns:
            break
        columns.append(column)
    return {s: float(p) for s, p in zip(sizes, prices, strict=True)}


class FillPair(FillReserve):
    """fill-reserve, ranked first by the remnant value a fraction throws away (see the module docstring)."""

    name = "fill-pair"

    def __init__(self, pair_weight: float = 100.0, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.pair_weight = pair_weight
        self.prices: dict[int, float] = {}
        self.value: FloatArray = np.zeros(MILLI_PER_GPU + 1)

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """fill-reserve's preparation, plus the piece prices and remnant values of the workload's fractions."""
        super().prepare(state, workload)
        demand: dict[int, float] = {}
        for c in workload.classes if workload is not None else ():
            if c.request.gpu_milli:
                demand[c.request.gpu_milli] = demand.get(c.request.gpu_milli, 0.0) + c.weight
        self.prices = cutting_stock_prices(demand)
        self.value, _ = knapsack(self.prices)

    def excess(self, state: ClusterState, req: Request, rows: IntArray) -> FloatArray:
        """Per row: the remnant value (share of a GPU) lost beyond the piece's price if fraction ``req`` goes there."""
        if not req.gpu_milli or not self.prices:
            return np.zeros(rows.size)
        left = gpu_left(state, rows)
        j = np.argmin(np.where(left >= req.gpu_milli, left, MILLI_PER_GPU + 1), axis=1)
        free = left[np.arange(rows.size), j]
        price = self.prices.get(req.gpu_milli, 0.0)
        lost: FloatArray = self.value[free] - self.value[np.maximum(free - req.gpu_milli, 0)] - price
        return np.maximum(lost, 0.0)

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """fill-reserve's score minus ``pair_weight * 1000`` times the excess (higher is better)."""
        score = super().score(state, req, candidates)
        if req.gpu_milli and self.pair_weight > 0:
            score = score - self.pair_weight * MILLI_PER_GPU * self.excess(state, req, candidates)
        return score
