"""The node-claim lifecycle as an explicit transition table.

A *node claim* is gpuscale's record of one node it asked a provider for. It is keyed by the launch request id (the
provider's idempotency key), so asking twice with the same id never creates two nodes, and a restarted controller
rebuilds every claim from the provider's node list and the cluster's nodes.

Phases and the events that move between them (every other pair is forbidden, see :data:`TRANSITIONS`)::

    Requested --Launched-------------> Launched          the provider accepted the request and named the node
    Requested --LaunchFailed---------> Failed            the provider refused (capacity, quota, invalid request)
    Requested --LaunchTimeout--------> Failed            no answer before the launch deadline
    Launched  --Registered-----------> Registered        the Node object appeared in the cluster
    Launched  --LaunchFailed---------> Failed            the instance failed to start (asynchronous provider report)
    Launched  --RegistrationTimeout--> Failed            no Node object before the registration deadline
    Registered--Initialized----------> Initialized       the node advertises its GPUs as allocatable
    Registered--GpuInitTimeout-------> Failed            GPUs never appeared before the GPU-init deadline
    Launched / Registered / Initialized --Disrupt--> Draining   cordoned, pods being evicted
    Launched / Registered / Initialized / Draining --Lost--> Gone   the node vanished without us deleting it
    Draining  --Drained--------------> Deleting          no evictable pod left; delete requested
    Failed    --Delete---------------> Deleting          clean up whatever the failed launch left behind
    Failed    --Lost-----------------> Gone              nothing left to clean up
    Deleting  --Deleted--------------> Gone              the provider no longer lists the node

``Gone`` is terminal. Every deadline is per pool (:class:`Deadlines`); :func:`expired` tells whether the claim's
current phase has outlived its deadline and :func:`timeout_event` which event to apply then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpuscale.core.model import CapacityType
from gpuscale.core.resources import Resources

REQUEST_ID_LABEL = "gpuscale.io/request-id"
"""Label every node gpuscale launches carries: the launch request id of its claim."""


class ClaimPhase(StrEnum):
    """Where a node claim is in its lifecycle."""

    REQUESTED = "Requested"
    LAUNCHED = "Launched"
    REGISTERED = "Registered"
    INITIALIZED = "Initialized"
    DRAINING = "Draining"
    DELETING = "Deleting"
    GONE = "Gone"
    FAILED = "Failed"


class ClaimEvent(StrEnum):
    """What happened to a claim (the trigger of a transition)."""

    LAUNCHED = "Launched"
    LAUNCH_FAILED = "LaunchFailed"
    LAUNCH_TIMEOUT = "LaunchTimeout"
    REGISTERED = "Registered"
    REGISTRATION_TIMEOUT = "RegistrationTimeout"
    INITIALIZED = "Initialized"
    GPU_INIT_TIMEOUT = "GpuInitTimeout"
    DISRUPT = "Disrupt"
    DRAINED = "Drained"
    DELETE = "Delete"
    DELETED = "Deleted"
    LOST = "Lost"


P = ClaimPhase
E = ClaimEvent

TRANSITIONS: Mapping[tuple[ClaimPhase, ClaimEvent], ClaimPhase] = {
    (P.REQUESTED, E.LAUNCHED): P.LAUNCHED,
    (P.REQUESTED, E.LAUNCH_FAILED): P.FAILED,
    (P.REQUESTED, E.LAUNCH_TIMEOUT): P.FAILED,
    (P.LAUNCHED, E.REGISTERED): P.REGISTERED,
    (P.LAUNCHED, E.LAUNCH_FAILED): P.FAILED,
    (P.LAUNCHED, E.REGISTRATION_TIMEOUT): P.FAILED,
    (P.LAUNCHED, E.DISRUPT): P.DRAINING,
    (P.LAUNCHED, E.LOST): P.GONE,
    (P.REGISTERED, E.INITIALIZED): P.INITIALIZED,
    (P.REGISTERED, E.GPU_INIT_TIMEOUT): P.FAILED,
    (P.REGISTERED, E.DISRUPT): P.DRAINING,
    (P.REGISTERED, E.LOST): P.GONE,
    (P.INITIALIZED, E.DISRUPT): P.DRAINING,
    (P.INITIALIZED, E.LOST): P.GONE,
    (P.DRAINING, E.DRAINED): P.DELETING,
    (P.DRAINING, E.LOST): P.GONE,
    (P.FAILED, E.DELETE): P.DELETING,
    (P.FAILED, E.LOST): P.GONE,
    (P.DELETING, E.DELETED): P.GONE,
}
"""Every allowed edge: (phase, event) -> next phase. Anything else raises :class:`ForbiddenTransition`."""

IN_FLIGHT = frozenset({P.REQUESTED, P.LAUNCHED, P.REGISTERED})
"""Phases whose node does not yet offer its full capacity but will: counted as capacity by the planner."""

ALIVE = frozenset({P.REQUESTED, P.LAUNCHED, P.REGISTERED, P.INITIALIZED})
"""Phases of a claim whose node is (or will be) usable for pods."""

TERMINAL = frozenset({P.GONE})


class ForbiddenTransition(ValueError):
    """An event that is not allowed in the claim's current phase."""

    def __init__(self, claim: NodeClaim, event: ClaimEvent) -> None:
        allowed = sorted(str(ev) for (ph, ev) in TRANSITIONS if ph == claim.phase)
        super().__init__(
            f"node claim {claim.request_id}: event {event} is not allowed in phase {claim.phase}"
            f" (allowed: {', '.join(allowed) or 'none, the phase is terminal'})"
        )
        self.claim = claim
        self.event = event


@dataclass(frozen=True, slots=True)
class Deadlines:
    """How long a claim may stay in each waiting phase, in seconds (per pool)."""

    launch_s: float = 300.0
    """Requested -> Launched: the provider must accept the request."""
    registration_s: float = 900.0
    """Launched -> Registered: the Node object must appear."""
    gpu_init_s: float = 600.0
    """Registered -> Initialized: the device plugin must advertise the GPUs."""


DEFAULT_DEADLINES = Deadlines()


@dataclass(frozen=True, slots=True)
class Transition:
    """One applied transition, kept in the claim's history."""

    at: float
    event: ClaimEvent
    source: ClaimPhase
    target: ClaimPhase
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeClaim:
    """One node gpuscale asked for, identified by its launch request id.

    ``expected`` is the allocatable capacity the node template promises (what the planner counts while the node is
    in flight); ``since`` is when the claim entered its current phase; ``replaces`` names the node this one was
    launched to replace (spot interruption or consolidation), if any.
    """

    request_id: str
    pool: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    phase: ClaimPhase = ClaimPhase.REQUESTED
    created_at: float = 0.0
    since: float = 0.0
    expected: Resources = field(default_factory=Resources)
    hourly_price: float = 0.0
    node_id: str = ""
    node_name: str = ""
    pods: tuple[str, ...] = ()
    replaces: str = ""
    reason: str = ""
    deadlines: Deadlines = DEFAULT_DEADLINES
    history: tuple[Transition, ...] = ()

    @property
    def in_flight(self) -> bool:
        """True while the node is on its way (Requested, Launched, Registered)."""
        return self.phase in IN_FLIGHT

    @property
    def alive(self) -> bool:
        """True while the node is or will be usable for pods."""
        return self.phase in ALIVE


def new_claim(
    request_id: str,
    pool: str,
    instance_type: str,
    zone: str,
    capacity_type: CapacityType,
    now: float,
    *,
    expected: Resources | None = None,
    hourly_price: float = 0.0,
    pods: tuple[str, ...] = (),
    replaces: str = "",
    reason: str = "",
    deadlines: Deadlines = DEFAULT_DEADLINES,
) -> NodeClaim:
    """A fresh claim in phase Requested."""
    return NodeClaim(
        request_id=request_id,
        pool=pool,
        instance_type=instance_type,
        zone=zone,
        capacity_type=capacity_type,
        created_at=now,
        since=now,
        expected=expected if expected is not None else Resources(),
        hourly_price=hourly_price,
        pods=pods,
        replaces=replaces,
        reason=reason,
        deadlines=deadlines,
    )


def can_transition(phase: ClaimPhase, event: ClaimEvent) -> bool:
    """True if ``event`` is allowed in ``phase``."""
    return (phase, event) in TRANSITIONS


def transition(
    claim: NodeClaim,
    event: ClaimEvent,
    now: float,
    *,
    reason: str = "",
    node_id: str | None = None,
    node_name: str | None = None,
) -> NodeClaim:
    """The claim after ``event`` at ``now``; raises :class:`ForbiddenTransition` for an edge not in the table.

    ``node_id`` / ``node_name`` record the provider's id and the Kubernetes name when they become known.
    """
    target = TRANSITIONS.get((claim.phase, event))
    if target is None:
        raise ForbiddenTransition(claim, event)
    step = _new(Transition)  # Transition(at=now, event=event, source=claim.phase, target=target, reason=reason)
    _set(step, "at", now)
    _set(step, "event", event)
    _set(step, "source", claim.phase)
    _set(step, "target", target)
    _set(step, "reason", reason)
    # the claim copied field by field as its frozen __init__ would set them, without the argument passing (a third
    # of dataclasses.replace's cost and half of a keyword __init__'s: every claim of every node goes through here
    # several times); tests/test_nodeclaim.py checks no field is left behind
    new = _new(NodeClaim)
    _set(new, "request_id", claim.request_id)
    _set(new, "pool", claim.pool)
    _set(new, "instance_type", claim.instance_type)
    _set(new, "zone", claim.zone)
    _set(new, "capacity_type", claim.capacity_type)
    _set(new, "phase", target)
    _set(new, "created_at", claim.created_at)
    _set(new, "since", now)
    _set(new, "expected", claim.expected)
    _set(new, "hourly_price", claim.hourly_price)
    _set(new, "node_id", claim.node_id if node_id is None else node_id)
    _set(new, "node_name", claim.node_name if node_name is None else node_name)
    _set(new, "pods", claim.pods)
    _set(new, "replaces", claim.replaces)
    _set(new, "reason", reason or _EVENT_TEXT[event])
    _set(new, "deadlines", claim.deadlines)
    _set(new, "history", (*claim.history, step))
    return new


_new = object.__new__
_set = object.__setattr__  # what a frozen dataclass's own __init__ calls per field
_EVENT_TEXT: Mapping[ClaimEvent, str] = {e: str(e) for e in ClaimEvent}
"""``str(event)`` of every event (a lookup instead of a call)."""


_TIMEOUTS: Mapping[ClaimPhase, ClaimEvent] = {
    P.REQUESTED: E.LAUNCH_TIMEOUT,
    P.LAUNCHED: E.REGISTRATION_TIMEOUT,
    P.REGISTERED: E.GPU_INIT_TIMEOUT,
}
TIMED_PHASES: frozenset[ClaimPhase] = frozenset(_TIMEOUTS)
"""The phases that time out (every other phase has no deadline)."""


def deadline(claim: NodeClaim) -> float | None:
    """When the claim's current phase times out, or None for a phase without a deadline."""
    phase = claim.phase
    if phase is _REQUESTED:
        return claim.since + claim.deadlines.launch_s
    if phase is _LAUNCHED:
        return claim.since + claim.deadlines.registration_s
    if phase is _REGISTERED:
        return claim.since + claim.deadlines.gpu_init_s
    return None


# Enum members as module constants: a class attribute of an Enum costs ~4 times a global lookup in Python 3.11
# (EnumType defines __getattr__); read once per timed claim per claim table change.
_REQUESTED, _LAUNCHED, _REGISTERED = P.REQUESTED, P.LAUNCHED, P.REGISTERED


def expired(claim: NodeClaim, now: float) -> bool:
    """True if the claim has stayed in its current phase past that phase's deadline."""
    t = deadline(claim)
    return t is not None and now > t


def timeout_event(claim: NodeClaim) -> ClaimEvent | None:
    """The event to apply when the current phase's deadline passes (None for phases without one)."""
    return _TIMEOUTS.get(claim.phase)
