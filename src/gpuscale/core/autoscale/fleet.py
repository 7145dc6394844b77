"""One round of every scaler in a cluster, pure: KEDA/HPA decisions for the scalers that are due, then each GPU
budget's arbitration over its members, then what to scale and what to write in each status.

A scaler is *due* when ``pollingInterval`` seconds have passed since its last poll (:func:`due`); only due scalers
read their metrics and run :func:`gpuscale.core.autoscale.keda.step`. A budget is arbitrated every round over all
its members (a member not due asks for what it asked last), so an owner reclaiming its guarantee takes effect at
once. The target of a scaler is ``min(its desired, its grant)``.

The state the decisions need between rounds (:class:`~gpuscale.core.autoscale.keda.ScalerState`) is written into the
scaler's status (:func:`state_to_status`) and read back after a restart (:func:`state_from_status`), so a new
controller keeps the stabilisation windows, rate-policy periods, failure counts and the last active time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuscale.core.autoscale.budget import Arbitration, Budget, Demand, Grant, arbitrate
from gpuscale.core.autoscale.hpa import HpaState, PodCounts
from gpuscale.core.autoscale.keda import ScalerDecision, ScalerSpec, ScalerState, step

LIMITS = frozenset({"TooManyReplicas", "TooFewReplicas", "ScaleUpLimit", "ScaleDownLimit"})
"""HPA condition reasons that mean the desired count was limited (``ScalingLimited`` True)."""


@dataclass(frozen=True, slots=True)
class Membership:
    """A scaler's place in a GPU budget: the budget's key (``namespace/name``), its model and GPUs per replica."""

    budget: str
    model: str
    gpus_per_replica: int = 1


@dataclass(frozen=True, slots=True)
class Member:
    """One scaler at this round. ``readings`` is None when it is not due (its metrics were not read)."""

    key: str
    spec: ScalerSpec
    state: ScalerState
    current: int
    readings: Mapping[str, float | None] | None
    pods: PodCounts
    priority: int = 0
    budget: Membership | None = None
    last_desired: int | None = None
    """What it wanted at its last poll (used when it is not due)."""


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to do for one scaler: scale ``current`` to ``target`` (when they differ) and the status to write."""

    key: str
    current: int
    wanted: int
    """The scaler's own desired replicas (before its budget)."""
    target: int
    reason: str
    decision: ScalerDecision | None
    """None when the scaler was not due."""
    state: ScalerState
    grant: Grant | None = None
    conditions: tuple[Condition, ...] = ()
    fallback: tuple[str, ...] = ()
    """Triggers holding ``fallback.replicas``."""

    @property
    def scales(self) -> bool:
        return self.target != self.current


@dataclass(frozen=True, slots=True)
class RoundPlan:
    outcomes: tuple[Outcome, ...]
    arbitrations: Mapping[str, Arbitration]
    missing_budgets: Mapping[str, str]
    """Scaler key -> the budget key it names that does not exist."""


def due(spec: ScalerSpec, state: ScalerState, now: float) -> bool:
    """Whether a scaler polls its metrics at ``now``."""
    return state.last_poll is None or now - state.last_poll >= spec.polling_interval_s


def next_due(spec: ScalerSpec, state: ScalerState) -> float | None:
    """When the scaler polls next (None: at once)."""
    return None if state.last_poll is None else state.last_poll + spec.polling_interval_s


def plan(
    members: Sequence[Member],
    budgets: Mapping[str, Budget],
    previous: Mapping[str, Arbitration],
    now: float,
) -> RoundPlan:
    """One round (see the module docstring). ``budgets`` and ``previous`` are keyed by budget key."""
    decided: dict[str, tuple[int, ScalerDecision | None, ScalerState]] = {}
    for m in members:
        if m.readings is None:
            decided[m.key] = (m.last_desired if m.last_desired is not None else m.current, None, m.state)
        else:
            sync = step(m.spec, m.state, m.current, m.readings, m.pods, now)
            decided[m.key] = (sync.desired, sync, sync.state)

    arbitrations: dict[str, Arbitration] = {}
    missing: dict[str, str] = {}
    by_budget: dict[str, list[Member]] = {}
    for m in members:
        if m.budget is None:
            continue
        if m.budget.budget not in budgets:
            missing[m.key] = m.budget.budget
            continue
        by_budget.setdefault(m.budget.budget, []).append(m)
    grants: dict[str, Grant] = {}
    for key, group in sorted(by_budget.items()):
        demands = [
            Demand(m.key, m.budget.model, decided[m.key][0], m.priority, m.budget.gpus_per_replica)
            for m in group
            if m.budget is not None
        ]
        arb = arbitrate(budgets[key], demands, previous.get(key))
        arbitrations[key] = arb
        grants.update(arb.by_scaler())

    outcomes = []
    for m in members:
        wanted, d, state = decided[m.key]
        grant = grants.get(m.key)
        target = wanted if grant is None else min(wanted, grant.granted)
        state = _record_actual(state, m.current, d.desired if d is not None else m.current, target, now)
        reason = d.reason if d is not None else f"not due; keeping its last desired {wanted}"
        if grant is not None and target < wanted:
            reason += (
                f"; budget {m.budget.budget if m.budget else ''} grants {grant.granted}: {'; '.join(grant.reasons)}"
            )
        if m.key in missing:
            reason += f"; budget {missing[m.key]} not found (not limited by it)"
        fallback = _in_fallback(m.spec, state)
        conditions = _conditions(m, d, state, wanted, target, grant, fallback)
        outcomes.append(Outcome(m.key, m.current, wanted, target, reason, d, state, grant, conditions, fallback))
    return RoundPlan(tuple(outcomes), arbitrations, missing)


def _record_actual(state: ScalerState, current: int, recorded: int, target: int, now: float) -> ScalerState:
    """The rate policies count what was scaled: when the budget changes the HPA's result (``recorded``, the change
    the HPA noted at ``now``), note ``current -> target`` instead."""
    if target == recorded:
        return state
    hpa = state.hpa
    up, down = list(hpa.scale_up_events), list(hpa.scale_down_events)
    if recorded > current and up and up[-1] == (now, recorded - current):
        up.pop()
    elif recorded < current and down and down[-1] == (now, current - recorded):
        down.pop()
    if target > current:
        up.append((now, target - current))
    elif target < current:
        down.append((now, current - target))
    return replace(state, hpa=replace(hpa, scale_up_events=tuple(up), scale_down_events=tuple(down)))


def _in_fallback(spec: ScalerSpec, state: ScalerState) -> tuple[str, ...]:
    fb = spec.fallback
    if fb is None:
        return ()
    return tuple(sorted(n for n, f in state.failures.items() if f > fb.failure_threshold))


def _conditions(
    m: Member,
    d: ScalerDecision | None,
    state: ScalerState,
    wanted: int,
    target: int,
    grant: Grant | None,
    fallback: tuple[str, ...],
) -> tuple[Condition, ...]:
    """The HPA's three conditions. AbleToScale says the target can be scaled (the shell sets it False when reading or
    writing its scale subresource fails)."""
    able = Condition("AbleToScale", "True", "ReadyForNewScale", "the target's scale subresource can be updated")
    failing = sorted(n for n, f in state.failures.items() if f > 0)
    if d is None:
        active = Condition("ScalingActive", "True", "ValidMetricFound", "waiting for the next poll")
    elif m.current == 0 and wanted == 0:
        active = Condition("ScalingActive", "False", "ScalingDisabled", f"idle at 0: {d.reason}")
    elif failing and len(failing) == len(m.spec.triggers):
        note = f"; fallback {m.spec.fallback.replicas} replicas" if fallback and m.spec.fallback else ""
        active = Condition("ScalingActive", "False", "FailedGetMetrics", f"{', '.join(failing)} failing{note}")
    else:
        metric = d.hpa.metric if d.hpa is not None and d.hpa.metric else "the triggers"
        active = Condition("ScalingActive", "True", "ValidMetricFound", f"computed from {metric}")
    if grant is not None and target < wanted:
        limited = Condition("ScalingLimited", "True", "BudgetLimited",
                            f"wants {wanted}, the GPU budget grants {grant.granted}")  # fmt: skip
    elif d is not None and d.hpa is not None and d.hpa.condition in LIMITS:
        limited = Condition("ScalingLimited", "True", d.hpa.condition, d.hpa.reason)
    else:
        limited = Condition("ScalingLimited", "False", "DesiredWithinRange", "the desired count is within range")
    return able, active, limited


# ------------------------------------------------------------------------------------------------ status
def status(outcome: Outcome, *, last_scale_time: str | None = None) -> dict[str, Any]:
    """The GPUWorkloadScaler's ``status`` for an outcome (``deploy/crds/gpuworkloadscaler.yaml``)."""
    st = outcome.state
    out: dict[str, Any] = {
        "currentReplicas": outcome.current,
        "desiredReplicas": outcome.target,
        "active": st.active,
        "reason": outcome.reason,
        "health": {
            name: {"numberOfFailures": n, "status": "Failing" if n else "Happy"}
            for name, n in sorted(st.failures.items())
        },
        "conditions": [c.to_dict() for c in outcome.conditions],
        "fallback": {"active": bool(outcome.fallback), "triggers": list(outcome.fallback)},
        "scalerState": state_to_status(st),
    }
    if outcome.decision is not None:
        out.update({k: v for k, v in outcome.decision.status().items() if k == "lastActiveTime"})
    if outcome.grant is not None:
        out["grantedReplicas"] = outcome.grant.granted
    if last_scale_time is not None:
        out["lastScaleTime"] = last_scale_time
    return out


def _pairs(events: Sequence[tuple[float, int]]) -> list[dict[str, float | int]]:
    return [{"time": t, "replicas": n} for t, n in events]


def state_to_status(state: ScalerState) -> dict[str, Any]:
    """What the next controller needs to go on where this one stopped (epoch seconds)."""
    out: dict[str, Any] = {
        "active": state.active,
        "activeReason": state.active_reason,
        "failures": dict(sorted(state.failures.items())),
        "recommendations": _pairs(state.hpa.recommendations),
        "scaleUpEvents": _pairs(state.hpa.scale_up_events),
        "scaleDownEvents": _pairs(state.hpa.scale_down_events),
    }
    for key, value in (("lastPoll", state.last_poll), ("lastActive", state.last_active), ("created", state.created)):
        if value is not None:
            out[key] = value
    return out


def _read_pairs(raw: object) -> tuple[tuple[float, int], ...]:
    out = []
    for item in raw if isinstance(raw, list) else []:
        if (
            isinstance(item, dict)
            and isinstance(item.get("time"), int | float)
            and isinstance(item.get("replicas"), int)
        ):
            out.append((float(item["time"]), int(item["replicas"])))
    return tuple(out)


def _num(raw: object) -> float | None:
    return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None


def state_from_status(raw: object) -> ScalerState:
    """The state written by :func:`state_to_status` (anything unreadable starts afresh)."""
    if not isinstance(raw, dict):
        return ScalerState()
    failures = raw.get("failures")
    return ScalerState(
        hpa=HpaState(
            _read_pairs(raw.get("recommendations")),
            _read_pairs(raw.get("scaleUpEvents")),
            _read_pairs(raw.get("scaleDownEvents")),
        ),
        failures={str(k): int(v) for k, v in failures.items() if isinstance(v, int)}
        if isinstance(failures, dict)
        else {},
        last_active=_num(raw.get("lastActive")),
        last_poll=_num(raw.get("lastPoll")),
        active=raw.get("active") is True,
        active_reason=str(raw.get("activeReason") or ""),
        created=_num(raw.get("created")),
    )
