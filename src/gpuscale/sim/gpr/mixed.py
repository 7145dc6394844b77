"""GPRs beside pods in one simulation: a scenario's ``gprs`` section, run by ``gpuscale simulate`` and ``compare``.

The section lists GPU Provisioning Requests submitted at given times::

    gprs:
      - at: 20m                     # submitted 20 minutes in
        releaseAfter: 1h            # optional: early release this long after it is provisioned
        workload: false             # optional: no workload pods (the reservation stays idle); default true
        repeat: 3                   # optional: this many requests, ``every`` apart (default 1)
        every: 30m
        spec: {requestName: train, gpuShape: RTX4000-Ada, numberOfGPUs: 1, numberOfGPUNodes: 2, exitDuration: 8h}

:class:`GprSide` runs a :class:`~gpuscale.gpr.manager.GprManager` (SQLite in a temporary directory) on the
simulated cloud. When the node controller can take GPR demand (:meth:`launch_gpr_nodes`, the gpuscale controller)
the manager's engine is that controller: one claim table, availability record and node lifecycle for both; the
controller's free nodes are the manager's inventory (borrowed before launching) and a released GPR's launched nodes
return to their pool or are deleted, per its ``releasePolicy``. A controller without that method runs beside a
manager that launches by itself, and leaves its nodes alone.

Once a GPR is provisioned its workload (unless ``workload: false``) arrives: one pod per node, asking for the GPR's
GPUs per node, labelled to match its ``workloadSelector``, tolerating its taint and selecting its nodes; the pods
leave when the GPR is released or expires (before its nodes are drained).

Figures added to the report: ``gprs`` (per request: id, name, state, wait to provisioned, the reason it is not
provisioned), ``gprsProvisioned``, ``gprsNotProvisioned``, ``gprWaitP50s`` / ``gprWaitMaxS`` (submitted to
provisioned, over those provisioned), ``gprNodesDisrupted``: distinct nodes of a GPR that holds them which the
node controller consolidated, drained, deleted or evicted pods from, ``gprNodesBorrowed``: free nodes a GPR borrowed
instead of launching one, and ``podsOnGprNodesOutsideGpr``: pods seen
bound to a held GPR node that are not that GPR's workload (0 is the target of both). ``podsArrived`` and the other
pod figures include the GPR workloads' pods.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuscale.core.gpr import (
    GPR_LABEL,
    GprState,
    GprValidationError,
    gpr_id_of_request,
    gpr_toleration,
    is_gpr_request_id,
    parse_gpr_spec,
)
from gpuscale.core.gpr.spec import GprSpec
from gpuscale.core.model import Catalog, Pod
from gpuscale.core.resources import Request
from gpuscale.gpr.manager import GprManager, NodeEngine
from gpuscale.gpr.store import GprStore
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine

ENTRY_FIELDS = ("at", "releaseAfter", "repeat", "every", "workload", "spec")
DISRUPTIVE = frozenset({"Consolidate", "Drain", "NodeDelete", "Evict"})
"""Event kinds by which the node controller takes a node (or its pods) away."""
_HOLDING = (GprState.PROVISIONING, GprState.PROVISIONED)
MAX_GPRS = 10_000


class _Validator(Protocol):  # the scenario loader's validator (gpuscale.sim.scenario_fields.FieldReader)
    def fail(self, path: str, message: str, value: object = None, fix: str = "") -> Exception: ...
    def mapping(self, value: object, path: str, allowed: Sequence[str]) -> dict[str, Any]: ...
    def listing(self, value: object, path: str) -> list[Any]: ...
    def integer(self, value: object, path: str, *, minimum: int = 0, maximum: int = ...) -> int: ...
    def duration(self, value: object, path: str) -> float: ...
    def boolean(self, value: object, path: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class GprArrival:
    """One GPR submitted at ``at``; released ``release_after_s`` after it is provisioned (None: at its exit)."""

    at: float
    spec: GprSpec
    release_after_s: float | None = None
    workload: bool = True


def parse_gprs(v: _Validator, raw: object, catalog: Catalog) -> tuple[GprArrival, ...]:
    """The ``gprs`` section; errors name the entry and field."""
    out: list[GprArrival] = []
    for i, item in enumerate(v.listing(raw, "gprs")):
        path = f"gprs[{i}]"
        e = v.mapping(item, path, ENTRY_FIELDS)
        if e.get("spec") is None:
            raise v.fail(f"{path}.spec", "is required", fix="give the GPR spec (requestName, gpuShape, ...)")
        try:
            spec = parse_gpr_spec(e["spec"], catalog)
        except GprValidationError as exc:
            first = exc.errors[0]
            raise v.fail(f"{path}.spec.{first.field}", first.message) from None
        at = v.duration(e.get("at", 0), f"{path}.at")
        release = v.duration(e["releaseAfter"], f"{path}.releaseAfter") if e.get("releaseAfter") is not None else None
        repeat = v.integer(e.get("repeat", 1), f"{path}.repeat", minimum=1, maximum=MAX_GPRS)
        every = v.duration(e.get("every", 0), f"{path}.every")
        if repeat > 1 and every <= 0:
            raise v.fail(f"{path}.every", "must be positive when repeat > 1", e.get("every"))
        work = v.boolean(e.get("workload", True), f"{path}.workload")
        out += [GprArrival(at + k * every, spec, release, work) for k in range(repeat)]
        if len(out) > MAX_GPRS:
            raise v.fail("gprs", f"at most {MAX_GPRS:,} GPRs", len(out))
    out.sort(key=lambda a: a.at)
    return tuple(out)


class GprSide:
    """The GPR manager of one simulation run (see the module docstring)."""

    def __init__(
        self,
        arrivals: Sequence[GprArrival],
        engine: Engine,
        cloud: SimCloud,
        cluster: SimCluster,
        catalog: Catalog,
        controller: object,
    ) -> None:
        self.engine = engine
        self.cloud = cloud
        self.cluster = cluster
        self.catalog = catalog
        self._dir = tempfile.TemporaryDirectory(prefix="gpuscale-gprs-")
        self._db = Path(self._dir.name) / "gpr.db"
        self.manager = self._manager(controller)
        self._submitted: dict[str, tuple[float, str]] = {}
        """GPR id -> (submitted at, request name)."""
        self._release_after: dict[str, float] = {}
        self._provisioned_at: dict[str, float] = {}
        self._disrupted: set[str] = set()
        self._events_seen = len(cluster.events)
        self._held: dict[str, str] = {}
        """Node name -> GPR id of the nodes held by a GPR, as of the last pass."""
        self._workload: dict[str, tuple[str, ...]] = {}
        self._selectors: dict[str, Mapping[str, str]] = {}
        """GPR id -> its workload's pod keys (while they run)."""
        self._started: set[str] = set()
        self._intruders: set[str] = set()
        self._kick = False
        for n, a in enumerate(arrivals):
            engine.at(a.at, self._submit, (n, a))

    def _manager(self, controller: object) -> GprManager:
        engine: NodeEngine | None = controller if hasattr(controller, "launch_gpr_nodes") else None  # type: ignore[assignment]
        self.shared = engine is not None
        """True if the manager's launches go through the node controller."""
        return GprManager(GprStore(self._db), self.catalog, provider=self.cloud, clock=self.engine.clock, engine=engine)

    def attach(self, controller: object) -> None:
        """A restarted controller: a new manager over the same database, with the new engine."""
        self.manager = self._manager(controller)

    def _submit(self, item: tuple[int, GprArrival]) -> None:
        n, a = item
        g = self.manager.submit(a.spec, gpr_id=f"gpr-sim{n:05d}")
        self._submitted[g.gpr_id] = (self.engine.now(), a.spec.request_name)
        if not a.workload:
            self._started.add(g.gpr_id)  # held idle: no workload pods
        self._kick = True
        if a.release_after_s is not None:
            self._release_after[g.gpr_id] = a.release_after_s

    def next_wakeup(self) -> float | None:
        """The next time a pass is due: an early release, or a periodic look while some GPR is not final."""
        now = self.engine.now()
        if self._kick:
            return now
        times = [self._provisioned_at[g] + d for g, d in self._release_after.items() if g in self._provisioned_at]
        if any(s.state in (GprState.QUEUED, *_HOLDING) for s in self.manager.list_gprs(_ACTIVE)):
            times.append(now + 30.0)
        future = [t for t in times if t > now]
        return min(future) if future else None

    def reconcile(self) -> None:
        """One manager pass (before the node controller's round); early releases that are due."""
        now = self.engine.now()
        self._kick = False
        for gid, after in list(self._release_after.items()):
            at = self._provisioned_at.get(gid)
            if at is not None and now >= at + after:
                del self._release_after[gid]
                if self.manager.get(gid).state in _HOLDING:
                    self.manager.release(gid)
        self.manager.reconcile()
        holding = {g.gpr_id: g for g in self.manager.list_gprs(_HOLDING)}
        for gid in [gid for gid in self._selectors if gid not in holding]:  # its nodes are ordinary again
            del self._selectors[gid]
            self.cluster.set_gpr_workload(gid, None)
        for gid, g in holding.items():
            if gid not in self._selectors:  # its nodes take only its workload (the scheduler's predicate)
                self._selectors[gid] = g.spec.workload_selector
                self.cluster.set_gpr_workload(gid, g.spec.workload_selector)
            if g.state is GprState.PROVISIONED:
                self._provisioned_at.setdefault(gid, now)
                if gid not in self._started:
                    self._start_workload(gid, g.spec)
        for gid in [gid for gid in self._workload if gid not in holding]:  # released or expired: its work leaves
            for key in self._workload.pop(gid):
                self.cluster.remove_pod(key)
        self._held = self._held_nodes(set(holding))
        self._check_intruders()
        self._events_seen = len(self.cluster.events)

    def after_controller(self) -> None:
        """Count the node controller's disruptions of nodes held by a GPR during its round."""
        new = self.cluster.events[self._events_seen :]
        self._events_seen = len(self.cluster.events)
        for e in new:
            if e.kind in DISRUPTIVE and e.object.removeprefix("node/") in self._held:
                self._disrupted.add(e.object.removeprefix("node/"))
        self._check_intruders()

    def _start_workload(self, gid: str, spec: GprSpec) -> None:
        self._started.add(gid)
        keys: list[str] = []
        for i in range(spec.number_of_gpu_nodes):
            pod = Pod(
                f"{gid}-w{i}",
                request=Request(cpu_milli=1000, memory_mib=1024, gpus=spec.number_of_gpus),
                node_selector={GPR_LABEL: gid},
                tolerations=(gpr_toleration(gid),),
                labels=dict(spec.workload_selector),
            )
            self.cluster.add_pod(pod, 10 * 365 * 86400.0)  # runs until the GPR ends
            keys.append(pod.key)
        self._workload[gid] = tuple(keys)

    def _check_intruders(self) -> None:
        for name, gid in self._held.items():
            own = self._workload.get(gid, ())
            self._intruders.update(k for k in self.cluster.pods_on(name) if k not in own)

    def _held_nodes(self, holding: set[str]) -> dict[str, str]:
        """Node name -> GPR of the nodes a holding GPR has: by the Node's GPR label once registered (launched or
        borrowed), by the launch's request id before."""
        if not holding:
            return {}
        out: dict[str, str] = {}
        for n in self.cloud.alive():
            if n.node_name and is_gpr_request_id(n.request_id) and self.cluster.node(n.node_name) is None:
                gid = gpr_id_of_request(n.request_id)
                if gid in holding:
                    out[n.node_name] = gid
        for node in self.cluster.list_nodes():
            label = node.labels.get(GPR_LABEL)
            if label in holding:
                out[node.name] = label
        return out

    def report(self) -> dict[str, Any]:
        """The GPR figures (see the module docstring)."""
        rows: list[dict[str, Any]] = []
        waits: list[float] = []
        for g in self.manager.list_gprs():
            at, name = self._submitted.get(g.gpr_id, (g.created_at, g.spec.request_name))
            got = self._provisioned_at.get(g.gpr_id)
            wait = None if got is None else round(got - at, 3)
            if wait is not None:
                waits.append(wait)
            st = g.status
            reason = "" if got is not None else (st.failure_reason or st.internal_state or st.last_trigger)
            rows.append(
                {"gprId": g.gpr_id, "requestName": name, "state": str(g.state), "waitS": wait, "reason": reason}
            )
        waits.sort()
        self._dir.cleanup()
        return {
            "gprs": rows,
            "gprsProvisioned": len(waits),
            "gprsNotProvisioned": len(rows) - len(waits),
            "gprWaitP50s": waits[len(waits) // 2] if waits else None,
            "gprWaitMaxS": waits[-1] if waits else None,
            "gprNodesDisrupted": len(self._disrupted),
            "gprNodesBorrowed": sum(1 for e in self.cluster.events if e.kind == "GprBorrow"),
            "podsOnGprNodesOutsideGpr": len(self._intruders),
            "gprSharedEngine": self.shared,
        }


_ACTIVE = (GprState.QUEUED, GprState.PROVISIONING, GprState.PROVISIONED)


def gpr_report_keys(report: Mapping[str, Any]) -> dict[str, Any]:
    """The GPR figures of a report (empty for a scenario without GPRs), for ``compare`` rows."""
    keys = (
        "gprsProvisioned",
        "gprsNotProvisioned",
        "gprWaitP50s",
        "gprWaitMaxS",
        "gprNodesDisrupted",
        "gprNodesBorrowed",
        "podsOnGprNodesOutsideGpr",
    )
    return {k: report[k] for k in keys if k in report}
