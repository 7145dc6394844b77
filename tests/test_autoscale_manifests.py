"""GPUWorkloadScaler / ScaledObject / GPUBudget reading: the shipped examples, KEDA's layout, errors with file:line
and fix, and the CRDs in deploy/crds agreeing with the parser's field tables."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.core.autoscale.hpa import DEFAULT_SCALE_UP, MetricKind, PolicyType, SelectPolicy
from gpuscale.errors import InputError
from gpuscale.manifests import scaler as sc
from gpuscale.manifests.scaler import load_scalers, parse_scalers

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "src" / "gpuscale" / "examples"
CRDS = ROOT / "deploy" / "crds"


def test_example_scaler_reads() -> None:
    f = load_scalers(EXAMPLES / "scaler.yaml")
    (s,) = f.scalers
    assert (s.name, s.namespace, s.target_kind, s.target_name) == ("llama-70b", "inference", "Deployment", "llama-70b")
    util, queue = s.spec.triggers
    assert util.metric.kind is MetricKind.POD_AVERAGE and util.metric.target == 70 and util.activation == 5
    assert queue.metric.kind is MetricKind.AVERAGE_VALUE and queue.metric.target == 8
    assert s.queries["gpu-util"][1] == 'avg(DCGM_FI_DEV_GPU_UTIL{namespace="inference",pod=~"llama-70b-.*"})'
    assert s.spec.behavior.scale_up.policies[0].type is PolicyType.PODS
    assert s.spec.behavior.scale_down.stabilization_window_s == 120
    assert s.spec.fallback is not None and s.spec.fallback.replicas == 4
    assert s.budget == sc.BudgetRef("shared-inference", "llama-70b", 2) and s.priority == 200
    assert len(s.spec.schedules) == 1 and s.spec.schedules[0].replicas == 2


def test_keda_scaled_object_pasted_as_is() -> None:
    (s,) = load_scalers(EXAMPLES / "keda-scaledobject.yaml").scalers
    assert s.kind == "ScaledObject" and s.spec.min_replicas == 1 and s.spec.polling_interval_s == 15
    down = s.spec.behavior.scale_down
    assert down.stabilization_window_s == 60 and down.policies[0].value == 1
    assert s.spec.behavior.scale_up == DEFAULT_SCALE_UP
    assert s.spec.triggers[0].ignore_null_values is False


def test_budget_example() -> None:
    (b,) = load_scalers(EXAMPLES / "gpubudget.yaml").budgets
    assert (b.total_gpus, b.elastic_share, b.guarantee("llama-70b"), b.guarantee("other")) == (16, 1.0, 4, 0)


GOOD = """\
apiVersion: gpuscale.io/v1alpha1
kind: GPUWorkloadScaler
metadata: {name: m}
spec:
  scaleTargetRef: {name: m}
  triggers:
    - type: dcgm
      metadata: {metric: DCGM_FI_DEV_GPU_UTIL, threshold: "70"}
"""


def err(text: str) -> str:
    with pytest.raises(InputError) as exc:
        parse_scalers(text, source="s.yaml")
    return str(exc.value)


def test_minimal_scaler_takes_the_defaults() -> None:
    (s,) = parse_scalers(GOOD, source="s.yaml").scalers
    assert (s.spec.min_replicas, s.spec.max_replicas, s.spec.polling_interval_s, s.spec.cooldown_s) == (0, 100, 30, 300)
    assert s.spec.triggers[0].name == "trigger-0" and s.namespace == "default"
    assert s.spec.behavior.scale_down.select_policy is SelectPolicy.MAX


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        (
            'threshold: "70"',
            "threshold: 70",
            "s.yaml:8 (document 1, GPUWorkloadScaler m) spec.triggers[0].metadata.threshold: must be a string",
        ),
        ('threshold: "70"', 'threshold: "seventy"', "is not a number"),
        ('threshold: "70"', 'threshold: "0"', "must be greater than 0"),
        (
            "  triggers:",
            "  minReplicas: 1\n  triggers:",
            "s.yaml:6 (document 1, GPUWorkloadScaler m) spec.minReplicas: unknown field (got 'minReplicas'); "
            "did you mean minReplicaCount",
        ),
        ("metric: DCGM_FI_DEV_GPU_UTIL", "metric: DCGM_FI_DEV_GPU_UTILS", "did you mean DCGM_FI_DEV_GPU_UTIL"),
        ("type: dcgm", "type: kafka", "spec.triggers[0].type: is not a valid value"),
        ("  triggers:", "  idleReplicaCount: 0\n  triggers:", "must be less than minReplicaCount"),
        ("  triggers:", "  idleReplicaCount: 2\n  minReplicaCount: 3\n  triggers:", "must be <= 0"),
        ("  triggers:", "  maxReplicaCount: 0\n  triggers:", "must be at least 1"),
        (
            "  triggers:",
            "  schedules: [{start: '0 25 * * *', end: '0 20 * * *', desiredReplicas: 2}]\n  triggers:",
            "spec.schedules[0].start: cron spec.schedules[0].start (hour) value 25 out of range",
        ),
        ("  triggers:", "  behavior: {scaleUp: {policies: []}}\n  triggers:", "must list at least one policy"),
        ("  triggers:", "  behavior: {scaleUp: {selectPolicy: max}}\n  triggers:", "did you mean Max"),
        (
            "  triggers:",
            "  behavior: {}\n  advanced: {horizontalPodAutoscalerConfig: {behavior: {}}}\n  triggers:",
            "is set twice",
        ),
        ("kind: GPUWorkloadScaler", "kind: GPUWorkloadScalar", "did you mean GPUWorkloadScaler"),
        ("metadata: {name: m}", "metadata: {name: m, namespace: 'a\"b'}", "metadata.namespace: must be a DNS label"),
        ("scaleTargetRef: {name: m}", "scaleTargetRef: {name: 'x\"}'}", "scaleTargetRef.name: must be a DNS subdomain"),
        ("apiVersion: gpuscale.io/v1alpha1", "apiVersion: keda.sh/v1alpha1", "has apiVersion gpuscale.io/v1alpha1"),
    ],
)
def test_errors_name_file_line_field_and_fix(old: str, new: str, expect: str) -> None:
    assert old in GOOD
    assert expect in err(GOOD.replace(old, new))


def test_fallback_needs_average_value() -> None:
    text = GOOD.replace("    - type: dcgm\n      metadata: {metric: DCGM_FI_DEV_GPU_UTIL, threshold: \"70\"}",
                        "    - {type: prometheus, metricType: Value, metadata: {serverAddress: 'http://p:9090', "
                        "query: up, threshold: '1'}}")  # fmt: skip
    text += "  fallback: {failureThreshold: 3, replicas: 2}\n"
    assert "fallback works only with AverageValue triggers" in err(text)


def test_every_problem_is_reported_at_once() -> None:
    text = GOOD.replace('threshold: "70"', "threshold: 70").replace("  triggers:", "  cooldown: 5\n  triggers:")
    message = err(text)
    assert message.startswith("2 problems in s.yaml")


def test_budget_guarantees_must_fit() -> None:
    text = ("apiVersion: gpuscale.io/v1alpha1\nkind: GPUBudget\nmetadata: {name: b}\n"
            "spec: {totalGPUs: 4, models: [{name: a, guaranteedGPUs: 3}, {name: b, guaranteedGPUs: 2}]}\n")  # fmt: skip
    assert "guarantees 5 GPUs, more than totalGPUs (4)" in err(text)
    assert "elasticShare: must be between 0 and 1" in err(text.replace("totalGPUs: 4", "totalGPUs: 9, elasticShare: 2"))
    ok = parse_scalers(text.replace("totalGPUs: 4", "totalGPUs: 9, elasticShare: '50%'"), source="b.yaml")
    assert ok.budgets[0].elastic_share == 0.5


def test_empty_and_foreign_files() -> None:
    assert "holds no GPUWorkloadScaler" in err("")
    assert "is not a kind read here" in err("apiVersion: v1\nkind: Pod\n")


# ------------------------------------------------------------------------------------------------------ the CRDs
def crd(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CRDS / name).read_text())
    return data


def schema(name: str) -> dict[str, Any]:
    (version,) = crd(name)["spec"]["versions"]
    s: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return s


def props(node: dict[str, Any], *path: str) -> dict[str, Any]:
    for part in path:
        node = node["properties"][part]
        if node.get("type") == "array":
            node = node["items"]
    return node


def test_scaler_crd_fields_match_the_parser() -> None:
    s = schema("gpuworkloadscaler.yaml")
    spec = props(s, "spec")
    assert list(spec["properties"]) == list(sc.SPEC_FIELDS)
    assert set(props(spec, "scaleTargetRef")["properties"]) == set(sc.TARGET_FIELDS)
    assert set(props(spec, "fallback")["properties"]) == set(sc.FALLBACK_FIELDS)
    assert set(props(spec, "advanced")["properties"]) == set(sc.ADVANCED_FIELDS)
    assert set(props(spec, "advanced", "horizontalPodAutoscalerConfig")["properties"]) == set(sc.HPA_CONFIG_FIELDS)
    assert set(props(spec, "triggers")["properties"]) == set(sc.TRIGGER_FIELDS)
    assert props(spec, "triggers", "type")["enum"] == list(sc.TRIGGER_TYPES)
    assert props(spec, "triggers", "metricType")["enum"] == list(sc.METRIC_TYPES)
    assert set(props(spec, "schedules")["properties"]) == set(sc.SCHEDULE_FIELDS)
    assert set(props(spec, "gpuBudget")["properties"]) == set(sc.GPU_BUDGET_REF_FIELDS)
    for behavior in (props(spec, "behavior"), props(spec, "advanced", "horizontalPodAutoscalerConfig", "behavior")):
        assert set(behavior["properties"]) == set(sc.BEHAVIOR_FIELDS)
        for d in sc.BEHAVIOR_FIELDS:
            assert set(props(behavior, d)["properties"]) == set(sc.RULES_FIELDS)
            assert set(props(behavior, d, "policies")["properties"]) == set(sc.POLICY_FIELDS)
            assert props(behavior, d, "selectPolicy")["enum"] == [str(p) for p in SelectPolicy]
    # defaults in the schema are the parser's
    (parsed,) = parse_scalers(GOOD, source="s.yaml").scalers
    assert props(spec, "minReplicaCount")["default"] == parsed.spec.min_replicas
    assert props(spec, "maxReplicaCount")["default"] == parsed.spec.max_replicas
    assert props(spec, "pollingInterval")["default"] == parsed.spec.polling_interval_s
    assert props(spec, "cooldownPeriod")["default"] == parsed.spec.cooldown_s
    assert set(spec["required"]) == {"scaleTargetRef", "triggers"}


def test_budget_crd_fields_match_the_parser() -> None:
    spec = props(schema("gpubudget.yaml"), "spec")
    assert list(spec["properties"]) == list(sc.BUDGET_SPEC_FIELDS)
    assert set(props(spec, "models")["properties"]) == set(sc.MODEL_FIELDS)


@pytest.mark.parametrize(("name", "kind", "short"), [("gpuworkloadscaler.yaml", "GPUWorkloadScaler", "gws"),
                                                      ("gpubudget.yaml", "GPUBudget", "gpub")])  # fmt: skip
def test_crd_identity_status_and_printer_columns(name: str, kind: str, short: str) -> None:
    c = crd(name)
    names = c["spec"]["names"]
    assert names["kind"] == kind and names["shortNames"] == [short]
    assert c["metadata"]["name"] == f"{names['plural']}.gpuscale.io"
    (version,) = c["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    s = version["schema"]["openAPIV3Schema"]
    for col in version["additionalPrinterColumns"]:
        path = col["jsonPath"].lstrip(".").split(".")
        if path[0] == "metadata":
            continue
        node = s
        for part in path:
            node = node["properties"][part]
        assert node["type"] == {"date": "string"}.get(col["type"], col["type"]), col


def _untyped(node: dict[str, Any], path: str = "") -> list[str]:
    """Schema nodes without a type (a structural schema has one everywhere, unless it preserves unknown fields)."""
    typed = "type" in node or node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
    bad = [] if typed else [path or "<root>"]
    for name, sub in node.get("properties", {}).items():
        bad += _untyped(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            bad += _untyped(node[key], f"{path}[{key}]")
    return bad


@pytest.mark.parametrize("name", ["gpuworkloadscaler.yaml", "gpubudget.yaml"])
def test_crds_are_structural_and_installed_by_the_kustomization(name: str) -> None:
    assert _untyped(schema(name)) == []
    assert name in yaml.safe_load((CRDS / "kustomization.yaml").read_text())["resources"]


@pytest.mark.parametrize(("example", "crd_file"), [("scaler.yaml", "gpuworkloadscaler.yaml"),
                                                    ("gpubudget.yaml", "gpubudget.yaml")])  # fmt: skip
def test_examples_validate_against_the_crds(example: str, crd_file: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = yaml.safe_load((EXAMPLES / example).read_text())
    jsonschema.validate(doc, schema(crd_file))


def test_dcgm_shortcut_queries_parse_on_prometheus(tmp_path: Path) -> None:
    """Every shortcut's query, for a target whose name holds a '.', is valid PromQL (promtool check rules)."""
    from prom_harness import tool

    promtool = tool("promtool")
    triggers = "\n".join(
        f"    - {{type: dcgm, name: t{i}, metadata: {{metric: {m}, threshold: '50'}}}}"
        for i, m in enumerate(sc.DCGM_SHORTCUTS)
    )
    text = GOOD.replace("scaleTargetRef: {name: m}", "scaleTargetRef: {name: llm.v2}").split("  triggers:")[0]
    (s,) = parse_scalers(text + "  triggers:\n" + triggers + "\n", source="s.yaml").scalers
    assert 'pod=~"llm\\\\.v2-.*"' in s.queries["t0"][1]
    rules = {"groups": [{"name": "q", "rules": [{"record": f"q:{n.replace('-', '_')}", "expr": q}
                                                for n, (_, q) in s.queries.items()]}]}  # fmt: skip
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(sc.DCGM_SHORTCUTS)} rules found" in done.stdout
