"""The generated CRDs: committed files equal the generator's output, schemas are structural and follow the readers'
field tables, the shipped CR examples validate (and broken ones do not), and the GPUNodeClaim codec round-trips."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.catalogs import load_catalog
from gpuscale.cli import main
from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.errors import InputError
from gpuscale.manifests import crds, nodeclaims, parse_yaml, status
from gpuscale.manifests.problems import Doc

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "deploy" / "crds"
EXAMPLE = REPO / "src" / "gpuscale" / "examples" / "crs.yaml"
NOW = 1_790_000_000.0


def _schema(kind: str) -> dict[str, Any]:
    for spec in crds.crd_specs():
        if spec.kind == kind:
            crd = yaml.safe_load((CRD_DIR / spec.file_name).read_text())
            schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(kind)


def _examples() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


def test_committed_crds_equal_the_generated_ones() -> None:
    assert crds.stale(CRD_DIR) == [], "run: gpuscale crds --out deploy/crds"
    assert {s.file_name for s in crds.crd_specs()} == {
        "gpunodepool.yaml",
        "offeringavailability.yaml",
        "gpunodeclaim.yaml",
    }


def test_crds_command_prints_writes_and_checks(tmp_path: Path) -> None:
    runner = CliRunner()
    printed = runner.invoke(main, ["crds"])
    assert printed.exit_code == 0
    docs = [d for d in yaml.safe_load_all(printed.output) if d]
    assert [d["spec"]["names"]["kind"] for d in docs] == ["GPUNodePool", "OfferingAvailability", "GPUNodeClaim"]
    out = tmp_path / "crds"
    assert runner.invoke(main, ["crds", "--out", str(out)]).exit_code == 0
    assert runner.invoke(main, ["crds", "--check", str(out)]).exit_code == 0
    (out / "gpunodeclaim.yaml").write_text((out / "gpunodeclaim.yaml").read_text().replace("gnc", "gc"))
    checked = runner.invoke(main, ["crds", "--check", str(out)])
    assert checked.exit_code == 1 and "gpunodeclaim.yaml" in checked.output


def test_a_schema_must_list_exactly_the_readers_fields() -> None:
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        crds.obj(("a", "b"), {"a": crds.string()})
    with pytest.raises(ValueError, match=r"not in the table \['c'\]"):
        crds.obj(("a",), {"a": crds.string(), "c": crds.string()})
    with pytest.raises(ValueError, match="required"):
        crds.obj(("a",), {"a": crds.string()}, required=("z",))


def _walk(schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of schema nodes that are not structural (no type, and not int-or-string / preserve-unknown)."""
    bad = []
    escape = schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in schema and not escape:
        bad.append(path or "<root>")
    for name, sub in schema.get("properties", {}).items():
        bad += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        bad += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        bad += _walk(schema["additionalProperties"], f"{path}{{}}")
    return bad


@pytest.mark.parametrize("spec", crds.crd_specs(), ids=lambda s: s.kind)
def test_every_crd_is_structural_with_status_columns_and_short_names(spec: crds.CrdSpec) -> None:
    crd = yaml.safe_load((CRD_DIR / spec.file_name).read_text())
    (version,) = crd["spec"]["versions"]
    assert _walk(version["schema"]["openAPIV3Schema"]) == []
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"]
    assert version["additionalPrinterColumns"][-1]["name"] == "Age"
    jsonschema.Draft7Validator.check_schema(version["schema"]["openAPIV3Schema"])


def test_pool_columns_show_nodes_gpus_and_cost() -> None:
    crd = yaml.safe_load((CRD_DIR / "gpunodepool.yaml").read_text())
    cols = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols["Nodes"] == ".status.nodes" and cols["GPUs"] == ".status.gpus" and cols["$/h"] == ".status.hourlyCost"
    schema = _schema("GPUNodePool")
    written: dict[str, Any] = {
        "apiVersion": "gpuscale.io/v1alpha1",
        "kind": "GPUNodePool",
        "metadata": {"name": "p"},
        "spec": {},
        "status": status.pool_status(
            3, 12, 4.0199, [status.Condition("Ready", "True", "Reconciled", "ok", "2026-01-01T00:00:00Z", 2)]
        ),
    }
    jsonschema.validate(written, schema)
    assert written["status"]["hourlyCost"] == 4.02
    written["status"]["conditions"][0]["status"] = "Maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(written, schema)


def test_the_shipped_examples_validate_and_parse() -> None:
    docs = _examples()
    assert [d["kind"] for d in docs] == ["GPUNodePool", "OfferingAvailability", "GPUNodeClaim"]
    for d in docs:
        jsonschema.validate(d, _schema(d["kind"]))
    notes: list[str] = []
    snap = parse_yaml(EXAMPLE.read_text(), source="crs.yaml", catalog=load_catalog("linode"), now=NOW, notes=notes)
    assert [p.name for p in snap.pools] == ["training"]
    assert {k.instance_type for k in snap.unavailable} == {"g2-gpu-rtx4000a2-s", "g1-gpu-rtx6000-2"}
    claim = nodeclaims.read_nodeclaim(Doc("crs.yaml", 3, None, []), docs[2])
    assert claim is not None and claim.phase is ClaimPhase.INITIALIZED and claim.node_name == "lke-training-61234567"


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("GPUNodePool", ("spec", "maxNodes"), -1),
        ("GPUNodePool", ("spec", "disruption", "consolidateAfter"), "10 minutes"),
        ("GPUNodePool", ("spec", "capacityTypes"), ["reserved"]),
        ("GPUNodePool", ("metadata", "name"), "Training"),
        ("OfferingAvailability", ("spec", "unavailable"), [{"zone": "us-ord", "until": "5m"}]),
        ("GPUNodeClaim", ("status", "phase"), "Running"),
        ("GPUNodeClaim", ("spec", "hourlyPrice"), -0.5),
        ("GPUNodeClaim", ("spec", "requestId"), "GS_1"),
        ("GPUNodeClaim", ("spec", "capacityType"), "Spot"),
    ],
)
def test_broken_examples_are_rejected_by_the_schema(kind: str, path: tuple[str, ...], value: object) -> None:
    doc = next(d for d in _examples() if d["kind"] == kind)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _schema(kind))


def test_nodeclaim_schema_requires_the_identity_fields() -> None:
    doc = next(d for d in _examples() if d["kind"] == "GPUNodeClaim")
    del doc["spec"]["requestedAt"]
    with pytest.raises(jsonschema.ValidationError, match="requestedAt"):
        jsonschema.validate(doc, _schema("GPUNodeClaim"))


_ids = st.from_regex(r"\Ags-[0-9a-f]{16}(-[1-9])?\Z")
_text = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)
_times = st.floats(min_value=1.0e9, max_value=4.0e9).map(lambda t: math.floor(t * 1e6) / 1e6)


@settings(max_examples=60, deadline=None)
@given(
    rid=_ids,
    pool=_text,
    phase=st.sampled_from(ClaimPhase),
    cap=st.sampled_from(CapacityType),
    created=_times,
    since=_times,
    price=st.floats(min_value=0, max_value=100, allow_nan=False),
    node_id=st.one_of(st.just(""), _text),
    node_name=st.one_of(st.just(""), _text),
    replaces=st.one_of(st.just(""), _text),
)
def test_nodeclaim_objects_round_trip(
    rid: str,
    pool: str,
    phase: ClaimPhase,
    cap: CapacityType,
    created: float,
    since: float,
    price: float,
    node_id: str,
    node_name: str,
    replaces: str,
) -> None:
    claim = NodeClaim(
        request_id=rid,
        pool=pool,
        instance_type="g2-gpu-rtx4000a1-s",
        zone="us-ord",
        capacity_type=cap,
        phase=phase,
        created_at=created,
        since=since,
        hourly_price=price,
        node_id=node_id,
        node_name=node_name,
        replaces=replaces,
        reason="because",
    )
    obj = nodeclaims.claim_object(claim)
    jsonschema.validate(obj, _schema("GPUNodeClaim"))
    back = nodeclaims.read_nodeclaim(Doc("x", 1, None, []), yaml.safe_load(yaml.safe_dump(obj)))
    assert back is not None
    assert back.created_at == pytest.approx(created, abs=1e-6) and back.since == pytest.approx(since, abs=1e-6)
    same = ("request_id", "pool", "capacity_type", "phase", "hourly_price", "node_id", "node_name", "replaces")
    assert all(getattr(back, f) == getattr(claim, f) for f in same)


def test_a_claim_never_updated_is_requested_since_its_request() -> None:
    obj = next(d for d in _examples() if d["kind"] == "GPUNodeClaim")
    del obj["status"]
    claim = nodeclaims.read_nodeclaim(Doc("x", 1, None, []), obj)
    assert claim is not None and claim.phase is ClaimPhase.REQUESTED and claim.since == claim.created_at


def test_nodeclaim_reader_reports_every_problem() -> None:
    obj = next(d for d in _examples() if d["kind"] == "GPUNodeClaim")
    obj["spec"].update(requestId="other-id", capacityType="reserved", requestedAt="yesterday", colour="blue")
    obj["status"].update(phase="Running", phaseSince="2026-01-01T00:00:00")
    doc = Doc("claims.yaml", 1, None, [])
    assert nodeclaims.read_nodeclaim(doc, obj) is None
    text = "\n".join(str(p) for p in doc.problems)
    for needle in (
        "spec.colour",
        "spec.requestId",
        "differs from metadata.name",
        "spec.capacityType",
        "spec.requestedAt",
        "status.phase",
        "status.phaseSince",
        "has no time zone",
    ):
        assert needle in text, (needle, text)


# ------------------------------------------------------------------------------- CEL rules (x-kubernetes-validations)
try:
    import celpy
    from celpy.adapter import json_to_cel
except ImportError:  # pragma: no cover - cel-python is in the dev extra
    HAVE_CEL = False
else:
    HAVE_CEL = True
needs_cel = pytest.mark.skipif(not HAVE_CEL, reason="cel-python is not installed")


@functools.cache
def _cel() -> celpy.Environment:
    return celpy.Environment()


def _rules(schema: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, str]]:
    """(path, rule, message) of every CEL rule; a path element "[]" means every item of a list."""
    out = [(path, r["rule"], r["message"]) for r in schema.get("x-kubernetes-validations", [])]
    for name, sub in schema.get("properties", {}).items():
        out += _rules(sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        out += _rules(schema["items"], (*path, "[]"))
    return out


def _at(obj: Any, path: tuple[str, ...]) -> list[Any]:
    if not path:
        return [obj]
    head, rest = path[0], path[1:]
    if head == "[]":
        return [x for item in obj for x in _at(item, rest)] if isinstance(obj, list) else []
    return _at(obj[head], rest) if isinstance(obj, dict) and head in obj else []


def cel_errors(doc: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The messages of the CEL rules ``doc`` breaks, as the API server evaluates them (``old``: transition rules)."""
    errors = []
    for path, rule, message in _rules(_schema(doc["kind"])):
        if "oldSelf" in rule and old is None:
            continue
        prog = _cel().program(_cel().compile(rule))
        olds = _at(old, path) if old is not None else []
        for i, node in enumerate(_at(doc, path)):
            act = {"self": json_to_cel(node)}
            if "oldSelf" in rule:
                if i >= len(olds):
                    continue
                act["oldSelf"] = json_to_cel(olds[i])
            if not bool(prog.evaluate(act)):
                errors.append(message)
    return errors


@needs_cel
def test_every_rule_compiles_and_the_examples_pass_them() -> None:
    rules = [r for spec in crds.crd_specs() for r in _rules(spec.schema)]
    assert len(rules) >= 6
    for _, rule, _ in rules:
        _cel().compile(rule)
    docs = _examples() + [
        d for d in yaml.safe_load_all((REPO / "examples" / "snapshot.yaml").read_text()) if d and d["kind"] in
        ("GPUNodePool", "OfferingAvailability")
    ]  # fmt: skip
    for d in docs:
        assert cel_errors(d) == [], d["metadata"]["name"]


_REQ = ("spec", "requirements", 0)


@needs_cel
@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (_REQ, {"key": "nvidia.com/gpu.product", "operator": "In"}, "In and NotIn need at least one value"),
        (_REQ, {"key": "nvidia.com/gpu.count", "operator": "Exists", "values": ["1"]}, "take no values"),
        (_REQ, {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["two"]}, "exactly one integer value"),
        (_REQ, {"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["1", "2"]}, "exactly one integer value"),
        (("spec", "disruption", "budgets", 1), {"nodes": "0", "schedule": "0 9 * * 1-5"}, "set together"),
        (("spec", "minNodes"), 7, "maxNodes must be >= minNodes"),
    ],
)
def test_cel_rules_reject_what_the_pool_reader_rejects(path: tuple[Any, ...], value: object, message: str) -> None:
    doc = next(d for d in _examples() if d["kind"] == "GPUNodePool")
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    jsonschema.validate(doc, _schema("GPUNodePool"))  # the structural part accepts it: only the rule catches it
    assert any(message in e for e in cel_errors(doc)), cel_errors(doc)
    with pytest.raises(InputError):
        parse_yaml(yaml.safe_dump(doc), source="pool.yaml", catalog=load_catalog("linode"), now=NOW)


@needs_cel
def test_a_claims_spec_is_immutable() -> None:
    old = next(d for d in _examples() if d["kind"] == "GPUNodeClaim")
    new = yaml.safe_load(yaml.safe_dump(old))
    new["status"]["phase"] = "Draining"
    assert cel_errors(new, old) == []
    new["spec"]["zone"] = "us-sea"
    assert cel_errors(new, old) == ["spec is immutable: a claim records one launch"]
