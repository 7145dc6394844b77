"""The Kubernetes HorizontalPodAutoscaler (``autoscaling/v2``) replica computation, step for step, pure.

One call of :func:`decide` is one HPA sync of one target:

1. each metric proposes a replica count from its usage ratio (``ceil(ratio * pods)``), or keeps the current count
   when the ratio is within the tolerance (0.1 by default; per direction when the behaviour sets one);
   a per-pod metric (:attr:`MetricKind.POD_AVERAGE`) runs the HPA's rebalance pass for pods missing the metric
   (100 % of target on a scale-down, 0 % on a scale-up, left out at a ratio of exactly 1) and not-ready pods (0 % on
   a scale-up, else ignored), and
   keeps the current count when that pass reverses the direction; external ``Value`` and ``AverageValue`` targets
   compute as the HPA does for External metrics (KEDA's triggers are External metrics);
2. the largest proposal wins (the first metric on a tie); when every metric failed, or one failed and the others
   propose fewer replicas than now, nothing changes;
3. stabilisation: the result is kept between the lowest recommendation of the scale-up window and the highest of
   the scale-down window (each recommendation is recorded unstabilised);
4. rate policies: a scale-up may reach at most the ``Max`` (or ``Min``) of the policies' limits, each counted from
   the replica count at the start of its ``periodSeconds`` (``Pods``: +value; ``Percent``: ``ceil``); scale-down
   alike (``Percent`` truncates); ``Disabled`` stops that direction; then min/max replicas clamp.

Values are carried at milli precision (rounded), as the metrics APIs carry them; averages divide in whole
milli-units as the HPA does. Every :class:`HpaDecision` says which metric won and what limited it, with the
condition names the HPA uses (``ScaleUpLimit``, ``ScaleDownStabilized``, ``TooManyReplicas``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

DEFAULT_TOLERANCE = 0.1
DEFAULT_SCALE_DOWN_WINDOW_S = 300
"""The controller's ``--horizontal-pod-autoscaler-downscale-stabilization`` default."""


class MetricKind(StrEnum):
    """How a metric's value turns into replicas."""

    POD_AVERAGE = "PodAverage"
    """A per-pod metric (HPA ``Pods`` source, ``AverageValue`` target): the value is the average over the ready pods
    that report it; missing and not-ready pods go through the rebalance pass."""
    VALUE = "Value"
    """An External metric with a ``Value`` target: ``ceil(value / target * readyPods)``."""
    AVERAGE_VALUE = "AverageValue"
    """An External metric with an ``AverageValue`` target (KEDA's default): ``ceil(value / target)``."""


class PolicyType(StrEnum):
    PODS = "Pods"
    PERCENT = "Percent"


class SelectPolicy(StrEnum):
    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """At most ``value`` pods (or percent) of change per ``period_s`` seconds."""

    type: PolicyType
    value: int
    period_s: int

    def label(self) -> str:
        unit = "%" if self.type is PolicyType.PERCENT else " pods"
        return f"{self.type} {self.value}{unit} per {self.period_s}s"


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction of ``spec.behavior`` (``scaleUp`` or ``scaleDown``)."""

    stabilization_window_s: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: SelectPolicy = SelectPolicy.MAX
    tolerance: float = DEFAULT_TOLERANCE


DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy(PolicyType.PODS, 4, 15), ScalingPolicy(PolicyType.PERCENT, 100, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(DEFAULT_SCALE_DOWN_WINDOW_S, (ScalingPolicy(PolicyType.PERCENT, 100, 15),))


@dataclass(frozen=True, slots=True)
class Behavior:
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


@dataclass(frozen=True, slots=True)
class MetricTarget:
    name: str
    kind: MetricKind
    target: float
    """Target value (per pod for POD_AVERAGE and AVERAGE_VALUE); > 0."""


@dataclass(frozen=True, slots=True)
class HpaSpec:
    min_replicas: int
    max_replicas: int
    metrics: tuple[MetricTarget, ...]
    behavior: Behavior = Behavior()


@dataclass(frozen=True, slots=True)
class PodCounts:
    """The target's pods at this sync: ready with the metric, not ready, and ready but missing the metric."""

    ready: int
    unready: int = 0
    missing: int = 0


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a metric: a value, nothing (``value=None``: the metric failed), or a proposal imposed from
    outside (``fixed``, KEDA's fallback) with its ``note``."""

    value: float | None
    fixed: int | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Proposal:
    metric: str
    replicas: int | None
    """None: the metric is invalid this sync."""
    ratio: float | None
    detail: str


@dataclass(frozen=True, slots=True)
class HpaState:
    """What the HPA remembers between syncs: unstabilised recommendations and scale events, as ``(t, n)``."""

    recommendations: tuple[tuple[float, int], ...] = ()
    scale_up_events: tuple[tuple[float, int], ...] = ()
    scale_down_events: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class HpaDecision:
    current: int
    desired: int
    reason: str
    """One line: which metric proposed what, and what limited it."""
    condition: str
    """The HPA's condition reason: DesiredWithinRange, ScaleUpLimit, ScaleDownLimit, TooManyReplicas,
    TooFewReplicas, ScaleUpStabilized, ScaleDownStabilized, FailedGetMetrics or ScalingDisabled."""
    metric: str | None
    proposals: tuple[Proposal, ...]
    state: HpaState = field(repr=False)


def milli(value: float) -> int:
    """A value in whole milli-units (the precision of Kubernetes quantities)."""
    return round(value * 1000)


def _within(ratio: float, up: float, down: float) -> bool:
    return (1.0 - down) <= ratio <= (1.0 + up)


def propose(target: MetricTarget, sample: Sample, current: int, pods: PodCounts, behavior: Behavior) -> Proposal:
    """The replica count one metric proposes (the HPA's replica calculator)."""
    name = target.name
    if sample.fixed is not None:
        return Proposal(name, sample.fixed, None, sample.note or f"fixed at {sample.fixed}")
    if sample.value is None:
        return Proposal(name, None, None, sample.note or "metric unavailable")
    up, down = behavior.scale_up.tolerance, behavior.scale_down.tolerance
    value_m, target_m = milli(sample.value), milli(target.target)
    if target_m <= 0:
        return Proposal(name, None, None, "target must be positive")
    if target.kind is MetricKind.POD_AVERAGE:
        return _pod_average(name, value_m, target_m, current, pods, up, down)
    if target.kind is MetricKind.VALUE:
        ratio = value_m / target_m
        if current == 0:
            return Proposal(name, math.ceil(ratio), ratio, f"value ratio {ratio:.3g} from zero")
        if pods.ready + pods.unready + pods.missing == 0:
            return Proposal(name, None, ratio, "no pods of the target to count")
        if _within(ratio, up, down):
            return Proposal(name, current, ratio, f"ratio {ratio:.3g} within tolerance")
        ready = pods.ready + pods.missing  # every ready pod counts: an External metric is not reported per pod
        n = math.ceil(ratio * ready)
        return Proposal(name, n, ratio, f"value ratio {ratio:.3g} x {ready} ready pods")
    # AverageValue of an External metric: the total shared among the current replicas
    ratio = (math.inf if value_m > 0 else math.nan) if current == 0 else value_m / (target_m * current)
    if not _within(ratio, up, down):
        n = math.ceil(value_m / target_m)
        return Proposal(name, n, ratio, f"total {sample.value:g} / {target.target:g} per pod")
    return Proposal(name, current, ratio, f"ratio {ratio:.3g} within tolerance")


def _pod_average(
    name: str, avg_m: int, target_m: int, current: int, pods: PodCounts, up: float, down: float
) -> Proposal:
    ready, unready, missing = pods.ready, pods.unready, pods.missing
    if ready <= 0:
        return Proposal(name, None, None, "no ready pod reports the metric")
    total = avg_m * ready
    ratio = (total // ready) / target_m
    up_with_unready = unready > 0 and ratio > 1.0
    if not up_with_unready and missing == 0:
        if _within(ratio, up, down):
            return Proposal(name, current, ratio, f"ratio {ratio:.3g} within tolerance")
        return Proposal(name, math.ceil(ratio * ready), ratio, f"ratio {ratio:.3g} x {ready} ready pods")
    counted = ready
    if missing > 0 and ratio < 1.0:  # scale-down: pods without the metric count as at target
        total += missing * target_m
        counted += missing
    elif missing > 0 and ratio > 1.0:  # scale-up: as 0 (at exactly 1.0 they are left out)
        counted += missing
    if up_with_unready:  # scale-up: unready pods count as 0
        counted += unready
    new_ratio = (total // counted) / target_m
    what = f"ratio {ratio:.3g} rebalanced to {new_ratio:.3g} over {counted} pods"
    if _within(new_ratio, up, down):
        return Proposal(name, current, new_ratio, f"{what}: within tolerance")
    if (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return Proposal(name, current, new_ratio, f"{what}: direction reversed, no change")
    n = math.ceil(new_ratio * counted)
    if (new_ratio < 1.0 and n > current) or (new_ratio > 1.0 and n < current):
        return Proposal(name, current, new_ratio, f"{what}: would move against the ratio, no change")
    return Proposal(name, n, new_ratio, what)


def _prune(state: HpaState, behavior: Behavior, now: float) -> HpaState:
    """Forget what can no longer count: recommendations older than both windows, events older than every period."""
    window = max(behavior.scale_up.stabilization_window_s, behavior.scale_down.stabilization_window_s)
    up_period = max((p.period_s for p in behavior.scale_up.policies), default=0)
    down_period = max((p.period_s for p in behavior.scale_down.policies), default=0)
    return HpaState(
        tuple(r for r in state.recommendations if r[0] > now - window),
        tuple(e for e in state.scale_up_events if e[0] > now - up_period),
        tuple(e for e in state.scale_down_events if e[0] > now - down_period),
    )


def _changed_within(period_s: int, events: tuple[tuple[float, int], ...], now: float) -> int:
    return sum(change for t, change in events if t > now - period_s)


def _period_start(policy: ScalingPolicy, current: int, state: HpaState, now: float) -> int:
    added = _changed_within(policy.period_s, state.scale_up_events, now)
    removed = _changed_within(policy.period_s, state.scale_down_events, now)
    return current - added + removed


def scale_up_limit(current: int, rules: ScalingRules, state: HpaState, now: float) -> tuple[int, str]:
    """The most replicas the scale-up policies allow now, and the policy that set it."""
    if rules.select_policy is SelectPolicy.DISABLED:
        return current, "scale-up disabled (selectPolicy Disabled)"
    best: tuple[int, str] | None = None
    for policy in rules.policies:
        start = _period_start(policy, current, state, now)
        if policy.type is PolicyType.PODS:
            proposed = start + policy.value
        else:
            proposed = math.ceil(start * (1 + policy.value / 100))
        better = best is None or (proposed > best[0] if rules.select_policy is SelectPolicy.MAX else proposed < best[0])
        if better:
            best = (proposed, f"scale-up policy {policy.label()} from {start}")
    return best if best is not None else (current, "no scale-up policy")


def scale_down_limit(current: int, rules: ScalingRules, state: HpaState, now: float) -> tuple[int, str]:
    """The fewest replicas the scale-down policies allow now, and the policy that set it."""
    if rules.select_policy is SelectPolicy.DISABLED:
        return current, "scale-down disabled (selectPolicy Disabled)"
    best: tuple[int, str] | None = None
    for policy in rules.policies:
        start = _period_start(policy, current, state, now)
        proposed = start - policy.value if policy.type is PolicyType.PODS else int(start * (1 - policy.value / 100))
        better = best is None or (proposed < best[0] if rules.select_policy is SelectPolicy.MAX else proposed > best[0])
        if better:
            best = (proposed, f"scale-down policy {policy.label()} from {start}")
    return best if best is not None else (current, "no scale-down policy")


def _stabilize(current: int, desired: int, behavior: Behavior, state: HpaState, now: float) -> tuple[int, str]:
    up_w = behavior.scale_up.stabilization_window_s
    down_w = behavior.scale_down.stabilization_window_s
    up_rec = down_rec = desired
    for t, rec in state.recommendations:
        if t > now - up_w:
            up_rec = min(up_rec, rec)
        if t > now - down_w:
            down_rec = max(down_rec, rec)
    result = min(max(current, up_rec), down_rec)
    if result > desired:
        return result, f"scale-down stabilization window {down_w}s keeps its highest recommendation {result}"
    if result < desired:
        return result, f"scale-up stabilization window {up_w}s keeps its lowest recommendation {result}"
    return result, ""


def _record(state: HpaState, current: int, desired: int, now: float) -> HpaState:
    if desired > current:
        return replace(state, scale_up_events=(*state.scale_up_events, (now, desired - current)))
    if desired < current:
        return replace(state, scale_down_events=(*state.scale_down_events, (now, current - desired)))
    return state


def decide(
    spec: HpaSpec,
    current: int,
    samples: Mapping[str, Sample],
    pods: PodCounts,
    state: HpaState,
    now: float,
) -> HpaDecision:
    """One HPA sync: the desired replicas for ``current`` given the metric ``samples`` (by metric name; a metric
    absent from ``samples`` failed), the pod counts, what the HPA remembers (``state``) and the time ``now``."""
    behavior = spec.behavior
    state = _prune(state, behavior, now)
    lo, hi = spec.min_replicas, spec.max_replicas

    def done(desired: int, reason: str, condition: str, metric: str | None = None, props: tuple[Proposal, ...] = (),
             st: HpaState = state) -> HpaDecision:  # fmt: skip
        return HpaDecision(current, desired, reason, condition, metric, props, _record(st, current, desired, now))

    if current == 0 and lo != 0:
        return done(0, "the target has 0 replicas: autoscaling is off until it is activated", "ScalingDisabled")
    if current > hi:
        return done(hi, f"current {current} is above maxReplicas {hi}", "TooManyReplicas")
    if current < lo:
        return done(lo, f"current {current} is below minReplicas {lo}", "TooFewReplicas")

    props = tuple(propose(m, samples.get(m.name, Sample(None)), current, pods, behavior) for m in spec.metrics)
    replicas, winner = 0, None
    invalid = [p for p in props if p.replicas is None]
    for p in props:
        if p.replicas is not None and (replicas == 0 or p.replicas > replicas):
            replicas, winner = p.replicas, p
    if len(invalid) >= len(props) or (invalid and replicas < current):
        bad = ", ".join(f"{p.metric} ({p.detail})" for p in invalid)
        why = (
            "no metric could be read"
            if len(invalid) >= len(props)
            else "a metric is missing and the others propose fewer"
        )
        return HpaDecision(current, current, f"{why}: {bad}; keeping {current}", "FailedGetMetrics", None, props, state)
    assert winner is not None
    proposed = f"{winner.metric} proposes {replicas} ({winner.detail})"

    stabilized, stab_reason = _stabilize(current, replicas, behavior, state, now)
    state = replace(state, recommendations=(*state.recommendations, (now, replicas)))
    desired, condition, limit = stabilized, "DesiredWithinRange", stab_reason
    if stab_reason:
        condition = "ScaleUpStabilized" if stabilized < replicas else "ScaleDownStabilized"
    if stabilized > current:
        cap, why = scale_up_limit(current, behavior.scale_up, state, now)
        cap = max(cap, current)
        if hi > cap:
            bound, cond, text = cap, "ScaleUpLimit", why
        else:
            bound, cond, text = hi, "TooManyReplicas", f"maxReplicas {hi}"
        if stabilized > bound:
            desired, condition, limit = bound, cond, f"{text} caps it at {bound}"
    elif stabilized < current:
        floor, why = scale_down_limit(current, behavior.scale_down, state, now)
        floor = min(floor, current)
        if lo < floor:
            bound, cond, text = floor, "ScaleDownLimit", why
        else:
            bound, cond, text = lo, "TooFewReplicas", f"minReplicas {lo}"
        if stabilized < bound:
            desired, condition, limit = bound, cond, f"{text} floors it at {bound}"
    reason = proposed if not limit else f"{proposed}; {limit}"
    return done(desired, reason, condition, winner.metric, props, state)
