"""The GPR simulation run: the driver on the virtual clock, per-GPR outcomes, the report and ``simulate-gpr``."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from gpuscale.core.gpr import (
    HOLDING_STATES,
    GprNode,
    GprState,
    GprValidationError,
    Trigger,
    gpr_id_of_request,
    parse_gpr_spec,
    priority_band,
)
from gpuscale.errors import InputError
from gpuscale.gpr.manager import GprManager, ReconcileReport, StaticInventory
from gpuscale.gpr.store import GprStore
from gpuscale.providers.base import CloudNodeState
from gpuscale.providers.capabilities import fit_catalog
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.engine import Engine, Timer
from gpuscale.sim.gpr.scenario import (
    BANDS,
    DEFAULT_SCENARIO,
    GprScenario,
    SimRequest,
    generate_requests,
    load_gpr_scenario,
    parse_gpr_scenario,
)


# ---------------------------------------------------------------------------------------------------- the run
@dataclass(slots=True)
class _Track:
    """What the driver knows about one GPR."""

    request: SimRequest
    band: str
    gpus_wanted: int
    created_at: float
    exit_s: float
    idle_timeout_s: float | None
    state: GprState = GprState.QUEUED
    state_since: float = 0.0
    idle_deadline: float | None = None
    first_ready: float | None = None
    active: bool = False
    held_since: float | None = None
    held_gpus: int = 0
    held_inventory_gpus: int = 0
    stopped_at: float | None = None
    held_gpu_s: float = 0.0
    held_inventory_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    idle_tail_gpu_s: float = 0.0
    """GPU-seconds held after the workload stopped using them (what an idle timeout bounds)."""
    last_trigger: str = ""
    timers: list[Timer] = field(default_factory=list)
    evictions: int = 0


class _Driver:
    def __init__(self, scenario: GprScenario) -> None:
        self.sc = scenario
        self.engine = Engine(start=0.0)
        self.cloud = SimCloud(self.engine, scenario.catalog, scenario.cloud, seed=scenario.seed)
        types = scenario.catalog.by_name()
        inv_nodes = [
            GprNode(
                name=f"inv-{name}-{i}",
                instance_type=name,
                gpu_model=types[name].gpu_model,
                gpu_count=types[name].gpu_count,
                gpu_memory_mib=types[name].gpu_memory_mib,
                gpu_utilization=0.0,
            )
            for name, count in scenario.inventory
            for i in range(count)
        ]
        self.inventory = StaticInventory(inv_nodes) if inv_nodes else None
        self.inv_gpus = {n.name: n.gpu_count for n in inv_nodes}
        self.store = GprStore(":memory:")
        self.manager = GprManager(
            self.store,
            fit_catalog(scenario.catalog, self.cloud.capabilities),
            config=scenario.manager,
            provider=self.cloud,
            inventory=self.inventory,
            utilization=self.utilization,
            clock=self.engine.clock,
        )
        self.tracks: dict[str, _Track] = {}
        self.types = types
        self.dirty = False
        self.reconciles = 0
        self.transitions: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.invalid = 0

    # -- workload model
    def utilization(self) -> dict[str, float]:
        busy = self.sc.requests.busy_utilization
        out: dict[str, float] = {}
        for n in self.cloud.alive():
            tr = self.tracks.get(gpr_id_of_request(n.request_id))
            out[n.node_name] = busy if tr is not None and tr.active else 0.0
        return out

    def arrive(self, i: int, req: SimRequest) -> None:
        now = self.engine.now()
        try:
            spec = parse_gpr_spec(req.spec, self.sc.catalog)
        except GprValidationError:
            self.invalid += 1
            return
        gpr = self.manager.submit(spec, gpr_id=f"gpr-{i:012x}")
        timeout = spec.idle_timeout_s if spec.enforce_idle_timeout else None
        self.tracks[gpr.gpr_id] = _Track(
            req, priority_band(spec.priority), spec.total_gpus, now, spec.exit_duration_s, timeout, state_since=now
        )
        self.dirty = True

    def stop_workload(self, gid: str) -> None:
        tr = self.tracks[gid]
        if tr.active:
            self._account(tr)
            tr.active = False
            tr.stopped_at = self.engine.now()
            self.dirty = True

    def release(self, gid: str) -> None:
        if self.manager.get(gid).state in HOLDING_STATES:
            self.manager.release(gid)
            self.dirty = True

    def sync_inventory(self) -> None:
        """Existing nodes report the GPU use of the workload of the GPR they are labelled for."""
        if self.inventory is None:
            return
        busy = self.sc.requests.busy_utilization
        for n in self.inventory.nodes():
            tr = self.tracks.get(n.gpr_id) if n.gpr_id else None
            value = busy if tr is not None and tr.active else 0.0
            if n.gpu_utilization != value:
                self.inventory.set_utilization(n.name, value)

    def _account(self, tr: _Track) -> None:
        """Close the accounting interval of a held GPR at now."""
        now = self.engine.now()
        if tr.held_since is None:
            return
        dt = now - tr.held_since
        tr.held_gpu_s += dt * tr.held_gpus
        tr.held_inventory_gpu_s += dt * tr.held_inventory_gpus
        if tr.active:
            tr.used_gpu_s += dt * tr.gpus_wanted
        elif tr.stopped_at is not None:
            tr.idle_tail_gpu_s += dt * tr.held_gpus
        tr.held_since = now

    # -- after a reconcile
    def observe(self, report: ReconcileReport) -> None:
        now = self.engine.now()
        for t in report.transitions:
            self.transitions[f"{t.from_state}->{t.to_state} ({t.trigger})"] += 1
            tr = self.tracks[t.gpr_id]
            tr.last_trigger = t.trigger.value
            tr.state = t.to_state
            tr.state_since = now
            tr.idle_deadline = None
            if t.trigger is Trigger.NODES_READY:
                self._provisioned(t.gpr_id, tr, now)
            elif t.from_state is GprState.PROVISIONED:
                self._account(tr)
                tr.held_since = None
                tr.active = False
            if t.to_state in (GprState.FAILED, GprState.EVICTED):
                self.failures[t.trigger.value] += 1
            if t.trigger is Trigger.EVICT:
                tr.evictions += 1
            if t.to_state not in HOLDING_STATES:
                for timer in tr.timers:
                    timer.cancel()
                tr.timers = []
        # The planner starts a GPR's idle clock at the first pass that sees all its nodes idle: this one.
        always_idle = self.sc.requests.busy_utilization <= self.sc.manager.idle_gpu_threshold
        for tr in self.tracks.values():
            watch = tr.state is GprState.PROVISIONED and tr.idle_timeout_s and tr.idle_deadline is None
            if watch and (not tr.active or always_idle) and tr.state_since < now:
                tr.idle_deadline = now + (tr.idle_timeout_s or 0.0)

    def _provisioned(self, gid: str, tr: _Track, now: float) -> None:
        g = self.manager.get(gid)
        cloud_gpus = {n.node_name: self.types[n.instance_type].gpu_count for n in self.cloud.alive()}
        tr.held_gpus = sum(cloud_gpus.get(x, self.inv_gpus.get(x, 0)) for x in g.status.node_list)
        tr.held_inventory_gpus = sum(self.inv_gpus.get(x, 0) for x in g.status.inventory_nodes)
        if tr.first_ready is None:
            tr.first_ready = now
        tr.held_since = now
        tr.active = True
        tr.stopped_at = None
        if tr.request.stops_after_s is not None:
            tr.timers.append(self.engine.after(tr.request.stops_after_s, self.stop_workload, gid))
        if tr.request.release_after_s is not None:
            tr.timers.append(self.engine.after(tr.request.release_after_s, self.release, gid))

    def cloud_signature(self) -> frozenset[tuple[str, bool]]:
        """The cloud changes the manager reacts to: nodes appearing, becoming ready, being deleted or dying."""
        return frozenset(
            (n.node_id, n.state is CloudNodeState.READY)
            for n in self.cloud.alive()
            if n.state is not CloudNodeState.DELETING
        )

    def next_deadline(self) -> float | None:
        """The earliest time the manager has something to do without any outside change."""
        now = self.engine.now()
        cfg = self.sc.manager
        due: list[float] = []
        queued = False
        for tr in self.tracks.values():
            if tr.state is GprState.QUEUED:
                queued = True
            elif tr.state is GprState.PROVISIONING:
                due.append(tr.state_since + cfg.provisioning_timeout_s)
            elif tr.state is GprState.PROVISIONED:
                due.append(tr.state_since + tr.exit_s)
                if tr.idle_deadline is not None:
                    due.append(tr.idle_deadline)
        if queued:
            # Queued GPRs are re-examined on a fixed grid of delay intervals, so that the delays of many GPRs are
            # counted in the same passes instead of one pass per GPR.
            step = cfg.delay_interval_s or self.sc.reconcile_interval_s
            due.append((math.floor(now / step) + 1) * step)
        due.extend(self.manager.unavailable_offerings.values())
        return min(due) if due else None

    # -- main loop
    def run(self, requests: Sequence[SimRequest]) -> None:
        end = self.sc.duration_s
        interval = self.sc.reconcile_interval_s
        for i, req in enumerate(requests, start=1):
            self.engine.at(req.at, self.arrive, i, req)
        seen: frozenset[tuple[str, bool]] = frozenset()
        last = -math.inf
        wake: float | None = None
        pending: float | None = None
        while True:
            cands = [x for x in (self.engine.peek(), wake, pending) if x is not None]
            if not cands:
                break
            t = min(cands)
            if t >= end:
                break
            self.engine.run_until(t)
            now = self.engine.now()
            sig = self.cloud_signature()
            if self.dirty or sig != seen:
                self.dirty = False
                seen = sig
                due = max(now, last + interval)
                pending = due if pending is None else min(pending, due)
            if (pending is not None and now >= pending) or (wake is not None and now >= wake):
                self.sync_inventory()
                report = self.manager.reconcile()
                self.reconciles += 1
                last = now
                self.observe(report)
                # Most planner decisions settle within a pass; labels put on existing nodes, a failed call, or a
                # failure recorded after the plan (a refused launch) are taken up by the next pass. Launched nodes
                # wake the loop through the cloud signature.
                again = (
                    report.assigned
                    or report.unassigned
                    or report.errors
                    or report.skipped
                    or any(t.to_state is GprState.FAILED for t in report.transitions)
                )
                pending = now + interval if again or self.dirty else None
                self.dirty = False
                nxt = self.next_deadline()
                wake = None if nxt is None else (nxt if nxt > now else now + interval)
        self.engine.run_until(end, inclusive=False)
        self.engine.clock.advance_to(end)
        for tr in self.tracks.values():
            self._account(tr)

    def outcomes(self) -> list[GprOutcome]:
        """Per-GPR results at the end of the run."""
        cost = dict.fromkeys(self.tracks, 0.0)
        for (pool, _), c in self.cloud.cost_by_pool_type(self.sc.duration_s).items():
            if pool in cost:
                cost[pool] += c
        out: list[GprOutcome] = []
        for g in self.manager.list_gprs():
            tr = self.tracks[g.gpr_id]
            out.append(
                GprOutcome(
                    gpr_id=g.gpr_id,
                    request_name=g.spec.request_name,
                    priority=g.spec.priority,
                    band=tr.band,
                    arrived_at=tr.created_at,
                    ready_at=tr.first_ready,
                    final_state=g.state.value,
                    last_trigger=g.status.last_trigger,
                    ended_at=g.status.completion_timestamp,
                    idle_timeout_s=g.spec.idle_timeout_s if g.spec.enforce_idle_timeout else None,
                    workload_stopped_at=tr.stopped_at,
                    held_gpus=tr.held_gpus,
                    held_gpu_hours=tr.held_gpu_s / 3600,
                    used_gpu_hours=tr.used_gpu_s / 3600,
                    idle_after_stop_gpu_hours=tr.idle_tail_gpu_s / 3600,
                    evictions=tr.evictions,
                    cost=cost[g.gpr_id],
                )
            )
        return out

    # -- report
    def report(self, wall_s: float) -> dict[str, Any]:
        end = self.sc.duration_s
        final = Counter(g.state.value for g in self.manager.list_gprs())
        released_idle = sum(
            1 for g in self.manager.list_gprs((GprState.RELEASED,)) if g.status.last_trigger == Trigger.IDLE_TIMEOUT
        )
        waits: dict[str, list[float]] = {b: [] for b in BANDS}
        unserved: Counter[str] = Counter()
        for tr in self.tracks.values():
            if tr.first_ready is not None:
                waits[tr.band].append(tr.first_ready - tr.created_at)
            else:
                unserved[tr.band] += 1
        all_waits = [w for b in BANDS for w in waits[b]]
        cost_by_pool = self.cloud.cost_by_pool_type(end)
        total_cost = self.cloud.total_cost(end)
        by_band = dict.fromkeys(BANDS, 0.0)
        unattributed = 0.0
        for (pool, _), c in cost_by_pool.items():
            owner = self.tracks.get(pool)
            if owner is None:
                unattributed += c
            else:
                by_band[owner.band] += c
        billed = self.cloud.gpu_hours_bought(end)
        held = sum(tr.held_gpu_s for tr in self.tracks.values()) / 3600
        held_inv = sum(tr.held_inventory_gpu_s for tr in self.tracks.values()) / 3600
        provisioned = billed + held_inv
        used = sum(tr.used_gpu_s for tr in self.tracks.values()) / 3600
        idle_tail = sum(tr.idle_tail_gpu_s for tr in self.tracks.values()) / 3600
        timeout_ids = [g for g, tr in self.tracks.items() if "idleTimeOutDuration" in tr.request.spec]
        return {
            "scenario": self.sc.name,
            "seed": self.sc.seed,
            "simulatedHours": round(end / 3600, 3),
            "wallSeconds": round(wall_s, 3),
            "reconciles": self.reconciles,
            "requests": {
                "submitted": len(self.tracks),
                "invalid": self.invalid,
                "byPriority": {b: sum(1 for tr in self.tracks.values() if tr.band == b) for b in BANDS},
                "served": sum(1 for tr in self.tracks.values() if tr.first_ready is not None),
                "completed": final.get(GprState.COMPLETE.value, 0),
                "released": final.get(GprState.RELEASED.value, 0),
                "releasedIdle": released_idle,
                "releasedEarly": final.get(GprState.RELEASED.value, 0) - released_idle,
                "evicted": final.get(GprState.EVICTED.value, 0),
                "evictions": sum(tr.evictions for tr in self.tracks.values()),
                "failed": final.get(GprState.FAILED.value, 0),
                "cancelled": final.get(GprState.CANCELLED.value, 0),
                "activeAtEnd": sum(final.get(s.value, 0) for s in (GprState.QUEUED, *HOLDING_STATES)),
                "finalStates": dict(sorted(final.items())),
                "failuresByTrigger": dict(sorted(self.failures.items())),
                "capacityFallbacks": sum(
                    1 for e in self.store.journal() if e.kind == "launch" and "after" in e.payload
                ),
            },
            "waitSeconds": {
                **{b: _stats(waits[b], unserved[b]) for b in BANDS},
                "all": _stats(all_waits, sum(unserved.values())),
            },
            "gpuHours": {
                "provisioned": round(provisioned, 3),
                "billed": round(billed, 3),
                "inventoryHeld": round(held_inv, 3),
                "held": round(held, 3),
                "used": round(used, 3),
                "idle": round(provisioned - used, 3),
                "idleWhileHeld": round(held - used, 3),
                "idleAfterWorkloadStopped": round(idle_tail, 3),
                "idleAfterStopWithTimeout": round(sum(self.tracks[g].idle_tail_gpu_s for g in timeout_ids) / 3600, 3),
                "utilization": round(used / provisioned, 4) if provisioned else 0.0,
            },
            "cost": {
                "total": round(total_cost, 4),
                "byPriority": {b: round(c, 4) for b, c in by_band.items()},
                "unattributed": round(unattributed, 4),
                "perUsedGpuHour": round(total_cost / used, 4) if used else None,
            },
            "transitions": dict(sorted(self.transitions.items())),
            "cloud": self.cloud.counters.as_dict(),
        }


def _stats(values: Sequence[float], unserved: int) -> dict[str, float | int | None]:
    if not values:
        return {"served": 0, "unserved": unserved, "p50": None, "p95": None, "max": None, "mean": None}
    xs = sorted(values)

    def pct(q: float) -> float:
        k = (len(xs) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {
        "served": len(xs),
        "unserved": unserved,
        "p50": round(pct(0.5), 1),
        "p95": round(pct(0.95), 1),
        "max": round(xs[-1], 1),
        "mean": round(sum(xs) / len(xs), 1),
    }


@dataclass(frozen=True, slots=True)
class GprOutcome:
    """What happened to one simulated GPR (times in virtual seconds from the start of the run)."""

    gpr_id: str
    request_name: str
    priority: int
    band: str
    arrived_at: float
    ready_at: float | None
    """When its nodes were first ready (None: never served)."""
    final_state: str
    last_trigger: str
    ended_at: float | None
    idle_timeout_s: int | None
    """The enforced idle timeout, if any."""
    workload_stopped_at: float | None
    """When its workload last stopped using the GPUs before the GPR ended (None: it never did)."""
    held_gpus: int
    held_gpu_hours: float
    used_gpu_hours: float
    idle_after_stop_gpu_hours: float
    evictions: int
    cost: float
    """Cost of its launched nodes from the simulated cloud's accounting."""


@dataclass
class GprSimResult:
    """A finished GPR simulation: the report, per-GPR outcomes and the simulated cloud (for its accounting)."""

    scenario: GprScenario
    report: dict[str, Any]
    outcomes: list[GprOutcome]
    cloud: SimCloud


def simulate_gprs(scenario: GprScenario) -> GprSimResult:
    """Run ``scenario`` and keep everything a test or a notebook may want to look at."""
    wall0 = time.perf_counter()
    driver = _Driver(scenario)
    try:
        driver.run(generate_requests(scenario))
        outcomes = driver.outcomes()
        report = driver.report(time.perf_counter() - wall0)
    finally:
        driver.store.close()
    return GprSimResult(scenario, report, outcomes, driver.cloud)


def run_gpr_simulation(config: GprScenario | Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """Run a GPR scenario (a :class:`GprScenario`, a scenario mapping, or a YAML path) and return the report."""
    if isinstance(config, GprScenario):
        scenario = config
    elif isinstance(config, Mapping):
        scenario = parse_gpr_scenario(config)
    else:
        scenario = load_gpr_scenario(config)
    return simulate_gprs(scenario).report


def format_gpr_report(report: Mapping[str, Any]) -> str:
    """A human-readable summary of :func:`run_gpr_simulation`'s report."""
    r, g, c = report["requests"], report["gpuHours"], report["cost"]

    def dur(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x / 3600:.1f}h" if x >= 5400 else f"{x / 60:.1f}m" if x >= 90 else f"{x:.0f}s"

    lines = [
        f"GPR simulation {report['scenario']} (seed {report['seed']}): {report['simulatedHours']:.0f} simulated hours "
        f"in {report['wallSeconds']:.1f}s wall, {report['reconciles']} reconciles",
        f"requests: {r['submitted']} submitted, {r['served']} served; {r['completed']} completed, {r['released']} "
        f"released ({r['releasedEarly']} early, {r['releasedIdle']} idle timeout), {r['evicted']} evicted "
        f"({r['evictions']} evictions), {r['failed']} failed, {r['activeAtEnd']} still active at the end",
        "wait time until nodes ready:",
    ]
    for band in (*BANDS, "all"):
        s = report["waitSeconds"][band]
        lines.append(
            f"  {band:<7} served {s['served']:>4}  unserved {s['unserved']:>3}  p50 {dur(s['p50']):>7}  "
            f"p95 {dur(s['p95']):>7}  max {dur(s['max']):>7}"
        )
    lines += [
        f"GPU-hours: provisioned {g['provisioned']:.1f} (billed {g['billed']:.1f} + existing nodes "
        f"{g['inventoryHeld']:.1f}), used {g['used']:.1f} ({g['utilization']:.1%}), idle {g['idle']:.1f}: "
        f"{g['idleWhileHeld']:.1f} while held, {g['idleAfterWorkloadStopped']:.1f} after workloads stopped "
        f"({g['idleAfterStopWithTimeout']:.1f} under an idle timeout)",
        f"cost: ${c['total']:.2f} (low ${c['byPriority']['low']:.2f}, medium ${c['byPriority']['medium']:.2f}, "
        f"high ${c['byPriority']['high']:.2f})"
        + (f", ${c['perUsedGpuHour']:.2f} per used GPU-hour" if c["perUsedGpuHour"] else ""),
    ]
    if r["failuresByTrigger"]:
        lines.append("failures and evictions: " + ", ".join(f"{k} x{n}" for k, n in r["failuresByTrigger"].items()))
    if r["capacityFallbacks"]:
        lines.append(f"launches moved to another offering after insufficient capacity: {r['capacityFallbacks']}")
    return "\n".join(lines)


@click.command("simulate-gpr")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False))
@click.option("--seed", type=int, help="Override the scenario's seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def gpr_sim_command(scenario: str | None, seed: int | None, as_json: bool) -> None:
    """Simulate GPU Provisioning Requests (default: the shipped examples/gpr-scenario.yaml)."""
    from dataclasses import replace

    try:
        path = Path(scenario) if scenario else DEFAULT_SCENARIO
        if not path.is_file():
            raise InputError(
                "scenario file not found", where=str(path), fix="give a GPR scenario YAML (see docs/gpr.md)"
            )
        sc = load_gpr_scenario(path)
        if seed is not None:
            sc = replace(sc, seed=seed)
        report = run_gpr_simulation(sc)
    except InputError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(json.dumps(report, indent=2) if as_json else format_gpr_report(report))
