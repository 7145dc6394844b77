"""fill-reserve: fill-frag's local waste plus the expected demand lost when scarce request slots are used up.

Hand-built cases for each rule: a scarce 8-GPU slot is kept although the local waste says otherwise, a plentiful one
is not, the slot value follows the Poisson tail, near-equal scores tie to the lowest row under ``quantum``, and the
cached scores equal those of a freshly prepared scorer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscale.core.resources import Request, Resources
from gpuscale.core.scoring import SCORERS, Workload, make_scorer, select
from gpuscale.core.scoring.base import WorkloadClass
from gpuscale.core.scoring.fgd import FGD
from gpuscale.core.scoring.fillreserve import FillReserve, poisson_tail
from gpuscale.core.state import ClusterState, NodeShape

ONE = Request(cpu_milli=4000, memory_mib=1024, gpus=1)
EIGHT = Request(cpu_milli=8000, memory_mib=1024, gpus=8)
HEAVY = Request(cpu_milli=20000, memory_mib=1024, gpus=1)
"""A 1-GPU pod with much CPU: on the partly used node it leaves the last free GPU without CPU."""


def g8(name: str) -> NodeShape:
    return NodeShape(name, Resources(cpu_milli=96000, memory_mib=393216, gpus=8), "G2")


def cluster(empty_nodes: int) -> ClusterState:
    """``empty_nodes`` empty 8-GPU nodes, then one with 2 GPUs and 20 cores free (the last row)."""
    state = ClusterState([*(g8(f"e{i}") for i in range(empty_nodes)), g8("used")])
    state.place(Request(cpu_milli=76000, memory_mib=1024, gpus=6), empty_nodes)
    return state


def workload() -> Workload:
    return Workload((WorkloadClass(ONE, 0.9), WorkloadClass(EIGHT, 0.1)))


def test_registered_under_its_own_name() -> None:
    assert SCORERS["fill-reserve"] is FillReserve
    assert make_scorer("fill-reserve").name == "fill-reserve"
    assert SCORERS["fill-frag"]().name == "fill-frag"  # fill-frag itself is unchanged and still registered


def test_a_scarce_whole_node_slot_is_kept_for_the_multi_gpu_shape() -> None:
    # Locally, HEAVY on the used node strands its last GPU (0.9 x 1000 of waste for ONE) while breaking the empty
    # node costs only the 8-GPU shape's 7000 x 0.1: fill-frag (and fill-reserve without its reserve) break it.
    # But that node is the cluster's only 8-GPU slot, and about 0.6 8-GPU pods are still to come (10 GPUs free,
    # 1.7 GPUs per pod on average): P(N >= 1) = 0.45, so the slot is worth 0.45 x 8000 and is kept.
    state = cluster(1)
    cand = np.array([0, 1])
    for local in (make_scorer("fill-frag"), FillReserve(reserve=0.0)):
        local.prepare(state, workload())
        assert select(local, state, HEAVY, cand) == 0
    scorer = FillReserve()
    scorer.prepare(state, workload())
    worth = scorer.slot_worth(state)
    lam = 0.1 * 10000 / (0.9 * 1000 + 0.1 * 8000)
    eight = int(np.flatnonzero(scorer._demand == 8000)[0])
    assert worth[eight] == pytest.approx(8000 * (1 - math.exp(-lam)), rel=0.02)
    assert select(scorer, state, HEAVY, cand) == 1


def test_a_plentiful_slot_costs_nothing_and_the_local_rule_decides() -> None:
    # Forty empty 8-GPU nodes: about 7 8-GPU pods to come against 40 slots, so a slot is worth (almost) nothing.
    state = cluster(40)
    scorer = FillReserve()
    scorer.prepare(state, workload())
    assert scorer.slot_worth(state).max() < 1.0
    cand = np.array([0, 40])
    assert select(scorer, state, HEAVY, cand) == 0
    local = FillReserve(reserve=0.0)
    local.prepare(state, workload())
    np.testing.assert_allclose(scorer.score(state, HEAVY, cand), local.score(state, HEAVY, cand))


def test_poisson_tail_matches_the_exact_sum() -> None:
    lam = np.array([0.5, 1.0, 5.0, 5.0, 20.0, 20.0, 100.0, 3.0])
    k = np.array([1.0, 2.0, 3.0, 8.0, 10.0, 30.0, 130.0, 0.0])
    exact = [
        1 - sum(math.exp(-m) * m**i / math.factorial(i) for i in range(int(n))) for m, n in zip(lam, k, strict=True)
    ]
    np.testing.assert_allclose(poisson_tail(lam, k), exact, atol=0.01)
    assert poisson_tail(np.array([10.0]), np.array([500.0]))[0] == 0.0


def test_quantum_ties_near_equal_nodes_to_the_lowest_row() -> None:
    # Two partly used nodes whose exact scores differ by a few milli-GPU: exact scoring takes the better (row 1),
    # a coarse quantum makes them tie and the lowest row wins.
    state = ClusterState([g8("a"), g8("b")])
    state.place(Request(cpu_milli=1000, memory_mib=1, gpu_milli=100), 0)
    state.place(Request(cpu_milli=1000, memory_mib=1, gpu_milli=300), 1)
    pod = Request(cpu_milli=1000, memory_mib=1, gpu_milli=100)
    wl = Workload.from_requests([pod] * 9 + [Request(cpu_milli=1000, memory_mib=1, gpu_milli=750)])
    exact, coarse = FillReserve(quantum=0.0), FillReserve(quantum=100.0)
    for s in (exact, coarse):
        s.prepare(state, wl)
    cand = np.array([0, 1])
    e = exact.score(state, pod, cand)
    assert e[1] > e[0] and e[1] - e[0] < 50 and abs(e[0]) < 50
    assert select(exact, state, pod, cand) == 1
    assert select(coarse, state, pod, cand) == 0


def test_the_local_score_is_fill_waste_plus_weighted_fgd_fragmentation() -> None:
    # Without the reserve, the score is fill-frag's (fill waste growth) plus fgd_weight times FGD's exact drop.
    state = cluster(2)
    state.place(Request(cpu_milli=3000, memory_mib=1, gpu_milli=470), 0)
    wl = Workload.from_requests([ONE] * 6 + [EIGHT] + [Request(cpu_milli=3000, memory_mib=1, gpu_milli=470)] * 3)
    cand = np.array([0, 1, 2])
    both, fill, fgd = FillReserve(reserve=0.0, fgd_weight=4.0), make_scorer("fill-frag"), FGD(quantize=False)
    for s in (both, fill, fgd):
        s.prepare(state, wl)
    for req in (ONE, HEAVY, Request(cpu_milli=3000, memory_mib=1, gpu_milli=470)):
        expected = fill.score(state, req, cand) + 4.0 * fgd.score(state, req, cand)
        np.testing.assert_allclose(both.score(state, req, cand), expected, atol=1e-6)


def test_cached_scores_match_a_fresh_scorer() -> None:
    rng = np.random.default_rng(5)
    shapes = [g8("a"), g8("b"), NodeShape("t4", Resources(cpu_milli=104000, memory_mib=524288, gpus=2), "T4")]
    state = ClusterState(shapes)
    reqs = []
    for _ in range(150):
        kind = int(rng.integers(0, 3))
        cpu = int(rng.integers(1000, 16000))
        if kind == 0:
            reqs.append(Request(cpu_milli=cpu, memory_mib=1024, gpus=int(rng.choice([1, 1, 2, 8]))))
        elif kind == 1:
            reqs.append(Request(cpu_milli=cpu, memory_mib=1024, gpu_milli=int(rng.choice([200, 470, 810]))))
        else:
            reqs.append(Request(cpu_milli=cpu, memory_mib=1024))
    wl = Workload.from_requests(reqs)
    long_lived = FillReserve()
    long_lived.prepare(state, wl)
    for k, req in enumerate(reqs):
        cand = np.flatnonzero(state.fits(req))
        if cand.size == 0:
            continue
        scores = long_lived.score(state, req, cand)
        if k % 7 == 0:
            fresh = FillReserve()
            fresh.prepare(state, wl)
            np.testing.assert_allclose(scores, fresh.score(state, req, cand), atol=1e-6)
        state.place(req, int(cand[int(np.argmax(scores))]))


def test_a_resized_cluster_keeps_the_workload_and_matches_a_fresh_scorer() -> None:
    small, big = cluster(1), cluster(3)
    scorer = FillReserve()
    scorer.prepare(small, workload())
    scorer.score(small, HEAVY, np.array([0, 1]))
    fresh = FillReserve()
    fresh.prepare(big, workload())
    cand = np.arange(len(big))
    np.testing.assert_allclose(scorer.score(big, HEAVY, cand), fresh.score(big, HEAVY, cand))
