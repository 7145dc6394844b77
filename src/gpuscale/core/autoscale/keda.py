"""KEDA's semantics on top of the HPA computation, pure: one :func:`step` is one sync of one scaler.

* Activation decides 0 <-> 1: a trigger is active when its value is strictly greater than its
  ``activationThreshold``; from zero (or from ``idleReplicaCount``) an active scaler goes to ``minReplicaCount``
  (at least 1). Activation is re-evaluated every ``pollingInterval`` seconds; in between the last verdict holds.
* The threshold decides 1 <-> N, through :func:`gpuscale.core.autoscale.hpa.decide` with the HPA's minimum at
  ``max(minReplicaCount, 1)`` and maximum at ``maxReplicaCount``.
* ``cooldownPeriod`` applies only to going to zero (or to ``idleReplicaCount``): the scaler must have been inactive
  for longer than it.
* After more than ``fallback.failureThreshold`` consecutive failures of a trigger, that trigger proposes
  ``fallback.replicas`` to the HPA; a failing trigger (in fallback or not) is not active, but blocks going to
  zero; a target at zero stays there (the HPA is off at zero, so a fallback applies only to a running target).
* ``schedules`` (gpuscale's own) raise the minimum to a schedule's replicas while its cron window is open.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuscale.core.autoscale.hpa import (
    Behavior,
    HpaDecision,
    HpaSpec,
    HpaState,
    MetricTarget,
    PodCounts,
    Sample,
    decide,
)
from gpuscale.core.cron import CronSchedule

DEFAULT_POLLING_INTERVAL_S = 30
DEFAULT_COOLDOWN_S = 300
DEFAULT_MAX_REPLICAS = 100


@dataclass(frozen=True, slots=True)
class Trigger:
    name: str
    metric: MetricTarget
    """The HPA metric; its target is the trigger's ``threshold``."""
    activation: float = 0.0
    ignore_null_values: bool = True
    """An empty query result reads as 0 (KEDA's default) instead of a failure."""


@dataclass(frozen=True, slots=True)
class Fallback:
    failure_threshold: int
    replicas: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """While the window from ``start`` to ``end`` (cron, UTC) is open, keep at least ``replicas``."""

    start: CronSchedule
    end: CronSchedule
    replicas: int
    name: str = ""


@dataclass(frozen=True, slots=True)
class ScalerSpec:
    triggers: tuple[Trigger, ...]
    min_replicas: int = 0
    max_replicas: int = DEFAULT_MAX_REPLICAS
    idle_replicas: int | None = None
    polling_interval_s: float = DEFAULT_POLLING_INTERVAL_S
    cooldown_s: float = DEFAULT_COOLDOWN_S
    initial_cooldown_s: float = 0.0
    """Before any activity, going to zero waits this long after the scaler's first sync (KEDA: after creation)."""
    fallback: Fallback | None = None
    behavior: Behavior = field(default_factory=Behavior)
    schedules: tuple[Schedule, ...] = ()

    def hpa(self, minimum: int) -> HpaSpec:
        """The HPA KEDA would create, with ``minimum`` (minReplicaCount, raised by a schedule)."""
        return HpaSpec(
            max(minimum, 1), self.max_replicas, tuple(t.metric for t in self.triggers), self.behavior
        )  # fmt: skip


EMPTY = float("nan")
"""A reading whose query returned no sample (``ignoreNullValues`` decides what it means)."""


@dataclass(frozen=True, slots=True)
class ScalerState:
    hpa: HpaState = field(default_factory=HpaState)
    failures: Mapping[str, int] = field(default_factory=dict)
    last_active: float | None = None
    last_poll: float | None = None
    active: bool = False
    active_reason: str = ""
    created: float | None = None


@dataclass(frozen=True, slots=True)
class ScalerDecision:
    current: int
    desired: int
    reason: str
    active: bool
    hpa: HpaDecision | None
    state: ScalerState = field(repr=False)

    def status(self, granted: int | None = None) -> dict[str, object]:
        """The GPUWorkloadScaler's ``status`` (``deploy/crds/gpuworkloadscaler.yaml``); ``granted`` is the budget
        arbiter's grant when the scaler is in a GPU budget."""
        out: dict[str, object] = {
            "currentReplicas": self.current,
            "desiredReplicas": self.desired,
            "active": self.active,
            "reason": self.reason,
            "health": {
                name: {"numberOfFailures": n, "status": "Failing" if n else "Happy"}
                for name, n in sorted(self.state.failures.items())
            },
        }
        if self.state.last_active is not None:
            when = dt.datetime.fromtimestamp(self.state.last_active, dt.UTC)
            out["lastActiveTime"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        if granted is not None:
            out["grantedReplicas"] = granted
        return out


def window_open(start: CronSchedule, end: CronSchedule, now: float) -> bool:
    """Whether ``now`` lies in a window opened by ``start`` and closed by ``end``: after ``now`` the next end comes
    before the next start (open from the start minute to just before the end minute; a minute matching both is
    closed)."""
    nxt_end, nxt_start = end.next_fire(now), start.next_fire(now)
    if nxt_end is None:
        return False
    return nxt_start is None or nxt_end < nxt_start


def schedule_floor(spec: ScalerSpec, now: float) -> tuple[int, str]:
    """The largest replicas of the schedules open at ``now``, and the schedule's name (0 and "" when none)."""
    best, name = 0, ""
    for i, s in enumerate(spec.schedules):
        if s.replicas > best and window_open(s.start, s.end, now):
            best, name = s.replicas, s.name or f"schedules[{i}]"
    return best, name


def _readings(spec: ScalerSpec, raw: Mapping[str, float | None]) -> dict[str, float | None]:
    """Trigger name -> value, or None for a failure (absent, or empty without ignoreNullValues)."""
    out: dict[str, float | None] = {}
    for t in spec.triggers:
        value = raw.get(t.name)
        if value is not None and value != value:  # EMPTY
            value = 0.0 if t.ignore_null_values else None
        out[t.name] = value
    return out


def step(
    spec: ScalerSpec,
    state: ScalerState,
    current: int,
    readings: Mapping[str, float | None],
    pods: PodCounts,
    now: float,
) -> ScalerDecision:
    """One sync: ``readings`` maps trigger names to values (absent or None: the query failed; :data:`EMPTY`: no
    sample). Returns the desired replicas with the reason and the new state."""
    values = _readings(spec, readings)
    failures = {t.name: 0 if values[t.name] is not None else state.failures.get(t.name, 0) + 1 for t in spec.triggers}
    fb = spec.fallback
    in_fallback = [n for n, f in failures.items() if fb is not None and f > fb.failure_threshold]
    failing = [n for n, f in failures.items() if f > 0]  # in fallback or not: never scale to zero on an error
    floor, sched = schedule_floor(spec, now)
    minimum = max(spec.min_replicas, floor)

    polled = state.last_poll is None or now - state.last_poll >= spec.polling_interval_s
    active, why = state.active, state.active_reason
    if polled:
        hits = [t for t in spec.triggers if (v := values[t.name]) is not None and v > t.activation]
        if hits:
            t = hits[0]
            active, why = True, f"{t.name} {values[t.name]:g} > activation {t.activation:g}"
        elif floor:
            active, why = True, f"schedule {sched} open"
        else:
            active, why = False, "no trigger above its activation threshold"
    last_active = now if active else state.last_active
    created = now if state.created is None else state.created
    new_state = ScalerState(
        state.hpa, failures, last_active, now if polled else state.last_poll, active, why, created
    )  # fmt: skip

    def out(desired: int, reason: str, hpa: HpaDecision | None = None, st: ScalerState = new_state) -> ScalerDecision:
        return ScalerDecision(current, desired, reason, active, hpa, st)

    idle = spec.idle_replicas
    if polled:  # KEDA's scale executor
        if active and (current == 0 or (idle is not None and current < minimum)):
            target = max(minimum, 1)
            return out(target, f"activated ({why}): {current} -> {target}")
        if not active and not failing:
            if (idle is not None and current > idle) or (current > 0 and minimum == 0):
                to = idle if idle is not None else 0
                if (state.last_active is None and created + spec.initial_cooldown_s <= now) or (
                    state.last_active is not None and state.last_active + spec.cooldown_s < now
                ):
                    return out(to, f"inactive ({why}) past cooldownPeriod {spec.cooldown_s:g}s: {current} -> {to}")
            elif current < minimum and idle is None:
                return out(minimum, f"below minReplicaCount {minimum}: {current} -> {minimum}")
    if current == 0:
        reason = f"idle at 0 ({why})"
        if failing:  # KEDA does not activate on an error, fallback or not: the HPA is off at 0
            reason = f"idle at 0; {', '.join(failing)} failing (a fallback applies only to a running target)"
        return out(0, reason)

    samples: dict[str, Sample] = {}
    for t in spec.triggers:
        v = values[t.name]
        if t.name in in_fallback and fb is not None:
            note = f"fallback {fb.replicas} after {failures[t.name]} consecutive failures"
            samples[t.name] = Sample(None, fixed=fb.replicas, note=note)
        elif v is None:
            samples[t.name] = Sample(None, note=f"query failed, {failures[t.name]} in a row")
        else:
            samples[t.name] = Sample(v)
    d = decide(spec.hpa(minimum), current, samples, pods, state.hpa, now)
    final = ScalerState(d.state, failures, last_active, new_state.last_poll, active, why, created)
    reason = d.reason
    if not active and current > 0 and minimum == 0 and state.last_active is not None:
        reason += f"; scale to zero after cooldown at t={state.last_active + spec.cooldown_s:g}"
    if floor and d.condition == "TooFewReplicas":
        reason += f" (schedule {sched})"
    return out(d.desired, reason, d, final)
