"""The controller: the imperative shell of the node reconcile, shared by every backend (simulated cluster,
Kubernetes). Observe -> decide (pure functions in :mod:`gpuscale.core`) -> act.

One :meth:`Controller.reconcile` call:

1. **observe** pods, nodes, PDBs and GPU utilisation from the :class:`~gpuscale.controller.backend.ClusterBackend`,
   the provider's node list and its asynchronous events (spot notices, launch failures);
2. **claims**: :func:`gpuscale.core.reconcile.sync_claims`, :func:`~gpuscale.core.reconcile.on_provider_events`,
   :func:`~gpuscale.core.reconcile.expire_deadlines` and :func:`~gpuscale.core.reconcile.progress_replacements`
   decide claim transitions (adoption after a restart, advancement as the Node appears and advertises its GPUs,
   loss, deadlines), offerings to avoid, nodes to cordon and drain; the shell carries each action record out in
   order (:meth:`~gpuscale.controller.shell.ShellBase._apply`);
3. **scale up** (:mod:`gpuscale.controller.scaleup`): due launch retries, batching, the pure planner over a snapshot
   in which every node in flight is a ``launching`` node, launches through the
   :class:`~gpuscale.controller.launcher.Launcher` (launch errors are data, judged by
   :func:`~gpuscale.core.reconcile.judge_launch_error` from their retry policy; a capacity or quota error re-plans
   at once), ``minNodes``;
4. **scale down** (:mod:`gpuscale.controller.scaledown`): consolidation through the
   :class:`~gpuscale.controller.consolidation.ConsolidationGate` and the pure
   :func:`gpuscale.core.disruption.plan_disruption`, draining (never past a PDB; never a do-not-disrupt pod in a
   voluntary drain), deletion, orphaned Node objects.

Every decision is recorded as an :class:`~gpuscale.controller.backend.Event`. State lives in small objects: the claim
table (:class:`~gpuscale.controller.claims.ClaimTable`), the offering availability and back-offs
(:class:`~gpuscale.controller.availability.Availability`, kept across restarts by its store), the launcher's retry
times and burnt ids, the consolidation gate, the deletion timers (:class:`~gpuscale.controller.deletions.Deletions`)
and the GPR nodes handed to this engine (:class:`~gpuscale.controller.gprnodes.GprNodes`).

Crash safety: the controller keeps nothing that cannot be rebuilt (or, for availability, that its store does not
keep). A new controller adopts every provider node as a claim (a cordoned node is resumed as Draining, a provider
node in ``deleting`` as Deleting), and request ids are derived deterministically from what is launched and for which
pods, so a restart between "asked" and "recorded" replays the same id and the provider's idempotency returns the
node it already made. Deletes are idempotent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuscale.clock import Clock
from gpuscale.controller.availability import Availability
from gpuscale.controller.backend import ClusterBackend
from gpuscale.controller.batching import PendingBatch
from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.controller.deletions import Deletions
from gpuscale.controller.gprnodes import GprNodes, GprSteps
from gpuscale.controller.launcher import Launcher
from gpuscale.controller.rounds import Observation, Replacements, Reports, ScaleUpState
from gpuscale.controller.scaledown import ScaleDownSteps
from gpuscale.controller.scaleup import PlanFn, ScaleUpSteps
from gpuscale.controller.shell import ReconcileResult, World
from gpuscale.core import labels as L
from gpuscale.core.gpr import is_gpr_request_id
from gpuscale.core.model import Catalog, Node, NodePool, OfferingKey
from gpuscale.core.nodeclaim import TIMED_PHASES, ClaimPhase, deadline
from gpuscale.core.plan import ScaleUpPlan
from gpuscale.core.reconcile import (
    Decisions,
    EventKind,
    Uncordon,
    expire_deadlines,
    on_provider_events,
    progress_replacements,
    retry_uncordons,
    sync_claims,
)
from gpuscale.errors import ProviderError
from gpuscale.providers.base import CloudNodeState, Provider

__all__ = ["Controller", "ControllerConfig", "EventKind", "PlanFn", "ReconcileResult", "make_controller"]


def _default_planner() -> PlanFn:
    from gpuscale.core.planner import plan

    return plan


_LIVE_PHASES = frozenset({"Pending", "Running", ""})
# Enum members as module constants: a class attribute of an Enum costs ~4 times a global lookup in Python 3.11
# (EnumType defines __getattr__, so every member lookup goes through a slow path); read in per-round loops.
_GONE = CloudNodeState.GONE
_LAUNCHED = ClaimPhase.LAUNCHED
_REQUESTED = ClaimPhase.REQUESTED
_INF = math.inf
"""(read per wake-up candidate as a global instead of a module attribute)"""


class Controller(ScaleUpSteps, ScaleDownSteps, GprSteps):
    """The gpuscale controller. Call :meth:`reconcile` periodically (every second or so, or at :meth:`next_wakeup`).

    ``pools`` and ``catalog`` describe what may be launched; ``planner`` defaults to
    :func:`gpuscale.core.planner.plan`. All state is rebuilt from ``backend`` and ``provider`` on the first
    reconcile, so constructing a new controller is how a crashed one restarts; ``availability`` (offering marks and
    back-offs) may be given with a persistent store, and may be shared with the GPR manager. Provider nodes whose
    request id ``foreign`` owns (by default the GPR manager's) are left to their owner. ``check_gate`` runs the
    consolidation gate's uncached reference beside every round, ``check_plan`` plans beside every skipped plan
    (:class:`~gpuscale.controller.rounds.ScaleUpState`; tests).
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
        check_plan: bool = False,
        foreign: Callable[[str], bool] | None = is_gpr_request_id,
    ) -> None:
        self.backend = backend
        self.provider = provider
        self.pools: dict[str, NodePool] = {p.name: p for p in pools}
        self.catalog = catalog
        self.clock = clock
        self.config = config or ControllerConfig()
        self.claims = ClaimTable()
        """Live node claims by request id (indexed by phase)."""
        self.availability = availability if availability is not None else Availability()
        """Offerings not to be bought, pool back-offs and spot fallbacks, each until a time (kept by its store across
        restarts; shared with the launcher and possibly the GPR manager)."""
        self.availability.expire(clock.now())
        self.observed = Observation(foreign)
        """The round's time, the last node and cloud lists, the claim sync's shortcut, the wake-up times."""
        self.observed.now = clock.now()
        self.launcher = Launcher(
            provider, self.availability, self.config.launch_rules(), self._note, prefix=self.config.request_id_prefix
        )
        """Request ids, launches and their retries at due times."""
        self.scaleup = ScaleUpState(
            planner or _default_planner(),
            PendingBatch(self.config.batch_idle_s, self.config.batch_max_s),
            check=check_plan,
        )
        """The planner, the batch window of pending pods and the planning memo."""
        self.replacements = Replacements()
        """Nodes being replaced, claims drained involuntarily."""
        self.reports = Reports()
        """The last reason reported per object."""
        self.gpr = GprNodes()
        """Which claims are GPR nodes and which of them were released (see :mod:`gpuscale.controller.gprnodes`)."""
        self.gate = ConsolidationGate(self.pools, self.config, check=check_gate)
        """The consolidation step's clocks, caches and skips."""
        self.deletions = Deletions(self.config.orphan_grace_s)
        """Delete retry times and orphan clocks."""

    # ------------------------------------------------------------------------------------------------ public
    @property
    def batch(self) -> PendingBatch:
        """The batch window of pending pods."""
        return self.scaleup.batch

    @property
    def _synced(self) -> tuple[object, int] | None:
        return self.observed.synced

    @property
    def unavailable(self) -> Mapping[OfferingKey, float]:
        """Offerings not to be bought until the given time (read-only; see :attr:`availability`)."""
        return self.availability.offerings

    def reconcile(self) -> ReconcileResult:
        """One observe -> decide -> act round."""
        result, world = self._begin_round()
        if world is None:
            return result
        if world.events:  # (each step below that is guarded does nothing without what its guard asks for)
            self._handle_provider_events(world)
        self._check_deadlines(world)
        if self.replacements.uncordon_due or self.replacements.by_old:
            self._progress_replacements(world)
        self._retry_requested(world, result)
        self._scale_up(world, result)
        self._ensure_min_nodes(world, result)
        if self.gpr.released:
            self._release_gpr_nodes(world)
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

    def _begin_round(self) -> tuple[ReconcileResult, World | None]:
        """Start a round: forget the cached wake-up times, observe, and sync the claims with what was observed.
        The world is None (and the result says so) when observing failed."""
        self.observed.wake_times = None
        now = self.clock.now()
        self.observed.now = now
        result = ReconcileResult(at=now)
        world = self._observe(now)
        if world is None:
            result.observe_failed = True
            return result, None
        if self.gpr.enabled:  # (GprNodes.observe does nothing otherwise)
            self.gpr.observe(world.nodes, now)
        self._sync_claims(world)
        return result, world

    def next_wakeup(self) -> float | None:
        """The next future time at which a reconcile has timed work to do, or None.

        Batch windows closing, claim deadlines, launch/delete retries, orphan grace periods, consolidateAfter
        expiring, a skipped disruption pass, and (while pods are pending) offering/back-off/fallback expiries.
        Anything else only changes when the cluster or cloud changes, which a driver observes by itself.
        The candidate times are kept until the next reconcile (nothing else changes them), and so is the answer
        while it is still in the future (it is the earliest candidate after any earlier time).
        """
        now = self.clock.now()
        obs = self.observed
        times = obs.wake_times
        if times is None:
            times = obs.wake_times = self._timer_candidates()
        elif obs.wake_next is None or obs.wake_next > now:
            return obs.wake_next
        nxt = _INF  # the earliest finite candidate after now (one pass, no list of them)
        for t in times:
            if now < t < nxt:
                nxt = t
        obs.wake_next = wake = nxt if nxt < _INF else None
        return wake

    def _deadlines_kept(self) -> tuple[int, object, list[float], list[float]]:
        """(the claim table's version, its claims in a timed phase, their deadlines
        (:func:`~gpuscale.core.nodeclaim.deadline`) in table order, each just after its deadline: the wake-up
        times), made again when the table answers another tuple for those phases (a claim of
        theirs changed); not asked again while the table's version is the same."""
        claims = self.claims
        kept = self.observed.deadlines
        if kept is not None and kept[0] == claims.version:
            return kept
        timed = claims.in_phases(TIMED_PHASES)
        if kept is not None and kept[1] is timed:
            kept = self.observed.deadlines = (claims.version, timed, kept[2], kept[3])
            return kept
        found = [t for _, c in timed if (t := deadline(c)) is not None]
        kept = self.observed.deadlines = (claims.version, timed, found, [t + 1e-6 for t in found])
        return kept

    def _timer_candidates(self) -> list[float]:
        times = self.scaleup.wake_times(self.availability)
        times += self._deadlines_kept()[3]
        for key in self.observed.unlisted:
            unlisted = self.claims.get(key)
            if unlisted is not None and unlisted.phase is _LAUNCHED:
                times.append(unlisted.since + self.config.lost_grace_s)
        times += self.launcher.wake_times()
        times += self.deletions.wake_times()
        if self.replacements.uncordon_due:  # (Replacements.wake_times: its uncordon times, none most rounds)
            times += self.replacements.wake_times()
        times += self.gate.wake_times(self._node_pools())  # (reads the claims, changes none)
        if self.gpr.enabled:  # (no GPR news otherwise)
            times += self._gpr_wake_times()
        return times

    # --------------------------------------------------------------------------------------------- observing
    def _observe(self, now: float) -> World | None:
        try:
            obs = self.observed
            pods, by_node, unbound = obs.live_pods(self.backend.list_pods(), _LIVE_PHASES)
            listed = self.backend.list_nodes()
            if obs.same_nodes(listed):
                nodes = dict(obs.nodes)  # a copy: the controller deletes from it during the round
            else:  # (patched where the list replaced a few nodes, else all normalised)
                nodes = obs.patched_nodes(listed, self._normalise) or {
                    n.name: n if n.pool is not None else self._normalise(n) for n in listed
                }
                obs.keep_nodes(listed, nodes)
            provided = self.provider.list_nodes()
            if provided is not obs.cloud_list:
                obs.keep_cloud(provided, [c for c in provided if c.state is not _GONE])
            cloud = obs.cloud
            events = list(self.provider.poll_errors())
            if self.gpr.enabled:  # the GPR manager's view: the engine is the one reader (kept only while enabled)
                self.gpr.provider_observed(provided, events)
            pdbs = list(self.backend.list_pdbs())
            utilization = dict(self.backend.gpu_utilization()) if self.gate.measured else {}
        except ProviderError as exc:
            if self.gpr.enabled:
                self.gpr.feed.failed(exc)
            self._record(now, EventKind.OBSERVE_FAILED, "provider/" + self.provider.name, type(exc).__name__, str(exc))
            return None
        # (the grouping is kept with the pod list: the same pods as last round, the same lists)
        return World(now, pods, nodes, cloud, events, pdbs, utilization, by_node, unbound)

    @staticmethod
    def _normalise(node: Node) -> Node:
        if node.pool is None and L.POOL in node.labels:
            return replace(node, pool=node.labels[L.POOL])
        return node

    # --------------------------------------------------------------------------------------------- claims
    def _sync_claims(self, w: World) -> None:
        obs = self.observed
        if not obs.sync_needed(self.claims.version):
            return  # the same provider list and claims as after the last sync that learnt nothing: nothing to learn
        # the listed nodes found settled before, unchanged and with unchanged claims, are left out (SettledNodes)
        settled = obs.settled_nodes
        pos, todo, known = settled.todo(self.claims, w.cloud)
        d = sync_claims(
            self.claims,
            todo,
            w.nodes,
            self._fleet,
            self._rules,
            w.now,
            requested=self.claims.count(_REQUESTED),
            foreign=None if obs.foreign is None or self.gpr.enabled else obs.foreign,
            known=known,
        )
        self._apply(d, w)
        settled.found(pos, w.cloud, d.matched)
        # settled: every listed node matched its settled claim, which depends on neither the time nor the cluster;
        # fixpoint: the claims as now changed are what a sync of this listing and these Nodes gives, at any time
        obs.synced_with(d.unlisted, d.settled, self.claims.version, fixpoint=d.fixpoint)

    # --------------------------------------------------------------------------------------- provider events
    def _handle_provider_events(self, w: World) -> None:
        if w.events:
            self._apply(on_provider_events(self.claims, w.events, w.nodes, self._rules, w.now), w)

    # ------------------------------------------------------------------------------------------- deadlines
    def _check_deadlines(self, w: World) -> None:
        deadlines = self._deadlines_kept()[2]  # the timed claims' deadlines
        if deadlines and w.now > min(deadlines):  # else no claim is past its deadline: nothing expires
            self._apply(expire_deadlines(self.claims.in_phases(TIMED_PHASES), self._rules, w.now), w)

    # -------------------------------------------------------------------------------------------- replacing
    def _progress_replacements(self, w: World) -> None:
        """Drain a replaced node once all its replacements are initialised; keep it if one of them fails (and
        uncordon it if gpuscale cordoned it for the replacement, again at its due time until it is seen schedulable)."""
        r = self.replacements
        if r.uncordon_due:
            again, settled = retry_uncordons(r.uncordon_due, w.nodes, self.claims.by_node_name, w.now)
            for name in settled:
                r.uncordon_settled(name)
            self._apply(Decisions(actions=[Uncordon(name) for name in again]), w)
        if not r.by_old:
            return
        by_name = self.claims.by_node_name
        self._apply(progress_replacements(r.progress(), self.claims, by_name, w.nodes, w.now, r.cordoned), w)


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
