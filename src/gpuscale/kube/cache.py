"""A local cache of the cluster: list, then watch, each resource gpuscale reads (an informer).

Every watched resource is listed once, then watched from the list's resourceVersion. A watch answered with 410 Gone
(the server compacted its history) or a dropped connection relists; an unreachable server is retried with
exponential back-off (never a crash; :attr:`KubeCache.healthy` says whether every resource is being watched). Reads
(:meth:`KubeCache.objects`) come from memory, never from a request per round, and each change bumps
:attr:`KubeCache.version` so readers rebuild derived views only when something changed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.policy_v1 import PodDisruptionBudget

from gpuscale.kube.client import KubeClient, KubeError, as_kube_error
from gpuscale.kube.podrecord import compact_pod

__all__ = ["QUIET", "WATCHED", "KubeCache", "Watched"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Watched:
    """One resource the cache lists and watches; ``rbac`` is its RBAC resource name."""

    name: str
    resource: Any
    rbac: str
    namespaced: bool = False
    record: Callable[[Obj], Obj] | None = None
    """What the cache keeps of each object (default: the object without ``managedFields``)."""

    @property
    def scope(self) -> dict[str, str]:
        """Keyword arguments selecting every namespace of a namespaced resource."""
        return {"namespace": "*"} if self.namespaced else {}


Pod = create_namespaced_resource("", "v1", "Pod", "pods")
Node = create_global_resource("", "v1", "Node", "nodes")
"""Pods and Nodes are read as plain dicts (lightkube's generic resources), not typed models: the cache keeps the
decoded JSON (of a pod, only the fields gpuscale reads: :mod:`gpuscale.kube.podrecord`), with no model built and
converted back for each of thousands of objects."""
GPUNodePool = create_global_resource("gpuscale.io", "v1alpha1", "GPUNodePool", "gpunodepools")
GPUNodeClaim = create_global_resource("gpuscale.io", "v1alpha1", "GPUNodeClaim", "gpunodeclaims")
OfferingAvailability = create_global_resource(
    "gpuscale.io", "v1alpha1", "OfferingAvailability", "offeringavailabilities"
)
GPUProvisioningRequest = create_namespaced_resource(
    "gpuscale.io", "v1alpha1", "GPUProvisioningRequest", "gpuprovisioningrequests"
)

WATCHED: tuple[Watched, ...] = (
    Watched("pods", Pod, "pods", True, compact_pod),  # a compact record per pod: the cache holds every pod
    Watched("nodes", Node, "nodes"),
    Watched("poddisruptionbudgets", PodDisruptionBudget, "poddisruptionbudgets.policy", True),
    Watched("daemonsets", DaemonSet, "daemonsets.apps", True),
    Watched("gpunodepools", GPUNodePool, "gpunodepools.gpuscale.io"),
    Watched("gpunodeclaims", GPUNodeClaim, "gpunodeclaims.gpuscale.io"),
    Watched("offeringavailabilities", OfferingAvailability, "offeringavailabilities.gpuscale.io"),
    Watched("gpuprovisioningrequests", GPUProvisioningRequest, "gpuprovisioningrequests.gpuscale.io", True),
)

QUIET = frozenset({"gpunodeclaims"})
"""Resources whose changes do not call the :meth:`KubeCache.on_change` listeners: the controller's own records,
read back only at a restart (each of its writes would otherwise wake another round)."""


LIST_PAGE = 500
"""Objects per page of a list (``limit``, as informers list): the decoded JSON of one page at a time, not of every
pod of the cluster at once, is held beside the cache's records."""


def raw(obj: Any) -> Obj:
    """A lightkube object (typed model or generic) as the plain dict the API server sent."""
    if hasattr(obj, "to_dict"):
        out: Obj = obj.to_dict()
        return out
    return dict(obj)


def slim(obj: Obj) -> Obj:
    """``obj`` without ``metadata.managedFields`` (server-side apply bookkeeping nothing here reads; often the
    largest part of an object)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _keep(w: Watched, obj: Any) -> Obj:
    return w.record(raw(obj)) if w.record is not None else slim(raw(obj))


def obj_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


class KubeCache:
    """List-then-watch of ``resources`` on ``client``'s loop. Start with :meth:`start`, then :meth:`wait_synced`."""

    def __init__(
        self,
        client: KubeClient,
        resources: tuple[Watched, ...] = WATCHED,
        *,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        watch_timeout_s: int = 300,
        quiet: frozenset[str] = QUIET,
    ) -> None:
        self.client = client
        self.resources = resources
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.watch_timeout_s = watch_timeout_s
        self.quiet = quiet
        self._lock = threading.Lock()
        self._store: dict[str, dict[str, Obj]] = {w.name: {} for w in resources}
        self._synced: dict[str, threading.Event] = {w.name: threading.Event() for w in resources}
        self._errors: dict[str, KubeError | None] = {w.name: None for w in resources}
        self._first_error = threading.Event()
        self.version = 0
        """Bumped on every change of any cached object."""
        self.versions: dict[str, int] = {w.name: 0 for w in resources}
        """Bumped on every change of an object of that resource."""
        self.relists: dict[str, int] = {w.name: 0 for w in resources}
        """Lists per resource (1 after the start; more after 410 Gone or a dropped connection)."""
        self._tasks: list[Any] = []
        self._listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> KubeCache:
        for w in self.resources:
            self._tasks.append(self.client.spawn(self._run(w)))
        return self

    def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()

    def wait_synced(self, timeout: float) -> None:
        """Block until every resource was listed once. Raises the first :class:`KubeError` met before that (a
        refused verb, bad credentials, an unreachable server), or a timeout error."""
        deadline = timeout
        for w in self.resources:
            ev = self._synced[w.name]
            while not ev.wait(0.05):
                err = self._errors[w.name]
                if err is not None:
                    raise err
                deadline -= 0.05
                if deadline <= 0:
                    raise KubeError("timed out waiting for the first list", verb="list", resource=w.rbac)

    @property
    def healthy(self) -> bool:
        """Every resource is listed and its watch is not failing."""
        return all(self._synced[w.name].is_set() and self._errors[w.name] is None for w in self.resources)

    def errors(self) -> dict[str, KubeError]:
        """The current error of each failing resource."""
        return {k: v for k, v in self._errors.items() if v is not None}

    def on_change(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (from the client's loop thread) after every change."""
        self._listeners.append(fn)

    # ------------------------------------------------------------------ reads
    def objects(self, name: str) -> list[Obj]:
        """The cached objects of a resource (shared dicts: do not modify)."""
        with self._lock:
            return list(self._store[name].values())

    def get(self, name: str, key: str) -> Obj | None:
        """One cached object by ``namespace/name`` (or ``name`` for cluster-scoped resources)."""
        with self._lock:
            return self._store[name].get(key)

    # ------------------------------------------------------------------ the watch loop
    def _changed(self, name: str) -> None:
        self.versions[name] += 1
        self.version += 1
        if name in self.quiet:
            return
        for fn in self._listeners:
            fn()

    async def _relist(self, w: Watched) -> str:
        listing = self.client.api.list(w.resource, chunk_size=LIST_PAGE, **w.scope)
        items = {}
        async for obj in listing:
            d = _keep(w, obj)
            items[obj_key(d)] = d
        rv = listing._resourceVersion or ""  # set once the list was read, also when it had no items
        with self._lock:
            self._store[w.name] = items
            self.relists[w.name] += 1
        self._changed(w.name)
        return rv

    def _apply(self, w: Watched, kind: str, obj: Obj) -> None:
        key = obj_key(obj)
        with self._lock:
            store = self._store[w.name]
            if kind == "DELETED":
                store.pop(key, None)
            else:
                store[key] = obj
        self._changed(w.name)

    async def _run(self, w: Watched) -> None:
        backoff = self.min_backoff_s
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    rv = await self._relist(w)
                    self._errors[w.name] = None
                    self._synced[w.name].set()
                async for kind, obj in self.client.api.watch(
                    w.resource, resource_version=rv, server_timeout=self.watch_timeout_s, **w.scope
                ):
                    d = _keep(w, obj)
                    rv = (d.get("metadata") or {}).get("resourceVersion") or rv
                    self._apply(w, kind, d)
                    backoff = self.min_backoff_s
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                err = as_kube_error(exc, "watch" if rv is not None else "list", w.rbac)
                rv = None  # relist: 410 Gone (history compacted) or anything else the server refused
                if err.status == 410:
                    log.info("watch of %s expired (410 Gone): relisting", w.name)
                    continue
                self._errors[w.name] = err
                log.warning("%s", err.describe())
            except Exception as exc:  # a dropped or refused connection: relist after a back-off
                err = as_kube_error(exc, "watch" if rv is not None else "list", w.rbac)
                self._errors[w.name] = err
                rv = None
                log.warning("%s; retrying in %.1fs", err.describe(), backoff)
            await asyncio.sleep(backoff)
            backoff = min(self.max_backoff_s, backoff * 2)
