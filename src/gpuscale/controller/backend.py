"""The cluster-side protocol the controller observes and acts through.

The controller never binds pods (the scheduler does). It reads pods and nodes, cordons (and uncordons), evicts and
deletes nodes, labels and taints the nodes GPRs borrow and give back, and records events.
:class:`gpuscale.sim.cluster.SimCluster` and the Kubernetes adapter implement it.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuscale.core.disruption import PodDisruptionBudget
from gpuscale.core.model import Node, Pod, Taint

__all__ = ["ClusterBackend", "Event", "PodDisruptionBudget"]


@dataclass(frozen=True, slots=True)
class Event:
    """A decision record (becomes a Kubernetes Event in a real cluster)."""

    at: float
    kind: str
    """Short machine-readable type, e.g. ``ScaleUp``, ``Blocked``, ``Consolidate``, ``SpotInterruption``."""
    object: str
    """What it is about, e.g. ``pod/ns/name`` or ``node/name`` or ``pool/name``."""
    reason: str
    message: str
    data: Mapping[str, builtins.object] = field(default_factory=dict)


class ClusterBackend(Protocol):
    """What the controller needs from a cluster."""

    def list_pods(self) -> Sequence[Pod]:
        """Every pod (pending, running); bound pods have ``node_name``."""
        ...

    def list_nodes(self) -> Sequence[Node]:
        """Every registered node, with current labels, taints, allocatable and ``unschedulable``."""
        ...

    def list_pdbs(self) -> Sequence[PodDisruptionBudget]:
        """PodDisruptionBudgets."""
        ...

    def gpu_utilization(self) -> Mapping[str, float]:
        """Measured GPU utilisation (0..1) per node name, where known."""
        ...

    def cordon(self, node_name: str) -> None:
        """Mark the node unschedulable."""
        ...

    def uncordon(self, node_name: str) -> None:
        """Undo :meth:`cordon`: make the node schedulable again (idempotent; a node that is gone is ignored)."""
        ...

    def evict(self, pod_key: str) -> bool:
        """Evict a pod (``namespace/name``); False if a PDB refused it."""
        ...

    def delete_node(self, node_name: str) -> None:
        """Remove the Node object."""
        ...

    def update_node(
        self,
        node_name: str,
        labels: Mapping[str, str | None],
        taints: Sequence[Taint] = (),
        untaint: Sequence[str] = (),
    ) -> None:
        """Set ``labels`` (a None value removes the label), remove the taints whose key is in ``untaint`` and add
        ``taints`` (idempotent; a node that is gone is ignored). Used for the nodes GPRs borrow and give back."""
        ...

    def record(self, event: Event) -> None:
        """Record a decision."""
        ...
