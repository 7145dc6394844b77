"""The ``status`` gpuscale writes on its GPUNodePool and OfferingAvailability objects (status subresource).

A pool's status counts its live nodes, their GPUs and their hourly cost (shown by ``kubectl get gnp``) and carries
Kubernetes-style conditions. The field tables here are what the CRD schemas are generated from
(:mod:`gpuscale.manifests.crds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

POOL_STATUS_FIELDS = ("nodes", "gpus", "hourlyCost", "conditions")
CONDITION_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime", "observedGeneration")
CONDITION_STATUSES = ("True", "False", "Unknown")
AVAILABILITY_STATUS_FIELDS = ("conditions", "marks")
MARK_FIELDS = ("kind", "key", "until", "failures", "reason")
"""A ``status.marks`` entry: a back-off, spot fallback or launch retry (:mod:`gpuscale.kube.availability_store`)."""


@dataclass(frozen=True, slots=True)
class Condition:
    """One status condition (``lastTransitionTime`` is an RFC 3339 time)."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The condition as the API object holds it."""
        out: dict[str, Any] = {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }
        if self.observed_generation:
            out["observedGeneration"] = self.observed_generation
        return out


def pool_status(nodes: int, gpus: int, hourly_cost: float, conditions: Sequence[Condition] = ()) -> dict[str, Any]:
    """A GPUNodePool ``status``: live nodes, their GPUs, their cost per hour (rounded to cents) and conditions."""
    return {
        "nodes": nodes,
        "gpus": gpus,
        "hourlyCost": round(hourly_cost, 2),
        "conditions": [c.to_dict() for c in conditions],
    }
