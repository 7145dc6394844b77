"""A stateful fake of the Alibaba Cloud ACK (Container Service, API 2015-12-15) node-pool endpoints over real HTTP.

Requests and responses are checked against the official SDK's own models (``alibabacloud_cs20151215.models``): a
request body (or query) must survive ``Model().from_map(x).to_map()`` unchanged (so it has no field the model does
not know and every value is of the model's type), pass the model's ``validate()``, and carry the fields the action
requires; the ``x-acs-action`` and ``x-acs-version`` headers must name the action routed to, and the
``ACS3-HMAC-SHA256`` signature is recomputed with the fake's AccessKey secret (a wrong key or secret gets 400
``SignatureDoesNotMatch`` / 404 ``InvalidAccessKeyId.NotFound``, as ACK answers). A bad request gets 400 in ACK's
error format (``{"code", "message", "requestId"}``) and is recorded in :attr:`FakeAlibabaAPI.invalid_requests`; a
response that does not round-trip through its model is recorded in :attr:`FakeAlibabaAPI.response_errors`.

Actions: CreateClusterNodePool, DescribeClusterNodePools, ScaleClusterNodePool (adds ``count`` nodes),
ModifyClusterNodePool (``scaling_group.tags``, kept at once, and a ``desired_size`` that grows the pool in a task;
tags are held to Auto Scaling's limits: 20 per group, 128 characters per key and value),
RemoveNodePoolNodes (``drain_node`` and ``release_node`` recorded in :attr:`FakeAlibabaAPI.removals`),
DeleteClusterNodepool, DescribeClusterNodes, DescribeTaskInfo. Changes are tasks that run ``task_delay_s`` on the
injected clock; a pool runs one task at a time (another gets 400 ``ErrorNodePoolNotActive``, the fake's name for
ACK's refusal to change a pool that is not ``active``); new nodes are ``initial`` for ``boot_delay_s``, then
``running``. Faults: :attr:`FakeAlibabaAPI.no_stock` (instance types whose nodes cannot be created: the task fails
with ``OperationDenied.NoStock``), :attr:`FakeAlibabaAPI.max_nodes_quota` (nodes per account: beyond it 400
``QuotaExceed.ElasticQuota``), :meth:`FakeAlibabaAPI.fail_next` (an error for the next matching request).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from alibabacloud_cs20151215 import models as cs
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from gpuscale.clock import Clock, SystemClock
from gpuscale.fakes._http import LocalServer, ServedFake

__all__ = ["ACTIONS", "FakeAlibabaAPI"]

VERSION = "2015-12-15"
ACTIONS: dict[str, tuple[str, str, Any, Any]] = {
    "CreateClusterNodePool": (
        "POST",
        "/clusters/<cluster>/nodepools",
        cs.CreateClusterNodePoolRequest,
        cs.CreateClusterNodePoolResponseBody,
    ),
    "DescribeClusterNodePools": (
        "GET",
        "/clusters/<cluster>/nodepools",
        cs.DescribeClusterNodePoolsRequest,
        cs.DescribeClusterNodePoolsResponseBody,
    ),
    "ScaleClusterNodePool": (
        "POST",
        "/clusters/<cluster>/nodepools/<pool>",
        cs.ScaleClusterNodePoolRequest,
        cs.ScaleClusterNodePoolResponseBody,
    ),
    "ModifyClusterNodePool": (
        "PUT",
        "/clusters/<cluster>/nodepools/<pool>",
        cs.ModifyClusterNodePoolRequest,
        cs.ModifyClusterNodePoolResponseBody,
    ),
    "RemoveNodePoolNodes": (
        "DELETE",
        "/clusters/<cluster>/nodepools/<pool>/nodes",
        cs.RemoveNodePoolNodesShrinkRequest,
        cs.RemoveNodePoolNodesResponseBody,
    ),
    "DeleteClusterNodepool": (
        "DELETE",
        "/clusters/<cluster>/nodepools/<pool>",
        cs.DeleteClusterNodepoolRequest,
        cs.DeleteClusterNodepoolResponseBody,
    ),
    "DescribeClusterNodes": (
        "GET",
        "/clusters/<cluster>/nodes",
        cs.DescribeClusterNodesRequest,
        cs.DescribeClusterNodesResponseBody,
    ),
    "DescribeTaskInfo": ("GET", "/tasks/<task>", None, cs.DescribeTaskInfoResponseBody),
}
"""Action -> (HTTP method, path, request model, response body model)."""

_REQUIRED = {
    "CreateClusterNodePool": ("nodepool_info.name", "scaling_group.instance_types", "scaling_group.vswitch_ids"),
    "ScaleClusterNodePool": ("count",),
    "RemoveNodePoolNodes": ("instance_ids",),
}


class _Fail(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class _Node:
    instance_id: str
    name: str
    instance_type: str
    created: float
    removing_at: float | None = None


@dataclass
class _Pool:
    id: str
    cluster: str
    body: dict[str, Any]
    created: float
    state: str = "initial"
    nodes: dict[str, _Node] = field(default_factory=dict)
    task: str = ""


@dataclass
class _Task:
    id: str
    cluster: str
    kind: str
    start: float
    done_at: float
    apply: Callable[[], None]
    pool: str = ""
    state: str = "running"
    error: dict[str, str] | None = None


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _lost(given: Any, back: Any, where: str) -> list[str]:
    """Where ``back`` (a model's ``to_map`` of ``given``) lost or changed something of ``given``; the model may add
    empty defaults."""
    if isinstance(given, dict) and isinstance(back, dict):
        return [
            e
            for k, v in given.items()
            for e in (_lost(v, back[k], f"{where}.{k}") if k in back else [f"{where}.{k} (unknown field)"])
        ]
    if isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        return [e for i, (a, b) in enumerate(zip(given, back, strict=True)) for e in _lost(a, b, f"{where}[{i}]")]
    return [] if given == back and type(given) is type(back) else [f"{where or 'body'} ({given!r:.40})"]


def _get(d: dict[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


class FakeAlibabaAPI(ServedFake):
    """The fake ACK API. ``access_key_id`` / ``access_key_secret`` are the credentials it accepts."""

    def __init__(self, *, clock: Clock | None = None, task_delay_s: float = 0.0, boot_delay_s: float = 0.0) -> None:
        self.clock: Clock = clock or SystemClock()
        self.task_delay_s = task_delay_s
        self.boot_delay_s = boot_delay_s
        self.access_key_id = "LTAI-gpuscale-fake"
        self.access_key_secret = "fake-secret-" + hashlib.sha256(str(id(self)).encode()).hexdigest()[:16]
        self._rules = Map(
            [Rule(path, endpoint=action, methods=[method]) for action, (method, path, _, _) in ACTIONS.items()]
        )
        self._lock = threading.RLock()
        self._http = LocalServer(self._wsgi, name="fake-ack")
        self.reset()

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``, the SDK's ``Config.endpoint`` (with ``protocol="http"``)."""
        return f"127.0.0.1:{self._http.port('fake ACK API')}"

    def reset(self) -> None:
        """Forget all state, faults and recorded requests."""
        with self._lock:
            self._clusters: dict[str, dict[str, _Pool]] = {}
            self._tasks: dict[str, _Task] = {}
            self._ids = itertools.count(1)
            self.no_stock: set[str] = set()
            self.max_nodes_quota: int | None = None
            self._faults: list[tuple[str, int, str, str]] = []
            self.invalid_requests: list[str] = []
            self.response_errors: list[str] = []
            self.calls: list[str] = []
            self.removals: list[dict[str, Any]] = []

    def check(self) -> None:
        """Raise AssertionError if the fake ever answered with a response its SDK model does not round-trip."""
        if self.response_errors:
            raise AssertionError("; ".join(self.response_errors[:5]))

    def create_cluster(self, cluster_id: str) -> str:
        with self._lock:
            self._clusters.setdefault(cluster_id, {})
        return cluster_id

    def fail_next(self, status: int, code: str, *, action: str = "", message: str = "") -> None:
        """Answer the next request for ``action`` (any when empty) with an ACK error."""
        with self._lock:
            self._faults.append((action, status, code, message or f"injected {code}"))

    def pools(self, cluster_id: str) -> dict[str, dict[str, Any]]:
        """Pool id -> ``{"state", "body", "nodes": [instance ids]}``."""
        with self._lock:
            self._advance()
            return {
                p.id: {"state": p.state, "body": p.body, "nodes": sorted(p.nodes)}
                for p in self._clusters.get(cluster_id, {}).values()
            }

    # --- HTTP ----------------------------------------------------------------------------------------------------
    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return self._dispatch(Request(environ))(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        try:
            action, args = self._rules.bind("fake").match(request.path, method=request.method)
        except Exception:
            with self._lock:
                self.invalid_requests.append(f"{request.method} {request.path}: no action")
            return self._error(404, "InvalidAction.NotFound", f"{request.method} {request.path} is not an action")
        raw = request.get_data()
        query = dict(parse_qsl(urlsplit(request.url).query, keep_blank_values=True))
        with self._lock:
            self.calls.append(action)
            try:
                self._check_auth(request, raw)
                body = self._check_request(action, request, raw, query)
            except _Fail as exc:
                if exc.status == 400 and exc.code not in ("SignatureDoesNotMatch",):
                    self.invalid_requests.append(f"{action}: {exc.message}")
                return self._error(exc.status, exc.code, exc.message)
            for i, (act, status, code, message) in enumerate(self._faults):
                if act in ("", action):
                    del self._faults[i]
                    return self._error(status, code, message)
            self._advance()
            try:
                result = self._handle(action, dict(args), body, query)
            except _Fail as exc:
                return self._error(exc.status, exc.code, exc.message)
            model = ACTIONS[action][3]
            lost = _lost(result, model().from_map(result).to_map(), "")
            if lost:
                self.response_errors.append(f"{action}: {model.__name__} does not keep {', '.join(lost[:5])}")
                return self._error(500, "InternalError", "the fake produced an invalid response")
            return Response(json.dumps(result), status=200, content_type="application/json")

    @staticmethod
    def _error(status: int, code: str, message: str) -> Response:
        body = {"code": code, "message": message, "requestId": "fake-request"}
        return Response(json.dumps(body), status=status, content_type="application/json")

    def _check_auth(self, request: Request, raw: bytes) -> None:
        auth = request.headers.get("Authorization", "")
        prefix = "ACS3-HMAC-SHA256 "
        if not auth.startswith(prefix):
            raise _Fail(400, "MissingAuthorization", "the request is not signed with ACS3-HMAC-SHA256")
        parts = dict(p.split("=", 1) for p in auth[len(prefix) :].split(","))
        if parts.get("Credential") != self.access_key_id:
            raise _Fail(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        signed = parts.get("SignedHeaders", "").split(";")
        payload_hash = hashlib.sha256(raw).hexdigest()
        if request.headers.get("x-acs-content-sha256") != payload_hash:
            raise _Fail(400, "SignatureDoesNotMatch", "x-acs-content-sha256 does not match the body")
        query = sorted(parse_qsl(urlsplit(request.url).query, keep_blank_values=True))
        canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in query)
        headers = "".join(f"{h}:{request.headers.get(h, '').strip()}\n" for h in signed)
        canonical = "\n".join(
            [
                request.method,
                quote(request.path, safe="/-_.~"),
                canonical_query,
                headers,
                ";".join(signed),
                payload_hash,
            ]
        )
        to_sign = "ACS3-HMAC-SHA256\n" + hashlib.sha256(canonical.encode()).hexdigest()
        expected = hmac.new(self.access_key_secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, parts.get("Signature", "")):
            raise _Fail(400, "SignatureDoesNotMatch", "The request signature does not conform to Aliyun standards.")

    def _check_request(self, action: str, request: Request, raw: bytes, query: dict[str, str]) -> dict[str, Any]:
        if request.headers.get("x-acs-action") != action or request.headers.get("x-acs-version") != VERSION:
            raise _Fail(400, "InvalidAction", f"x-acs-action/x-acs-version do not name {action} {VERSION}")
        model = ACTIONS[action][2]
        body: dict[str, Any] = {}
        if raw:
            if model is None or request.method not in ("POST", "PUT"):
                raise _Fail(400, "InvalidParameter", f"{action} takes no body")
            try:
                body = json.loads(raw)
            except ValueError:
                raise _Fail(400, "InvalidParameter", "the body is not JSON") from None
        given = body if raw else dict(query)
        if model is None:
            if given:
                raise _Fail(400, "InvalidParameter", f"{action} takes no parameters")
            return body
        instance = model()
        try:
            instance.from_map(given)
            instance.validate()
        except Exception as exc:
            raise _Fail(400, "InvalidParameter", f"{action}: {type(exc).__name__}: {exc}") from None
        back = instance.to_map()
        lost = _lost(given, back if raw else {k: str(v) for k, v in back.items()}, "")
        if lost:
            raise _Fail(400, "InvalidParameter", f"{action}: {model.__name__} does not keep {', '.join(lost[:5])}")
        for path in _REQUIRED.get(action, ()):
            if _get(given, path) in (None, "", [], "[]"):
                raise _Fail(400, "InvalidParameter", f"{action}: {path} is required")
        return body

    # --- the model -----------------------------------------------------------------------------------------------
    def _handle(self, action: str, args: dict[str, str], body: dict[str, Any], query: dict[str, str]) -> dict[str, Any]:
        if action == "DescribeTaskInfo":
            task = self._tasks.get(args["task"])
            if task is None:
                raise _Fail(404, "ErrorTaskNotFound", f"task {args['task']} not found")
            out: dict[str, Any] = {
                "task_id": task.id,
                "cluster_id": task.cluster,
                "task_type": task.kind,
                "state": task.state,
                "created": _ts(task.start),
            }
            if task.error is not None:
                out["error"] = dict(task.error)
            return out
        pools = self._clusters.get(args["cluster"])
        if pools is None:
            raise _Fail(404, "ErrorClusterNotFound", f"cluster {args['cluster']} not found")
        if action == "CreateClusterNodePool":
            return self._create(args["cluster"], pools, body)
        if action == "DescribeClusterNodePools":
            name = query.get("NodepoolName")
            return {
                "nodepools": [
                    self._pool_json(p)
                    for p in pools.values()
                    if name is None or p.body["nodepool_info"]["name"] == name
                ]
            }
        if action == "DescribeClusterNodes":
            return self._nodes_json(pools, query)
        pool = pools.get(args["pool"])
        if pool is None:
            raise _Fail(404, "ErrorNodePoolNotFound", f"node pool {args['pool']} not found")
        if action == "ScaleClusterNodePool":
            return self._scale(pool, int(body["count"]))
        if action == "ModifyClusterNodePool":
            return self._modify(pool, body)
        if action == "RemoveNodePoolNodes":
            return self._remove(pool, query)
        if action == "DeleteClusterNodepool":
            return self._delete(pools, pool)
        raise _Fail(400, "InvalidAction", f"{action} is not implemented by the fake")

    def _advance(self) -> None:
        now = self.clock.now()
        for task in sorted(self._tasks.values(), key=lambda t: t.done_at):
            if task.state == "running" and task.done_at <= now:
                try:
                    task.apply()
                    task.state = "success"
                except _Fail as exc:
                    task.state = "fail"
                    task.error = {"code": exc.code, "message": exc.message}
                for pools in self._clusters.values():
                    pool = pools.get(task.pool)
                    if pool is not None and pool.task == task.id:
                        pool.task = ""
                        if pool.state in ("initial", "scaling", "removing", "updating"):
                            pool.state = "active"
        for pools in self._clusters.values():
            for pool in pools.values():
                for iid in [i for i, n in pool.nodes.items() if n.removing_at is not None and n.removing_at <= now]:
                    del pool.nodes[iid]

    def _task(self, cluster: str, kind: str, pool: _Pool, apply: Callable[[], None]) -> str:
        now = self.clock.now()
        task = _Task(f"T-{next(self._ids):06d}", cluster, kind, now, now + self.task_delay_s, apply, pool.id)
        self._tasks[task.id] = task
        pool.task = task.id
        self._advance()
        return task.id

    def _node_count(self) -> int:
        return sum(len(p.nodes) for ps in self._clusters.values() for p in ps.values())

    def _quota(self, extra: int) -> None:
        if self.max_nodes_quota is not None and self._node_count() + extra > self.max_nodes_quota:
            raise _Fail(
                400, "QuotaExceed.ElasticQuota", f"The number of instances exceeds the quota ({self.max_nodes_quota})."
            )

    def _add_nodes(self, pool: _Pool, count: int) -> None:
        types = pool.body.get("scaling_group", {}).get("instance_types", [])
        if not types or all(t in self.no_stock for t in types):
            raise _Fail(
                400,
                "OperationDenied.NoStock",
                "The requested resource is sold out in the specified zone; try other types of resources.",
            )
        itype = next(t for t in types if t not in self.no_stock)
        for _ in range(count):
            n = next(self._ids)
            iid = f"i-fake{n:012d}"
            pool.nodes[iid] = _Node(iid, f"{pool.cluster}.{n}", itype, self.clock.now())

    def _create(self, cluster: str, pools: dict[str, _Pool], body: dict[str, Any]) -> dict[str, Any]:
        name = body["nodepool_info"]["name"]
        if any(p.body["nodepool_info"]["name"] == name for p in pools.values()):
            raise _Fail(400, "ErrorNodePoolNameExists", f"node pool name {name} already exists")
        count = int(body.get("scaling_group", {}).get("desired_size", body.get("count", 0)))
        self._check_tags(body.get("scaling_group", {}).get("tags", []))
        self._quota(count)
        pool = _Pool(f"np{next(self._ids):08x}", cluster, body, self.clock.now())
        pools[pool.id] = pool
        task = self._task(cluster, "nodepool_create", pool, lambda: self._add_nodes(pool, count))
        return {"nodepool_id": pool.id, "task_id": task, "request_id": "fake-request"}

    def _busy(self, pool: _Pool) -> None:
        if pool.task or pool.state != "active":
            raise _Fail(400, "ErrorNodePoolNotActive", f"node pool {pool.id} is {pool.state}, not active")

    def _scale(self, pool: _Pool, count: int) -> dict[str, Any]:
        self._busy(pool)
        self._quota(count)
        pool.state = "scaling"
        return {"task_id": self._task(pool.cluster, "nodepool_scaleout", pool, lambda: self._add_nodes(pool, count))}

    @staticmethod
    def _check_tags(tags: list[dict[str, str]]) -> None:
        """Auto Scaling's tag limits: at most 20 tags, keys and values of at most 128 characters, unique keys."""
        keys = [t.get("key", "") for t in tags]
        if len(tags) > 20 or len(set(keys)) != len(keys):
            raise _Fail(400, "InvalidParameter", f"scaling_group.tags: {len(tags)} tags, at most 20 unique keys")
        if any(not k or len(k) > 128 or len(t.get("value", "")) > 128 for k, t in zip(keys, tags, strict=True)):
            raise _Fail(400, "InvalidParameter", "scaling_group.tags: a key or value is empty or over 128 characters")

    def _modify(self, pool: _Pool, body: dict[str, Any]) -> dict[str, Any]:
        """``scaling_group.tags`` replace the pool's tags at once; ``scaling_group.desired_size`` above the pool's
        node count adds the difference in the task (scale-in by desired size is not modelled: 400)."""
        self._busy(pool)
        sg = {k: v for k, v in body.get("scaling_group", {}).items() if v not in (None, [], {}, "")}
        given = {k for k, v in body.items() if v not in (None, [], {}, "")}
        unsupported = sorted(given - {"scaling_group"}) + sorted(set(sg) - {"tags", "desired_size"})
        if unsupported:
            raise _Fail(400, "InvalidParameter", f"the fake does not model changing {', '.join(unsupported)}")
        add = 0
        if "desired_size" in sg:
            add = int(sg["desired_size"]) - len(pool.nodes)
            if add < 0:
                raise _Fail(400, "InvalidParameter", "the fake does not model scale-in by desired_size")
            self._quota(add)
        if "tags" in sg:
            self._check_tags(sg["tags"])
            pool.body.setdefault("scaling_group", {})["tags"] = [dict(t) for t in sg["tags"]]
        if "desired_size" in sg:
            pool.body["scaling_group"]["desired_size"] = int(sg["desired_size"])
        pool.state = "updating"
        task = self._task(pool.cluster, "nodepool_update", pool, lambda: self._add_nodes(pool, add) if add else None)
        return {"task_id": task, "nodepool_id": pool.id, "request_id": "fake-request"}

    def _remove(self, pool: _Pool, query: dict[str, str]) -> dict[str, Any]:
        self._busy(pool)
        ids = json.loads(query["instance_ids"])
        missing = [i for i in ids if i not in pool.nodes]
        if missing:
            raise _Fail(400, "ErrorInstanceNotInNodePool", f"instances {missing} are not in node pool {pool.id}")
        self.removals.append(
            {
                "pool": pool.id,
                "instance_ids": ids,
                "drain_node": query.get("drain_node"),
                "release_node": query.get("release_node"),
            }
        )
        pool.state = "removing"

        def apply() -> None:
            for i in ids:
                if i in pool.nodes:
                    pool.nodes[i].removing_at = self.clock.now()

        return {"task_id": self._task(pool.cluster, "nodepool_remove_nodes", pool, apply), "request_id": "fake-request"}

    def _delete(self, pools: dict[str, _Pool], pool: _Pool) -> dict[str, Any]:
        if pool.nodes:
            raise _Fail(400, "ErrorNodePoolHasNodes", f"node pool {pool.id} still has nodes")
        self._busy(pool)
        pool.state = "deleting"

        def apply() -> None:
            pools.pop(pool.id, None)

        task = self._task(pool.cluster, "nodepool_delete", pool, apply)
        return {"task_id": task, "request_id": "fake-request"}

    def _pool_json(self, p: _Pool) -> dict[str, Any]:
        now = self.clock.now()
        initial = sum(1 for n in p.nodes.values() if now - n.created < self.boot_delay_s)
        removing = sum(1 for n in p.nodes.values() if n.removing_at is not None)
        sg = dict(p.body.get("scaling_group", {}))
        sg.pop("instance_metadata_options", None)
        return {
            "nodepool_info": {
                "nodepool_id": p.id,
                "name": p.body["nodepool_info"]["name"],
                "type": p.body["nodepool_info"].get("type", "ess"),
                "created": _ts(p.created),
            },
            "status": {
                "state": p.state,
                "total_nodes": len(p.nodes),
                "initial_nodes": initial,
                "removing_nodes": removing,
                "serving_nodes": len(p.nodes) - initial - removing,
                "healthy_nodes": len(p.nodes) - initial - removing,
                "failed_nodes": 0,
            },
            "scaling_group": sg,
            "kubernetes_config": dict(p.body.get("kubernetes_config", {})),
            **({"auto_scaling": p.body["auto_scaling"]} if "auto_scaling" in p.body else {}),
            **({"max_nodes": p.body["max_nodes"]} if "max_nodes" in p.body else {}),
        }

    def _nodes_json(self, pools: dict[str, _Pool], query: dict[str, str]) -> dict[str, Any]:
        now = self.clock.now()
        wanted = query.get("nodepool_id")
        nodes = []
        for p in pools.values():
            if wanted and p.id != wanted:
                continue
            for n in p.nodes.values():
                state = (
                    "removing"
                    if n.removing_at is not None
                    else ("initial" if now - n.created < self.boot_delay_s else "running")
                )
                nodes.append(
                    {
                        "instance_id": n.instance_id,
                        "node_name": n.name,
                        "nodepool_id": p.id,
                        "instance_type": n.instance_type,
                        "state": state,
                        "creation_time": _ts(n.created),
                        "source": "ess_attach",
                    }
                )
        size = int(query.get("pageSize", "100"))
        page = int(query.get("pageNumber", "1"))
        chunk = nodes[(page - 1) * size : page * size]
        return {"nodes": chunk, "page": {"page_number": page, "page_size": size, "total_count": len(nodes)}}
