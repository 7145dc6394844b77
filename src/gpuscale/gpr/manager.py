"""The GPR manager: the imperative shell around :func:`gpuscale.core.gpr.plan_gprs`.

``reconcile()`` observes (existing inventory, the nodes the provider launched for GPRs, provider events, GPU
utilisation; with an engine, the provider as the engine last observed it: the engine is the provider's one reader),
plans, persists the plan and a journal entry per effect (write-ahead), then acts: deletes launched
nodes of GPRs that no longer hold them (by node id, never by shrinking a pool), unlabels and labels borrowed
inventory nodes, and launches nodes with the GPR's labels and taints under a request id that is deterministic per
GPR and attempt, so a restart never doubles a launch.

Launch errors are judged by the pure :func:`~gpuscale.core.reconcile.judge_gpr_launch_error`, which reads the
error's :class:`~gpuscale.errors.RetryPolicy` in the same place as the node controller's launch verdict (one retry
layer; the provider never retries or sleeps); the manager only carries the verdict out. A launch refused with
:class:`~gpuscale.errors.CapacityError` marks that (instance type, zone) unavailable for ``GPR_UNAVAILABLE_TTL_S``
seconds and the same launch (same request id: a refused launch created nothing) is retried at once on the GPR's next
candidate offering (another zone, or another type when ``enableAutoGpuSelection`` or several types of the shape
fit); only when none is left does the attempt fail. The marks also steer admission of queued GPRs (a GPR whose every
candidate is marked waits, delayed, until one expires). A rate limit is retried with the same request id after its
``Retry-After``, a transient error after the policy's delay doubled per attempt until its ``max_attempts`` are used
up (then the attempt fails), a quota error after a doubling back-off; until then each pass skips that launch. An
invalid request fails the attempt. Marks, due times and attempt counts live in an
:class:`~gpuscale.controller.availability.Availability` record, which the node controller shares in engine mode and
whose store keeps them across restarts (in memory by default).

Settings (:func:`config_from_env`): ``ENABLE_DYNAMIC_NODE`` (default true; when false GPRs are served from existing
inventory only and no provider is created or called), ``MAX_DELAYED_COUNT``, ``MAX_NODE_COUNT`` and a few
``GPR_*`` timings. A provider that cannot authenticate (the Linode provider raises
:class:`~gpuscale.errors.AuthenticationError` ``LINODE_TOKEN environment variable is not set`` when the token is
missing) is never called again; queued GPRs that need a scale-up report that message as ``failureReason``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from gpuscale.clock import Clock, SystemClock
from gpuscale.controller.availability import Availability
from gpuscale.core.gpr import (
    DEFAULT_MAX_EXIT_S,
    GPR_LABEL,
    CapacityView,
    Gpr,
    GprConfig,
    GprNode,
    GprSpec,
    GprState,
    LaunchAction,
    TransitionRecord,
    Trigger,
    cancel,
    gpr_id_of_request,
    is_gpr_request_id,
    launch_action,
    new_gpr,
    parse_gpr_spec,
    plan_gprs,
    request_release,
    retarget_launch,
    transition,
    with_priority,
)
from gpuscale.core.model import CapacityType, Catalog, OfferingKey, Taint
from gpuscale.core.reconcile import (
    FailAttempt,
    LaunchRules,
    MarkUnavailable,
    Retarget,
    RetryLaunch,
    judge_gpr_launch_error,
)
from gpuscale.errors import AuthenticationError, GpuscaleError, InputError, NotFound, ProviderError
from gpuscale.gpr.ports import GprStorePort
from gpuscale.gpr.store import StaleWrite, Stored, new_gpr_id
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    Provider,
    ProviderEvent,
    ProviderEventKind,
)

log = logging.getLogger("gpuscale.gpr")

HOLDING_STATES = (GprState.PROVISIONING, GprState.PROVISIONED)
"""States in which a GPR holds nodes: they take only its workloads' pods."""
_LEFT = (CloudNodeState.DELETING, CloudNodeState.GONE)
ACTIVE_STATES = (GprState.QUEUED, GprState.PROVISIONING, GprState.PROVISIONED, GprState.FAILED, GprState.EVICTED)


# --------------------------------------------------------------------------------------------------- settings
def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise InputError("is not a boolean", where=f"environment variable {name}", value=raw, fix="set true or false")


def _env_num(env: Mapping[str, str], name: str, default: float | None, *, minimum: float = 0) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise InputError(
            "is not a number", where=f"environment variable {name}", value=raw, fix="set a number"
        ) from None
    if v < minimum:
        raise InputError(f"must be at least {minimum:g}", where=f"environment variable {name}", value=raw)
    return v


def config_from_env(env: Mapping[str, str] | None = None, *, provider: str = "", cluster: str = "") -> GprConfig:
    """Planner settings from the environment: ``ENABLE_DYNAMIC_NODE``, ``MAX_DELAYED_COUNT``, ``MAX_NODE_COUNT``,
    ``GPR_DELAY_INTERVAL_S``, ``GPR_MAX_RETRY_COUNT``, ``GPR_PROVISIONING_TIMEOUT_S``, ``GPR_SCALE_UP_LATENCY_S``,
    ``GPR_IDLE_GPU_THRESHOLD``, ``GPR_UNAVAILABLE_TTL_S``. Raises :class:`InputError` naming the variable for a bad
    value."""
    env = os.environ if env is None else env
    d = GprConfig()
    max_nodes = _env_num(env, "MAX_NODE_COUNT", None, minimum=1)
    return GprConfig(
        enable_dynamic_node=_env_bool(env, "ENABLE_DYNAMIC_NODE", True),
        max_delayed_count=int(_env_num(env, "MAX_DELAYED_COUNT", d.max_delayed_count) or 0),
        delay_interval_s=float(_env_num(env, "GPR_DELAY_INTERVAL_S", d.delay_interval_s) or 0.0),
        max_retry_count=int(_env_num(env, "GPR_MAX_RETRY_COUNT", d.max_retry_count) or 0),
        provisioning_timeout_s=float(
            _env_num(env, "GPR_PROVISIONING_TIMEOUT_S", d.provisioning_timeout_s, minimum=1) or 1
        ),
        scale_up_latency_s=float(_env_num(env, "GPR_SCALE_UP_LATENCY_S", d.scale_up_latency_s) or 0.0),
        idle_gpu_threshold=float(_env_num(env, "GPR_IDLE_GPU_THRESHOLD", d.idle_gpu_threshold) or 0.0),
        max_nodes=None if max_nodes is None else int(max_nodes),
        unavailable_ttl_s=float(_env_num(env, "GPR_UNAVAILABLE_TTL_S", d.unavailable_ttl_s) or 0.0),
        provider=provider,
        cluster=cluster,
    )


# --------------------------------------------------------------------------------------------------- inventory
class Inventory(Protocol):
    """Existing nodes GPRs may borrow (the Kubernetes cluster's nodes in the controller; a list in tests)."""

    def nodes(self) -> Sequence[GprNode]:
        """Existing GPU nodes with their current GPR label, readiness, used GPUs and GPU utilisation."""
        ...

    def assign(self, node_name: str, labels: Mapping[str, str], taints: Sequence[Taint]) -> None:
        """Add ``labels`` and ``taints`` to a node (idempotent)."""
        ...

    def unassign(self, node_name: str) -> None:
        """Remove the GPR label and taint from a node (idempotent)."""
        ...


class StaticInventory:
    """An in-memory :class:`Inventory`: a fixed set of nodes whose GPR labels and utilisation can change."""

    def __init__(self, nodes: Iterable[GprNode] = ()) -> None:
        self._nodes: dict[str, GprNode] = {n.name: n for n in nodes}
        self.taints: dict[str, tuple[Taint, ...]] = {}
        self._lock = threading.Lock()

    def nodes(self) -> Sequence[GprNode]:
        """Current nodes."""
        with self._lock:
            return list(self._nodes.values())

    def assign(self, node_name: str, labels: Mapping[str, str], taints: Sequence[Taint]) -> None:
        """Set the node's GPR label and taints."""
        with self._lock:
            n = self._nodes[node_name]
            self._nodes[node_name] = replace(n, gpr_id=labels.get(GPR_LABEL))
            self.taints[node_name] = tuple(taints)

    def unassign(self, node_name: str) -> None:
        """Clear the node's GPR label and taints."""
        with self._lock:
            if node_name in self._nodes:
                self._nodes[node_name] = replace(self._nodes[node_name], gpr_id=None)
            self.taints.pop(node_name, None)

    def set_utilization(self, node_name: str, value: float | None) -> None:
        """Record the node's GPU utilisation (0..1)."""
        with self._lock:
            self._nodes[node_name] = replace(self._nodes[node_name], gpu_utilization=value)

    def set_ready(self, node_name: str, ready: bool) -> None:
        """Mark the node ready or not."""
        with self._lock:
            self._nodes[node_name] = replace(self._nodes[node_name], ready=ready)

    def remove(self, node_name: str) -> None:
        """The node left the cluster."""
        with self._lock:
            self._nodes.pop(node_name, None)


# --------------------------------------------------------------------------------------------------- engine
class NodeEngine(Protocol):
    """The node engine GPR demand goes through (the controller, :mod:`gpuscale.controller.gprnodes`): one claim table,
    one availability record and one node lifecycle for the nodes of pods and of GPRs."""

    availability: Availability

    def launch_gpr_nodes(self, request: LaunchRequest) -> list[CloudNode]:
        """Launch a GPR's nodes once and track them as claims; provider errors propagate."""
        ...

    def release_gpr_node(self, node_id: str) -> None:
        """The GPR no longer holds the node: drain and delete it."""
        ...

    def serve_gprs(self) -> None:
        """From now on GPR nodes are the engine's (adopted after a restart, never consolidated while held)."""
        ...

    def gpr_observation(self) -> tuple[Sequence[CloudNode], list[ProviderEvent]] | None:
        """The provider as the engine last observed it: (its node list, the GPR launches' events not taken yet, each
        once), or None before the engine's first observation; raises the provider error of a failed observation.
        The engine is the provider's only reader: the manager never lists or polls it itself."""
        ...

    def gpr_inventory(self) -> Inventory:
        """The engine's free nodes and the nodes GPRs hold by label, as inventory GPRs borrow."""
        ...

    def hold_gpr_workloads(self, workloads: Mapping[str, Mapping[str, str]]) -> None:
        """The active GPRs' workload selectors (gprId -> selector): their nodes are room only for their pods."""
        ...


def holding_workloads(gprs: Iterable[Gpr]) -> dict[str, Mapping[str, str]]:
    """The workload selectors of the GPRs that hold nodes (Provisioning or Provisioned), by gprId."""
    return {g.gpr_id: g.spec.workload_selector for g in gprs if g.state in HOLDING_STATES}


# --------------------------------------------------------------------------------------------------- manager
@dataclass(slots=True)
class ReconcileReport:
    """What one reconcile did."""

    transitions: list[TransitionRecord] = field(default_factory=list)
    launched: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    assigned: list[str] = field(default_factory=list)
    unassigned: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: str = ""


class GprManager:
    """Creates, updates and serves GPRs. Thread-safe; ``reconcile`` runs one pass at a time.

    ``provider`` or ``provider_factory`` (called lazily, only when dynamic nodes are enabled) gives the cloud;
    ``inventory`` the existing nodes; ``utilization`` maps node names to GPU utilisation (0..1) for launched
    nodes (inventory nodes carry their own). With ``engine`` (the node controller) launches and deletions go through
    the engine's claim table and node lifecycle, and its availability record is shared; the provider's nodes and
    events are then read from the engine's last observation (:meth:`NodeEngine.gpr_observation`), never from the
    provider, and a pass before the engine's first observation is skipped; without an ``inventory`` the engine's
    free nodes are the inventory (borrowed before launching).
    """

    def __init__(
        self,
        store: GprStorePort,
        catalog: Catalog,
        *,
        config: GprConfig | None = None,
        provider: Provider | None = None,
        provider_factory: Callable[[], Provider] | None = None,
        inventory: Inventory | None = None,
        utilization: Callable[[], Mapping[str, float]] | None = None,
        clock: Clock | None = None,
        max_exit_s: int = DEFAULT_MAX_EXIT_S,
        availability: Availability | None = None,
        engine: NodeEngine | None = None,
    ) -> None:
        self.store = store
        self.max_exit_s = max_exit_s
        self.catalog = catalog
        self.config = config or GprConfig()
        self.clock: Clock = clock or SystemClock()
        self.inventory = inventory
        self._provider = provider
        self._last_word: tuple[Provider, CloudNodeState] | None = None
        self._factory = provider_factory
        self._utilization = utilization
        self._blocked: str | None = None
        self._engine = engine
        self._failed: dict[str, str] = {}
        """Failed GPR launches (request id -> message) taken from the provider, until a stored plan has seen them."""
        if engine is not None:
            engine.serve_gprs()
            if inventory is None:  # the engine's free nodes are borrowed before new ones are launched
                self.inventory = engine.gpr_inventory()
        if availability is None:
            availability = engine.availability if engine is not None else Availability()
        self.availability = availability
        """Offerings not to be bought until a time (shared with the node controller when given)."""
        self._launch_rules = LaunchRules(unavailable_ttl_s=self.config.unavailable_ttl_s)
        self._lock = threading.RLock()
        self._last_view = CapacityView()
        self._types = catalog.by_name()
        for entry in store.journal(pending_only=True):
            log.warning("in-doubt %s %s for %s from before a restart", entry.kind, entry.key, entry.gpr_id)
            store.finish(entry.id, "in doubt at restart: redone idempotently if still needed", now=self.clock.now())

    # ---------------------------------------------------------------------------------------- user operations
    def create(self, data: Mapping[str, Any]) -> Gpr:
        """Validate an EGS spec dict against the catalog and queue it; raises ``GprValidationError``."""
        spec = parse_gpr_spec(data, self.catalog, max_exit_s=self.max_exit_s)
        return self.submit(spec)

    def submit(self, spec: GprSpec, *, gpr_id: str | None = None) -> Gpr:
        """Queue an already validated spec (``gpr_id`` fixes the id, e.g. for reproducible simulations)."""
        gpr = new_gpr(gpr_id or new_gpr_id(), spec, self.catalog, self.clock.now())
        self.store.insert(gpr)
        log.info("GPR %s (%s) queued with priority %d", gpr.gpr_id, spec.request_name, spec.priority)
        return gpr

    def get(self, gpr_id: str) -> Gpr:
        """The GPR ``gpr_id`` (``GprNotFound`` if unknown)."""
        return self.store.get(gpr_id).gpr

    def list_gprs(self, states: Iterable[GprState] | None = None) -> list[Gpr]:
        """Every GPR (optionally only in ``states``), oldest first."""
        return [s.gpr for s in self.store.list_gprs(states)]

    def set_priority(self, gpr_id: str, priority: int) -> Gpr:
        """Change a GPR's priority (not once it is final)."""
        return self.store.modify(gpr_id, lambda g: with_priority(g, priority), now=self.clock.now()).gpr

    def release(self, gpr_id: str) -> Gpr:
        """Ask for early release of a provisioning or provisioned GPR (done by the next reconcile)."""
        return self.store.modify(gpr_id, request_release, now=self.clock.now()).gpr

    def cancel(self, gpr_id: str) -> Gpr:
        """Cancel a queued GPR."""
        now = self.clock.now()
        return self.store.modify(gpr_id, lambda g: cancel(g, now), now=now).gpr

    def estimate_wait(self, spec: GprSpec) -> float | None:
        """Seconds until a GPR with ``spec``, submitted now, would have ready nodes (None: not servable as things
        stand). Uses the capacity seen by the last reconcile."""
        probe = new_gpr("gpr-waittime-probe", spec, self.catalog, self.clock.now())
        return self._estimate([*self._active(), probe], probe)

    def wait_for(self, gpr_id: str) -> float | None:
        """Estimated seconds until GPR ``gpr_id`` has ready nodes (0 once provisioned or final)."""
        g = self.get(gpr_id)
        if g.state is GprState.QUEUED:
            return self._estimate(self._active(), g)
        if g.state is GprState.PROVISIONING and g.status.scale_up_triggered:
            return max(0.0, self.config.scale_up_latency_s - (self.clock.now() - g.status.state_since))
        return 0.0

    def _active(self) -> list[Gpr]:
        return [s.gpr for s in self._load_active()]

    def _load_active(self) -> list[Stored]:
        """GPRs the planner must see: queued, holding, and failed/evicted ones that may still be requeued."""
        out: list[Stored] = []
        for s in self.store.list_gprs(ACTIVE_STATES):
            g = s.gpr
            if g.state in (GprState.FAILED, GprState.EVICTED) and not (
                g.spec.requeue_on_failure and g.status.retry_count < self.config.max_retry_count
            ):
                continue
            out.append(s)
        return out

    def _estimate(self, gprs: list[Gpr], target: Gpr) -> float | None:
        plan = plan_gprs(gprs, self._last_view, self.catalog, self.config, self.clock.now())
        got = plan.by_id().get(target.gpr_id, target)
        if got.state is GprState.QUEUED:
            return got.status.estimated_wait_time_s
        if got.state is GprState.PROVISIONING:
            return self.config.scale_up_latency_s if got.status.scale_up_triggered else 0.0
        return None

    @property
    def unavailable_offerings(self) -> dict[OfferingKey, float]:
        """Offerings marked out of capacity and the time until which they are skipped."""
        now = self.clock.now()
        with self._lock:
            return self.availability.unavailable_at(now)

    def mark_unavailable(self, instance_type: str, zone: str, *, until: float | None = None) -> None:
        """Skip an on-demand offering until ``until`` (default: now + ``unavailable_ttl_s``)."""
        key = OfferingKey(instance_type, zone, CapacityType.ON_DEMAND)
        t = self.clock.now() + self.config.unavailable_ttl_s if until is None else until
        with self._lock:
            self.availability.mark_unavailable(key, t, "GPR launch: insufficient capacity")

    @property
    def blocked_reason(self) -> str | None:
        """Why the provider cannot be used (e.g. the missing-token message), or None."""
        return self._blocked

    # ---------------------------------------------------------------------------------------- reconcile
    def reconcile(self) -> ReconcileReport:
        """One observe-plan-persist-act pass."""
        with self._lock:
            report = ReconcileReport()
            now = self.clock.now()
            view = self._observe(report)
            if view is None:
                return report
            self._last_view = view
            stored = {s.gpr.gpr_id: s for s in self._load_active()}
            plan = plan_gprs([s.gpr for s in stored.values()], view, self.catalog, self.config, now)
            journal: list[tuple[str, str, str, dict[str, Any]]] = []
            journal += [("delete", d.node_id, d.gpr_id, {"node": d.node_name}) for d in plan.deletes]
            journal += [("unassign", u.node_name, u.gpr_id, {}) for u in plan.unassigns]
            journal += [("assign", a.node_name, a.gpr_id, {}) for a in plan.assigns]
            journal += [
                ("launch", la.request_id, la.gpr_id, {"type": la.instance_type, "count": la.count})
                for la in plan.launches
            ]
            try:
                ids = self.store.apply(
                    [(g, stored[g.gpr_id].version) for g in plan.updates], plan.transitions, journal, now=now
                )
            except StaleWrite as exc:
                report.skipped = f"plan dropped: {exc}"
                return report
            self._failed.clear()  # the failures taken from the provider were seen by a stored plan
            report.transitions = list(plan.transitions)
            if self._engine is not None:
                after = {s.gpr.gpr_id: s.gpr for s in stored.values()} | {g.gpr_id: g for g in plan.updates}
                self._engine.hold_gpr_workloads(holding_workloads(after.values()))
            for t in plan.transitions:
                log.info("GPR %s: %s -> %s (%s) %s", t.gpr_id, t.from_state, t.to_state, t.trigger, t.reason)
            jids = iter(ids)
            for d in plan.deletes:
                self._act(next(jids), report, partial(self._delete, d.node_id), report.deleted, d.node_id)
            inv = self.inventory
            for u in plan.unassigns:
                jid = next(jids)
                if inv is not None:
                    self._act(jid, report, partial(inv.unassign, u.node_name), report.unassigned, u.node_name)
            for a in plan.assigns:
                jid = next(jids)
                if inv is not None:
                    act = partial(inv.assign, a.node_name, a.labels, a.taints)
                    self._act(jid, report, act, report.assigned, a.node_name)
            for la in plan.launches:
                self._launch(next(jids), la, report)
            return report

    def _act(self, jid: int, report: ReconcileReport, fn: Callable[[], None], done: list[str], what: str) -> None:
        try:
            fn()
        except GpuscaleError as exc:
            self._provider_failed(exc)
            report.errors.append(f"{what}: {exc}")
            self.store.finish(jid, f"error: {exc}", now=self.clock.now())
            return
        done.append(what)
        self.store.finish(jid, "ok", now=self.clock.now())

    def _delete(self, node_id: str) -> None:
        provider = self._get_provider()
        if provider is None:
            raise AuthenticationError(self._blocked or "no provider")
        if self._engine is not None:
            self._engine.release_gpr_node(node_id)
            return
        try:
            provider.delete_node(node_id)
        except NotFound:
            return

    def _launch(self, jid: int, la: LaunchAction, report: ReconcileReport) -> None:
        provider = self._get_provider()
        now = self.clock.now()
        if provider is None:
            self.store.finish(jid, f"error: {self._blocked}", now=now)
            return
        pending = self.availability.retry(la.request_id)
        due = pending.until if pending is not None else now
        if due > now:
            self.store.finish(jid, f"deferred: retried at {due:.0f} per the last error's retry policy", now=now)
            return
        if OfferingKey(la.instance_type, la.zone, CapacityType.ON_DEMAND) in self.unavailable_offerings:
            # Marked by an earlier launch of this same pass: go straight to the next offering if there is one.
            nxt = self._retarget(la)
            if nxt is not None:
                self.store.finish(jid, f"skipped: {la.instance_type} in {la.zone} is out of capacity", now=now)
                self._launch_next(la, nxt, report)
                return
        req = LaunchRequest(
            request_id=la.request_id,
            pool=la.pool,
            instance_type=la.instance_type,
            zone=la.zone,
            count=la.count,
            labels=dict(la.labels),
            taints=tuple(la.taints),
        )
        try:
            nodes = provider.launch(req) if self._engine is None else self._engine.launch_gpr_nodes(req)
        except ProviderError as exc:
            report.errors.append(f"launch {la.request_id}: {exc}")
            self.store.finish(jid, f"error: {exc}", now=now)
            self._carry_out(la, exc, now, report)
            return
        self.availability.clear_retry(la.request_id)
        report.launched.append(la.request_id)
        self.store.finish(jid, "ok", now=now)
        ids = tuple(sorted(n.node_id for n in nodes))

        def record(g: Gpr) -> Gpr:
            d = g.status.node_pool_details
            if g.request_id != la.request_id or d.node_ids == ids:
                return g
            return replace(g, status=replace(g.status, node_pool_details=replace(d, node_ids=ids)))

        self.store.modify(la.gpr_id, record, now=now)

    def _carry_out(self, la: LaunchAction, exc: ProviderError, now: float, report: ReconcileReport) -> None:
        """Carry out the pure verdict on the failed launch ``la`` (:func:`judge_gpr_launch_error`)."""
        pending = self.availability.retry(la.request_id)
        verdict = judge_gpr_launch_error(
            exc,
            request_id=la.request_id,
            offering=OfferingKey(la.instance_type, la.zone, CapacityType.ON_DEMAND),
            attempts=pending.failures if pending is not None else 0,
            rules=self._launch_rules,
            now=now,
        )
        for act in verdict.actions:
            if isinstance(act, MarkUnavailable):
                self.availability.mark_unavailable(act.offering, act.until, act.why)
            elif isinstance(act, RetryLaunch):
                self.availability.set_retry(act.request_id, act.at, act.attempts, act.why)
            elif isinstance(act, Retarget):
                nxt = self._retarget(la)
                if nxt is None:
                    self._fail_provisioning(la.gpr_id, la.request_id, act.reason, report)
                else:
                    self._launch_next(la, nxt, report)
            elif isinstance(act, FailAttempt):
                if act.clear_retry:
                    self.availability.clear_retry(la.request_id)
                self._fail_provisioning(la.gpr_id, la.request_id, act.reason, report)
            else:
                self._provider_failed(exc)

    def _launch_next(self, la: LaunchAction, nxt: LaunchAction, report: ReconcileReport) -> None:
        """Journal and run the launch ``nxt`` that replaces ``la`` on another offering."""
        log.info(
            "GPR %s: no capacity for %s in %s; trying %s in %s",
            la.gpr_id,
            la.instance_type,
            la.zone,
            nxt.instance_type,
            nxt.zone,
        )
        payload = {"type": nxt.instance_type, "zone": nxt.zone, "count": nxt.count, "after": la.instance_type}
        (jid,) = self.store.apply([], [], [("launch", nxt.request_id, nxt.gpr_id, payload)], now=self.clock.now())
        self._launch(jid, nxt, report)

    def _retarget(self, la: LaunchAction) -> LaunchAction | None:
        """Move the GPR's pending launch ``la`` to its next candidate offering not marked unavailable; return the new
        launch, or None when there is none (or the GPR moved on meanwhile)."""
        skip = frozenset(self.unavailable_offerings)
        moved: list[Gpr] = []

        def fn(g: Gpr) -> Gpr:
            d = g.status.node_pool_details
            if (
                g.request_id != la.request_id
                or (d.instance_type, d.zone) != (la.instance_type, la.zone)
                or d.node_ids  # this launch already created nodes: it is not refused, only replayed
            ):
                return g
            nxt = retarget_launch(g, self.catalog, skip)
            if nxt is None:
                return g
            moved.append(nxt)
            return nxt

        self.store.modify(la.gpr_id, fn, now=self.clock.now())
        return launch_action(moved[0], self.catalog) if moved else None

    def _fail_provisioning(self, gpr_id: str, request_id: str, reason: str, report: ReconcileReport) -> None:
        now = self.clock.now()

        def fail(g: Gpr) -> Gpr:
            if g.state is not GprState.PROVISIONING or g.request_id != request_id:
                return g
            return transition(g, Trigger.PROVISIONING_FAILED, now, reason=reason)

        before = self.store.get(gpr_id).gpr.state
        after = self.store.modify(gpr_id, fail, now=now).gpr
        if after.state is not before:
            report.transitions.append(
                TransitionRecord(gpr_id, before, after.state, Trigger.PROVISIONING_FAILED, reason)
            )

    def _provider_failed(self, exc: Exception) -> None:
        if isinstance(exc, AuthenticationError):
            self._blocked = str(exc)
            log.error("provider authentication failed: %s; no further provider calls", exc)

    def _get_provider(self) -> Provider | None:
        if self._blocked is not None or not self.config.enable_dynamic_node:
            return None
        if self._provider is None and self._factory is not None:
            try:
                self._provider = self._factory()
            except (AuthenticationError, InputError) as exc:
                self._blocked = str(exc)
                log.error("cannot create the provider: %s", exc)
                return None
        return self._provider

    # ---------------------------------------------------------------------------------------- observe
    def _observe(self, report: ReconcileReport) -> CapacityView | None:
        """The capacity view of a pass: inventory, the provider's GPR nodes and failed GPR launches. Without an engine
        the provider is listed and polled here; with one, the engine's last observation is used (the engine is the
        provider's one reader: :meth:`NodeEngine.gpr_observation`) and the pass is skipped until the engine has
        observed once. Failures taken stay in ``_failed`` until a plan that saw them is stored."""
        inv_nodes = list(self.inventory.nodes()) if self.inventory is not None else []
        provider = self._get_provider()
        created: list[GprNode] = []
        observed = False
        if provider is not None:
            try:
                if self._engine is None:
                    listed: Sequence[CloudNode] = provider.list_nodes()
                    events: Sequence[ProviderEvent] = provider.poll_errors()
                else:
                    seen = self._engine.gpr_observation()
                    if seen is None:
                        report.skipped = "waiting for the node engine's first observation of the provider"
                        return None
                    listed, events = seen
            except AuthenticationError as exc:
                self._provider_failed(exc)
            except ProviderError as exc:
                report.skipped = f"cannot list provider nodes: {exc}"
                report.errors.append(report.skipped)
                log.warning("%s; skipping this pass", report.skipped)
                return None
            else:
                observed = True
                for ev in events:
                    if ev.kind in (ProviderEventKind.LAUNCH_FAILED, ProviderEventKind.NODE_FAILED) and (
                        is_gpr_request_id(ev.request_id)
                    ):
                        self._failed[ev.request_id] = ev.message or str(ev.kind)
                util = dict(self._utilization()) if self._utilization is not None else {}
                by_name = {n.name: n for n in inv_nodes}
                last_word = self._ready_state(provider)
                for cn in listed:
                    if not is_gpr_request_id(cn.request_id) or cn.state in _LEFT:
                        continue
                    k8s = by_name.pop(cn.node_name, None)
                    if self._engine is not None and k8s is not None and k8s.gpr_id != gpr_id_of_request(cn.request_id):
                        by_name[cn.node_name] = k8s  # the engine gave it back to its pool: inventory now, not launched
                        continue
                    created.append(self._to_gpr_node(cn, k8s, util, last_word))
                inv_nodes = list(by_name.values())
        blocked = self._blocked if self.config.enable_dynamic_node else None
        if self.config.enable_dynamic_node and provider is None and blocked is None:
            blocked = "no cloud provider is configured"
        now = self.clock.now()
        return CapacityView(
            nodes=(*inv_nodes, *created),
            scale_up_blocked=blocked,
            failed_requests=dict(self._failed),
            observed_created=observed,
            unavailable=self.availability.unavailable_at(now),
        )

    def _ready_state(self, provider: Provider) -> CloudNodeState:
        """The provider state that means "up": READY, or RUNNING for a provider that never says READY (its
        capabilities, read once per provider; asked again next pass if they cannot be read)."""
        if self._last_word is None or self._last_word[0] is not provider:
            try:
                reports = provider.capabilities.reports_node_ready
            except ProviderError as exc:
                log.warning("cannot read the provider's capabilities: %s", exc)
                return CloudNodeState.READY
            self._last_word = (provider, CloudNodeState.READY if reports else CloudNodeState.RUNNING)
        return self._last_word[1]

    def _to_gpr_node(
        self, cn: CloudNode, k8s: GprNode | None, util: Mapping[str, float], up: CloudNodeState = CloudNodeState.READY
    ) -> GprNode:
        it = self._types.get(cn.instance_type)
        offer = it.cheapest() if it is not None else None
        name = cn.node_name or cn.node_id
        ready = cn.state in (CloudNodeState.READY, up) and (k8s is None or k8s.ready)
        return GprNode(
            name=name,
            instance_type=cn.instance_type,
            gpu_model=it.gpu_model if it is not None else None,
            gpu_count=it.gpu_count if it is not None else 0,
            gpu_memory_mib=it.gpu_memory_mib if it is not None else 0,
            ready=ready,
            gpr_id=cn.labels.get(GPR_LABEL) or gpr_id_of_request(cn.request_id),
            created=True,
            node_id=cn.node_id,
            request_id=cn.request_id,
            hourly_cost=offer.hourly_price if offer is not None else 0.0,
            gpu_utilization=util.get(name, k8s.gpu_utilization if k8s is not None else None),
        )
