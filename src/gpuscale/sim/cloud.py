"""A simulated cloud implementing :class:`gpuscale.providers.base.Provider` on the virtual clock.

Lifecycle of a node: ``launch`` creates it in ``provisioning`` (billing starts); after the instance type's launch
latency it is ``running``; after the registration latency its kubelet joins the cluster (``ready``; the cluster is
told through :class:`CloudListener`), and after a further device-plugin delay its GPUs become allocatable (the
cluster applies that delay; a GPU-initialisation failure means never). ``delete_node`` moves it to ``deleting`` (the
cluster loses the node at once) and, after the deletion latency, to ``gone`` (billing stops; a zero latency makes
it gone at once). Deleting an unknown or gone node succeeds.

Behaviour (all seeded): per-type latency distributions, capacity rules per offering (insufficient-capacity errors),
an account node quota, random API faults (429, 5xx, timeouts that may or may not have taken effect), asynchronous
launch failures, GPU initialisation failures, and spot interruptions at a rate per node-hour with a notice (reported
by ``poll_errors`` as :attr:`ProviderEventKind.SPOT_INTERRUPTION` with its deadline) after which the node dies.

Launch is idempotent by request id: a request id that already has nodes returns them; the same id with different
parameters is refused. :attr:`SimCloud.counters` counts everything, including ``duplicate_nodes`` (a node created for
a request id that already had nodes), which the design makes impossible and the tests check stays zero.

Redundant launches: before creating each node of a launch whose :attr:`LaunchRequest.pods` is not empty, the cloud
asks its listener :meth:`CloudListener.launch_is_redundant`, passing the nodes in flight (launched, not registered,
not deleting, not failed; the node about to be created not among them, the earlier nodes of the same request
included). The cluster answers True when the pods already pending fit without the new node (see
:meth:`gpuscale.sim.cluster.SimCluster.launch_is_redundant`); such nodes are counted in
``counters.redundant_launches`` and named in :attr:`SimCloud.redundant_nodes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering, Taint
from gpuscale.errors import (
    InsufficientCapacity,
    InvalidProviderRequest,
    NotFound,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    ProviderCapabilities,
    ProviderEvent,
    ProviderEventKind,
)
from gpuscale.sim.engine import Dist, Engine, Timer, stream

PROVIDER_NAME = "sim"


@dataclass(frozen=True, slots=True)
class TypeLatencies:
    """Per-instance-type overrides of the latency distributions (None keeps the default)."""

    launch: Dist | None = None
    registration: Dist | None = None
    device_plugin: Dist | None = None


@dataclass(frozen=True, slots=True)
class CapacityRule:
    """At most ``max_nodes`` live nodes matching this rule (None fields match anything), between ``start`` and ``end``.

    A launch that would exceed any active matching rule fails with :class:`InsufficientCapacity`.
    """

    max_nodes: int
    instance_type: str | None = None
    zone: str | None = None
    capacity_type: CapacityType | None = None
    start: float = 0.0
    end: float = math.inf

    def matches(self, instance_type: str, zone: str, capacity_type: CapacityType) -> bool:
        """True if an offering falls under this rule."""
        return (
            (self.instance_type is None or self.instance_type == instance_type)
            and (self.zone is None or self.zone == zone)
            and (self.capacity_type is None or self.capacity_type == capacity_type)
        )

    def active(self, t: float) -> bool:
        """True if the rule applies at time ``t``."""
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True)
class Faults:
    """Random API faults, as probabilities per call of the methods in ``methods``.

    A timeout raises :class:`TransientProviderError` *after* the call took effect with probability
    ``timeout_took_effect`` (the dangerous case for idempotency), else before.
    """

    rate_limited: float = 0.0
    server_error: float = 0.0
    timeout: float = 0.0
    timeout_took_effect: float = 0.5
    retry_after_s: float = 1.0
    methods: tuple[str, ...] = ("launch", "delete_node", "list_nodes")

    def __post_init__(self) -> None:
        for name in ("rate_limited", "server_error", "timeout", "timeout_took_effect"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"fault probability {name} must be in 0..1, got {v}")
        if self.rate_limited + self.server_error + self.timeout > 1.0:
            raise ValueError("fault probabilities must sum to at most 1")


@dataclass(frozen=True, slots=True)
class ApiRateLimit:
    """A token bucket on nodes launched: ``burst`` tokens, refilled at ``per_second``; each node of a launch takes
    one. A launch that finds too few tokens raises :class:`RateLimited` with the wait until there are enough."""

    burst: float
    per_second: float


def _lognormal(median: float, sigma: float = 0.3) -> Dist:
    return Dist("lognormal", median, sigma)


@dataclass(frozen=True, slots=True)
class CloudBehaviour:
    """How the simulated cloud behaves. Times in seconds, rates per node-hour, probabilities in 0..1."""

    launch_latency: Dist = field(default_factory=lambda: _lognormal(40.0))
    registration_latency: Dist = field(default_factory=lambda: _lognormal(50.0))
    device_plugin_delay: Dist = field(default_factory=lambda: _lognormal(90.0))
    deletion_latency: Dist = field(default_factory=lambda: Dist.const(30.0))
    per_type: Mapping[str, TypeLatencies] = field(default_factory=dict)
    capacity: tuple[CapacityRule, ...] = ()
    ice_probability: float = 0.0
    """Probability that any launch fails with insufficient capacity regardless of the capacity rules."""
    quota_nodes: int | None = None
    """Account-wide limit on live nodes: launches beyond it raise :class:`QuotaExceeded`."""
    spot_interruptions_per_hour: float = 0.0
    spot_notice_s: float = 120.0
    spot_protection_s: float = 0.0
    """No spot interruption notice in a node's first ``spot_protection_s`` seconds of running."""
    faults: Faults = field(default_factory=Faults)
    launch_failure_rate: float = 0.0
    """Probability that an accepted launch fails asynchronously while provisioning (reported by ``poll_errors``)."""
    gpu_init_failure_rate: float = 0.0
    """Probability that a GPU node registers but its GPUs never become allocatable."""
    max_nodes_per_launch: int = 100
    api_rate: ApiRateLimit | None = None

    def latencies(self, instance_type: str) -> tuple[Dist, Dist, Dist]:
        """(launch, registration, device plugin) distributions for an instance type."""
        o = self.per_type.get(instance_type)
        if o is None:
            return self.launch_latency, self.registration_latency, self.device_plugin_delay
        return (
            o.launch or self.launch_latency,
            o.registration or self.registration_latency,
            o.device_plugin or self.device_plugin_delay,
        )


@dataclass(slots=True)
class CloudCounters:
    """What the simulated cloud saw. ``failed_launches`` = launch calls that raised + asynchronous launch failures."""

    launch_calls: int = 0
    nodes_launched: int = 0
    failed_launches: int = 0
    insufficient_capacity: int = 0
    quota_exceeded: int = 0
    invalid_requests: int = 0
    rate_limited: int = 0
    server_errors: int = 0
    timeouts: int = 0
    async_launch_failures: int = 0
    gpu_init_failures: int = 0
    idempotent_replays: int = 0
    idempotency_mismatches: int = 0
    duplicate_nodes: int = 0
    redundant_launches: int = 0
    """Nodes created for pending pods that already fitted without them (see the module docstring)."""
    delete_calls: int = 0
    nodes_deleted: int = 0
    spot_notices: int = 0
    spot_terminations: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain dict (for reports)."""
        return {k: int(v) for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class InFlightNode:
    """A node launched but not registered yet, as the cloud describes it to its listener.

    ``node`` is the node as it was created (its state field is not kept up to date); ``taints`` are the launch
    request's taints (the pool's come from the cluster's pool definition).
    """

    node: CloudNode
    itype: InstanceType
    taints: tuple[Taint, ...]
    hourly_price: float


class CloudListener(Protocol):
    """What the cloud tells (and asks) the cluster (implemented by :class:`gpuscale.sim.cluster.SimCluster`)."""

    def launch_is_redundant(self, request: LaunchRequest, in_flight: Collection[InFlightNode]) -> bool:
        """Asked before each node of a launch with pods is created: True if it is redundant, i.e. the pending pods
        fit without it, in the registered nodes and ``in_flight``. Must not change any state."""

    def node_registered(
        self,
        node: CloudNode,
        itype: InstanceType,
        taints: tuple[Taint, ...],
        hourly_price: float,
        gpu_delay: float | None,
    ) -> None:
        """The node's kubelet joined; its GPUs become allocatable after ``gpu_delay`` seconds (None: never)."""

    def node_terminated(self, node: CloudNode, reason: str) -> None:
        """The instance is shutting down or died: its Node and pods are gone."""


class _Rec:
    """Mutable provider-side record of one node."""

    __slots__ = (
        "created_at",
        "ended_at",
        "failed",
        "itype",
        "labels",
        "node_id",
        "node_name",
        "price",
        "registered_at",
        "request",
        "snap",
        "state",
        "taints",
        "timers",
    )

    def __init__(self, node_id: str, node_name: str, request: LaunchRequest, itype: InstanceType, price: float) -> None:
        self.node_id = node_id
        self.node_name = node_name
        self.request = request
        self.itype = itype
        self.price = price
        self.labels: Mapping[str, str] = dict(request.labels)
        self.taints: tuple[Taint, ...] = tuple(request.taints)
        self.state = CloudNodeState.PROVISIONING
        self.snap: CloudNode | None = None
        self.created_at = 0.0
        self.registered_at: float | None = None
        self.ended_at: float | None = None
        self.failed = False
        self.timers: list[Timer] = []

    def set_state(self, state: CloudNodeState) -> None:
        self.state = state
        self.snap = None

    def snapshot(self) -> CloudNode:
        if self.snap is not None:
            return self.snap
        r = self.request
        # CloudNode's fields set as its frozen __init__ sets them, without the keyword passing (made again at every
        # state change of every node); tests/test_sim_cloud.py checks it equals CloudNode(...) field for field
        snap = self.snap = _new(CloudNode)
        _set(snap, "node_id", self.node_id)
        _set(snap, "request_id", r.request_id)
        _set(snap, "pool", r.pool)
        _set(snap, "instance_type", r.instance_type)
        _set(snap, "zone", r.zone)
        _set(snap, "capacity_type", r.capacity_type)
        _set(snap, "state", self.state)
        _set(snap, "created_at", self.created_at)
        _set(snap, "node_name", self.node_name)
        _set(snap, "instance_id", self.node_id)
        _set(snap, "labels", self.labels)
        return snap


_new = object.__new__
_set = object.__setattr__


def _same_intent(a: LaunchRequest, b: LaunchRequest) -> bool:
    return (a.pool, a.instance_type, a.zone, a.capacity_type, a.count) == (
        b.pool,
        b.instance_type,
        b.zone,
        b.capacity_type,
        b.count,
    )


class SimCloud:
    """The simulated provider. See the module docstring for behaviour; construct with an :class:`Engine`.

    ``listener`` (usually the :class:`~gpuscale.sim.cluster.SimCluster`) is told about registrations and
    terminations. ``hook``, if set, is called with a point name (``"launch:before"``, ``"launch:after"``,
    ``"delete_node:before"``, ``"delete_node:after"``) around every mutating call; crash-safety tests raise from it.
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        engine: Engine,
        catalog: Catalog,
        behaviour: CloudBehaviour | None = None,
        *,
        seed: int = 0,
        listener: CloudListener | None = None,
    ) -> None:
        self.engine = engine
        self.catalog = catalog
        self.behaviour = behaviour or CloudBehaviour()
        self.listener = listener
        self.hook: Callable[[str], None] | None = None
        self.counters = CloudCounters()
        self._types = catalog.by_name()
        self._offers: dict[tuple[str, str, CapacityType], Offering] = {
            (it.name, o.zone, o.capacity_type): o for it in catalog.instance_types for o in it.offerings
        }
        self._recs: dict[str, _Rec] = {}
        self._alive: dict[str, _Rec] = {}
        self._by_request: dict[str, tuple[LaunchRequest, list[str]]] = {}
        self._in_flight: dict[str, InFlightNode] = {}
        """node id -> every node launched and not yet registered, deleting, failed or gone."""
        self._events: list[ProviderEvent] = []
        self._seq = 0
        self._rng_faults = stream(seed, "cloud.faults")
        self._rng_lat = stream(seed, "cloud.latency")
        self._rng_fail = stream(seed, "cloud.failures")
        self._rng_spot = stream(seed, "cloud.spot")
        self._cost_closed: dict[tuple[str, str], float] = {}
        self._gpu_s_closed = 0.0
        self._node_s_closed = 0.0
        self.hourly_rate = 0.0
        self._pool_nodes: dict[str, int] = {}
        self._pool_gpus: dict[str, int] = {}
        """$/h of every node currently billed."""
        self.spot_notices: dict[str, float] = {}
        """node name -> deadline of each spot interruption notice given."""
        self.version = 0
        """Bumped on every provider-side state change."""
        self.redundant_nodes: list[str] = []
        """Names of the nodes counted in ``counters.redundant_launches``, in creation order."""
        self._listed: tuple[int, tuple[CloudNode, ...]] = (-1, ())
        self._tokens: tuple[float, float] | None = None
        """(tokens, at) of the API rate-limit bucket, once used."""

    # ----------------------------------------------------------------------------------------------- protocol
    @property
    def capabilities(self) -> ProviderCapabilities:
        """Spot if the catalog has spot offerings; every catalog zone."""
        zones = sorted({z for (_, z, _) in self._offers})
        spot = any(ct is CapacityType.SPOT for (_, _, ct) in self._offers)
        return ProviderCapabilities(
            spot=spot,
            delete_specific_node=True,
            zones=tuple(zones),
            max_nodes_per_launch=self.behaviour.max_nodes_per_launch,
        )

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """Create ``request.count`` nodes, or return those already created for ``request.request_id``."""
        self._hook("launch:before")
        self.counters.launch_calls += 1
        try:
            took_effect_then_timeout = self._maybe_fault("launch")
            self._take_tokens(request)
            nodes = self._launch(request)
        except Exception:
            self.counters.failed_launches += 1
            raise
        if took_effect_then_timeout:
            self.counters.failed_launches += 1
            raise TransientProviderError("launch timed out (the request may have been applied)", provider=self.name)
        self._hook("launch:after")
        return nodes

    def delete_node(self, node_id: str) -> None:
        """Start deleting a node; succeeds if it is already deleting, gone or unknown (nothing to delete)."""
        self._hook("delete_node:before")
        self.counters.delete_calls += 1
        after = self._maybe_fault("delete_node")
        rec = self._recs.get(node_id)
        if rec is not None:
            self._delete(rec, "deleted by request")
        if after:
            raise TransientProviderError("delete timed out (the request may have been applied)", provider=self.name)
        self._hook("delete_node:after")

    def list_nodes(self) -> Sequence[CloudNode]:
        """Every node not yet gone, in creation order."""
        f = self.behaviour.faults  # (asked every round: _maybe_fault is called only when some fault rate is set)
        if (f.rate_limited or f.server_error or f.timeout) and self._maybe_fault("list_nodes"):
            raise TransientProviderError("list_nodes: request timed out", provider=self.name)
        if self._listed[0] != self.version:
            self._listed = (self.version, tuple([r.snap or r.snapshot() for r in self._alive.values()]))
        return self._listed[1]

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Events since the last call (spot notices, asynchronous launch failures, GPU init failures)."""
        out, self._events = self._events, []
        return out

    def has_events(self) -> bool:
        """True if :meth:`poll_errors` would return something (the simulator wakes the controller for these)."""
        return bool(self._events)

    # ------------------------------------------------------------------------------------------------ helpers
    def _hook(self, point: str) -> None:
        if self.hook is not None:
            self.hook(point)

    def _maybe_fault(self, method: str) -> bool:
        """Raise an injected fault before the call; True means "time out after applying the call"."""
        f = self.behaviour.faults
        if method not in f.methods or (f.rate_limited == 0 and f.server_error == 0 and f.timeout == 0):
            return False
        x = self._rng_faults.random()
        if x < f.rate_limited:
            self.counters.rate_limited += 1
            raise RateLimited(f"{method}: too many requests", provider=self.name, retry_after=f.retry_after_s)
        x -= f.rate_limited
        if x < f.server_error:
            self.counters.server_errors += 1
            raise TransientProviderError(f"{method}: internal server error", provider=self.name, status=503)
        x -= f.server_error
        if x < f.timeout:
            self.counters.timeouts += 1
            if self._rng_faults.random() < f.timeout_took_effect:
                return True
            raise TransientProviderError(f"{method}: request timed out", provider=self.name)
        return False

    def _take_tokens(self, request: LaunchRequest) -> None:
        """Charge a new launch to the API rate-limit bucket (replays are free); raise RateLimited if it is short."""
        rate = self.behaviour.api_rate
        if rate is None or request.request_id in self._by_request:
            return
        now = self.engine.now()
        tokens, at = self._tokens if self._tokens is not None else (rate.burst, now)
        tokens = min(rate.burst, tokens + (now - at) * rate.per_second)
        need = min(float(request.count), rate.burst)
        if tokens < need:
            self._tokens = (tokens, now)
            self.counters.rate_limited += 1
            wait = (need - tokens) / rate.per_second if rate.per_second > 0 else 3600.0
            raise RateLimited("launch: API rate limit exceeded", provider=self.name, retry_after=wait)
        self._tokens = (tokens - need, now)

    def _launch(self, request: LaunchRequest) -> list[CloudNode]:
        prior = self._by_request.get(request.request_id)
        if prior is not None:
            first, ids = prior
            if not _same_intent(first, request):
                self.counters.idempotency_mismatches += 1
                raise InvalidProviderRequest(
                    "request id already used with different parameters", provider=self.name, field="request_id"
                )
            self.counters.idempotent_replays += 1
            return [self._recs[i].snapshot() for i in ids]
        itype, offer = self._validate(request)
        now = self.engine.now()
        self._check_capacity(request, now)
        return self._create(request, itype, offer, now)

    def _validate(self, request: LaunchRequest) -> tuple[InstanceType, Offering]:
        def bad(fieldname: str, reason: str) -> InvalidProviderRequest:
            self.counters.invalid_requests += 1
            return InvalidProviderRequest(reason, provider=self.name, field=fieldname)

        if not request.request_id:
            raise bad("request_id", "must not be empty")
        if not request.pool:
            raise bad("pool", "must not be empty")
        if not 1 <= request.count <= self.behaviour.max_nodes_per_launch:
            raise bad("count", f"must be in 1..{self.behaviour.max_nodes_per_launch}, got {request.count}")
        itype = self._types.get(request.instance_type)
        if itype is None:
            raise bad("instance_type", f"unknown instance type {request.instance_type!r}")
        offer = self._offers.get((request.instance_type, request.zone, request.capacity_type))
        if offer is None:
            raise bad(
                "zone", f"{request.instance_type} is not offered as {request.capacity_type} in zone {request.zone!r}"
            )
        return itype, offer

    def _check_capacity(self, request: LaunchRequest, now: float) -> None:
        b = self.behaviour
        if b.quota_nodes is not None and len(self._live_nodes()) + request.count > b.quota_nodes:
            self.counters.quota_exceeded += 1
            raise QuotaExceeded(f"node quota of {b.quota_nodes} reached", provider=self.name, status=403)
        key = (request.instance_type, request.zone, request.capacity_type)
        for rule in b.capacity:
            if rule.active(now) and rule.matches(*key):
                used = sum(1 for r in self._live_nodes() if rule.matches(*_offer_key(r)))
                if used + request.count > rule.max_nodes:
                    self.counters.insufficient_capacity += 1
                    raise InsufficientCapacity(
                        f"insufficient capacity for {request.instance_type} ({request.capacity_type}) in "
                        f"{request.zone}",
                        provider=self.name,
                    )
        if b.ice_probability and self._rng_fail.random() < b.ice_probability:
            self.counters.insufficient_capacity += 1
            raise InsufficientCapacity(
                f"insufficient capacity for {request.instance_type} ({request.capacity_type}) in {request.zone}",
                provider=self.name,
            )

    def _live_nodes(self) -> list[_Rec]:
        return [r for r in self._alive.values() if r.state is not CloudNodeState.DELETING]

    def _create(self, request: LaunchRequest, itype: InstanceType, offer: Offering, now: float) -> list[CloudNode]:
        if request.request_id in self._by_request:  # cannot happen: replays return above. Counted, never hidden.
            self.counters.duplicate_nodes += request.count
        ids: list[str] = []
        launch_d, _, _ = self.behaviour.latencies(itype.name)
        listener = self.listener if request.pods else None
        for _ in range(request.count):
            redundant = listener is not None and listener.launch_is_redundant(request, self._in_flight.values())
            self._seq += 1
            node_id = f"sim-{self._seq:06d}"
            rec = _Rec(node_id, f"{request.pool}-{self._seq:05d}", request, itype, offer.hourly_price)
            rec.created_at = now
            self._recs[node_id] = rec
            self._alive[node_id] = rec
            self._in_flight[node_id] = InFlightNode(rec.snapshot(), itype, rec.taints, rec.price)
            if redundant:
                self.counters.redundant_launches += 1
                self.redundant_nodes.append(rec.node_name)
            self.hourly_rate += rec.price
            self._count_alive(rec, +1)
            ids.append(node_id)
            rec.timers.append(self.engine.after(launch_d.sample(self._rng_lat), self._running, rec))
        self._by_request[request.request_id] = (request, ids)
        self.version += 1
        self.counters.nodes_launched += request.count
        return [self._recs[i].snapshot() for i in ids]

    def _running(self, rec: _Rec) -> None:
        if rec.state is not CloudNodeState.PROVISIONING:
            return
        b = self.behaviour
        if b.launch_failure_rate and self._rng_fail.random() < b.launch_failure_rate:
            self.counters.async_launch_failures += 1
            rec.failed = True
            self.counters.failed_launches += 1
            self._events.append(
                ProviderEvent(
                    ProviderEventKind.LAUNCH_FAILED,
                    node_id=rec.node_id,
                    request_id=rec.request.request_id,
                    message=f"instance {rec.node_id} failed to start",
                    at=self.engine.now(),
                )
            )
            self._end(rec)
            return
        rec.set_state(CloudNodeState.RUNNING)
        self.version += 1
        _, reg_d, _ = b.latencies(rec.itype.name)
        rec.timers = [self.engine.after(reg_d.sample(self._rng_lat), self._register, rec)]
        if rec.request.capacity_type is CapacityType.SPOT and b.spot_interruptions_per_hour > 0:
            dt = b.spot_protection_s + self._rng_spot.expovariate(b.spot_interruptions_per_hour / 3600.0)
            rec.timers.append(self.engine.after(dt, self._spot_notice, rec))

    def _register(self, rec: _Rec) -> None:
        if rec.state is not CloudNodeState.RUNNING:
            return
        rec.set_state(CloudNodeState.READY)
        self.version += 1
        rec.registered_at = self.engine.now()
        self._in_flight.pop(rec.node_id, None)
        gpu_delay: float | None = 0.0
        if rec.itype.gpu_count:
            _, _, dp = self.behaviour.latencies(rec.itype.name)
            gpu_delay = dp.sample(self._rng_lat)
            if self.behaviour.gpu_init_failure_rate and self._rng_fail.random() < self.behaviour.gpu_init_failure_rate:
                self.counters.gpu_init_failures += 1
                rec.failed = True
                gpu_delay = None
        if self.listener is not None:
            self.listener.node_registered(rec.snapshot(), rec.itype, rec.taints, rec.price, gpu_delay)

    def interrupt(self, node_id: str) -> None:
        """Give a spot interruption notice to a node now (for tests and scripted scenarios)."""
        rec = self._recs.get(node_id)
        if rec is None:
            raise NotFound(f"node {node_id} does not exist", provider=self.name)
        self._spot_notice(rec)

    def _spot_notice(self, rec: _Rec) -> None:
        if rec.state in (CloudNodeState.DELETING, CloudNodeState.GONE) or rec.node_name in self.spot_notices:
            return
        now = self.engine.now()
        deadline = now + self.behaviour.spot_notice_s
        self.counters.spot_notices += 1
        self.spot_notices[rec.node_name] = deadline
        self.version += 1
        self._events.append(
            ProviderEvent(
                ProviderEventKind.SPOT_INTERRUPTION,
                node_id=rec.node_id,
                request_id=rec.request.request_id,
                message=f"spot instance {rec.node_id} ({rec.node_name}) will be reclaimed",
                at=now,
                deadline=deadline,
            )
        )
        rec.timers.append(self.engine.at(deadline, self._spot_kill, rec))

    def _spot_kill(self, rec: _Rec) -> None:
        if rec.state in (CloudNodeState.DELETING, CloudNodeState.GONE):
            return
        self.counters.spot_terminations += 1
        if self.listener is not None and rec.registered_at is not None:
            self.listener.node_terminated(rec.snapshot(), "spot-interruption")
        self._end(rec)

    def _delete(self, rec: _Rec, reason: str) -> None:
        if rec.state in (CloudNodeState.DELETING, CloudNodeState.GONE):
            return
        for t in rec.timers:
            t.cancel()
        was_registered = rec.registered_at is not None
        rec.set_state(CloudNodeState.DELETING)
        self._in_flight.pop(rec.node_id, None)
        self.version += 1
        self.counters.nodes_deleted += 1
        if self.listener is not None and was_registered:
            self.listener.node_terminated(rec.snapshot(), reason)
        latency = self.behaviour.deletion_latency.sample(self._rng_lat)
        if latency > 0:
            rec.timers = [self.engine.after(latency, self._end, rec)]
        else:
            rec.timers = []
            self._end(rec)

    def _end(self, rec: _Rec) -> None:
        if rec.state is CloudNodeState.GONE:
            return
        for t in rec.timers:
            t.cancel()
        rec.timers = []
        rec.set_state(CloudNodeState.GONE)
        self._in_flight.pop(rec.node_id, None)
        self.version += 1
        now = self.engine.now()
        rec.ended_at = now
        del self._alive[rec.node_id]
        self._count_alive(rec, -1)
        self.hourly_rate -= rec.price
        if not self._alive:
            self.hourly_rate = 0.0  # no float drift when the cloud is empty
        secs = now - rec.created_at
        key = (rec.request.pool, rec.itype.name)
        self._cost_closed[key] = self._cost_closed.get(key, 0.0) + secs * rec.price / 3600.0
        self._gpu_s_closed += secs * rec.itype.gpu_count
        self._node_s_closed += secs

    # ----------------------------------------------------------------------------------------------- accounting
    def cost_by_pool_type(self, now: float | None = None) -> dict[tuple[str, str], float]:
        """Exact cost in USD so far (node-seconds × hourly price / 3600), per (pool, instance type)."""
        t = self.engine.now() if now is None else now
        out = dict(self._cost_closed)
        for r in self._alive.values():
            key = (r.request.pool, r.itype.name)
            out[key] = out.get(key, 0.0) + (t - r.created_at) * r.price / 3600.0
        return out

    def total_cost(self, now: float | None = None) -> float:
        """Exact cost in USD so far."""
        return sum(self.cost_by_pool_type(now).values())

    def gpu_hours_bought(self, now: float | None = None) -> float:
        """GPU-hours paid for so far (GPUs × billed hours)."""
        t = self.engine.now() if now is None else now
        return (self._gpu_s_closed + sum((t - r.created_at) * r.itype.gpu_count for r in self._alive.values())) / 3600

    def node_hours(self, now: float | None = None) -> float:
        """Node-hours paid for so far."""
        t = self.engine.now() if now is None else now
        return (self._node_s_closed + sum(t - r.created_at for r in self._alive.values())) / 3600

    def alive(self) -> list[CloudNode]:
        """Every billed node (like :meth:`list_nodes` without fault injection)."""
        return [r.snapshot() for r in self._alive.values()]

    def _count_alive(self, rec: _Rec, sign: int) -> None:
        pool = rec.request.pool
        self._pool_nodes[pool] = self._pool_nodes.get(pool, 0) + sign
        self._pool_gpus[pool] = self._pool_gpus.get(pool, 0) + sign * rec.itype.gpu_count
        if not self._pool_nodes[pool]:
            del self._pool_nodes[pool], self._pool_gpus[pool]

    def pool_counts(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(billed nodes per pool, their GPUs per pool), kept up to date as nodes start and stop billing (read-only
        views, not copies)."""
        return self._pool_nodes, self._pool_gpus

    def add_capacity_rule(self, rule: CapacityRule) -> None:
        """Add a capacity rule from now on (e.g. ``CapacityRule(0, instance_type=t)`` exhausts a type)."""
        self.behaviour = replace(self.behaviour, capacity=(*self.behaviour.capacity, rule))

    def set_quota(self, nodes: int | None) -> None:
        """Change the account node quota (None: unlimited)."""
        self.behaviour = replace(self.behaviour, quota_nodes=nodes)

    def launched_node_names(self, *, include_failed: bool = True) -> list[str]:
        """Names of every node ever created, in creation order (optionally without failed launches)."""
        return [r.node_name for r in self._recs.values() if include_failed or not r.failed]

    def launched(self) -> list[CloudNode]:
        """Every node ever created (failed and gone ones included), in creation order."""
        return [r.snapshot() for r in self._recs.values()]

    def in_flight(self) -> list[InFlightNode]:
        """Nodes launched and not yet registered, deleting, failed or gone, in creation order."""
        return list(self._in_flight.values())

    def node_ids_for(self, request_id: str) -> list[str]:
        """Node ids created for a request id (empty if none)."""
        prior = self._by_request.get(request_id)
        return list(prior[1]) if prior else []


def _offer_key(r: _Rec) -> tuple[str, str, CapacityType]:
    return (r.request.instance_type, r.request.zone, r.request.capacity_type)


CONTRACT_INSTANCE_TYPE = "sim-gpu-1"
CONTRACT_ZONE = "sim-z1"
CONTRACT_NO_CAPACITY_TYPE = "sim-gpu-none"


def contract_catalog() -> Catalog:
    """A small catalog for generic provider tests: CPU, 1-GPU (with spot) and 4-GPU types, and one that never fits."""

    def it(name: str, vcpus: int, mem_gib: int, gpus: int, price: float, spot: float | None) -> InstanceType:
        offers = [Offering(z, CapacityType.ON_DEMAND, price) for z in ("sim-z1", "sim-z2")]
        if spot is not None:
            offers += [Offering(z, CapacityType.SPOT, spot) for z in ("sim-z1", "sim-z2")]
        return InstanceType(
            name,
            PROVIDER_NAME,
            vcpus,
            mem_gib * 1024,
            gpus,
            "SIM-GPU" if gpus else None,
            24576 if gpus else 0,
            family="sim",
            region="sim-region",
            offerings=tuple(offers),
        )

    return Catalog(
        "sim-contract",
        (
            it("sim-cpu-4", 4, 16, 0, 0.2, None),
            it(CONTRACT_INSTANCE_TYPE, 8, 32, 1, 1.0, 0.4),
            it("sim-gpu-4", 32, 128, 4, 4.0, 1.6),
            it(CONTRACT_NO_CAPACITY_TYPE, 8, 32, 1, 1.0, None),
        ),
    )


def make_contract_cloud(seed: int = 0) -> SimCloud:
    """A fault-free :class:`SimCloud` for the generic provider contract suite.

    ``CONTRACT_INSTANCE_TYPE`` in ``CONTRACT_ZONE`` (on-demand or spot) launches; every offering of
    ``CONTRACT_NO_CAPACITY_TYPE`` raises :class:`InsufficientCapacity`; :meth:`SimCloud.add_capacity_rule` and
    :meth:`SimCloud.set_quota` exhaust capacity or quota. Deletion is immediate (the node leaves ``list_nodes`` at
    once). Time stands still unless the test advances ``cloud.engine`` (``cloud.engine.run_until(t)``): nodes then
    go provisioning -> running -> ready.
    """
    behaviour = CloudBehaviour(
        deletion_latency=Dist.const(0.0),
        capacity=(CapacityRule(0, instance_type=CONTRACT_NO_CAPACITY_TYPE),),
    )
    return SimCloud(Engine(), contract_catalog(), behaviour, seed=seed)
