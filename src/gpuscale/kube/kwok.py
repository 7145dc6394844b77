"""``--provider kwok``: nodes are Node objects created directly in the API server, as kwok's fake nodes.

Each launched node is a Node named ``kwok-<pool>-<request id hash>-<i>`` with the launch's labels (the pool's
template: well-known, ``gpuscale.io/pool``, GPU Feature Discovery), ``gpuscale.io/request-id``, kwok's label
``type: kwok``, annotation ``kwok.x-k8s.io/node: fake`` and taint ``kwok.x-k8s.io/node=fake:NoSchedule`` (pods,
and pools, tolerate or declare it), ``spec.providerID`` ``kwok://<name>``, and allocatable CPU and memory from the
catalog. Allocatable ``nvidia.com/gpu`` starts at 0 and is set from the catalog ``device_plugin_delay_s`` after
creation (the device plugin starting), on the first ``list_nodes`` after that time. In a cluster running kwok this is a
full scale test with no cloud account. Launches are idempotent by request id: node names derive from it, so a repeated
launch meets 409 AlreadyExists and returns the nodes labelled with it. ``max_nodes`` and ``unavailable_types`` stand in
for a quota and for exhausted capacity.

A launch returns at once, as a cloud's create call does: the Node creates are issued on the client's loop, at most
``KwokConfig.parallel_creates`` at a time, so the nodes of one round are created concurrently rather than one HTTP
round trip after another. The returned nodes are ``provisioning``; a create the API server refuses (other than 409)
is reported by ``poll_errors`` as a ``launch-failed`` event for its request id. Every other call (``list_nodes``,
``delete_node``, a quota check) first waits for the creates in flight, so reads never miss a node just launched.
The Node records the pods it was launched for in the ``gpuscale.io/launched-for`` annotation (cut to 1 KiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from lightkube.resources.core_v1 import Node as KNode
from lightkube.types import PatchType

from gpuscale.clock import Clock, SystemClock
from gpuscale.core import labels as L
from gpuscale.core.model import CapacityType, Catalog
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL
from gpuscale.core.resources import GPU_RESOURCE
from gpuscale.errors import InsufficientCapacity, InvalidProviderRequest, QuotaExceeded, TransientProviderError
from gpuscale.kube.cache import KubeCache, raw
from gpuscale.kube.cache import Node as GenericNode
from gpuscale.kube.client import KubeClient, KubeError, as_kube_error
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    ProviderCapabilities,
    ProviderEvent,
    ProviderEventKind,
)

__all__ = ["KWOK_ANNOTATION", "KWOK_TAINT", "KwokConfig", "KwokProvider"]

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
PROVIDER_LABEL = "gpuscale.io/provider-kind"
CREATED_ANNOTATION = "gpuscale.io/created-at"
LAUNCHED_FOR_ANNOTATION = "gpuscale.io/launched-for"
"""Comma-separated ``namespace/name`` of the pending pods a node was launched for (cut to 1 KiB)."""


@dataclass(slots=True)
class KwokConfig:
    """Knobs of the kwok provider (times in seconds of the injected clock)."""

    device_plugin_delay_s: float = 0.0
    max_nodes: int | None = None
    """Quota: launches past this many kwok nodes raise QuotaExceeded."""
    unavailable_types: set[str] = field(default_factory=set)
    """Instance types with no capacity (InsufficientCapacity), to exercise fallbacks."""
    taint: bool = True
    """Add kwok's ``kwok.x-k8s.io/node=fake:NoSchedule`` taint."""
    parallel_creates: int = 16
    """At most this many Node creates in flight at once."""
    settle_timeout_s: float = 30.0
    """How long a read waits for the creates in flight."""


class KwokProvider:
    """A :class:`~gpuscale.providers.base.Provider` whose nodes are kwok Node objects."""

    name = "kwok"

    def __init__(
        self,
        client: KubeClient,
        catalog: Catalog,
        clock: Clock | None = None,
        config: KwokConfig | None = None,
        *,
        cache: KubeCache | None = None,
    ) -> None:
        self.client = client
        self.cache = cache
        """When given, ``list_nodes`` reads the watched Nodes instead of listing them from the API server."""
        self.catalog = catalog
        self.clock = clock or SystemClock()
        self.config = config or KwokConfig()
        self._types = catalog.by_name()
        self._events: list[ProviderEvent] = []
        self._inflight: dict[str, tuple[Future[Any], CloudNode]] = {}
        """Node name -> (its create on the client's loop, the node as returned by ``launch``)."""
        self._gate: asyncio.Semaphore | None = None

    @property
    def capabilities(self) -> ProviderCapabilities:
        zones = sorted({o.zone for it in self.catalog.instance_types for o in it.offerings})
        return ProviderCapabilities(spot=True, delete_specific_node=True, zones=tuple(zones), max_nodes_per_launch=100)

    # ------------------------------------------------------------------ API calls
    def _list(self, selector: str) -> list[dict[str, object]]:
        async def go() -> list[dict[str, object]]:
            return [raw(n) async for n in self.client.api.list(GenericNode, labels=_labels(selector))]

        try:
            return self.client.run(go(), verb="list", resource="nodes")
        except KubeError as exc:
            raise TransientProviderError(exc.describe(), provider=self.name, status=exc.status or None) from exc

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        itype = self._types.get(request.instance_type)
        if itype is None:
            raise InvalidProviderRequest(
                f"unknown instance type {request.instance_type!r}", provider=self.name, field="instance_type"
            )
        if request.instance_type in self.config.unavailable_types or self.config.max_nodes is not None:
            self.settle()
        if request.instance_type in self.config.unavailable_types:
            made = self._list(f"{REQUEST_ID_LABEL}={request.request_id}")
            if made:  # launched before the capacity ran out: the same nodes again
                return [self._cloud(n) for n in made]
            raise InsufficientCapacity(f"no capacity for {request.instance_type} in {request.zone}", provider=self.name)
        if self.config.max_nodes is not None:
            listed = self._list(f"{PROVIDER_LABEL}=kwok")
            mine = [n for n in listed if _request_id(n) == request.request_id]
            if mine:
                return [self._cloud(n) for n in mine]
            if len(listed) + request.count > self.config.max_nodes:
                raise QuotaExceeded(f"kwok node quota {self.config.max_nodes} reached", provider=self.name)
        digest = hashlib.sha256(request.request_id.encode()).hexdigest()[:8]
        out = []
        for i in range(request.count):
            name = f"kwok-{request.pool}-{digest}-{i}"[:63]
            labels = {
                L.INSTANCE_TYPE: itype.name,
                L.ZONE: request.zone,
                L.ARCH: itype.arch,
                L.OS: "linux",
                L.CAPACITY_TYPE: str(request.capacity_type),
                L.POOL: request.pool,
                **dict(request.labels),
                L.HOSTNAME: name,
                REQUEST_ID_LABEL: request.request_id,
                PROVIDER_LABEL: "kwok",
                "type": "kwok",
            }
            if itype.gpu_count and itype.gpu_model:
                labels.setdefault(L.GPU_PRODUCT, itype.gpu_model)
                labels.setdefault(L.GPU_COUNT, str(itype.gpu_count))
                labels.setdefault("nvidia.com/gpu.present", "true")
            taints = [{"key": t.key, "value": t.value, "effect": str(t.effect)} for t in request.taints]
            if self.config.taint:
                taints.append(dict(KWOK_TAINT))
            gpus = itype.gpu_count if self.config.device_plugin_delay_s <= 0 else 0
            alloc = {"cpu": str(itype.vcpus), "memory": f"{itype.memory_mib}Mi", "pods": "110", GPU_RESOURCE: str(gpus)}
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {
                        KWOK_ANNOTATION: "fake",
                        CREATED_ANNOTATION: repr(self.clock.now()),
                        "node.alpha.kubernetes.io/ttl": "0",
                        **({LAUNCHED_FOR_ANNOTATION: _cut(",".join(request.pods))} if request.pods else {}),
                    },
                },
                "spec": {"providerID": f"kwok://{name}", "taints": taints},
                "status": {
                    "allocatable": alloc,
                    "capacity": {**alloc, GPU_RESOURCE: str(itype.gpu_count)},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                },
            }
            out.append(self._submit(name, body))
        return out

    def _submit(self, name: str, body: dict[str, Any]) -> CloudNode:
        """Start the create of Node ``name`` (unless it is in flight or cached) and return it as launched."""
        if name in self._inflight:
            return self._inflight[name][1]
        cached = self.cache.get("nodes", name) if self.cache is not None and self.cache.healthy else None
        if cached is not None:  # created by an earlier attempt with the same request id
            return self._cloud(cached)
        node = replace(self._cloud(body), state=CloudNodeState.PROVISIONING)
        self._inflight[name] = (self.client.spawn(self._create(body)), node)
        return node

    async def _create(self, body: dict[str, Any]) -> None:
        if self._gate is None:  # made on the client's loop, where it is used
            self._gate = asyncio.Semaphore(max(1, self.config.parallel_creates))
        async with self._gate:
            await self.client.api.create(GenericNode.from_dict(body))

    def settle(self) -> None:
        """Wait for the Node creates in flight; a refused one (other than 409 AlreadyExists: made by an earlier
        attempt) becomes a ``launch-failed`` event for ``poll_errors``."""
        inflight, self._inflight = self._inflight, {}
        for name, (fut, node) in inflight.items():
            try:
                fut.result(self.config.settle_timeout_s)
            except Exception as exc:
                err = as_kube_error(exc, "create", "nodes")
                if err.status == 409:
                    continue
                self._events.append(
                    ProviderEvent(
                        ProviderEventKind.LAUNCH_FAILED,
                        node_id=name,
                        request_id=node.request_id,
                        message=f"kwok node {name}: {err.describe()}",
                        at=self.clock.now(),
                    )
                )

    def delete_node(self, node_id: str) -> None:
        self.settle()
        try:
            self.client.run(self.client.api.delete(KNode, node_id), verb="delete", resource="nodes")
        except KubeError as exc:
            if exc.status != 404:
                raise TransientProviderError(exc.describe(), provider=self.name, status=exc.status or None) from exc

    def list_nodes(self) -> Sequence[CloudNode]:
        self.settle()
        if self.cache is not None and self.cache.healthy:
            nodes = [
                n
                for n in self.cache.objects("nodes")
                if (n["metadata"].get("labels") or {}).get(PROVIDER_LABEL) == "kwok"
            ]
        else:
            nodes = self._list(f"{PROVIDER_LABEL}=kwok")
        now = self.clock.now()
        for n in nodes:
            self._maybe_init_gpus(n, now)
        return [self._cloud(n) for n in nodes]

    def poll_errors(self) -> Sequence[ProviderEvent]:
        self.settle()
        events, self._events = self._events, []
        return events

    def interrupt(self, node_name: str, notice_s: float = 120.0) -> None:
        """Announce a spot interruption of ``node_name`` (as a cloud's two-minute notice), for scale tests."""
        now = self.clock.now()
        self._events.append(
            ProviderEvent(
                ProviderEventKind.SPOT_INTERRUPTION, node_id=node_name, message="kwok", at=now, deadline=now + notice_s
            )
        )

    # ------------------------------------------------------------------ helpers
    def _maybe_init_gpus(self, n: dict[str, object], now: float) -> None:
        """Set allocatable GPUs once the device-plugin delay has passed (a status subresource patch)."""
        meta = n.get("metadata") or {}
        status = n.get("status") or {}
        assert isinstance(meta, dict) and isinstance(status, dict)
        cap = (status.get("capacity") or {}).get(GPU_RESOURCE, "0")
        alloc = (status.get("allocatable") or {}).get(GPU_RESOURCE, "0")
        if str(cap) == str(alloc) or meta.get("deletionTimestamp"):
            return
        created = float((meta.get("annotations") or {}).get(CREATED_ANNOTATION, "0") or 0)
        if now < created + self.config.device_plugin_delay_s:
            return
        patch = {"status": {"allocatable": {GPU_RESOURCE: str(cap)}}}
        with contextlib.suppress(KubeError):  # tried again on the next list
            self.client.run(
                self.client.api.patch(KNode.Status, str(meta["name"]), patch, patch_type=PatchType.MERGE),
                verb="patch",
                resource="nodes/status",
            )

    def _cloud(self, n: dict[str, object]) -> CloudNode:
        meta = n.get("metadata") or {}
        assert isinstance(meta, dict)
        labels = dict(meta.get("labels") or {})
        created = float((meta.get("annotations") or {}).get(CREATED_ANNOTATION, "0") or 0)
        ct = labels.get(L.CAPACITY_TYPE, "on-demand")
        return CloudNode(
            node_id=str(meta["name"]),
            request_id=labels.get(REQUEST_ID_LABEL, ""),
            pool=labels.get(L.POOL, ""),
            instance_type=labels.get(L.INSTANCE_TYPE, ""),
            zone=labels.get(L.ZONE, ""),
            capacity_type=CapacityType(ct) if ct in ("spot", "on-demand") else CapacityType.ON_DEMAND,
            state=CloudNodeState.DELETING if meta.get("deletionTimestamp") else CloudNodeState.READY,
            created_at=created,
            node_name=str(meta["name"]),
            instance_id=f"kwok://{meta['name']}",
            labels=labels,
        )


def _request_id(n: dict[str, object]) -> str:
    meta = n.get("metadata") or {}
    labels = meta.get("labels") or {} if isinstance(meta, dict) else {}
    return str(labels.get(REQUEST_ID_LABEL, "")) if isinstance(labels, dict) else ""


def _cut(text: str, limit: int = 1024) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(",", 0, limit)
    return text[:cut] if cut > 0 else text[:limit]


def _labels(selector: str) -> dict[str, str]:
    key, value = selector.split("=", 1)
    return {key: value}
