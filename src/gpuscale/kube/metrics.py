"""The controller's Prometheus metrics (names and labels from :data:`gpuscale.metrics.names.CONTROLLER`).

Each round the controller process calls :meth:`ControllerMetrics.observe` with what it already holds: the claim
table, the pods it sees, the GPRs and the round's :class:`~gpuscale.controller.loop.ReconcileResult`.
:func:`measure` turns that into a :class:`Measurement` (a pure function: gauges of the moment, and the launches and
failures that happened since the last round, found from the claims' transition histories); ``observe`` sets the
gauges and adds to the counters. ``/metrics`` serves :attr:`ControllerMetrics.registry`
(:mod:`gpuscale.kube.health`).

* ``gpuscale_nodes`` / ``gpuscale_gpus`` {pool, state}: node claims and their GPUs by phase;
* ``gpuscale_pending_gpu_pods``: pods waiting for a node that ask for GPUs;
* ``gpuscale_launches_total`` {pool}; ``gpuscale_launch_failures_total`` {pool, reason}: the claim event that failed
  it (``LaunchFailed``, ``LaunchTimeout``, ``RegistrationTimeout``, ``GpuInitTimeout``);
* ``gpuscale_decisions_total`` {kind}: ``launch``, ``disrupt``, ``evict``, ``delete`` and ``plan`` per round;
* ``gpuscale_hourly_cost_dollars`` {pool}: what the pool's nodes cost per hour (nodes that exist at the provider);
* ``gpuscale_gpr_queue_length``; ``gpuscale_gpr_wait_seconds``: a histogram of how long each GPR queued, observed
  when it leaves the queue;
* ``gpuscale_reconcile_seconds``: a histogram of round durations;
* ``gpuscale_scaler_desired_replicas`` / ``gpuscale_scaler_current_replicas`` {namespace, scaler}: each
  GPUWorkloadScaler's target replicas (after its budget) and its target's replicas when polled;
  ``gpuscale_budget_granted_gpus`` {namespace, budget, model}: GPUs each GPUBudget grants a model
  (:meth:`ControllerMetrics.observe_scalers`, from :class:`gpuscale.kube.scalers.ScalerReconciler`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuscale.core.model import Pod
from gpuscale.core.nodeclaim import ClaimEvent, ClaimPhase, NodeClaim
from gpuscale.metrics.names import CONTROLLER

__all__ = ["ControllerMetrics", "Measurement", "QueuedGpr", "RoundResult", "measure"]

COSTING = frozenset(
    {ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED, ClaimPhase.INITIALIZED, ClaimPhase.DRAINING, ClaimPhase.DELETING}
)
"""Phases whose node exists at the provider and is billed (a Failed claim is billed while it still has a node)."""
FAILURE_EVENTS = frozenset(
    {ClaimEvent.LAUNCH_FAILED, ClaimEvent.LAUNCH_TIMEOUT, ClaimEvent.REGISTRATION_TIMEOUT, ClaimEvent.GPU_INIT_TIMEOUT}
)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
ROUND_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class RoundResult(Protocol):
    """What :class:`~gpuscale.controller.loop.ReconcileResult` says about a round (the counted fields)."""

    planned: bool
    launched: int
    disrupted: int
    evicted: int
    deleted: int


@dataclass(frozen=True, slots=True)
class QueuedGpr:
    """A GPR as the metrics see it: its id, whether it is queued, and since when (epoch seconds)."""

    gpr_id: str
    queued: bool
    since: float


@dataclass(frozen=True, slots=True)
class Measurement:
    """One round's metric values. Gauges are of the moment; ``launches`` and ``failures`` are since the last round."""

    nodes: Mapping[tuple[str, str], int]
    gpus: Mapping[tuple[str, str], int]
    hourly_cost: Mapping[str, float]
    pending_gpu_pods: int
    launches: Mapping[str, int]
    failures: Mapping[tuple[str, str], int]
    counted: frozenset[str]
    """Request ids whose launch or failure has been counted (pass it back in next round)."""
    gpr_queue: int
    gpr_waits: tuple[float, ...]
    """Queueing times of the GPRs that left the queue since the last round."""
    queued: Mapping[str, float] = field(default_factory=dict)
    """Queued GPR id -> queued since (pass it back in next round)."""


def measure(
    claims: Iterable[NodeClaim],
    pods: Iterable[Pod],
    gprs: Iterable[QueuedGpr],
    now: float,
    *,
    counted: frozenset[str] = frozenset(),
    queued: Mapping[str, float] | None = None,
) -> Measurement:
    """The metric values of one round (pure). ``counted`` and ``queued`` come from the previous Measurement."""
    nodes: dict[tuple[str, str], int] = {}
    gpus: dict[tuple[str, str], int] = {}
    cost: dict[str, float] = {}
    launches: dict[str, int] = {}
    failures: dict[tuple[str, str], int] = {}
    seen: set[str] = set()
    for c in claims:
        if c.phase is not ClaimPhase.GONE:
            key = (c.pool, str(c.phase))
            nodes[key] = nodes.get(key, 0) + 1
            gpus[key] = gpus.get(key, 0) + c.expected.gpus
            cost.setdefault(c.pool, 0.0)
            if c.phase in COSTING or (c.phase is ClaimPhase.FAILED and c.node_id):
                cost[c.pool] += c.hourly_price
        for step in c.history:  # a claim launched and gone between two rounds still counts
            if step.event is ClaimEvent.LAUNCHED:
                mark = f"{c.request_id}/launched"
                seen.add(mark)
                if mark not in counted:
                    launches[c.pool] = launches.get(c.pool, 0) + 1
            elif step.event in FAILURE_EVENTS:
                mark = f"{c.request_id}/failed"
                seen.add(mark)
                if mark not in counted:
                    fk = (c.pool, str(step.event))
                    failures[fk] = failures.get(fk, 0) + 1
    pending = sum(1 for p in pods if p.pending and (p.request.gpus > 0 or p.request.gpu_milli > 0))
    before = dict(queued or {})
    now_queued = {g.gpr_id: g.since for g in gprs if g.queued}
    waits = tuple(max(0.0, now - since) for gid, since in before.items() if gid not in now_queued)
    return Measurement(
        nodes=nodes,
        gpus=gpus,
        hourly_cost=cost,
        pending_gpu_pods=pending,
        launches=launches,
        failures=failures,
        counted=frozenset(seen),
        gpr_queue=len(now_queued),
        gpr_waits=waits,
        queued=now_queued,
    )


class ControllerMetrics:
    """The controller's metrics in their own registry (nothing global, so tests and processes do not collide)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def h(name: str) -> str:
            return CONTROLLER.get(name, name)

        self.nodes = Gauge("gpuscale_nodes", h("gpuscale_nodes"), ["pool", "state"], registry=r)
        self.gpus = Gauge("gpuscale_gpus", h("gpuscale_gpus"), ["pool", "state"], registry=r)
        self.pending = Gauge("gpuscale_pending_gpu_pods", h("gpuscale_pending_gpu_pods"), registry=r)
        self.launches = Counter("gpuscale_launches", h("gpuscale_launches_total"), ["pool"], registry=r)
        self.failures = Counter(
            "gpuscale_launch_failures", h("gpuscale_launch_failures_total"), ["pool", "reason"], registry=r
        )
        self.decisions = Counter("gpuscale_decisions", h("gpuscale_decisions_total"), ["kind"], registry=r)
        self.cost = Gauge("gpuscale_hourly_cost_dollars", h("gpuscale_hourly_cost_dollars"), ["pool"], registry=r)
        self.gpr_queue = Gauge("gpuscale_gpr_queue_length", h("gpuscale_gpr_queue_length"), registry=r)
        self.gpr_wait = Histogram(
            "gpuscale_gpr_wait_seconds", h("gpuscale_gpr_wait_seconds"), buckets=WAIT_BUCKETS, registry=r
        )
        self.round_seconds = Histogram(
            "gpuscale_reconcile_seconds", "Duration of a reconcile round.", buckets=ROUND_BUCKETS, registry=r
        )
        scaler = ["namespace", "scaler"]
        self.scaler_desired = Gauge("gpuscale_scaler_desired_replicas", h("gpuscale_scaler_desired_replicas"),
                                    scaler, registry=r)  # fmt: skip
        self.scaler_current = Gauge("gpuscale_scaler_current_replicas", h("gpuscale_scaler_current_replicas"),
                                    scaler, registry=r)  # fmt: skip
        self.budget_granted = Gauge("gpuscale_budget_granted_gpus", h("gpuscale_budget_granted_gpus"),
                                    ["namespace", "budget", "model"], registry=r)  # fmt: skip
        self._last: Measurement | None = None
        self._series: dict[str, set[tuple[str, ...]]] = {
            "nodes": set(), "gpus": set(), "cost": set(), "desired": set(), "current": set(), "granted": set(),
        }  # fmt: skip

    def observe_scalers(
        self,
        replicas: Mapping[tuple[str, str], tuple[int, int]],
        granted_gpus: Mapping[tuple[str, str, str], int],
    ) -> None:
        """Set the scaler and budget gauges: (namespace, scaler) -> (desired, current) and (namespace, budget,
        model) -> GPUs granted. Scalers and grants no longer present lose their series."""
        self._set(self.scaler_desired, "desired", {k: float(d) for k, (d, _) in replicas.items()})
        self._set(self.scaler_current, "current", {k: float(c) for k, (_, c) in replicas.items()})
        self._set(self.budget_granted, "granted", {k: float(v) for k, v in granted_gpus.items()})

    def observe(
        self,
        claims: Iterable[NodeClaim],
        pods: Iterable[Pod],
        now: float,
        *,
        gprs: Iterable[QueuedGpr] = (),
        result: RoundResult | None = None,
        round_seconds: float | None = None,
    ) -> Measurement:
        """Update every metric from one round; returns the measurement."""
        last = self._last
        m = measure(
            claims,
            pods,
            gprs,
            now,
            counted=last.counted if last else frozenset(),
            queued=last.queued if last else None,
        )
        self._set(self.nodes, "nodes", {k: float(v) for k, v in m.nodes.items()})
        self._set(self.gpus, "gpus", {k: float(v) for k, v in m.gpus.items()})
        self._set(self.cost, "cost", {(pool,): v for pool, v in m.hourly_cost.items()})
        self.pending.set(m.pending_gpu_pods)
        for pool, n in m.launches.items():
            self.launches.labels(pool).inc(n)
        for (pool, reason), n in m.failures.items():
            self.failures.labels(pool, reason).inc(n)
        self.gpr_queue.set(m.gpr_queue)
        for wait in m.gpr_waits:
            self.gpr_wait.observe(wait)
        if result is not None:
            counts = {
                "plan": int(result.planned),
                "launch": result.launched,
                "disrupt": result.disrupted,
                "evict": result.evicted,
                "delete": result.deleted,
            }
            for kind, n in counts.items():
                if n:
                    self.decisions.labels(kind).inc(n)
        if round_seconds is not None:
            self.round_seconds.observe(round_seconds)
        self._last = m
        return m

    def _set(self, gauge: Gauge, name: str, values: Mapping[tuple[str, ...], float]) -> None:
        """Set a labelled gauge to exactly ``values``: series that disappeared are removed, not left stale."""
        for labels in self._series[name] - set(values):
            gauge.remove(*labels)
        for labels, v in values.items():
            gauge.labels(*labels).set(v)
        self._series[name] = set(values)
