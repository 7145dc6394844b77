"""The :class:`~gpuscale.controller.backend.ClusterBackend` on a live cluster, read from the :class:`KubeCache`.

Reads are views of the cache rebuilt only when it changed. Pending pods are those the scheduler gave up on
(``PodScheduled=False``, reason ``Unschedulable``); a pod not yet judged by the scheduler is left alone, and a pod
nominated to a node that exists is counted on that node (so a node in flight is never paid for twice). Writes:

* ``cordon``: a JSON merge patch setting ``spec.unschedulable`` and adding the ``gpuscale.io/disrupted:NoSchedule``
  taint, guarded by the node's resourceVersion (a 409 conflict retries once on a fresh read);
* ``uncordon``: the reverse patch, only on a node carrying that taint (one a person cordoned is left alone);
* ``evict``: the Eviction subresource; 429 (a PodDisruptionBudget forbids it now) returns False and the controller
  asks again in a later round (nothing here sleeps);
* ``delete_node``: DELETE of the Node (already gone is fine);
* ``record``: Kubernetes Events via :class:`~gpuscale.kube.events.EventRecorder`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node as KNode
from lightkube.resources.core_v1 import Pod as KPod
from lightkube.types import PatchType

from gpuscale.controller.backend import Event
from gpuscale.core.disruption import PodDisruptionBudget
from gpuscale.core.headroom import HeadroomSpec
from gpuscale.core.model import Catalog, Node, NodePool, Pod, Taint
from gpuscale.core.predicates import untolerated
from gpuscale.core.resources import Resources
from gpuscale.errors import InputError
from gpuscale.kube.cache import KubeCache, obj_key
from gpuscale.kube.client import KubeClient, KubeError
from gpuscale.kube.events import EventRecorder
from gpuscale.kube.policy import pool_headroom, without_headroom
from gpuscale.manifests.nodes import read_node
from gpuscale.manifests.pods import read_pod
from gpuscale.manifests.pools import read_pool
from gpuscale.manifests.problems import Doc, Notes

__all__ = ["DISRUPTED_TAINT", "KubeBackend", "is_pending"]

log = logging.getLogger(__name__)

DISRUPTED_TAINT = "gpuscale.io/disrupted"
"""Taint (NoSchedule) put on a node gpuscale drains."""

Obj = dict[str, Any]


def is_pending(obj: Obj) -> bool:
    """The scheduler found no node for this unbound pod: ``PodScheduled=False`` with reason ``Unschedulable``."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return bool(cond.get("status") == "False" and cond.get("reason") == "Unschedulable")
    return False


@dataclass(frozen=True, slots=True)
class _PodView:
    """A cached pod as the core sees it, with what decides whether it is pending or counted on a nominated node."""

    pod: Pod | None
    nominated: str | None = None
    pending: bool = False


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _doc(kind: str) -> Doc:
    return Doc(source="cluster", index=1, line=None, problems=[], kind=kind)


class KubeBackend:
    """The cluster as the controller sees it, through the cache; writes go through ``client``."""

    def __init__(self, client: KubeClient, cache: KubeCache, catalog: Catalog, *, events: EventRecorder | None = None):
        self.client = client
        self.cache = cache
        self.catalog = catalog
        self._types = catalog.by_name()
        self.events = events or EventRecorder(client, cache)
        self._pods: tuple[object, tuple[Pod, ...]] = (None, ())
        self._nodes: tuple[object, tuple[Node, ...]] = (None, ())
        self._pdbs: tuple[object, tuple[PodDisruptionBudget, ...]] = (None, ())
        self._pod_memo: dict[int, tuple[Obj, _PodView]] = {}
        """Converted pods by the identity of the cached object they were read from (the cache stores a new object on
        every change, so only changed pods are read again, and a round over 10,000 pods does no per-pod key work)."""
        self._node_memo: dict[str, tuple[str, Node | None]] = {}
        """Converted nodes by key with the resourceVersion they were converted at: only changed ones are read."""
        self._bad: set[str] = set()
        self.pool_headroom: dict[str, HeadroomSpec] = {}
        """``spec.headroom`` of the pools :meth:`node_pools` last read, by pool name."""

    # ------------------------------------------------------------------ reads
    def list_nodes(self) -> Sequence[Node]:
        version = self.cache.versions["nodes"]
        if self._nodes[0] != version:
            memo: dict[str, tuple[str, Node | None]] = {}
            out = []
            for obj in self.cache.objects("nodes"):
                key, rv = obj_key(obj), _rv(obj)
                hit = self._node_memo.get(key)
                if hit is None or hit[0] != rv:
                    hit = (rv, read_node(_doc("Node"), obj, self._types))
                    if hit[1] is None:
                        self._warn("Node", obj)
                memo[key] = hit
                if hit[1] is not None:
                    out.append(hit[1])
            self._node_memo = memo
            self._nodes = (version, tuple(out))
        return self._nodes[1]

    def list_pods(self) -> Sequence[Pod]:
        version = (self.cache.versions["pods"], self.cache.versions["nodes"])
        if self._pods[0] != version:
            nodes = {n.name for n in self.list_nodes()}
            memo: dict[int, tuple[Obj, _PodView]] = {}
            out = []
            for obj in self.cache.objects("pods"):
                hit = self._pod_memo.get(id(obj))
                if hit is None or hit[0] is not obj:
                    hit = (obj, self._pod_view(obj))
                memo[id(obj)] = hit
                view = hit[1]
                if view.pod is None:
                    continue
                if view.pod.node_name is None:
                    if view.nominated and view.nominated in nodes:
                        out.append(replace(view.pod, node_name=view.nominated))  # counted where it will run
                        continue
                    if not view.pending:
                        continue  # the scheduler has not given up on it (yet)
                out.append(view.pod)
            self._pod_memo = memo
            self._pods = (version, tuple(out))
        return self._pods[1]

    def _pod_view(self, obj: Obj) -> _PodView:
        status = obj.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return _PodView(None)
        notes = Notes()
        pod = read_pod(_doc("Pod"), obj, notes)
        if pod is None and not notes.counts:
            self._warn("Pod", obj)
        return _PodView(pod, status.get("nominatedNodeName") or None, is_pending(obj))

    def list_pdbs(self) -> Sequence[PodDisruptionBudget]:
        version = (self.cache.versions["poddisruptionbudgets"], self.cache.versions["pods"])
        if self._pdbs[0] != version:
            pods = self.cache.objects("pods")
            out = []
            for obj in self.cache.objects("poddisruptionbudgets"):
                pdb = _pdb(obj, pods)
                if pdb is not None:
                    out.append(pdb)
            self._pdbs = (version, tuple(out))
        return self._pdbs[1]

    def gpu_utilization(self) -> Mapping[str, float]:
        """No measurement source is wired to the cluster adapter yet."""
        return {}

    def node_pools(self, catalog: Catalog | None = None) -> list[NodePool]:
        """The GPUNodePool objects of the cluster, with DaemonSet overhead added where the pool sets none. Each
        pool's ``spec.headroom`` is read too (:mod:`gpuscale.kube.policy`), into :attr:`pool_headroom`; a pool whose
        headroom is invalid is skipped like any unreadable pool."""
        catalog = catalog or self.catalog
        types = catalog.by_name()
        zones = frozenset(o.zone for it in catalog.instance_types for o in it.offerings)
        pools = []
        headroom: dict[str, HeadroomSpec] = {}
        for obj in self.cache.objects("gpunodepools"):
            doc = _doc("GPUNodePool")
            pool = read_pool(doc, dict(without_headroom(obj)), types, zones)
            if pool is None:
                for p in doc.problems:
                    log.warning("GPUNodePool skipped: %s", p)
                continue
            try:
                spec = pool_headroom(obj)
            except InputError as exc:
                log.warning("GPUNodePool skipped: %s", exc)
                continue
            if spec is not None:
                headroom[pool.name] = spec
            overhead = daemonset_overhead(self.cache.objects("daemonsets"), pool)
            if overhead is not None and not (pool.daemonset_overhead.cpu_milli or pool.daemonset_overhead.memory_mib):
                pool = replace(pool, daemonset_overhead=overhead)
            pools.append(pool)
        self.pool_headroom = headroom
        return pools

    def _warn(self, kind: str, obj: Obj) -> None:
        key = f"{kind}/{(obj.get('metadata') or {}).get('name')}"
        if key not in self._bad:
            self._bad.add(key)
            log.warning("%s skipped: it cannot be read", key)

    # ------------------------------------------------------------------ writes
    def cordon(self, node_name: str) -> None:
        def patch(obj: Obj) -> Obj:
            taints = list((obj.get("spec") or {}).get("taints") or [])
            if not any(t.get("key") == DISRUPTED_TAINT for t in taints):
                taints.append({"key": DISRUPTED_TAINT, "effect": "NoSchedule"})
            return {"spec": {"unschedulable": True, "taints": taints}}

        self._patch_node(node_name, "cordon", patch)

    def uncordon(self, node_name: str) -> None:
        """Undo :meth:`cordon`: a merge patch setting ``spec.unschedulable`` false and removing the
        ``gpuscale.io/disrupted`` taint. Only a node carrying that taint is patched (a node a person cordoned is
        left alone, and a second call sends nothing)."""

        def patch(obj: Obj) -> Obj | None:
            taints = (obj.get("spec") or {}).get("taints") or []
            kept = [t for t in taints if t.get("key") != DISRUPTED_TAINT]
            if len(kept) == len(taints):  # not cordoned by gpuscale
                return None
            return {"spec": {"unschedulable": False, "taints": kept}}

        self._patch_node(node_name, "uncordon", patch)

    def update_node(
        self,
        node_name: str,
        labels: Mapping[str, str | None],
        taints: Sequence[Taint] = (),
        untaint: Sequence[str] = (),
    ) -> None:
        """Merge-patch the Node's labels (None removes one) and its taints (those keyed in ``untaint`` removed,
        ``taints`` added), guarded by its resourceVersion; a conflict is retried once on a fresh read."""

        def patch(obj: Obj) -> Obj:
            current = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") not in untaint]
            for t in taints:
                if not any(c.get("key") == t.key and c.get("effect") == str(t.effect) for c in current):
                    current.append({"key": t.key, "effect": str(t.effect), **({"value": t.value} if t.value else {})})
            return {"metadata": {"labels": dict(labels)}, "spec": {"taints": current}}

        self._patch_node(node_name, "update node", patch)

    def _patch_node(self, node_name: str, what: str, build: Callable[[Obj], Obj | None]) -> None:
        """Merge-patch a Node with ``build(node)`` guarded by its resourceVersion: the cached object first, and on a
        conflict once more on a fresh read; a Node that is gone (or for which ``build`` returns None) is left alone,
        other failures are logged."""
        for attempt in range(2):
            obj = self.cache.get("nodes", node_name) if attempt == 0 else self._fetch_node(node_name)
            if obj is None:
                return
            patch = build(obj)
            if patch is None:
                return
            patch["metadata"] = {**patch.get("metadata", {}), "resourceVersion": obj["metadata"].get("resourceVersion")}
            try:
                self.client.run(
                    self.client.api.patch(KNode, node_name, patch, patch_type=PatchType.MERGE),
                    verb="patch",
                    resource="nodes",
                )
                return
            except KubeError as exc:
                if exc.status == 404:
                    return
                if exc.status != 409 or attempt == 1:
                    log.warning("%s %s: %s", what, node_name, exc.describe())
                    return

    def _fetch_node(self, name: str) -> Obj | None:
        try:
            got = self.client.run(self.client.api.get(KNode, name), verb="get", resource="nodes")
        except KubeError:
            return None
        out: Obj = got.to_dict()
        return out

    def evict(self, pod_key: str) -> bool:
        namespace, name = pod_key.split("/", 1)
        eviction = KPod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        try:
            self.client.run(
                self.client.api.create(eviction, name=name, namespace=namespace),
                verb="create",
                resource="pods/eviction",
            )
        except KubeError as exc:
            if exc.status == 404:
                return True  # already gone
            if exc.status != 429:
                log.warning("evict %s: %s", pod_key, exc.describe())
            return False
        return True

    def delete_node(self, node_name: str) -> None:
        try:
            self.client.run(self.client.api.delete(KNode, node_name), verb="delete", resource="nodes")
        except KubeError as exc:
            if exc.status != 404:
                log.warning("delete node %s: %s", node_name, exc.describe())

    def record(self, event: Event) -> None:
        self.events.record(event)


def _pdb(obj: Obj, pods: list[Obj]) -> PodDisruptionBudget | None:
    """The core PDB: ``max_unavailable`` is how many selected pods may be down at once."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    if (spec.get("selector") or {}).get("matchExpressions"):
        log.warning("PDB %s/%s: matchExpressions are not read", meta.get("namespace"), meta.get("name"))
    ns = meta.get("namespace") or "default"
    selected = [
        p
        for p in pods
        if (p.get("metadata") or {}).get("namespace") == ns
        and all(((p.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in selector.items())
        and ((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
    ]
    n = len(selected)
    if spec.get("maxUnavailable") is not None:
        allowed = _count(spec["maxUnavailable"], n)
    elif spec.get("minAvailable") is not None:
        allowed = n - _count(spec["minAvailable"], n)
    else:
        allowed = n
    return PodDisruptionBudget(
        name=meta.get("name", ""), namespace=ns, selector=dict(selector), max_unavailable=max(0, allowed)
    )


def _count(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return -(-total * int(value[:-1]) // 100)
    return int(value)


def daemonset_overhead(daemonsets: list[Obj], pool: NodePool) -> Resources | None:
    """Summed requests of the DaemonSets whose pods would run on the pool's nodes (None if there are none)."""
    total: Resources | None = None
    for ds in daemonsets:
        template = ((ds.get("spec") or {}).get("template")) or {}
        pod_obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ds", **(template.get("metadata") or {})}}
        pod_obj["spec"] = template.get("spec") or {}
        pod = read_pod(_doc("DaemonSet"), pod_obj, Notes())
        if pod is None:
            continue
        if any(pool.labels.get(k) != v for k, v in pod.node_selector.items() if not k.startswith("kubernetes.io/")):
            continue
        if untolerated(pod.tolerations, pool.taints):
            continue
        req = Resources(cpu_milli=pod.request.cpu_milli, memory_mib=pod.request.memory_mib, pods=1)
        total = req if total is None else total + req
    return total
