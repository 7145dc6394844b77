"""GPR lifecycle: states, triggers, the transition table and the node labels and taints that tie nodes to a GPR."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuscale.core.gpr.schema import PRIORITY_MAX, PRIORITY_MIN
from gpuscale.core.gpr.spec import (
    GPR_LABEL,
    GPR_TAINT,
    REQUEST_ID_PREFIX,
    FieldError,
    GprSpec,
    GprValidationError,
)
from gpuscale.core.gpr.validation import estimate_cost
from gpuscale.core.model import (
    Catalog,
    Pod,
    Taint,
    TaintEffect,
    Toleration,
)
from gpuscale.errors import GpuscaleError


class IllegalTransition(GpuscaleError):
    """A lifecycle transition that the state machine does not allow (e.g. cancelling a provisioned GPR)."""


class GprState(StrEnum):
    """``provisioningStatus`` of a GPR."""

    QUEUED = "Queued"
    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    COMPLETE = "Complete"
    RELEASED = "Released"
    FAILED = "Failed"
    EVICTED = "Evicted"
    CANCELLED = "Cancelled"


class Trigger(StrEnum):
    """What moves a GPR from one state to the next."""

    ADMIT = "admit"
    NODES_READY = "nodes-ready"
    EXIT_DURATION = "exit-duration"
    EARLY_RELEASE = "early-release"
    IDLE_TIMEOUT = "idle-timeout"
    PROVISIONING_FAILED = "provisioning-failed"
    NODE_LOST = "node-lost"
    DELAY_LIMIT = "delay-limit"
    UNSERVABLE = "unservable"
    EVICT = "evict"
    REQUEUE = "requeue"
    CANCEL = "cancel"


TRANSITIONS: Mapping[tuple[GprState, Trigger], GprState] = {
    (GprState.QUEUED, Trigger.ADMIT): GprState.PROVISIONING,
    (GprState.QUEUED, Trigger.CANCEL): GprState.CANCELLED,
    (GprState.QUEUED, Trigger.DELAY_LIMIT): GprState.FAILED,
    (GprState.QUEUED, Trigger.UNSERVABLE): GprState.FAILED,
    (GprState.PROVISIONING, Trigger.NODES_READY): GprState.PROVISIONED,
    (GprState.PROVISIONING, Trigger.PROVISIONING_FAILED): GprState.FAILED,
    (GprState.PROVISIONING, Trigger.EARLY_RELEASE): GprState.RELEASED,
    (GprState.PROVISIONING, Trigger.EVICT): GprState.EVICTED,
    (GprState.PROVISIONED, Trigger.EXIT_DURATION): GprState.COMPLETE,
    (GprState.PROVISIONED, Trigger.EARLY_RELEASE): GprState.RELEASED,
    (GprState.PROVISIONED, Trigger.IDLE_TIMEOUT): GprState.RELEASED,
    (GprState.PROVISIONED, Trigger.NODE_LOST): GprState.FAILED,
    (GprState.PROVISIONED, Trigger.EVICT): GprState.EVICTED,
    (GprState.FAILED, Trigger.REQUEUE): GprState.QUEUED,
    (GprState.EVICTED, Trigger.REQUEUE): GprState.QUEUED,
}
"""The whole state machine: (state, trigger) -> next state. Any pair not listed is an illegal transition."""

TRIGGER_DOCS: Mapping[Trigger, str] = {
    Trigger.ADMIT: "capacity was found: free inventory nodes reserved and/or a scale-up launched",
    Trigger.NODES_READY: "every node of the GPR is ready and labelled for it; the exit-duration clock starts",
    Trigger.EXIT_DURATION: "exitDuration elapsed since startTimestamp",
    Trigger.EARLY_RELEASE: "the user released the GPR (earlyRelease) before its exit duration",
    Trigger.IDLE_TIMEOUT: "no GPU use on its nodes for idleTimeOutDuration (when enforceIdleTimeOut)",
    Trigger.PROVISIONING_FAILED: "the provider rejected the launch, a node failed, or nodes missed the deadline",
    Trigger.NODE_LOST: "a node serving the provisioned GPR disappeared",
    Trigger.DELAY_LIMIT: "delayedCount reached MAX_DELAYED_COUNT without the GPR being served",
    Trigger.UNSERVABLE: "the spec no longer matches any instance type of the catalog",
    Trigger.EVICT: "a higher-priority GPR needed its capacity (the GPR has enableEviction)",
    Trigger.REQUEUE: "requeueOnFailure is set and retryCount is below the limit",
    Trigger.CANCEL: "the user cancelled the GPR while it was still queued",
}

HOLDING_STATES = frozenset({GprState.PROVISIONING, GprState.PROVISIONED})
"""States in which a GPR holds nodes."""
FINAL_STATES = frozenset({GprState.COMPLETE, GprState.RELEASED, GprState.CANCELLED})
"""States no transition leaves. Failed and Evicted are final unless requeued."""
_FAILURE_TRIGGERS = frozenset({Trigger.PROVISIONING_FAILED, Trigger.NODE_LOST, Trigger.DELAY_LIMIT, Trigger.UNSERVABLE})
REQUEUEABLE = frozenset({Trigger.PROVISIONING_FAILED, Trigger.NODE_LOST, Trigger.EVICT})


@dataclass(frozen=True, slots=True)
class NodePoolDetails:
    """Where the GPR's nodes come from: provider, cluster, pool, provider node ids, the chosen instance type, the
    launch request id and how many nodes that launch asked for."""

    provider: str = ""
    cluster: str = ""
    pool: str = ""
    node_ids: tuple[str, ...] = ()
    instance_type: str = ""
    zone: str = ""
    request_id: str = ""
    count: int = 0


@dataclass(frozen=True, slots=True)
class GprStatus:
    """Observed state of a GPR. Times are Unix seconds; durations seconds."""

    provisioning_status: GprState = GprState.QUEUED
    internal_state: str = ""
    failure_reason: str = ""
    start_timestamp: float | None = None
    completion_timestamp: float | None = None
    remaining_duration_s: float | None = None
    num_gpus_allocated: int = 0
    node_list: tuple[str, ...] = ()
    cost: float = 0.0
    estimated_wait_time_s: float | None = None
    delayed_count: int = 0
    retry_count: int = 0
    evicted_by: str = ""
    scale_up_triggered: bool = False
    node_pool_details: NodePoolDetails = field(default_factory=NodePoolDetails)
    inventory_nodes: tuple[str, ...] = ()
    """Names of existing (not launched-for-it) nodes reserved for the GPR."""
    state_since: float = 0.0
    last_trigger: str = ""
    last_delayed_at: float | None = None
    idle_since: float | None = None


@dataclass(frozen=True, slots=True)
class Gpr:
    """A GPR: id, spec, status, creation time (Unix seconds)."""

    gpr_id: str
    spec: GprSpec
    status: GprStatus
    created_at: float

    @property
    def state(self) -> GprState:
        """The provisioning status."""
        return self.status.provisioning_status

    @property
    def request_id(self) -> str:
        """Idempotency key of the current attempt's launch: deterministic per GPR and attempt."""
        return f"{self.gpr_id}-a{self.status.retry_count}"


def new_gpr(gpr_id: str, spec: GprSpec, catalog: Catalog, now: float) -> Gpr:
    """A freshly queued GPR with its cost estimate."""
    return Gpr(gpr_id, spec, GprStatus(cost=estimate_cost(spec, catalog), state_since=now), now)


def _internal_state(state: GprState, before: GprState) -> str:
    if state in HOLDING_STATES:
        return "Reserved"
    if state is GprState.QUEUED:
        return ""
    return "Released" if before in HOLDING_STATES or before is GprState.QUEUED else ""


def transition(gpr: Gpr, trigger: Trigger, now: float, *, reason: str = "") -> Gpr:
    """Apply ``trigger`` to ``gpr`` per :data:`TRANSITIONS`; raises :class:`IllegalTransition` for a forbidden edge.

    Keeps the status bookkeeping consistent: ``internalState``, ``completionTimestamp`` on leaving for a final
    state, ``failureReason`` on failures, ``retryCount`` and a fresh attempt on requeue.
    """
    nxt = TRANSITIONS.get((gpr.state, trigger))
    if nxt is None:
        allowed = sorted(t.value for (s, t) in TRANSITIONS if s is gpr.state)
        raise IllegalTransition(
            f"GPR {gpr.gpr_id} is {gpr.state}: {trigger} is not allowed"
            + (f" (allowed: {', '.join(allowed)})" if allowed else " (the GPR is final)")
        )
    st = gpr.status
    changes: dict[str, Any] = {
        "provisioning_status": nxt,
        "internal_state": _internal_state(nxt, gpr.state),
        "state_since": now,
        "last_trigger": trigger.value,
        "idle_since": None,
    }
    if trigger in _FAILURE_TRIGGERS:
        changes["failure_reason"] = reason or TRIGGER_DOCS[trigger]
    if nxt is GprState.PROVISIONED:
        changes.update(
            start_timestamp=now,
            failure_reason="",
            remaining_duration_s=float(gpr.spec.exit_duration_s),
            estimated_wait_time_s=0.0,
        )
    if nxt is GprState.PROVISIONING:
        changes.update(failure_reason="", estimated_wait_time_s=0.0)
    if nxt in (GprState.COMPLETE, GprState.RELEASED, GprState.FAILED, GprState.EVICTED, GprState.CANCELLED):
        changes.update(completion_timestamp=now, remaining_duration_s=0.0 if st.start_timestamp else None)
        changes.update(estimated_wait_time_s=None)
    if nxt is GprState.QUEUED:
        changes.update(
            retry_count=st.retry_count + 1,
            delayed_count=0,
            last_delayed_at=None,
            start_timestamp=None,
            completion_timestamp=None,
            remaining_duration_s=None,
            num_gpus_allocated=0,
            node_list=(),
            inventory_nodes=(),
            scale_up_triggered=False,
            node_pool_details=NodePoolDetails(),
        )
    return replace(gpr, status=replace(st, **changes))


def cancel(gpr: Gpr, now: float) -> Gpr:
    """Cancel a queued GPR (:class:`IllegalTransition` in any other state)."""
    return transition(gpr, Trigger.CANCEL, now, reason="cancelled by the user")


def request_release(gpr: Gpr) -> Gpr:
    """Mark a provisioning or provisioned GPR for early release; the next plan releases it."""
    if gpr.state not in HOLDING_STATES:
        raise IllegalTransition(
            f"GPR {gpr.gpr_id} is {gpr.state}: only a Provisioning or Provisioned GPR can be released"
            + (" (cancel a queued one instead)" if gpr.state is GprState.QUEUED else "")
        )
    return replace(gpr, spec=replace(gpr.spec, early_release=True))


def with_priority(gpr: Gpr, priority: int) -> Gpr:
    """Change the priority of a GPR that is not final; raises :class:`GprValidationError` when out of range."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise GprValidationError(
            [FieldError("priority", f"must be an integer between {PRIORITY_MIN} and {PRIORITY_MAX}, got {priority!r}")]
        )
    if gpr.state in FINAL_STATES:
        raise IllegalTransition(f"GPR {gpr.gpr_id} is {gpr.state}: its priority can no longer change")
    return replace(gpr, spec=replace(gpr.spec, priority=priority))


# ---------------------------------------------------------------------------------------------- node labelling
def gpr_node_labels(gpr_id: str) -> dict[str, str]:
    """Labels of every node serving GPR ``gpr_id``."""
    return {GPR_LABEL: gpr_id}


def gpr_node_taints(gpr_id: str) -> tuple[Taint, ...]:
    """Taints of every node serving GPR ``gpr_id``: only its workloads may schedule there."""
    return (Taint(GPR_TAINT, TaintEffect.NO_SCHEDULE, gpr_id),)


def gpr_toleration(gpr_id: str) -> Toleration:
    """The toleration a workload of GPR ``gpr_id`` needs."""
    return Toleration(key=GPR_TAINT, operator="Equal", value=gpr_id, effect=TaintEffect.NO_SCHEDULE)


def _tolerates(tol: Toleration, taint: Taint) -> bool:
    if tol.effect is not None and tol.effect != taint.effect:
        return False
    if tol.operator == "Exists":
        return tol.key in ("", taint.key)
    return tol.key == taint.key and tol.value == taint.value


def admits_pod(gpr: Gpr, pod: Pod) -> bool:
    """True if ``pod`` belongs on the GPR's nodes: its labels match ``workloadSelector`` and it tolerates the GPR
    taint. An empty selector matches no pod (a GPR never attracts unrelated workloads by accident)."""
    sel = gpr.spec.workload_selector
    if not sel or any(pod.labels.get(k) != v for k, v in sel.items()):
        return False
    return all(any(_tolerates(t, taint) for t in pod.tolerations) for taint in gpr_node_taints(gpr.gpr_id))


def is_gpr_request_id(request_id: str) -> bool:
    """True if a provider request id was made by the GPR manager (``gpr-...-a<attempt>``)."""
    return request_id.startswith(REQUEST_ID_PREFIX) and re.search(r"-a\d+$", request_id) is not None


def gpr_id_of_request(request_id: str) -> str:
    """The gprId of a GPR launch request id."""
    return re.sub(r"-a\d+$", "", request_id)
