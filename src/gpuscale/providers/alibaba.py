"""Alibaba Cloud ACK provider: GPU nodes in ACK node pools, through the official ``alibabacloud-cs20151215`` SDK.

Pools and slots
---------------
One node pool per offering (gpuscale pool, instance type, zone, capacity type, labels, taints), named
``gpuscale-<10 hex>`` (:func:`pool_name`), created on demand in the zone's vSwitches with the instance type, its
Kubernetes labels and taints (``nvidia.com/gpu=present:NoSchedule`` besides the request's), ACK's own auto scaling
off (gpuscale is the autoscaler), ``max_nodes`` as the pool's maximum and ``desired_size`` = the launch's count; spot
pools use ``SpotWithPriceLimit`` with the configured price limit of the type (``SpotAsPriceGo`` when none is set).
A launch into an existing pool adds its count with ``ScaleClusterNodePool``. A specific node leaves with
``RemoveNodePoolNodes`` (``drain_node=false``: gpuscale has drained it; ``release_node=true``), never by lowering
the pool's size; pools left with no node are deleted.

As on GKE, a launch reserves slots (node ids ``<pool id>/<request key>/<i>``) and returns at once; ACK's changes are
tasks, read with ``DescribeTaskInfo`` on later rounds, never waited on. New nodes get the open slots in creation
order. ACK keeps no per-node label gpuscale could write, so the slot of a node lives in this process: after a
restart, nodes of gpuscale pools are listed with their instance id as node id and no request id, and the controller
adopts them as such; a relaunch of a request id served before the restart creates its nodes again.

A pool runs one task at a time: a scale-out or a removal asked while a task runs waits for the next round (the node
is hidden from ``list_nodes`` at once).

Errors
------
``OperationDenied.NoStock`` and other sold-out codes -> :class:`~gpuscale.errors.InsufficientCapacity` (the offering
is then marked unavailable for ``unavailable_ttl_s``); ``QuotaExceed.*`` -> ``QuotaExceeded``; ``Throttling*`` ->
``RateLimited``; ``InvalidAccessKeyId.*``, ``SignatureDoesNotMatch``, ``Forbidden*`` and 401/403 ->
``AuthenticationError``; 404 -> ``NotFound``; 5xx and network errors -> ``TransientProviderError``; other 400s ->
``InvalidProviderRequest``. A task that fails becomes a ``LAUNCH_FAILED`` event per open slot. The SDK's retry is
off (``autoretry=False``): the controller is the one retry layer. The AccessKey secret never appears in messages or
logs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from alibabacloud_cs20151215 import models as cs
from alibabacloud_cs20151215.client import Client
from alibabacloud_tea_openapi import models as openapi
from darabonba.runtime import RuntimeOptions
from Tea.exceptions import TeaException

from gpuscale.clock import Clock, SystemClock
from gpuscale.core import labels as wk
from gpuscale.core.model import CapacityType, Taint, TaintEffect
from gpuscale.errors import (
    AuthenticationError,
    InputError,
    InsufficientCapacity,
    InvalidProviderRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    ProviderCapabilities,
    ProviderEvent,
    ProviderEventKind,
)

__all__ = ["API_CALLS", "AlibabaConfig", "AlibabaProvider", "pool_name"]

log = logging.getLogger(__name__)
T = TypeVar("T")

PROVIDER_NAME = "alibaba"
KEY_ID_ENV, KEY_SECRET_ENV = "ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
GPU_TAINT = Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present")
MANAGED_TAG = {"key": "gpuscale", "value": "managed"}
API_CALLS = (
    "CreateClusterNodePool",
    "DescribeClusterNodePools",
    "ScaleClusterNodePool",
    "RemoveNodePoolNodes",
    "DeleteClusterNodepool",
    "DescribeClusterNodes",
    "DescribeTaskInfo",
)
"""Every ACK action the provider calls (``docs/providers/alibaba.md`` gives the RAM policy)."""

_CAPACITY = re.compile(r"NoStock|SoldOut|sold out|NotEnoughStock|ResourceNotAvailable|Zone\.NotOnSale", re.IGNORECASE)
_QUOTA = re.compile(r"^QuotaExceed|Quota|LimitExceeded", re.IGNORECASE)
_AUTH = re.compile(r"^(InvalidAccessKeyId|SignatureDoesNotMatch|Forbidden|NoPermission|InvalidSecurityToken)")
_STATE = {
    "initial": CloudNodeState.PROVISIONING,
    "running": CloudNodeState.RUNNING,
    "removing": CloudNodeState.DELETING,
    "removed": CloudNodeState.GONE,
    "failed": CloudNodeState.NOT_READY,
}
_BUSY_STATES = ("initial", "scaling", "removing", "updating", "deleting")


def label_key(value: str) -> str:
    """A request id as used in node ids: itself when short and plain, else ``h-`` + 30 hex digits of its SHA-256."""
    return (
        value
        if re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", value)
        else "h-" + hashlib.sha256(value.encode()).hexdigest()[:30]
    )


def pool_name(request: LaunchRequest) -> str:
    """The ACK node pool of a request's offering (``gpuscale-`` + a hash of everything that must match)."""
    taints = sorted(str(t) for t in request.taints)
    raw = repr(
        (
            request.pool,
            request.instance_type,
            request.zone,
            str(request.capacity_type),
            sorted(request.labels.items()),
            taints,
        )
    )
    return "gpuscale-" + hashlib.sha256(raw.encode()).hexdigest()[:10]


@dataclass(frozen=True, slots=True)
class AlibabaConfig:
    """The ACK cluster and how the provider behaves. ``vswitches``: each zone gpuscale may use -> its vSwitch ids."""

    cluster_id: str
    region: str
    vswitches: Mapping[str, tuple[str, ...]]
    endpoint: str = ""
    """``cs.<region>.aliyuncs.com`` when empty."""
    protocol: str = "https"
    timeout_s: float = 30.0
    max_pools: int = 20
    max_nodes: int = 100
    max_pool_nodes: int = 100
    spot_price_limits: Mapping[str, float] = field(default_factory=dict)
    """Instance type -> highest spot price per hour (USD) for ``SpotWithPriceLimit``."""
    unavailable_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.cluster_id or not self.region:
            raise InputError(
                "is empty", where="alibaba config cluster_id/region", fix="set the ACK cluster id and region"
            )
        if not self.vswitches or not all(self.vswitches.values()):
            raise InputError(
                "names no vSwitch", where="alibaba config vswitches", fix="map each zone to its vSwitch ids"
            )
        for name in ("max_pools", "max_nodes", "max_pool_nodes"):
            if getattr(self, name) < 1:
                raise InputError("must be at least 1", where=f"alibaba config {name}", value=getattr(self, name))


@dataclass
class _Slots:
    request: LaunchRequest
    key: str
    pool: str  # pool name
    open: list[int]
    at: float
    asked: bool = False


@dataclass
class _Pool:
    id: str
    name: str
    state: str
    instance_type: str
    zone: str
    spot: bool
    labels: dict[str, str]
    nodes: list[cs.DescribeClusterNodesResponseBodyNodes] = field(default_factory=list)


class AlibabaProvider:
    """The :class:`~gpuscale.providers.base.Provider` for ACK (see the module docstring)."""

    name = PROVIDER_NAME

    def __init__(
        self,
        config: AlibabaConfig,
        *,
        access_key_id: str | None = None,
        access_key_secret: str | None = None,
        env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        env = os.environ if env is None else env
        key_id = access_key_id or env.get(KEY_ID_ENV, "")
        self._secret = access_key_secret or env.get(KEY_SECRET_ENV, "")
        if not key_id or not self._secret:
            raise AuthenticationError(f"{KEY_ID_ENV} and {KEY_SECRET_ENV} must be set", provider=PROVIDER_NAME)
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self._client = Client(
            openapi.Config(
                access_key_id=key_id,
                access_key_secret=self._secret,
                region_id=config.region,
                endpoint=config.endpoint or f"cs.{config.region}.aliyuncs.com",
                protocol=config.protocol,
            )
        )
        ms = int(config.timeout_s * 1000)
        self._runtime = RuntimeOptions(autoretry=False, max_attempts=1, read_timeout=ms, connect_timeout=ms)
        self._zone_of = {v: z for z, vs in config.vswitches.items() for v in vs}
        self._lock = threading.RLock()
        self._slots: dict[str, _Slots] = {}
        self._bound: dict[str, tuple[str, int]] = {}  # instance id -> (request key, slot)
        self._request_ids: dict[str, str] = {}
        self._tasks: dict[str, tuple[str, str]] = {}  # task id -> (pool id, purpose)
        self._removing: dict[str, set[str]] = {}  # pool id -> instance ids to remove (asked or not yet)
        self._asked_removal: set[str] = set()
        self._cancelled: dict[str, int] = {}
        self._unavailable: dict[tuple[str, str, CapacityType], float] = {}
        self._events: list[ProviderEvent] = []
        self._seen: dict[str, float] = {}
        self._pool_ids: dict[str, str] = {}  # pool name -> id

    def __repr__(self) -> str:
        return f"AlibabaProvider(cluster_id={self.config.cluster_id!r}, region={self.config.region!r})"

    @property
    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(
            spot=True,
            delete_specific_node=True,
            zones=tuple(self.config.vswitches),
            max_nodes_per_launch=self.config.max_pool_nodes,
        )

    def unavailable_offerings(self) -> dict[tuple[str, str, CapacityType], float]:
        """(instance type, zone, capacity type) -> until when it is marked unavailable after a stockout."""
        now = self.clock.now()
        return {k: t for k, t in self._unavailable.items() if t > now}

    # --- Provider protocol ---------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """Reserve ``request.count`` slots in the offering's pool (created or scaled out); return them at once."""
        if not 1 <= request.count <= self.config.max_pool_nodes:
            raise InvalidProviderRequest(
                f"count must be 1..{self.config.max_pool_nodes}", provider=self.name, field="count"
            )
        if request.zone not in self.config.vswitches:
            raise InvalidProviderRequest(
                f"zone {request.zone!r} has no configured vSwitch", provider=self.name, field="zone"
            )
        offering = (request.instance_type, request.zone, request.capacity_type)
        if self._unavailable.get(offering, -1.0) > self.clock.now():
            raise InsufficientCapacity(
                f"alibaba: {request.instance_type} {request.capacity_type} in {request.zone} "
                "was sold out recently (OperationDenied.NoStock)",
                provider=self.name,
            )
        key = label_key(request.request_id)
        with self._lock:
            self._request_ids[key] = request.request_id
            pools = self._observe()
            served = [n for n in self._nodes(pools) if n.request_id == request.request_id]
            if served:
                return served
            total = sum(len(p.nodes) for p in pools.values()) + sum(len(s.open) for s in self._slots.values())
            if total + request.count > self.config.max_nodes:
                raise QuotaExceeded(
                    f"alibaba: max_nodes {self.config.max_nodes} reached ({total} gpuscale nodes)", provider=self.name
                )
            name = pool_name(request)
            slots = _Slots(request, key, name, list(range(request.count)), self.clock.now())
            pool = next((p for p in pools.values() if p.name == name), None)
            if pool is None:
                if len(pools) >= self.config.max_pools:
                    raise QuotaExceeded(
                        f"alibaba: max_pools {self.config.max_pools} gpuscale node pools exist", provider=self.name
                    )
                self._create_pool(request, name)
                slots.asked = True
            elif len(pool.nodes) + request.count > self.config.max_pool_nodes:
                raise QuotaExceeded(
                    f"alibaba: pool {name} would exceed {self.config.max_pool_nodes} nodes", provider=self.name
                )
            self._slots[key] = slots
            if pool is not None:
                self._scale_out(pool, raise_errors=True)
            return self._slot_nodes(slots)

    def delete_node(self, node_id: str) -> None:
        """Remove one node (``RemoveNodePoolNodes`` without ACK's drain), or cancel its open slot."""
        with self._lock:
            pools = self._observe()
            for pool in pools.values():
                for node in pool.nodes:
                    if node_id in (node.instance_id, self._node_id(pool, node)):
                        self._removing.setdefault(pool.id, set()).add(node.instance_id)
                        self._remove_queued(pool)
                        return
            pool_name_, _, rest = node_id.partition("/")
            key, _, slot = rest.partition("/")
            s = self._slots.get(key)
            if s is not None and s.pool == pool_name_ and slot.isdigit() and int(slot) in s.open:
                s.open.remove(int(slot))
                if s.asked:
                    self._cancelled[s.pool] = self._cancelled.get(s.pool, 0) + 1
                if not s.open:
                    del self._slots[key]

    def list_nodes(self) -> Sequence[CloudNode]:
        """Nodes of gpuscale's pools (not being removed) and slots still waiting for a node."""
        with self._lock:
            return self._nodes(self._observe())

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Carry pending work on; return the asynchronous failures found since the last call."""
        with self._lock:
            self._observe()
            events, self._events = self._events, []
            return events

    # --- progress --------------------------------------------------------------------------------------------------
    def _observe(self) -> dict[str, _Pool]:
        self._poll_tasks()
        pools = self._pools()
        busy = {pid for pid, _ in self._tasks.values()}
        for pool in pools.values():
            self._bind(pool)
            if pool.id in self._removing:  # forget removals that are done
                self._removing[pool.id] &= {n.instance_id for n in pool.nodes}
        self._asked_removal &= {i for ids in self._removing.values() for i in ids}
        for pool in pools.values():
            if pool.id in busy or pool.state in _BUSY_STATES:
                continue
            if self._removing.get(pool.id):
                self._remove_queued(pool)
            elif any(s.pool == pool.name and not s.asked for s in self._slots.values()):
                self._scale_out(pool, raise_errors=False)
            elif not pool.nodes and not any(s.pool == pool.name for s in self._slots.values()):
                task = self._call(
                    f"delete pool {pool.id}",
                    lambda p=pool: self._client.delete_cluster_nodepool_with_options(  # type: ignore[misc]
                        self.config.cluster_id, p.id, cs.DeleteClusterNodepoolRequest(), {}, self._runtime
                    ),
                )
                self._tasks[task.body.task_id] = (pool.id, "delete")
                log.info("alibaba: deleting idle pool %s (%s)", pool.id, pool.name)
        return pools

    def _pools(self) -> dict[str, _Pool]:
        body = self._call(
            "describe node pools",
            lambda: self._client.describe_cluster_node_pools_with_options(
                self.config.cluster_id, cs.DescribeClusterNodePoolsRequest(), {}, self._runtime
            ),
        ).body
        out: dict[str, _Pool] = {}
        for np in body.nodepools or []:
            sg = np.scaling_group
            tags = [{"key": t.key, "value": t.value} for t in (sg.tags or [])] if sg else []
            if MANAGED_TAG not in tags or np.nodepool_info is None:
                continue
            labels = {t.key: t.value for t in (np.kubernetes_config.labels or [])} if np.kubernetes_config else {}
            zone = next((self._zone_of[v] for v in (sg.vswitch_ids or []) if v in self._zone_of), "")
            out[np.nodepool_info.nodepool_id] = _Pool(
                np.nodepool_info.nodepool_id,
                np.nodepool_info.name,
                np.status.state if np.status else "",
                (sg.instance_types or [""])[0],
                zone,
                (sg.spot_strategy or "NoSpot") != "NoSpot",
                labels,
            )
        for pool in out.values():
            self._pool_ids[pool.name] = pool.id
            page = 1
            while True:
                req = cs.DescribeClusterNodesRequest(nodepool_id=pool.id, page_size="100", page_number=str(page))
                got = self._call(
                    "describe nodes",
                    lambda r=req: self._client.describe_cluster_nodes_with_options(  # type: ignore[misc]
                        self.config.cluster_id, r, {}, self._runtime
                    ),
                ).body
                pool.nodes.extend(n for n in got.nodes or [] if n.state not in ("removing", "removed"))
                total = got.page.total_count if got.page else 0
                if page * 100 >= (total or 0):
                    break
                page += 1
            pool.nodes.sort(key=lambda n: (n.creation_time or "", n.instance_id or ""))
        return out

    def _bind(self, pool: _Pool) -> None:
        for node in pool.nodes:
            iid = node.instance_id
            self._seen.setdefault(iid, self.clock.now())
            if iid in self._bound:
                continue
            slots = sorted(
                (s for s in self._slots.values() if s.pool == pool.name and s.open and s.asked), key=lambda s: s.at
            )
            if slots:
                s = slots[0]
                self._bound[iid] = (s.key, s.open.pop(0))
                if not s.open:
                    del self._slots[s.key]
            elif self._cancelled.get(pool.name, 0) > 0:
                self._cancelled[pool.name] -= 1
                self._removing.setdefault(pool.id, set()).add(iid)

    def _scale_out(self, pool: _Pool, *, raise_errors: bool) -> None:
        waiting = [s for s in self._slots.values() if s.pool == pool.name and not s.asked]
        count = sum(len(s.open) for s in waiting)
        if not count or pool.state in _BUSY_STATES or any(pid == pool.id for pid, _ in self._tasks.values()):
            return
        try:
            task = self._call(
                f"scale pool {pool.id}",
                lambda: self._client.scale_cluster_node_pool_with_options(
                    self.config.cluster_id, pool.id, cs.ScaleClusterNodePoolRequest(count=count), {}, self._runtime
                ),
            )
        except ProviderError as exc:
            self._fail_slots(waiting, exc, report=not raise_errors)
            if raise_errors:
                raise
            return
        for s in waiting:
            s.asked = True
        self._tasks[task.body.task_id] = (pool.id, "scale")
        log.info("alibaba: scaling pool %s out by %d nodes", pool.id, count)

    def _remove_queued(self, pool: _Pool) -> None:
        ids = sorted(self._removing.get(pool.id, set()) - self._asked_removal)
        present = {n.instance_id for n in pool.nodes}
        ids = [i for i in ids if i in present]
        if not ids or pool.state in _BUSY_STATES or any(pid == pool.id for pid, _ in self._tasks.values()):
            return
        req = cs.RemoveNodePoolNodesRequest(instance_ids=ids, drain_node=False, release_node=True)
        task = self._call(
            f"remove nodes of pool {pool.id}",
            lambda: self._client.remove_node_pool_nodes_with_options(
                self.config.cluster_id, pool.id, req, {}, self._runtime
            ),
        )
        self._asked_removal.update(ids)
        self._tasks[task.body.task_id] = (pool.id, "remove")
        log.info("alibaba: removing nodes %s from pool %s", ", ".join(ids), pool.id)

    def _create_pool(self, request: LaunchRequest, name: str) -> None:
        taints = [GPU_TAINT, *(t for t in request.taints if t != GPU_TAINT)]
        labels = {**request.labels, wk.POOL: request.pool, wk.CAPACITY_TYPE: str(request.capacity_type)}
        sg = cs.CreateClusterNodePoolRequestScalingGroup(
            instance_types=[request.instance_type],
            vswitch_ids=list(self.config.vswitches[request.zone]),
            desired_size=request.count,
            tags=[cs.Tag(key=MANAGED_TAG["key"], value=MANAGED_TAG["value"])],
        )
        if request.capacity_type is CapacityType.SPOT:
            limit = self.config.spot_price_limits.get(request.instance_type)
            sg.spot_strategy = "SpotWithPriceLimit" if limit else "SpotAsPriceGo"
            if limit:
                sg.spot_price_limit = [
                    cs.CreateClusterNodePoolRequestScalingGroupSpotPriceLimit(
                        instance_type=request.instance_type, price_limit=f"{limit:.4f}"
                    )
                ]
        req = cs.CreateClusterNodePoolRequest(
            nodepool_info=cs.CreateClusterNodePoolRequestNodepoolInfo(name=name, type="ess"),
            auto_scaling=cs.CreateClusterNodePoolRequestAutoScaling(enable=False),
            max_nodes=self.config.max_pool_nodes,
            scaling_group=sg,
            kubernetes_config=cs.CreateClusterNodePoolRequestKubernetesConfig(
                labels=[cs.Tag(key=k, value=v) for k, v in sorted(labels.items())],
                taints=[cs.Taint(key=t.key, value=t.value, effect=str(t.effect)) for t in taints],
            ),
        )
        try:
            body = self._call(
                f"create pool {name}",
                lambda: self._client.create_cluster_node_pool_with_options(
                    self.config.cluster_id, req, {}, self._runtime
                ),
            ).body
        except InsufficientCapacity:
            self._mark_unavailable(request)
            raise
        log.info(
            "alibaba: creating pool %s (%s x%d in %s) for request %s",
            name,
            request.instance_type,
            request.count,
            request.zone,
            request.request_id,
        )
        # Read the task once (no waiting): ACK may already know it failed.
        info = self._call(
            "describe task", lambda: self._client.describe_task_info_with_options(body.task_id, {}, self._runtime)
        ).body
        if info.state == "fail":
            err = self._task_error(info, f"create pool {name}")
            if isinstance(err, InsufficientCapacity):
                self._mark_unavailable(request)
            raise err
        self._tasks[body.task_id] = (body.nodepool_id, "create")
        self._pool_ids[name] = body.nodepool_id

    def _poll_tasks(self) -> None:
        for task_id, (pool_id, purpose) in list(self._tasks.items()):
            info = self._call(
                "describe task",
                lambda t=task_id: self._client.describe_task_info_with_options(  # type: ignore[misc]
                    t, {}, self._runtime
                ),
            ).body
            if info.state in ("running", "pending", None):
                continue
            del self._tasks[task_id]
            if info.state == "fail" and purpose in ("create", "scale"):
                err = self._task_error(info, f"{purpose} pool {pool_id}")
                asked = [s for s in self._slots.values() if s.asked and self._pool_of(s) == pool_id]
                self._fail_slots(asked, err, report=True)
            elif info.state == "fail":
                log.warning("alibaba: %s of pool %s failed: %s", purpose, pool_id, self._scrub(str(info.error)))

    def _pool_of(self, s: _Slots) -> str:
        return self._pool_ids.get(s.pool, "")

    def _fail_slots(self, slots: list[_Slots], err: ProviderError, *, report: bool) -> None:
        for s in slots:
            if isinstance(err, InsufficientCapacity):
                self._mark_unavailable(s.request)
            if report:
                for i in s.open:
                    self._events.append(
                        ProviderEvent(
                            ProviderEventKind.LAUNCH_FAILED,
                            node_id=f"{s.pool}/{s.key}/{i}",
                            request_id=s.request.request_id,
                            message=str(err),
                            at=self.clock.now(),
                        )
                    )
            self._slots.pop(s.key, None)

    def _mark_unavailable(self, request: LaunchRequest) -> None:
        offering = (request.instance_type, request.zone, request.capacity_type)
        self._unavailable[offering] = self.clock.now() + self.config.unavailable_ttl_s

    # --- nodes -----------------------------------------------------------------------------------------------------
    def _node_id(self, pool: _Pool, node: cs.DescribeClusterNodesResponseBodyNodes) -> str:
        owner = self._bound.get(node.instance_id)
        return f"{pool.name}/{owner[0]}/{owner[1]}" if owner else node.instance_id

    def _slot_nodes(self, s: _Slots) -> list[CloudNode]:
        r = s.request
        return [
            CloudNode(
                f"{s.pool}/{s.key}/{i}",
                r.request_id,
                r.pool,
                r.instance_type,
                r.zone,
                r.capacity_type,
                CloudNodeState.PROVISIONING,
                created_at=s.at,
                labels=dict(r.labels),
            )
            for i in s.open
        ]

    def _nodes(self, pools: Mapping[str, _Pool]) -> list[CloudNode]:
        out: list[CloudNode] = []
        for pool in pools.values():
            hidden = self._removing.get(pool.id, set())
            for node in pool.nodes:
                if node.instance_id in hidden:
                    continue
                owner = self._bound.get(node.instance_id)
                out.append(
                    CloudNode(
                        node_id=self._node_id(pool, node),
                        request_id=self._request_ids.get(owner[0], owner[0]) if owner else "",
                        pool=pool.labels.get(wk.POOL, ""),
                        instance_type=pool.instance_type,
                        zone=pool.zone,
                        capacity_type=CapacityType.SPOT if pool.spot else CapacityType.ON_DEMAND,
                        state=_STATE.get(node.state or "", CloudNodeState.PROVISIONING),
                        created_at=self._seen.get(node.instance_id, 0.0),
                        node_name=node.node_name or "",
                        instance_id=node.instance_id,
                        labels=dict(pool.labels),
                    )
                )
        for s in self._slots.values():
            out.extend(self._slot_nodes(s))
        return sorted(out, key=lambda n: n.node_id)

    # --- errors ----------------------------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _task_error(self, info: cs.DescribeTaskInfoResponseBody, what: str) -> ProviderError:
        code = (info.error.code if info.error else "") or ""
        message = self._scrub(f"{code}: {info.error.message if info.error else 'task failed'}")
        text = f"alibaba {what}: {message[:300]}"
        if _CAPACITY.search(code) or _CAPACITY.search(message):
            return InsufficientCapacity(text, provider=self.name)
        if _QUOTA.search(code):
            return QuotaExceeded(text, provider=self.name)
        return ProviderError(text, provider=self.name)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """One SDK call; its failure mapped to the error tree (chained unless the secret could ride along)."""
        try:
            return fn()
        except TeaException as exc:
            err = self._map(exc, what)
            leaks = bool(self._secret) and self._secret in f"{exc} {exc.data!r}"
            if leaks:
                raise err from None
            raise err from exc
        except Exception as exc:
            mod = type(exc).__module__
            if any(m in mod for m in ("requests", "urllib3", "aiohttp", "socket", "darabonba")) or isinstance(
                exc, OSError
            ):
                raise TransientProviderError(
                    f"alibaba {what}: connection failed ({type(exc).__name__})", provider=self.name
                ) from None
            raise

    def _map(self, exc: TeaException, what: str) -> ProviderError:
        code = str(getattr(exc, "code", "") or "")
        data = getattr(exc, "data", None) or {}
        status = int(
            getattr(exc, "status_code", 0) or (data.get("statusCode", 0) if isinstance(data, dict) else 0) or 0
        )
        message = self._scrub(str(data.get("message", "") if isinstance(data, dict) else "") or str(exc.message))
        text = f"alibaba {what}: {code}: {message[:300]}"
        if _CAPACITY.search(code) or _CAPACITY.search(message):
            return InsufficientCapacity(text, provider=self.name, status=status or None)
        if _QUOTA.search(code):
            return QuotaExceeded(text, provider=self.name, status=status or None)
        if code.startswith("Throttling") or status == 429:
            return RateLimited(text, provider=self.name, retry_after=5.0)
        if _AUTH.match(code) or status in (401, 403):
            return AuthenticationError(f"alibaba {what}: credentials rejected ({code or status})", provider=self.name)
        if status == 404 or code.endswith("NotFound"):
            return NotFound(text, provider=self.name, status=404)
        if status >= 500 or code in ("ServiceUnavailable", "InternalError"):
            return TransientProviderError(text, provider=self.name, status=status or None)
        if status == 400:
            return InvalidProviderRequest(f"{code}: {message[:300]}", provider=self.name, status=400)
        return ProviderError(text, provider=self.name, status=status or None)
