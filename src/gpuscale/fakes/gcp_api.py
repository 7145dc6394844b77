"""A stateful fake of the GKE node-pool and Compute Engine instance-group endpoints, served over real HTTP on 127.0.0.1.

Every request and every response is checked against Google's published discovery documents for ``container/v1``
and ``compute/v1``, the copies google-api-python-client ships (``googleapiclient/discovery_cache/documents``): the
HTTP method and path must be a method of the document, every query parameter one it declares (or a system
parameter), required parameters present, and the JSON body must match the method's request schema with no unknown
field, every value of its declared type (``int64`` as a decimal string, enums by name, or by number when the client
asked for ``$alt=json;enum-encoding=int``, as the GAPIC REST transport does). A request that fails gets a 400 in
Google's error format and is recorded in :attr:`FakeGcpAPI.invalid_requests`; a response of the fake that fails is a
bug in the fake: it is recorded in :attr:`FakeGcpAPI.response_errors` and :meth:`FakeGcpAPI.check` raises.

Implemented (under ``/v1/projects/{p}/locations/{l}/clusters/{c}``): node pools list, get, create, delete,
``setSize``; ``operations.get``. Compute (under ``/compute/v1/projects/{p}/zones/{z}``): ``instances.list`` (with
an ``labels.KEY = "VALUE"`` filter), ``instances.setLabels`` (label fingerprints checked), instance group manager
get, ``deleteInstances``, ``listManagedInstances``, ``listErrors``; zone operations get.

Behaviour modelled on GKE: every change is a long-running operation that is ``RUNNING`` until ``op_delay_s`` has
passed on the injected clock and then applied (``DONE``); a node pool accepts one operation at a time (a second gets
400 ``FAILED_PRECONDITION``); each pool has one managed instance group per zone whose instances carry the pool's
resource labels; new instances are ``PROVISIONING`` and become ``RUNNING`` after ``boot_delay_s``; ``setSize`` below
the current size removes instances of the fake's choosing (recorded in :attr:`FakeGcpAPI.random_removals`, so
tests can assert a client never relies on it). Faults: :attr:`FakeGcpAPI.stockout` (machine types whose creation
fails with ``ZONE_RESOURCE_POOL_EXHAUSTED``: a pool create operation ends in error; a resize leaves the group short
and reports the error in ``listErrors``), :attr:`FakeGcpAPI.gpu_quota` (accelerators per project: beyond it a create
or resize is refused with 403 ``QUOTA_EXCEEDED``), :meth:`FakeGcpAPI.fail_next` (an HTTP error for the next
matching requests).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from werkzeug.wrappers import Request, Response

from gpuscale.clock import Clock, SystemClock
from gpuscale.fakes._http import LocalServer, ServedFake
from gpuscale.fakes.google_discovery import DiscoveryDocument, discovery_document

__all__ = ["DiscoveryDocument", "FakeGcpAPI", "FakeSpecViolation", "discovery_document"]

_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
_LABEL_FILTER = re.compile(r'^\(?\s*labels\.([a-z0-9_-]+)\s*=\s*"([^"]*)"\s*\)?$')


class FakeSpecViolation(AssertionError):
    """The fake produced a response that violates the discovery document (a bug in the fake)."""


# --- state -------------------------------------------------------------------------------------------------------
class _ApiError(Exception):
    def __init__(self, status: int, message: str, reason: str = "", domain: str = "global") -> None:
        super().__init__(message)
        self.status, self.message, self.reason, self.domain = status, message, reason, domain


@dataclass
class _Instance:
    name: str
    id: int
    zone: str
    machine_type: str
    labels: dict[str, str]
    created: float
    spot: bool
    deleting_at: float | None = None

    def fingerprint(self) -> str:
        raw = json.dumps(sorted(self.labels.items())).encode()
        return base64.b64encode(hashlib.sha256(raw).digest()[:8]).decode()


@dataclass
class _Group:
    name: str
    zone: str
    pool: str
    target: int = 0
    instances: dict[str, _Instance] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Pool:
    cluster: str
    body: dict[str, Any]
    status: str = "PROVISIONING"
    groups: dict[str, _Group] = field(default_factory=dict)
    busy_op: str = ""

    @property
    def name(self) -> str:
        return str(self.body["name"])


@dataclass
class _Op:
    name: str
    kind: str  # "container" | "compute"
    op_type: str
    target: str
    location: str
    start: float
    done_at: float
    apply: Any
    status: str = "RUNNING"
    error: dict[str, Any] | None = None
    pool_key: str = ""


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class FakeGcpAPI(ServedFake):
    """The fake GKE + Compute Engine API. Use as a context manager or :meth:`start` / :meth:`stop`.

    ``op_delay_s`` is how long an operation runs, ``boot_delay_s`` how long a new instance is ``PROVISIONING``, both
    on ``clock`` (share a :class:`~gpuscale.clock.ManualClock` with the client for virtual time).
    """

    def __init__(self, *, clock: Clock | None = None, op_delay_s: float = 0.0, boot_delay_s: float = 0.0) -> None:
        self.clock: Clock = clock or SystemClock()
        self.op_delay_s = op_delay_s
        self.boot_delay_s = boot_delay_s
        self.container = discovery_document("container.v1")
        self.compute = discovery_document("compute.v1")
        self._lock = threading.RLock()
        self._http = LocalServer(self._wsgi, name="fake-gcp")
        self.reset()

    # --- lifecycle ---------------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """The ``api_endpoint`` to give both SDK clients (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self._http.port('fake GCP API')}"

    def reset(self) -> None:
        """Forget all state, faults and recorded requests."""
        with self._lock:
            self._clusters: dict[str, dict[str, _Pool]] = {}
            self._ops: dict[str, _Op] = {}
            self._ids = itertools.count(1000)
            self.stockout: set[str] = set()
            self.gpu_quota: int | None = None
            self._faults: list[tuple[str, str, int, str, str]] = []
            self.invalid_requests: list[str] = []
            self.response_errors: list[str] = []
            self.calls: list[str] = []
            """The method id of every routed request, in order (``compute.instances.list``, ...)."""
            self.random_removals = 0

    def check(self) -> None:
        """Raise :class:`FakeSpecViolation` if the fake ever answered with a response that violates its document."""
        if self.response_errors:
            raise FakeSpecViolation("; ".join(self.response_errors[:5]))

    def create_cluster(self, project: str, location: str, name: str) -> str:
        """Add an empty cluster; returns its resource name ``projects/P/locations/L/clusters/N``."""
        key = f"projects/{project}/locations/{location}/clusters/{name}"
        with self._lock:
            self._clusters.setdefault(key, {})
        return key

    def fail_next(
        self, status: int, *, method_id: str = "", times: int = 1, reason: str = "", message: str = ""
    ) -> None:
        """Answer the next ``times`` requests to ``method_id`` (any when empty) with an HTTP error."""
        with self._lock:
            for _ in range(times):
                self._faults.append((method_id, "", status, reason, message or f"injected HTTP {status}"))

    # --- views for tests ---------------------------------------------------------------------------------------
    def pools(self, cluster: str) -> dict[str, dict[str, Any]]:
        """Node pool name -> ``{"status", "target", "instances": [names], "labels"}`` of a cluster."""
        with self._lock:
            self._advance()
            return {
                p.name: {
                    "status": p.status,
                    "target": sum(g.target for g in p.groups.values()),
                    "instances": sorted(n for g in p.groups.values() for n in g.instances),
                    "body": p.body,
                }
                for p in self._clusters.get(cluster, {}).values()
            }

    def accelerators_in_use(self) -> int:
        with self._lock:
            return sum(
                self._pool_gpus(p) * g.target
                for c in self._clusters.values()
                for p in c.values()
                for g in p.groups.values()
            )

    # --- HTTP ----------------------------------------------------------------------------------------------------
    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return self._dispatch(Request(environ))(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        path = request.path
        query = parse_qs(urlsplit(request.url).query, keep_blank_values=True)
        doc = self.compute if path.startswith("/compute/") else self.container
        method = doc.route(request.method, path)
        with self._lock:
            if method is None:
                self.invalid_requests.append(f"{request.method} {path}: no method of {doc.name}")
                return self._error(404, f"{request.method} {path} is not a method of {doc.name}", "notFound")
            self.calls.append(method.id)
            int_enums = "enum-encoding=int" in ",".join(query.get("$alt", []))
            errors = doc.check_query(method, query)
            raw = request.get_data(as_text=True)
            body: Any = None
            if "request" in method.desc:
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    errors.append("body is not JSON")
                else:
                    errors += doc.check(body, method.desc["request"], "body", int_enums=int_enums)
                    if not errors:
                        body = doc.enum_names(body, method.desc["request"])
            elif raw.strip():
                errors.append(f"{method.id} takes no body")
            if errors:
                self.invalid_requests.append(f"{method.id}: {'; '.join(errors)}")
                return self._error(400, f"{method.id}: {'; '.join(errors)[:500]}", "invalid")
            for i, (mid, _, status, reason, message) in enumerate(self._faults):
                if mid in ("", method.id):
                    del self._faults[i]
                    return self._error(status, message, reason)
            params = method.pattern.match(path).groups()  # type: ignore[union-attr]
            self._advance()
            try:
                result = self._handle(method.id, params, body or {}, query, int_enums)
            except _ApiError as exc:
                return self._error(exc.status, exc.message, exc.reason)
            errs = doc.check(result, method.desc.get("response", {"type": "object"}), "response")
            if errs:
                self.response_errors.append(f"{method.id}: {'; '.join(errs)}")
                return self._error(500, "the fake produced an invalid response", "backendError")
            return Response(json.dumps(result), status=200, content_type="application/json")

    @staticmethod
    def _error(status: int, message: str, reason: str = "") -> Response:
        err: dict[str, Any] = {"code": status, "message": message, "status": _STATUS_NAMES.get(status, "UNKNOWN")}
        if reason:
            err["errors"] = [{"message": message, "domain": "global", "reason": reason}]
        return Response(json.dumps({"error": err}), status=status, content_type="application/json")

    # --- the model -----------------------------------------------------------------------------------------------
    def _handle(
        self, mid: str, p: tuple[str, ...], body: dict[str, Any], query: dict[str, list[str]], int_enums: bool
    ) -> dict[str, Any]:
        short = mid.rsplit(".", 2)
        if mid.startswith("container."):
            cluster = f"projects/{p[0]}/locations/{p[1]}/clusters/{p[2]}" if len(p) >= 3 else ""
            if mid.endswith("operations.get"):
                return self._container_op(self._op(p[2]))
            pools = self._clusters.get(cluster)
            if pools is None:
                raise _ApiError(404, f"cluster {cluster} not found", "notFound")
            if mid.endswith("nodePools.list"):
                return {"nodePools": [self._pool_json(x) for x in pools.values()]}
            if mid.endswith("nodePools.create"):
                return self._create_pool(cluster, p[1], body["nodePool"])
            pool = pools.get(p[3])
            if pool is None:
                raise _ApiError(404, f"node pool {p[3]} not found", "notFound")
            if mid.endswith("nodePools.get"):
                return self._pool_json(pool)
            if mid.endswith("nodePools.setSize"):
                return self._set_size(pool, int(body.get("nodeCount", 0)))
            if mid.endswith("nodePools.delete"):
                return self._delete_pool(pool)
        elif mid.startswith("compute."):
            project, zone = p[0], p[1]
            if mid == "compute.zoneOperations.get":
                return self._compute_op(self._op(p[2]))
            if mid == "compute.instances.list":
                return self._list_instances(project, zone, query.get("filter", [""])[0])
            if mid == "compute.instances.setLabels":
                return self._set_labels(project, zone, p[2], body)
            group = self._group(zone, p[2])
            if mid == "compute.instanceGroupManagers.get":
                return self._group_json(project, group)
            if mid == "compute.instanceGroupManagers.listManagedInstances":
                return {"managedInstances": [self._managed_json(project, i) for i in group.instances.values()]}
            if mid == "compute.instanceGroupManagers.listErrors":
                return {"items": list(group.errors)}
            if mid == "compute.instanceGroupManagers.deleteInstances":
                return self._delete_instances(project, group, body.get("instances", []))
        raise _ApiError(400, f"{short[-1]} is not implemented by the fake", "notImplemented")

    def _op(self, name: str) -> _Op:
        op = self._ops.get(name)
        if op is None:
            raise _ApiError(404, f"operation {name} not found", "notFound")
        return op

    def _new_op(self, kind: str, op_type: str, target: str, location: str, apply: Any, pool: _Pool | None) -> _Op:
        now = self.clock.now()
        op = _Op(f"operation-{next(self._ids)}", kind, op_type, target, location, now, now + self.op_delay_s, apply)
        if pool is not None:
            pool.busy_op = op.name
            op.pool_key = f"{pool.cluster}/nodePools/{pool.name}"
        self._ops[op.name] = op
        self._advance()
        return op

    def _advance(self) -> None:
        """Apply operations whose time has come and finish booting and deleting instances."""
        now = self.clock.now()
        for op in sorted(self._ops.values(), key=lambda o: o.done_at):
            if op.status != "DONE" and op.done_at <= now:
                try:
                    op.apply()
                except _ApiError as exc:
                    op.error = {"code": 8 if exc.status == 429 else 9, "message": exc.message}
                op.status = "DONE"
                cluster, _, pool_name = op.pool_key.partition("/nodePools/")
                pool = self._clusters.get(cluster, {}).get(pool_name)
                if pool is not None and pool.busy_op == op.name:
                    pool.busy_op = ""
        for pools in self._clusters.values():
            for pool in pools.values():
                for g in pool.groups.values():
                    for name in [
                        n for n, i in g.instances.items() if i.deleting_at is not None and i.deleting_at <= now
                    ]:
                        del g.instances[name]

    # --- node pools ----------------------------------------------------------------------------------------------
    @staticmethod
    def _pool_gpus(pool: _Pool) -> int:
        return sum(int(a.get("acceleratorCount", "0")) for a in pool.body.get("config", {}).get("accelerators", []))

    def _check_quota(self, extra_gpus: int) -> None:
        if self.gpu_quota is not None and self.accelerators_in_use() + extra_gpus > self.gpu_quota:
            raise _ApiError(
                403,
                f"Insufficient quota to satisfy the request: QUOTA_EXCEEDED: accelerators limit {self.gpu_quota}",
                "QUOTA_EXCEEDED",
            )

    def _create_pool(self, cluster: str, location: str, body: dict[str, Any]) -> dict[str, Any]:
        pools = self._clusters[cluster]
        name = body.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name):
            raise _ApiError(400, f"invalid node pool name {name!r}", "invalid")
        if name in pools:
            raise _ApiError(409, f"node pool {name} already exists", "alreadyExists")
        zones = body.get("locations") or [location]
        count = int(body.get("initialNodeCount", 0))
        pool = _Pool(cluster, json.loads(json.dumps(body)))
        self._check_quota(self._pool_gpus(pool) * count * len(zones))
        cluster_name = cluster.rsplit("/", 1)[1]
        for zone in zones:
            digest = hashlib.sha256(f"{cluster}/{name}/{zone}".encode()).hexdigest()[:8]
            pool.groups[zone] = _Group(f"gke-{cluster_name}-{name}-{digest}-grp"[:61], zone, name)
        pools[name] = pool

        def apply() -> None:
            machine = pool.body.get("config", {}).get("machineType", "")
            if machine in self.stockout:
                pool.status = "ERROR"
                raise _ApiError(
                    429,
                    f"Google Compute Engine: ZONE_RESOURCE_POOL_EXHAUSTED: the zone does not have enough resources "
                    f"available to fulfill the request ({machine})",
                )
            pool.status = "RUNNING"
            for g in pool.groups.values():
                self._resize(pool, g, count)

        return self._container_op(
            self._new_op("container", "CREATE_NODE_POOL", f"{cluster}/nodePools/{name}", location, apply, pool)
        )

    def _busy(self, pool: _Pool) -> None:
        if pool.busy_op:
            raise _ApiError(
                400,
                f"FAILED_PRECONDITION: operation {pool.busy_op} is currently running on node pool {pool.name}",
                "failedPrecondition",
            )

    def _set_size(self, pool: _Pool, count: int) -> dict[str, Any]:
        self._busy(pool)
        if pool.status not in ("RUNNING", "RUNNING_WITH_ERROR"):
            raise _ApiError(400, f"FAILED_PRECONDITION: node pool {pool.name} is {pool.status}", "failedPrecondition")
        grow = sum(max(0, count - g.target) for g in pool.groups.values())
        self._check_quota(self._pool_gpus(pool) * grow)

        def apply() -> None:
            for g in pool.groups.values():
                self._resize(pool, g, count)

        location = pool.cluster.split("/")[3]
        return self._container_op(
            self._new_op(
                "container", "SET_NODE_POOL_SIZE", f"{pool.cluster}/nodePools/{pool.name}", location, apply, pool
            )
        )

    def _resize(self, pool: _Pool, g: _Group, count: int) -> None:
        now = self.clock.now()
        live = [i for i in g.instances.values() if i.deleting_at is None]
        machine = pool.body.get("config", {}).get("machineType", "")
        if count < len(live):
            for inst in sorted(live, key=lambda i: -i.created)[: len(live) - count]:
                inst.deleting_at = now
                self.random_removals += 1
        for _ in range(count - len(live)):
            if machine in self.stockout:
                g.errors.append(
                    {
                        "error": {
                            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                            "message": f"The zone does not have enough resources available ({machine})",
                        },
                        "timestamp": _ts(now),
                    }
                )
                continue
            iid = next(self._ids)
            name = f"{g.name.removesuffix('-grp')}-{iid:04x}"[-63:]
            labels = dict(pool.body.get("config", {}).get("resourceLabels", {}))
            labels["goog-k8s-node-pool-name"] = pool.name
            spot = bool(pool.body.get("config", {}).get("spot"))
            g.instances[name] = _Instance(name, iid, g.zone, machine, labels, now, spot)
        g.target = count
        self._advance_deletions(g)

    def _advance_deletions(self, g: _Group) -> None:
        now = self.clock.now()
        for name in [n for n, i in g.instances.items() if i.deleting_at is not None and i.deleting_at <= now]:
            del g.instances[name]

    def _delete_pool(self, pool: _Pool) -> dict[str, Any]:
        self._busy(pool)
        pool.status = "STOPPING"

        def apply() -> None:
            self._clusters[pool.cluster].pop(pool.name, None)

        location = pool.cluster.split("/")[3]
        return self._container_op(
            self._new_op(
                "container", "DELETE_NODE_POOL", f"{pool.cluster}/nodePools/{pool.name}", location, apply, pool
            )
        )

    def _pool_json(self, pool: _Pool) -> dict[str, Any]:
        project = pool.cluster.split("/")[1]
        out = dict(pool.body)
        out["status"] = pool.status
        out["selfLink"] = f"https://container.googleapis.com/v1/{pool.cluster}/nodePools/{pool.name}"
        out["instanceGroupUrls"] = [
            f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{g.zone}/instanceGroupManagers/{g.name}"
            for g in pool.groups.values()
        ]
        return out

    def _container_op(self, op: _Op) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": op.name,
            "operationType": op.op_type,
            "status": op.status,
            "location": op.location,
            "zone": op.location,
            "targetLink": f"https://container.googleapis.com/v1/{op.target}",
            "selfLink": f"https://container.googleapis.com/v1/{op.target.split('/clusters/')[0]}/operations/{op.name}",
            "startTime": _ts(op.start),
        }
        if op.status == "DONE":
            out["endTime"] = _ts(op.done_at)
        if op.error is not None:
            out["error"] = op.error
            out["statusMessage"] = op.error["message"]
        return out

    # --- compute -------------------------------------------------------------------------------------------------
    def _groups(self) -> Iterable[tuple[_Pool, _Group]]:
        for pools in self._clusters.values():
            for pool in pools.values():
                for g in pool.groups.values():
                    yield pool, g

    def _group(self, zone: str, name: str) -> _Group:
        for _, g in self._groups():
            if g.zone == zone and g.name == name:
                return g
        raise _ApiError(404, f"instance group manager {name} not found in {zone}", "notFound")

    def _group_json(self, project: str, g: _Group) -> dict[str, Any]:
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{g.zone}"
        creating = sum(1 for i in g.instances.values() if self._status(i) == "PROVISIONING")
        deleting = sum(1 for i in g.instances.values() if i.deleting_at is not None)
        return {
            "kind": "compute#instanceGroupManager",
            "name": g.name,
            "zone": base,
            "targetSize": g.target,
            "baseInstanceName": g.name.removesuffix("-grp"),
            "instanceGroup": f"{base}/instanceGroups/{g.name}",
            "selfLink": f"{base}/instanceGroupManagers/{g.name}",
            "currentActions": {
                "creating": creating,
                "deleting": deleting,
                "none": len(g.instances) - creating - deleting,
            },
        }

    def _status(self, inst: _Instance) -> str:
        if inst.deleting_at is not None:
            return "STOPPING"
        return "RUNNING" if self.clock.now() - inst.created >= self.boot_delay_s else "PROVISIONING"

    def _instance_json(self, project: str, inst: _Instance) -> dict[str, Any]:
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{inst.zone}"
        return {
            "kind": "compute#instance",
            "id": str(inst.id),
            "name": inst.name,
            "zone": base,
            "machineType": f"{base}/machineTypes/{inst.machine_type}",
            "status": self._status(inst),
            "labels": dict(inst.labels),
            "labelFingerprint": inst.fingerprint(),
            "creationTimestamp": _ts(inst.created),
            "selfLink": f"{base}/instances/{inst.name}",
            "scheduling": {"provisioningModel": "SPOT" if inst.spot else "STANDARD"},
        }

    def _managed_json(self, project: str, inst: _Instance) -> dict[str, Any]:
        action = (
            "DELETING"
            if inst.deleting_at is not None
            else ("CREATING" if self._status(inst) == "PROVISIONING" else "NONE")
        )
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{inst.zone}"
        return {
            "instance": f"{base}/instances/{inst.name}",
            "id": str(inst.id),
            "currentAction": action,
            "instanceStatus": self._status(inst),
        }

    def _list_instances(self, project: str, zone: str, filter_: str) -> dict[str, Any]:
        wanted: list[tuple[str, str]] = []
        for part in [p for p in re.split(r"\)\s*(?:AND\s*)?\(", filter_.strip()) if p.strip()]:
            m = _LABEL_FILTER.match(part.strip())
            if m is None:
                raise _ApiError(400, f"Invalid value for field 'filter': {filter_!r}", "invalid")
            wanted.append((m.group(1), m.group(2)))
        items = [
            self._instance_json(project, i)
            for _, g in self._groups()
            if g.zone == zone
            for i in g.instances.values()
            if all(i.labels.get(k) == v for k, v in wanted)
        ]
        return {"kind": "compute#instanceList", "id": f"projects/{project}/zones/{zone}/instances", "items": items}

    def _set_labels(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        inst = next(
            (i for _, g in self._groups() if g.zone == zone for i in g.instances.values() if i.name == name), None
        )
        if inst is None:
            raise _ApiError(
                404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found", "notFound"
            )
        if body.get("labelFingerprint") != inst.fingerprint():
            raise _ApiError(412, "Labels fingerprint either invalid or resource labels have changed", "conditionNotMet")
        labels = dict(body.get("labels", {}))
        bad = [
            k
            for k, v in labels.items()
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) or not re.fullmatch(r"[a-z0-9_-]{0,63}", v)
        ]
        if bad:
            raise _ApiError(400, f"Invalid value for field 'resource.labels': {bad[0]!r}", "invalid")

        def apply() -> None:
            inst.labels = labels

        op = self._new_op(
            "compute", "setLabels", f"projects/{project}/zones/{zone}/instances/{name}", zone, apply, None
        )
        return self._compute_op(op)

    def _delete_instances(self, project: str, g: _Group, urls: list[str]) -> dict[str, Any]:
        names = [u.rstrip("/").rsplit("/", 1)[-1] for u in urls]
        missing = [n for n in names if n not in g.instances]
        if missing:
            raise _ApiError(400, f"instance {missing[0]} is not a member of {g.name}", "invalid")

        def apply() -> None:
            for n in names:
                inst = g.instances.get(n)
                if inst is not None and inst.deleting_at is None:
                    inst.deleting_at = self.clock.now()
                    g.target = max(0, g.target - 1)
            self._advance_deletions(g)

        op = self._new_op(
            "compute",
            "deleteInstances",
            f"projects/{project}/zones/{g.zone}/instanceGroupManagers/{g.name}",
            g.zone,
            apply,
            None,
        )
        return self._compute_op(op)

    def _compute_op(self, op: _Op) -> dict[str, Any]:
        project = op.target.split("/")[1]
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{op.location}"
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(abs(hash(op.name)) % 10**12),
            "name": op.name,
            "zone": base,
            "operationType": op.op_type,
            "targetLink": f"https://www.googleapis.com/compute/v1/{op.target}",
            "status": op.status,
            "progress": 100 if op.status == "DONE" else 50,
            "insertTime": _ts(op.start),
            "selfLink": f"{base}/operations/{op.name}",
        }
        if op.error is not None:
            out["error"] = {"errors": [{"code": "RESOURCE_EXHAUSTED", "message": op.error["message"]}]}
        return out
