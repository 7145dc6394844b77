"""``gpuscale.io/v1alpha1`` ``GPUProvisioningRequest`` in a snapshot: which GPRs hold nodes, and their workloads.

Only what the planner needs is read: ``status.gprId`` and ``status.provisioningStatus`` (as ``gpuscale controller``
writes them) and ``spec.workloadSelector`` (``{matchLabels: {...}}`` or a bare label map). A GPR that is
``Provisioning`` or ``Provisioned`` holds its nodes (labelled ``gpuscale.io/gpr=<gprId>``): they take only pods
whose labels match its selector (an empty selector matches no pod). The rest of the spec is the GPR server's and
the controller's to validate; a GPR not admitted yet (no ``status.gprId``) or in another state holds no node and is
skipped.
"""

from __future__ import annotations

from typing import Any

from gpuscale.core.gpr.lifecycle import GprState
from gpuscale.manifests.fields import as_mapping, as_str, check_fields, metadata_and_spec, str_map
from gpuscale.manifests.pools import TOP_FIELDS
from gpuscale.manifests.problems import Doc

HOLDING = frozenset({GprState.PROVISIONING.value, GprState.PROVISIONED.value})
"""``provisioningStatus`` values of a GPR that holds nodes."""


def read_gpr_workload(doc: Doc, obj: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """``(gprId, workloadSelector)`` of a GPR that holds nodes; None if it holds none or the document has problems
    (reported to ``doc``)."""
    meta, spec = metadata_and_spec(doc, obj, TOP_FIELDS)
    gpr_id, state = "", ""
    selector: dict[str, str] = {}
    with doc.field():
        doc.name = as_str(meta.get("name"), "metadata.name")
    with doc.field():
        status = as_mapping(obj.get("status"), "status")
        gpr_id = as_str(status.get("gprId"), "status.gprId")
        state = as_str(status.get("provisioningStatus"), "status.provisioningStatus")
    with doc.field():
        raw = as_mapping(spec.get("workloadSelector"), "spec.workloadSelector")
        if "matchLabels" in raw:
            check_fields(doc, raw, "spec.workloadSelector", ("matchLabels",))
            selector = str_map(raw["matchLabels"], "spec.workloadSelector.matchLabels")
        else:
            selector = str_map(raw, "spec.workloadSelector")
    if doc.failed or not gpr_id or state not in HOLDING:
        return None
    return gpr_id, selector
