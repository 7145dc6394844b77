"""The offline cost lower bound."""

from __future__ import annotations

from builders import catalog, itype, pod, pool
from gpuscale.core.bounds import Interval, cost_lower_bound, pod_rate_bounds
from gpuscale.core.model import Snapshot
from gpuscale.core.planner import build_options


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
