"""The narrow provider protocol every cloud (and the simulated cloud) implements.

Effects are idempotent and keyed by a request id: ``launch`` with a request id that already has nodes returns those
nodes instead of creating more, so a controller that crashes after asking and before recording never doubles a node.
``delete_node`` of a node that is already gone succeeds. ``list_nodes`` returns only nodes gpuscale created (tagged
with the request id), which is how a restarted controller rebuilds its state. Failures are raised as
:mod:`gpuscale.errors` classes (insufficient capacity, quota, rate limit, ...), never as SDK exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gpuscale.core.model import CapacityType, Taint


class CloudNodeState(StrEnum):
    """Provider-side state of a node."""

    PROVISIONING = "provisioning"
    RUNNING = "running"
    READY = "ready"
    NOT_READY = "not_ready"
    DELETING = "deleting"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Ask for ``count`` nodes of one offering. ``request_id`` is the idempotency key."""

    request_id: str
    pool: str
    instance_type: str
    zone: str
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    count: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    pods: tuple[str, ...] = ()
    """Informational: the pending pods (namespace/name) this node is launched for; empty for minNodes, replacements
    of running pods' nodes and other launches not driven by pending pods. Not part of the idempotency key."""


@dataclass(frozen=True, slots=True)
class CloudNode:
    """A node as the provider reports it. ``node_id`` is the provider's id; ``node_name`` the Kubernetes name."""

    node_id: str
    request_id: str
    pool: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    state: CloudNodeState
    created_at: float = 0.0
    node_name: str = ""
    instance_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


class ProviderEventKind(StrEnum):
    """Asynchronous provider events returned by ``poll_errors``."""

    SPOT_INTERRUPTION = "spot-interruption"
    LAUNCH_FAILED = "launch-failed"
    NODE_FAILED = "node-failed"
    REBALANCE_RECOMMENDATION = "rebalance-recommendation"
    """Elevated risk that a spot node is interrupted soon (informational; no action is required)."""


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    """Something the provider reports after the fact (a spot notice, an async launch failure)."""

    kind: ProviderEventKind
    node_id: str = ""
    request_id: str = ""
    message: str = ""
    at: float = 0.0
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class ProviderCapabilities:
    """What a provider can do; the controller adapts to it."""

    spot: bool = False
    delete_specific_node: bool = True
    zones: tuple[str, ...] = ()
    max_nodes_per_launch: int = 100
    reports_node_ready: bool = True
    """True: the provider itself says READY once the node has joined the cluster (LKE, the simulated cloud). False:
    RUNNING is its last word (an EC2 instance, a GCE VM, an ECS instance); readiness is the Kubernetes Node's, and
    where nothing watches the cluster (``gpuscale serve``) a RUNNING node counts as ready."""


class Provider(Protocol):
    """A cloud (or simulated cloud) that launches and deletes nodes."""

    name: str

    @property
    def capabilities(self) -> ProviderCapabilities: ...

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """Create ``request.count`` nodes, or return the nodes already created for ``request.request_id``."""
        ...

    def delete_node(self, node_id: str) -> None:
        """Delete one specific node. Succeeds if it is already gone."""
        ...

    def list_nodes(self) -> Sequence[CloudNode]:
        """Every node this gpuscale installation created and that is not gone."""
        ...

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Events since the last call (spot interruption notices, asynchronous failures)."""
        ...
