"""The reconcile loop shared by every backend (simulated cluster, Kubernetes): observe -> decide -> act.

One :meth:`Controller.reconcile` call:

1. **observe** pods, nodes, PDBs and GPU utilisation from the :class:`~gpuscale.controller.backend.ClusterBackend`,
   the provider's node list and its asynchronous events (spot notices, launch failures);
2. **sync node claims** (:mod:`gpuscale.core.nodeclaim`): every provider node is a claim keyed by its launch request
   id; claims advance Launched -> Registered -> Initialized as the Node appears and advertises its GPUs, time out
   by their per-pool deadlines, and vanish when the provider no longer lists them;
3. **scale up**: pending pods are batched (a batch closes ``batch_idle_s`` after the last new pending pod, or
   ``batch_max_s`` after it opened), then the pure planner (:func:`gpuscale.core.planner.plan`) sees every node in
   flight as a ``launching`` node with its template's allocatable, so a slow device plugin never causes a second
   launch for the same pods. Provider errors are data: insufficient capacity marks the offering unavailable for
   ``unavailable_ttl_s`` and re-plans at once (next cheapest offering, pool or capacity type; a spot-only pool with
   ``allow_spot_fallback`` may then buy on-demand, labelled as a fallback that later drifts back to spot); quota
   and rate-limit errors back a pool off; transient errors retry the same request id;
4. **scale down** with :func:`gpuscale.core.disruption.plan_disruption` every ``disruption_interval_s``;
5. **act**: launch (one node per request id), cordon, evict (never past a PDB; never a do-not-disrupt pod in a
   voluntary drain), delete; every decision is recorded as an :class:`~gpuscale.controller.backend.Event`.

Crash safety: the controller keeps nothing that cannot be rebuilt. A new controller adopts every provider node as a
claim (a cordoned node is resumed as Draining, a provider node in ``deleting`` as Deleting), and request ids are
derived deterministically from what is launched and for which pods, so a restart between "asked" and "recorded"
replays the same id and the provider's idempotency returns the node it already made. Deletes are idempotent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuscale.clock import Clock
from gpuscale.controller.availability import Availability
from gpuscale.controller.backend import ClusterBackend, Event
from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.controller.launcher import Launcher, apply_mark
from gpuscale.core import labels as L
from gpuscale.core.disruption import (
    SPOT_FALLBACK_LABEL,
    ActionKind,
    DisruptionAction,
    DisruptionPlan,
    KeepReason,
    PodDisruptionBudget,
    do_not_disrupt,
    pdb_allowances,
    plan_disruption,
    pool_offerings,
)
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    InstanceType,
    Node,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
    Snapshot,
    Taint,
)
from gpuscale.core.nodeclaim import (
    IN_FLIGHT,
    REQUEST_ID_LABEL,
    TIMED_PHASES,
    ClaimEvent,
    ClaimPhase,
    NodeClaim,
    deadline,
    new_claim,
    transition,
)
from gpuscale.core.plan import BlockReason, PlannerConfig, ScaleUpPlan
from gpuscale.core.reconcile import (
    ClearRetry,
    Cordon,
    Decisions,
    DrainStarted,
    DropReplacement,
    EventKind,
    FinishClaim,
    Fleet,
    MarkUnavailable,
    Note,
    Outcome,
    SetClaim,
    expire_deadlines,
    find_node,
    on_provider_events,
    progress_replacements,
    retry_delay,
    start_drain,
    sync_claims,
)
from gpuscale.core.resources import Resources
from gpuscale.core.templates import template_allocatable, template_labels
from gpuscale.errors import NotFound, ProviderError
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, Provider, ProviderEvent

__all__ = ["Controller", "ControllerConfig", "EventKind", "ReconcileResult", "make_controller"]

PlanFn = Callable[[Snapshot, PlannerConfig, float], ScaleUpPlan]
"""The planner's signature (:func:`gpuscale.core.planner.plan`)."""


@dataclass(slots=True)
class ReconcileResult:
    """What one reconcile did."""

    at: float
    planned: bool = False
    launched: int = 0
    disrupted: int = 0
    evicted: int = 0
    deleted: int = 0
    observe_failed: bool = False


@dataclass(slots=True)
class _World:
    """One observation."""

    now: float
    pods: list[Pod]
    nodes: dict[str, Node]
    cloud: list[CloudNode]
    events: list[ProviderEvent]
    pdbs: list[PodDisruptionBudget]
    utilization: Mapping[str, float]
    _by_node: dict[str, list[Pod]] | None = None
    _unbound: list[Pod] | None = None

    def by_node(self) -> dict[str, list[Pod]]:
        """Bound pods grouped by node name (computed once per observation; ``pods`` is not changed afterwards)."""
        if self._by_node is None:
            self._group()
        assert self._by_node is not None
        return self._by_node

    def unbound(self) -> list[Pod]:
        """Pods without a node (computed with :meth:`by_node`)."""
        if self._unbound is None:
            self._group()
        assert self._unbound is not None
        return self._unbound

    def _group(self) -> None:
        out: dict[str, list[Pod]] = {}
        free: list[Pod] = []
        for p in self.pods:
            if p.node_name is None:
                free.append(p)
            elif p.node_name in out:
                out[p.node_name].append(p)
            else:
                out[p.node_name] = [p]
        self._by_node, self._unbound = out, free


def _default_planner() -> PlanFn:
    from gpuscale.core.planner import plan

    return plan


@dataclass(frozen=True, slots=True)
class _DisruptionInputs:
    pods: list[Pod]
    nodes: list[Node]
    protected: frozenset[str]
    unavailable: dict[OfferingKey, float]


_LIVE_PHASES = ("Pending", "Running", "")
_LEAVING = frozenset({ClaimPhase.DRAINING, ClaimPhase.DELETING, ClaimPhase.FAILED})
"""Claim phases whose node is on its way out (takes no pods, counts against disruption budgets)."""
_STATIC_BLOCKS = frozenset(
    {BlockReason.TOO_LARGE, BlockReason.NO_MATCHING_POOL, BlockReason.TAINT_NOT_TOLERATED, BlockReason.INVALID_REQUEST}
)
"""Block reasons no change of nodes, capacity or time can lift (pools and catalog are fixed for a controller)."""
_HOLDS_NODE = frozenset(
    {
        ClaimPhase.LAUNCHED,
        ClaimPhase.REGISTERED,
        ClaimPhase.INITIALIZED,
        ClaimPhase.DRAINING,
        ClaimPhase.DELETING,
    }
)


class Controller:
    """The gpuscale controller. Call :meth:`reconcile` periodically (every second or so, or at :meth:`next_wakeup`).

    ``pools`` and ``catalog`` describe what may be launched; ``planner`` defaults to
    :func:`gpuscale.core.planner.plan`. All state is rebuilt from ``backend`` and ``provider`` on the first
    reconcile, so constructing a new controller is how a crashed one restarts.
    """

    def __init__(
        self,
        backend: ClusterBackend,
        provider: Provider,
        pools: Sequence[NodePool],
        catalog: Catalog,
        clock: Clock,
        config: ControllerConfig | None = None,
        *,
        planner: PlanFn | None = None,
        availability: Availability | None = None,
        check_gate: bool = False,
    ) -> None:
        self.backend = backend
        self.provider = provider
        self.pools: dict[str, NodePool] = {p.name: p for p in pools}
        self.catalog = catalog
        self.clock = clock
        self.config = config or ControllerConfig()
        self._plan_fn: PlanFn = planner or _default_planner()
        self._types: dict[str, InstanceType] = catalog.by_name()
        self.claims = ClaimTable()
        """Live node claims by request id (indexed by phase)."""
        self.availability = availability if availability is not None else Availability()
        """Offerings not to be bought, pool back-offs and spot fallbacks, each until a time (kept by its store across
        restarts)."""
        self.availability.expire(clock.now())
        self._rules = self.config.rules()
        self._fleet = Fleet(self.pools, self._types)
        self._now = clock.now()
        """The time of the current round (notes from the launcher are stamped with it)."""
        self.launcher = Launcher(
            provider, self.availability, self.config.launch_rules(), self._note, prefix=self.config.request_id_prefix
        )
        """Request ids, launches and their retries at due times."""
        self._involuntary: set[str] = set()
        self._replacements: dict[str, tuple[tuple[str, ...], DisruptionAction]] = {}
        self._orphan_since: dict[str, float] = {}
        self._batch_start: float | None = None
        self._batch_last: float = -math.inf
        self._seen_pending: set[str] = set()
        self._force_plan = False
        self._last_plan_at = -math.inf
        self._last_signature: object = None
        self._planned_on_node: dict[str, str] = {}
        self._unlisted: set[str] = set()
        self._listed_nodes: tuple[object, dict[str, Node]] = (None, {})
        self._listed_cloud: tuple[object, list[CloudNode]] = (None, [])
        """The last node and cloud lists as returned (when immutable tuples) and as observed: the same tuple again
        is observed without looking at each node."""
        self._synced: tuple[object, int] | None = None
        """(cloud list, claim table version) after a claim sync that left nothing to wait for."""
        self._static_blocked: set[str] = set()
        self.gate = ConsolidationGate(self.pools, self.config, check=check_gate)
        """The consolidation step's clocks, caches and skips."""
        self._measured = self.gate.measured
        """Some pool judges utilisation by measured GPU use, so the backend's metrics are read every round."""
        self._reported: dict[str, str] = {}
        self._wake_times: list[float] | None = None
        """Sorted candidate wake-up times, computed on demand after each round."""
        self._delete_retry_at: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------ public
    @property
    def unavailable(self) -> Mapping[OfferingKey, float]:
        """Offerings not to be bought until the given time (read-only; see :attr:`availability`)."""
        return self.availability.offerings

    def reconcile(self) -> ReconcileResult:
        """One observe -> decide -> act round."""
        result, world = self._begin_round()
        if world is None:
            return result
        self._handle_provider_events(world)
        self._check_deadlines(world)
        self._progress_replacements(world)
        self._retry_requested(world, result)
        self._scale_up(world, result)
        self._ensure_min_nodes(world, result)
        self._consolidate(world, result)
        self._drain_and_delete(world, result)
        self._collect_orphans(world)
        return result

    def prelaunch(self, plan: ScaleUpPlan) -> ReconcileResult:
        """Launch the nodes of a plan made elsewhere (e.g. capacity bought ahead for a known peak).

        Request ids derive from the plan as in a normal scale-up, so calling this twice launches nothing new.
        """
        result, world = self._begin_round()
        if world is not None:
            self._execute_plan(plan, world, result)
        return result

    def _begin_round(self) -> tuple[ReconcileResult, _World | None]:
        """Start a round: forget the cached wake-up times, observe, and sync the claims with what was observed.
        The world is None (and the result says so) when observing failed."""
        self._wake_times = None
        now = self.clock.now()
        self._now = now
        result = ReconcileResult(at=now)
        world = self._observe(now)
        if world is None:
            result.observe_failed = True
            return result, None
        self._sync_claims(world)
        return result, world

    def next_wakeup(self) -> float | None:
        """The next future time at which a reconcile has timed work to do, or None.

        Batch windows closing, claim deadlines, launch/delete retries, orphan grace periods, consolidateAfter
        expiring, a skipped disruption pass, and (while pods are pending) offering/back-off/fallback expiries.
        Anything else only changes when the cluster or cloud changes, which a driver observes by itself.
        The candidate times are kept until the next reconcile (nothing else changes them).
        """
        now = self.clock.now()
        if self._wake_times is None:
            self._wake_times = sorted(t for t in self._timer_candidates() if t < math.inf)
        return next((t for t in self._wake_times if t > now), None)

    def _timer_candidates(self) -> list[float]:
        times: list[float] = []
        if self._batch_start is not None:
            times.append(min(self._batch_last + self.config.batch_idle_s, self._batch_start + self.config.batch_max_s))
        for _, c in self.claims.in_phases(TIMED_PHASES):
            t = deadline(c)
            if t is not None:
                times.append(t + 1e-6)
        for key in self._unlisted:
            unlisted = self.claims.get(key)
            if unlisted is not None and unlisted.phase is ClaimPhase.LAUNCHED:
                times.append(unlisted.since + self.config.lost_grace_s)
        times += self.launcher.wake_times()
        times += self._delete_retry_at.values()
        times += [t + self.config.orphan_grace_s for t in self._orphan_since.values()]
        if self._seen_pending:
            times += self.availability.expiries()
        times += self.gate.wake_times(self._pool_of_node)
        return times

    # --------------------------------------------------------------------------------------------- observing
    def _observe(self, now: float) -> _World | None:
        try:
            pods = [p for p in self.backend.list_pods() if p.phase in _LIVE_PHASES]
            listed = self.backend.list_nodes()
            if listed is self._listed_nodes[0]:
                nodes = dict(self._listed_nodes[1])  # a copy: the controller deletes from it during the round
            else:
                nodes = {n.name: self._normalise(n) for n in listed}
                self._listed_nodes = (listed, dict(nodes)) if isinstance(listed, tuple) else (None, {})
            provided = self.provider.list_nodes()
            if provided is not self._listed_cloud[0]:
                alive = [c for c in provided if c.state is not CloudNodeState.GONE]
                self._listed_cloud = (provided if isinstance(provided, tuple) else None, alive)
            cloud = self._listed_cloud[1]
            events = list(self.provider.poll_errors())
            pdbs = list(self.backend.list_pdbs())
            utilization = dict(self.backend.gpu_utilization()) if self._measured else {}
        except ProviderError as exc:
            self._record(now, EventKind.OBSERVE_FAILED, "provider/" + self.provider.name, type(exc).__name__, str(exc))
            return None
        return _World(now, pods, nodes, cloud, events, pdbs, utilization)

    @staticmethod
    def _normalise(node: Node) -> Node:
        if node.pool is None and L.POOL in node.labels:
            return replace(node, pool=node.labels[L.POOL])
        return node

    # --------------------------------------------------------------------------------------------- claims
    def _sync_claims(self, w: _World) -> None:
        if self._synced is not None and self._synced == (self._listed_cloud[0], self.claims.version):
            return  # the same provider list and claims as after the last sync that learnt nothing: nothing to learn
        self._synced = None
        d = sync_claims(
            self.claims,
            w.cloud,
            w.nodes,
            self._fleet,
            self._rules,
            w.now,
            requested=self.claims.count(ClaimPhase.REQUESTED),
        )
        self._apply(d, w)
        self._unlisted = d.unlisted
        if d.settled and self._listed_cloud[0] is not None:
            # every listed node matched its settled claim, which depends on neither the time nor the cluster
            self._synced = (self._listed_cloud[0], self.claims.version)

    def _apply(self, d: Decisions, w: _World) -> None:
        """Carry out a pure decision record, in order."""
        now = w.now
        for a in d.actions:
            if isinstance(a, SetClaim):
                self.claims[a.key] = a.claim
            elif isinstance(a, Note):
                self._record(now, a.kind, a.object, a.reason, a.message, **a.data)
            elif isinstance(a, FinishClaim):
                self._finish(a.key, a.claim)
            elif isinstance(a, MarkUnavailable):
                apply_mark(self.availability, a, now, self._note)
            elif isinstance(a, Cordon):
                self.backend.cordon(a.node_name)
                node = w.nodes.get(a.node_name)
                if node is not None:
                    w.nodes[a.node_name] = replace(node, unschedulable=True)
            elif isinstance(a, DrainStarted):
                if a.involuntary:
                    self._involuntary.add(a.key)
                self.gate.forget(a.node_name)
            elif isinstance(a, ClearRetry):
                self.launcher.listed(a.key)
            elif isinstance(a, DropReplacement):
                self._replacements.pop(a.old_node, None)
        if d.replan:
            self._force_plan = True

    def _finish(self, key: str, claim: NodeClaim) -> None:
        """Drop a claim that reached Gone; its request id is never reused."""
        del self.claims[key]
        self.launcher.forget(key)
        self._involuntary.discard(key)
        self._delete_retry_at.pop(key, None)
        if claim.node_name:
            self.gate.forget(claim.node_name)
            self._reported.pop(f"node/{claim.node_name}", None)

    def _claim_by_node_name(self, name: str) -> tuple[str, NodeClaim] | None:
        return self.claims.by_node_name(name)

    # --------------------------------------------------------------------------------------- provider events
    def _handle_provider_events(self, w: _World) -> None:
        if w.events:
            self._apply(on_provider_events(self.claims, w.events, w.nodes, self._rules, w.now), w)

    def _start_drain(self, key: str, c: NodeClaim, w: _World, reason: str, *, involuntary: bool) -> None:
        d = Decisions()
        start_drain(key, c, reason, w.nodes, w.now, d, involuntary=involuntary)
        self._apply(d, w)

    # ------------------------------------------------------------------------------------------- deadlines
    def _check_deadlines(self, w: _World) -> None:
        timed = self.claims.in_phases(TIMED_PHASES)
        if timed:
            self._apply(expire_deadlines(timed, self._rules, w.now), w)

    # -------------------------------------------------------------------------------------------- replacing
    def _progress_replacements(self, w: _World) -> None:
        """Drain a replaced node once all its replacements are initialised; keep it if one of them fails."""
        if not self._replacements:
            return
        reps = {old: (rids, str(action.reason)) for old, (rids, action) in self._replacements.items()}
        self._apply(progress_replacements(reps, self.claims, self.claims.by_node_name, w.nodes, w.now), w)

    # ----------------------------------------------------------------------------------------------- scale up
    def _retry_requested(self, w: _World, result: ReconcileResult) -> None:
        for key, c in self.claims.in_phases((ClaimPhase.REQUESTED,)):
            if self.launcher.due(key, w.now):
                if self.availability.backed_off(c.pool, w.now):
                    continue
                outcome = self._call_launch(key, w)
                if outcome is Outcome.OK:
                    result.launched += 1
                elif outcome is not Outcome.RETRY:
                    self._force_plan = True

    def _pending(self, w: _World) -> tuple[list[Pod], list[Pod]]:
        """(real pending pods, pods of draining nodes shown to the planner as pending)."""
        real = [p for p in w.unbound() if p.phase == "Pending" and not p.is_daemonset]
        leaving = {c.node_name for _, c in self.claims.in_phases(_LEAVING) if c.node_name}
        by_node = w.by_node()
        virtual = [
            replace(p, node_name=None, phase="Pending")
            for name in sorted(leaving)
            for p in by_node.get(name, ())
            if not p.is_daemonset
        ]
        return real, virtual

    def _update_batch(self, real: Sequence[Pod], now: float) -> bool:
        """Track the batch window; True if it is closed (planning may run)."""
        keys = {p.key for p in real}
        if keys - self._seen_pending:
            if self._batch_start is None:
                self._batch_start = now
            self._batch_last = now
        self._seen_pending = keys
        if self._batch_start is None:
            return True
        c = self.config
        return now - self._batch_last >= c.batch_idle_s or now - self._batch_start >= c.batch_max_s

    def _scale_up(self, w: _World, result: ReconcileResult) -> None:
        now = w.now
        real, virtual = self._pending(w)
        closed = self._update_batch(real, now)
        if not real and not virtual:
            self._batch_start = None
            self._planned_on_node = {}
            self._prune_reports(set())
            return
        if not closed and not self._force_plan:
            return
        # pods no cluster change can help (too large, no matching pool) keep their reason and are not re-planned
        pending_keys = {p.key for p in real} | {p.key for p in virtual}
        self._static_blocked &= pending_keys
        real = [p for p in real if p.key not in self._static_blocked]
        if not real and not virtual:
            self._batch_start = None
            return
        if not virtual and not self._force_plan and self._all_covered(real, w):
            return  # every pending pod already has room on a node in flight: re-planning cannot launch less
        signature = self._signature(real, virtual, w)
        if (
            not self._force_plan
            and signature == self._last_signature
            and now - self._last_plan_at < self.config.replan_interval_s
        ):
            return
        self._force_plan = False
        self._batch_start = None
        result.planned = True
        plan: ScaleUpPlan | None = None
        for _ in range(max(1, self.config.max_replans)):
            snapshot = self._snapshot(w, real, virtual)
            plan = self._plan_fn(snapshot, self.config.planner, now)
            if not self._execute_plan(plan, w, result):
                break
        assert plan is not None
        self._last_plan_at = now
        self._planned_on_node = {k: v for k, v in plan.placements.items() if v in w.nodes}
        self._last_signature = self._signature(real, virtual, w)
        self._static_blocked |= {b.pod for b in plan.blocked if b.reason in _STATIC_BLOCKS}
        for b in plan.blocked:
            self._report(f"pod/{b.pod}", str(b.reason), EventKind.BLOCKED, now, b.message)
        self._prune_reports(pending_keys)

    def _all_covered(self, real: Sequence[Pod], w: _World) -> bool:
        """True if every pending pod is one a live in-flight claim was launched for, or was planned onto a node
        that is still coming up (or, within ``replan_interval_s``, onto any schedulable node)."""
        in_flight: set[str] = set()
        coming_up: set[str] = set()
        for _, c in self.claims.in_phases(IN_FLIGHT):
            in_flight.update(c.pods)
            if c.node_name:
                coming_up.add(c.node_name)
        fresh = w.now - self._last_plan_at < self.config.replan_interval_s
        for p in real:
            if p.key in in_flight:
                continue
            target = self._planned_on_node.get(p.key)
            node = w.nodes.get(target) if target is not None else None
            if node is not None and not node.unschedulable and (target in coming_up or fresh):
                continue
            return False
        return True

    def _signature(self, real: Sequence[Pod], virtual: Sequence[Pod], w: _World) -> object:
        now = w.now
        return (
            frozenset(p.key for p in real),
            frozenset(p.key for p in virtual),
            frozenset((k, c.phase) for k, c in self.claims.items()),
            frozenset(k for k, t in self.availability.offerings.items() if t > now),
            frozenset(w.nodes),
            frozenset(p for p in self.availability.backoffs if self.availability.backed_off(p, now)),
            frozenset(p for p, t in self.availability.fallbacks.items() if t > now),
        )

    def _effective_pools(self, nodes: Sequence[Node], now: float) -> list[NodePool]:
        counts: dict[str, int] = {}
        for n in nodes:
            if n.pool is not None:
                counts[n.pool] = counts.get(n.pool, 0) + 1
        out: list[NodePool] = []
        for p in self.pools.values():
            q = p
            if self._spot_fallback(p, now) and CapacityType.ON_DEMAND not in p.capacity_types:
                q = replace(q, capacity_types=(*p.capacity_types, CapacityType.ON_DEMAND))
            if self.availability.backed_off(p.name, now):
                q = replace(q, max_nodes=counts.get(p.name, 0))
            out.append(q)
        return out

    def _spot_fallback(self, pool: NodePool, now: float) -> bool:
        return (
            pool.allow_spot_fallback
            and CapacityType.SPOT in pool.capacity_types
            and self.availability.fallback_active(pool.name, now)
        )

    def _snapshot(self, w: _World, real: Sequence[Pod], virtual: Sequence[Pod]) -> Snapshot:
        by_name = {c.node_name: c for c in self.claims.values() if c.node_name}
        nodes: list[Node] = []
        for n in w.nodes.values():
            c = by_name.get(n.name)
            if c is not None and c.phase in _LEAVING:
                nodes.append(replace(n, unschedulable=True, pool=n.pool or c.pool))
            elif c is not None and c.phase is ClaimPhase.REGISTERED:
                alloc = c.expected if c.expected.gpus > n.allocatable.gpus else n.allocatable
                nodes.append(replace(n, allocatable=alloc, launching=True, pool=n.pool or c.pool))
            elif c is not None and n.pool is None:
                nodes.append(replace(n, pool=c.pool))
            else:
                nodes.append(n)
        for key, c in sorted(self.claims.items()):
            if c.node_name in w.nodes:
                continue
            if c.phase in (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED):
                nodes.append(self._launching_node(key, c))
            elif c.phase in (ClaimPhase.DRAINING, ClaimPhase.DELETING) or (c.phase is ClaimPhase.FAILED and c.node_id):
                # still billed and counted against maxNodes/limits, but takes no pods
                nodes.append(replace(self._launching_node(key, c), launching=False, unschedulable=True))
        virtual_keys = {p.key for p in virtual}
        pods = [p for p in w.pods if p.key not in virtual_keys and p.key not in self._static_blocked] + list(virtual)
        return Snapshot(
            pods=tuple(pods),
            nodes=tuple(nodes),
            pools=tuple(self._effective_pools(nodes, w.now)),
            catalog=self.catalog,
            unavailable=self.availability.unavailable_at(w.now),
        )

    def _launching_node(self, key: str, c: NodeClaim) -> Node:
        labels, taints = self._template(c)
        return Node(
            name=c.node_name or f"nodeclaim-{key}",
            allocatable=c.expected,
            labels=labels,
            taints=taints,
            pool=c.pool,
            launching=True,
            hourly_cost=c.hourly_price,
        )

    def _offering(self, instance_type: str, zone: str, ct: CapacityType) -> Offering | None:
        return self._fleet.offering(instance_type, zone, ct)

    def _price(self, instance_type: str, zone: str, ct: CapacityType) -> float:
        return self._fleet.price(instance_type, zone, ct)

    def _template(self, c: NodeClaim) -> tuple[dict[str, str], tuple[Taint, ...]]:
        pool = self.pools.get(c.pool)
        it = self._types.get(c.instance_type)
        if pool is None or it is None:
            return {L.POOL: c.pool, L.INSTANCE_TYPE: c.instance_type, L.ZONE: c.zone}, ()
        off = self._offering(c.instance_type, c.zone, c.capacity_type) or Offering(
            c.zone, c.capacity_type, c.hourly_price
        )
        return template_labels(pool, it, off), pool.taints

    def _execute_plan(self, plan: ScaleUpPlan, w: _World, result: ReconcileResult) -> bool:
        """Launch the plan's nodes; True if a capacity or quota error calls for a re-plan."""
        per_node: dict[str, list[str]] = {}
        for pod, target in plan.placements.items():
            per_node.setdefault(target, []).append(pod)
        replan = False
        for launch in plan.launches:
            for i in range(launch.count):
                pods = tuple(sorted(per_node.get(f"{launch.id}/{i}", ())))
                seed = ("up", launch.pool, launch.instance_type, launch.zone, str(launch.capacity_type), *pods)
                if not pods:
                    seed = (*seed, str(i))
                outcome = self._launch_new(
                    seed,
                    launch.pool,
                    launch.instance_type,
                    launch.zone,
                    launch.capacity_type,
                    w,
                    pods=pods,
                    reason="ScaleUp",
                )
                if outcome is Outcome.OK:
                    result.launched += 1
                if outcome in (Outcome.CAPACITY, Outcome.QUOTA):
                    replan = True
                    break
                if outcome in (Outcome.FAILED, Outcome.GUARD):
                    break
        return replan

    # ------------------------------------------------------------------------------------------------ launching
    def _pool_usage(self, pool: str, w: _World) -> tuple[int, Resources]:
        """Nodes of ``pool`` (claimed or not, launching or not) and their raw capacity."""
        count = cpu = mem = gpus = 0
        for c in self.claims.values():
            if c.pool != pool or c.phase is ClaimPhase.GONE:
                continue
            if c.phase is ClaimPhase.FAILED and not c.node_id:
                continue
            count += 1
            it = self._types.get(c.instance_type)
            if it is not None:
                cpu, mem, gpus = cpu + it.capacity.cpu_milli, mem + it.capacity.memory_mib, gpus + it.capacity.gpus
        used = Resources(cpu, mem, gpus, 0)
        for n in w.nodes.values():
            if n.pool == pool and not self.claims.names_node(n.name) and REQUEST_ID_LABEL not in n.labels:
                count += 1
                used = used + replace(n.allocatable, pods=0)
        return count, used

    def _within_limits(self, pool: NodePool, it: InstanceType, w: _World) -> str | None:
        if pool.max_nodes is None and not pool.limits.bounded:
            return None  # nothing to count against
        count, used = self._pool_usage(pool.name, w)
        if pool.max_nodes is not None and count + 1 > pool.max_nodes:
            return f"pool {pool.name} has {count} of maxNodes={pool.max_nodes} nodes"
        if not pool.limits.allows(used + replace(it.capacity, pods=0)):
            return f"a {it.name} would exceed the limits of pool {pool.name}"
        return None

    def _launch_new(
        self,
        seed: Sequence[str],
        pool_name: str,
        instance_type: str,
        zone: str,
        ct: CapacityType,
        w: _World,
        *,
        pods: tuple[str, ...] = (),
        replaces: str = "",
        reason: str,
    ) -> Outcome:
        now = w.now
        pool = self.pools.get(pool_name)
        it = self._types.get(instance_type)
        if pool is None or it is None:
            self._record(now, EventKind.LAUNCH_FAILED, f"pool/{pool_name}", "Unknown", f"no {instance_type} here")
            return Outcome.FAILED
        why = self._within_limits(pool, it, w)
        if why is not None:
            self._report(
                f"pool/{pool_name}", "PoolLimit", EventKind.BLOCKED, now, f"launch of {it.name} skipped: {why}"
            )
            return Outcome.GUARD
        for _ in range(3):
            rid = self.launcher.request_id(seed, self.claims)
            outcome = self._launch_with_id(rid, pool, it, zone, ct, w, pods, replaces, reason)
            if outcome is not Outcome.BURNT:
                return outcome
        return Outcome.FAILED

    def _launch_with_id(
        self,
        rid: str,
        pool: NodePool,
        it: InstanceType,
        zone: str,
        ct: CapacityType,
        w: _World,
        pods: tuple[str, ...],
        replaces: str,
        reason: str,
    ) -> Outcome:
        now = w.now
        pool_name, instance_type = pool.name, it.name
        claim = new_claim(
            rid,
            pool_name,
            instance_type,
            zone,
            ct,
            now,
            expected=template_allocatable(pool, it),
            hourly_price=self._price(instance_type, zone, ct),
            pods=pods,
            replaces=replaces,
            reason=reason,
            deadlines=self.config.deadlines_for(pool_name),
        )
        self.claims[rid] = claim
        if self.availability.backed_off(pool_name, now):
            self.launcher.hold(rid, self.availability.backoffs[pool_name].until)
            return Outcome.RETRY
        return self._call_launch(rid, w)

    def _launch_request(self, c: NodeClaim) -> LaunchRequest:
        labels, taints = self._template(c)
        labels[REQUEST_ID_LABEL] = c.request_id
        pool = self.pools.get(c.pool)
        if c.capacity_type is CapacityType.ON_DEMAND and pool is not None and self._spot_fallback(pool, c.created_at):
            labels[SPOT_FALLBACK_LABEL] = "true"
        return LaunchRequest(
            request_id=c.request_id,
            pool=c.pool,
            instance_type=c.instance_type,
            zone=c.zone,
            capacity_type=c.capacity_type,
            count=1,
            labels=labels,
            taints=taints,
            pods=() if c.replaces else c.pods,
        )

    def _call_launch(self, key: str, w: _World) -> Outcome:
        """Ask the provider for the node of claim ``key`` (phase Requested) once; the launcher carries out the
        outcome (errors are data: see :func:`gpuscale.core.reconcile.judge_launch_error`)."""
        c = self.claims[key]
        return self.launcher.launch(key, self._launch_request(c), self.claims, self.pools.get(c.pool), w.now)

    def _ensure_min_nodes(self, w: _World, result: ReconcileResult) -> None:
        now = w.now
        for pool in self.pools.values():
            if pool.min_nodes <= 0 or self.availability.backed_off(pool.name, now):
                continue
            have = self._alive_in_pool(pool.name, w)
            for k in range(have, pool.min_nodes):
                eff = next(p for p in self._effective_pools([], now) if p.name == pool.name)
                offers = pool_offerings(eff, self.catalog, now, self.availability.offerings)
                if not offers:
                    self._report(f"pool/{pool.name}", "MinNodes", EventKind.BLOCKED, now, "no offering for minNodes")
                    break
                po = offers[0]
                seed = (
                    "min",
                    pool.name,
                    po.instance_type.name,
                    po.offering.zone,
                    str(po.offering.capacity_type),
                    str(k),
                )
                outcome = self._launch_new(
                    seed,
                    pool.name,
                    po.instance_type.name,
                    po.offering.zone,
                    po.offering.capacity_type,
                    w,
                    reason="MinNodes",
                )
                if outcome is Outcome.OK:
                    result.launched += 1
                elif outcome is not Outcome.RETRY:
                    break

    def _alive_in_pool(self, pool: str, w: _World) -> int:
        n = sum(1 for c in self.claims.values() if c.pool == pool and c.alive)
        n += sum(
            1
            for node in w.nodes.values()
            if node.pool == pool and not self.claims.names_node(node.name) and REQUEST_ID_LABEL not in node.labels
        )
        return n

    # ------------------------------------------------------------------------------------------------ scale down
    def _consolidate(self, w: _World, result: ReconcileResult) -> None:
        now = w.now
        if not self.config.consolidation:
            return
        gate = self.gate
        candidates: set[str] = set()
        disrupting: set[str] = set(self._replacements)
        replacing = self._replacements
        for c in self.claims.values():
            name = c.node_name
            # neither a node being replaced nor one of its (already ready) replacements is a candidate
            if name and c.phase is ClaimPhase.INITIALIZED and name not in replacing and c.replaces not in replacing:
                candidates.add(name)
        disrupting.update(c.node_name for _, c in self.claims.in_phases(_LEAVING) if c.node_name)
        by_node = w.by_node()
        unavailable_now = frozenset(k for k, t in self.availability.offerings.items() if t > now)
        last_pass = gate.last_pass_at
        due = gate.select(
            candidates,
            disrupting,
            w.nodes,
            by_node,
            w.pods,
            bool(w.pdbs),
            w.utilization,
            unavailable_now,
            now,
            self._pool_of_node,
        )
        reference = None
        if gate.check and now - last_pass >= self.config.disruption_interval_s:
            ref_due = gate.reference_due(candidates, w.nodes, by_node, w.utilization, now, self._pool_of_node)
            if ref_due:
                ref = self._disruption_pass(self._disruption_inputs(w), set(ref_due), disrupting, dict(gate.since), w)
                reference = {(a.node, str(a.kind), str(a.reason)) for a in ref.actions}
        dp = None
        protected: frozenset[str] = frozenset()
        if gate.open_pass(due, now):
            candidates = set(due)  # nodes still waiting out consolidateAfter cannot be acted on this round
            inputs = self._disruption_inputs(w)
            protected = inputs.protected
            signature = (
                frozenset((n.name, n.unschedulable, n.allocatable, n.launching) for n in inputs.nodes),
                frozenset((p.key, p.node_name) for p in inputs.pods if p.node_name is not None),
                frozenset(candidates),
                frozenset(disrupting),
                protected,
                frozenset(inputs.unavailable),
                frozenset((k, round(v, 1)) for k, v in w.utilization.items()) if self._measured else None,
            )
            if gate.inputs_changed(signature, now, self._pool_of_node):
                dp = self._disruption_pass(inputs, candidates, disrupting, gate.since, w)
        if gate.check and (reference is not None or dp is not None):
            cached = {(a.node, str(a.kind), str(a.reason)) for a in dp.actions} if dp is not None else set()
            gate.compare(now, cached, reference or set())
        if dp is None:
            return
        gate.since.update(dp.since)
        for kept in dp.kept:
            if kept.reason is not KeepReason.WAITING and kept.node not in protected:
                gate.rest(kept.node, frozenset(p.key for p in by_node.get(kept.node, ())), now)
            if kept.reason is not KeepReason.WAITING:
                self._report(f"node/{kept.node}", str(kept.reason), EventKind.DISRUPTION_BLOCKED, now, kept.message)
        for action in dp.actions:
            found = self._claim_by_node_name(action.node)
            if found is None:
                continue
            key, c = found
            data = {
                "action": str(action.kind),
                "pool": action.pool,
                "savingsPerHour": round(action.savings_per_hour, 6),
            }
            if action.kind is ActionKind.DELETE:
                self._start_drain(key, c, w, str(action.reason), involuntary=False)
                result.disrupted += 1
                self._record(
                    now, EventKind.CONSOLIDATE, f"node/{action.node}", str(action.reason), action.message, **data
                )
                continue
            outcomes = []
            before = {k for k, cl in self.claims.items() if cl.replaces == action.node}
            for i, r in enumerate(action.replacements):
                seed = ("replace", action.node, r.pool, r.instance_type, r.zone, str(r.capacity_type))
                outcome = self._launch_new(
                    (*seed, str(i)) if i else seed,
                    r.pool,
                    r.instance_type,
                    r.zone,
                    r.capacity_type,
                    w,
                    pods=r.pods,
                    replaces=action.node,
                    reason=f"Replace{action.reason}",
                )
                outcomes.append(outcome)
                if outcome not in (Outcome.OK, Outcome.RETRY):
                    break
            rids = tuple(
                k for k, cl in self.claims.items() if cl.replaces == action.node and k not in before and cl.alive
            )
            result.launched += sum(1 for o in outcomes if o is Outcome.OK)
            if all(o in (Outcome.OK, Outcome.RETRY) for o in outcomes):
                self._replacements[action.node] = (rids, action)
                result.disrupted += 1
                self._record(
                    now, EventKind.CONSOLIDATE, f"node/{action.node}", str(action.reason), action.message, **data
                )
            elif rids:  # a split replacement only partly launched: the old node stays; the new ones are spare
                self._record(
                    now,
                    EventKind.REPLACE_ABORTED,
                    f"node/{action.node}",
                    "ReplacementFailed",
                    f"only {len(rids)} of {len(action.replacements)} replacement nodes launched; node kept",
                )

    def _disruption_inputs(self, w: _World) -> _DisruptionInputs:
        """Pods (pending ones already planned onto existing nodes hold their room there and protect those nodes),
        nodes (with nodes in flight), and the unavailable offerings, as a pass sees them."""
        pods = list(w.pods)
        protected: frozenset[str] = frozenset()
        planned = {k: v for k, v in self._planned_on_node.items() if v in w.nodes}
        for c in self.claims.values():
            if c.node_name in w.nodes and c.phase in (ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED):
                planned.update((k, c.node_name) for k in c.pods if k not in planned)
        if planned:
            protected = frozenset(planned.values())
            pods = [replace(p, node_name=planned[p.key]) if p.pending and p.key in planned else p for p in pods]
        nodes = list(w.nodes.values())
        for key, c in self.claims.items():
            if c.phase in (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED) and c.node_name not in w.nodes:
                nodes.append(self._launching_node(key, c))
        return _DisruptionInputs(pods, nodes, protected, self.availability.unavailable_at(w.now))

    def _disruption_pass(
        self,
        inputs: _DisruptionInputs,
        candidates: set[str],
        disrupting: set[str],
        since: Mapping[str, float],
        w: _World,
    ) -> DisruptionPlan:
        return plan_disruption(
            inputs.nodes,
            inputs.pods,
            list(self.pools.values()),
            self.catalog,
            w.now,
            since=since,
            candidates=candidates,
            disrupting=disrupting,
            protected=set(inputs.protected),
            pdbs=w.pdbs,
            utilization=w.utilization,
            unavailable=inputs.unavailable,
            allow_replace=self.config.replace_nodes,
        )

    def _drain_and_delete(self, w: _World, result: ReconcileResult) -> None:
        now = w.now
        allow: dict[str, int] | None = None
        for key, c in self.claims.in_phases(_LEAVING):
            if c.phase is ClaimPhase.DRAINING:
                if allow is None:
                    allow = pdb_allowances(w.pdbs, w.pods)
                node = find_node(c, w.nodes)
                left = [p for p in w.by_node().get(node.name, ()) if not p.is_daemonset] if node is not None else []
                if not left:
                    self.claims[key] = transition(c, ClaimEvent.DRAINED, now, reason="no pods left")
                    self._delete(key, w, result)
                    continue
                voluntary = key not in self._involuntary
                for p in left:
                    if voluntary and do_not_disrupt(p):
                        self._report(
                            f"pod/{p.key}", "DoNotDisrupt", EventKind.EVICT_BLOCKED, now, "annotated do-not-disrupt"
                        )
                        continue
                    pdbs = [b for b in w.pdbs if b.matches(p)]
                    keys = [f"{b.namespace}/{b.name}" for b in pdbs]
                    if any(allow.get(k, 0) < 1 for k in keys):
                        self._report(
                            f"pod/{p.key}", "PodDisruptionBudget", EventKind.EVICT_BLOCKED, now, "PDB allows none now"
                        )
                        continue
                    if self.backend.evict(p.key):
                        for k in keys:
                            allow[k] -= 1
                        result.evicted += 1
                        self._record(
                            now, EventKind.EVICT, f"pod/{p.key}", c.reason, f"evicted from {node and node.name}"
                        )
            elif c.phase is ClaimPhase.FAILED:
                if c.node_id:
                    self.claims[key] = transition(c, ClaimEvent.DELETE, now, reason=c.reason)
                    self._delete(key, w, result)
                else:
                    self._finish(key, transition(c, ClaimEvent.LOST, now, reason="no node was created"))
            elif c.phase is ClaimPhase.DELETING and self._delete_retry_at.get(key, -math.inf) <= now:
                self._delete(key, w, result)

    def _delete(self, key: str, w: _World, result: ReconcileResult) -> None:
        """Delete the claim's node at the provider, then its Node object (both idempotent)."""
        now = w.now
        c = self.claims[key]
        cloud = next((cn for cn in w.cloud if cn.node_id == c.node_id), None)
        recheck = self.config.max_backoff_s  # the provider is deleting it: only a stuck deletion needs another look
        if c.node_id and (cloud is None or cloud.state is not CloudNodeState.DELETING):
            recheck = self.config.delete_recheck_s
            try:
                self.provider.delete_node(c.node_id)
            except NotFound:
                pass
            except ProviderError as exc:
                n = self.launcher.attempts.get(key, 0) + 1
                self.launcher.attempts[key] = n
                delay = retry_delay(exc, n, self.launcher.rules)
                self._delete_retry_at[key] = now + delay
                self._record(now, EventKind.DELETE, f"node/{c.node_name or key}", "DeleteRetry", str(exc))
                return
            result.deleted += 1
            self._record(
                now,
                EventKind.DELETE,
                f"node/{c.node_name or key}",
                c.reason or "Delete",
                f"deleting {c.instance_type} {c.capacity_type} in {c.zone}",
                request_id=key,
            )
        self._delete_retry_at[key] = now + recheck
        node = find_node(c, w.nodes)
        if node is not None:
            self.backend.delete_node(node.name)
            del w.nodes[node.name]

    def _collect_orphans(self, w: _World) -> None:
        """Delete Node objects labelled with a request id the provider no longer lists (after a grace period)."""
        now = w.now
        rids: set[str] | None = None
        current: set[str] = set()
        for n in list(w.nodes.values()):
            rid = n.labels.get(REQUEST_ID_LABEL)
            if rid is None or rid in self.claims:
                continue
            if rids is None:
                rids = {cn.request_id for cn in w.cloud}
            if self.claims.names_node(n.name) or rid in rids:
                continue
            current.add(n.name)
            first = self._orphan_since.setdefault(n.name, now)
            if now - first >= self.config.orphan_grace_s:
                self.backend.delete_node(n.name)
                del w.nodes[n.name]
                self._record(now, EventKind.ORPHAN, f"node/{n.name}", "Orphan", f"request {rid} has no cloud node")
        self._orphan_since = {k: v for k, v in self._orphan_since.items() if k in current}

    # --------------------------------------------------------------------------------------------- records
    def _pool_of_node(self, name: str) -> NodePool | None:
        found = self._claim_by_node_name(name)
        return self.pools.get(found[1].pool) if found is not None else None

    def _record(self, now: float, kind: EventKind, obj: str, reason: str, message: str, **data: object) -> None:
        self.backend.record(Event(now, str(kind), obj, reason, message, data))

    def _note(self, note: Note) -> None:
        """Record a note of the current round."""
        self.backend.record(Event(self._now, str(note.kind), note.object, note.reason, note.message, note.data))

    def _report(self, obj: str, reason: str, kind: EventKind, now: float, message: str) -> None:
        """Record an event only when ``obj``'s reason changes (no repeats every round)."""
        if self._reported.get(obj) == reason:
            return
        self._reported[obj] = reason
        self._record(now, kind, obj, reason, message)

    def _prune_reports(self, pending: set[str]) -> None:
        """Forget reasons reported for pods that are no longer pending (so a new blockage is reported again)."""
        gone = [k for k in self._reported if k.startswith("pod/") and k[len("pod/") :] not in pending]
        for k in gone:
            del self._reported[k]


def make_controller(
    *,
    backend: ClusterBackend,
    provider: Provider,
    pools: Sequence[NodePool],
    catalog: Catalog,
    clock: Clock,
    config: ControllerConfig | Mapping[str, Any] | None = None,
    planner: PlanFn | None = None,
    availability: Availability | None = None,
) -> Controller:
    """A :class:`Controller`; ``config`` may be a :class:`ControllerConfig` or a scenario ``policy`` mapping.

    This is the ``controller_factory`` of :func:`gpuscale.sim.runner.run_simulation`.
    """
    cfg = config if isinstance(config, ControllerConfig) else ControllerConfig.from_policy(config)
    return Controller(backend, provider, pools, catalog, clock, cfg, planner=planner, availability=availability)
