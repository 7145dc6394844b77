"""Every scorer: valid placements under CPU, memory, whole/fractional GPU and model constraints, plus the behaviour
each one is defined by (and that cached scorers agree with freshly prepared ones)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.core.resources import Request, Resources
from gpuscale.core.scoring import SCORERS, Workload, make_scorer, select
from gpuscale.core.scoring.fgd import FGD
from gpuscale.core.scoring.randomized import RandomScorer
from gpuscale.core.state import ClusterState, NodeShape


def node(name: str, cpu: int, mem: int, gpus: int, model: str | None) -> NodeShape:
    return NodeShape(name, Resources(cpu_milli=cpu, memory_mib=mem, gpus=gpus), model)


def mixed_cluster() -> list[NodeShape]:
    return [
        node("p100", 64000, 262144, 2, "P100"),
        node("g2a", 96000, 393216, 8, "G2"),
        node("g2b", 96000, 393216, 8, "G2"),
        node("t4", 104000, 524288, 2, "T4"),
        node("v16", 8000, 32768, 1, "V100M16"),
        node("cpu", 32000, 131072, 0, None),
    ]


def random_requests(rng: np.random.Generator, n: int) -> list[Request]:
    out = []
    for _ in range(n):
        kind = rng.integers(0, 4)
        cpu, mem = int(rng.integers(500, 16000)), int(rng.integers(512, 65536))
        models = frozenset({"T4", "P100"}) if rng.random() < 0.2 else None
        if kind == 0:
            out.append(Request(cpu_milli=cpu, memory_mib=mem))
        elif kind == 1:
            out.append(Request(cpu_milli=cpu, memory_mib=mem, gpu_milli=int(rng.integers(50, 1000)), gpu_models=models))
        else:
            out.append(Request(cpu_milli=cpu, memory_mib=mem, gpus=int(rng.choice([1, 1, 2, 4])), gpu_models=models))
    return out


class WorstFitGpuState(ClusterState):
    """Puts each fraction on the emptiest GPU, to build a node with 500 milli-GPU free on each of two GPUs."""

    def choose_gpus(self, req: Request, i: int) -> tuple[int, ...]:
        if req.gpu_milli:
            return (int(np.argmax(self.gpu_free[i])),)
        return super().choose_gpus(req, i)


def test_fraction_never_spans_two_gpus() -> None:
    state = WorstFitGpuState([node("n", 64000, 65536, 2, "T4")])
    half = Request(cpu_milli=1, memory_mib=1, gpu_milli=500)
    state.place(half, 0)
    state.place(half, 0)
    assert state.gpu_free[0].tolist() == [500, 500]
    big = Request(cpu_milli=1, memory_mib=1, gpu_milli=600)
    assert not state.fits(big)[0]
    for name in SCORERS:
        assert select(make_scorer(name), state, big, np.flatnonzero(state.fits(big))) is None
    with pytest.raises(ValueError):
        state.place(big, 0)


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_scorer_placements_respect_every_constraint(name: str) -> None:
    rng = np.random.default_rng(7)
    shapes = mixed_cluster()
    state = ClusterState(shapes)
    reqs = random_requests(rng, 300)
    scorer = make_scorer(name)
    scorer.prepare(state, Workload.from_requests(reqs))
    placed = 0
    for req in reqs:
        cand = np.flatnonzero(state.fits(req))
        if cand.size == 0:
            continue
        scores = scorer.score(state, req, cand)
        assert scores.shape == cand.shape and np.all(np.isfinite(scores))
        i = select(scorer, state, req, cand)
        assert i is not None and i in cand
        if req.gpu_models is not None:
            assert shapes[i].gpu_model in req.gpu_models
        before = state.gpu_free[i].copy()
        p = state.place(req, i)
        placed += 1
        if req.gpu_milli:
            assert len(p.gpu_indices) == 1 and before[p.gpu_indices[0]] >= req.gpu_milli
        if req.gpus:
            assert len(p.gpu_indices) == req.gpus and all(before[g] == 1000 for g in p.gpu_indices)
    assert placed > 30
    assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    assert ((state.gpu_free >= 0) | (state.gpu_free == -1)).all() and (state.gpu_free <= 1000).all()


@pytest.mark.parametrize("name", ["fgd", "fill-frag"])
def test_cached_scores_match_a_fresh_scorer(name: str) -> None:
    rng = np.random.default_rng(3)
    state = ClusterState(mixed_cluster())
    reqs = random_requests(rng, 200)
    wl = Workload.from_requests(reqs)
    long_lived = make_scorer(name)
    long_lived.prepare(state, wl)
    for k, req in enumerate(reqs):
        cand = np.flatnonzero(state.fits(req))
        if cand.size == 0:
            continue
        scores = long_lived.score(state, req, cand)
        if k % 10 == 0:
            fresh = make_scorer(name)
            fresh.prepare(state, wl)
            np.testing.assert_allclose(scores, fresh.score(state, req, cand), atol=1e-6)
        state.place(req, int(cand[int(np.argmax(scores))]))


def test_best_fit_prefers_the_tightest_node() -> None:
    state = ClusterState([node("big", 96000, 393216, 8, "G2"), node("small", 16000, 65536, 2, "G2")])
    scorer = make_scorer("best-fit")
    scorer.prepare(state, None)
    req = Request(cpu_milli=4000, memory_mib=1024, gpus=1)
    assert select(scorer, state, req, np.array([0, 1])) == 1


def test_gpu_packing_prefers_a_shared_gpu_then_a_used_node() -> None:
    state = ClusterState([node("idle", 64000, 65536, 2, "T4"), node("used", 64000, 65536, 4, "T4")])
    state.place(Request(cpu_milli=1, memory_mib=1, gpu_milli=300), 1)
    scorer = make_scorer("gpu-packing")
    frac = Request(cpu_milli=1, memory_mib=1, gpu_milli=500)
    assert select(scorer, state, frac, np.array([0, 1])) == 1  # fits on the shared GPU
    whole = Request(cpu_milli=1, memory_mib=1, gpus=1)
    assert select(scorer, state, whole, np.array([0, 1])) == 1  # used node before an idle one


def test_dot_product_prefers_least_aligned_free_capacity() -> None:
    state = ClusterState([node("a", 96000, 65536, 8, "G2"), node("b", 96000, 65536, 8, "G2")])
    state.place(Request(cpu_milli=80000, memory_mib=1, gpus=1), 1)
    scorer = make_scorer("dot-product")
    scorer.prepare(state, None)
    assert select(scorer, state, Request(cpu_milli=8000, memory_mib=1, gpus=1), np.array([0, 1])) == 1


def test_random_is_deterministic_per_seed() -> None:
    state = ClusterState(mixed_cluster())
    req = Request(cpu_milli=1, memory_mib=1)
    cand = np.arange(len(state))
    a, b, c = RandomScorer(5), RandomScorer(5), RandomScorer(6)
    for s in (a, b, c):
        s.prepare(state, None)
    sa, sb, sc = a.score(state, req, cand), b.score(state, req, cand), c.score(state, req, cand)
    assert np.array_equal(sa, sb) and not np.array_equal(sa, sc)


def test_fgd_fills_a_partial_gpu_instead_of_breaking_a_whole_one() -> None:
    state = ClusterState([node("fresh", 64000, 65536, 2, "T4"), node("shared", 64000, 65536, 2, "T4")])
    state.place(Request(cpu_milli=1, memory_mib=1, gpu_milli=500), 1)
    state.place(Request(cpu_milli=1, memory_mib=1, gpus=1), 1)
    frac = Request(cpu_milli=1, memory_mib=1, gpu_milli=500)
    wl = Workload.from_requests([Request(cpu_milli=1, memory_mib=1, gpus=1), frac])
    scorer = FGD()
    scorer.prepare(state, wl)
    assert select(scorer, state, frac, np.array([0, 1])) == 1
    assert scorer.gpus_for(state, frac, 1) == (0,)


def test_fill_frag_keeps_cpu_pods_off_cpu_starved_gpu_nodes() -> None:
    # 8 GPUs with 12 cores each vs 2 GPUs with 52 cores each (the openb G2 / T4 shapes).
    state = ClusterState([node("g2", 96000, 393216, 8, "G2"), node("t4", 104000, 524288, 2, "T4")])
    gpu_pod = Request(cpu_milli=11000, memory_mib=40000, gpus=1)
    cpu_pod = Request(cpu_milli=30000, memory_mib=30000)
    scorer = make_scorer("fill-frag")
    scorer.prepare(state, Workload.from_requests([gpu_pod] * 9 + [cpu_pod]))
    assert select(scorer, state, cpu_pod, np.array([0, 1])) == 1
    fgd = make_scorer("fgd")
    fgd.prepare(state, Workload.from_requests([gpu_pod] * 9 + [cpu_pod]))
    fgd_scores = fgd.score(state, cpu_pod, np.array([0, 1]))
    assert fgd_scores[0] == fgd_scores[1]  # FGD sees no difference: one more GPU pod still fits on g2


def test_registry_names_and_errors() -> None:
    assert {"random", "best-fit", "gpu-packing", "dot-product", "fgd", "fill-frag"} <= set(SCORERS)
    for name, factory in SCORERS.items():
        assert factory().name == name
    with pytest.raises(KeyError, match="unknown scorer"):
        make_scorer("nope")


def test_fgd_scores_like_the_paper_simulator_integer_sigmoid_ties_to_the_lowest_row() -> None:
    # A 100-milli fraction: on node a (GPU0 has 800 left) it leaves the fragmentation as it is (drop 0); on node b
    # (GPU0 has 400 left, too small for the 650-milli shape) it shrinks that fragment by 100 x 10 % (drop 10). The exact
    # score prefers b; the simulator's integer score int(100 * sigmoid(drop / 1000)) is 50 on both, and the lowest
    # row wins.
    state = ClusterState([node("a", 64000, 65536, 2, "T4"), node("b", 64000, 65536, 2, "T4")])
    state.place(Request(cpu_milli=1, memory_mib=1, gpu_milli=200), 0)
    state.place(Request(cpu_milli=1, memory_mib=1, gpu_milli=600), 1)
    pod = Request(cpu_milli=1, memory_mib=1, gpu_milli=100)
    wl = Workload.from_requests([pod] * 9 + [Request(cpu_milli=1, memory_mib=1, gpu_milli=650)])
    quantized, exact = FGD(), FGD(quantize=False)
    for s in (quantized, exact):
        s.prepare(state, wl)
    cand = np.array([0, 1])
    assert exact.score(state, pod, cand).tolist() == pytest.approx([0.0, 10.0])
    assert quantized.score(state, pod, cand).tolist() == [50.0, 50.0]
    assert select(exact, state, pod, cand) == 1
    assert select(quantized, state, pod, cand) == 0
    assert quantized.gpus_for(state, pod, 1) == (0,)  # the first GPU of the best integer score
