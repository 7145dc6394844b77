"""Right-sizing in the cluster: the imperative shell around
:func:`gpuscale.core.autoscale.rightsize_update.decide`, run by :class:`~gpuscale.kube.scalers.ScalerReconciler`
for every GPUWorkloadScaler with ``spec.rightsizing``.

Every ``every_s`` seconds per scaler: read the target (a Deployment or StatefulSet), its usage history from Prometheus
(:class:`~gpuscale.metrics.usage.PrometheusUsage` over ``historyWindow``), the PodDisruptionBudgets from the process's
cache; recommend (:func:`~gpuscale.core.autoscale.rightsize.recommend`, within ``minAllowed``/``maxAllowed``),
decide, and then:

* ``Recreate`` and due: a JSON patch (RFC 6902) of the pod template's requests (the rolling update recreates the
  pods) and a ``RightsizeApplied`` Event; ``RightsizeBlocked`` (Warning) while a PDB allows no disruption;
* ``Off``: a ``RightsizeRecommendation`` Event naming the change;
* a GPU verdict other than "fits": a ``GPURightsizeAdvice`` Event (GPU model and count are never changed);
* always: ``status.rightsizing`` (bounds per container, verdict, message, ``lastUpdateTime``, read back after a
  restart so the rate limit holds).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.types import PatchType

from gpuscale.clock import Clock
from gpuscale.core.autoscale.rightsize import GpuAdvice, GpuVerdict, Recommendation, gpu_advice, recommend
from gpuscale.core.autoscale.rightsize_update import (
    PDB,
    Decision,
    RightsizePolicy,
    TemplateContainer,
    Verdict,
    blocking_budget,
    decide,
    quantity,
)
from gpuscale.errors import MetricsError
from gpuscale.kube.cache import KubeCache, raw
from gpuscale.kube.client import KubeClient, KubeError
from gpuscale.manifests.scaler import ScalerManifest
from gpuscale.metrics.usage import PrometheusUsage

if TYPE_CHECKING:
    from gpuscale.metrics.prometheus import MetricSource

__all__ = ["WORKLOADS", "Rightsizer"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]
WORKLOADS: dict[str, tuple[Any, str]] = {
    "Deployment": (Deployment, "deployments.apps"),
    "StatefulSet": (StatefulSet, "statefulsets.apps"),
}
"""Kinds whose pod template the right-sizer patches, and their RBAC names."""
MAX_POINTS = 10_000


class Events(Protocol):
    def emit(self, obj: Obj, reason: str, etype: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Memory:
    uid: str
    last_update: float | None
    checked: float | None = None


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: object) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() if text else None
    except ValueError:
        return None


class Rightsizer:
    """See the module docstring. ``write_status(obj, body)`` merges ``body`` into the scaler's status."""

    def __init__(self, client: KubeClient, pods: KubeCache | None, clock: Clock, events: Events,
                 source: Callable[[str], MetricSource], write_status: Callable[[Obj, Obj], object], *,
                 every_s: float = 300.0) -> None:  # fmt: skip
        self.client = client
        self.pods = pods
        self.clock = clock
        self.events = events
        self.source = source
        self.write_status = write_status
        self.every_s = every_s
        self._memory: dict[str, _Memory] = {}
        self.decisions: dict[str, Decision] = {}
        """Scaler key -> the last decision (for tests and logs)."""

    def next_due(self) -> float | None:
        times = [m.checked + self.every_s for m in self._memory.values() if m.checked is not None]
        return min(times, default=None)

    def reconcile(self, scalers: list[tuple[ScalerManifest, Obj]], now: float) -> None:
        keys = set()
        for manifest, obj in scalers:
            if manifest.rightsizing is None:
                continue
            key = f"{manifest.namespace}/{manifest.name}"
            keys.add(key)
            meta, st = obj.get("metadata") or {}, obj.get("status") or {}
            uid = str(meta.get("uid") or "")
            mem = self._memory.get(key)
            if mem is None or mem.uid != uid:  # first sight: the rate limit goes on from the status
                mem = _Memory(uid, _epoch((st.get("rightsizing") or {}).get("lastUpdateTime")))
            if mem.checked is not None and now < mem.checked + self.every_s:
                self._memory[key] = mem
                continue
            self._memory[key] = replace(mem, checked=now)
            try:
                self._check(manifest, manifest.rightsizing, obj, key, now)
            except (KubeError, MetricsError) as exc:
                text = exc.describe() if isinstance(exc, KubeError) else str(exc)
                log.info("right-sizing %s: %s", key, text)
                self.write_status(obj, {"rightsizing": {"updateMode": str(manifest.rightsizing.mode),
                                                        "verdict": "Error", "message": text[:1000]}})  # fmt: skip
        for gone in set(self._memory) - keys:
            del self._memory[gone]

    # ------------------------------------------------------------------ one workload
    def _check(self, m: ScalerManifest, policy: RightsizePolicy, obj: Obj, key: str, now: float) -> None:
        ns = m.namespace
        if m.target_kind not in WORKLOADS:
            raise MetricsError(f"right-sizing patches Deployments and StatefulSets, not {m.target_kind}")
        resource, rbac = WORKLOADS[m.target_kind]
        workload = raw(self.client.run(self.client.api.get(resource, m.target_name, namespace=ns), verb="get",
                                       resource=rbac))  # fmt: skip
        template = (workload.get("spec") or {}).get("template") or {}
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        containers = [
            TemplateContainer(i, str(c.get("name")), c.get("resources"))
            for i, c in enumerate((template.get("spec") or {}).get("containers") or [])
        ]
        step = max(60.0, policy.history_s / MAX_POINTS)  # Prometheus refuses more than 11,000 points a series
        usage = PrometheusUsage(self.source(policy.server), namespace=ns, end=now, window_s=policy.history_s,
                                step_s=step).usage()  # fmt: skip
        wkey = f"{ns}/{m.target_name}"
        names = {c.name for c in containers}
        recs: list[Recommendation] = []
        for u in usage.containers:
            samples = {"cpu": u.cpu_cores, "memory": u.memory_mib}
            if any(not samples[r] for r in policy.controlled):
                continue  # no history of a controlled resource: no recommendation (its floor is not one)
            if u.workload == wkey and u.container in names:
                u = replace(u, containers_in_pod=len(containers), min_allowed=policy.min_allowed,
                            max_allowed=policy.max_allowed)  # fmt: skip
                recs.append(recommend(u))
        gpu = next((gpu_advice(g) for g in usage.gpus if g.workload == wkey), None)
        mem = self._memory[key]
        decision = decide(policy, recs, containers, last_update=mem.last_update,
                          blocked_by=blocking_budget(self._pdbs(ns), labels), now=now)  # fmt: skip
        self.decisions[key] = decision
        last = mem.last_update
        if decision.verdict is Verdict.APPLY:
            try:
                self.client.run(self.client.api.patch(resource, m.target_name, list(decision.patch), namespace=ns,
                                                      patch_type=PatchType.JSON),
                                verb="patch", resource=rbac)  # fmt: skip
            except KubeError as exc:
                message = f"cannot patch {m.target_kind} {m.target_name}: {exc.describe()}"
                self.events.emit(obj, "FailedRightsize", "Warning", message)
                decision = replace(decision, verdict=Verdict.NO_CHANGE, message=message)
            else:
                last = now
                self._memory[key] = replace(mem, last_update=now)
                self.events.emit(obj, "RightsizeApplied", "Normal",
                                 f"{m.target_kind} {m.target_name}: {decision.message}")  # fmt: skip
        elif decision.verdict is Verdict.OFF:
            self.events.emit(obj, "RightsizeRecommendation", "Normal", f"{m.target_kind} {m.target_name}: "
                             f"{decision.message}")  # fmt: skip
        elif decision.verdict is Verdict.BLOCKED:
            self.events.emit(obj, "RightsizeBlocked", "Warning", f"{m.target_kind} {m.target_name}: "
                             f"{decision.message}")  # fmt: skip
        if gpu is not None and gpu.verdict in (GpuVerdict.LARGER, GpuVerdict.FRACTIONAL, GpuVerdict.SMALLER):
            etype = "Warning" if gpu.verdict is GpuVerdict.LARGER else "Normal"
            self.events.emit(obj, "GPURightsizeAdvice", etype, f"{m.target_kind} {m.target_name}: {gpu.reason} "
                             "(GPU model and count are not changed automatically)")  # fmt: skip
        self.write_status(obj, {"rightsizing": _status(policy, decision, recs, gpu, last, now)})

    def _pdbs(self, namespace: str) -> list[PDB]:
        if self.pods is None:
            return []
        out = []
        for p in self.pods.objects("poddisruptionbudgets"):
            meta, spec = p.get("metadata") or {}, p.get("spec") or {}
            if meta.get("namespace") != namespace:
                continue
            sel = spec.get("selector") or {}
            exprs = tuple((str(e.get("key")), str(e.get("operator")), tuple(str(v) for v in e.get("values") or ()))
                          for e in sel.get("matchExpressions") or ())  # fmt: skip
            allowed = int((p.get("status") or {}).get("disruptionsAllowed") or 0)
            out.append(PDB(str(meta.get("name")), dict(sel.get("matchLabels") or {}), exprs, allowed))
        return out


def _status(policy: RightsizePolicy, d: Decision, recs: list[Recommendation], gpu: GpuAdvice | None,
            last_update: float | None, now: float) -> Obj:  # fmt: skip
    body: Obj = {
        "updateMode": str(policy.mode),
        "verdict": str(d.verdict),
        "message": d.message[:1000],
        "lastRecommendationTime": _rfc3339(now),
        "recommendations": [_bounds(r) for r in recs],
    }
    if last_update is not None:
        body["lastUpdateTime"] = _rfc3339(last_update)
    if gpu is not None:
        body["gpu"] = {"verdict": str(gpu.verdict), "message": gpu.reason[:1000]}
        if gpu.gpu_milli is not None:
            body["gpu"]["gpuMilli"] = gpu.gpu_milli
    return body


def _bounds(r: Recommendation) -> Obj:
    out: Obj = {"container": r.container}
    for res, b in (("cpu", r.cpu_milli), ("memory", r.memory_mib)):
        out[res] = {k: quantity(res, getattr(b, k)) for k in ("lower", "target", "upper")}
    return out
