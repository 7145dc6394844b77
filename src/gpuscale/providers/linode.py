"""Linode LKE provider: GPU nodes as LKE node pools, through the official ``linode_api4`` SDK.

Tag and label scheme (how gpuscale recognises its pools and stays idempotent across crashes)
--------------------------------------------------------------------------------------------
Every pool gpuscale creates carries the tags ``gpuscale`` (the management marker), ``gpuscale-pool:<pool key>``
and ``gpuscale-req:<request key>`` (the request that created it). Keys are the id itself when it is a valid
Kubernetes label name of at most 36 characters (UUIDs qualify), else ``h-`` + 30 hex digits of its SHA-256, so a
tag never exceeds Linode's 50 characters (:func:`tag_key`).

Which requests a pool serves, and with how many nodes, is a *ledger* kept in the pool's labels: one label
``requests.gpuscale.io/<request key>: "<seq>.<count>"`` per request. The spec's update operation (``PUT`` pool)
accepts ``count``, ``labels`` and ``taints`` but not ``tags``, so the ledger lives in labels, where a growth can
change ``count`` and add its ledger entry in *one* request: either both happen or neither does. Hence:

- ``launch`` first lists the cluster's pools; if the request key is in some ledger, the request was already served
  (possibly by a process that crashed before recording it) and its nodes are returned; nothing is created.
- Otherwise a new pool is created (tags + ledger ``1.<count>``), or, when ``MAX_NODE_POOL_COUNT`` gpuscale pools
  exist, an existing gpuscale pool of the same type, labels and taints grows by ``count`` with ledger entry
  ``<max seq + 1>.<count>`` in the same ``PUT``.
- Nodes of a pool are attributed to ledger entries in ``seq`` order, taking the pool's nodes in creation order
  (Linode instance ids increase). Deleting a node decrements its owner's entry (a ``PUT`` of labels only), so the
  attribution of the remaining nodes does not move. Nodes of one pool share type, labels and taints, so the
  attribution is bookkeeping (a recycled node, which gets a new instance id, may change owner within its pool);
  the per-request counts are exact.
- A crash between deleting a node and decrementing the ledger leaves the ledger counting a node that is gone: the
  request simply reports one node less. The order was chosen so no node is ever left without an owner.
- A pool's ``count`` is only ever raised. Shrinking is always ``DELETE .../nodes/{nodeId}`` of the chosen node,
  or ``DELETE`` of the whole pool when it would become empty: lowering ``count`` makes LKE remove a node of its
  own choosing, possibly a busy one.

Pools tagged ``gpuscale`` whose ledger names requests the controller does not know (after a crash or a lost
database) are found by :meth:`LinodeProvider.orphans` and removed by :meth:`LinodeProvider.collect_garbage`;
:meth:`LinodeProvider.adopt` maps known request ids back to their nodes.

Errors and retries
------------------
The SDK's own retries are disabled (they sleep in real time inside urllib3, and would re-send a ``POST``), and the
provider never retries or sleeps either: each call is made once and a failure is raised as its mapped error with
its :class:`~gpuscale.errors.RetryPolicy` (HTTP 429 as :class:`~gpuscale.errors.RateLimited` carrying
``Retry-After``; 408/5xx, timeouts and connection errors as :class:`~gpuscale.errors.TransientProviderError`). The
caller's launcher retries the whole operation, which is idempotent by request id, in a later reconcile at the due
time: one retry layer in the system. The SDK sets no timeout, so a default one is mounted on its session. API
errors map to :mod:`gpuscale.errors` (chained with ``from``); a 400 keeps the API's ``reason`` and ``field``. The
token is read from ``LINODE_TOKEN`` and never appears in logs, exceptions or reprs.
"""

from __future__ import annotations

import email.utils
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import requests
from linode_api4 import ApiError, LinodeClient, LKECluster, LKENodePool
from requests.adapters import HTTPAdapter

from gpuscale.clock import Clock, SystemClock
from gpuscale.core import labels as wk
from gpuscale.core.model import CapacityType, Taint, TaintEffect
from gpuscale.errors import (
    AuthenticationError,
    GpuscaleError,
    InputError,
    InsufficientCapacity,
    InvalidProviderRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers._ledger import LEDGER_LABEL_PREFIX, attribute, ledger_labels, next_seq, split_ledger, tag_key
from gpuscale.providers._support import scrub_secrets
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    ProviderCapabilities,
    ProviderEvent,
    ProviderEventKind,
)

__all__ = [
    "LEDGER_LABEL_PREFIX",
    "MANAGED_TAG",
    "MISSING_TOKEN_MESSAGE",
    "POOL_TAG_PREFIX",
    "REQUEST_TAG_PREFIX",
    "TOKEN_ENV",
    "LinodeConfig",
    "LinodeProvider",
    "Orphan",
    "tag_key",
]

log = logging.getLogger(__name__)

PROVIDER_NAME = "linode"
TOKEN_ENV = "LINODE_TOKEN"
MISSING_TOKEN_MESSAGE = "LINODE_TOKEN environment variable is not set"
MANAGED_TAG = "gpuscale"
POOL_TAG_PREFIX = "gpuscale-pool:"
REQUEST_TAG_PREFIX = "gpuscale-req:"
DEFAULT_BASE_URL = "https://api.linode.com/v4"
DEFAULT_MAX_NODE_POOL_COUNT = 10
DEFAULT_MAX_NODES = 100
MAX_POOL_SIZE = 100
"""LKE's maximum ``count`` of one node pool."""

_QUOTA_RE = re.compile(r"limit|quota|maximum number", re.IGNORECASE)
_CAPACITY_RE = re.compile(r"no (capacity|availability)|not available|unavailable|sold out", re.IGNORECASE)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LinodeConfig:
    """Where and how the provider works. ``max_nodes`` caps the nodes of all gpuscale pools together."""

    cluster_id: int
    region: str
    base_url: str = DEFAULT_BASE_URL
    max_node_pool_count: int = DEFAULT_MAX_NODE_POOL_COUNT
    max_nodes: int = DEFAULT_MAX_NODES
    timeout_s: float = 30.0
    default_retry_after_s: float = 1.0
    """The retry delay a 429 without a usable ``Retry-After`` header carries."""
    not_ready_deadline_s: float = 900.0

    def __post_init__(self) -> None:
        for name in ("max_node_pool_count", "max_nodes"):
            if getattr(self, name) < 1:
                raise InputError("must be at least 1", where=f"linode config {name}", value=getattr(self, name))
        for name in ("timeout_s", "default_retry_after_s", "not_ready_deadline_s"):
            if getattr(self, name) <= 0:
                raise InputError("must be positive", where=f"linode config {name}", value=getattr(self, name))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LinodeConfig:
        """Read ``LINODE_CLUSTER_ID``, ``LINODE_REGION`` and optional ``LINODE_API_URL``, ``MAX_NODE_POOL_COUNT``,
        ``MAX_NODE_COUNT``."""
        env = os.environ if env is None else env

        def number(name: str, default: int | None) -> int:
            raw = env.get(name)
            if raw is None or raw == "":
                if default is None:
                    raise InputError("is not set", where=f"environment variable {name}", fix="set it to an integer")
                return default
            try:
                return int(raw)
            except ValueError:
                raise InputError(
                    "is not an integer", where=f"environment variable {name}", value=raw, fix="set it to an integer"
                ) from None

        region = env.get("LINODE_REGION", "")
        if not region:
            raise InputError("is not set", where="environment variable LINODE_REGION", fix="set it, e.g. us-ord")
        return cls(
            cluster_id=number("LINODE_CLUSTER_ID", None),
            region=region,
            base_url=env.get("LINODE_API_URL") or DEFAULT_BASE_URL,
            max_node_pool_count=number("MAX_NODE_POOL_COUNT", DEFAULT_MAX_NODE_POOL_COUNT),
            max_nodes=number("MAX_NODE_COUNT", DEFAULT_MAX_NODES),
        )


@dataclass(frozen=True, slots=True)
class Orphan:
    """Nodes of a gpuscale pool that serve no known request. ``whole_pool`` when every node of the pool is orphaned."""

    pool_id: int
    pool: str
    request_key: str
    node_ids: tuple[str, ...]
    whole_pool: bool


@dataclass(frozen=True, slots=True)
class _Node:
    id: str
    instance_id: str
    status: str

    def order(self) -> tuple[int, str]:
        return (int(self.instance_id) if self.instance_id.isdigit() else 1 << 62, self.id)


@dataclass(frozen=True, slots=True)
class _Pool:
    id: int
    type: str
    count: int
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    """User labels: every label except the ledger."""
    ledger: Mapping[str, tuple[int, int]]
    """request key -> (seq, node count)."""
    taints: tuple[Taint, ...]
    nodes: tuple[_Node, ...]

    @property
    def managed(self) -> bool:
        return MANAGED_TAG in self.tags

    @property
    def name(self) -> str:
        if wk.POOL in self.labels:
            return self.labels[wk.POOL]
        return next((t[len(POOL_TAG_PREFIX) :] for t in self.tags if t.startswith(POOL_TAG_PREFIX)), "")

    def owners(self) -> dict[str, str]:
        """node id -> request key ('' for nodes beyond the ledger)."""
        return attribute(self.ledger, (n.id for n in sorted(self.nodes, key=_Node.order)))


def _taint_to_api(t: Taint) -> dict[str, str]:
    return {"key": t.key, "value": t.value, "effect": str(t.effect)}


class _TimeoutAdapter(HTTPAdapter):
    """Gives every request a timeout (the SDK passes none) and retries nothing at the HTTP layer."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(max_retries=0)
        self._timeout_s = timeout_s

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        return super().send(
            request,
            stream=stream,
            timeout=self._timeout_s if timeout is None else timeout,
            verify=verify,
            cert=cert,
            proxies=proxies,
        )


class LinodeProvider:
    """The :class:`~gpuscale.providers.base.Provider` for Linode LKE. See the module docstring for the scheme.

    The token comes from ``token`` or else ``env[LINODE_TOKEN]``; without one the constructor raises
    :class:`~gpuscale.errors.AuthenticationError` (``LINODE_TOKEN environment variable is not set``) and no call
    is made. ``clock`` times nodes (first seen, not ready since); the provider never sleeps.
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        config: LinodeConfig,
        *,
        token: str | None = None,
        env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        env = os.environ if env is None else env
        secret = token if token is not None else env.get(TOKEN_ENV, "")
        if not secret:
            raise AuthenticationError(MISSING_TOKEN_MESSAGE, provider=PROVIDER_NAME)
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self._client = LinodeClient(secret, base_url=config.base_url.rstrip("/"), retry=False)
        adapter = _TimeoutAdapter(config.timeout_s)
        self._client.session.mount("http://", adapter)
        self._client.session.mount("https://", adapter)
        self._lock = threading.RLock()
        self._cluster_checked = False
        self._request_ids: dict[str, str] = {}
        self._first_seen: dict[str, float] = {}
        self._not_ready_since: dict[str, float] = {}
        self._reported_stuck: set[str] = set()
        self._events: list[ProviderEvent] = []

    def __repr__(self) -> str:
        return f"LinodeProvider(cluster_id={self.config.cluster_id}, region={self.config.region!r})"

    @property
    def capabilities(self) -> ProviderCapabilities:
        """On-demand only, one region, specific nodes can be deleted, at most one pool's worth per launch."""
        return ProviderCapabilities(
            spot=False, delete_specific_node=True, zones=(self.config.region,), max_nodes_per_launch=MAX_POOL_SIZE
        )

    # --- Provider protocol ---------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """Create a pool (or grow one at the pool cap) for ``request``; return its nodes if it was served before."""
        if request.count < 1 or request.count > MAX_POOL_SIZE:
            raise InvalidProviderRequest(
                f"count must be between 1 and {MAX_POOL_SIZE}", provider=self.name, field="count"
            )
        if request.zone not in ("", self.config.region):
            raise InvalidProviderRequest(
                f"zone {request.zone!r} is not the cluster's region {self.config.region!r}",
                provider=self.name,
                field="zone",
            )
        if request.capacity_type is not CapacityType.ON_DEMAND:
            raise InsufficientCapacity("Linode offers no spot capacity", provider=self.name)
        key = tag_key(request.request_id)
        with self._lock:
            self._request_ids[key] = request.request_id
            self._ensure_cluster()
            return self._call(f"launch {request.request_id}", lambda: self._launch_once(request, key))

    def delete_node(self, node_id: str) -> None:
        """Delete this node (its whole pool if it is the pool's last node). A node already gone is success."""
        with self._lock:
            pool = next((p for p in self._pools() if any(n.id == node_id for n in p.nodes)), None)
            if pool is None:
                self._forget(node_id)
                return
            if not pool.managed:
                raise InvalidProviderRequest(
                    f"node {node_id} is in pool {pool.id}, which gpuscale does not manage",
                    provider=self.name,
                    field="node_id",
                )
            if len(pool.nodes) == 1:
                self._delete_pool(pool.id)
            else:
                owner = pool.owners().get(node_id, "")
                self._call(f"delete node {node_id}", lambda: self._delete_node_call(node_id))
                if owner:
                    ledger = dict(pool.ledger)
                    seq, k = ledger[owner]
                    if k <= 1:
                        del ledger[owner]
                    else:
                        ledger[owner] = (seq, k - 1)
                    self._call(f"update ledger of pool {pool.id}", lambda: self._put_labels(pool, ledger))
            self._forget(node_id)

    def list_nodes(self) -> Sequence[CloudNode]:
        """Every node of every gpuscale pool of the cluster."""
        with self._lock:
            return [node for pool in self._pools() if pool.managed for node in self._cloud_nodes(pool)]

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Events since the last call: nodes seen ``not_ready`` past ``not_ready_deadline_s`` (NODE_FAILED)."""
        with self._lock:
            events, self._events = self._events, []
            return events

    # --- lifecycle helpers beyond the protocol -------------------------------------------------------------------
    def release(self, request_id: str) -> list[str]:
        """Delete every node serving ``request_id`` (whole pools when it is their only request); return node ids."""
        key = tag_key(request_id)
        deleted: list[str] = []
        with self._lock:
            for pool in self._pools():
                if not pool.managed or key not in pool.ledger:
                    continue
                mine = [n for n, owner in pool.owners().items() if owner == key]
                if set(pool.ledger) == {key}:
                    self._delete_pool(pool.id)
                    deleted.extend(n.id for n in pool.nodes)
                    for n in pool.nodes:
                        self._forget(n.id)
                    continue
                for node_id in mine:
                    self.delete_node(node_id)
                    deleted.append(node_id)
        return deleted

    def adopt(self, request_ids: Iterable[str]) -> dict[str, list[CloudNode]]:
        """Nodes per known request id (after a restart): remembers the ids so nodes report them, not their keys."""
        wanted = set(request_ids)
        with self._lock:
            for rid in wanted:
                self._request_ids[tag_key(rid)] = rid
            out: dict[str, list[CloudNode]] = {}
            for node in self.list_nodes():
                if node.request_id in wanted:
                    out.setdefault(node.request_id, []).append(node)
            return out

    def orphans(self, known_request_ids: Iterable[str]) -> list[Orphan]:
        """Nodes of gpuscale pools that serve no request in ``known_request_ids`` (leaked by a crash)."""
        known = {tag_key(r) for r in known_request_ids}
        out: list[Orphan] = []
        with self._lock:
            for pool in self._pools():
                if not pool.managed:
                    continue
                by_owner: dict[str, list[str]] = {}
                for node_id, owner in pool.owners().items():
                    if owner not in known:
                        by_owner.setdefault(owner, []).append(node_id)
                whole = sum(len(v) for v in by_owner.values()) == len(pool.nodes)
                for owner, node_ids in sorted(by_owner.items()):
                    out.append(Orphan(pool.id, pool.name, owner, tuple(sorted(node_ids)), whole))
        return out

    def collect_garbage(self, known_request_ids: Iterable[str]) -> list[Orphan]:
        """Delete what :meth:`orphans` finds (whole pools where possible, else the specific nodes); return it."""
        found = self.orphans(known_request_ids)
        with self._lock:
            done_pools: set[int] = set()
            for orphan in found:
                if orphan.whole_pool:
                    if orphan.pool_id not in done_pools:
                        self._delete_pool(orphan.pool_id)
                        done_pools.add(orphan.pool_id)
                    continue
                for node_id in orphan.node_ids:
                    self.delete_node(node_id)
            if found:
                log.info("linode: garbage-collected %d orphan group(s) in %d pool(s)", len(found), len(done_pools))
        return found

    def recycle_node(self, node_id: str) -> None:
        """Replace the Linode behind a node (LKE ``recycle``); used for nodes stuck ``not_ready``."""
        with self._lock:
            self._call(
                f"recycle node {node_id}",
                lambda: LKECluster(self._client, self.config.cluster_id).node_recycle(node_id),
            )
            self._not_ready_since.pop(node_id, None)
            self._reported_stuck.discard(node_id)

    def recycle_stuck_nodes(self, deadline_s: float | None = None) -> list[str]:
        """Recycle gpuscale nodes seen ``not_ready`` for at least ``deadline_s``; return their ids."""
        deadline = self.config.not_ready_deadline_s if deadline_s is None else deadline_s
        with self._lock:
            now = self.clock.now()
            stuck = [
                n.node_id
                for n in self.list_nodes()
                if n.state is CloudNodeState.NOT_READY and now - self._not_ready_since.get(n.node_id, now) >= deadline
            ]
            for node_id in stuck:
                log.warning("linode: node %s not ready for over %.0fs; recycling it", node_id, deadline)
                self.recycle_node(node_id)
            return stuck

    # --- internals -----------------------------------------------------------------------------------------------
    def _ensure_cluster(self) -> None:
        if self._cluster_checked:
            return
        cluster = self._call("get cluster", lambda: self._client.load(LKECluster, self.config.cluster_id))
        region = getattr(cluster.region, "id", cluster.region)
        if region != self.config.region:
            raise InvalidProviderRequest(
                f"cluster {self.config.cluster_id} is in region {region!r}, not {self.config.region!r}",
                provider=self.name,
                field="region",
            )
        self._cluster_checked = True

    def _launch_once(self, request: LaunchRequest, key: str) -> list[CloudNode]:
        pools = [p for p in self._pools() if p.managed]
        served = [p for p in pools if key in p.ledger]
        if served:
            return [n for p in served for n in self._cloud_nodes(p) if tag_key(n.request_id) == key]
        total = sum(len(p.nodes) for p in pools)
        if total + request.count > self.config.max_nodes:
            raise QuotaExceeded(
                f"maximum node count {self.config.max_nodes} reached ({total} gpuscale nodes, asked for "
                f"{request.count} more)",
                provider=self.name,
            )
        labels = {**request.labels, wk.POOL: request.pool}
        if len(pools) < self.config.max_node_pool_count:
            pool = self._create_pool(request, key, labels)
        else:
            growable = sorted(
                (
                    p
                    for p in pools
                    if p.type == request.instance_type
                    and dict(p.labels) == labels
                    and set(p.taints) == set(request.taints)
                    and p.count + request.count <= MAX_POOL_SIZE
                ),
                key=lambda p: p.id,
            )
            if not growable:
                raise QuotaExceeded(
                    f"MAX_NODE_POOL_COUNT={self.config.max_node_pool_count} gpuscale pools exist and none of type "
                    f"{request.instance_type} with the same labels and taints can grow",
                    provider=self.name,
                )
            pool = self._grow_pool(growable[0], key, request.count)
        return [n for n in self._cloud_nodes(pool) if tag_key(n.request_id) == key]

    def _create_pool(self, request: LaunchRequest, key: str, labels: Mapping[str, str]) -> _Pool:
        tags = [MANAGED_TAG, POOL_TAG_PREFIX + tag_key(request.pool), REQUEST_TAG_PREFIX + key]
        api_labels = {**labels, LEDGER_LABEL_PREFIX + key: f"1.{request.count}"}
        kwargs: dict[str, Any] = {"labels": api_labels, "tags": tags}
        if request.taints:
            kwargs["taints"] = [_taint_to_api(t) for t in request.taints]
        cluster = LKECluster(self._client, self.config.cluster_id)
        created = cluster.node_pool_create(request.instance_type, request.count, **kwargs)
        pool = self._view(created)
        log.info(
            "linode: created pool %s (%s x%d) for request %s", pool.id, pool.type, request.count, request.request_id
        )
        return pool

    def _grow_pool(self, pool: _Pool, key: str, count: int) -> _Pool:
        new_count = pool.count + count
        if new_count <= pool.count:  # the one place a count is written: it only ever goes up
            raise AssertionError("a pool's count is never lowered")
        ledger = {**pool.ledger, key: (next_seq(pool.ledger), count)}
        body = {"count": new_count, "labels": self._labels_with_ledger(pool.labels, ledger)}
        obj = LKENodePool(self._client, pool.id, self.config.cluster_id)
        raw = self._client.put(LKENodePool.api_endpoint, model=obj, data=body)
        grown = self._view(LKENodePool(self._client, pool.id, self.config.cluster_id, raw))
        log.info("linode: grew pool %s from %d to %d nodes for request key %s", pool.id, pool.count, new_count, key)
        return grown

    @staticmethod
    def _labels_with_ledger(labels: Mapping[str, str], ledger: Mapping[str, tuple[int, int]]) -> dict[str, str]:
        return {**labels, **ledger_labels(ledger)}

    def _put_labels(self, pool: _Pool, ledger: Mapping[str, tuple[int, int]]) -> None:
        """Rewrite the ledger. Sends labels only: never ``count`` (lowering it deletes a node LKE chooses)."""
        obj = LKENodePool(self._client, pool.id, self.config.cluster_id)
        self._client.put(
            LKENodePool.api_endpoint, model=obj, data={"labels": self._labels_with_ledger(pool.labels, ledger)}
        )

    def _delete_node_call(self, node_id: str) -> None:
        try:
            LKECluster(self._client, self.config.cluster_id).node_delete(node_id)
        except ApiError as exc:
            if exc.status != 404:
                raise
        log.info("linode: deleted node %s", node_id)

    def _delete_pool(self, pool_id: int) -> None:
        def call() -> None:
            try:
                LKENodePool(self._client, pool_id, self.config.cluster_id).delete()
            except ApiError as exc:
                if exc.status != 404:
                    raise

        self._call(f"delete pool {pool_id}", call)
        log.info("linode: deleted pool %s", pool_id)

    def _forget(self, node_id: str) -> None:
        self._first_seen.pop(node_id, None)
        self._not_ready_since.pop(node_id, None)
        self._reported_stuck.discard(node_id)

    def _pools(self) -> list[_Pool]:
        def call() -> list[_Pool]:
            return [self._view(p) for p in LKECluster(self._client, self.config.cluster_id).pools]

        return self._call("list pools", call)

    @staticmethod
    def _view(obj: Any) -> _Pool:
        raw_labels = getattr(obj.labels, "dict", obj.labels) or {}
        ledger, labels = split_ledger({str(k): str(v) for k, v in dict(raw_labels).items()})
        taints = tuple(
            Taint(key=str(t.key), effect=TaintEffect(str(t.effect)), value=str(t.value or "")) for t in obj.taints or ()
        )
        nodes = tuple(
            _Node(str(n.id), "" if n.instance_id is None else str(n.instance_id), str(n.status))
            for n in obj.nodes or ()
        )
        type_ = getattr(obj.type, "id", obj.type)
        return _Pool(
            id=int(obj.id),
            type=str(type_),
            count=int(obj.count),
            tags=tuple(obj.tags or ()),
            labels=labels,
            ledger=ledger,
            taints=taints,
            nodes=nodes,
        )

    def _cloud_nodes(self, pool: _Pool) -> list[CloudNode]:
        now = self.clock.now()
        owners = pool.owners()
        out: list[CloudNode] = []
        for node in sorted(pool.nodes, key=_Node.order):
            self._first_seen.setdefault(node.id, now)
            state = CloudNodeState.READY if node.status == "ready" else CloudNodeState.NOT_READY
            if state is CloudNodeState.NOT_READY:
                since = self._not_ready_since.setdefault(node.id, now)
                if now - since >= self.config.not_ready_deadline_s and node.id not in self._reported_stuck:
                    self._reported_stuck.add(node.id)
                    self._events.append(
                        ProviderEvent(
                            ProviderEventKind.NODE_FAILED,
                            node_id=node.id,
                            request_id=self._request_ids.get(owners[node.id], owners[node.id]),
                            message=f"node not ready for {now - since:.0f}s",
                            at=now,
                        )
                    )
            else:
                self._not_ready_since.pop(node.id, None)
                self._reported_stuck.discard(node.id)
            owner = owners[node.id]
            out.append(
                CloudNode(
                    node_id=node.id,
                    request_id=self._request_ids.get(owner, owner),
                    pool=pool.name,
                    instance_type=pool.type,
                    zone=self.config.region,
                    capacity_type=CapacityType.ON_DEMAND,
                    state=state,
                    created_at=self._first_seen[node.id],
                    instance_id=node.instance_id,
                    labels=dict(pool.labels),
                )
            )
        return out

    # --- retries and error mapping -------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one API operation once; raise a failure as its mapped :mod:`gpuscale.errors` class, chained to a
        cause the token cannot ride along in. Never retries and never sleeps (the caller's launcher retries)."""
        scrubbed: ProviderError | None = None  # raised outside the handler, so it has no __context__
        try:
            return fn()
        except GpuscaleError as exc:
            if not self._leaks(exc):
                raise
            scrubbed = ProviderError(self._scrub(str(exc))[:300], provider=self.name)
        except ApiError as exc:
            err, cause = self._map_api_error(exc, what), exc
        except requests.exceptions.Timeout as exc:
            err = TransientProviderError(f"linode {what}: timed out", provider=self.name)
            cause = exc
        except requests.exceptions.RequestException as exc:
            err = TransientProviderError(f"linode {what}: connection failed ({type(exc).__name__})", provider=self.name)
            cause = exc
        except Exception as exc:  # anything else from the client library: never let the token ride along
            if not self._leaks(exc):
                raise
            scrubbed = ProviderError(f"linode {what}: {self._scrub(str(exc))[:300]}", provider=self.name)
        if scrubbed is not None:
            raise scrubbed
        log.warning("%s (retry policy %s, left to the caller)", err, err.retry.kind)
        raise err from self._scrubbed_cause(cause)

    def _scrub(self, text: str) -> str:
        return scrub_secrets(text, (str(self._client.token or ""),))

    def _leaks(self, exc: BaseException) -> bool:
        """Whether the token appears in ``exc``, its arguments or anything in its cause/context chain."""
        token = str(self._client.token or "")
        seen: set[int] = set()
        cur: BaseException | None = exc
        while token and cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            if token in str(cur) or any(token in repr(a) for a in cur.args):
                return True
            cur = cur.__cause__ or cur.__context__
        return False

    def _scrubbed_cause(self, exc: BaseException) -> BaseException | None:
        """``exc`` as the ``__cause__`` of a mapped error, or a scrubbed stand-in (with no chain) when the token
        appears anywhere in it: tracebacks logged later then cannot show the token."""
        if not self._leaks(exc):
            return exc
        return ProviderError(f"{type(exc).__name__}: {self._scrub(str(exc))[:300]}", provider=self.name)

    def _map_api_error(self, exc: ApiError, what: str) -> ProviderError:
        status = int(exc.status)
        errors = (exc.json or {}).get("errors") if isinstance(exc.json, dict) else None
        first: dict[str, Any] = errors[0] if errors and isinstance(errors[0], dict) else {}
        reason = self._scrub(str(first.get("reason") or "; ".join(map(str, exc.errors)) or f"HTTP {status}"))
        field_name = first.get("field") or None
        message = f"linode {what}: {reason}"
        if status == 429:
            return RateLimited(message, provider=self.name, retry_after=self._retry_after(exc))
        if status in (401, 403) and not _QUOTA_RE.search(reason):
            return AuthenticationError(f"linode {what}: credentials rejected (HTTP {status})", provider=self.name)
        if status == 404:
            return NotFound(message, provider=self.name, status=404)
        if status == 408 or status >= 500:
            return TransientProviderError(message, provider=self.name, status=status)
        if _QUOTA_RE.search(reason):
            return QuotaExceeded(message, provider=self.name, status=status)
        if _CAPACITY_RE.search(reason):
            return InsufficientCapacity(message, provider=self.name, status=status)
        if status in (400, 422):
            return InvalidProviderRequest(reason, provider=self.name, field=field_name, status=status)
        return ProviderError(message, provider=self.name, status=status)

    def _retry_after(self, exc: ApiError) -> float:
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        raw = headers.get("Retry-After")
        if raw is None:
            return self.config.default_retry_after_s
        try:
            return max(0.0, float(raw))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return self.config.default_retry_after_s
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
