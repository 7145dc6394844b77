"""The pure GPR planner: admission, preemption, provisioning progress and wait estimates as actions."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscale.core.durations import format_egs_duration
from gpuscale.core.gpr.lifecycle import (
    HOLDING_STATES,
    REQUEUEABLE,
    Gpr,
    GprState,
    NodePoolDetails,
    Trigger,
    gpr_id_of_request,
    gpr_node_labels,
    gpr_node_taints,
    transition,
)
from gpuscale.core.gpr.spec import RELEASE_POLICY_LABEL, GprSpec, format_timestamp
from gpuscale.core.gpr.validation import (
    allowed_models,
    candidate_offerings,
    candidate_types,
    memory_ok,
    offering_key,
    on_demand_price,
    validate_spec,
)
from gpuscale.core.labels import GPU_PRODUCT, POOL
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    InstanceType,
    Offering,
    OfferingKey,
    Taint,
)


@dataclass(frozen=True, slots=True)
class GprConfig:
    """Planner settings. ``max_delayed_count`` 0 means never give up; ``max_nodes`` None means unlimited."""

    enable_dynamic_node: bool = True
    max_delayed_count: int = 20
    delay_interval_s: float = 60.0
    max_retry_count: int = 3
    provisioning_timeout_s: float = 1800.0
    scale_up_latency_s: float = 300.0
    """Expected time from launch to ready nodes, for wait-time estimates."""
    idle_gpu_threshold: float = 0.05
    """A node whose GPU utilisation (0..1) is at or below this is idle."""
    max_nodes: int | None = None
    """Most nodes gpuscale may have launched for GPRs at once."""
    unavailable_ttl_s: float = 600.0
    """How long an offering that reported insufficient capacity is skipped (the shell keeps the marks)."""
    provider: str = ""
    cluster: str = ""


@dataclass(frozen=True, slots=True)
class GprNode:
    """A node as the GPR planner sees it.

    ``created`` nodes were launched for a GPR (``request_id`` names the launch) and are deleted when it ends;
    others are existing inventory that a GPR borrows (labelled and tainted, never deleted). ``gpr_id`` is the
    node's current GPR label. ``gpu_utilization`` (0..1, None unknown) feeds the idle timeout.
    """

    name: str
    instance_type: str = ""
    gpu_model: str | None = None
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    gpus_used: int = 0
    ready: bool = True
    gpr_id: str | None = None
    created: bool = False
    node_id: str = ""
    request_id: str = ""
    hourly_cost: float = 0.0
    gpu_utilization: float | None = None


@dataclass(frozen=True, slots=True)
class CapacityView:
    """What the planner may use. ``scale_up_blocked`` says why launching is impossible now (e.g. a missing token);
    ``failed_requests`` maps launch request ids to the asynchronous failure the provider reported.
    ``observed_created`` is False when the provider's nodes could not be listed: launched nodes absent from
    ``nodes`` are then unknown, not lost. ``unavailable`` maps offerings that reported insufficient capacity to the
    time until which they are skipped (entries in the past are ignored)."""

    nodes: tuple[GprNode, ...] = ()
    scale_up_blocked: str | None = None
    failed_requests: Mapping[str, str] = field(default_factory=dict)
    observed_created: bool = True
    unavailable: Mapping[OfferingKey, float] = field(default_factory=dict)

    def skipped_offerings(self, now: float) -> frozenset[OfferingKey]:
        """Offerings still marked unavailable at ``now``."""
        return frozenset(k for k, until in self.unavailable.items() if until > now)


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    """One state change the plan made."""

    gpr_id: str
    from_state: GprState
    to_state: GprState
    trigger: Trigger
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LaunchAction:
    """Launch ``count`` nodes for a GPR. ``request_id`` is deterministic per GPR and attempt (idempotent)."""

    gpr_id: str
    request_id: str
    pool: str
    instance_type: str
    zone: str
    count: int
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]


@dataclass(frozen=True, slots=True)
class AssignNode:
    """Label and taint an existing node for a GPR (idempotent)."""

    gpr_id: str
    node_name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]


@dataclass(frozen=True, slots=True)
class DeleteNode:
    """Delete a node launched for a GPR that no longer holds it, by its provider id."""

    node_id: str
    node_name: str
    gpr_id: str


@dataclass(frozen=True, slots=True)
class UnassignNode:
    """Remove the GPR label and taint from an existing node that its GPR no longer holds."""

    node_name: str
    gpr_id: str


@dataclass(frozen=True, slots=True)
class GprActions:
    """The result of :func:`plan_gprs`: persist ``updates`` (write-ahead) first, then apply the node actions in
    order: deletes and unassigns, then assigns and launches."""

    updates: tuple[Gpr, ...] = ()
    transitions: tuple[TransitionRecord, ...] = ()
    launches: tuple[LaunchAction, ...] = ()
    assigns: tuple[AssignNode, ...] = ()
    deletes: tuple[DeleteNode, ...] = ()
    unassigns: tuple[UnassignNode, ...] = ()

    def by_id(self) -> dict[str, Gpr]:
        """Updated GPRs by id."""
        return {g.gpr_id: g for g in self.updates}


def queue_order(gprs: Iterable[Gpr]) -> list[Gpr]:
    """Queued GPRs in service order: higher priority first, then older, then id."""
    return sorted(
        (g for g in gprs if g.state is GprState.QUEUED), key=lambda g: (-g.spec.priority, g.created_at, g.gpr_id)
    )


def _node_matches(spec: GprSpec, node: GprNode) -> bool:
    if node.created or not node.ready or not node.gpu_count:
        return False
    if node.gpu_count - node.gpus_used < spec.number_of_gpus or not memory_ok(spec, node.gpu_memory_mib):
        return False
    if spec.instance_type:
        return node.instance_type == spec.instance_type
    allowed = allowed_models(spec)
    if allowed is None:
        return spec.enable_auto_gpu_selection and node.gpu_model is not None
    return node.gpu_model in allowed


def _pick_nodes(spec: GprSpec, free: Sequence[GprNode], n: int) -> list[GprNode]:
    """Up to ``n`` matching free nodes, tightest fit first (fewest GPUs, cheapest, name)."""
    match = [x for x in free if _node_matches(spec, x)]
    match.sort(key=lambda x: (x.gpu_count - x.gpus_used, x.hourly_cost, x.name))
    return match[:n]


def _launch_action(g: Gpr, types: Mapping[str, InstanceType]) -> LaunchAction:
    d = g.status.node_pool_details
    labels = {**gpr_node_labels(g.gpr_id), POOL: d.pool, RELEASE_POLICY_LABEL: g.spec.release_policy}
    it = types.get(d.instance_type)
    if it is not None and it.gpu_model:
        labels[GPU_PRODUCT] = it.gpu_model
    return LaunchAction(
        gpr_id=g.gpr_id,
        request_id=d.request_id,
        pool=d.pool,
        instance_type=d.instance_type,
        zone=d.zone,
        count=d.count,
        labels=labels,
        taints=gpr_node_taints(g.gpr_id),
    )


def launch_action(gpr: Gpr, catalog: Catalog) -> LaunchAction:
    """The (idempotent) launch of a provisioning GPR's scale-up, from its ``nodePoolDetails``."""
    return _launch_action(gpr, catalog.by_name())


def retarget_launch(gpr: Gpr, catalog: Catalog, skip: Collection[OfferingKey]) -> Gpr | None:
    """Point a provisioning GPR's pending scale-up at the next candidate offering not in ``skip`` (after the
    current one reported insufficient capacity); None when no candidate is left.

    The launch keeps its request id (a refused launch created nothing), the pool and the node count; the instance
    type, zone and cost estimate follow the new offering.
    """
    st = gpr.status
    d = st.node_pool_details
    if gpr.state is not GprState.PROVISIONING or not st.scale_up_triggered or not d.count:
        return None
    options = candidate_offerings(gpr.spec, catalog, skip)
    if not options:
        return None
    it, offer = options[0]
    old = catalog.by_name().get(d.instance_type)
    old_offer = (
        next((o for o in old.offerings if o.zone == d.zone and o.capacity_type is CapacityType.ON_DEMAND), None)
        if old is not None
        else None
    )
    old_price = old_offer.hourly_price if old_offer is not None else 0.0
    hours = gpr.spec.exit_duration_s / 3600.0
    cost = max(0.0, st.cost + d.count * (offer.hourly_price - old_price) * hours)
    details = replace(d, instance_type=it.name, zone=offer.zone)
    return replace(gpr, status=replace(st, node_pool_details=details, cost=round(cost, 4)))


class _Planner:
    def __init__(self, gprs: Sequence[Gpr], view: CapacityView, catalog: Catalog, config: GprConfig, now: float):
        self.cur: dict[str, Gpr] = {g.gpr_id: g for g in gprs}
        self.orig = dict(self.cur)
        self.view = view
        self.catalog = catalog
        self.cfg = config
        self.now = now
        self.types = catalog.by_name()
        self.transitions: list[TransitionRecord] = []
        self.launches: list[LaunchAction] = []
        self.skip = view.skipped_offerings(now)
        self._cands: dict[tuple[object, ...], tuple[InstanceType, ...]] = {}
        self._offers: dict[tuple[object, ...], tuple[tuple[InstanceType, Offering], ...]] = {}

    # -- helpers
    @staticmethod
    def _shape_key(spec: GprSpec) -> tuple[object, ...]:
        """The spec fields :func:`candidate_types` depends on (a pass sees many GPRs of few shapes)."""
        return (
            spec.instance_type,
            spec.gpu_shape,
            spec.enable_auto_gpu_selection,
            spec.number_of_gpus,
            spec.memory_per_gpu,
        )

    def cands(self, spec: GprSpec) -> tuple[InstanceType, ...]:
        key = self._shape_key(spec)
        if key not in self._cands:
            self._cands[key] = candidate_types(spec, self.catalog)
        return self._cands[key]

    def offers(self, spec: GprSpec, *, skip: bool = True) -> tuple[tuple[InstanceType, Offering], ...]:
        """Candidate offerings of ``spec`` without (``skip``) or with the ones marked out of capacity."""
        key = (*self._shape_key(spec), skip)
        if key not in self._offers:
            self._offers[key] = candidate_offerings(spec, self.catalog, self.skip if skip else frozenset())
        return self._offers[key]

    def move(self, g: Gpr, trigger: Trigger, reason: str = "") -> Gpr:
        nxt = transition(g, trigger, self.now, reason=reason)
        self.transitions.append(TransitionRecord(g.gpr_id, g.state, nxt.state, trigger, reason))
        self.cur[g.gpr_id] = nxt
        return nxt

    def set_status(self, g: Gpr, **changes: Any) -> Gpr:
        nxt = replace(g, status=replace(g.status, **changes))
        self.cur[g.gpr_id] = nxt
        return nxt

    def owned(self, g: Gpr) -> list[GprNode]:
        """Nodes currently serving ``g``: its launched nodes of the current attempt and its borrowed ones."""
        inv = set(g.status.inventory_nodes)
        rid = g.request_id
        return [n for n in self.view.nodes if (n.created and n.request_id == rid) or (not n.created and n.name in inv)]

    def dynamic_ok(self, g: Gpr) -> bool:
        return self.cfg.enable_dynamic_node and g.spec.enable_dynamic_node_pool

    def node_cost(self, n: GprNode) -> float:
        if n.hourly_cost:
            return n.hourly_cost
        it = self.types.get(n.instance_type)
        return on_demand_price(it) if it is not None and math.isfinite(on_demand_price(it)) else 0.0

    # -- steps
    def run(self) -> GprActions:
        for g in list(self.cur.values()):
            if g.state in HOLDING_STATES and g.spec.early_release:
                self.move(g, Trigger.EARLY_RELEASE, "released early by the user")
        for g in list(self.cur.values()):
            if g.state is GprState.PROVISIONED:
                self.step_provisioned(g)
            elif g.state is GprState.PROVISIONING:
                self.step_provisioning(g)
        for g in list(self.cur.values()):
            if (
                g.state in (GprState.FAILED, GprState.EVICTED)
                and g.spec.requeue_on_failure
                and g.status.last_trigger in REQUEUEABLE
                and g.status.retry_count < self.cfg.max_retry_count
            ):
                self.move(g, Trigger.REQUEUE, f"requeued after {g.status.last_trigger}")
        waits = self.admit_queue()
        for gid, w in waits.items():
            g = self.cur[gid]
            if g.state is GprState.QUEUED and g.status.estimated_wait_time_s != w:
                self.set_status(g, estimated_wait_time_s=w)
        assigns, deletes, unassigns = self.node_actions()
        updates = tuple(g for gid, g in self.cur.items() if g != self.orig.get(gid))
        return GprActions(
            updates=updates,
            transitions=tuple(self.transitions),
            launches=tuple(self.launches),
            assigns=tuple(assigns),
            deletes=tuple(deletes),
            unassigns=tuple(unassigns),
        )

    def step_provisioned(self, g: Gpr) -> None:
        owned = self.owned(g)
        names = {n.name for n in owned}
        inv = set(g.status.inventory_nodes)
        missing = [x for x in g.status.node_list if x not in names and (self.view.observed_created or x in inv)]
        if missing:
            self.move(g, Trigger.NODE_LOST, f"node(s) {', '.join(missing)} disappeared")
            return
        start = g.status.start_timestamp if g.status.start_timestamp is not None else self.now
        end = start + g.spec.exit_duration_s
        if self.now >= end:
            self.move(g, Trigger.EXIT_DURATION, "exit duration reached")
            return
        idle_since = g.status.idle_since
        if g.spec.idle_timeout_s and g.spec.enforce_idle_timeout:
            utils = [n.gpu_utilization for n in owned]
            idle = bool(utils) and all(u is not None and u <= self.cfg.idle_gpu_threshold for u in utils)
            idle_since = (idle_since if idle_since is not None else self.now) if idle else None
            if idle_since is not None and self.now - idle_since >= g.spec.idle_timeout_s:
                self.move(g, Trigger.IDLE_TIMEOUT, f"no GPU use for {format_egs_duration(self.now - idle_since)}")
                return
        self.set_status(g, remaining_duration_s=end - self.now, idle_since=idle_since)

    def step_provisioning(self, g: Gpr) -> None:
        st = g.status
        rid = g.request_id
        if st.scale_up_triggered and rid in self.view.failed_requests:
            self.move(g, Trigger.PROVISIONING_FAILED, self.view.failed_requests[rid])
            return
        owned = self.owned(g)
        created = [n for n in owned if n.created]
        ready = [n for n in owned if n.ready and n.gpr_id == g.gpr_id]
        if st.scale_up_triggered and st.node_pool_details.count and not self.view.observed_created:
            if self.view.scale_up_blocked is not None:
                self.move(g, Trigger.PROVISIONING_FAILED, self.view.scale_up_blocked)
            elif self.now - st.state_since >= self.cfg.provisioning_timeout_s:
                self.move(g, Trigger.PROVISIONING_FAILED, "launched nodes cannot be observed")
            return
        if len(ready) >= g.spec.number_of_gpu_nodes and len(created) >= st.node_pool_details.count:
            nodes = tuple(sorted(n.name for n in ready))
            details = replace(st.node_pool_details, node_ids=tuple(sorted(n.node_id for n in created)))
            g = self.move(g, Trigger.NODES_READY)
            cost = sum(self.node_cost(n) for n in ready) * g.spec.exit_duration_s / 3600.0
            self.set_status(
                g,
                node_list=nodes,
                num_gpus_allocated=g.spec.number_of_gpus * len(ready),
                node_pool_details=details,
                cost=round(cost, 4) if cost else g.status.cost,
            )
            return
        if self.now - st.state_since >= self.cfg.provisioning_timeout_s:
            self.move(
                g,
                Trigger.PROVISIONING_FAILED,
                f"{len(ready)}/{g.spec.number_of_gpu_nodes} nodes ready after "
                f"{format_egs_duration(self.now - st.state_since)}",
            )
            return
        need = st.node_pool_details.count - len(created)
        if st.scale_up_triggered and need > 0:
            if self.view.scale_up_blocked is not None:
                self.move(g, Trigger.PROVISIONING_FAILED, self.view.scale_up_blocked)
                return
            d = st.node_pool_details
            if not created and OfferingKey(d.instance_type, d.zone, CapacityType.ON_DEMAND) in self.skip:
                moved = retarget_launch(g, self.catalog, self.skip)
                if moved is None:
                    self.move(g, Trigger.PROVISIONING_FAILED, self.no_capacity_reason(g.spec))
                    return
                g = self.set_status(moved, node_pool_details=moved.status.node_pool_details, cost=moved.status.cost)
                st = g.status
            if self.dynamic_ok(g):
                self.launches.append(_launch_action(g, self.types))
        if created:
            ids = tuple(sorted(n.node_id for n in created))
            if ids != st.node_pool_details.node_ids:
                self.set_status(g, node_pool_details=replace(st.node_pool_details, node_ids=ids))

    # -- admission
    def holders(self) -> list[Gpr]:
        return [g for g in self.cur.values() if g.state in HOLDING_STATES]

    def free_nodes(self) -> list[GprNode]:
        held: set[str] = set()
        for g in self.holders():
            held.update(g.status.inventory_nodes)
        return [n for n in self.view.nodes if not n.created and n.name not in held]

    def created_in_use(self) -> int:
        """Launched nodes counted against ``max_nodes``: those expected by holders plus leftovers not yet gone."""
        holders = self.holders()
        rids = {g.request_id for g in holders}
        expected = sum(g.status.node_pool_details.count for g in holders if g.status.scale_up_triggered)
        leftovers = sum(1 for n in self.view.nodes if n.created and n.request_id not in rids)
        return expected + leftovers

    def budget(self) -> float:
        return math.inf if self.cfg.max_nodes is None else max(0, self.cfg.max_nodes - self.created_in_use())

    def admit_queue(self) -> dict[str, float | None]:
        for g in queue_order(self.cur.values()):
            self.try_admit(g)
        return self.estimate_waits()

    def try_admit(self, g: Gpr) -> None:
        spec = g.spec
        cands = self.cands(spec)
        free = self.free_nodes()
        take = _pick_nodes(spec, free, spec.number_of_gpu_nodes)
        rest = spec.number_of_gpu_nodes - len(take)
        if not cands and not take:
            errors = validate_spec(spec, self.catalog)
            if errors:
                self.move(g, Trigger.UNSERVABLE, "; ".join(f"{e.field}: {e.message}" for e in errors))
                return
        offers = self.offers(spec) if cands else ()
        dyn = self.dynamic_ok(g) and bool(offers) and self.view.scale_up_blocked is None
        if rest == 0 or (dyn and rest <= self.budget()):
            self.admit(g, take, rest, offers)
            return
        victims = self.choose_victims(g, cands, dyn)
        if victims is not None:
            for v in victims:
                self.move(self.cur[v.gpr_id], Trigger.EVICT, f"evicted by {g.gpr_id} (priority {spec.priority})")
                self.set_status(self.cur[v.gpr_id], evicted_by=g.gpr_id)
            take = _pick_nodes(spec, self.free_nodes(), spec.number_of_gpu_nodes)
            self.admit(self.cur[g.gpr_id], take, spec.number_of_gpu_nodes - len(take), offers)
            return
        self.delay(g, self.why_not(g, cands, offers, len(take)))

    def admit(self, g: Gpr, take: list[GprNode], rest: int, offers: Sequence[tuple[InstanceType, Offering]]) -> None:
        details = NodePoolDetails(provider=self.cfg.provider, cluster=self.cfg.cluster or g.spec.cluster_name)
        if rest > 0:
            it, offer = offers[0]
            details = replace(
                details,
                pool=g.gpr_id,
                instance_type=it.name,
                zone=offer.zone,
                request_id=g.request_id,
                count=rest,
            )
        how = f"{len(take)} inventory node(s)" + (f" + scale-up of {rest} x {details.instance_type}" if rest else "")
        g = self.move(g, Trigger.ADMIT, how)
        cost = sum(self.node_cost(n) for n in take)
        if rest:
            cost += rest * offers[0][1].hourly_price
        g = self.set_status(
            g,
            inventory_nodes=tuple(sorted(n.name for n in take)),
            scale_up_triggered=rest > 0,
            node_pool_details=details,
            cost=round(cost * g.spec.exit_duration_s / 3600.0, 4),
            estimated_wait_time_s=self.cfg.scale_up_latency_s if rest else 0.0,
        )
        if rest and self.view.scale_up_blocked is None:
            self.launches.append(_launch_action(g, self.types))

    def delay(self, g: Gpr, why: str) -> None:
        st = g.status
        due = st.last_delayed_at is None or self.now - st.last_delayed_at >= self.cfg.delay_interval_s
        count = st.delayed_count + 1 if due else st.delayed_count
        g = self.set_status(
            g, failure_reason=why, delayed_count=count, last_delayed_at=self.now if due else st.last_delayed_at
        )
        if self.cfg.max_delayed_count and count >= self.cfg.max_delayed_count:
            self.move(g, Trigger.DELAY_LIMIT, why)

    def why_not(
        self, g: Gpr, cands: Sequence[InstanceType], offers: Sequence[tuple[InstanceType, Offering]], have: int
    ) -> str:
        spec = g.spec
        shape = spec.instance_type or spec.gpu_shape or "any GPU"
        base = f"{have}/{spec.number_of_gpu_nodes} free inventory node(s) with {spec.number_of_gpus} x {shape}"
        if not self.cfg.enable_dynamic_node:
            return f"{base} and ENABLE_DYNAMIC_NODE is false"
        if not spec.enable_dynamic_node_pool:
            return f"{base} and enableDynamicNodePool is false"
        if self.view.scale_up_blocked is not None:
            return self.view.scale_up_blocked
        if not cands:
            return f"{base} and no catalog instance type fits"
        if not offers:
            return f"{base} and {self.no_capacity_reason(spec)}"
        return f"{base} and the node limit is reached ({self.created_in_use()}/{self.cfg.max_nodes} nodes)"

    def capacity_back_at(self, spec: GprSpec) -> float:
        """When a scale-up for ``spec`` can next be tried: now, or when the first out-of-capacity mark expires."""
        if self.offers(spec):
            return self.now
        keys = {offering_key(it, o) for it, o in self.offers(spec, skip=False)}
        return min((self.view.unavailable[k] for k in keys if k in self.skip), default=self.now)

    def no_capacity_reason(self, spec: GprSpec) -> str:
        """Why no offering can be launched for ``spec``: every candidate is marked out of capacity (and until when)."""
        keys = {offering_key(it, o) for it, o in self.offers(spec, skip=False)}
        marked = sorted((k for k in keys if k in self.skip), key=lambda k: (k.instance_type, k.zone))
        names = ", ".join(f"{k.instance_type} in {k.zone}" for k in marked) or "none"
        until = min((self.view.unavailable[k] for k in marked), default=self.now)
        return f"insufficient capacity for every candidate offering ({names}); retrying after {format_timestamp(until)}"

    def choose_victims(self, g: Gpr, cands: Sequence[InstanceType], dyn: bool) -> list[Gpr] | None:
        """The fewest, lowest-priority evictable holders whose capacity lets ``g`` be served, or None."""
        pool = sorted(
            (
                h
                for h in self.holders()
                if h.spec.enable_eviction and h.spec.priority < g.spec.priority and h.gpr_id != g.gpr_id
            ),
            key=lambda h: (h.spec.priority, -h.created_at, h.gpr_id),
        )
        if not pool:
            return None
        free = self.free_nodes()
        budget = self.budget()
        inv_by_name = {n.name: n for n in self.view.nodes if not n.created}

        def serves(combo: Sequence[Gpr]) -> bool:
            freed = [inv_by_name[x] for h in combo for x in h.status.inventory_nodes if x in inv_by_name]
            have = len(_pick_nodes(g.spec, [*free, *freed], g.spec.number_of_gpu_nodes))
            extra = sum(h.status.node_pool_details.count for h in combo if h.status.scale_up_triggered)
            return have >= g.spec.number_of_gpu_nodes or (dyn and g.spec.number_of_gpu_nodes - have <= budget + extra)

        def key(combo: Sequence[Gpr]) -> tuple[int, int, int]:
            prios = [h.spec.priority for h in combo]
            return (len(combo), max(prios), sum(prios))

        if len(pool) <= 12:
            for k in range(1, len(pool) + 1):
                found = [list(c) for c in itertools.combinations(pool, k) if serves(c)]
                if found:
                    return min(found, key=key)
            return None
        chosen: list[Gpr] = []
        for h in pool:
            chosen.append(h)
            if serves(chosen):
                for x in sorted(chosen, key=lambda h: -h.spec.priority):
                    rest = [y for y in chosen if y is not x]
                    if rest and serves(rest):
                        chosen = rest
                return chosen
        return None

    # -- wait-time estimate
    def estimate_waits(self) -> dict[str, float | None]:
        """Expected seconds until each queued GPR's nodes are ready, simulating the queue in order against free
        inventory, the launch budget and the expected release times of holders (no backfilling: an upper-end
        estimate). None when the GPR cannot be served even after everything ahead of it finishes."""
        queued = queue_order(self.cur.values())
        out: dict[str, float | None] = {}
        if not queued:
            return out
        lat = self.cfg.scale_up_latency_s
        free = list(self.free_nodes())
        budget = self.budget()
        inv_by_name = {n.name: n for n in self.view.nodes if not n.created}
        events: list[tuple[float, int, tuple[GprNode, ...], int]] = []
        seq = itertools.count()
        for h in self.holders():
            st = h.status
            if h.state is GprState.PROVISIONED and st.start_timestamp is not None:
                end = st.start_timestamp + h.spec.exit_duration_s
            else:
                end = self.now + (lat if st.scale_up_triggered else 0.0) + h.spec.exit_duration_s
            nodes = tuple(inv_by_name[x] for x in st.inventory_nodes if x in inv_by_name)
            heapq.heappush(events, (max(end, self.now), next(seq), nodes, st.node_pool_details.count))
        t = self.now
        for g in queued:
            cands = self.cands(g.spec)
            dyn = self.dynamic_ok(g) and bool(cands) and self.view.scale_up_blocked is None
            launch_from = self.capacity_back_at(g.spec) if dyn else self.now
            while True:
                take = _pick_nodes(g.spec, free, g.spec.number_of_gpu_nodes)
                rest = g.spec.number_of_gpu_nodes - len(take)
                if rest == 0 or (dyn and rest <= budget):
                    break
                if not events:
                    take = []
                    break
                t_end, _, nodes, count = heapq.heappop(events)
                t = max(t, t_end)
                free.extend(nodes)
                budget += count
            if rest and not (dyn and rest <= budget):
                out[g.gpr_id] = None
                continue
            ready_at = max(t, launch_from) + lat if rest else t
            out[g.gpr_id] = round(ready_at - self.now, 3)
            taken = {n.name for n in take}
            free = [n for n in free if n.name not in taken]
            budget -= rest
            heapq.heappush(events, (ready_at + g.spec.exit_duration_s, next(seq), tuple(take), rest))
        return out

    # -- node actions
    def node_actions(self) -> tuple[list[AssignNode], list[DeleteNode], list[UnassignNode]]:
        holders = self.holders()
        owner_inv = {x: g.gpr_id for g in holders for x in g.status.inventory_nodes}
        rids = {g.request_id for g in holders}
        assigns: list[AssignNode] = []
        deletes: list[DeleteNode] = []
        unassigns: list[UnassignNode] = []
        for n in self.view.nodes:
            if n.created:
                if n.request_id not in rids and self.cfg.enable_dynamic_node and n.node_id:
                    deletes.append(DeleteNode(n.node_id, n.name, n.gpr_id or gpr_id_of_request(n.request_id)))
                continue
            owner = owner_inv.get(n.name)
            if owner is not None and n.gpr_id != owner:
                assigns.append(AssignNode(owner, n.name, gpr_node_labels(owner), gpr_node_taints(owner)))
            elif owner is None and n.gpr_id is not None:
                unassigns.append(UnassignNode(n.name, n.gpr_id))
        return assigns, deletes, unassigns


def plan_gprs(gprs: Sequence[Gpr], view: CapacityView, catalog: Catalog, config: GprConfig, now: float) -> GprActions:
    """One pure planning pass over the GPRs.

    In order: early releases; exit-duration completion, idle-timeout release and lost nodes of provisioned GPRs;
    readiness, failures and (idempotent) launches of provisioning GPRs; requeue of failed/evicted GPRs with
    ``requeueOnFailure``; admission of queued GPRs in :func:`queue_order` from free inventory and/or a scale-up
    (when dynamic nodes are enabled and under ``max_nodes``), else eviction of the fewest, lowest-priority
    evictable holders, else a delay (counted at most once per ``delay_interval_s``; at ``max_delayed_count`` the GPR
    fails with the reason it waited for); wait-time estimates; and the node actions (label borrowed nodes, delete
    launched nodes and unlabel borrowed nodes whose GPR no longer holds them).
    """
    return _Planner(gprs, view, catalog, config, now).run()
