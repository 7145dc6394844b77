"""The watch cache's record of a Pod: only the fields gpuscale reads, in the API's shape, with common parts shared.

The cache holds every pod of the cluster, and the decoded JSON of a pod is mostly fields nothing here reads (images,
commands, env, probes, volumes, container statuses, timestamps). :func:`compact_pod` keeps what the cache's readers
use, at the same paths, so they read a record as they read the object:

* the snapshot (:func:`~gpuscale.manifests.pods.read_pod`): name, namespace, labels, annotations, owner kinds,
  the containers' and init containers' resources (and a sidecar's ``restartPolicy``), pod ``resources`` and
  ``overhead``, node selector, affinity, tolerations, priority, ``nodeName``, ``schedulingGates``, ``phase``;
* the backend (pending, nominated) and the scalers (ready counts): ``status.conditions`` (type, status, reason),
  ``status.nominatedNodeName``, ``metadata.deletionTimestamp``;
* Events (``uid``) and the cache itself (``resourceVersion``).

Parts many pods have in common (a workload's containers, tolerations, affinity, labels, owner, status) are stored
once and shared between records; cached objects are read-only, so sharing is safe.
"""

from __future__ import annotations

import json
import sys
import weakref
from typing import Any

__all__ = ["SharedParts", "compact_pod"]

Obj = dict[str, Any]

_METADATA = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
_METADATA_SHARED = ("labels", "annotations")
_SPEC_SHARED = ("nodeSelector", "affinity", "tolerations", "schedulingGates", "resources", "overhead")
_CONTAINER = ("name", "resources", "restartPolicy")
_OWNER = ("apiVersion", "kind", "name", "uid", "controller")
_CONDITION = ("type", "status", "reason")


class _Dict(dict[str, Any]):
    """A shared mapping part (a dict that can be weakly referenced)."""

    __slots__ = ("__weakref__",)


class _List(list[Any]):
    """A shared list part (a list that can be weakly referenced)."""

    __slots__ = ("__weakref__",)


class SharedParts:
    """Equal parts stored once. A part is found by the hash of its JSON text and checked equal before it is shared,
    and the table holds parts weakly: a part no cached record uses any more is gone from it, so pods that come and
    go leave nothing behind."""

    def __init__(self) -> None:
        self._table: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._table)

    def __call__(self, value: Any) -> Any:
        if not value or not isinstance(value, dict | list):
            return value
        try:
            key = hash(json.dumps(value, separators=(",", ":")))
        except (TypeError, ValueError):  # not JSON (never from the API server): kept as it is
            return value
        got = self._table.get(key)
        if got is not None and got == value:
            return got
        part = _Dict(value) if isinstance(value, dict) else _List(value)
        self._table[key] = part
        return part


_SHARED = SharedParts()


def _pick(obj: Any, keys: tuple[str, ...]) -> Obj:
    if not isinstance(obj, dict):
        return {}
    return {k: obj[k] for k in keys if obj.get(k) is not None}


def _containers(value: Any) -> Any:
    if not isinstance(value, list):
        return value  # a malformed value is kept, for the reader to report
    return [_pick(c, _CONTAINER) if isinstance(c, dict) else c for c in value]


def compact_pod(obj: Obj, shared: SharedParts = _SHARED) -> Obj:
    """The record of the decoded Pod ``obj`` (see the module docstring); a section that is not a mapping is kept as
    it is, so that readers report it as for the full object."""
    out: Obj = {}
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        m = _pick(meta, _METADATA)
        for k in ("namespace",):
            if isinstance(m.get(k), str):
                m[k] = sys.intern(m[k])
        for k in _METADATA_SHARED:
            if meta.get(k) is not None:
                m[k] = shared(meta[k])
        owners = meta.get("ownerReferences")
        if owners is not None:
            m["ownerReferences"] = shared(
                [_pick(o, _OWNER) if isinstance(o, dict) else o for o in owners] if isinstance(owners, list) else owners
            )
        out["metadata"] = m
    elif meta is not None:
        out["metadata"] = meta
    spec = obj.get("spec")
    if isinstance(spec, dict):
        s: Obj = {}
        if isinstance(spec.get("nodeName"), str):
            s["nodeName"] = sys.intern(spec["nodeName"])
        elif spec.get("nodeName") is not None:
            s["nodeName"] = spec["nodeName"]
        if spec.get("priority") is not None:
            s["priority"] = spec["priority"]
        for k in ("containers", "initContainers"):
            if spec.get(k) is not None:
                s[k] = shared(_containers(spec[k]))
        for k in _SPEC_SHARED:
            if spec.get(k) is not None:
                s[k] = shared(spec[k])
        out["spec"] = s
    elif spec is not None:
        out["spec"] = spec
    status = obj.get("status")
    if isinstance(status, dict):
        st = _pick(status, ("phase", "nominatedNodeName"))
        conditions = status.get("conditions")
        if conditions is not None:
            st["conditions"] = (
                [_pick(c, _CONDITION) if isinstance(c, dict) else c for c in conditions]
                if isinstance(conditions, list)
                else conditions
            )
        out["status"] = shared(st)
    elif status is not None:
        out["status"] = status
    return out
