"""The optional policies' pure decisions (forecast, headroom sizing, warm nodes kept, lost work, weighing of
consolidations) and the validation of their settings (policy keys and a pool's ``headroom``)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from builders import node, pod
from gpuscale.controller.config import ControllerConfig
from gpuscale.core import labels as L
from gpuscale.core.disruption import ActionKind, DisruptionAction, DisruptionPlan, DisruptionReason, KeepReason
from gpuscale.core.disruption.workcost import (
    CHECKPOINT_ANNOTATION,
    WorkCostRule,
    checkpoint_time,
    lost_work_usd,
    weigh_actions,
)
from gpuscale.core.headroom import (
    DAY_S,
    Forecast,
    HeadroomSpec,
    WarmNode,
    forecast,
    headroom_cap,
    keep_warm,
    pick_offer,
    quantile,
    size_headroom,
)
from gpuscale.core.model import Catalog
from gpuscale.errors import InputError
from gpuscale.sim.policies import _config
from gpuscale.sim.scenario import parse_scenario

SPEC = HeadroomSpec(max_nodes=3, max_hourly_cost=10.0, lead_s=600.0, quantile=0.5, days=4, min_days=2)
NO_CATALOG = Catalog("none", ())


# ------------------------------------------------------------------------------------------------ forecast
def test_quantile_is_nearest_rank() -> None:
    assert quantile([], 0.5) == 0
    assert quantile([3, 1, 2], 0.5) == 2
    assert quantile([3, 1, 2], 1.0) == 3
    assert quantile([3, 1, 2], 0.0) == 1


def test_forecast_time_of_day_takes_the_quantile_of_the_same_window_on_past_days() -> None:
    now = 10 * DAY_S + 3600
    # the same window (now .. now + 10 min) on days 1-4 before: 2, 0, 4 and 1 GPUs
    arrivals = []
    for d, gpus in ((1, 2), (2, 0), (3, 4), (4, 1)):
        arrivals += [(now - d * DAY_S + 60 + i, 1000) for i in range(gpus)]
    arrivals.append((now - DAY_S + 700, 5000))  # outside the window: not counted
    arrivals.sort()
    fc = forecast(arrivals, 0.0, now, SPEC)
    assert fc.days_seen == 4 and fc.seasonal == 1000  # median of 0, 1, 2, 4 (nearest rank: 1)
    assert fc.recent == 0 and fc.milli == 1000
    high = forecast(arrivals, 0.0, now, replace(SPEC, quantile=1.0))
    assert high.seasonal == 4000 and high.milli == 4000


def test_forecast_needs_min_days_of_history_and_counts_recent_bursts() -> None:
    now = 1.5 * DAY_S
    arrivals = [(now - DAY_S + 10, 3000), (now - 500, 1000), (now - 400, 1000), (now - 700, 500)]
    arrivals.sort()
    fc = forecast(arrivals, 0.0, now, SPEC)
    assert fc.days_seen == 1 and fc.seasonal == 0  # one day seen, two needed
    # recent windows of 10 min: [now-600, now) holds 2 GPUs, [now-1200, now-600) 0.5 GPU, the others nothing
    assert fc.recent == 0  # median of 2000, 500, 0, 0, 0, 0
    burst = forecast(arrivals, 0.0, now, replace(SPEC, recent_windows=2, quantile=1.0))
    assert burst.recent == 2000 and burst.milli == 2000
    # windows before observation started are not counted
    late = forecast(arrivals, now - 600, now, replace(SPEC, recent_windows=6, quantile=0.5))
    assert late.recent == 2000


# ------------------------------------------------------------------------------------------------ sizing
def test_size_headroom_covers_the_deficit_within_the_caps() -> None:
    fc = Forecast(milli=5000, seasonal=5000, recent=0, days_seen=4)
    assert size_headroom(fc, 5000, 1, 1.0, SPEC).nodes == 0  # free room covers it
    assert size_headroom(fc, 3500, 1, 1.0, SPEC).nodes == 2  # 1.5 GPU short: two 1-GPU nodes
    assert size_headroom(fc, 3500, 4, 1.0, SPEC).nodes == 1
    assert size_headroom(fc, 0, 1, 1.0, SPEC).nodes == 3  # maxNodes
    assert size_headroom(fc, 0, 1, 4.0, SPEC).nodes == 2  # maxHourlyCost 10 at $4/h
    assert size_headroom(fc, 0, 1, 11.0, SPEC).nodes == 0
    assert headroom_cap(SPEC, 0.0) == 3
    assert "cap 3" in size_headroom(fc, 0, 1, 1.0, SPEC).reason


def test_size_headroom_weighs_cold_starts_against_the_nodes_when_priced() -> None:
    fc = Forecast(milli=1000, seasonal=1000, recent=0, days_seen=4)
    # one GPU waiting 200 s at $6/GPU-hour = $0.33; a $1/h node for the 10-minute window = $0.17: worth it
    spec = replace(SPEC, wait_cost_per_gpu_hour=6.0, cold_start_s=200.0)
    assert size_headroom(fc, 0, 1, 1.0, spec).nodes == 1
    # at $3/h the node costs $0.50 per window: not worth it
    decision = size_headroom(fc, 0, 1, 3.0, spec)
    assert decision.nodes == 0 and "cold starts avoided" in decision.reason


def test_pick_offer_is_the_cheapest_per_gpu_that_fits_the_cost_cap() -> None:
    offers = [(1, 0.6), (4, 2.2), (0, 0.1), (2, 1.3)]
    assert pick_offer(offers, 5.0) == 1  # $0.55 per GPU
    assert pick_offer(offers, 1.3) == 0  # the 4-GPU node is over the cap; $0.60 < $0.65 per GPU
    assert pick_offer(offers, 0.5) is None


def test_keep_warm_keeps_the_cheapest_per_gpu_empty_nodes_within_the_caps() -> None:
    empty = [WarmNode("a", 1, 2.0), WarmNode("b", 4, 4.0), WarmNode("c", 1, 0.5), WarmNode("d", 0, 0.1)]
    fc = Forecast(milli=2000, seasonal=2000, recent=0, days_seen=4)
    assert keep_warm(empty, fc, 0, SPEC) == ("c", "b")  # $0.5/GPU then $1/GPU; the GPU-less node is no headroom
    assert keep_warm(empty, fc, 1000, SPEC) == ("c",)
    assert keep_warm(empty, fc, 2000, SPEC) == ()
    assert keep_warm(empty, fc, 0, replace(SPEC, max_hourly_cost=3.0)) == ("c", "a")  # b would pass $3/h
    assert keep_warm(empty, Forecast(9000, 9000, 0, 4), 0, replace(SPEC, max_nodes=1)) == ("c",)


# ------------------------------------------------------------------------------------------------ lost work
def test_lost_work_is_run_time_since_the_last_checkpoint_times_share_times_price() -> None:
    n = node("n1", 8000, 32768, 4, "T4")
    p = pod("p", gpus=2, node="n1")
    assert lost_work_usd(p, n, 8.0, 0.0, 3600.0) == pytest.approx(4.0)  # 1 h x half the node x $8/h
    assert lost_work_usd(p, n, 8.0, None, 3600.0) == 0.0
    ck = replace(p, annotations={CHECKPOINT_ANNOTATION: "2700"})
    assert lost_work_usd(ck, n, 8.0, 0.0, 3600.0) == pytest.approx(1.0)
    iso = replace(p, annotations={CHECKPOINT_ANNOTATION: "1970-01-01T00:45:00Z"})
    assert checkpoint_time(iso) == 2700.0
    assert checkpoint_time(replace(p, annotations={CHECKPOINT_ANNOTATION: "soon"})) is None
    cpu_node = node("c1", 4000, 16384)
    assert lost_work_usd(pod("q", cpu=2000, node="c1"), cpu_node, 1.0, 0.0, 7200.0) == pytest.approx(1.0)


def _action(kind: ActionKind, reason: DisruptionReason, saving: float, pods: tuple[str, ...]) -> DisruptionAction:
    return DisruptionAction(kind, "n1", "gpu", reason, "m", pods, (), saving)


def test_weigh_actions_keeps_nodes_whose_eviction_loses_more_than_it_saves() -> None:
    n = replace(node("n1", 8000, 32768, 4, "T4", labels={L.INSTANCE_TYPE: "x"}), hourly_cost=8.0)
    p = pod("p", gpus=1, node="n1")
    plan = DisruptionPlan((_action(ActionKind.DELETE, DisruptionReason.UNDERUTILIZED, 8.0, (p.key,)),), (), {})
    rule = WorkCostRule(horizon_s=3600.0)
    # a quarter of an $8/h node for 2 h = $4 of work < $8 saved in the hour: goes ahead
    assert weigh_actions(plan, [n], [p], {p.key: 0.0}, NO_CATALOG, rule, 7200.0) is plan
    # for 5 h: $10 > $8: kept, with the reason
    out = weigh_actions(plan, [n], [p], {p.key: 0.0}, NO_CATALOG, rule, 5 * 3600.0)
    assert out.actions == () and out.kept[0].reason is KeepReason.WORK_LOST and "$10.00" in out.kept[0].message
    # a longer horizon counts more saving
    assert weigh_actions(plan, [n], [p], {p.key: 0.0}, NO_CATALOG, WorkCostRule(2 * 3600.0), 5 * 3600.0) is plan
    # empty and drifted nodes are never held back
    for reason in (DisruptionReason.EMPTY, DisruptionReason.DRIFTED):
        other = DisruptionPlan((_action(ActionKind.DELETE, reason, 8.0, (p.key,)),), (), {})
        assert weigh_actions(other, [n], [p], {p.key: 0.0}, NO_CATALOG, rule, 50 * 3600.0) is other


# ------------------------------------------------------------------------------------------------ validation
def test_policy_keys_parse_and_default_off() -> None:
    cfg = ControllerConfig.from_policy({})
    assert cfg.eviction_cost is None and cfg.headroom == {}
    cfg = ControllerConfig.from_policy(
        {
            "evictionCost": {"horizon": "2h"},
            "headroom": {"gpu": {"policy": "Predictive", "maxNodes": 2, "maxHourlyCost": 3.5, "lead": "5m"}},
        }
    )
    assert cfg.eviction_cost == WorkCostRule(7200.0)
    assert cfg.headroom["gpu"] == HeadroomSpec(max_nodes=2, max_hourly_cost=3.5, lead_s=300.0)
    assert ControllerConfig.from_policy({"evictionCost": True}).eviction_cost == WorkCostRule()
    assert ControllerConfig.from_policy({"evictionCost": False}).eviction_cost is None


@pytest.mark.parametrize(
    ("policy", "where", "words"),
    [
        ({"evictionCost": "yes"}, "policy.evictionCost", "true, false or a mapping"),
        ({"evictionCost": {"horizon": "soon"}}, "policy.evictionCost.horizon", "not a duration"),
        ({"evictionCost": {"horizon": 0}}, "policy.evictionCost.horizon", "positive"),
        ({"evictionCost": {"span": "1h"}}, "policy.evictionCost.span", "unknown evictionCost setting"),
        ({"headroom": [1]}, "policy.headroom", "must map pool names"),
        ({"headroom": {"gpu": {"maxNodes": 2}}}, "policy.headroom.gpu", "maxHourlyCost is required"),
        ({"headroom": {"gpu": {"maxNodes": 0, "maxHourlyCost": 1}}}, "policy.headroom.gpu.maxNodes", "integer"),
        ({"headroom": {"gpu": {"maxNodes": 1, "maxHourlyCost": -1}}}, "policy.headroom.gpu.maxHourlyCost", "number"),
        ({"headroom": {"gpu": {"policy": "Static", "maxNodes": 1, "maxHourlyCost": 1}}}, "gpu.policy", "Predictive"),
        ({"headroom": {"gpu": {"maxNodes": 1, "maxHourlyCost": 1, "quantile": 2}}}, "gpu.quantile", "0 to 1"),
        ({"headroom": {"gpu": {"maxNodes": 1, "maxHourlyCost": 1, "size": 2}}}, "gpu.size", "unknown headroom"),
        ({"headroom": {"gpu": {"maxNodes": 1, "maxHourlyCost": 1, "launch": "no"}}}, "gpu.launch", "true or false"),
    ],
)
def test_bad_policy_settings_are_one_line_errors(policy: dict[str, object], where: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        ControllerConfig.from_policy(policy)
    assert where in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


SCENARIO = """
name: hr
catalog: linode
pools:
  - name: gpu
    headroom: {HEADROOM}
workload:
  - source: burst
    count: 1
    at: 0s
    shape: {{cpu: 1, memory: 1Gi, gpus: 1}}
    runtime: 1m
policy: {POLICY}
"""


def test_a_pools_headroom_in_a_scenario_goes_to_the_policy() -> None:
    text = SCENARIO.format(HEADROOM="{policy: Predictive, maxNodes: 1, maxHourlyCost: 5}", POLICY="{name: gpuscale}")
    sc = parse_scenario(text, source="hr.yaml")
    assert sc.policy["headroom"] == {"gpu": {"policy": "Predictive", "maxNodes": 1, "maxHourlyCost": 5}}
    assert ControllerConfig.from_policy(sc.policy).headroom["gpu"].max_nodes == 1


@pytest.mark.parametrize(
    ("headroom", "policy", "where"),
    [
        ("{maxNodes: two, maxHourlyCost: 5}", "{name: gpuscale}", "pools[0].headroom.maxNodes"),
        ("{maxNodes: 1}", "{name: gpuscale}", "pools[0].headroom"),
        ("{maxNodes: 1, maxHourlyCost: 5}", "{headroom: {cpu: {maxNodes: 1, maxHourlyCost: 1}}}", "headroom.cpu"),
    ],
)
def test_bad_scenario_headroom_names_the_field(headroom: str, policy: str, where: str) -> None:
    with pytest.raises(InputError) as err:
        parse_scenario(SCENARIO.format(HEADROOM=headroom, POLICY=policy), source="hr.yaml")
    assert "hr.yaml" in str(err.value) and where in str(err.value)


def test_baselines_ignore_gpuscales_options() -> None:
    cfg = _config({"evictionCost": True, "headroom": {"gpu": {"maxNodes": 1, "maxHourlyCost": 1}}})
    assert cfg.eviction_cost is None and cfg.headroom == {}
    assert dataclasses.replace(cfg) == _config({})
