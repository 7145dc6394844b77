"""Kubernetes Events for the controller's decisions, with the reasons users know from other autoscalers.

========================  ==========  =======================================================================
reason                    on          from the controller's event
========================  ==========  =======================================================================
``TriggeredScaleUp``      pods        ``ScaleUp``: each pod a launch is for (pool, instance type, count)
``NotTriggerScaleUp``     pod         ``Blocked``: the core's explanation of why no node is launched
``ScaleDown``             node        ``Consolidate`` deleting a node (empty or underutilised)
``ConsolidationReplace``  node        ``Consolidate`` replacing a node by a cheaper one
``SpotInterrupted``       node        ``SpotInterruption``
``GPUInitTimeout``        node        ``NodeClaimTimeout`` of a node whose GPUs never became allocatable
========================  ==========  =======================================================================

Other decisions about a pod or node keep the controller's reason (``Evict``, ``NodeRegistered``, ...). Like kubectl's
event recorder, a repeat of the same (object, reason, message) raises the ``count`` of the existing Event, and each
object may emit a burst of 25 events and then one per 5 minutes. Messages are cut to 1 KiB and anything that looks like
a credential is masked. Writes are not awaited: a failing event never slows or fails a reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from gpuscale.clock import Clock, SystemClock
from gpuscale.controller.backend import Event
from gpuscale.kube.cache import KubeCache
from gpuscale.kube.client import KubeClient, as_kube_error

__all__ = ["EventRecorder", "kube_reason", "redact"]

log = logging.getLogger(__name__)

COMPONENT = "gpuscale"
BURST = 25
REFILL_S = 300.0
MAX_MESSAGE = 1024
EVENT_WRITES = 2
"""Event writes in flight at once: Events queue behind the calls a round waits for (node creates), never before."""
KEvent = create_namespaced_resource("", "v1", "Event", "events")
"""Events are written and read back as plain dicts (lightkube's generic resource), with no typed model per write."""
EVENT_NAMESPACE = "default"
"""Namespace of Events about cluster-scoped objects (nodes), as kubelet and the node controller do."""

_SECRET = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:bearer\s+|basic\s+)?|bearer\s+|token[\"']?\s*[:=]\s*[\"']?"
    r"|password[\"']?\s*[:=]\s*[\"']?)"
    r"[^\s\"',;]+"
)
_LONG_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")


def redact(text: str) -> str:
    """Mask credentials (tokens, passwords, bearer headers, long hex strings) and cut to 1 KiB."""
    text = _SECRET.sub(lambda m: m.group(1) + "***", text)
    text = _LONG_HEX.sub("***", text)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def kube_reason(event: Event) -> tuple[str, str] | None:
    """(reason, type) of the Kubernetes Event for a controller event about a pod or node; None for others."""
    kind = event.kind
    if kind == "ScaleUp":
        return "TriggeredScaleUp", "Normal"
    if kind == "Blocked":
        return ("NotTriggerScaleUp", "Normal") if event.object.startswith("pod/") else None
    if kind == "Consolidate":
        replace = event.data.get("action") == "Replace"
        return ("ConsolidationReplace" if replace else "ScaleDown"), "Normal"
    if kind == "SpotInterruption":
        return "SpotInterrupted", "Warning"
    if kind == "NodeClaimTimeout":
        return ("GPUInitTimeout" if event.reason == "GpuInitTimeout" else event.reason or kind), "Warning"
    if not event.object.startswith(("pod/", "node/")):
        return None
    warning = kind in ("LaunchFailed", "EvictBlocked", "NodeLost", "NodeFailed", "DisruptionBlocked")
    return kind, "Warning" if warning else "Normal"


@dataclass(slots=True)
class _Seen:
    name: str
    namespace: str
    count: int
    first: str


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


def event_body(
    name: str,
    namespace: str,
    involved: dict[str, str],
    reason: str,
    message: str,
    etype: str,
    now: str,
    component: str,
) -> dict[str, Any]:
    """A new core/v1 Event (count 1, first and last seen at ``now``, an RFC 3339 time) about ``involved``, reported by
    ``component`` of gpuscale's controller."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": etype,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": component},
        "reportingComponent": "gpuscale.io/controller",
        "reportingInstance": component,
    }


def _ts(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Turns controller events into aggregated, rate-limited Kubernetes Events."""

    def __init__(self, client: KubeClient, cache: KubeCache | None = None, clock: Clock | None = None) -> None:
        self.client = client
        self.cache = cache
        self.clock = clock or SystemClock()
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}
        self._buckets: dict[str, _Bucket] = {}
        self.dropped = 0
        """Events not written because their object exceeded its rate."""
        self.pending: list[Any] = []
        self._gate: asyncio.Semaphore | None = None
        self._last: dict[str, Any] = {}
        """Event name -> its last write (the next write of that Event waits for it while it is in flight); one
        entry per Event, as in ``_seen``."""

    def record(self, event: Event) -> None:
        mapped = kube_reason(event)
        if mapped is None:
            return
        reason, etype = mapped
        message = redact(event.message)
        if event.kind == "ScaleUp":
            listed = event.data.get("pods") or []
            pods = [str(p) for p in listed] if isinstance(listed, (list, tuple)) else []
            what = f"pod triggered scale-up: pool {event.data.get('pool')}, {event.data.get('instanceType')} x1"
            for pod in pods:
                self._emit("Pod", pod, reason, etype, redact(f"{what} ({message})"))
            return
        kind = "Pod" if event.object.startswith("pod/") else "Node"
        self._emit(kind, event.object.split("/", 1)[1], reason, etype, message)

    def _allow(self, obj: str) -> bool:
        now = self.clock.now()
        b = self._buckets.get(obj)
        if b is None:
            b = self._buckets[obj] = _Bucket(float(BURST), now)
        b.tokens = min(float(BURST), b.tokens + (now - b.at) / REFILL_S)
        b.at = now
        if b.tokens < 1:
            return False
        b.tokens -= 1
        return True

    def object_event(self, obj: dict[str, Any], reason: str, etype: str, message: str) -> None:
        """An Event about any namespaced API object (``obj`` as the server sent it, e.g. a GPR), aggregated and
        rate-limited like the others."""
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or EVENT_NAMESPACE, str(meta.get("name", ""))
        involved = {"kind": str(obj.get("kind", "")), "apiVersion": str(obj.get("apiVersion", "")), "name": name}
        involved["namespace"] = ns
        if meta.get("uid"):
            involved["uid"] = meta["uid"]
        self._emit(involved["kind"], f"{ns}/{name}", reason, etype, redact(message), involved=involved)

    def _emit(
        self, kind: str, ref: str, reason: str, etype: str, message: str, *, involved: dict[str, str] | None = None
    ) -> None:
        if involved is not None:
            namespace, name = involved["namespace"], involved["name"]
        elif kind == "Pod":
            namespace, name = ref.split("/", 1) if "/" in ref else ("default", ref)
        else:
            namespace, name = EVENT_NAMESPACE, ref
        key = (kind, ref, reason, message)
        if not self._allow(f"{kind}/{ref}"):
            self.dropped += 1
            return
        now = _ts(self.clock.now())
        seen = self._seen.get(key)
        if seen is not None:
            seen.count += 1
            patch = {"count": seen.count, "lastTimestamp": now}
            coro = self.client.api.patch(KEvent, seen.name, patch, namespace=seen.namespace, patch_type=PatchType.MERGE)
            self._spawn(coro, "patch", seen.name)
            return
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:10]
        ev_name = f"{name}.{digest}"
        self._seen[key] = _Seen(ev_name, namespace, 1, now)
        if involved is None:
            uid = ""
            if self.cache is not None:
                cached = self.cache.get("pods" if kind == "Pod" else "nodes", ref)
                uid = ((cached or {}).get("metadata") or {}).get("uid", "")
            involved = {"kind": kind, "name": name, "apiVersion": "v1", **({"uid": uid} if uid else {})}
            if kind == "Pod":
                involved["namespace"] = namespace
        body = KEvent.from_dict(event_body(ev_name, namespace, involved, reason, message, etype, now, COMPONENT))
        self._spawn(self.client.api.create(body, namespace=namespace), "create", ev_name)

    async def _gated(self, coro: Any, after: Any) -> Any:
        if after is not None:  # the previous write of the same Event lands first (a count never goes back)
            with contextlib.suppress(Exception):  # its failure is logged by its own callback
                await asyncio.wrap_future(after)
        if self._gate is None:  # made on the client's loop, where it is used
            self._gate = asyncio.Semaphore(EVENT_WRITES)
        async with self._gate:
            return await coro

    def _spawn(self, coro: Any, verb: str, name: str) -> None:
        """Write on the client's loop, at most EVENT_WRITES at a time, each Event's writes in the order made."""
        prev = self._last.get(name)
        fut = self.client.spawn(self._gated(coro, prev if prev is not None and not prev.done() else None))

        def done(f: Any) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                log.info("event not written: %s", as_kube_error(exc, verb, "events").describe())

        self._last[name] = fut
        fut.add_done_callback(done)
        self.pending = [p for p in self.pending if not p.done()] + [fut]

    def flush(self, timeout: float = 5.0) -> None:
        """Wait for the event writes in flight (for tests and shutdown)."""
        for f in list(self.pending):
            with contextlib.suppress(Exception):  # failures are logged by the callback
                f.result(timeout)
        self.pending.clear()
