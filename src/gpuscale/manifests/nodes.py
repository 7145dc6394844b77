"""``v1/Node`` -> :class:`gpuscale.core.model.Node`.

Read: ``metadata.name``, ``metadata.labels``, ``spec.taints``, ``spec.unschedulable`` and ``status.allocatable``
(``cpu``, ``memory``, ``nvidia.com/gpu``, ``pods``; falls back to ``status.capacity``). Capacities round down. The
node's pool is its ``gpuscale.io/pool`` label; its $/h comes from the catalog when its instance type (and zone /
capacity type) labels name a known offering.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuscale.core import labels as L
from gpuscale.core.model import InstanceType, Node, Taint
from gpuscale.core.resources import DEFAULT_MAX_PODS, GPU_RESOURCE, Resources
from gpuscale.manifests.fields import as_bool, as_list, as_mapping, as_str, str_map, taint
from gpuscale.manifests.problems import Doc, FieldError
from gpuscale.manifests.quantity import QUANTITY_HELP, cpu_milli, memory_mib, whole_count


def read_node(doc: Doc, obj: dict[str, Any], types: Mapping[str, InstanceType]) -> Node | None:
    """The core Node of a ``v1/Node`` document (``types``: the catalog by name); None if it has problems."""
    meta = spec = status = {}
    try:
        meta = as_mapping(obj.get("metadata"), "metadata")
        spec = as_mapping(obj.get("spec"), "spec")
        status = as_mapping(obj.get("status"), "status")
    except FieldError as err:
        doc.report(err)
    name = ""
    with doc.field():
        name = as_str(meta.get("name"), "metadata.name", required=True)
    doc.name = name
    labels: dict[str, str] = {}
    with doc.field():
        labels = str_map(meta.get("labels"), "metadata.labels")
    taints: list[Taint] = []
    with doc.field():
        for i, raw in enumerate(as_list(spec.get("taints"), "spec.taints")):
            t = taint(doc, raw, f"spec.taints[{i}]")
            if t is not None:
                taints.append(t)
    unschedulable = False
    with doc.field():
        if spec.get("unschedulable") is not None:
            unschedulable = as_bool(spec.get("unschedulable"), "spec.unschedulable")
    allocatable = _allocatable(doc, status)
    if doc.failed or allocatable is None:
        return None
    return Node(
        name=name,
        allocatable=allocatable,
        labels=labels,
        taints=tuple(taints),
        unschedulable=unschedulable,
        pool=labels.get(L.POOL),
        hourly_cost=_hourly_cost(labels, types),
    )


def _allocatable(doc: Doc, status: dict[str, Any]) -> Resources | None:
    key = "allocatable" if status.get("allocatable") is not None else "capacity"
    path = f"status.{key}"
    try:
        alloc = as_mapping(status.get(key), path)
    except FieldError as err:
        doc.report(err)
        return None
    if not alloc:
        doc.error("status.allocatable", "is required", fix="give at least cpu and memory (e.g. cpu: 8, memory: 32Gi)")
        return None
    values = {"cpu": 0, "memory": 0, GPU_RESOURCE: 0, "pods": DEFAULT_MAX_PODS}
    readers = {
        "cpu": lambda v: cpu_milli(v, round_up=False),
        "memory": lambda v: memory_mib(v, round_up=False),
        GPU_RESOURCE: whole_count,
        "pods": whole_count,
    }
    for res, read in readers.items():
        if res in alloc:
            with doc.field():
                try:
                    values[res] = read(alloc[res])
                except ValueError as exc:
                    raise FieldError(f"{path}.{res}", str(exc), alloc[res], fix=QUANTITY_HELP) from None
    for res in ("cpu", "memory"):
        if res not in alloc:
            doc.error(f"{path}.{res}", "is required", fix=f"add {res} to {path}")
    if doc.failed:
        return None
    return Resources(
        cpu_milli=values["cpu"], memory_mib=values["memory"], gpus=values[GPU_RESOURCE], pods=values["pods"]
    )


def _hourly_cost(labels: dict[str, str], types: Mapping[str, InstanceType]) -> float:
    """$/h of the node's offering per the catalog: exact zone and capacity type if labelled, else the cheapest."""
    itype = types.get(labels.get(L.INSTANCE_TYPE, ""))
    if itype is None or not itype.offerings:
        return 0.0
    zone, cap = labels.get(L.ZONE), labels.get(L.CAPACITY_TYPE)
    matching = [
        o for o in itype.offerings if (zone is None or o.zone == zone) and (cap is None or str(o.capacity_type) == cap)
    ]
    pool = matching or list(itype.offerings)
    return min(o.hourly_price for o in pool)
