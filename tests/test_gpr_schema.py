"""One GPR spec schema: the committed CRD is the generated one, and the core reader, the REST model and the CRD's
schema accept and refuse the same 200 generated specs.

The CRD side is its OpenAPI schema read as JSON Schema, with ``nullable`` as a null type and unknown fields refused
(``kubectl``'s strict field validation). Its CEL rules are not evaluated here, so every generated spec names a
``gpuShape`` (the "shape given" rule holds) and uses valid label keys; strings carry no surrounding whitespace other
than blank strings of spaces (the core trims), durations stay below the core's 100-year ceiling, and only the
``matchLabels`` form of the selector is generated (the core also reads a bare label map). Within that, anything
accepted by one is accepted by all three.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuscale.core.gpr import (
    SPEC_FIELDS,
    SPEC_SCHEMA,
    GprValidationError,
    spec_from_dict,
    spec_json_schema,
)
from gpuscale.gpr.api import SPEC_SCHEMA as REST_SCHEMA
from gpuscale.gpr.spec_model import GprSpecIn
from gpuscale.manifests import gpr_crd

jsonschema = pytest.importorskip("jsonschema")

CRD_DIR = Path(__file__).resolve().parents[1] / "deploy" / "crds"


def _strict(node: Any) -> Any:
    """CRD schema as JSON Schema: ``nullable`` -> null type, objects with properties refuse unknown fields."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k not in ("nullable", "x-kubernetes-validations")}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


CRD_SPEC = jsonschema.Draft202012Validator(_strict(spec_json_schema("crd")))
REST = jsonschema.Draft202012Validator(REST_SCHEMA)


def core_accepts(spec: dict[str, Any]) -> bool:
    try:
        spec_from_dict(spec)
    except GprValidationError:
        return False
    return True


def crd_accepts(spec: dict[str, Any]) -> bool:
    return bool(CRD_SPEC.is_valid(spec))


def model_accepts(spec: dict[str, Any]) -> bool:
    try:
        GprSpecIn.model_validate(spec)
    except ValidationError:
        return False
    return True


TEXT_BAD = [5, True, ["x"], "tab\there", "nul\x00", "del\x7f"]
BOOL_OK, BOOL_BAD = [True, False, None], ["yes", 1, 0]
VALID: dict[str, list[Any]] = {
    "requestName": ["llm", "a b", "x" * 40, "ünïcode"],
    "gpuShape": ["RTX4000-Ada", "T4", "", "  ", "x" * 128],
    "exitDuration": ["8h", "0d8h0m", "1d12h", "90s", "2D", "30m", " 8h ", "36500d", "1h30m15s"],
    "clusterName": ["lke-ml", "a.b-c", "", "  ", "x" * 253, None],
    "instanceType": ["g2-gpu-rtx4000a4-s", "", None],
    "enableAutoGpuSelection": BOOL_OK,
    "numberOfGPUs": [1, 4, 64, 2.0, None],
    "numberOfGPUNodes": [1, 2, 100, None],
    "memoryPerGpu": [0, 24, 4096, None],
    "priority": [1, 101, 300, 150.0, None],
    "idleTimeOutDuration": ["30m", "", "0m", "1h", None],
    "enforceIdleTimeOut": BOOL_OK,
    "earlyRelease": BOOL_OK,
    "enableEviction": BOOL_OK,
    "requeueOnFailure": BOOL_OK,
    "enableDynamicNodePool": BOOL_OK,
    "releasePolicy": ["Consolidate", "Delete", "", "  ", None],
    "workloadSelector": [None, {}, {"matchLabels": {}}, {"matchLabels": {"app": "x", "gpuscale.io/job": "a" * 63}}],
}
INVALID: dict[str, list[Any]] = {
    "requestName": ["", "   ", "x" * 41, None, *TEXT_BAD],
    "gpuShape": ["x" * 129, *TEXT_BAD],
    "exitDuration": ["0h", "0d0h0m", "", "  ", "8 hours", "-1h", "1h30", "1m1h", "h", "1" * 13 + "h", None, 8],
    "clusterName": ["UPPER", "bad_name", "-x", "a" * 254, 3],
    "instanceType": ["x" * 129, *TEXT_BAD],
    "enableAutoGpuSelection": BOOL_BAD,
    "numberOfGPUs": [0, -1, 65, 2.5, "4", True, 10**20],
    "numberOfGPUNodes": [0, 101, "2", False],
    "memoryPerGpu": [-1, 4097, 1.5, "24"],
    "priority": [0, 301, "high", True],
    "idleTimeOutDuration": ["  ", "soon", "1h30", 7],
    "enforceIdleTimeOut": BOOL_BAD,
    "earlyRelease": BOOL_BAD,
    "enableEviction": BOOL_BAD,
    "requeueOnFailure": BOOL_BAD,
    "enableDynamicNodePool": BOOL_BAD,
    "releasePolicy": ["delete", "Keep", "x" * 129, *TEXT_BAD],
    "workloadSelector": [
        "app=x",
        {"matchLabels": None},
        {"matchLabels": {"a": "b"}, "extra": 1},
        {"matchLabels": {"app": "bad value!"}},
        {"matchLabels": {"app": "a" * 64}},
        {"matchLabels": {"app": 3}},
        {"matchLabels": {f"k{i}": "v" for i in range(33)}},
    ],
}
REQUIRED = ("requestName", "gpuShape", "exitDuration")
FAULTS = [(name, bad) for name, values in INVALID.items() for bad in values] + [
    ("numberOfGpus", 1),
    ("requestName", ...),
]
"""(field, value) pairs that make a spec invalid; ``...`` removes the field (an unknown key is the other kind)."""

VALID_SPECS = st.fixed_dictionaries(
    {k: st.sampled_from(VALID[k]) for k in REQUIRED},
    optional={k: st.sampled_from(v) for k, v in VALID.items() if k not in REQUIRED},
)


def _corrupt(spec: dict[str, Any], faults: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(spec)
    for name, value in faults:
        if value is ...:
            out.pop(name, None)
        else:
            out[name] = value
    return out


SPECS = st.builds(_corrupt, VALID_SPECS, st.lists(st.sampled_from(FAULTS), max_size=2))
"""A valid spec with zero, one or two faults."""


def test_committed_crd_is_the_generated_one(tmp_path: Path) -> None:
    assert not gpr_crd.stale(CRD_DIR), "run: python -m gpuscale.manifests.gpr_crd --out deploy/crds"
    assert gpr_crd.main(["--check", str(CRD_DIR)]) == 0
    assert gpr_crd.main(["--check", str(tmp_path)]) == 1
    assert gpr_crd.main(["--out", str(tmp_path)]) == 0 and not gpr_crd.stale(tmp_path)


def test_the_crd_follows_the_field_table() -> None:
    crd = gpr_crd.crd_spec().manifest()
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert list(spec["properties"]) == list(SPEC_FIELDS)
    assert [c["name"] for c in version["additionalPrinterColumns"]][:4] == ["Status", "GPUs", "Nodes", "Priority"]
    assert version["additionalPrinterColumns"][-1]["name"] == "Age"
    assert crd["spec"]["names"]["shortNames"] == ["gpr"] and version["subresources"] == {"status": {}}
    rest_only = {f.name for f in SPEC_SCHEMA if f.rest_only}
    assert rest_only and not rest_only & set(spec["properties"])
    assert rest_only <= set(REST_SCHEMA["properties"]) and "gprName" in REST_SCHEMA["properties"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS)
def test_core_rest_model_and_crd_agree(spec: dict[str, Any]) -> None:
    core = core_accepts(copy.deepcopy(spec))
    assert crd_accepts(spec) is core, f"CRD schema and core reader disagree on {spec!r}"
    assert model_accepts(spec) is core, f"REST model and core reader disagree on {spec!r}"
    assert REST.is_valid(spec) is core, f"REST OpenAPI schema and core reader disagree on {spec!r}"


@pytest.mark.parametrize(("name", "value"), FAULTS, ids=[f"{n}={str(v)[:12]!r}" for n, v in FAULTS])
def test_every_fault_is_refused_by_all_three(name: str, value: Any) -> None:
    spec = _corrupt({"requestName": "llm", "gpuShape": "T4", "exitDuration": "8h"}, [(name, value)])
    assert (core_accepts(copy.deepcopy(spec)), crd_accepts(spec), model_accepts(spec), REST.is_valid(spec)) == (
        False,
        False,
        False,
        False,
    )


def test_the_generated_specs_include_valid_and_invalid_ones() -> None:
    find(SPECS, core_accepts, settings=settings(database=None, max_examples=500))
    find(SPECS, lambda s: not core_accepts(s), settings=settings(database=None, max_examples=500))
