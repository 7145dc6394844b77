"""The HPA v2 replica computation against the worked examples of the Kubernetes documentation.

Each case id names the documentation section it comes from (kubernetes.io, "Horizontal Pod Autoscaling" concept page,
"HorizontalPodAutoscaler Walkthrough" task page); the expected numbers are the documentation's or hand-computed from
the rules the section states (shown in the comment of the case). Cases named ``k8s-TestReplicaCalc...`` are the
inputs and expected replicas of the HPA controller's own unit tests (``replica_calculator_test.go``).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.autoscale.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    Behavior,
    HpaSpec,
    HpaState,
    MetricKind,
    MetricTarget,
    PodCounts,
    PolicyType,
    Sample,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    decide,
    propose,
)

POD = MetricKind.POD_AVERAGE
AVG = MetricKind.AVERAGE_VALUE
VAL = MetricKind.VALUE
NO_WINDOWS = Behavior(
    ScalingRules(0, DEFAULT_SCALE_UP.policies), ScalingRules(0, DEFAULT_SCALE_DOWN.policies)
)  # fmt: skip
UNLIMITED = Behavior(
    ScalingRules(0, (ScalingPolicy(PolicyType.PERCENT, 10_000, 15),)),
    ScalingRules(0, (ScalingPolicy(PolicyType.PERCENT, 100, 15),)),
)


def one(kind: MetricKind, target: float, value: float, current: int, pods: PodCounts | None = None,
        behavior: Behavior = UNLIMITED, lo: int = 1, hi: int = 100) -> int:  # fmt: skip
    spec = HpaSpec(lo, hi, (MetricTarget("m", kind, target),), behavior)
    return decide(spec, current, {"m": Sample(value)}, pods or PodCounts(current), HpaState(), 0.0).desired


# (id, kind, target, value, current, pods, expected)
RATIO_CASES = [
    # "Algorithm details": 200m over a 100m target doubles the replicas
    ("algorithm-details-200m-over-100m-doubles", POD, 0.1, 0.2, 3, None, 6),
    # "Algorithm details": 50m over a 100m target halves them
    ("algorithm-details-50m-over-100m-halves", POD, 0.1, 0.05, 6, None, 3),
    # "Algorithm details": within the 0.1 tolerance nothing changes (ratio 1.05 and 0.95)
    ("algorithm-details-tolerance-0.1-above", POD, 100, 105, 4, None, 4),
    ("algorithm-details-tolerance-0.1-below", POD, 100, 95, 4, None, 4),
    ("algorithm-details-just-past-tolerance", POD, 100, 111, 10, None, 12),  # ceil(1.11 * 10)
    # "HorizontalPodAutoscaler Walkthrough": CPU at 305% of request with a 50% target -> 7 replicas from 1
    ("walkthrough-cpu-305pct-target-50pct-7-replicas", POD, 50, 305, 1, None, 7),
    # "Algorithm details", missing metrics on a scale-down count as 100% of target: (4*50 + 4*100)/8 -> 0.75 -> 6
    ("algorithm-details-missing-metrics-scale-down-at-target", POD, 100, 50, 8, PodCounts(4, 0, 4), 6),
    # ... on a scale-up they count as 0%: (4*150 + 0)/5 = 120 -> ceil(1.2 * 5) = 6
    ("algorithm-details-missing-metrics-scale-up-at-zero", POD, 100, 150, 5, PodCounts(4, 0, 1), 6),
    # ... and when that reverses the direction nothing happens: (2*150 + 0)/4 = 75 < 100
    ("algorithm-details-missing-metrics-reverse-direction", POD, 100, 150, 4, PodCounts(2, 0, 2), 4),
    # not-yet-ready pods count as 0% on a scale-up: (2*200 + 0)/4 = 100 -> within tolerance, no change
    ("algorithm-details-not-ready-pods-zero-on-scale-up", POD, 100, 200, 4, PodCounts(2, 2, 0), 4),
    # ... and are ignored on a scale-down: 50/100 over the 2 ready pods -> 1
    ("algorithm-details-not-ready-pods-ignored-on-scale-down", POD, 100, 50, 4, PodCounts(2, 2, 0), 1),
    # "Scaling on custom metrics" / External AverageValue: the total divided by the per-pod target
    ("external-averagevalue-total-over-target", AVG, 100, 1000, 3, None, 10),
    ("external-averagevalue-within-tolerance", AVG, 100, 310, 3, None, 3),
    # External Value: ratio times ready pods
    ("external-value-ratio-times-ready-pods", VAL, 100, 250, 2, None, 5),
    ("external-value-counts-ready-pods-not-unready", VAL, 100, 250, 4, PodCounts(1, 2, 1), 5),  # 2.5 x (1 + 1)
]


# The HPA controller's own unit tests (kubernetes/kubernetes, pkg/controller/podautoscaler/replica_calculator_test.go):
# pods' levels as (average over the ready pods with metrics, pod counts); equal requests, so utilisation targets are
# per-pod values.
RATIO_CASES += [
    ("k8s-TestReplicaCalcScaleUp", POD, 300, 500, 3, None, 5),  # levels 300, 500, 700
    ("k8s-TestReplicaCalcScaleUpUnreadyLessScale", POD, 300, 600, 3, PodCounts(2, 1, 0), 4),
    ("k8s-TestReplicaCalcScaleUpUnreadyNoScale", POD, 300, 400, 3, PodCounts(1, 2, 0), 3),
    ("k8s-TestReplicaCalcScaleUpCM", POD, 15000, 20000, 3, None, 4),
    ("k8s-TestReplicaCalcScaleUpCMUnreadyLessScale", POD, 15000, 30000, 3, PodCounts(2, 1, 0), 4),
    ("k8s-TestReplicaCalcScaleUpCMUnreadyNoScaleWouldScaleDown", POD, 15000, 15000, 3, PodCounts(1, 2, 0), 3),
    ("k8s-TestReplicaCalcScaleDown", POD, 500, 280, 5, None, 3),  # levels 100, 300, 500, 250, 250
    ("k8s-TestReplicaCalcScaleDownCM", POD, 20000, 12000, 5, None, 3),
    ("k8s-TestReplicaCalcScaleDownIgnoresUnreadyPods", POD, 500, 300, 5, PodCounts(3, 2, 0), 2),
    ("k8s-TestReplicaCalcToleranceCM", POD, 20000, 62000 / 3, 3, None, 3),  # 20000, 21000, 21000
    ("k8s-TestReplicaCalcMissingMetrics", POD, 1000, 247.5, 4, PodCounts(2, 0, 2), 3),  # levels 400, 95
    ("k8s-TestReplicaCalcMissingMetricsNoChangeEq", POD, 1000, 1000, 2, PodCounts(1, 0, 1), 2),
    ("k8s-TestReplicaCalcMissingMetricsNoChangeGt", POD, 1000, 1900, 2, PodCounts(1, 0, 1), 2),
    ("k8s-TestReplicaCalcMissingMetricsNoChangeLt", POD, 1000, 600, 2, PodCounts(1, 0, 1), 2),
    ("k8s-TestReplicaCalcMissingMetricsUnreadyNoChange", POD, 500, 450, 3, PodCounts(1, 1, 1), 3),
    ("k8s-TestReplicaCalcMissingMetricsUnreadyScaleUp", POD, 500, 2000, 3, PodCounts(1, 1, 1), 4),
]


@pytest.mark.parametrize(("kind", "target", "value", "current", "pods", "expected"),
                         [c[1:] for c in RATIO_CASES], ids=[c[0] for c in RATIO_CASES])  # fmt: skip
def test_replica_ratio(kind: MetricKind, target: float, value: float, current: int, pods: PodCounts | None,
                       expected: int) -> None:  # fmt: skip
    assert one(kind, target, value, current, pods, lo=1) == expected


def test_per_direction_tolerance_configurable_tolerance_example() -> None:
    """ "Tolerance" section: a 100Mi memory target with scale-up tolerance 5% scales up above 105Mi only."""
    b = Behavior(
        ScalingRules(0, UNLIMITED.scale_up.policies, tolerance=0.05), ScalingRules(0, UNLIMITED.scale_down.policies)
    )
    assert one(POD, 100, 104, 10, behavior=b) == 10
    assert one(POD, 100, 106, 10, behavior=b) == 11  # ceil(1.06 * 10)
    assert one(POD, 100, 91, 10, behavior=b) == 10  # scale-down keeps the default 0.1


def test_several_metrics_take_the_largest_proposal() -> None:
    """ "Scaling on multiple metrics": each metric proposes, the largest wins."""
    spec = HpaSpec(1, 20, (MetricTarget("util", POD, 70), MetricTarget("queue", AVG, 10)), UNLIMITED)
    d = decide(spec, 4, {"util": Sample(35), "queue": Sample(80)}, PodCounts(4), HpaState(), 0.0)
    assert (d.desired, d.metric) == (8, "queue")
    assert [p.replicas for p in d.proposals] == [2, 8]
    assert "queue proposes 8" in d.reason


def test_a_failed_metric_blocks_a_scale_down_but_not_a_scale_up() -> None:
    spec = HpaSpec(1, 20, (MetricTarget("a", POD, 70), MetricTarget("b", AVG, 10)), UNLIMITED)
    down = decide(spec, 4, {"a": Sample(10)}, PodCounts(4), HpaState(), 0.0)
    assert (down.desired, down.condition) == (4, "FailedGetMetrics")
    up = decide(spec, 4, {"a": Sample(140)}, PodCounts(4), HpaState(), 0.0)
    assert up.desired == 8
    none = decide(spec, 4, {}, PodCounts(4), HpaState(), 0.0)
    assert (none.desired, none.condition) == (4, "FailedGetMetrics")


def run(spec: HpaSpec, steps: list[tuple[float, float]], current: int) -> list[int]:
    """Feed (t, value) of metric "m" through successive syncs, applying each decision."""
    state, out = HpaState(), []
    for t, value in steps:
        d = decide(spec, current, {"m": Sample(value)}, PodCounts(current), state, t)
        state, current = d.state, d.desired
        out.append(current)
    return out


def test_default_scale_up_behavior_4_pods_or_100_percent_per_15s() -> None:
    """ "Default Behavior": scale up by at most max(4 pods, 100 %) every 15 s, no window. From 1 replica to the
    walkthrough's 7: 1 -> 5 (1 + 4 beats 2 x 1) -> 7."""
    spec = HpaSpec(1, 10, (MetricTarget("m", POD, 50),))
    state = HpaState()
    d = decide(spec, 1, {"m": Sample(305)}, PodCounts(1), state, 0.0)
    assert (d.desired, d.condition) == (5, "ScaleUpLimit")
    assert "Pods 4 pods per 15s" in d.reason
    # 15 s later the event of t=0 has left the period: the limit counts from 5 again (max(9, 10) = 10)
    d2 = decide(spec, 5, {"m": Sample(305 / 5)}, PodCounts(5), d.state, 15.0)
    assert d2.desired == 7 and d2.condition == "DesiredWithinRange"
    # within the same period the first step's +4 still counts: start 1 -> limit 5 -> no further growth
    d3 = decide(spec, 5, {"m": Sample(305 / 5)}, PodCounts(5), d.state, 10.0)
    assert d3.desired == 5 and d3.condition == "ScaleUpLimit"


def test_default_scale_down_window_300s() -> None:
    """ "Stabilization window": scale-down uses the highest recommendation of the last 300 s (default)."""
    spec = HpaSpec(1, 10, (MetricTarget("m", POD, 50),))
    got = run(spec, [(0, 200), (15, 25), (150, 25), (299, 25), (300, 25)], 4)
    # t=0 recommends ceil(4 * 4) = 16, the default scale-up policy allows max(4 + 4, 2 x 4) = 8; afterwards the metric
    # recommends ceil(0.5 * 8) = 4 but the window keeps 16 (t=0's unstabilised recommendation) until t=300, when it
    # is no longer strictly inside the window
    assert got == [8, 8, 8, 8, 4]


def test_scaling_policies_example_80_replicas_pods_4_percent_10_per_60s() -> None:
    """ "Scaling Policies": scale-down with Pods 4 and Percent 10 per 60 s, from 80 to 10: the first step removes 8,
    at 72 the 10 % (7.2) still removes 8; below 40 replicas the Pods policy (4) allows the larger change."""
    down = ScalingRules(300, (ScalingPolicy(PolicyType.PODS, 4, 60), ScalingPolicy(PolicyType.PERCENT, 10, 60)))
    spec = HpaSpec(1, 100, (MetricTarget("m", AVG, 100),), Behavior(DEFAULT_SCALE_UP, down))
    got = run(spec, [(60 * i, 1000) for i in range(20)], 80)
    assert got[:3] == [72, 64, 57]
    assert got[3:8] == [51, 45, 40, 36, 32]  # 57 * 0.9 = 51.3 -> 51 (Percent beats Pods 53), ...
    assert got[8:12] == [28, 24, 20, 16]  # below 40 replicas: 4 at a time (10 % of 32 is 3.2)
    assert got[-1] == 10
    # within one period, the change already made counts: 15 s after the first step nothing more is removed
    state = decide(spec, 80, {"m": Sample(1000)}, PodCounts(80), HpaState(), 0.0).state
    d = decide(spec, 72, {"m": Sample(1000)}, PodCounts(72), state, 15.0)
    assert (d.desired, d.condition) == (72, "ScaleDownLimit")


def test_select_policy_min_and_disabled() -> None:
    """ "Scaling Policies" selectPolicy: Min picks the smallest change; "Example: disable scale down"."""
    down = ScalingRules(
        0, (ScalingPolicy(PolicyType.PODS, 4, 60), ScalingPolicy(PolicyType.PERCENT, 10, 60)), SelectPolicy.MIN
    )
    spec = HpaSpec(1, 100, (MetricTarget("m", AVG, 100),), Behavior(DEFAULT_SCALE_UP, down))
    assert run(spec, [(0, 1000)], 80) == [76]
    off = ScalingRules(0, down.policies, SelectPolicy.DISABLED)
    spec = HpaSpec(1, 100, (MetricTarget("m", AVG, 100),), Behavior(DEFAULT_SCALE_UP, off))
    d = decide(spec, 80, {"m": Sample(1000)}, PodCounts(80), HpaState(), 0.0)
    assert (d.desired, d.condition) == (80, "ScaleDownLimit") and "disabled" in d.reason


def test_scale_up_stabilization_window_takes_the_lowest() -> None:
    up = ScalingRules(60, UNLIMITED.scale_up.policies)
    spec = HpaSpec(1, 100, (MetricTarget("m", AVG, 10),), Behavior(up, UNLIMITED.scale_down))
    got = run(spec, [(0, 20), (15, 80), (30, 80), (61, 80)], 2)
    assert got == [2, 2, 2, 8]


def test_clamping_to_min_and_max() -> None:
    assert one(AVG, 10, 1000, 5, hi=20) == 20
    assert one(AVG, 10, 1, 5, lo=3) == 3
    spec = HpaSpec(2, 6, (MetricTarget("m", AVG, 10),))
    assert decide(spec, 9, {}, PodCounts(9), HpaState(), 0).condition == "TooManyReplicas"
    assert decide(spec, 1, {}, PodCounts(1), HpaState(), 0).desired == 2
    assert decide(spec, 0, {}, PodCounts(0), HpaState(), 0).condition == "ScalingDisabled"


def test_fixed_sample_and_zero_current_external() -> None:
    target = MetricTarget("m", AVG, 10)
    assert propose(target, Sample(None, fixed=3, note="fallback"), 5, PodCounts(5), Behavior()).replicas == 3
    assert propose(target, Sample(25), 0, PodCounts(0), Behavior()).replicas == 3
    assert propose(MetricTarget("v", VAL, 10), Sample(25), 0, PodCounts(0), Behavior()).replicas == 3


@pytest.mark.parametrize(
    ("current", "proposed", "recs", "expected", "condition"),
    [
        (5, 10, ((-120, 8), (-240, 7)), 7, "ScaleUpStabilized"),  # lowest of the 300 s scale-up window
        (8, 3, ((-300, 5), (-480, 4)), 5, "ScaleDownStabilized"),  # -300 s is outside the up window, inside down's
    ],
    ids=["controller-tests-scale-up-stabilized", "controller-tests-scale-down-stabilized"],
)
def test_stabilization_windows_300_up_600_down(
    current: int, proposed: int, recs: tuple[tuple[int, int], ...], expected: int, condition: str
) -> None:
    """The stabilisation cases of the HPA controller tests (windows 300 s up, 600 s down, earlier recommendations
    at the given offsets): the result stays between the up window's lowest and the down window's highest."""
    b = Behavior(ScalingRules(300, UNLIMITED.scale_up.policies), ScalingRules(600, UNLIMITED.scale_down.policies))
    spec = HpaSpec(1, 100, (MetricTarget("m", AVG, 10),), b)
    now = 1000.0
    state = HpaState(recommendations=tuple((now + dt, r) for dt, r in recs))
    d = decide(spec, current, {"m": Sample(proposed * 10)}, PodCounts(current), state, now)
    assert (d.desired, d.condition) == (expected, condition)
    assert d.state.recommendations[-1] == (now, proposed)  # the unstabilised recommendation is recorded


# ------------------------------------------------------------------------------------------------- properties
PROPS = settings(max_examples=300, derandomize=True, deadline=None, database=None)
KINDS = st.sampled_from([POD, AVG, VAL])


@PROPS
@given(KINDS, st.integers(1, 1000), st.floats(0, 10_000, allow_nan=False), st.integers(1, 40), st.integers(1, 10),
       st.integers(10, 50), st.integers(0, 3), st.integers(0, 3))  # fmt: skip
def test_default_behavior_bounds(kind: MetricKind, target: int, value: float, current: int, lo: int, hi: int,
                                 unready: int, missing: int) -> None:  # fmt: skip
    """From a count within [min, max]: the result stays within them, grows by at most max(4, 100 %) in a sync, and
    a within-tolerance ratio changes nothing."""
    current = max(min(current, hi), lo)
    pods = PodCounts(max(current - unready - missing, 1), unready, missing)
    spec = HpaSpec(lo, hi, (MetricTarget("m", kind, target),))
    d = decide(spec, current, {"m": Sample(value)}, pods, HpaState(), 0.0)
    assert lo <= d.desired <= hi
    assert d.desired <= max(current + 4, 2 * current)
    if kind is AVG and 0.9 <= value / (target * current) <= 1.1:
        assert d.desired == current


@PROPS
@given(KINDS, st.integers(1, 1000), st.floats(0, 10_000, allow_nan=False), st.floats(0, 10_000, allow_nan=False),
       st.integers(1, 40))  # fmt: skip
def test_monotone_in_the_metric(kind: MetricKind, target: int, a: float, b: float, current: int) -> None:
    """With every pod reporting and no windows or rate limits, a larger value never proposes fewer replicas."""
    lo_v, hi_v = sorted((a, b))
    spec = HpaSpec(1, 100_000, (MetricTarget("m", kind, target),), UNLIMITED)
    low = decide(spec, current, {"m": Sample(lo_v)}, PodCounts(current), HpaState(), 0.0).desired
    high = decide(spec, current, {"m": Sample(hi_v)}, PodCounts(current), HpaState(), 0.0).desired
    assert high >= low
