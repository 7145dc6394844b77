"""Alibaba Cloud ACK provider: GPU nodes in ACK node pools, through the official ``alibabacloud-cs20151215`` SDK.

Pools and slots
---------------
One node pool per offering (gpuscale pool, instance type, zone, capacity type, labels, taints), named
``gpuscale-<10 hex>`` (:func:`pool_name`), created on demand in the zone's vSwitches with the instance type, its
Kubernetes labels and taints (``nvidia.com/gpu=present:NoSchedule`` besides the request's), ACK's own auto scaling
off (gpuscale is the autoscaler), ``max_nodes`` as the pool's maximum and ``desired_size`` = the launch's count; spot
pools use ``SpotWithPriceLimit`` with the configured price limit of the type (``SpotAsPriceGo`` when none is set).
A launch into an existing pool raises its ``desired_size`` with ``ModifyClusterNodePool``. A specific node leaves
with ``RemoveNodePoolNodes`` (``drain_node=false``: gpuscale has drained it; ``release_node=true``), never by
lowering the pool's size; pools left with no node are deleted.

The ledger
----------
ACK keeps no per-node label gpuscale could write, so each pool's scaling-group tags ``gpuscale.ledger.<i>`` hold the
slots it was asked for, in ask order (:class:`Entry`: request id, slot, and the instance id once its node is being
removed). The ledger is written in the very call that asks for nodes (``CreateClusterNodePool``, or
``ModifyClusterNodePool`` with the new ``desired_size`` and tags together), and a removal is tombstoned in it before
``RemoveNodePoolNodes``. One task at a time per pool makes ACK create nodes in ask order, so :func:`bind` pairs nodes
(by creation time) with slots. Only work not yet asked of ACK lives in the process: after a restart every node is
listed with its request id and node id ``<pool name>/<request key>/<i>``, and a relaunch creates nothing.

As on GKE, a launch reserves slots and returns at once; ACK's changes are tasks, read with ``DescribeTaskInfo`` on
later rounds, never waited on. An idle pool whose ledger still has slots without nodes failed to get them.

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

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from alibabacloud_cs20151215 import models as cs
from alibabacloud_cs20151215.client import Client
from alibabacloud_tea_openapi import models as openapi
from darabonba.runtime import RuntimeOptions
from Tea.exceptions import TeaException

from gpuscale.clock import Clock
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
from gpuscale.providers._common import SlotProvider, slot_id
from gpuscale.providers._support import digest_key, pool_name, scrub_secrets
from gpuscale.providers.alibaba_ledger import LEDGER_PREFIX, TAGS_MAX, Entry, bind, decode_ledger, encode_ledger
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, ProviderCapabilities

__all__ = [
    "API_CALLS",
    "AlibabaConfig",
    "AlibabaProvider",
    "Entry",
    "bind",
    "decode_ledger",
    "encode_ledger",
    "pool_name",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

PROVIDER_NAME = "alibaba"
KEY_ID_ENV, KEY_SECRET_ENV = "ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
GPU_TAINT = Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present")
MANAGED_TAG = {"key": "gpuscale", "value": "managed"}
API_CALLS = (
    "CreateClusterNodePool",
    "DescribeClusterNodePools",
    "ModifyClusterNodePool",
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
    return value if re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", value) else digest_key(value)


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
    count: int
    at: float


@dataclass
class _Pool:
    id: str
    name: str
    state: str
    instance_type: str
    zone: str
    spot: bool
    labels: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)
    nodes: list[cs.DescribeClusterNodesResponseBodyNodes] = field(default_factory=list)
    ledger: list[Entry] = field(default_factory=list)
    bound: dict[str, Entry] = field(default_factory=dict)
    open: list[Entry] = field(default_factory=list)


class AlibabaProvider(SlotProvider["_Pool"]):
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
        super().__init__(clock, config.unavailable_ttl_s)
        self.config = config
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
        # Only work not yet asked of ACK lives here; what was asked is in the pools' ledgers.
        self._waiting: dict[str, _Slots] = {}  # request key -> slots to add with the next ledger write
        self._tasks: dict[str, tuple[str, str]] = {}  # task id -> (pool id, purpose)
        self._removing: dict[str, set[str]] = {}  # pool id -> instance ids to tombstone and remove
        self._cancel: dict[str, set[tuple[str, int]]] = {}  # pool id -> open (request id, slot) to cancel
        self._failed: dict[str, ProviderError] = {}  # pool id -> why its last create or scale-out task failed
        self._raised: set[str] = set()  # pools whose creation failed at once (the launch raised)
        self._seen: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"AlibabaProvider(cluster_id={self.config.cluster_id!r}, region={self.config.region!r})"

    @property
    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(
            spot=True,
            delete_specific_node=True,
            zones=tuple(self.config.vswitches),
            max_nodes_per_launch=self.config.max_pool_nodes,
            reports_node_ready=False,
        )

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
        self._refuse_if_out_of_stock(request, "was sold out recently (OperationDenied.NoStock)")
        key = label_key(request.request_id)
        with self._lock:
            pools = self._observe()
            served = [n for n in self._nodes(pools) if n.request_id == request.request_id]
            if served or any(e.request_id == request.request_id for p in pools.values() for e in p.ledger):
                return served  # asked before (maybe by an earlier process): nothing new
            total = sum(len(p.nodes) + len(p.open) for p in pools.values())
            total += sum(s.count for s in self._waiting.values())
            if total + request.count > self.config.max_nodes:
                raise QuotaExceeded(
                    f"alibaba: max_nodes {self.config.max_nodes} reached ({total} gpuscale nodes)", provider=self.name
                )
            name = pool_name(request)
            slots = _Slots(request, key, name, request.count, self.clock.now())
            pool = next((p for p in pools.values() if p.name == name), None)
            if pool is None:
                if len(pools) >= self.config.max_pools:
                    raise QuotaExceeded(
                        f"alibaba: max_pools {self.config.max_pools} gpuscale node pools exist", provider=self.name
                    )
                self._create_pool(request, name)
                return self._slot_nodes(slots)
            if len(pool.nodes) + len(pool.open) + request.count > self.config.max_pool_nodes:
                raise QuotaExceeded(
                    f"alibaba: pool {name} would exceed {self.config.max_pool_nodes} nodes", provider=self.name
                )
            self._waiting[key] = slots
            try:
                self._sync(pool, raise_errors=True)
            except ProviderError:
                self._waiting.pop(key, None)
                raise
            return self._slot_nodes(slots)

    def delete_node(self, node_id: str) -> None:
        """Remove one node (tombstoned in the ledger, then ``RemoveNodePoolNodes`` without ACK's drain), or cancel
        its open slot."""
        with self._lock:
            pools = self._observe()
            for pool in pools.values():
                for node in pool.nodes:
                    if node_id in (node.instance_id, self._node_id(pool, node)):
                        self._removing.setdefault(pool.id, set()).add(node.instance_id)
                        self._sync(pool, raise_errors=True)
                        return
                for e in pool.open:
                    if node_id == self._entry_id(pool, e) and e.gone is None:
                        self._cancel.setdefault(pool.id, set()).add((e.request_id, e.slot))
                        self._sync(pool, raise_errors=True)
                        return
            pool_name_, _, rest = node_id.partition("/")
            key, _, slot = rest.partition("/")
            s = self._waiting.get(key)
            if s is not None and s.pool == pool_name_ and slot.isdigit() and int(slot) < s.count:
                s.count -= 1
                if not s.count:
                    del self._waiting[key]

    # --- progress --------------------------------------------------------------------------------------------------
    def _observe(self) -> dict[str, _Pool]:
        self._poll_tasks()
        pools = self._pools()
        for pool in pools.values():
            self._sync(pool, raise_errors=False)
        return pools

    def _idle(self, pool: _Pool) -> bool:
        return pool.state not in _BUSY_STATES and not any(pid == pool.id for pid, _ in self._tasks.values())

    def _sync(self, pool: _Pool, *, raise_errors: bool) -> None:
        """One step for an idle pool: a ledger write (with any scale-out in the same call), else the removal of
        tombstoned nodes, else the deletion of an empty pool."""
        if not self._idle(pool):
            return
        present = {n.instance_id for n in pool.nodes}
        ledger = [e for e in pool.ledger if not e.gone or e.gone in present]  # finished removals drop out
        cancel = self._cancel.pop(pool.id, set())
        if pool.open:  # an idle pool with slots but no node for them: the asking task failed
            err = self._failed.pop(pool.id, None) or ProviderError(
                f"alibaba: pool {pool.name} settled without nodes for {len(pool.open)} slots", provider=self.name
            )
            if pool.id not in self._raised:
                self._report_failed([e for e in pool.open if (e.request_id, e.slot) not in cancel], pool, err)
            ledger = [e for e in ledger if e not in pool.open]
            self._raised.discard(pool.id)
        cancelled = {iid for iid, e in pool.bound.items() if (e.request_id, e.slot) in cancel}
        if cancelled:  # the nodes of slots cancelled while the pool was busy: removed like any other
            self._removing.setdefault(pool.id, set()).update(cancelled)
        removing = self._removing.get(pool.id, set()) & present
        by_node = {e: iid for iid, e in pool.bound.items()}
        ledger = [Entry(e.request_id, e.slot, by_node[e]) if by_node.get(e) in removing else e for e in ledger]
        # A node outside the ledger (a pool from before it) is tombstoned under no request.
        ledger += [Entry("", 0, iid) for iid in sorted(removing - set(pool.bound) - {e.gone for e in ledger})]
        waiting = [s for s in self._waiting.values() if s.pool == pool.name]
        ledger += [Entry(s.request.request_id, i) for s in waiting for i in range(s.count)]
        count = sum(s.count for s in waiting)
        if ledger != pool.ledger or count:
            self._modify(pool, ledger, len(pool.nodes) + count if count else None, waiting, raise_errors)
            return
        tombstoned = sorted({e.gone for e in ledger if e.gone} & present)
        if tombstoned:
            self._remove(pool, tombstoned)
        elif not pool.nodes and not ledger:
            task = self._call(
                f"delete pool {pool.id}",
                lambda p=pool: self._client.delete_cluster_nodepool_with_options(  # type: ignore[misc]
                    self.config.cluster_id, p.id, cs.DeleteClusterNodepoolRequest(), {}, self._runtime
                ),
            )
            self._tasks[task.body.task_id] = (pool.id, "delete")
            log.info("alibaba: deleting idle pool %s (%s)", pool.id, pool.name)

    def _modify(
        self, pool: _Pool, ledger: list[Entry], desired: int | None, waiting: list[_Slots], raise_errors: bool
    ) -> None:
        tags = {k: v for k, v in pool.tags.items() if not k.startswith(LEDGER_PREFIX)} | encode_ledger(ledger)
        if len(tags) > TAGS_MAX:
            err = QuotaExceeded(
                f"alibaba: the ledger of pool {pool.name} needs more than {TAGS_MAX} tags; use fewer slots per pool",
                provider=self.name,
            )
            self._fail_waiting(waiting, err, report=not raise_errors)
            if raise_errors:
                raise err
            return
        sg = cs.ModifyClusterNodePoolRequestScalingGroup(
            tags=[cs.Tag(key=k, value=v) for k, v in sorted(tags.items())], desired_size=desired
        )
        try:
            task = self._call(
                f"update pool {pool.id}",
                lambda: self._client.modify_cluster_node_pool_with_options(
                    self.config.cluster_id,
                    pool.id,
                    cs.ModifyClusterNodePoolRequest(scaling_group=sg),
                    {},
                    self._runtime,
                ),
            )
        except ProviderError as exc:
            if isinstance(exc, InsufficientCapacity):
                for s in waiting:
                    self._mark_request_unavailable(s.request)
            self._fail_waiting(waiting, exc, report=not raise_errors)
            if raise_errors:
                raise
            return
        for s in waiting:
            self._waiting.pop(s.key, None)
        self._tasks[task.body.task_id] = (pool.id, "scale" if desired is not None else "update")
        pool.ledger = ledger
        pool.bound, pool.open = bind(ledger, [n.instance_id for n in pool.nodes])
        if desired is not None:
            log.info("alibaba: scaling pool %s to %d nodes", pool.id, desired)

    def _remove(self, pool: _Pool, ids: list[str]) -> None:
        req = cs.RemoveNodePoolNodesRequest(instance_ids=ids, drain_node=False, release_node=True)
        task = self._call(
            f"remove nodes of pool {pool.id}",
            lambda: self._client.remove_node_pool_nodes_with_options(
                self.config.cluster_id, pool.id, req, {}, self._runtime
            ),
        )
        self._tasks[task.body.task_id] = (pool.id, "remove")
        log.info("alibaba: removing nodes %s from pool %s", ", ".join(ids), pool.id)

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
            tags = {t.key: t.value for t in (sg.tags or [])} if sg else {}
            if tags.get(MANAGED_TAG["key"]) != MANAGED_TAG["value"] or np.nodepool_info is None:
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
                tags,
                ledger=decode_ledger(tags),
            )
        for pool in out.values():
            page = 1
            while True:
                req = cs.DescribeClusterNodesRequest(nodepool_id=pool.id, page_size="100", page_number=str(page))
                got = self._call(
                    "describe nodes",
                    lambda r=req: self._client.describe_cluster_nodes_with_options(  # type: ignore[misc]
                        self.config.cluster_id, r, {}, self._runtime
                    ),
                ).body
                pool.nodes.extend(n for n in got.nodes or [] if n.state != "removed")
                total = got.page.total_count if got.page else 0
                if page * 100 >= (total or 0):
                    break
                page += 1
            pool.nodes.sort(key=lambda n: (n.creation_time or "", n.instance_id or ""))
            for n in pool.nodes:
                self._seen.setdefault(n.instance_id, self.clock.now())
            pool.bound, pool.open = bind(pool.ledger, [n.instance_id for n in pool.nodes])
            # Tombstoned nodes (also those a crashed process tombstoned) are removed.
            gone = {e.gone for e in pool.ledger if e.gone} & {
                n.instance_id for n in pool.nodes if n.state != "removing"
            }
            if gone:
                self._removing.setdefault(pool.id, set()).update(gone)
            if pool.id in self._removing:
                self._removing[pool.id] &= {n.instance_id for n in pool.nodes}
        return out

    def _create_pool(self, request: LaunchRequest, name: str) -> None:
        taints = [GPU_TAINT, *(t for t in request.taints if t != GPU_TAINT)]
        labels = {**request.labels, wk.POOL: request.pool, wk.CAPACITY_TYPE: str(request.capacity_type)}
        ledger = encode_ledger([Entry(request.request_id, i) for i in range(request.count)])
        if len(ledger) + 1 > TAGS_MAX:
            raise QuotaExceeded(
                f"alibaba: the ledger of {request.count} slots needs more than {TAGS_MAX} tags", provider=self.name
            )
        sg = cs.CreateClusterNodePoolRequestScalingGroup(
            instance_types=[request.instance_type],
            vswitch_ids=list(self.config.vswitches[request.zone]),
            desired_size=request.count,
            tags=[cs.Tag(key=MANAGED_TAG["key"], value=MANAGED_TAG["value"])]
            + [cs.Tag(key=k, value=v) for k, v in ledger.items()],
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
            self._mark_request_unavailable(request)
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
            self._raised.add(body.nodepool_id)  # launch raises it: no event for these slots later
            err = self._task_error(info, f"create pool {name}")
            if isinstance(err, InsufficientCapacity):
                self._mark_request_unavailable(request)
            raise err
        self._tasks[body.task_id] = (body.nodepool_id, "create")

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
                self._failed[pool_id] = self._task_error(info, f"{purpose} pool {pool_id}")
            elif info.state == "fail":
                log.warning("alibaba: %s of pool %s failed: %s", purpose, pool_id, self._scrub(str(info.error)))

    def _report_failed(self, entries: list[Entry], pool: _Pool, err: ProviderError) -> None:
        if isinstance(err, InsufficientCapacity):
            self._mark_unavailable(
                pool.instance_type, pool.zone, CapacityType.SPOT if pool.spot else CapacityType.ON_DEMAND
            )
        for e in entries:
            self._launch_failed(pool.name, label_key(e.request_id), e.request_id, (e.slot,), err)

    def _fail_waiting(self, slots: list[_Slots], err: ProviderError, *, report: bool) -> None:
        for s in slots:
            if isinstance(err, InsufficientCapacity):
                self._mark_request_unavailable(s.request)
            if report:
                self._launch_failed(s.pool, s.key, s.request.request_id, range(s.count), err)
            self._waiting.pop(s.key, None)

    # --- nodes -----------------------------------------------------------------------------------------------------
    @staticmethod
    def _entry_id(pool: _Pool, e: Entry) -> str:
        return slot_id(pool.name, label_key(e.request_id), e.slot)

    def _node_id(self, pool: _Pool, node: cs.DescribeClusterNodesResponseBodyNodes) -> str:
        e = pool.bound.get(node.instance_id)
        return self._entry_id(pool, e) if e else node.instance_id

    def _slot_nodes(self, s: _Slots) -> list[CloudNode]:
        return self._open_slots(s.request, s.pool, s.key, range(s.count), s.at)

    def _nodes(self, pools: Mapping[str, _Pool]) -> list[CloudNode]:
        out: list[CloudNode] = []
        for pool in pools.values():
            hidden = self._removing.get(pool.id, set()) | {e.gone for e in pool.ledger if e.gone}
            cancelled = self._cancel.get(pool.id, set())
            ct = CapacityType.SPOT if pool.spot else CapacityType.ON_DEMAND
            for node in pool.nodes:
                e = pool.bound.get(node.instance_id)
                if (
                    node.instance_id in hidden
                    or node.state == "removing"
                    or (e and (e.request_id, e.slot) in cancelled)
                ):
                    continue
                out.append(
                    CloudNode(
                        node_id=self._node_id(pool, node),
                        request_id=e.request_id if e else "",
                        pool=pool.labels.get(wk.POOL, ""),
                        instance_type=pool.instance_type,
                        zone=pool.zone,
                        capacity_type=ct,
                        state=_STATE.get(node.state or "", CloudNodeState.PROVISIONING),
                        created_at=self._seen.get(node.instance_id, 0.0),
                        node_name=node.node_name or "",
                        instance_id=node.instance_id,
                        labels=dict(pool.labels),
                    )
                )
            for e in pool.open:
                if e.gone is not None or (e.request_id, e.slot) in cancelled:
                    continue
                out.append(
                    CloudNode(
                        self._entry_id(pool, e),
                        e.request_id,
                        pool.labels.get(wk.POOL, ""),
                        pool.instance_type,
                        pool.zone,
                        ct,
                        CloudNodeState.PROVISIONING,
                        labels={k: v for k, v in pool.labels.items() if k not in (wk.POOL, wk.CAPACITY_TYPE)},
                    )
                )
        for s in self._waiting.values():
            out.extend(self._slot_nodes(s))
        return sorted(out, key=lambda n: n.node_id)

    # --- errors ----------------------------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return scrub_secrets(text, (self._secret,))

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
