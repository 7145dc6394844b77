"""A Kubernetes API server emulator for tests, built on kmock's Kubernetes scaffold (discovery, Status errors).

:class:`KubeAPIEmulator` keeps objects in memory and behaves like the API server where gpuscale relies on it:

* server metadata stamped on create (``uid``, ``resourceVersion``, ``creationTimestamp``, ``generateName``, the
  namespace from the URL), 201 on create, 409 ``AlreadyExists``;
* one cluster-wide resourceVersion counter; ``PUT`` and patches carrying ``metadata.resourceVersion`` get 409
  ``Conflict`` when it is stale;
* JSON merge patch (RFC 7386) and JSON patch (RFC 6902); strategic merge and server-side apply are refused (415);
* a ``status`` subresource: writes to the object ignore ``status`` (except on create of a Node, as the real server
  allows), writes to ``/status`` change only ``status``;
* label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``) and field selectors
  (``metadata.name``, ``metadata.namespace``, ``spec.nodeName``, ``status.phase``, ``spec.unschedulable``);
* list then watch from a resourceVersion, replaying the retained history; a resourceVersion older than the history
  (see :meth:`KubeAPIEmulator.compact`) gets the real server's ``ERROR`` event with code 410 ``Expired``;
* the Eviction subresource with PodDisruptionBudget checks (429 when a budget allows no disruption);
* the ``scale`` subresource of Deployments, StatefulSets and ReplicaSets (an ``autoscaling/v1`` Scale: GET, PATCH,
  PUT; the workload's ``spec.replicas`` follows, ``status.selector`` comes from its ``spec.selector``);
* Leases, Events and gpuscale's CRDs as ordinary resources (more with :meth:`KubeAPIEmulator.add_resource`).

:class:`KubeAPIServer` runs it on 127.0.0.1 in a background thread (a free port, kept across :meth:`stop` and
:meth:`start` so a client sees the server go away and come back) with thread-safe helpers for tests.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import datetime
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import rendering

from gpuscale.fakes.kube_selectors import (
    ApiError,
    api_error,
    field_matcher,
    int_or_percent,
    label_matcher,
    merge_patch,
    selector_matches,
)

__all__ = [
    "ApiError",
    "KubeAPIEmulator",
    "KubeAPIServer",
    "ResourceType",
    "field_matcher",
    "label_matcher",
    "selector_matches",
]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource: where it lives and what it is."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status: bool = True
    """Has a ``status`` subresource."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "pods", "Pod", True),
    ResourceType("", "v1", "nodes", "Node", False),
    ResourceType("", "v1", "namespaces", "Namespace", False),
    ResourceType("", "v1", "events", "Event", True, status=False),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, status=False),
    ResourceType("", "v1", "secrets", "Secret", True, status=False),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True),
    ResourceType("apps", "v1", "deployments", "Deployment", True),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", True),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", True),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, status=False),
    ResourceType("gpuscale.io", "v1alpha1", "gpunodepools", "GPUNodePool", False),
    ResourceType("gpuscale.io", "v1alpha1", "gpunodeclaims", "GPUNodeClaim", False),
    ResourceType("gpuscale.io", "v1alpha1", "offeringavailabilities", "OfferingAvailability", False),
    ResourceType("gpuscale.io", "v1alpha1", "gpuprovisioningrequests", "GPUProvisioningRequest", True),
    ResourceType("gpuscale.io", "v1alpha1", "gpuworkloadscalers", "GPUWorkloadScaler", True),
    ResourceType("gpuscale.io", "v1alpha1", "gpubudgets", "GPUBudget", True),
)
SCALABLE = frozenset({("apps", "deployments"), ("apps", "statefulsets"), ("apps", "replicasets")})
"""(group, plural) of the resources served with a ``scale`` subresource."""

Key = tuple[str, str, str]
"""(resource key ``group/version/plural``, namespace or "", name)."""


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------------ emulator
@attrs.define(kw_only=True)
class KubeAPIEmulator(kmock.KubernetesScaffold):
    """An in-memory Kubernetes API server (see the module docstring). ``history`` bounds the watch replay window."""

    history: int = 10_000
    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    _objects: dict[Key, Obj] = attrs.field(factory=dict, init=False)
    _rv: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _last_rv: int = attrs.field(default=0, init=False)
    _log: list[tuple[int, str, str, Obj]] = attrs.field(factory=list, init=False)
    """(resourceVersion, resource key, event type, object) in order."""
    _oldest: int = attrs.field(default=0, init=False)
    """Watches from a resourceVersion below this get 410 Gone."""
    _changed: asyncio.Condition | None = attrs.field(default=None, init=False)
    _watch_epoch: int = attrs.field(default=0, init=False)
    requests_seen: list[tuple[str, str]] = attrs.field(factory=list, init=False)
    """(verb, resource) of every resource request served, for RBAC checks in tests."""
    created_at: dict[tuple[str, str, str], float] = attrs.field(factory=dict, init=False)
    """(plural, namespace, name) -> ``time.monotonic()`` when it was created (for latency benchmarks)."""
    token: str | None = None
    """When set, requests must carry ``Authorization: Bearer <token>`` (else 401)."""
    forbidden: set[tuple[str, str]] = attrs.field(factory=set)
    """(verb, RBAC resource) pairs answered 403 Forbidden, and denied by SelfSubjectAccessReviews."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rt in BUILTIN_RESOURCES:
            self.add_resource(rt)
        self.fallback["get /version/"] << self._serve_server_version  # some clients ask with a slash
        self.fallback[re.compile(r"/apis?/.+")] << self._serve

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        """A ``Status`` object with the exact ``application/json`` content type the API server sends."""
        if isinstance(exc, kmock.KubernetesError):
            code, reason, message, details = exc.status, exc.reason or "", exc.message or "", exc.details or {}
        else:
            code, reason, message, details = 500, "InternalError", repr(exc), {}
        status = {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
            "details": details,
        }
        return aiohttp.web.Response(body=json.dumps(status).encode(), status=code, content_type="application/json")

    # ------------------------------------------------------------------ setup
    def add_resource(self, rt: ResourceType) -> None:
        """Serve another resource (e.g. a CRD)."""
        self._types[(rt.group, rt.version, rt.plural)] = rt
        subresources = {"status"} if rt.status else set()
        if rt.plural == "pods":
            subresources |= {"eviction", "binding"}
        if (rt.group, rt.plural) in SCALABLE:
            subresources |= {"scale"}
        self.resources[f"{rt.group}/{rt.version}/{rt.plural}" if rt.group else f"v1/{rt.plural}"] = kmock.ResourceInfo(
            kind=rt.kind,
            namespaced=rt.namespaced,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            subresources=subresources,
        )

    def resource_type(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self._types.get((group, version, plural))
        if rt is None:
            raise api_error(404, "NotFound", f"the server could not find the requested resource ({plural})")
        return rt

    # ------------------------------------------------------------------ state (call on the server's loop)
    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    @property
    def resource_version(self) -> int:
        """The latest resourceVersion."""
        return self._last_rv

    async def _emit(self, rt: ResourceType, kind: str, obj: Obj) -> None:
        self._log.append((int(obj["metadata"]["resourceVersion"]), _rkey(rt), kind, copy.deepcopy(obj)))
        if len(self._log) > self.history:
            drop = len(self._log) - self.history
            self._oldest = self._log[drop - 1][0]
            del self._log[:drop]
        cond = self._cond()
        async with cond:
            cond.notify_all()

    def _bump(self, obj: Obj) -> None:
        self._last_rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self._last_rv)

    def objects(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Stored objects of a resource (copies), optionally of one namespace."""
        return [copy.deepcopy(o) for o in self._select(rt, namespace)]

    def _select(self, rt: ResourceType, namespace: str | None, keep: Callable[[Obj], bool] | None = None) -> list[Obj]:
        """The stored objects themselves (never changed in place: every write stores a new dict), for reading."""
        rk = _rkey(rt)
        return [
            o
            for (k, ns, _), o in self._objects.items()
            if k == rk and namespace in (None, ns) and (keep is None or keep(o))
        ]

    def read_obj(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self._objects.get((_rkey(rt), namespace, name))
        if obj is None:
            raise api_error(404, "NotFound", f'{rt.plural} "{name}" not found', name=name, kind=rt.plural)
        return obj

    async def create_obj(self, rt: ResourceType, namespace: str, body: Obj) -> Obj:
        if not isinstance(body, dict):
            raise api_error(400, "BadRequest", "the body must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        ns = namespace if rt.namespaced else ""
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise api_error(
                    400, "BadRequest", "the namespace of the object does not match the namespace of the URL"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise api_error(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        key = (_rkey(rt), ns, name)
        if key in self._objects:
            raise api_error(409, "AlreadyExists", f'{rt.plural} "{name}" already exists', name=name, kind=rt.plural)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta.pop("deletionTimestamp", None)
        if rt.status and rt.kind != "Node":
            obj.pop("status", None)
        if rt.kind == "Pod":
            obj["status"] = {"phase": "Pending"}  # the server owns a new pod's status
        self._bump(obj)
        self._objects[key] = obj
        self.created_at[(rt.plural, ns, name)] = time.monotonic()
        await self._emit(rt, "ADDED", obj)
        return obj

    async def replace_obj(self, rt: ResourceType, namespace: str, name: str, body: Obj, sub: str | None) -> Obj:
        current = self.read_obj(rt, namespace, name)
        if not isinstance(body, dict):
            raise api_error(400, "BadRequest", "the body must be a JSON object")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        self._check_rv(rt, name, current, rv)
        new = copy.deepcopy(body)
        if sub == "status":
            new = {**copy.deepcopy(current), "status": new.get("status")}
        elif rt.status:
            new["status"] = copy.deepcopy(current.get("status"))
        return await self._store(rt, current, new)

    async def patch_obj(
        self, rt: ResourceType, namespace: str, name: str, body: Any, ctype: str, sub: str | None
    ) -> Obj:
        current = self.read_obj(rt, namespace, name)
        if ctype.startswith("application/merge-patch+json"):
            if not isinstance(body, dict):
                raise api_error(400, "BadRequest", "a merge patch must be a JSON object")
            self._check_rv(rt, name, current, (body.get("metadata") or {}).get("resourceVersion"))
            new = merge_patch(copy.deepcopy(current), body)  # stored objects are never changed in place
        elif ctype.startswith("application/json-patch+json"):
            try:
                new = jsonpatch.apply_patch(current, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as exc:
                raise api_error(422, "Invalid", f"the JSON patch cannot be applied: {exc}") from None
        else:
            raise api_error(
                415,
                "UnsupportedMediaType",
                f"patch type {ctype!r} is not served: use merge-patch+json or json-patch+json",
            )
        if sub == "status":
            new = {**copy.deepcopy(current), "status": new.get("status")}
        elif rt.status:
            new["status"] = copy.deepcopy(current.get("status"))
        return await self._store(rt, current, new)

    def _check_rv(self, rt: ResourceType, name: str, current: Obj, rv: Any) -> None:
        if rv not in (None, "") and str(rv) != current["metadata"]["resourceVersion"]:
            raise api_error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                name=name,
                kind=rt.plural,
            )

    async def _store(self, rt: ResourceType, current: Obj, new: Obj) -> Obj:
        meta = new.setdefault("metadata", {})
        for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
            else:
                meta.pop(field, None)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        if new == current:
            return current  # a no-op write keeps the resourceVersion, as the real server does
        self._bump(new)
        key = (_rkey(rt), current["metadata"].get("namespace", ""), current["metadata"]["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[key]
            await self._emit(rt, "DELETED", new)
            return new
        self._objects[key] = new
        await self._emit(rt, "MODIFIED", new)
        return new

    async def delete_obj(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        current = self.read_obj(rt, namespace, name)
        key = (_rkey(rt), namespace if rt.namespaced else "", name)
        if current["metadata"].get("finalizers"):
            if not current["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(current)
                new["metadata"]["deletionTimestamp"] = _now()
                return await self._store(rt, current, new)
            return current
        del self._objects[key]
        gone = copy.deepcopy(current)
        self._bump(gone)
        await self._emit(rt, "DELETED", gone)
        return gone

    async def evict(self, namespace: str, name: str, body: Any) -> Obj:
        """The Eviction subresource: refuse with 429 when a PodDisruptionBudget allows no disruption."""
        pods = self._types[("", "v1", "pods")]
        pod = self.read_obj(pods, namespace, name)
        labels = pod["metadata"].get("labels") or {}
        phase = (pod.get("status") or {}).get("phase")
        if phase not in ("Succeeded", "Failed"):
            for pdb in self._select(self._types[("policy", "v1", "poddisruptionbudgets")], namespace):
                if selector_matches((pdb.get("spec") or {}).get("selector"), labels) and self.pdb_allowed(pdb) < 1:
                    raise api_error(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        causes=[{"reason": "DisruptionBudget", "message": f"{pdb['metadata']['name']} allows 0"}],
                    )
        await self.delete_obj(pods, namespace, name)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    async def scale(self, rt: ResourceType, namespace: str, name: str, method: str, request: Any) -> Obj:
        """The ``scale`` subresource: the workload as an ``autoscaling/v1`` Scale; a write sets ``spec.replicas``."""
        current = self.read_obj(rt, namespace, name)
        if method != "GET":
            scale = self._scale_of(current)
            if method == "PUT":
                body = request.data if isinstance(request.data, dict) else None
                if body is None:
                    raise api_error(400, "BadRequest", "the body must be a JSON object")
                self._check_rv(rt, name, current, (body.get("metadata") or {}).get("resourceVersion"))
                new_scale = body
            else:
                ctype = request.headers.get("Content-Type", request.headers.get("content-type", ""))
                patch = json.loads(request.body or b"null")
                if ctype.startswith("application/merge-patch+json") and isinstance(patch, dict):
                    new_scale = merge_patch(scale, patch)
                elif ctype.startswith("application/json-patch+json"):
                    try:
                        new_scale = jsonpatch.apply_patch(scale, patch)
                    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as exc:
                        raise api_error(422, "Invalid", f"the JSON patch cannot be applied: {exc}") from None
                else:
                    raise api_error(415, "UnsupportedMediaType", f"patch type {ctype!r} is not served on scale")
            replicas = (new_scale.get("spec") or {}).get("replicas")
            if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
                raise api_error(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}: must be an integer >= 0")
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["replicas"] = replicas
            current = await self._store(rt, current, new)
        return self._scale_of(current)

    @staticmethod
    def _scale_of(obj: Obj) -> Obj:
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        labels = ((spec.get("selector") or {}).get("matchLabels")) or {}
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": int(spec.get("replicas", 1))},
            "status": {"replicas": int(status.get("replicas") or 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))},
        }  # fmt: skip

    def pdb_allowed(self, pdb: Obj) -> int:
        """Disruptions a PodDisruptionBudget allows now, from the running pods it selects."""
        spec = pdb.get("spec") or {}
        ns = pdb["metadata"].get("namespace", "")
        pods = [
            p
            for p in self._select(self._types[("", "v1", "pods")], ns)
            if selector_matches(spec.get("selector"), p["metadata"].get("labels") or {})
            and not p["metadata"].get("deletionTimestamp")
        ]
        healthy = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        if spec.get("minAvailable") is not None:
            return healthy - int_or_percent(spec["minAvailable"], len(pods), round_up=True)
        if spec.get("maxUnavailable") is not None:
            return int_or_percent(spec["maxUnavailable"], len(pods), round_up=True) - (len(pods) - healthy)
        return len(pods)

    def compact(self) -> None:
        """Forget the watch history: a watch from any earlier resourceVersion now gets 410 Gone."""
        self._log.clear()
        self._oldest = self._last_rv

    async def drop_watches(self) -> None:
        """End every open watch stream (as an API server restart or a load balancer timeout does)."""
        self._watch_epoch += 1
        cond = self._cond()
        async with cond:
            cond.notify_all()

    # ------------------------------------------------------------------ HTTP
    async def _serve(self, request: rendering.Request) -> Any:
        # kmock keeps the status of the last Response a reaction returned: every answer names its own status
        status, payload = await self._answer(request)
        return rendering.Response(status=status, payload=payload)

    def _see(self, request: rendering.Request, verb: str, resource: str) -> None:
        """Record a request and authorise it (token, then the forbidden pairs)."""
        self.requests_seen.append((verb, resource))
        if self.token is not None:
            header = request.headers.get("Authorization", request.headers.get("authorization", ""))
            if header != f"Bearer {self.token}":
                raise api_error(401, "Unauthorized", "Unauthorized")
        if (verb, resource) in self.forbidden:
            plural, _, group = resource.partition(".")
            raise api_error(
                403,
                "Forbidden",
                f'{plural} is forbidden: User "system:serviceaccount:gpuscale:gpuscale" cannot {verb} resource '
                f'"{plural}" in API group "{group}"',
            )

    def _access_review(self, request: rendering.Request) -> Obj:
        """A SelfSubjectAccessReview: allowed unless the pair is in :attr:`forbidden`."""
        self._see(request, "create", "selfsubjectaccessreviews.authorization.k8s.io")
        body = request.data if isinstance(request.data, dict) else {}
        attrs_ = (body.get("spec") or {}).get("resourceAttributes") or {}
        res = attrs_.get("resource", "")
        if attrs_.get("group"):
            res = f"{res}.{attrs_['group']}"
        if attrs_.get("subresource"):
            res = f"{res}/{attrs_['subresource']}"
        allowed = (attrs_.get("verb", ""), res) not in self.forbidden
        return {**body, "status": {"allowed": allowed, **({} if allowed else {"reason": "RBAC: not granted"})}}

    async def _answer(self, request: rendering.Request) -> tuple[int, Any]:
        if request.resource is None:
            raise api_error(404, "NotFound", "not a resource path")
        if request.resource.group == "authorization.k8s.io" and request.resource.plural == "selfsubjectaccessreviews":
            return 201, self._access_review(request)
        rt = self.resource_type(
            request.resource.group or "", request.resource.version or "", request.resource.plural or ""
        )
        ns = request.namespace or ""
        method = str(request.method.value).upper()
        params = request.params
        name, sub = request.name, request.subresource
        if name is None:
            if method == "GET" and params.get("watch", "").lower() in ("true", "1", "t"):  # Go's ParseBool
                self._see(request, "watch", _rbac(rt))
                return 200, self._watch(rt, request.namespace, params)
            if method == "GET":
                self._see(request, "list", _rbac(rt))
                return 200, self._list(rt, request.namespace, params)
            if method == "POST":
                self._see(request, "create", _rbac(rt))
                return 201, await self.create_obj(rt, ns, request.data)
            raise api_error(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
        res = _rbac(rt) + (f"/{sub}" if sub else "")
        if sub == "eviction" and rt.plural == "pods" and method == "POST":
            self._see(request, "create", res)
            return 201, await self.evict(ns, name, request.data)
        if sub == "scale" and (rt.group, rt.plural) in SCALABLE and method in ("GET", "PATCH", "PUT"):
            self._see(request, {"GET": "get", "PATCH": "patch", "PUT": "update"}[method], res)
            return 200, await self.scale(rt, ns, name, method, request)
        if sub not in (None, "status") or (sub == "status" and not rt.status):
            raise api_error(404, "NotFound", f"the server could not find the requested resource ({res})")
        if method == "GET":
            self._see(request, "get", res)
            return 200, copy.deepcopy(self.read_obj(rt, ns, name))
        if method == "PUT":
            self._see(request, "update", res)
            return 200, copy.deepcopy(await self.replace_obj(rt, ns, name, request.data, sub))
        if method == "PATCH":
            self._see(request, "patch", res)
            ctype = request.headers.get("Content-Type", request.headers.get("content-type", ""))
            body = json.loads(request.body or b"null")
            return 200, copy.deepcopy(await self.patch_obj(rt, ns, name, body, ctype, sub))
        if method == "DELETE" and sub is None:
            self._see(request, "delete", res)
            return 200, copy.deepcopy(await self.delete_obj(rt, ns, name))
        raise api_error(405, "MethodNotAllowed", f"{method} is not allowed here")

    def _filters(self, params: Mapping[str, str]) -> Callable[[Obj], bool]:
        labels = label_matcher(params.get("labelSelector", ""))
        fields = field_matcher(params.get("fieldSelector", ""))
        return lambda o: labels(o.get("metadata", {}).get("labels") or {}) and fields(o)

    def _list(self, rt: ResourceType, namespace: str | None, params: Mapping[str, str]) -> Obj:
        keep = self._filters(params)
        items = self._select(rt, namespace, keep)  # serialised at once
        return {
            "apiVersion": rt.api_version,
            "kind": f"{rt.kind}List",
            "metadata": {"resourceVersion": str(self._last_rv)},
            "items": items,
        }

    async def _watch(self, rt: ResourceType, namespace: str | None, params: Mapping[str, str]) -> AsyncIterator[Any]:
        keep = self._filters(params)
        rk = _rkey(rt)
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        epoch = self._watch_epoch

        def visible(kind_rk: str, obj: Obj) -> bool:
            ns = obj.get("metadata", {}).get("namespace", "")
            return kind_rk == rk and namespace in (None, ns) and keep(obj)

        start = params.get("resourceVersion", "")
        if start in ("", "0"):
            since = self._last_rv
            initial = self._select(rt, namespace, keep)
            yield b""  # send the headers now
            for obj in initial:
                yield {"type": "ADDED", "object": obj}
        else:
            yield b""
            since = int(start)
        cond = self._cond()
        while True:
            if since < self._oldest:  # history this watch still needs is gone (compacted, or trimmed while it lagged)
                yield self._expired(since)
                return
            first = bisect.bisect_right(self._log, since, key=lambda e: e[0])
            for rv, k, t, o in self._log[first:]:
                since = rv
                if visible(k, o):
                    yield {"type": t, "object": copy.deepcopy(o)}
            if epoch != self._watch_epoch:
                return
            left = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if left is not None and left <= 0:
                return
            async with cond:
                if self._last_rv <= since and epoch == self._watch_epoch:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cond.wait(), timeout=left if left is not None else 1.0)

    def _expired(self, since: int) -> Obj:
        """The watch ``ERROR`` event of a resourceVersion older than the history kept (410 Expired)."""
        return {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {since} ({self._oldest})",
                "reason": "Expired",
                "code": 410,
            },
        }


def _rkey(rt: ResourceType) -> str:
    return f"{rt.group}/{rt.version}/{rt.plural}"


def _rbac(rt: ResourceType) -> str:
    """``plural.group`` as RBAC names resources (``pods``, ``leases.coordination.k8s.io``)."""
    return f"{rt.plural}.{rt.group}" if rt.group else rt.plural


# ------------------------------------------------------------------------------------------------ server
class KubeAPIServer:
    """Runs a :class:`KubeAPIEmulator` over real HTTP on 127.0.0.1 in a background thread.

    Thread-safe helpers (:meth:`create`, :meth:`patch`, :meth:`delete`, :meth:`get`, :meth:`list`) act on the
    emulator's loop, so watchers see the same events as for HTTP writes. :meth:`stop` closes the port (connections
    are refused) but keeps the objects; :meth:`start` serves them again on the same port.
    """

    def __init__(self, emulator: KubeAPIEmulator | None = None) -> None:
        self.emulator = emulator if emulator is not None else KubeAPIEmulator()
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-api-emulator", daemon=True)
        self._thread.start()
        self._server: kmock.Server | None = None
        self._entered = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, coro: Any, timeout: float = 10.0) -> Any:
        """Run a coroutine on the emulator's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` on the emulator's loop (for reads of its state)."""

        async def go() -> Any:
            return fn()

        return self.run(go())

    def start(self) -> KubeAPIServer:
        async def up() -> int:
            if not self._entered:
                await self.emulator.__aenter__()
                self._entered = True
            server = kmock.Server(self.emulator, host="127.0.0.1", port=self.port)
            await server.__aenter__()
            self._server = server
            return server.port

        self.port = self.run(up())
        return self

    def stop(self) -> None:
        """Close the port (open watches end); objects are kept."""

        async def down() -> None:
            if self._server is not None:
                await self.emulator.drop_watches()
                runner = self._server.server.runner
                if runner is not None:
                    runner._shutdown_timeout = 0.2  # close open streams now, as a crashed server would
                await self._server.__aexit__(None, None, None)
                self._server = None

        self.run(down())

    def close(self) -> None:
        """Stop for good."""
        self.stop()

        async def leave() -> None:
            if self._entered:
                await self.emulator.__aexit__(None, None, None)
                self._entered = False

        self.run(leave())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def _rt(self, resource: str) -> ResourceType:
        """``pods``, ``nodes``, ``poddisruptionbudgets``, ``leases``, ``gpunodepools``, ... (plural name)."""
        for rt in self.emulator._types.values():
            if rt.plural == resource:
                return rt
        raise KeyError(resource)

    def create(self, resource: str, obj: Obj, namespace: str = "default") -> Obj:
        return copy.deepcopy(self.run(self.emulator.create_obj(self._rt(resource), namespace, obj)))

    def patch(self, resource: str, name: str, patch: Obj, namespace: str = "default", status: bool = False) -> Obj:
        rt = self._rt(resource)
        ns = namespace if rt.namespaced else ""
        sub = "status" if status else None
        return copy.deepcopy(
            self.run(self.emulator.patch_obj(rt, ns, name, patch, "application/merge-patch+json", sub))
        )

    def delete(self, resource: str, name: str, namespace: str = "default") -> None:
        rt = self._rt(resource)
        self.run(self.emulator.delete_obj(rt, namespace if rt.namespaced else "", name))

    def get(self, resource: str, name: str, namespace: str = "default") -> Obj | None:
        rt = self._rt(resource)
        ns = namespace if rt.namespaced else ""
        found: Obj | None = self.call(lambda: copy.deepcopy(self.emulator._objects.get((_rkey(rt), ns, name))))
        return found

    def items(self, resource: str, namespace: str | None = None) -> list[Obj]:
        rt = self._rt(resource)
        return list(self.call(lambda: self.emulator.objects(rt, namespace)))

    def compact(self) -> None:
        self.call(self.emulator.compact)

    def drop_watches(self) -> None:
        self.run(self.emulator.drop_watches())

    def requests(self) -> list[tuple[str, str]]:
        return list(self.call(lambda: list(self.emulator.requests_seen)))


def all_pairs(emulators: Iterable[KubeAPIEmulator]) -> set[tuple[str, str]]:
    """Every (verb, resource) pair the emulators served."""
    return {pair for e in emulators for pair in e.requests_seen}
