"""What the node reconcile observes and the action record it returns.

The reconcile's inputs are read through small protocols (:class:`CloudNodeView`, :class:`ProviderEventView`) that
the provider's own ``CloudNode`` and ``ProviderEvent`` satisfy, so the core needs no adapter import and the shell
hands over what it observed as is. The output is one :class:`Decisions` record: an ordered list of actions the
shell carries out in that order (a claim set or finished, an offering marked unavailable, a node cordoned, a
note), plus the flags the next steps of the round read (re-plan, claims listed late).
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gpuscale.core.model import CapacityType, InstanceType, Node, NodePool, Offering, OfferingKey
from gpuscale.core.nodeclaim import DEFAULT_DEADLINES, REQUEST_ID_LABEL, Deadlines, NodeClaim


class EventKind(StrEnum):
    """``Event.kind`` values the controller records."""

    SCALE_UP = "ScaleUp"
    BLOCKED = "Blocked"
    LAUNCH_FAILED = "LaunchFailed"
    LAUNCH_RETRY = "LaunchRetry"
    OFFERING_UNAVAILABLE = "OfferingUnavailable"
    SPOT_FALLBACK = "SpotFallback"
    BACKOFF = "Backoff"
    REGISTERED = "NodeRegistered"
    INITIALIZED = "NodeInitialized"
    TIMEOUT = "NodeClaimTimeout"
    ADOPTED = "NodeClaimAdopted"
    LOST = "NodeLost"
    GONE = "NodeGone"
    CONSOLIDATE = "Consolidate"
    REPLACE_ABORTED = "ReplaceAborted"
    DISRUPTION_BLOCKED = "DisruptionBlocked"
    SPOT_INTERRUPTION = "SpotInterruption"
    NODE_FAILED = "NodeFailed"
    DRAIN = "Drain"
    EVICT = "Evict"
    EVICT_BLOCKED = "EvictBlocked"
    DELETE = "NodeDelete"
    ORPHAN = "OrphanNodeRemoved"
    OBSERVE_FAILED = "ObserveFailed"
    GPR_BORROW = "GprBorrow"
    GPR_RETURN = "GprReturn"


# --------------------------------------------------------------------------------------------------- observations
class CloudNodeView(Protocol):
    """A node as the provider lists it (``providers.base.CloudNode`` is one). ``state`` compares equal to the
    provider's state names (``"deleting"``, ...)."""

    @property
    def node_id(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def instance_type(self) -> str: ...
    @property
    def zone(self) -> str: ...
    @property
    def capacity_type(self) -> CapacityType: ...
    @property
    def state(self) -> str: ...
    @property
    def created_at(self) -> float: ...
    @property
    def node_name(self) -> str: ...


class ProviderEventView(Protocol):
    """An asynchronous provider event (``providers.base.ProviderEvent`` is one). ``kind`` compares equal to
    ``"spot-interruption"``, ``"launch-failed"``, ``"node-failed"``, ..."""

    @property
    def kind(self) -> str: ...
    @property
    def node_id(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def deadline(self) -> float | None: ...


DELETING = "deleting"
SPOT_INTERRUPTION = "spot-interruption"
LAUNCH_FAILED = "launch-failed"
NODE_FAILED = "node-failed"


@dataclass(frozen=True, slots=True)
class Rules:
    """The settings the node reconcile decides by (a subset of the controller's configuration)."""

    deadlines: Deadlines = DEFAULT_DEADLINES
    pool_deadlines: Mapping[str, Deadlines] = field(default_factory=dict)
    unavailable_ttl_s: float = 180.0
    gpu_init_unavailable_ttl_s: float = 1800.0
    lost_grace_s: float = 30.0

    def deadlines_for(self, pool: str) -> Deadlines:
        """The deadlines of ``pool``."""
        return self.pool_deadlines.get(pool, self.deadlines)


@dataclass(frozen=True, slots=True)
class Fleet:
    """What may be launched: pools by name, instance types by name (with their offerings and prices)."""

    pools: Mapping[str, NodePool]
    types: Mapping[str, InstanceType]
    _offerings: dict[tuple[str, str, CapacityType], Offering | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """:meth:`offering`'s answers, kept (``types`` and its instance types never change)."""

    def offering(self, instance_type: str, zone: str, ct: CapacityType) -> Offering | None:
        """The catalog's offering (the first of the type's offerings in that zone and capacity type), or None."""
        key = (instance_type, zone, ct)
        known = self._offerings
        if key in known:
            return known[key]
        it = self.types.get(instance_type)
        offerings = it.offerings if it is not None else ()
        found = known[key] = next((o for o in offerings if o.zone == zone and o.capacity_type is ct), None)
        return found

    def price(self, instance_type: str, zone: str, ct: CapacityType) -> float:
        """The offering's hourly price (0 when the catalog does not know it)."""
        off = self.offering(instance_type, zone, ct)
        return off.hourly_price if off is not None else 0.0


# --------------------------------------------------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class SetClaim:
    """Store ``claim`` under ``key`` (a new claim, or one after a transition or a field update)."""

    key: str
    claim: NodeClaim


@dataclass(frozen=True, slots=True)
class FinishClaim:
    """Drop the claim ``key``, which reached Gone (``claim``); its request id is never reused."""

    key: str
    claim: NodeClaim


@dataclass(frozen=True, slots=True)
class MarkUnavailable:
    """Do not buy ``offering`` until ``until`` (the shell notes it only when this extends the mark)."""

    offering: OfferingKey
    until: float
    why: str


@dataclass(frozen=True, slots=True)
class Cordon:
    """Mark the node unschedulable (its claim started draining)."""

    node_name: str


@dataclass(frozen=True, slots=True)
class Uncordon:
    """Make the node schedulable again: gpuscale cordoned it for a replacement that failed, and it is kept."""

    node_name: str


@dataclass(frozen=True, slots=True)
class DrainStarted:
    """The claim ``key`` started draining: ``involuntary`` drains ignore do-not-disrupt; the node's
    consolidateAfter clock stops."""

    key: str
    node_name: str
    involuntary: bool


@dataclass(frozen=True, slots=True)
class ClearRetry:
    """The claim ``key``'s pending launch retry is moot (its node was listed)."""

    key: str


@dataclass(frozen=True, slots=True)
class DropReplacement:
    """Stop tracking the replacement of ``old_node``."""

    old_node: str


@dataclass(frozen=True, slots=True)
class Note:
    """A decision record (an ``Event`` once the shell stamps it with the time)."""

    kind: EventKind
    object: str
    reason: str
    message: str
    data: Mapping[str, builtins.object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict ``pod`` from the node of the draining claim ``key`` (``reason``: why the node drains)."""

    pod: str
    key: str
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class EvictBlocked:
    """``pod`` may not be evicted now (``reason`` ``DoNotDisrupt`` or ``PodDisruptionBudget``)."""

    pod: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DeleteNode:
    """Delete the node of claim ``key`` at the provider, then its Node object (both idempotent)."""

    key: str


@dataclass(frozen=True, slots=True)
class RemoveOrphan:
    """Remove the Node object ``name``, labelled with request ``request_id`` that has no cloud node."""

    name: str
    request_id: str


Action = (
    SetClaim
    | FinishClaim
    | MarkUnavailable
    | Cordon
    | Uncordon
    | DrainStarted
    | ClearRetry
    | DropReplacement
    | Note
    | Evict
    | EvictBlocked
    | DeleteNode
    | RemoveOrphan
)


@dataclass(slots=True)
class Decisions:
    """One step's action record: ``actions`` in the order to carry them out, and flags for the rest of the round."""

    actions: list[Action] = field(default_factory=list)
    replan: bool = False
    """Something changed that the scale-up must see at once (a node lost, failed, timed out or draining)."""
    unlisted: set[str] = field(default_factory=set)
    """Claims launched so recently that a missing listing is not yet a loss (wake up at ``since + lost_grace``)."""
    settled: bool = False
    """The claim sync learnt nothing and every listed node matched its settled claim: the same listing with the
    same claims needs no sync (the shell may skip it)."""
    fixpoint: bool = False
    """The claims these decisions leave are a fixpoint of the claim sync: a sync of the same listing and the same
    Nodes would change nothing, at any time (no claim waits for the end of its listing grace period; a Launched or
    Registered claim may still advance when its Node changes): the shell may skip that sync."""
    matched: list[tuple[int, str]] = field(default_factory=list)
    """The claim sync's settled nodes: (index in the listing it was given, claim key) of every listed node whose
    claim needs nothing from it (its node id and name, a phase past Registered), whatever the time or the Nodes:
    while that node and that claim are unchanged, a later sync may leave the node out (its ``known`` keys)."""

    def note(self, kind: EventKind, obj: str, reason: str, message: str, **data: object) -> None:
        """Append a :class:`Note`."""
        self.actions.append(Note(kind, obj, reason, message, data))

    def notes(self) -> list[Note]:
        """The notes, in order."""
        return [a for a in self.actions if isinstance(a, Note)]

    def claims_set(self) -> dict[str, NodeClaim]:
        """The last claim set per key."""
        return {a.key: a.claim for a in self.actions if isinstance(a, SetClaim)}


def find_node(claim: NodeClaim, nodes: Mapping[str, Node]) -> Node | None:
    """The cluster's Node of ``claim``: by its node name, else the first node labelled with its request id."""
    if claim.node_name and claim.node_name in nodes:
        return nodes[claim.node_name]
    rid, label = claim.request_id, REQUEST_ID_LABEL  # (locals: the loop runs over every Node of every sync)
    for n in nodes.values():
        if n.labels.get(label) == rid:
            return n
    return None
