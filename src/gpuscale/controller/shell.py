"""What every step of the controller's round shares: the observation of one round, the claim table's updates,
the launching of nodes (through the :class:`~gpuscale.controller.launcher.Launcher`) and the event records.

:class:`ShellBase` is the part of :class:`~gpuscale.controller.loop.Controller` the scale-up
(:mod:`gpuscale.controller.scaleup`) and scale-down (:mod:`gpuscale.controller.scaledown`) steps build on; it
carries decisions out and decides nothing itself (the decisions are in :mod:`gpuscale.core`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpuscale.clock import Clock
from gpuscale.controller.availability import Availability
from gpuscale.controller.backend import ClusterBackend, Event
from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.controller.launcher import Launcher, apply_mark
from gpuscale.core import labels as L
from gpuscale.core.disruption import SPOT_FALLBACK_LABEL, PodDisruptionBudget
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    InstanceType,
    Node,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
    Taint,
)
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL, ClaimPhase, NodeClaim, new_claim
from gpuscale.core.reconcile import (
    Action,
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
    Rules,
    SetClaim,
    Uncordon,
    start_drain,
)
from gpuscale.core.reconcile.scaleup import pool_limit_refusal
from gpuscale.core.resources import Resources
from gpuscale.core.templates import template_allocatable, template_labels
from gpuscale.providers.base import CloudNode, LaunchRequest, Provider, ProviderEvent

if TYPE_CHECKING:
    from gpuscale.controller.deletions import Deletions
    from gpuscale.controller.gprnodes import GprNodes
    from gpuscale.controller.rounds import Observation, Replacements, Reports, ScaleUpState


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
class World:
    """One round's observation."""

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
        """Bound pods grouped by node name (given by the observation, or computed once; ``pods`` is not changed
        afterwards)."""
        if self._by_node is None:
            self._group()
        assert self._by_node is not None
        return self._by_node

    def unbound(self) -> list[Pod]:
        """Pods without a node (given or computed with :meth:`by_node`)."""
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


@dataclass(frozen=True, slots=True)
class DisruptionInputs:
    """Pods, nodes, protected nodes and unavailable offerings as a consolidation pass sees them; ``by_node``: the
    pods bound to each node, in ``pods``' order (None: the pass groups ``pods`` itself)."""

    pods: list[Pod]
    nodes: list[Node]
    protected: frozenset[str]
    unavailable: dict[OfferingKey, float]
    by_node: Mapping[str, Sequence[Pod]] | None = None


class _NodePools(dict[str, "NodePool | None"]):
    """Node name -> the pool of the first claim (in table order) naming that node, None if none does; a name not
    yet asked is looked up on the first ask (``__missing__``)."""

    __slots__ = ("claims", "pools")

    def __init__(self, claims: ClaimTable, pools: Mapping[str, NodePool]) -> None:
        super().__init__()
        self.claims = claims
        self.pools = pools

    def __missing__(self, name: str) -> NodePool | None:
        found = self.claims.by_node_name(name)
        pool = self[name] = self.pools.get(found[1].pool) if found is not None else None
        return pool


LEAVING = frozenset({ClaimPhase.DRAINING, ClaimPhase.DELETING, ClaimPhase.FAILED})
"""Claim phases whose node is on its way out (takes no pods, counts against disruption budgets)."""


class ShellBase:
    """State and helpers shared by the controller's steps (see the module docstring)."""

    backend: ClusterBackend
    provider: Provider
    pools: dict[str, NodePool]
    catalog: Catalog
    clock: Clock
    config: ControllerConfig
    claims: ClaimTable
    availability: Availability
    launcher: Launcher
    gate: ConsolidationGate
    gpr: GprNodes
    observed: Observation
    scaleup: ScaleUpState
    replacements: Replacements
    reports: Reports
    deletions: Deletions

    @property
    def _fleet(self) -> Fleet:
        """What may be launched: the pools and instance types by name (from the configuration; kept until the pools
        or the catalog are replaced by other objects)."""
        cached = self.__dict__.get("_fleet_cache")
        if cached is None or cached[0] is not self.pools or cached[1] is not self.catalog:
            cached = self.__dict__["_fleet_cache"] = (
                self.pools,
                self.catalog,
                Fleet(self.pools, self.catalog.by_name()),
            )
        return cached[2]

    @property
    def _types(self) -> Mapping[str, InstanceType]:
        return self._fleet.types

    @property
    def _rules(self) -> Rules:
        """The settings of the pure claim decisions (from the configuration; kept until it is replaced)."""
        cached = self.__dict__.get("_rules_cache")
        if cached is None or cached[0] is not self.config:
            cached = self.__dict__["_rules_cache"] = (self.config, self.config.rules())
        return cached[1]

    def _apply(self, d: Decisions, w: World) -> None:
        """Carry out a pure decision record, in order."""
        for a in d.actions:
            self._apply_action(a, w)
        if d.replan:
            self.scaleup.request_plan()

    def _cordon_replaced(self, node_name: str, w: World) -> None:
        """Cordon a listed, schedulable node whose replacement (``rightsize``, ``spotToSpot``) starts, so that no pod
        lands on it while the replacement (room for its own pods only) boots, and record it as cordoned by gpuscale
        (uncordoned if the replacement fails; a node already cordoned, by anyone, is left as it is)."""
        node = w.nodes.get(node_name)
        if node is None or node.unschedulable:
            return
        self.replacements.cordoned.add(node_name)
        self._apply_action(Cordon(node_name), w)

    def _apply_action(self, a: Action, w: World) -> None:
        """Carry out one action of a decision record."""
        now = w.now
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
        elif isinstance(a, Uncordon):
            self.backend.uncordon(a.node_name)
            self.replacements.uncordoned(a.node_name, now)
            node = w.nodes.get(a.node_name)
            if node is not None:
                w.nodes[a.node_name] = replace(node, unschedulable=False)
        elif isinstance(a, DrainStarted):
            if a.involuntary:
                self.replacements.involuntary.add(a.key)
            self.gate.forget(a.node_name)
        elif isinstance(a, ClearRetry):
            self.launcher.listed(a.key)
        elif isinstance(a, DropReplacement):
            self.replacements.drop(a.old_node)
        else:  # the drain actions are carried out by the scale-down step
            raise TypeError(f"not an action of this step: {a!r}")

    def _finish(self, key: str, claim: NodeClaim) -> None:
        """Drop a claim that reached Gone; its request id is never reused."""
        del self.claims[key]
        self.launcher.forget(key)
        self.replacements.finished(key)
        self.deletions.forget(key)
        if claim.node_name:
            self.gate.forget(claim.node_name)
            self.reports.forget(f"node/{claim.node_name}")

    def _claim_by_node_name(self, name: str) -> tuple[str, NodeClaim] | None:
        return self.claims.by_node_name(name)

    def _start_drain(self, key: str, c: NodeClaim, w: World, reason: str, *, involuntary: bool) -> None:
        d = Decisions()
        start_drain(key, c, reason, w.nodes, w.now, d, involuntary=involuntary)
        self._apply(d, w)

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

    _pool_memo: tuple[ClaimTable, Mapping[str, NodePool], set[str], _NodePools] | None = None

    def _node_pools(self) -> Callable[[str], NodePool | None]:
        """:meth:`_pool_of_node` as a plain lookup (a kept answer costs one C-level call), for a caller that asks many
        nodes while the claim table does not change (a change is seen only at the next call of this method).
        :class:`~gpuscale.controller.options.OptionsController` returns its own :meth:`_pool_of_node` instead."""
        return self._pools_kept().__getitem__

    def _pools_kept(self) -> _NodePools:
        """The kept node pools, without the answers for node names that a claim change may have changed since (the
        claim table's :meth:`~gpuscale.controller.claims.ClaimTable.watch_names`); all answers are dropped when the
        table or the pools are replaced."""
        memo = self._pool_memo
        if memo is None or memo[0] is not self.claims or memo[1] is not self.pools:
            watched = memo[2] if memo is not None and memo[0] is self.claims else self.claims.watch_names()
            watched.clear()
            memo = self._pool_memo = (self.claims, self.pools, watched, _NodePools(self.claims, self.pools))
        changed, known = memo[2], memo[3]
        if changed:
            for gone in changed:
                known.pop(gone, None)
            changed.clear()
        return known

    def _pool_of_node(self, name: str) -> NodePool | None:
        """The pool of the claim of node ``name`` (asked for every consolidation candidate several times a round),
        kept as :meth:`_pools_kept` says."""
        memo = self._pool_memo
        if memo is not None and not memo[2] and memo[0] is self.claims and memo[1] is self.pools:
            return memo[3][name]  # (most asks: no claim changed since, the same table and pools)
        return self._pools_kept()[name]

    def _record(self, now: float, kind: EventKind, obj: str, reason: str, message: str, **data: object) -> None:
        self.backend.record(Event(now, str(kind), obj, reason, message, data))

    def _note(self, note: Note) -> None:
        """Record a note of the current round."""
        self.backend.record(Event(self.observed.now, str(note.kind), note.object, note.reason, note.message, note.data))

    def _report(self, obj: str, reason: str, kind: EventKind, now: float, message: str) -> None:
        """Record an event only when ``obj``'s reason changes (no repeats every round)."""
        if self.reports.changed(obj, reason):
            self._record(now, kind, obj, reason, message)

    def _prune_reports(self, pending: Iterable[str]) -> None:
        """Forget reasons reported for pods that are no longer pending (so a new blockage is reported again)."""
        self.reports.prune_pods(pending)

    # ------------------------------------------------------------------------------------------------ launching
    def _spot_fallback(self, pool: NodePool, now: float) -> bool:
        return (
            pool.allow_spot_fallback
            and CapacityType.SPOT in pool.capacity_types
            and self.availability.fallback_active(pool.name, now)
        )

    def _pool_usage(self, pool: str, w: World) -> tuple[int, Resources]:
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

    def _within_limits(self, pool: NodePool, it: InstanceType, w: World) -> str | None:
        if pool.max_nodes is None and not pool.limits.bounded:
            return None  # nothing to count against
        count, used = self._pool_usage(pool.name, w)
        return pool_limit_refusal(pool, it, count, used)

    def _launch_new(
        self,
        seed: Sequence[str],
        pool_name: str,
        instance_type: str,
        zone: str,
        ct: CapacityType,
        w: World,
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
        w: World,
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

    def _call_launch(self, key: str, w: World) -> Outcome:
        """Ask the provider for the node of claim ``key`` (phase Requested) once; the launcher carries out the
        outcome (errors are data: see :func:`gpuscale.core.reconcile.judge_launch_error`)."""
        c = self.claims[key]
        return self.launcher.launch(key, self._launch_request(c), self.claims, self.pools.get(c.pool), w.now)
