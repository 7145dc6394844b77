"""The simulation driver: wires engine, cloud, cluster and a controller, delivers the workload and reconciles.

The controller is any object with ``reconcile() -> None``, built by ``controller_factory`` with the keyword
arguments ``backend`` (the :class:`SimCluster`), ``provider`` (the :class:`SimCloud`), ``pools``, ``catalog``,
``clock`` (the virtual clock) and ``config`` (the scenario's ``policy`` mapping). It may also define
``next_wakeup() -> float | None``: the virtual time of its next timer (batch window closing, ``consolidateAfter``
expiring, a deadline, a back-off). Then the driver reconciles when the cluster changed or the provider has events
(at most once per ``reconcile_interval_s``; other cloud state is polled, see ``RunnerConfig.cloud_poll_s``) or a
timer is due (on time), and an idle month costs nothing. A wakeup already
in the past is honoured at the next interval (the controller says it is overdue), so a controller that keeps
returning one is polled every interval. Without ``next_wakeup`` the driver keeps reconciling every interval for
``settle_s`` after each change, then backs off exponentially while pods are pending.

A controller that raises :class:`ControllerCrash` from ``reconcile`` (crash-safety tests raise it from wrappers
around the cloud and the cluster) is thrown away and rebuilt by the factory from the cluster and cloud state alone.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuscale.core.model import Catalog, NodePool
from gpuscale.providers.capabilities import fit_catalog
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine
from gpuscale.sim.report import TimeSeries, build_report
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.workloads import Arrival

DEFAULT_TAIL_S = 3600.0
"""Without a scenario duration, the run ends this long after the last pod would have finished."""


class Controller(Protocol):
    """What the driver needs from a controller."""

    def reconcile(self) -> None: ...


ControllerFactory = Callable[..., Controller]


class ControllerCrash(Exception):
    """Raised (by a test hook) to simulate the controller process dying in the middle of a reconcile."""


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """Driver knobs; None takes the scenario's ``policy.reconcileInterval`` / ``policy.settle``.

    Reconciles caused by a change are at least ``reconcile_interval_s`` apart; a controller's future timer is
    honoured on time, at least ``min_spacing_s`` after the previous reconcile. ``settle_s`` None derives it from the
    pools (longest finite ``consolidateAfter`` or ``consolidateEmptyAfter`` + 3 intervals).
    """

    reconcile_interval_s: float | None = None
    min_spacing_s: float = 1.0
    settle_s: float | None = None
    max_idle_interval_s: float = 3600.0
    cloud_poll_s: float = 60.0
    """Cloud state changes that are not provider events (a node became running, a deleted node is gone) are seen at
    the next reconcile, at most this long later, as a controller polling the cloud API would see them."""
    record_series: bool = True


@dataclass
class SimResult:
    """Everything a finished run leaves behind."""

    scenario: Scenario
    engine: Engine
    cloud: SimCloud
    cluster: SimCluster
    controller: Controller
    report: dict[str, Any]
    series: TimeSeries
    reconciles: int = 0
    restarts: int = 0
    wall_s: float = 0.0
    arrivals: int = 0
    reconcile_times: list[float] = field(default_factory=list)


def build_world(scenario: Scenario) -> tuple[Engine, SimCloud, SimCluster]:
    """Engine, cloud and cluster of a scenario, wired together (no workload, no controller)."""
    engine = Engine()
    cluster = SimCluster(
        engine, scenario.catalog, scenario.pools, scenario.cluster, seed=scenario.seed, pdbs=scenario.pdbs
    )
    cloud = SimCloud(engine, scenario.catalog, scenario.cloud, seed=scenario.seed, listener=cluster)
    cluster.spot_notices = cloud.spot_notices
    return engine, cloud, cluster


def _make_controller(
    factory: ControllerFactory,
    cluster: SimCluster,
    cloud: SimCloud,
    pools: Sequence[NodePool],
    catalog: Catalog,
    engine: Engine,
    config: Mapping[str, Any],
) -> Controller:
    catalog = fit_catalog(catalog, cloud.capabilities)  # spot and zones as the cloud offers them
    return factory(
        backend=cluster, provider=cloud, pools=tuple(pools), catalog=catalog, clock=engine.clock, config=config
    )


FULL_COLLECTION_EVERY = 1000
"""During a run, the cyclic garbage collector's oldest generation is collected after this many collections of the
middle one (Python's default is 10)."""


@contextmanager
def _static_heap() -> Iterator[None]:
    """Leave the objects alive before a run (the parsed workload, the catalog, the modules) out of the cyclic garbage
    collector's full passes until the run ends (``gc.freeze``): they outlive the run, and a long run would otherwise
    go through all of them at every full collection. Full passes are also rarer during the run
    (:data:`FULL_COLLECTION_EVERY`): what a run keeps (events, samples, claims) lives until its end, and its cyclic
    garbage (caught exceptions and their frames) dies young, in the collections that still run as usual (the openb
    replay made 4 full passes, 0.13 s CPU, more than its 532 other collections took together). Nothing is changed when
    someone else froze objects already."""
    if gc.get_freeze_count():
        yield
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], FULL_COLLECTION_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def run_simulation(
    scenario: Scenario,
    controller_factory: ControllerFactory,
    *,
    config: RunnerConfig | None = None,
    progress: Callable[[float], None] | None = None,
    arrivals: Sequence[Arrival] | None = None,
    policy_name: str | None = None,
) -> SimResult:
    """Run ``scenario`` under the controller built by ``controller_factory`` (see the module docstring).

    ``arrivals`` overrides the scenario's workload (e.g. to share one parsed trace between policies). ``progress``
    is called with the fraction of virtual time done (0..1), at most about 200 times.
    """
    with _static_heap():
        return _run(scenario, controller_factory, config, progress, arrivals, policy_name)


def _run(
    scenario: Scenario,
    controller_factory: ControllerFactory,
    config: RunnerConfig | None,
    progress: Callable[[float], None] | None,
    arrivals: Sequence[Arrival] | None,
    policy_name: str | None,
) -> SimResult:
    cfg = config or RunnerConfig()
    wall0 = time.perf_counter()
    engine, cloud, cluster = build_world(scenario)
    work = list(arrivals) if arrivals is not None else scenario.arrivals()
    end = scenario.duration_s
    if end is None:
        last = max((max(a.at + a.duration, a.deadline or 0.0) for a in work), default=0.0)
        end = last + DEFAULT_TAIL_S
    interval = max(
        1e-6, cfg.reconcile_interval_s if cfg.reconcile_interval_s is not None else scenario.reconcile_interval_s
    )
    spacing = min(interval, cfg.min_spacing_s)
    settle = cfg.settle_s if cfg.settle_s is not None else scenario.settle_s
    if settle is None:
        waits = [w for p in scenario.pools for w in (p.disruption.wait_s(False), p.disruption.wait_s(True))]
        settle = max((w for w in waits if math.isfinite(w)), default=0.0) + 3 * interval

    # arrivals are fed one at a time, so the heap stays small
    feed = iter(work)

    def deliver(a: Arrival) -> None:
        cluster.add_pod(a.pod, a.duration, deadline=a.deadline, gpu_util=a.gpu_util)
        nxt = next(feed, None)
        if nxt is not None:
            engine.at(nxt.at, deliver, nxt)

    first = next(feed, None)
    if first is not None:
        engine.at(first.at, deliver, first)

    controller = _make_controller(
        controller_factory, cluster, cloud, scenario.pools, scenario.catalog, engine, scenario.policy
    )
    gprs = None
    if scenario.gprs:  # GPRs beside the pods, through the same controller when it takes them
        from gpuscale.sim.gpr.mixed import GprSide

        gprs = GprSide(scenario.gprs, engine, cloud, cluster, scenario.catalog, controller)
    series = TimeSeries()
    reconciles = restarts = 0
    reconcile_times: list[float] = []
    last_reconcile = -math.inf
    seen_cluster = seen_cloud = -1  # the cluster's and the cloud's versions last seen
    last_change = 0.0
    next_reconcile: float | None = 0.0
    idle_step = interval
    next_progress = 0.0

    clock = engine.clock  # its time read as clock._now, once per step (as Engine.run_until reads it)
    record_series = cfg.record_series
    wake_owner: object = None
    wake_fn: Callable[[], float | None] | None = None
    while True:
        now = clock._now
        if now >= end:
            break
        if controller is not wake_owner:  # looked up once per controller (a crashed one is rebuilt)
            wake_owner, wake_fn = controller, getattr(controller, "next_wakeup", None)
        t_next = engine.peek()
        wake = wake_fn() if wake_fn is not None else None
        if gprs is not None and (g_wake := gprs.next_wakeup()) is not None:
            wake = g_wake if wake is None else min(wake, g_wake)
        if wake is not None:
            if wake > last_reconcile:  # a future timer: honoured on time (but not more often than min_spacing_s)
                wake = max(wake, last_reconcile + spacing, now)
            else:  # overdue: polled at the reconcile interval
                wake = max(last_reconcile + interval, now)
            t_next = wake if t_next is None or wake < t_next else t_next
        if next_reconcile is not None and (t_next is None or next_reconcile < t_next):
            t_next = next_reconcile
        if t_next is None:  # no event, no reconcile, no timer
            break
        engine.run_until(t_next if t_next < end else end)
        now = clock._now
        if cluster.version != seen_cluster or cloud.version != seen_cloud:
            watched = cluster.version != seen_cluster or cloud.has_events()
            seen_cluster, seen_cloud = cluster.version, cloud.version
            last_change = now
            idle_step = interval
            if record_series:
                series.record(now, cloud, cluster)
            # cluster changes and provider events wake the controller (watches); other cloud state is polled
            due = max(now, last_reconcile + (interval if watched else max(interval, cfg.cloud_poll_s)))
            next_reconcile = due if next_reconcile is None else min(next_reconcile, due)
        reconcile_now = (next_reconcile is not None and now >= next_reconcile) or (wake is not None and now >= wake)
        if reconcile_now and now < end:
            try:
                if gprs is not None:
                    gprs.reconcile()
                controller.reconcile()
                if gprs is not None:
                    gprs.after_controller()
            except ControllerCrash:
                restarts += 1
                crashed = True
                controller = _make_controller(
                    controller_factory, cluster, cloud, scenario.pools, scenario.catalog, engine, scenario.policy
                )
                if gprs is not None:
                    gprs.attach(controller)
            else:
                crashed = False
            reconciles += 1
            reconcile_times.append(now)
            last_reconcile = now
            next_reconcile = now + interval if crashed else None
            if cluster.version != seen_cluster or cloud.version != seen_cloud:
                seen_cluster, seen_cloud = cluster.version, cloud.version
                last_change = now
                if record_series:
                    series.record(now, cloud, cluster)
                if wake_fn is None or crashed:
                    # a controller without timers gets a follow-up look at what its own actions changed; one with
                    # timers already said when it next has work, and later consequences arrive as events
                    next_reconcile = now + interval
            elif wake_fn is None:
                if now - last_change < settle:
                    next_reconcile = now + interval
                elif cluster.pending_count():
                    idle_step = min(idle_step * 2, cfg.max_idle_interval_s)
                    next_reconcile = now + idle_step
        if progress is not None and now >= next_progress:
            progress(min(1.0, now / end) if end > 0 else 1.0)
            next_progress = now + end / 200
    engine.run_until(end, inclusive=False)
    engine.clock.advance_to(end)
    if cfg.record_series:
        series.record(end, cloud, cluster, force=True)
    if progress is not None:
        progress(1.0)
    wall = time.perf_counter() - wall0
    name = policy_name or str(scenario.policy.get("name", ""))
    report = build_report(
        cloud,
        cluster,
        scenario=scenario.name,
        policy=name,
        seed=scenario.seed,
        now=end,
        wall_s=wall,
        reconciles=reconciles,
        restarts=restarts,
    )
    if gprs is not None:
        report.update(gprs.report())
    return SimResult(
        scenario=scenario,
        engine=engine,
        cloud=cloud,
        cluster=cluster,
        controller=controller,
        report=report,
        series=series,
        reconciles=reconciles,
        restarts=restarts,
        wall_s=wall,
        arrivals=len(work),
        reconcile_times=reconcile_times,
    )
