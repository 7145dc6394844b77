"""The GPUProvisioningRequest CRD agrees with the core parser; the shipped example validates against both."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.core.gpr import (
    API_VERSION,
    KIND,
    SHORT_NAME,
    SPEC_FIELDS,
    GprState,
    GprStatus,
    GprValidationError,
    NodePoolDetails,
    parse_gpr_spec,
    priority_band,
    spec_from_dict,
    spec_to_dict,
    status_to_dict,
)

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[1]
CRD = yaml.safe_load((REPO / "deploy" / "crds" / "gpuprovisioningrequest.yaml").read_text())
EXAMPLE = yaml.safe_load((REPO / "examples" / "gpr.yaml").read_text())
(VERSION,) = CRD["spec"]["versions"]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = SCHEMA["properties"]["spec"]
STATUS_SCHEMA = SCHEMA["properties"]["status"]


def _json_schema(node: Any) -> Any:
    """OpenAPI ``nullable: true`` as JSON Schema (``type: [T, "null"]``); other keywords pass through."""
    if isinstance(node, list):
        return [_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
    return out


def test_identity_of_the_crd() -> None:
    group, version = API_VERSION.split("/")
    names = CRD["spec"]["names"]
    assert CRD["metadata"]["name"] == f"{names['plural']}.{group}" == "gpuprovisioningrequests.gpuscale.io"
    assert (CRD["spec"]["group"], VERSION["name"], names["kind"]) == (group, version, KIND)
    assert names["shortNames"] == [SHORT_NAME]
    assert VERSION["subresources"] == {"status": {}}


def test_spec_fields_match_the_parser_both_ways() -> None:
    assert list(SPEC_SCHEMA["properties"]) == list(SPEC_FIELDS)
    assert set(spec_to_dict(spec_from_dict(EXAMPLE["spec"]))) == set(SPEC_FIELDS)
    assert set(SPEC_SCHEMA["required"]) == {"requestName", "exitDuration"}
    for name in SPEC_SCHEMA["required"]:  # the parser requires the same fields
        with pytest.raises(GprValidationError) as exc:
            spec_from_dict({k: v for k, v in EXAMPLE["spec"].items() if k != name})
        assert [e.field for e in exc.value.errors] == [name]


def test_schema_defaults_are_the_parser_defaults() -> None:
    minimal = {"requestName": "x", "gpuShape": "RTX4000-Ada", "exitDuration": "1h"}
    bare = spec_to_dict(spec_from_dict(minimal))
    defaults = {k: p["default"] for k, p in SPEC_SCHEMA["properties"].items() if "default" in p}
    assert set(defaults) >= {"priority", "numberOfGPUs", "numberOfGPUNodes", "enableDynamicNodePool"}
    for name, value in defaults.items():
        assert bare[name] == value, name
        assert spec_to_dict(spec_from_dict({**minimal, name: value})) == bare


def test_status_fields_match_status_to_dict() -> None:
    status = GprStatus(
        provisioning_status=GprState.PROVISIONED,
        internal_state="Reserved",
        start_timestamp=1_700_000_000.0,
        remaining_duration_s=3600.0,
        num_gpus_allocated=8,
        node_list=("lke1-a", "lke1-b"),
        cost=47.36,
        estimated_wait_time_s=0.0,
        node_pool_details=NodePoolDetails("linode", "lke-ml", "gpr-x", ("1", "2"), "g2-gpu-rtx4000a4-s"),
    )
    doc = status_to_dict(status)
    props = STATUS_SCHEMA["properties"]
    assert set(props) == set(doc) | {"gprId", "conditions", "gpuscale"}  # the CR's own: gpr_crd.CR_STATUS_FIELDS
    assert set(props["nodePoolDetails"]["properties"]) == set(doc["nodePoolDetails"])
    assert set(props["provisioningStatus"]["enum"]) == {s.value for s in GprState}
    schema = _json_schema(STATUS_SCHEMA)
    jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    jsonschema.validate(status_to_dict(GprStatus()), schema)  # a fresh, queued status (nulls)


def test_printer_columns_point_at_schema_fields() -> None:
    cols = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    assert {"Priority", "Status", "GPUs", "Age"} <= set(cols)
    assert cols["Age"]["jsonPath"] == ".metadata.creationTimestamp"
    for col in cols.values():
        path = col["jsonPath"].lstrip(".").split(".")
        if path[0] == "metadata":
            continue
        node = SCHEMA
        for part in path:
            node = node["properties"][part]
        kind = {"integer": "integer", "string": "string", "date": "string", "number": "number"}[col["type"]]
        assert node["type"] == kind, col


def test_example_validates_against_the_schema_and_parses() -> None:
    jsonschema.validate(EXAMPLE, _json_schema(SCHEMA))
    assert EXAMPLE["apiVersion"] == API_VERSION and EXAMPLE["kind"] == KIND
    from gpuscale.catalogs import load_catalog

    spec = parse_gpr_spec(EXAMPLE["spec"], load_catalog("linode"))
    assert (spec.number_of_gpu_nodes, spec.number_of_gpus, spec.total_gpus) == (2, 4, 8)
    assert spec.exit_duration_s == 8 * 3600 and spec.idle_timeout_s == 30 * 60 and spec.enforce_idle_timeout
    assert priority_band(spec.priority) == "high"
    assert spec.workload_selector == {"app": "llm-finetune"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 0),
        ("priority", 301),
        ("numberOfGPUs", 0),
        ("numberOfGPUNodes", 0),
        ("numberOfGPUNodes", 101),
        ("memoryPerGpu", -1),
        ("exitDuration", "8 hours"),
        ("exitDuration", "-1h"),
        ("exitDuration", "1h30"),
        ("idleTimeOutDuration", "soon"),
        ("enableEviction", "yes"),
        ("numberOfGPUs", "4"),
        ("requestName", ""),
    ],
)
def test_bad_values_are_rejected_by_schema_and_parser_alike(field: str, value: object) -> None:
    doc = copy.deepcopy(EXAMPLE)
    doc["spec"][field] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _json_schema(SCHEMA))
    with pytest.raises(GprValidationError) as exc:
        spec_from_dict(doc["spec"])
    assert field in {e.field for e in exc.value.errors}


@pytest.mark.parametrize("value", ["0d8h0m", "8h", "30m", "1d12h", "90s", "2D"])
def test_durations_accepted_by_the_parser_match_the_schema_pattern(value: str) -> None:
    doc = copy.deepcopy(EXAMPLE)
    doc["spec"]["exitDuration"] = value
    doc["spec"]["idleTimeOutDuration"] = value
    jsonschema.validate(doc, _json_schema(SCHEMA))
    spec_from_dict(doc["spec"])
