"""GPUWorkloadScalers and GPUBudgets in the cluster: the imperative shell around
:func:`gpuscale.core.autoscale.fleet.plan`.

Each round (:meth:`ScalerReconciler.reconcile`, called by the controller process next to the node reconcile):

1. read every GPUWorkloadScaler and GPUBudget from a list-then-watch cache (a spec with problems gets
   ``ScalingActive=False/InvalidSpec`` and one Warning Event naming them);
2. read each target's ``scale`` subresource (current replicas, pod selector) and count its ready and unready pods
   from the process's pod cache;
3. query the triggers of the scalers that are due (``pollingInterval`` since their last poll; nothing sleeps: the
   process wakes at :meth:`ScalerReconciler.next_due`) through a :class:`~gpuscale.metrics.prometheus.MetricSource`
   per ``serverAddress``;
4. plan (KEDA/HPA decisions, budget arbitration), patch each target's ``scale`` to its target replicas, write the
   scaler's and the budget's status, and record Events: ``SuccessfulRescale``/``FailedRescale`` on the scaler,
   ``BudgetGranted``/``BudgetRefused`` on the budget whenever a grant changes.

The decision state is kept in memory and in each scaler's ``status.scalerState``; a new process (a restart, a new
leader) reads it back from there, so stabilisation windows and failure counts survive.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Event as KEvent
from lightkube.types import PatchType

from gpuscale.clock import Clock
from gpuscale.core.autoscale.budget import Arbitration, Budget
from gpuscale.core.autoscale.fleet import (
    Condition,
    Member,
    Membership,
    Outcome,
    RoundPlan,
    due,
    plan,
    state_from_status,
    status,
)
from gpuscale.core.autoscale.hpa import PodCounts
from gpuscale.core.autoscale.keda import EMPTY, ScalerState
from gpuscale.errors import MetricsError, NoData
from gpuscale.kube.cache import KubeCache, Watched
from gpuscale.kube.client import KubeClient, KubeError, as_kube_error
from gpuscale.kube.events import event_body
from gpuscale.kube.rightsizer import Rightsizer
from gpuscale.kube.scale_client import Scale, ScaleClient, selector_matcher
from gpuscale.manifests.problems import Doc
from gpuscale.manifests.scaler import BUDGET_KIND, SCALER_KIND, ScalerManifest, read_budget, read_scaler

if TYPE_CHECKING:
    from gpuscale.metrics.prometheus import MetricSource, PrometheusClient

__all__ = ["SCALER_RESOURCES", "ScalerReconciler"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]

GPUWorkloadScaler = create_namespaced_resource("gpuscale.io", "v1alpha1", SCALER_KIND, "gpuworkloadscalers")
GPUBudgetResource = create_namespaced_resource("gpuscale.io", "v1alpha1", BUDGET_KIND, "gpubudgets")
SCALER_RESOURCES: tuple[Watched, ...] = (
    Watched("gpuworkloadscalers", GPUWorkloadScaler, "gpuworkloadscalers.gpuscale.io", True),
    Watched("gpubudgets", GPUBudgetResource, "gpubudgets.gpuscale.io", True),
)
COMPONENT = "gpuscale-controller"


def _key(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    return ns, name, f"{ns}/{name}"


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class _Memory:
    uid: str
    state: ScalerState
    last_desired: int | None = None
    last_scale_time: str | None = None
    written: Obj | None = None
    """The status last written (a write that would change nothing is skipped)."""
    interval_s: float = 30.0
    scale: Scale | None = None
    """The target's scale as last read or written: between polls the round uses it instead of a GET."""
    retry_at: float | None = None
    """After a failed read of the target's scale, when to try again (one ``pollingInterval`` later)."""


class ObjectEvents:
    """Kubernetes Events on scalers and budgets: one Event per distinct (object, reason, message), its ``count``
    patched on repeats. Writes are not waited for (see :meth:`flush`)."""

    def __init__(self, client: KubeClient, clock: Clock) -> None:
        self.client = client
        self.clock = clock
        self._seen: dict[tuple[str, str, str, str], tuple[str, int]] = {}
        self.pending: list[Future[Any]] = []

    def emit(self, obj: Obj, reason: str, etype: str, message: str) -> None:
        ns, name, key = _key(obj)
        kind = str(obj.get("kind") or "")
        now = _rfc3339(self.clock.now())
        seen_key = (kind, key, reason, message)
        seen = self._seen.get(seen_key)
        if seen is not None:
            ev_name, count = seen[0], seen[1] + 1
            self._seen[seen_key] = (ev_name, count)
            body: Any = {"count": count, "lastTimestamp": now}
            self._spawn(self.client.api.patch(KEvent, ev_name, body, namespace=ns, patch_type=PatchType.MERGE))
            return
        ev_name = f"{name}.{hashlib.sha256(repr(seen_key).encode()).hexdigest()[:10]}"
        self._seen[seen_key] = (ev_name, 1)
        meta = obj.get("metadata") or {}
        involved = {"kind": kind, "apiVersion": obj.get("apiVersion", ""), "name": name, "namespace": ns}
        if meta.get("uid"):
            involved["uid"] = meta["uid"]
        event = KEvent.from_dict(event_body(ev_name, ns, involved, reason, message[:1024], etype, now, COMPONENT))
        self._spawn(self.client.api.create(event, namespace=ns))

    def _spawn(self, coro: Any) -> None:
        fut = self.client.spawn(coro)

        def done(f: Future[Any]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.info("event not written: %s", as_kube_error(f.exception() or Exception(), "create", "events"))

        fut.add_done_callback(done)
        self.pending = [p for p in self.pending if not p.done()] + [fut]

    def flush(self, timeout: float = 5.0) -> None:
        for f in list(self.pending):
            with contextlib.suppress(Exception):  # logged by the callback
                f.result(timeout)
        self.pending.clear()


class ScalerReconciler:
    """See the module docstring. ``pods`` is the process's cache holding ``pods``; ``sources`` maps a trigger's
    ``serverAddress`` to its metric source (default: one :class:`PrometheusClient` per address)."""

    def __init__(
        self,
        client: KubeClient,
        pods: KubeCache | None,
        clock: Clock,
        sources: Callable[[str], MetricSource] | None = None,
    ) -> None:
        self.client = client
        self.pods = pods
        self.clock = clock
        self.cache = KubeCache(client, SCALER_RESOURCES)
        self.scales = ScaleClient(client)
        self.events = ObjectEvents(client, clock)
        self._sources = sources
        self._prometheus: dict[str, PrometheusClient] = {}
        self._memory: dict[str, _Memory] = {}
        self._invalid: dict[str, str] = {}
        self._arbitrations: dict[str, Arbitration] = {}
        self.last: RoundPlan | None = None
        self.replicas: dict[tuple[str, str], tuple[int, int]] = {}
        """(namespace, scaler) -> (desired, current) after the last round, for the metrics."""
        self.granted_gpus: dict[tuple[str, str, str], int] = {}
        """(namespace, budget, model) -> GPUs granted at the last round, for the metrics."""
        self.rightsizer = Rightsizer(client, pods, clock, self.events, self.source, self._merge_status)
        """Scalers with ``spec.rightsizing`` (see :mod:`.rightsizer`)."""

    # ------------------------------------------------------------------ lifecycle
    def start(self, sync_timeout_s: float = 30.0) -> ScalerReconciler:
        self.cache.start()
        self.cache.wait_synced(sync_timeout_s)
        return self

    def close(self) -> None:
        self.cache.stop()
        self.events.flush(2)
        for c in self._prometheus.values():
            c.close()

    @property
    def healthy(self) -> bool:
        return self.cache.healthy

    def source(self, server: str) -> MetricSource:
        if self._sources is not None:
            return self._sources(server)
        if server not in self._prometheus:
            from gpuscale.metrics.prometheus import PrometheusClient  # httpx: loaded by the first trigger

            self._prometheus[server] = PrometheusClient(server)
        return self._prometheus[server]

    def next_due(self) -> float | None:
        """The earliest time a known scaler polls next (None: none known)."""
        times = []
        for obj in self.cache.objects("gpuworkloadscalers"):
            key = _key(obj)[2]
            mem = self._memory.get(key)
            if key in self._invalid:
                continue
            if mem is not None and mem.retry_at is not None:
                times.append(mem.retry_at)
            elif mem is None or mem.state.last_poll is None:
                return self.clock.now()
            else:
                times.append(mem.state.last_poll + mem.interval_s)
        rightsize = self.rightsizer.next_due()
        if rightsize is not None:
            times.append(rightsize)
        return min(times, default=None)

    # ------------------------------------------------------------------ the round
    def reconcile(self) -> RoundPlan:
        now = self.clock.now()
        budgets = self._budgets()
        members: list[Member] = []
        seen: dict[str, tuple[ScalerManifest, Obj, Scale]] = {}
        for obj in sorted(self.cache.objects("gpuworkloadscalers"), key=lambda o: _key(o)[2]):
            got = self._member(obj, now)
            if got is not None:
                member, manifest, scale = got
                members.append(member)
                seen[member.key] = (manifest, obj, scale)
        for gone in set(self._memory) - set(seen) - set(self._invalid):
            if self.cache.get("gpuworkloadscalers", gone) is None:
                del self._memory[gone]
        result = plan(members, budgets, self._arbitrations, now)
        for out in result.outcomes:
            manifest, obj, _ = seen[out.key]
            self._apply(out, manifest, obj, now)
        self.rightsizer.reconcile([(manifest, obj) for manifest, obj, _ in seen.values()], now)
        for key, arb in result.arbitrations.items():
            self._budget_outcome(key, arb)
        self._arbitrations = dict(result.arbitrations)
        self.last = result
        self.replicas = {
            tuple(o.key.split("/", 1)): (o.target, o.current)  # type: ignore[misc]
            for o in result.outcomes
        }
        self.granted_gpus = {}
        for key, arb in result.arbitrations.items():
            ns, name = key.split("/", 1)
            for g in arb.grants:
                k = (ns, name, g.model)
                self.granted_gpus[k] = self.granted_gpus.get(k, 0) + g.gpus
        return result

    def _budgets(self) -> dict[str, Budget]:
        out: dict[str, Budget] = {}
        for obj in self.cache.objects("gpubudgets"):
            _, _, key = _key(obj)
            doc = Doc(source=f"{BUDGET_KIND} {key}", index=1, line=None, problems=[], kind=BUDGET_KIND)
            budget = read_budget(doc, obj)
            if budget is None:
                self._invalid_spec(obj, key, doc)
                continue
            self._invalid.pop(key, None)
            out[key] = replace(budget, name=key)
        return out

    def _member(self, obj: Obj, now: float) -> tuple[Member, ScalerManifest, Scale] | None:
        ns, _, key = _key(obj)
        doc = Doc(source=f"{SCALER_KIND} {key}", index=1, line=None, problems=[], kind=SCALER_KIND)
        manifest = read_scaler(doc, obj)
        if manifest is None:
            self._invalid_spec(obj, key, doc)
            return None
        self._invalid.pop(key, None)
        meta, st = obj.get("metadata") or {}, obj.get("status") or {}
        uid = str(meta.get("uid") or "")
        mem = self._memory.get(key)
        if mem is None or mem.uid != uid:  # first sight (a new process): go on from the status
            mem = _Memory(uid, state_from_status(st.get("scalerState")), st.get("desiredReplicas"),
                          st.get("lastScaleTime"))  # fmt: skip
            self._memory[key] = mem
        if mem.retry_at is not None and now < mem.retry_at:
            return None
        is_due = due(manifest.spec, mem.state, now)
        api_version = ((obj.get("spec") or {}).get("scaleTargetRef") or {}).get("apiVersion")
        scale = mem.scale
        if is_due or scale is None or mem.retry_at is not None:
            try:
                scale = self.scales.get(manifest.target_kind, api_version, ns, manifest.target_name)
            except KubeError as exc:
                what = f"{manifest.target_kind} {manifest.target_name}"
                message = f"cannot read the scale of {what}: {exc.describe()}"
                self._write_status(obj, key, {"conditions": [
                    Condition("AbleToScale", "False", "FailedGetScale", message).to_dict()]})  # fmt: skip
                self.events.emit(obj, "FailedGetScale", "Warning", message)
                retry = now + manifest.spec.polling_interval_s
                self._memory[key] = replace(self._memory[key], scale=None, retry_at=retry)
                return None
            mem = replace(mem, scale=scale, retry_at=None)
            self._memory[key] = mem
        readings = self._read(manifest) if is_due else None
        budget = None
        if manifest.budget is not None:
            ref = manifest.budget
            budget = Membership(f"{ns}/{ref.name}", ref.model, ref.gpus_per_replica)
        member = Member(key, manifest.spec, mem.state, scale.replicas, readings, self._pod_counts(ns, scale),
                        manifest.priority, budget, mem.last_desired)  # fmt: skip
        return member, manifest, scale

    def _read(self, manifest: ScalerManifest) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for t in manifest.spec.triggers:
            server, query = manifest.queries[t.name]
            try:
                out[t.name] = self.source(server).value(query)
            except NoData:
                out[t.name] = EMPTY
            except MetricsError as exc:
                log.info("scaler %s/%s trigger %s: %s", manifest.namespace, manifest.name, t.name, exc)
                out[t.name] = None
        return out

    def _pod_counts(self, namespace: str, scale: Scale) -> PodCounts:
        if self.pods is None or not scale.selector:
            return PodCounts(scale.replicas)
        match = selector_matcher(scale.selector)
        ready = unready = 0
        for pod in self.pods.objects("pods"):
            meta, st = pod.get("metadata") or {}, pod.get("status") or {}
            if meta.get("namespace") != namespace or meta.get("deletionTimestamp"):
                continue
            if st.get("phase") in ("Succeeded", "Failed") or not match(meta.get("labels") or {}):
                continue
            not_ready = any(c.get("type") == "Ready" and c.get("status") != "True" for c in st.get("conditions") or [])
            if st.get("phase") == "Running" and not not_ready:
                ready += 1
            else:
                unready += 1
        return PodCounts(ready, unready)

    # ------------------------------------------------------------------ acting
    def _apply(self, out: Outcome, manifest: ScalerManifest, obj: Obj, now: float) -> None:
        ns, _, key = _key(obj)
        mem = self._memory[key]
        conditions = list(out.conditions)
        scaled_at = mem.last_scale_time
        if out.scales:
            api_version = ((obj.get("spec") or {}).get("scaleTargetRef") or {}).get("apiVersion")
            try:
                mem = replace(mem, scale=self.scales.set(manifest.target_kind, api_version, ns,
                                                         manifest.target_name, out.target))  # fmt: skip
                scaled_at = _rfc3339(now)
                what = f"scaled {manifest.target_kind} {manifest.target_name} to {out.target}"
                conditions[0] = Condition("AbleToScale", "True", "SucceededRescale", what)
                self.events.emit(obj, "SuccessfulRescale", "Normal", f"New size: {out.target}; reason: {out.reason}")
            except KubeError as exc:
                message = f"cannot scale {manifest.target_kind} {manifest.target_name}: {exc.describe()}"
                conditions[0] = Condition("AbleToScale", "False", "FailedUpdateScale", message)
                self.events.emit(obj, "FailedRescale", "Warning", message)
        last_desired = out.wanted if out.decision is not None else mem.last_desired
        mem = replace(mem, state=out.state, last_desired=last_desired, last_scale_time=scaled_at,
                      interval_s=manifest.spec.polling_interval_s)  # fmt: skip
        self._memory[key] = mem
        if out.decision is None and not out.scales:
            return  # nothing was polled or done: the status stands
        body = status(replace(out, conditions=tuple(conditions)), last_scale_time=scaled_at)
        self._write_status(obj, key, body)

    def _write_status(self, obj: Obj, key: str, body: Obj) -> None:
        mem = self._memory.get(key)
        if mem is not None and mem.written == body:
            return
        if self._merge_status(obj, body) and mem is not None:
            self._memory[key] = replace(mem, written=body)

    def _merge_status(self, obj: Obj, body: Obj) -> bool:
        """Merge ``body`` into a scaler's status; False (and a warning) when the API server refused it."""
        ns, name, key = _key(obj)
        return self._patch_status(GPUWorkloadScaler, ns, name, body, key)

    def _patch_status(self, resource: Any, ns: str, name: str, status: Obj, what: str) -> bool:
        """Merge ``status`` into the status of the ``resource`` ``ns/name``; False (and a warning naming ``what``)
        when the API server refused it."""
        try:
            self.client.run(
                self.client.api.patch(resource.Status, name, {"status": status}, namespace=ns,
                                      patch_type=PatchType.MERGE),
                verb="patch", resource=f"{resource._api_info.plural}.gpuscale.io/status",
            )  # fmt: skip
        except KubeError as exc:
            log.warning("status of %s not written: %s", what, exc.describe())
            return False
        return True

    def _invalid_spec(self, obj: Obj, key: str, doc: Doc) -> None:
        message = "; ".join(str(p) for p in doc.problems)[:1000] or "the spec cannot be read"
        if self._invalid.get(key) == message:
            return
        self._invalid[key] = message
        self.events.emit(obj, "InvalidSpec", "Warning", message)
        ns, name, _ = _key(obj)
        kind = str(obj.get("kind") or SCALER_KIND)
        resource = GPUWorkloadScaler if kind == SCALER_KIND else GPUBudgetResource
        cond = Condition("ScalingActive", "False", "InvalidSpec", message).to_dict()
        self._patch_status(resource, ns, name, {"conditions": [cond]}, key)

    def _budget_outcome(self, key: str, arb: Arbitration) -> None:
        ns, name = key.split("/", 1)
        obj = self.cache.get("gpubudgets", key)
        if obj is None:
            return
        before = self._arbitrations.get(key)
        old = before.by_scaler() if before is not None else {}
        for g in arb.grants:
            was = old.get(g.scaler)
            if was is not None and (was.granted, was.desired) == (g.granted, g.desired):
                continue
            scaler = g.scaler.split("/", 1)[-1]
            text = f"{scaler} ({g.model}): granted {g.granted} of {g.desired} replicas ({g.gpus} GPUs): "
            text += "; ".join(g.reasons)
            if g.refused:
                self.events.emit(obj, "BudgetRefused", "Warning", text)
            else:
                self.events.emit(obj, "BudgetGranted", "Normal", text)
        body = arb.status()
        for grant in body["grants"]:  # type: ignore[attr-defined]
            grant["scaler"] = str(grant["scaler"]).split("/", 1)[-1]
        if before is not None and before.status() == arb.status():
            return
        self._patch_status(GPUBudgetResource, ns, name, body, f"GPUBudget {key}")
