"""One round over every scaler of a cluster (``gpuscale.core.autoscale.fleet``): due times, budget arbitration over
due and not-due members, the HPA's conditions, and the state that survives a restart through the status."""

from __future__ import annotations

from gpuscale.core.autoscale.budget import Budget, ModelShare
from gpuscale.core.autoscale.fleet import Member, Membership, plan, state_from_status, state_to_status, status
from gpuscale.core.autoscale.hpa import MetricKind, MetricTarget, PodCounts
from gpuscale.core.autoscale.keda import Fallback, ScalerSpec, ScalerState, Trigger

SPEC = ScalerSpec(
    triggers=(Trigger("load", MetricTarget("load", MetricKind.AVERAGE_VALUE, 100.0)),),
    min_replicas=1,
    max_replicas=8,
    polling_interval_s=10,
)
BUDGET = Budget("ml/shared", 4, 1.0, (ModelShare("llama", 1), ModelShare("mistral", 1)))


def member(
    key: str,
    load: float | None,
    current: int = 1,
    *,
    prio: int = 0,
    model: str = "",
    state: ScalerState | None = None,
    last_desired: int | None = None,
) -> Member:
    budget = Membership("ml/shared", model) if model else None
    readings = None if load is None else {"load": load}
    return Member(key, SPEC, state or ScalerState(), current, readings, PodCounts(current), prio, budget, last_desired)


def test_a_scaler_alone_scales_to_its_hpa_proposal_with_conditions() -> None:
    (out,) = plan([member("ml/a", 350.0)], {}, {}, 100.0).outcomes
    assert (out.current, out.wanted, out.target, out.scales) == (1, 4, 4, True)
    conds = {c.type: (c.status, c.reason) for c in out.conditions}
    assert conds == {
        "AbleToScale": ("True", "ReadyForNewScale"),
        "ScalingActive": ("True", "ValidMetricFound"),
        "ScalingLimited": ("False", "DesiredWithinRange"),
    }
    body = status(out, last_scale_time="2026-01-01T00:00:00Z")
    assert body["desiredReplicas"] == 4 and body["lastScaleTime"] == "2026-01-01T00:00:00Z"
    assert body["scalerState"]["lastPoll"] == 100.0 and "grantedReplicas" not in body


def test_the_higher_priority_member_wins_the_pool_and_the_other_keeps_its_guarantee() -> None:
    # 4 GPUs; each model guarantees 1. Both want 4: guarantees first (1 + 1), the 2 left go to priority 10.
    got = plan([member("ml/hi", 400.0, prio=10, model="llama"), member("ml/lo", 400.0, prio=1, model="mistral")],
               {"ml/shared": BUDGET}, {}, 0.0)  # fmt: skip
    by = {o.key: o for o in got.outcomes}
    assert (by["ml/hi"].target, by["ml/lo"].target) == (3, 1)
    assert by["ml/lo"].wanted == 4 and by["ml/lo"].grant is not None and by["ml/lo"].grant.refused == 3
    limited = next(c for c in by["ml/lo"].conditions if c.type == "ScalingLimited")
    assert (limited.status, limited.reason) == ("True", "BudgetLimited")
    assert "budget ml/shared grants 1" in by["ml/lo"].reason
    assert got.arbitrations["ml/shared"].used_gpus == 4
    # the rate policies count what was scaled (1 -> 1 for lo), not what the HPA wanted (1 -> 4)
    assert by["ml/lo"].state.hpa.scale_up_events == () and by["ml/hi"].state.hpa.scale_up_events == ((0.0, 2),)


def test_a_member_not_due_asks_for_its_last_desired_and_a_reclaim_applies_at_once() -> None:
    # lo borrowed llama's idle guarantee last round (it holds 3); now hi polls and wants 3: llama reclaims.
    polled = ScalerState(last_poll=95.0)
    first = plan([member("ml/hi", 0.0, prio=10, model="llama"), member("ml/lo", 300.0, model="mistral")],
                 {"ml/shared": BUDGET}, {}, 90.0)  # fmt: skip
    assert {o.key: o.target for o in first.outcomes} == {"ml/hi": 1, "ml/lo": 3}
    lo = member("ml/lo", None, current=3, model="mistral", state=polled, last_desired=3)
    second = plan([member("ml/hi", 300.0, prio=10, model="llama"), lo], {"ml/shared": BUDGET}, first.arbitrations,
                  100.0)  # fmt: skip
    by = {o.key: o for o in second.outcomes}
    assert by["ml/lo"].decision is None and by["ml/lo"].wanted == 3
    assert (by["ml/hi"].target, by["ml/lo"].target) == (3, 1)
    assert by["ml/lo"].scales, "the reclaim scales the lender down without waiting for its poll"
    assert by["ml/lo"].state.hpa.scale_down_events == ((100.0, 2),)


def test_a_budget_that_does_not_exist_limits_nothing_and_says_so() -> None:
    got = plan([member("ml/a", 350.0, model="llama")], {}, {}, 0.0)
    (out,) = got.outcomes
    assert out.target == 4 and got.missing_budgets == {"ml/a": "ml/shared"}
    assert "budget ml/shared not found" in out.reason


def test_failing_metrics_and_fallback_show_in_the_conditions() -> None:
    spec = ScalerSpec(SPEC.triggers, 1, 8, polling_interval_s=10, fallback=Fallback(1, 5))
    state = ScalerState()
    out = None
    for t in (0.0, 10.0):
        m = Member("ml/a", spec, state, 2, {"load": None}, PodCounts(2))
        (out,) = plan([m], {}, {}, t).outcomes
        state = out.state
    assert out is not None and out.fallback == ("load",) and out.target == 5
    active = next(c for c in out.conditions if c.type == "ScalingActive")
    assert (active.status, active.reason) == ("False", "FailedGetMetrics") and "fallback 5" in active.message
    assert status(out)["fallback"] == {"active": True, "triggers": ["load"]}


def test_the_state_round_trips_through_the_status() -> None:
    m = member("ml/a", 350.0)
    (out,) = plan([m], {}, {}, 100.0).outcomes
    (out2,) = plan([member("ml/a", 120.0, current=4, state=out.state)], {}, {}, 110.0).outcomes
    back = state_from_status(state_to_status(out2.state))
    assert back == out2.state
    assert back.hpa.recommendations and back.hpa.scale_up_events == ((100.0, 3),)
    # the restarted decision is the same as the uninterrupted one: the scale-down window still holds 4
    go_on = plan([member("ml/a", 120.0, current=4, state=back)], {}, {}, 120.0).outcomes[0]
    same = plan([member("ml/a", 120.0, current=4, state=out2.state)], {}, {}, 120.0).outcomes[0]
    assert go_on.target == same.target == 4
    assert state_from_status({"recommendations": "junk", "lastPoll": "x"}) == ScalerState()
