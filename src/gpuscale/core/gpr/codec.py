"""GPR serialisation: the EGS status dict and the store record of a status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuscale.core.durations import format_egs_duration
from gpuscale.core.gpr.lifecycle import Gpr, GprState, GprStatus, NodePoolDetails
from gpuscale.core.gpr.spec import API_VERSION, KIND, format_timestamp, priority_band, spec_to_dict


def status_to_dict(status: GprStatus, *, remaining_s: float | None = None) -> dict[str, Any]:
    """EGS status dict (timestamps RFC 3339, durations like ``0d7h59m``); ``remaining_s`` overrides the stored
    remaining duration."""
    remaining = status.remaining_duration_s if remaining_s is None else remaining_s
    d = status.node_pool_details
    return {
        "provisioningStatus": status.provisioning_status.value,
        "internalState": status.internal_state,
        "failureReason": status.failure_reason,
        "startTimestamp": format_timestamp(status.start_timestamp),
        "completionTimestamp": format_timestamp(status.completion_timestamp),
        "remainingDuration": None if remaining is None else format_egs_duration(remaining),
        "numGPUsAllocated": status.num_gpus_allocated,
        "nodeList": list(status.node_list),
        "cost": status.cost,
        "estimatedWaitTime": None
        if status.estimated_wait_time_s is None
        else format_egs_duration(status.estimated_wait_time_s),
        "delayedCount": status.delayed_count,
        "retryCount": status.retry_count,
        "evictedBy": status.evicted_by,
        "scaleUpTriggered": status.scale_up_triggered,
        "nodePoolDetails": {
            "provider": d.provider,
            "cluster": d.cluster,
            "pool": d.pool,
            "nodeIds": list(d.node_ids),
            "instanceType": d.instance_type,
        },
    }


def gpr_to_dict(gpr: Gpr, *, now: float | None = None) -> dict[str, Any]:
    """The API form of a GPR: ``gprId``, ``createdTimestamp``, EGS ``spec`` and ``status``. With ``now`` the
    remaining duration of a provisioned GPR is computed for that instant."""
    st = gpr.status
    remaining = None
    if now is not None and gpr.state is GprState.PROVISIONED and st.start_timestamp is not None:
        remaining = max(0.0, st.start_timestamp + gpr.spec.exit_duration_s - now)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "gprId": gpr.gpr_id,
        "createdTimestamp": format_timestamp(gpr.created_at),
        "priorityBand": priority_band(gpr.spec.priority),
        "spec": spec_to_dict(gpr.spec),
        "status": status_to_dict(gpr.status, remaining_s=remaining),
    }


def status_to_record(status: GprStatus) -> dict[str, Any]:
    """Lossless JSON-able form of a status (for storage)."""
    d = status.node_pool_details
    return {
        "provisioning_status": status.provisioning_status.value,
        "internal_state": status.internal_state,
        "failure_reason": status.failure_reason,
        "start_timestamp": status.start_timestamp,
        "completion_timestamp": status.completion_timestamp,
        "remaining_duration_s": status.remaining_duration_s,
        "num_gpus_allocated": status.num_gpus_allocated,
        "node_list": list(status.node_list),
        "cost": status.cost,
        "estimated_wait_time_s": status.estimated_wait_time_s,
        "delayed_count": status.delayed_count,
        "retry_count": status.retry_count,
        "evicted_by": status.evicted_by,
        "scale_up_triggered": status.scale_up_triggered,
        "node_pool_details": {
            "provider": d.provider,
            "cluster": d.cluster,
            "pool": d.pool,
            "node_ids": list(d.node_ids),
            "instance_type": d.instance_type,
            "zone": d.zone,
            "request_id": d.request_id,
            "count": d.count,
        },
        "inventory_nodes": list(status.inventory_nodes),
        "state_since": status.state_since,
        "last_trigger": status.last_trigger,
        "last_delayed_at": status.last_delayed_at,
        "idle_since": status.idle_since,
    }


def status_from_record(rec: Mapping[str, Any]) -> GprStatus:
    """Inverse of :func:`status_to_record`."""
    d = dict(rec.get("node_pool_details") or {})
    details = NodePoolDetails(
        provider=d.get("provider", ""),
        cluster=d.get("cluster", ""),
        pool=d.get("pool", ""),
        node_ids=tuple(d.get("node_ids", ())),
        instance_type=d.get("instance_type", ""),
        zone=d.get("zone", ""),
        request_id=d.get("request_id", ""),
        count=int(d.get("count", 0)),
    )
    return GprStatus(
        provisioning_status=GprState(rec["provisioning_status"]),
        internal_state=rec.get("internal_state", ""),
        failure_reason=rec.get("failure_reason", ""),
        start_timestamp=rec.get("start_timestamp"),
        completion_timestamp=rec.get("completion_timestamp"),
        remaining_duration_s=rec.get("remaining_duration_s"),
        num_gpus_allocated=int(rec.get("num_gpus_allocated", 0)),
        node_list=tuple(rec.get("node_list", ())),
        cost=float(rec.get("cost", 0.0)),
        estimated_wait_time_s=rec.get("estimated_wait_time_s"),
        delayed_count=int(rec.get("delayed_count", 0)),
        retry_count=int(rec.get("retry_count", 0)),
        evicted_by=rec.get("evicted_by", ""),
        scale_up_triggered=bool(rec.get("scale_up_triggered", False)),
        node_pool_details=details,
        inventory_nodes=tuple(rec.get("inventory_nodes", ())),
        state_since=float(rec.get("state_since", 0.0)),
        last_trigger=rec.get("last_trigger", ""),
        last_delayed_at=rec.get("last_delayed_at"),
        idle_since=rec.get("idle_since"),
    )
