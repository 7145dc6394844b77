"""KEDA's semantics on top of the HPA computation: activation 0 <-> 1 (strictly greater than), the threshold
1 <-> N, cooldown only towards zero, fallback after more than failureThreshold failures, polling interval, idle
replicas and cron schedules."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.core.autoscale.budget import Budget, ModelShare
from gpuscale.core.autoscale.fleet import Member, Membership, plan
from gpuscale.core.autoscale.fleet import status as fleet_status
from gpuscale.core.autoscale.hpa import (
    Behavior,
    MetricKind,
    MetricTarget,
    PodCounts,
    PolicyType,
    ScalingPolicy,
    ScalingRules,
)
from gpuscale.core.autoscale.keda import EMPTY, Fallback, ScalerSpec, ScalerState, Schedule, Trigger, step, window_open
from gpuscale.core.autoscale.replay import HistoryStep, replay
from gpuscale.core.cron import parse_cron

FAST = Behavior(
    ScalingRules(0, (ScalingPolicy(PolicyType.PERCENT, 10_000, 1),)),
    ScalingRules(0, (ScalingPolicy(PolicyType.PERCENT, 100, 1),)),
)


def spec(**kw: Any) -> ScalerSpec:
    base: dict[str, Any] = {
        "triggers": (Trigger("q", MetricTarget("q", MetricKind.AVERAGE_VALUE, 10), activation=5),),
        "min_replicas": 0, "max_replicas": 20, "polling_interval_s": 30, "cooldown_s": 300, "behavior": FAST,
    }  # fmt: skip
    base.update(kw)
    return ScalerSpec(**base)


def desired(s: ScalerSpec, steps: Sequence[tuple[float, Mapping[str, float]]], **kw: Any) -> list[int]:
    rows = replay(s, [HistoryStep(t, m) for t, m in steps], **kw)
    return [r.desired for r in rows]


def test_activation_is_strictly_greater_than_the_activation_threshold() -> None:
    assert desired(spec(), [(0, {"q": 5})]) == [0]
    assert desired(spec(), [(0, {"q": 5.001})]) == [1]


def test_activation_goes_to_one_then_the_threshold_takes_over() -> None:
    got = desired(spec(), [(0, {"q": 80}), (30, {"q": 80}), (60, {"q": 30})])
    assert got == [1, 8, 3]


def test_activation_goes_to_min_replica_count_with_idle_replicas() -> None:
    s = spec(min_replicas=3, idle_replicas=0)
    got = desired(s, [(0, {"q": 0}), (30, {"q": 6}), (60, {"q": 6})], initial=0)
    assert got == [0, 3, 3]  # 6 / 10 -> 1, but the HPA's minimum is minReplicaCount


def test_cooldown_applies_only_to_going_to_zero() -> None:
    steps = [(0, {"q": 60}), (30, {"q": 60}), (60, {"q": 1}), (90, {"q": 1}), (330, {"q": 1}), (361, {"q": 1})]
    got = desired(spec(), steps)
    # 1 -> 6, then the threshold brings it down to 1 at once (no cooldown for 6 -> 1); last active at t=30, so zero
    # only once 30 + 300 < t
    assert got == [1, 6, 1, 1, 1, 0]
    rows = replay(spec(), [HistoryStep(t, m) for t, m in steps])
    assert "cooldown" in rows[-2].reason and "cooldownPeriod 300s" in rows[-1].reason


def test_initial_cooldown_before_any_activity() -> None:
    steps = [(0, {"q": 0}), (30, {"q": 0}), (60, {"q": 0})]
    assert desired(spec(), steps, initial=3) == [0, 0, 0]  # never active: zero at once
    # held off zero for 45 s after the first sync, the HPA meanwhile takes it to its minimum of 1
    assert desired(spec(initial_cooldown_s=45), steps, initial=3) == [1, 1, 0]


def test_never_scales_to_zero_with_min_replica_count() -> None:
    got = desired(spec(min_replicas=2), [(0, {"q": 0}), (400, {"q": 0}), (800, {"q": 0})], initial=2)
    assert got == [2, 2, 2]


def test_fallback_after_more_than_failure_threshold_failures() -> None:
    s = spec(fallback=Fallback(failure_threshold=2, replicas=7))
    got = desired(s, [(0, {"q": 30}), (30, {"q": 30}), (60, {}), (90, {}), (120, {}), (150, {"q": 30})])
    # 1 -> 3; two failures hold 3 (the HPA keeps its count when its only metric fails); the third is more than the
    # threshold: fallback 7; a good reading resets the count
    assert got == [1, 3, 3, 3, 7, 3]


def test_fallback_does_not_activate_from_zero_nor_allow_going_to_zero() -> None:
    s = spec(fallback=Fallback(failure_threshold=0, replicas=5))
    assert desired(s, [(0, {}), (30, {}), (400, {})]) == [0, 0, 0]  # KEDA: the HPA is off at 0, no activation
    rows = replay(s, [HistoryStep(0, {"q": 30}), HistoryStep(30, {}), HistoryStep(400, {}), HistoryStep(800, {})])
    assert [r.desired for r in rows] == [1, 5, 5, 5]  # running: fallback 5; inactive but erroring: never zero
    assert not rows[-1].active


def test_failures_without_fallback_never_scale_to_zero() -> None:
    got = desired(spec(), [(0, {"q": 30}), (30, {}), (400, {}), (800, {})])
    assert got == [1, 1, 1, 1]


def test_ignore_null_values() -> None:
    keep = spec()
    strict = spec(triggers=(Trigger("q", MetricTarget("q", MetricKind.AVERAGE_VALUE, 10), 5, False),),
                  fallback=Fallback(0, 4))  # fmt: skip
    steps: list[tuple[float, Mapping[str, float]]] = [(0, {"q": 30}), (30, {"q": EMPTY})]
    assert desired(keep, steps) == [1, 1]  # empty reads as 0: the HPA's minimum
    assert desired(strict, steps) == [1, 4]  # empty is a failure: fallback after more than 0 failures


def test_polling_interval_delays_activation() -> None:
    s = spec(polling_interval_s=60)
    got = desired(s, [(0, {"q": 0}), (30, {"q": 50}), (60, {"q": 50})])
    assert got == [0, 0, 1]


def test_cron_schedule_raises_the_minimum_while_open() -> None:
    weekdays = Schedule(parse_cron("0 8 * * 1-5"), parse_cron("0 20 * * 1-5"), 4, "business-hours")
    s = spec(schedules=(weekdays,))
    monday_7 = dt.datetime(2026, 1, 5, 7, 0, tzinfo=dt.UTC).timestamp()
    steps = [(0, {"q": 0}), (3600, {"q": 0}), (3630, {"q": 0}), (13 * 3600, {"q": 0}), (13 * 3600 + 400, {"q": 0})]
    rows = replay(s, [HistoryStep(t, m) for t, m in steps], start=monday_7)
    # 07:00 idle; 08:00 the window opens: active, from zero straight to the raised minimum; 20:00 it has closed and
    # the scaler was last seen active at 08:00:30 (the replay knows only its steps), more than the cooldown ago
    assert [r.desired for r in rows] == [0, 4, 4, 0, 0]
    assert "schedule business-hours" in rows[1].reason
    assert rows[2].reason.startswith("q proposes")


def test_cron_windows() -> None:
    start, end = parse_cron("0 8 * * 1-5"), parse_cron("0 20 * * 1-5")

    def at(y: int, mo: int, d: int, h: int, mi: int) -> float:
        return dt.datetime(y, mo, d, h, mi, tzinfo=dt.UTC).timestamp()

    assert window_open(start, end, at(2026, 1, 5, 8, 0))
    assert window_open(start, end, at(2026, 1, 5, 19, 59))
    assert not window_open(start, end, at(2026, 1, 5, 20, 0))
    assert not window_open(start, end, at(2026, 1, 10, 12, 0))  # Saturday
    night = (parse_cron("0 22 * * *"), parse_cron("0 6 * * *"))
    assert window_open(*night, at(2026, 1, 6, 3, 0)) and not window_open(*night, at(2026, 1, 6, 12, 0))


def test_status_matches_the_crd() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "deploy" / "crds" / "gpuworkloadscaler.yaml").read_text()
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    s = spec(fallback=Fallback(failure_threshold=5, replicas=2))
    state = ScalerState()
    d = step(s, state, 0, {"q": 60}, PodCounts(0), 90_000.0)
    d = step(s, d.state, d.desired, {}, PodCounts(1), 90_030.0)
    status = d.status(granted=1)
    jsonschema.validate(status, schema, format_checker=jsonschema.FormatChecker())
    assert status["lastActiveTime"] == "1970-01-02T01:00:00Z"
    assert status["health"] == {"q": {"numberOfFailures": 1, "status": "Failing"}}
    # the status the controller writes: the step's, with the round's conditions, fallback, state and scale time
    budget = Budget("ml/b", 4, 1.0, (ModelShare("m", 1),))
    member = Member("ml/s", s, d.state, 1, {"q": 60}, PodCounts(1), 0, Membership("ml/b", "m"))
    (outcome,) = plan([member], {"ml/b": budget}, {}, 90_060.0).outcomes
    written = fleet_status(outcome, last_scale_time="1970-01-02T01:01:00Z")
    jsonschema.validate(written, schema, format_checker=jsonschema.FormatChecker())
    assert set(written) == set(schema["properties"]) - {"rightsizing"}  # rightsizing: kube/rightsizer writes it
