"""A stateful fake of the Linode API v4 LKE endpoints, served over real HTTP on 127.0.0.1.

Every request and every response is validated against the official OpenAPI spec
(``../shared/specs/linode-openapi.yaml``) with ``openapi-core``. A request that violates the spec gets a 400 in
Linode's error format (``{"errors": [{"reason": ..., "field": ...}]}``) and is recorded in
:attr:`FakeLinodeAPI.invalid_requests`; a response of the fake that violates the spec is a bug in the fake: it is
recorded, answered with a 500, and :meth:`FakeLinodeAPI.check` raises :class:`FakeSpecViolation`.

Implemented endpoints (all under ``/{apiVersion}/lke/clusters/{clusterId}``): cluster get; pools list (paginated),
create, get, update, delete, recycle; nodes get, delete, recycle.

Behaviour beyond the spec, modelled on LKE: nodes start ``not_ready`` and become ``ready`` ``ready_delay_s`` after
creation (on the injected clock, so virtual time works); deleting a node shrinks its pool, and the last node of a
pool cannot be deleted (delete the pool); lowering a pool's ``count`` removes arbitrary nodes (recorded in
:attr:`FakeLinodeAPI.count_decreases`, so tests can assert a client never does it); tags are 3-50 characters;
label keys follow the Kubernetes syntax.

Fault injection: :meth:`FakeLinodeAPI.fail_next` (429 with ``Retry-After``, 5xx, ...),
:meth:`FakeLinodeAPI.delay_next` (the effect is applied, then the response is held back, as when a response is
lost to a client timeout), :meth:`FakeLinodeAPI.stick_not_ready` (nodes that stay ``not_ready`` until recycled),
:attr:`FakeLinodeAPI.max_pools` (pool-count quota) and :attr:`FakeLinodeAPI.unavailable_types` (no capacity).

The spec is parsed once per process and cached (:func:`load_spec`); the parsed document is also cached on disk as
JSON keyed by the spec file's path, size and mtime, which turns a ~0.7 s YAML parse into ~0.03 s.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from openapi_core import Config, OpenAPI
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest, WerkzeugOpenAPIResponse
from openapi_schema_validator import OAS30Validator
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.serving import WSGIRequestHandler
from werkzeug.wrappers import Request, Response

from gpuscale.clock import Clock, SystemClock
from gpuscale.fakes._http import LocalServer, ServedFake

__all__ = [
    "DEFAULT_SPEC_PATH",
    "FakeLinodeAPI",
    "FakeSpecViolation",
    "RecordedRequest",
    "load_spec",
    "spec_load_seconds",
]

DEFAULT_SPEC_PATH = Path(__file__).resolve().parents[3].parent / "shared" / "specs" / "linode-openapi.yaml"
"""The official Linode OpenAPI spec, ``../shared/specs/linode-openapi.yaml`` relative to the repository root."""

SPEC_ENV = "GPUSCALE_LINODE_SPEC"
_CACHE_FORMAT = "1"
_ERROR_SCHEMA_SOURCE = "/{apiVersion}/lke/clusters/{clusterId}/pools"
_LOOPBACK_SERVER = {"url": "http://127.0.0.1:{port}", "variables": {"port": {"default": "80"}}}
_LABEL_MAP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Kubernetes labels (key -> value). Patched by gpuscale: the published schema rejects any label map.",
    "additionalProperties": {"type": "string", "maxLength": 63},
}
_K8S_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY_RE = re.compile(rf"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_K8S_NAME}$")
_LABEL_VALUE_RE = re.compile(rf"^({_K8S_NAME})?$")

_spec_lock = threading.Lock()
_specs: dict[Path, OpenAPI] = {}
_spec_seconds: dict[Path, float] = {}


class FakeSpecViolation(AssertionError):
    """The fake produced a response that violates the OpenAPI spec (a bug in the fake)."""


def _cache_file(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{_CACHE_FORMAT}:{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:32]
    base = Path(os.environ.get("GPUSCALE_CACHE_DIR") or tempfile.gettempdir()) / "gpuscale-spec-cache"
    return base / f"{path.stem}-{key}.json"


def _read_spec_dict(path: Path) -> dict[str, Any]:
    """Parse the YAML spec, through an on-disk JSON cache (JSON parses ~30x faster than YAML)."""
    cache = _cache_file(path)
    with contextlib.suppress(OSError, ValueError):
        data: dict[str, Any] = json.loads(cache.read_text())
        return data
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("rb") as fh:
        data = yaml.load(fh, Loader=loader)
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, cache)
    return data


def _patch_label_maps(node: Any) -> int:
    """Replace the spec's broken ``labels`` schemas (a single ``{key, value}`` object) by a string map."""
    patched = 0
    if isinstance(node, dict):
        labels = node.get("labels")
        if isinstance(labels, dict) and set(labels.get("properties", {})) == {"key", "value"}:
            node["labels"] = dict(_LABEL_MAP_SCHEMA)
            patched += 1
        for value in node.values():
            patched += _patch_label_maps(value)
    elif isinstance(node, list):
        for item in node:
            patched += _patch_label_maps(item)
    return patched


def _patch_spec(data: dict[str, Any]) -> None:
    """Minimal, documented fixes so a correct client can pass: see the module docstring of the tests."""
    data.setdefault("servers", []).append(copy.deepcopy(_LOOPBACK_SERVER))
    for path, item in data.get("paths", {}).items():
        if path.startswith("/{apiVersion}/lke/"):
            _patch_label_maps(item)
            for operation in item.values():
                if isinstance(operation, dict) and "security" in operation:
                    operation["security"] = [{"personalAccessToken": []}]


def load_spec(path: Path | str | None = None) -> OpenAPI:
    """The parsed, patched Linode OpenAPI spec; parsed once per process and path.

    Patches: (1) a loopback server ``http://127.0.0.1:{port}`` is added so requests to the fake resolve; (2) in the
    LKE paths the ``labels`` schema, published as one ``{key, value}`` object with ``additionalProperties: false``
    (which rejects every real label map, including the spec's own examples), is replaced by a map of strings.
    (3) in the LKE paths the ``oauth`` security alternative is dropped (openapi-core cannot evaluate oauth2 and
    would accept any request), so a request without a bearer token is caught.
    The spec itself is not re-validated (that costs ~2.4 s and it is the official document).
    """
    resolved = Path(path or os.environ.get(SPEC_ENV) or DEFAULT_SPEC_PATH).resolve()
    with _spec_lock:
        api = _specs.get(resolved)
        if api is None:
            started = time.perf_counter()
            data = _read_spec_dict(resolved)
            _patch_spec(data)
            api = OpenAPI.from_dict(data, config=Config(spec_validator_cls=None))
            _specs[resolved] = api
            _spec_seconds[resolved] = time.perf_counter() - started
        return api


def spec_load_seconds(path: Path | str | None = None) -> float | None:
    """How long the first :func:`load_spec` of ``path`` took in this process (None if not loaded yet)."""
    resolved = Path(path or os.environ.get(SPEC_ENV) or DEFAULT_SPEC_PATH).resolve()
    return _spec_seconds.get(resolved)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the fake received (the Authorization header is never recorded)."""

    method: str
    path: str
    query: Mapping[str, str]
    body: Any
    status: int
    invalid: tuple[str, ...] = ()


@dataclass(slots=True)
class _Fault:
    status: int | None
    delay_s: float
    retry_after: float | None
    method: str | None
    path: str | None
    remaining: int

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method.upper() == method) and (self.path is None or self.path in path)


@dataclass(slots=True)
class _Node:
    id: str
    instance_id: int
    ready_at: float


@dataclass(slots=True)
class _Pool:
    id: int
    type: str
    tags: list[str]
    labels: dict[str, str]
    taints: list[dict[str, str]]
    nodes: list[_Node] = field(default_factory=list)


@dataclass(slots=True)
class _Cluster:
    id: int
    label: str
    region: str
    pools: dict[int, _Pool] = field(default_factory=dict)


class _ApiError(Exception):
    def __init__(self, status: int, reason: str, field_name: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.field_name = field_name


def _error_body(reason: str, field_name: str | None = None) -> dict[str, Any]:
    err: dict[str, str] = {"reason": reason}
    if field_name:
        err["field"] = field_name
    return {"errors": [err]}


def _schema_error_field(schema_error: Any) -> str | None:
    parts = [str(p) for p in getattr(schema_error, "path", ())]
    validator = getattr(schema_error, "validator", None)
    instance = getattr(schema_error, "instance", None)
    if validator == "required" and isinstance(instance, dict):
        missing = [p for p in getattr(schema_error, "validator_value", ()) if p not in instance]
        parts.extend(missing[:1])
    elif validator == "additionalProperties":
        found = re.search(r"'([^']+)' was unexpected", str(getattr(schema_error, "message", "")))
        if found:
            parts.append(found.group(1))
    return ".".join(parts) or None


def _describe(errors: list[Exception]) -> list[tuple[str | None, str]]:
    """(field, reason) pairs for openapi-core validation errors, as Linode would report them."""
    out: list[tuple[str | None, str]] = []
    for err in errors:
        schema_errors = list(getattr(err.__cause__, "schema_errors", None) or [])
        if schema_errors:
            out.extend((_schema_error_field(se), str(getattr(se, "message", se))) for se in schema_errors)
            continue
        name = getattr(err, "name", None)
        out.append((str(name) if name else None, str(err.__cause__ or err)))
    return list(dict.fromkeys(out))


class _QuietHandler(WSGIRequestHandler):
    def log(self, type: str, message: str, *args: Any) -> None:
        """Silence the per-request access log."""


_ROUTES = Map(
    [
        Rule("/<ver>/lke/clusters/<int:cid>", endpoint="cluster", methods=["GET"]),
        Rule("/<ver>/lke/clusters/<int:cid>/pools", endpoint="pools", methods=["GET", "POST"]),
        Rule("/<ver>/lke/clusters/<int:cid>/pools/<int:pid>", endpoint="pool", methods=["GET", "PUT", "DELETE"]),
        Rule("/<ver>/lke/clusters/<int:cid>/pools/<int:pid>/recycle", endpoint="pool_recycle", methods=["POST"]),
        Rule("/<ver>/lke/clusters/<int:cid>/nodes/<nid>", endpoint="node", methods=["GET", "DELETE"]),
        Rule("/<ver>/lke/clusters/<int:cid>/nodes/<nid>/recycle", endpoint="node_recycle", methods=["POST"]),
    ]
)


class FakeLinodeAPI(ServedFake):
    """The fake Linode API. Use as a context manager or call :meth:`start` / :meth:`stop`.

    ``clock`` drives node readiness (share a :class:`~gpuscale.clock.ManualClock` with the client for virtual
    time); ``ready_delay_s`` is how long a new or recycled node stays ``not_ready``.
    """

    def __init__(
        self,
        *,
        token: str = "fake-linode-token",
        clock: Clock | None = None,
        ready_delay_s: float = 0.0,
        spec_path: Path | str | None = None,
        page_size: int = 100,
    ) -> None:
        self.token = token
        self.clock: Clock = clock or SystemClock()
        self.ready_delay_s = ready_delay_s
        self.page_size = page_size
        self.max_pools: int | None = None
        self.unavailable_types: set[str] = set()
        self.requests: list[RecordedRequest] = []
        self.response_errors: list[str] = []
        self.count_decreases: list[tuple[int, int, int]] = []
        self._spec = load_spec(spec_path)
        error_schema = self._spec.spec / "paths" / _ERROR_SCHEMA_SOURCE / "get" / "responses" / "default"
        self._error_validator = OAS30Validator((error_schema / "content" / "application/json" / "schema").read_value())
        self._lock = threading.RLock()
        self._clusters: dict[int, _Cluster] = {}
        self._faults: list[_Fault] = []
        self._stuck_budget = 0
        self._stuck: set[str] = set()
        self._next_id = 1000
        self._next_instance = 50_000_000
        self._http = LocalServer(self._wsgi, name="fake-linode", handler=_QuietHandler)

    # --- lifecycle -----------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"FakeLinodeAPI(base_url={self.base_url!r}, clusters={sorted(self._clusters)})"

    @property
    def base_url(self) -> str:
        """The API base URL to give a client (``http://127.0.0.1:PORT/v4``)."""
        return f"http://127.0.0.1:{self._http.port('fake Linode API')}/v4"

    def reset(self) -> None:
        """Forget all state, faults and recorded requests (to share one server between tests)."""
        with self._lock:
            self._clusters.clear()
            self._faults.clear()
            self._stuck_budget = 0
            self._stuck.clear()
            self.requests.clear()
            self.response_errors.clear()
            self.count_decreases.clear()
            self.max_pools = None
            self.unavailable_types = set()
            self.ready_delay_s = 0.0
            self.page_size = 100

    # --- state setup and inspection --------------------------------------------------------------------------------
    def create_cluster(self, *, region: str = "us-ord", label: str = "gpuscale-test") -> int:
        """Add an LKE cluster and return its id."""
        with self._lock:
            cid = self._new_id()
            self._clusters[cid] = _Cluster(cid, label, region)
            return cid

    def add_pool(
        self,
        cluster_id: int,
        type_: str,
        count: int,
        *,
        tags: list[str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> int:
        """Create a pool directly (not through HTTP), e.g. a pool gpuscale does not own."""
        with self._lock:
            pool = self._make_pool(self._cluster(cluster_id), type_, count, tags or [], labels or {}, [])
            return pool.id

    def pools(self, cluster_id: int) -> list[dict[str, Any]]:
        """The cluster's pools as the API renders them."""
        with self._lock:
            return [self._render_pool(p) for p in self._cluster(cluster_id).pools.values()]

    def node_ids(self, cluster_id: int) -> set[str]:
        """Ids of every node of the cluster."""
        with self._lock:
            return {n.id for p in self._cluster(cluster_id).pools.values() for n in p.nodes}

    @property
    def invalid_requests(self) -> list[RecordedRequest]:
        """Requests that violated the spec."""
        return [r for r in self.requests if r.invalid]

    def check(self) -> None:
        """Raise :class:`FakeSpecViolation` if the fake ever produced a response that violates the spec."""
        if self.response_errors:
            raise FakeSpecViolation("; ".join(self.response_errors))

    # --- fault injection -----------------------------------------------------------------------------------------
    def fail_next(
        self,
        status: int,
        *,
        times: int = 1,
        retry_after: float | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests with ``status`` (and ``Retry-After`` if given), no effect."""
        with self._lock:
            self._faults.append(_Fault(status, 0.0, retry_after, method, path, times))

    def delay_next(self, seconds: float, *, times: int = 1, method: str | None = None, path: str | None = None) -> None:
        """Apply the next ``times`` matching requests, then hold their responses back for ``seconds`` (real time)."""
        with self._lock:
            self._faults.append(_Fault(None, seconds, None, method, path, times))

    def stick_not_ready(self, count: int = 1) -> None:
        """The next ``count`` nodes created stay ``not_ready`` until recycled."""
        with self._lock:
            self._stuck_budget += count

    # --- internals -----------------------------------------------------------------------------------------------
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _cluster(self, cid: int) -> _Cluster:
        cluster = self._clusters.get(cid)
        if cluster is None:
            raise _ApiError(404, "Not found")
        return cluster

    def _pool(self, cid: int, pid: int) -> _Pool:
        pool = self._cluster(cid).pools.get(pid)
        if pool is None:
            raise _ApiError(404, "Not found")
        return pool

    def _find_node(self, cid: int, nid: str) -> tuple[_Pool, _Node]:
        for pool in self._cluster(cid).pools.values():
            for node in pool.nodes:
                if node.id == nid:
                    return pool, node
        raise _ApiError(404, "Not found")

    def _new_node(self, pool: _Pool) -> _Node:
        self._next_instance += 1
        node = _Node(f"{pool.id}-{self._next_instance:x}", self._next_instance, self.clock.now() + self.ready_delay_s)
        if self._stuck_budget > 0:
            self._stuck_budget -= 1
            self._stuck.add(node.id)
        return node

    def _status(self, node: _Node) -> str:
        return "ready" if node.id not in self._stuck and self.clock.now() >= node.ready_at else "not_ready"

    def _check_capacity(self, cluster: _Cluster, type_: str) -> None:
        if type_ in self.unavailable_types:
            raise _ApiError(400, f"No capacity is available for type {type_} in region {cluster.region}", "type")

    def _make_pool(
        self,
        cluster: _Cluster,
        type_: str,
        count: int,
        tags: list[str],
        labels: dict[str, str],
        taints: list[dict[str, str]],
    ) -> _Pool:
        pool = _Pool(self._new_id(), type_, list(tags), dict(labels), [dict(t) for t in taints])
        pool.nodes = [self._new_node(pool) for _ in range(count)]
        cluster.pools[pool.id] = pool
        return pool

    def _render_pool(self, pool: _Pool) -> dict[str, Any]:
        count = len(pool.nodes)
        return {
            "id": pool.id,
            "type": pool.type,
            "count": count,
            "nodes": [{"id": n.id, "instance_id": str(n.instance_id), "status": self._status(n)} for n in pool.nodes],
            "tags": list(pool.tags),
            "labels": dict(pool.labels),
            "taints": [dict(t) for t in pool.taints],
            "autoscaler": {"enabled": False, "min": max(1, count), "max": max(1, count)},
            "disks": [],
        }

    @staticmethod
    def _check_tags_labels(body: Mapping[str, Any]) -> None:
        for i, tag in enumerate(body.get("tags") or []):
            if not 3 <= len(tag) <= 50:
                raise _ApiError(400, "Tag must be 3-50 characters", f"tags[{i}]")
        for key, value in (body.get("labels") or {}).items():
            if len(key) > 253 + 1 + 63 or not _LABEL_KEY_RE.match(key):
                raise _ApiError(400, f"Invalid label key {key!r}", "labels")
            if not _LABEL_VALUE_RE.match(value):
                raise _ApiError(400, f"Invalid label value {value!r} for key {key!r}", "labels")

    def _handle(self, endpoint: str, method: str, args: Mapping[str, Any], body: Any, query: Mapping[str, str]) -> Any:
        cid: int = args["cid"]
        if endpoint == "cluster":
            cluster = self._cluster(cid)
            stamp = "2024-01-01T00:00:00Z"
            return {
                "id": cluster.id,
                "label": cluster.label,
                "region": cluster.region,
                "k8s_version": "1.31",
                "created": stamp,
                "updated": stamp,
                "tags": [],
                "control_plane": {"high_availability": False},
            }
        if endpoint == "pools" and method == "GET":
            pools = list(self._cluster(cid).pools.values())
            size = max(1, min(500, int(query.get("page_size", self.page_size))))
            page = max(1, int(query.get("page", 1)))
            pages = max(1, -(-len(pools) // size))
            chunk = pools[(page - 1) * size : page * size]
            return {"data": [self._render_pool(p) for p in chunk], "page": page, "pages": pages, "results": len(pools)}
        if endpoint == "pools":
            cluster = self._cluster(cid)
            self._check_tags_labels(body)
            if self.max_pools is not None and len(cluster.pools) >= self.max_pools:
                raise _ApiError(400, f"Node pool limit reached: a cluster may have at most {self.max_pools} pools")
            self._check_capacity(cluster, body["type"])
            pool = self._make_pool(
                cluster,
                body["type"],
                body["count"],
                body.get("tags", []),
                body.get("labels", {}),
                body.get("taints", []),
            )
            return self._render_pool(pool)
        if endpoint == "pool":
            pool = self._pool(cid, args["pid"])
            if method == "GET":
                return self._render_pool(pool)
            if method == "DELETE":
                del self._clusters[cid].pools[pool.id]
                return {}
            return self._update_pool(self._clusters[cid], pool, body)
        if endpoint == "pool_recycle":
            pool = self._pool(cid, args["pid"])
            for node in pool.nodes:
                self._recycle(node)
            return {}
        pool, node = self._find_node(cid, args["nid"])
        if endpoint == "node_recycle":
            self._recycle(node)
            return {}
        if method == "GET":
            return {"id": node.id, "instance_id": node.instance_id, "status": self._status(node)}
        if len(pool.nodes) == 1:
            raise _ApiError(400, "Cannot delete the last node of a node pool; delete the node pool instead")
        pool.nodes.remove(node)
        self._stuck.discard(node.id)
        return {}

    def _update_pool(self, cluster: _Cluster, pool: _Pool, body: Mapping[str, Any]) -> Any:
        self._check_tags_labels(body)
        if "count" in body:
            new, old = int(body["count"]), len(pool.nodes)
            if new > old:
                self._check_capacity(cluster, pool.type)
                pool.nodes.extend(self._new_node(pool) for _ in range(new - old))
            elif new < old:
                # LKE removes nodes of its own choosing, busy or not: recorded so tests can forbid it.
                self.count_decreases.append((pool.id, old, new))
                del pool.nodes[new:]
        if "labels" in body:
            pool.labels = dict(body["labels"])
        if "taints" in body:
            pool.taints = [dict(t) for t in body["taints"]]
        return self._render_pool(pool)

    def _recycle(self, node: _Node) -> None:
        self._next_instance += 1
        node.instance_id = self._next_instance
        node.ready_at = self.clock.now() + self.ready_delay_s
        self._stuck.discard(node.id)

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        for fault in self._faults:
            if fault.remaining > 0 and fault.matches(method, path):
                fault.remaining -= 1
                return fault
        return None

    def _respond(
        self,
        request: Request,
        status: int,
        payload: Any,
        headers: Mapping[str, str] | None = None,
        *,
        validate: bool = True,
    ) -> Response:
        response = Response(
            json.dumps(payload), status=status, mimetype="application/json", headers=dict(headers or {})
        )
        if not validate:
            return response
        result = self._spec.unmarshal_response(WerkzeugOpenAPIRequest(request), WerkzeugOpenAPIResponse(response))
        problems = _describe(list(result.errors))
        if status >= 400 and [type(e).__name__ for e in result.errors] == ["ResponseNotFound"]:
            # Some operations (e.g. PUT pool) document no error response: hold errors to Linode's error schema.
            problems = [
                (".".join(map(str, e.path)) or None, e.message) for e in self._error_validator.iter_errors(payload)
            ]
        if problems:
            detail = "; ".join(f"{f or '-'}: {r}" for f, r in problems)
            with self._lock:
                self.response_errors.append(f"{request.method} {request.path} -> {status}: {detail}")
            return Response(
                json.dumps(_error_body("fake produced a response that violates the spec")),
                status=500,
                mimetype="application/json",
            )
        return response

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return self._dispatch(Request(environ))(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        method, path = request.method, request.path
        query = dict(request.args)
        raw = request.get_data(as_text=True)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw

        def record(status: int, invalid: tuple[str, ...] = ()) -> None:
            with self._lock:
                self.requests.append(RecordedRequest(method, path, query, body, status, invalid))

        validation = self._spec.unmarshal_request(WerkzeugOpenAPIRequest(request))
        if validation.errors:
            problems = _describe(list(validation.errors))
            kinds = {type(e).__name__ for e in validation.errors}
            unknown = bool(kinds & {"PathNotFound", "OperationNotFound", "ServerNotFound"})
            unauthenticated = bool(kinds & {"SecurityNotFound", "SecurityValidationError"})
            status = 404 if unknown else 401 if unauthenticated else 400
            record(status, tuple(f"{f or '-'}: {r}" for f, r in problems))
            payload = {"errors": [_error_body(r, f)["errors"][0] for f, r in problems]}
            return self._respond(request, status, payload, validate=not unknown)  # no spec for an unknown path
        if request.headers.get("Authorization", "") != f"Bearer {self.token}":
            record(401)
            return self._respond(request, 401, _error_body("Invalid Token"))
        with self._lock:
            fault = self._take_fault(method, path)
        if fault is not None and fault.status is not None:
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            record(fault.status)
            return self._respond(request, fault.status, _error_body("Injected fault"), headers)
        try:
            adapter = _ROUTES.bind("127.0.0.1")
            endpoint, args = adapter.match(path, method=method)
            with self._lock:
                payload = self._handle(str(endpoint), method, args, body, query)
            status = 200
        except _ApiError as exc:
            status, payload = exc.status, _error_body(exc.reason, exc.field_name)
        except HTTPException as exc:
            status, payload = exc.code or 404, _error_body("Not found")
        record(status)
        response = self._respond(request, status, payload)
        if fault is not None and fault.delay_s > 0:
            time.sleep(fault.delay_s)
        return response
