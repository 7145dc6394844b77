"""fill-pair: fill-reserve ranked first by the remnant value a fraction throws away (cutting-stock prices).

Hand-made cases: the knapsack of remnant values, the LP prices where they are unique, the excess of each placement
on small clusters where the better GPU is known (a 320 opens a fresh GPU rather than leave 210 beside a 470; it
completes a 650's remnant when one exists), and fill-reserve's score wherever the excess does not differ."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.core.resources import Request, Resources
from gpuscale.core.scoring import SCORERS, Workload, make_scorer, select
from gpuscale.core.scoring.base import WorkloadClass
from gpuscale.core.scoring.fillpair import FillPair, cutting_stock_prices, knapsack
from gpuscale.core.scoring.fillreserve import FillReserve
from gpuscale.core.state import ClusterState, NodeShape


def frac(milli: int) -> Request:
    return Request(cpu_milli=1000, memory_mib=1024, gpu_milli=milli)


def one_gpu_nodes(n: int) -> ClusterState:
    return ClusterState([NodeShape(f"n{i}", Resources(cpu_milli=32000, memory_mib=131072, gpus=1), "T4")
                         for i in range(n)])  # fmt: skip


def mix(*shares: tuple[Request, float]) -> Workload:
    return Workload(tuple(WorkloadClass(r, w) for r, w in shares))


WORKLOAD = mix((frac(470), 0.3), (frac(650), 0.2), (frac(320), 0.2), (Request(cpu_milli=1000, gpus=1), 0.3))


def test_registered_under_its_own_name() -> None:
    assert SCORERS["fill-pair"] is FillPair
    assert make_scorer("fill-pair").name == "fill-pair"


def test_knapsack_adds_up_the_best_prices_that_fit() -> None:
    value, last = knapsack({470: 0.5, 320: 1 / 3, 650: 2 / 3})
    assert value[100] == 0 and value[320] == pytest.approx(1 / 3) and value[469] == pytest.approx(1 / 3)
    assert value[470] == pytest.approx(0.5)
    assert value[640] == pytest.approx(2 / 3)  # two 320s
    assert value[1000] == pytest.approx(1.0)  # 470 + 470, or 650 + 320, or three 320s
    assert last[320] == 320 and last[0] == 0


def test_prices_are_the_share_of_a_gpu_in_the_best_packing() -> None:
    assert cutting_stock_prices({470: 5}) == {470: pytest.approx(0.5)}  # two per GPU
    assert cutting_stock_prices({320: 1}) == {320: pytest.approx(1 / 3)}
    # 190 holes beside 810s are plentiful for the few 160s: a 160 costs nothing, an 810 a whole GPU
    prices = cutting_stock_prices({810: 10, 160: 1})
    assert prices[810] == pytest.approx(1.0) and prices[160] == pytest.approx(0.0)
    # more 160s than holes: the extra ones pack six to a GPU; whole-GPU sizes and zero counts are ignored
    prices = cutting_stock_prices({810: 1, 160: 20, 1000: 3, 300: 0})
    assert prices == {160: pytest.approx(1 / 6), 810: pytest.approx(5 / 6)}
    assert cutting_stock_prices({}) == {}


def packings(sizes: list[int], room: int = 1000) -> list[list[int]]:
    """Every packing of one GPU with pieces of ``sizes`` (counts per size), by enumeration."""
    if not sizes:
        return [[]]
    return [[n, *rest] for n in range(room // sizes[0] + 1) for rest in packings(sizes[1:], room - n * sizes[0])]


def test_prices_are_feasible_and_optimal_for_a_mixed_workload() -> None:
    from scipy.optimize import linprog

    demand = {810: 11.0, 470: 75.0, 650: 25.0, 320: 33.0, 230: 14.0, 160: 7.0, 50: 2.0}
    prices = cutting_stock_prices(demand)
    value, _ = knapsack(prices)
    assert value[1000] <= 1.0 + 1e-9  # dual feasible: no GPU packing is worth more than a GPU
    # optimal: what the prices pay equals the least number of GPUs of the LP over every packing (strong duality)
    sizes = sorted(demand)
    a = np.array([p for p in packings(sizes) if any(p)], dtype=float).T
    need = np.array([demand[s] for s in sizes]) * 1000.0 / sum(demand.values())
    fluid = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-need, bounds=(0, None), method="highs").fun
    assert sum(prices[s] * n for s, n in zip(sizes, need, strict=True)) == pytest.approx(fluid, rel=1e-6)


def test_a_fraction_opens_a_fresh_gpu_rather_than_strand_a_remnant_nothing_fills() -> None:
    # Node 0 holds a 470 (530 free). A 320 there leaves 210 that nothing in the workload fills: excess
    # V(530) - V(210) - price(320) = 1/2 - 0 - 1/3. On the empty node 1 it leaves 680, which a 650 completes:
    # excess 1 - 2/3 - 1/3 = 0. Best fit (and fill-reserve) take node 0; fill-pair takes node 1.
    state = one_gpu_nodes(2)
    state.place(frac(470), 0)
    cand = np.array([0, 1])
    scorer = FillPair()
    scorer.prepare(state, WORKLOAD)
    assert scorer.prices[320] == pytest.approx(1 / 3) and scorer.prices[470] == pytest.approx(0.5)
    np.testing.assert_allclose(scorer.excess(state, frac(320), cand), [1 / 6, 0.0], atol=1e-9)
    reserve = FillReserve()
    reserve.prepare(state, WORKLOAD)
    assert select(reserve, state, frac(320), cand) == 0
    assert select(scorer, state, frac(320), cand) == 1
    # a second 470 completes the pair: no excess on either node, fill-reserve's rule decides (the partly used GPU)
    np.testing.assert_allclose(scorer.excess(state, frac(470), cand), [0.0, 0.0], atol=1e-9)
    assert select(scorer, state, frac(470), cand) == select(reserve, state, frac(470), cand) == 0


def test_a_fraction_completes_the_remnant_it_was_priced_for() -> None:
    # Node 0 holds a 470 (530 free), node 1 a 650 (350 free), node 2 is empty. A 320 on the 650's remnant or on the
    # empty GPU costs nothing, beside the 470 it wastes 1/6 of a GPU; fill-reserve's rule then prefers the remnant.
    state = one_gpu_nodes(3)
    state.place(frac(470), 0)
    state.place(frac(650), 1)
    cand = np.array([0, 1, 2])
    scorer = FillPair()
    scorer.prepare(state, WORKLOAD)
    np.testing.assert_allclose(scorer.excess(state, frac(320), cand), [1 / 6, 0.0, 0.0], atol=1e-9)
    assert select(scorer, state, frac(320), cand) == 1


def test_the_gpu_of_the_excess_is_the_one_place_takes() -> None:
    # One 2-GPU node: GPU 0 holds a 470 (530 free), GPU 1 is empty. place() puts a 320 on the tighter GPU 0, so the
    # node's excess is that of GPU 0 (1/6), not the empty GPU's 0.
    state = ClusterState([NodeShape("t4", Resources(cpu_milli=32000, memory_mib=131072, gpus=2), "T4")])
    state.place(frac(470), 0)
    scorer = FillPair()
    scorer.prepare(state, WORKLOAD)
    np.testing.assert_allclose(scorer.excess(state, frac(320), np.array([0])), [1 / 6], atol=1e-9)
    assert state.place(frac(320), 0).gpu_indices == (0,)


def test_whole_gpu_requests_and_ties_score_as_fill_reserve() -> None:
    state = one_gpu_nodes(3)
    state.place(frac(470), 0)
    cand = np.array([1, 2])
    pair, reserve = FillPair(), FillReserve()
    for s in (pair, reserve):
        s.prepare(state, WORKLOAD)
    for req in (Request(cpu_milli=1000, gpus=1), Request(cpu_milli=1000), frac(470)):
        rows = cand if req.gpus else np.array([0, 1, 2])
        np.testing.assert_allclose(pair.score(state, req, rows), reserve.score(state, req, rows), atol=1e-9)
    # without a workload there are no fractions to price: fill-reserve's score for every request
    bare = FillPair()
    bare.prepare(state, None)
    assert bare.prices == {}
    np.testing.assert_allclose(bare.excess(state, frac(320), np.array([0, 1])), [0.0, 0.0])


def test_pair_weight_zero_is_fill_reserve() -> None:
    state = one_gpu_nodes(2)
    state.place(frac(470), 0)
    off, reserve = FillPair(pair_weight=0.0), FillReserve()
    for s in (off, reserve):
        s.prepare(state, WORKLOAD)
    cand = np.array([0, 1])
    np.testing.assert_allclose(off.score(state, frac(320), cand), reserve.score(state, frac(320), cand))
