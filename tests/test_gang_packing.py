"""Gangs on few new nodes (``core/planner/gangs.py``, ``PlannerConfig.gang_tolerance``, policy ``gangPacking``)."""

from __future__ import annotations

import dataclasses

import pytest

from builders import catalog, itype, pod, pool
from gpuscale.controller.config import ControllerConfig
from gpuscale.core.model import Snapshot
from gpuscale.core.plan import DEFAULT_GANG_TOLERANCE, PlannerConfig, ScaleUpPlan
from gpuscale.core.planner import plan
from gpuscale.core.planner.gangs import fewest_nodes, members_per_node
from gpuscale.errors import InputError
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import parse_scenario

# Linode's RTX 4000 Ada prices: 1 GPU $0.52, 2 GPUs $1.05 (+1 % per GPU), 4 GPUs $2.96 (+42 %)
ADA = catalog(
    itype("ada-1", 4, 16, 1, "RTX4000", price=0.52),
    itype("ada-2", 8, 32, 2, "RTX4000", price=1.05),
    itype("ada-4", 16, 64, 4, "RTX4000", price=2.96),
)


@pytest.mark.parametrize(
    ("offers", "members", "tolerance", "want"),
    [
        ([(0.52, 1), (1.05, 2), (2.96, 4)], 4, 0.05, 2),  # 2 GPUs at +1 %; 4 at +42 % is too dear
        ([(0.52, 1), (1.05, 2), (2.96, 4)], 4, 0.5, 4),
        ([(0.52, 1), (1.05, 2), (2.96, 4)], 4, 0.0, 1),  # no tolerance: the cheapest per member
        ([(0.52, 1), (1.05, 2), (2.96, 4)], 1, 0.05, 1),  # one member: one per node whatever the node
        ([(1.0, 1), (2.0, 2), (4.0, 4), (8.0, 8)], 4, 0.0, 4),  # linear prices: one node (8 holds 4 at 2x)
        ([(1.0, 1), (8.0, 8)], 3, 0.05, 1),  # an 8-GPU node for 3 members costs 2.7x per member
        ([(0.0, 0), (1.0, 1)], 2, 0.05, 1),  # an offer that fits nobody is ignored
        ([], 2, 0.05, 0),
    ],
)
def test_members_per_node(offers: list[tuple[float, int]], members: int, tolerance: float, want: int) -> None:
    assert members_per_node(offers, members, tolerance) == want


def test_fewest_nodes_keeps_the_candidates_that_hold_enough() -> None:
    offers = [(0.52, 1), (1.05, 2), (2.96, 4), (0.0, 0)]
    assert fewest_nodes(["a", "b", "c", "d"], offers, 4, 0.05) == ["b", "c"]
    assert fewest_nodes(["a", "b", "c", "d"], offers, 4, 0.0) == ["a", "b", "c"]


def _snap(pods: list) -> Snapshot:  # type: ignore[type-arg]
    return Snapshot(tuple(pods), (), (pool("gpu"),), ADA)


def _gang(n: int, name: str = "g") -> list:  # type: ignore[type-arg]
    return [pod(f"{name}{i}", 3000, 12 * 1024, gpus=1, gang=name, gang_size=n) for i in range(n)]


def _types(r: ScaleUpPlan) -> list[tuple[str, int]]:
    return sorted((x.instance_type, x.count) for x in r.launches)


@pytest.mark.parametrize("exact", [False, True])
def test_a_gang_takes_fewer_nodes_within_the_tolerance(exact: bool) -> None:
    cfg = PlannerConfig(exact_solver=exact)
    assert cfg.gang_tolerance == DEFAULT_GANG_TOLERANCE
    r = plan(_snap(_gang(4)), cfg)
    assert _types(r) == [("ada-2", 2)]  # not four 1-GPU nodes: the integer program does not undo it
    assert len({r.placements[f"default/g{i}"] for i in range(4)}) == 2
    plain = plan(_snap(_gang(4)), dataclasses.replace(cfg, gang_tolerance=None))
    assert _types(plain) == [("ada-1", 4)]
    wide = plan(_snap(_gang(4)), dataclasses.replace(cfg, gang_tolerance=0.5))
    assert _types(wide) == [("ada-4", 1)]


@pytest.mark.parametrize("exact", [False, True])
def test_single_pods_keep_the_cheapest_nodes(exact: bool) -> None:
    singles = [pod(f"s{i}", 3000, 12 * 1024, gpus=1) for i in range(4)]
    r = plan(_snap([*singles, *_gang(2)]), PlannerConfig(exact_solver=exact))
    assert _types(r) == [("ada-1", 4), ("ada-2", 1)]
    gang_nodes = {r.placements["default/g0"], r.placements["default/g1"]}
    assert len(gang_nodes) == 1
    assert not gang_nodes & {r.placements[f"default/s{i}"] for i in range(4)}


def test_gang_packing_setting() -> None:
    assert ControllerConfig.from_policy({}).planner.gang_tolerance == DEFAULT_GANG_TOLERANCE
    assert ControllerConfig.from_policy({"gangPacking": True}).planner.gang_tolerance == DEFAULT_GANG_TOLERANCE
    assert ControllerConfig.from_policy({"gangPacking": False}).planner.gang_tolerance is None
    got = ControllerConfig.from_policy({"gangPacking": {"maxExtraCost": 0.2}}).planner.gang_tolerance
    assert got == pytest.approx(0.2)
    for bad, where in [
        ("yes", "policy.gangPacking"),
        ({"maxExtraCost": 2}, "policy.gangPacking.maxExtraCost"),
        ({"maxExtraCost": "5%"}, "policy.gangPacking.maxExtraCost"),
        ({"maxExtraCost": float("nan")}, "policy.gangPacking.maxExtraCost"),
        ({"tolerance": 0.1}, "policy.gangPacking.tolerance"),
    ]:
        with pytest.raises(InputError) as err:
            ControllerConfig.from_policy({"gangPacking": bad})
        assert where in str(err.value)


SCENARIO = """
name: gangs-cold
seed: 7
duration: 12h
catalog: linode
pools:
  - name: gpu
    disruption: {consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s}
workload:
  - source: gangs
    ratePerHour: 2
    duration: 12h
    sizes: [4]
    shape: {cpu: 4, memory: 16Gi, gpus: 1}
    runtime: 30m
policy:
  name: gpuscale
"""


def _gang_waits(policy: str) -> tuple[list[float], float]:
    scenario = parse_scenario(SCENARIO + policy)
    res = simulate_policy(scenario, "gpuscale")
    assert res.report["duplicateLaunches"] == 0
    return sorted(res.cluster.pending_samples), res.report["costUsd"]


def test_gangs_start_sooner_on_fewer_nodes_in_the_simulator() -> None:
    """Every gang arrives on an empty cluster (consolidateAfter 0s, runs shorter than the gaps are long): spread over
    four nodes it waits for the slowest of four cold starts, on two nodes for the slower of two."""
    packed, packed_cost = _gang_waits("")
    spread, spread_cost = _gang_waits("  gangPacking: false\n")
    assert len(packed) == len(spread) > 40
    assert sum(packed) / len(packed) < sum(spread) / len(spread) - 5
    assert packed_cost < spread_cost * 1.03
