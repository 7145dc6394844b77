"""The offline cost lower bound."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import catalog, itype, pod, pool, taint, tol
from gpuscale.core import bounds
from gpuscale.core import labels as L
from gpuscale.core.bounds import (
    Interval,
    can_host,
    cost_lower_bound,
    lp_rate_bound,
    pod_rate_bounds,
    weak_rate_bound,
)
from gpuscale.core.model import Catalog, NodePool, Pod, Snapshot
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner import Option, build_options, plan
from gpuscale.core.resources import MILLI_PER_GPU


def snap() -> Snapshot:
    return Snapshot(
        (), (), (pool(),), catalog(itype("g1", 8, 32, 1, "T4", price=1.0), itype("g4", 32, 128, 4, "T4", price=3.0))
    )


def test_rate_bounds_take_cheapest_share_per_dimension() -> None:
    rates = pod_rate_bounds(pod("p", 4000, 1024, gpus=1), build_options(snap(), 0))
    assert rates is not None
    cpu, _mem, gpu = rates
    assert gpu == 0.75  # 1 of 4 GPUs on the $3 node
    assert cpu == min(1.0 * 4 / 8, 3.0 * 4 / 32)
    assert pod_rate_bounds(pod("p", gpus=8), build_options(snap(), 0)) is None


def test_bound_integrates_over_time_and_takes_max_dimension() -> None:
    s = snap()
    one = [Interval(pod("a", 100, 100, gpus=1), 0, 3600)]
    assert cost_lower_bound(one, s) == 0.75
    # two overlapping pods for half an hour each side
    two = [Interval(pod("a", 100, 100, gpus=1), 0, 3600), Interval(pod("b", 100, 100, gpus=1), 1800, 5400)]
    assert abs(cost_lower_bound(two, s) - 1.5) < 1e-9
    assert cost_lower_bound([], s) == 0.0


def test_bound_never_exceeds_a_real_plan() -> None:
    from gpuscale.core.planner import plan

    pods = [pod(f"p{i}", 3000, 2048, gpus=1 + i % 2) for i in range(9)]
    s = Snapshot(tuple(pods), (), snap().pools, snap().catalog)
    hourly = plan(s).total_hourly_cost
    assert cost_lower_bound([Interval(p, 0, 3600) for p in pods], s) <= hourly + 1e-9


# ------------------------------------------------------------------------------------------------------- the LP bound
def test_method_weak_is_the_old_bound_and_lp_the_default() -> None:
    s = snap()
    two = [Interval(pod("a", 100, 100, gpus=1), 0, 3600), Interval(pod("b", 100, 100, gpus=1), 1800, 5400)]
    assert abs(cost_lower_bound(two, s, method="weak") - 1.5) < 1e-9
    # LP: one pod alone costs at least 3/4 per hour here too (the $3 4-GPU node, 1 GPU of 4)
    assert abs(cost_lower_bound(two, s) - 1.5) < 1e-9
    with pytest.raises(ValueError, match="method"):
        cost_lower_bound(two, s, method="best")  # type: ignore[arg-type]


def gpu_catalog_snap() -> Snapshot:
    """A 1-GPU/28-vCPU node at $0.263/h and a 2-GPU/16-vCPU node at $0.33/h (Alibaba's P100 spot offers)."""
    return Snapshot(
        (),
        (),
        (pool(),),
        catalog(itype("c28g1", 28, 112, 1, "P100", price=0.263), itype("c16g2", 16, 120, 2, "P100", price=0.33)),
    )


def test_lp_bound_hand_computed_where_the_weak_bound_is_loose() -> None:
    s = gpu_catalog_snap()
    opts = build_options(s, 0)
    pods = [pod(f"p{i}", 12000, 16384, gpus=1) for i in range(3)]
    # weak: GPU priced at half the 2-GPU node (0.165) beats CPU (12/28 of 0.263): 3 x 0.165
    assert abs(weak_rate_bound(pods, opts) - 3 * 0.165) < 1e-9
    # the plain LP would fit 16/12 such pods on a 2-GPU/16-vCPU node (0.33 x 12/16 = 0.2475 per pod); the packing cut
    # u_1(12/16) = 1 says one per node, so the 1-GPU node (0.263) wins: the real packing, one 1-GPU node each
    assert abs(lp_rate_bound(pods, opts) - 3 * 0.263) < 1e-9
    ivs = [Interval(p, 0, 7200) for p in pods]
    assert abs(cost_lower_bound(ivs, s, method="weak") - 2 * 3 * 0.165) < 1e-9
    assert abs(cost_lower_bound(ivs, s) - 2 * 3 * 0.263) < 1e-9


def test_lp_bound_mixes_complementary_pods() -> None:
    s = gpu_catalog_snap()
    opts = build_options(s, 0)
    # a 12-CPU/1-GPU and a 4-CPU/half-GPU pod fill the 16 vCPUs of a 2-GPU node: LP = integral optimum = 0.33 (dual:
    # the 2-GPU node's price all on CPU, the 1-GPU node's all on GPU), while the weak bound prices GPUs at 0.165 each
    pods = [pod("big", 12000, 1024, gpus=1), pod("small", 4000, 1024, milli=500)]
    assert abs(lp_rate_bound(pods, opts) - 0.33) < 1e-9
    assert abs(weak_rate_bound(pods, opts) - 1.5 * 0.165) < 1e-9


def test_lp_bound_leaves_out_pods_nothing_hosts_and_falls_back_without_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    s = gpu_catalog_snap()
    ivs = [Interval(pod("p", 12000, 16384, gpus=1), 0, 3600), Interval(pod("huge", gpus=8), 0, 3600)]
    assert abs(cost_lower_bound(ivs, s) - 0.263) < 1e-9
    monkeypatch.setattr(bounds, "have_solver", lambda: False)
    assert abs(cost_lower_bound(ivs, s) - 0.165) < 1e-9
    assert abs(lp_rate_bound([iv.pod for iv in ivs], build_options(s, 0)) - 0.165) < 1e-9


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from((2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 60, 97, 1000, 65536, 786432)).flatmap(
        lambda den: st.tuples(
            st.just(den),
            st.lists(st.integers(0, den), min_size=1, max_size=9).filter(lambda xs: sum(xs) <= den),
        )
    )
)
def test_fekete_schepers_cuts_hold_for_every_bin(bin_: tuple[int, list[int]]) -> None:
    """Requests of one bin summing to at most its capacity keep their values summing to at most 1 through every cut
    function (exact integers, so no share just below a step is rounded up to it)."""
    den, nums = bin_
    for k in bounds.CUT_ORDERS:
        assert float(bounds.fekete_schepers(nums, den, k).sum()) <= 1 + 1e-12, (k, nums, den)
    assert float(bounds.fekete_schepers(3, 4, 1)) == 1.0  # a 3/4 share takes a whole bin
    assert float(bounds.fekete_schepers(1, 2, 1)) == 0.5  # on a step: the share itself
    assert float(bounds.fekete_schepers(499_999, 1_000_000, 1)) == 0.0  # just below it: not rounded up
    assert float(bounds.fekete_schepers(5, 0, 1)) == 0.0  # nothing of that resource


def brute_lp(pods: list[Pod], options: list[Option]) -> float:
    """The LP relaxation with the packing cuts over every option and every pod (no classes, no dominance), by its
    primal value."""
    from scipy.optimize import linprog

    opts = [o for o in options if o.unavailable_until is None]
    pods = [p for p in pods if any(can_host(o, p) for o in opts)]
    if not pods:
        return 0.0
    cols = [(i, j) for i, p in enumerate(pods) for j, o in enumerate(opts) if can_host(o, p)]
    ny = len(cols)
    nvar = ny + len(opts)
    nd = bounds.ND
    # every (pod, option) share, raw and through the cuts
    raw = np.array(
        [
            [
                [p.request.cpu_milli / o.alloc.cpu_milli if o.alloc.cpu_milli else 0.0,
                 p.request.memory_mib / o.alloc.memory_mib if o.alloc.memory_mib else 0.0,
                 p.request.gpu_demand_milli / (o.alloc.gpus * MILLI_PER_GPU) if o.alloc.gpus else 0.0,
                 1 / o.alloc.pods]
                for o in opts
            ]
            for p in pods
        ]
    ).reshape(len(pods), len(opts), 4)  # fmt: skip
    cuts = bounds.cut_shares(
        np.array([[p.request.cpu_milli, p.request.memory_mib, p.request.gpu_demand_milli] for p in pods]),
        np.array([[o.alloc.cpu_milli, o.alloc.memory_mib, o.alloc.gpus * MILLI_PER_GPU] for o in opts]),
        np.array([p.request.gpus for p in pods]),
        np.array([0 if p.request.gpus else p.request.gpu_milli for p in pods]),
    )
    share = np.concatenate([raw, cuts], axis=2)
    a_eq = np.zeros((len(pods), nvar))
    a_ub = np.zeros((nd * len(opts), nvar))
    for k, (i, j) in enumerate(cols):
        a_eq[i, k] = 1
        a_ub[nd * j : nd * (j + 1), k] = share[i, j]
    for j in range(len(opts)):
        a_ub[nd * j : nd * (j + 1), ny + j] = -1
    cost = np.concatenate([np.zeros(ny), [o.price for o in opts]])
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(len(a_ub)), A_eq=a_eq, b_eq=np.ones(len(pods)), method="highs")
    assert res.status == 0
    return float(res.fun)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Snapshot, list[Interval]]:
    types = [
        itype(
            f"t{i}",
            draw(st.sampled_from((4, 8, 16, 28, 32))),
            draw(st.sampled_from((16, 32, 64, 128))),
            draw(st.sampled_from((0, 1, 2, 4, 8))),
            draw(st.sampled_from(("T4", "A100"))),
            price=draw(st.floats(0.1, 10.0).map(lambda x: round(x, 3))),
            zones=("z1", "z2"),
            spot=draw(st.one_of(st.none(), st.floats(0.05, 3.0).map(lambda x: round(x, 3)))),
        )
        for i in range(draw(st.integers(1, 5)))
    ]
    pools = (pool("p0"), pool("p1", taints=(taint("gpu", "yes"),)))[: draw(st.integers(1, 2))]
    ivs = []
    for k in range(draw(st.integers(0, 14))):
        kind = draw(st.integers(0, 2))
        start = draw(st.integers(0, 10)) * 600.0
        ivs.append(
            Interval(
                pod(
                    f"q{k}",
                    draw(st.sampled_from((250, 1000, 4000, 12000))),
                    draw(st.sampled_from((256, 2048, 16384, 65536))),
                    gpus=draw(st.sampled_from((1, 2, 4))) if kind == 0 else 0,
                    milli=draw(st.sampled_from((100, 300, 500, 700))) if kind == 1 else 0,
                    selector=draw(
                        st.sampled_from(({}, {L.GPU_PRODUCT: "A100"}, {L.ZONE: "z2"}, {L.CAPACITY_TYPE: "on-demand"}))
                    ),
                    tolerations=draw(st.sampled_from(((), (tol("gpu", "Exists"),)))),
                    models=draw(st.sampled_from((None, None, frozenset({"T4"})))) if kind < 2 else None,
                ),
                start,
                start + draw(st.integers(0, 6)) * 600.0,
            )
        )
    return Snapshot((), (), pools, Catalog("h", tuple(types))), ivs


def running(ivs: list[Interval], t0: float, t1: float) -> list[Pod]:
    return [iv.pod for iv in ivs if iv.start <= t0 and iv.end >= t1 and iv.end > iv.start]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_lp_bound_is_the_lp_and_between_the_weak_bound_and_a_real_plan(w: tuple[Snapshot, list[Interval]]) -> None:
    s, ivs = w
    opts = build_options(s, 0)
    weak = cost_lower_bound(ivs, s, method="weak")
    exact = cost_lower_bound(ivs, s, tolerance=0.0)
    loose = cost_lower_bound(ivs, s, tolerance=0.05)
    assert exact >= weak - 1e-9 * (1 + weak)
    assert loose >= 0.95 * exact - 1e-9 and loose <= exact + 1e-9 * (1 + exact)
    assert cost_lower_bound(ivs, s) <= exact + 1e-9 * (1 + exact)
    # piecewise: the integral of the exact per-instant LP, which the brute-force LP confirms, and a real plan caps
    times = sorted({t for iv in ivs for t in (iv.start, iv.end)})
    total = 0.0
    for t0, t1 in pairwise(times):
        pods = running(ivs, t0, t1)
        rate = lp_rate_bound(pods, opts)
        assert rate >= weak_rate_bound(pods, opts) - 1e-9
        assert abs(rate - brute_lp(pods, opts)) <= 1e-6 * (1 + rate)
        total += rate * (t1 - t0) / 3600.0
        p = plan(Snapshot(tuple(pods), (), s.pools, s.catalog), PlannerConfig(exact_solver=False))
        placed = [q for q in pods if q.key in p.placements]
        assert lp_rate_bound(placed, opts) <= p.total_hourly_cost + 1e-9
    assert abs(total - exact) <= 1e-6 * (1 + exact)


OPENB = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb" / "openb_pod_list_default.csv.gz"


@pytest.mark.slow
@pytest.mark.skipif(not OPENB.is_file(), reason="shared openb data not present")
def test_openb_default_trace_lp_bound_is_tighter() -> None:
    """Its time is a benchmark figure (``benchmarks/bench_sim.py`` reports it), not asserted here."""
    from gpuscale.catalogs import load_catalog
    from gpuscale.sim.workloads import openb_arrivals

    ivs = [Interval(a.pod, a.at, a.at + a.duration) for a in openb_arrivals(OPENB)]
    s = Snapshot((), (), (NodePool(name="gpu"),), load_catalog("alibaba"))
    weak = cost_lower_bound(ivs, s, method="weak")
    lp = cost_lower_bound(ivs, s)
    assert lp > 1.3 * weak  # about 15378 vs 11453 USD (14698 without the packing cuts)
