"""Tests of gpuscale.manifests: Kubernetes objects (YAML) -> core Snapshot."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.core import labels as L
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    ConsolidationPolicy,
    DisruptionBudget,
    InstanceType,
    Offering,
    OfferingKey,
    PoolLimits,
    Requirement,
    SelectorOperator,
    Snapshot,
    Taint,
    TaintEffect,
    Toleration,
)
from gpuscale.core.resources import Request, Resources
from gpuscale.errors import InputError
from gpuscale.manifests import ManifestError, load_snapshot, parse_documents, parse_yaml
from gpuscale.manifests import pools as pools_mod
from gpuscale.manifests.availability import ENTRY_FIELDS
from gpuscale.manifests.pools import cron_problem
from gpuscale.manifests.quantity import cpu_milli, memory_mib, parse_duration, whole_count

REPO = Path(__file__).resolve().parents[1]
NOW = 1_750_000_000.0


def _it(
    name: str, vcpus: int, mem_gib: int, gpus: int, model: str, price: float, zones: tuple[str, ...]
) -> InstanceType:
    offerings = tuple(Offering(z, CapacityType.ON_DEMAND, price) for z in zones)
    if model == "A10":
        offerings += tuple(Offering(z, CapacityType.SPOT, round(price * 0.4, 3)) for z in zones)
    return InstanceType(
        name=name,
        provider="test",
        vcpus=vcpus,
        memory_mib=mem_gib * 1024,
        gpu_count=gpus,
        gpu_model=model,
        gpu_memory_mib=24576,
        family=name.split("-")[0],
        offerings=offerings,
    )


CATALOG = Catalog(
    "test",
    (
        _it("gpu-a10-1", 8, 32, 1, "A10", 1.0, ("zone-a", "zone-b")),
        _it("gpu-a10-4", 32, 128, 4, "A10", 4.0, ("zone-a", "zone-b")),
        _it("gpu-l4-1", 4, 16, 1, "L4", 0.7, ("zone-a",)),
    ),
)


def parse(text: str, **kw: Any) -> Snapshot:
    return parse_yaml(textwrap.dedent(text), source="snap.yaml", catalog=CATALOG, now=NOW, **kw)


def errors_of(text: str) -> list[str]:
    with pytest.raises(InputError) as info:
        parse(text)
    err = info.value
    assert isinstance(err, ManifestError)
    return [str(p) for p in err.problems]


def pod_doc(containers: Any, *, name: str = "p", spec: dict[str, Any] | None = None, **meta: Any) -> str:
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", **meta},
        "spec": {"containers": containers, **(spec or {})},
    }
    return yaml.safe_dump(obj, sort_keys=False)


def one_pod(containers: Any, **kw: Any) -> Request:
    snap = parse(pod_doc(containers, **kw))
    assert len(snap.pods) == 1
    return snap.pods[0].request


def res(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {}
    if requests is not None:
        r["requests"] = requests
    if limits is not None:
        r["limits"] = limits
    return {"name": "c", "image": "x", "resources": r, **extra}


# ---------------------------------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(
    ("value", "up", "down"),
    [
        ("500m", 500, 500),
        ("2", 2000, 2000),
        ("0.5", 500, 500),
        (2, 2000, 2000),
        (0.25, 250, 250),
        ("1.5", 1500, 1500),
        ("100u", 1, 0),
        ("1500500u", 1501, 1500),
        ("1k", 1_000_000, 1_000_000),
        ("2e-3", 2, 2),
        ("+3", 3000, 3000),
        (".5", 500, 500),
    ],
)
def test_cpu_quantities(value: object, up: int, down: int) -> None:
    assert cpu_milli(value) == up
    assert cpu_milli(value, round_up=False) == down


@pytest.mark.parametrize(
    ("value", "up", "down"),
    [
        ("1Gi", 1024, 1024),
        ("512Mi", 512, 512),
        ("1G", 954, 953),
        ("1e9", 954, 953),
        ("1E9", 954, 953),
        ("128974848", 123, 123),
        (128974848, 123, 123),
        ("129e6", 124, 123),
        ("1Ki", 1, 0),
        ("0", 0, 0),
        ("1.5Gi", 1536, 1536),
        ("1Ti", 1024 * 1024, 1024 * 1024),
        ("8148596Ki", 7958, 7957),
        ("123M", 118, 117),
    ],
)
def test_memory_quantities(value: object, up: int, down: int) -> None:
    assert memory_mib(value) == up
    assert memory_mib(value, round_up=False) == down


@pytest.mark.parametrize(
    "value",
    ["2x", "", "1.2.3", "Gi", "1 Gi", "1KB", "1mi", "1e99", "-1", "- 1", "e3", True, None, [1], {"a": 1}, math.inf],
)
def test_invalid_quantities(value: object) -> None:
    with pytest.raises(ValueError):
        cpu_milli(value)
    with pytest.raises(ValueError):
        memory_mib(value)


@pytest.mark.parametrize(("value", "expected"), [("1", 1), (2, 2), ("1k", 1000), ("0", 0), ("4e0", 4)])
def test_whole_counts(value: object, expected: int) -> None:
    assert whole_count(value) == expected


@pytest.mark.parametrize("value", ["0.5", "500m", 1.5, "-1", "two"])
def test_whole_counts_invalid(value: object) -> None:
    with pytest.raises(ValueError):
        whole_count(value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30s", 30), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("500ms", 0.5), ("0", 0), ("2h0m0s", 7200)],
)
def test_durations(value: str, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["10", "-5s", "5d", "", "1h 30m", 30, "s", "Never"])
def test_durations_invalid(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


# ------------------------------------------------------------------------------------------------- pod requests


@pytest.mark.parametrize(
    ("containers", "inits", "spec", "cpu", "mem"),
    [
        # plain sum of containers
        ([{"cpu": "1", "memory": "1Gi"}, {"cpu": "500m", "memory": "512Mi"}], [], {}, 1500, 1536),
        # an init container larger than the sum wins, per resource
        ([{"cpu": "1", "memory": "1Gi"}], [{"cpu": "3", "memory": "256Mi"}], {}, 3000, 1024),
        # the max over init containers, not their sum
        ([{"cpu": "1"}], [{"cpu": "2"}, {"cpu": "2500m"}], {}, 2500, 0),
        # a sidecar (restartPolicy Always) adds to the containers and to later init containers
        ([{"cpu": "2"}], [{"cpu": "1", "_sidecar": True}, {"cpu": "3"}], {}, 4000, 0),
        ([{"cpu": "2"}], [{"cpu": "1", "_sidecar": True}, {"cpu": "500m"}], {}, 3000, 0),
        # pod overhead is added on top
        ([{"cpu": "1", "memory": "1Gi"}], [{"cpu": "2"}], {"overhead": {"cpu": "250m", "memory": "120Mi"}}, 2250, 1144),
        # pod-level resources replace the container sums for cpu and memory
        (
            [{"cpu": "1", "memory": "1Gi"}],
            [],
            {"resources": {"requests": {"cpu": "3"}, "limits": {"memory": "2Gi"}}},
            3000,
            2048,
        ),
    ],
)
def test_effective_request_init_rule(
    containers: list[dict[str, Any]], inits: list[dict[str, Any]], spec: dict[str, Any], cpu: int, mem: int
) -> None:
    init_objs = []
    for i, r in enumerate(inits):
        sidecar = r.pop("_sidecar", False)
        obj = res(r)
        obj["name"] = f"init{i}"
        if sidecar:
            obj["restartPolicy"] = "Always"
        init_objs.append(obj)
    full_spec = dict(spec)
    if init_objs:
        full_spec["initContainers"] = init_objs
    req = one_pod([res(r) for r in containers], spec=full_spec)
    assert (req.cpu_milli, req.memory_mib) == (cpu, mem)


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (res(limits={"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1}), Request(2000, 4096, gpus=1)),
        (res({"cpu": "1"}, {"cpu": "2", "memory": "4Gi"}), Request(1000, 4096)),
        (res({"memory": "1Gi"}, {"nvidia.com/gpu": "2"}), Request(0, 1024, gpus=2)),
        (res(limits={"gpuscale.io/gpu-milli": 300}), Request(gpu_milli=300)),
        (res({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 1}), Request(gpus=1)),
        (res(), Request()),
    ],
)
def test_limits_only_become_requests(container: dict[str, Any], expected: Request) -> None:
    assert one_pod([container]) == expected


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ([res({"gpuscale.io/gpu-milli": 500})], Request(gpu_milli=500)),
        ([res({"gpuscale.io/gpu-milli": "999"})], Request(gpu_milli=999)),
        ([res({"gpuscale.io/gpu-milli": 1})], Request(gpu_milli=1)),
        ([res({"gpuscale.io/gpu-milli": 200}), res({"gpuscale.io/gpu-milli": 150})], Request(gpu_milli=350)),
        ([res({"gpuscale.io/gpu-milli": 0})], Request()),
    ],
)
def test_fractional_gpus(containers: list[dict[str, Any]], expected: Request) -> None:
    assert one_pod(containers) == expected


@pytest.mark.parametrize(
    ("containers", "fragments"),
    [
        ([res({"gpuscale.io/gpu-milli": 1000})], ["must be 1..999", "use nvidia.com/gpu", "nvidia.com/gpu: 1"]),
        ([res({"gpuscale.io/gpu-milli": 2000})], ["use nvidia.com/gpu for whole GPUs (nvidia.com/gpu: 2)"]),
        ([res({"gpuscale.io/gpu-milli": 1500})], ["must be 1..999", "got 1500"]),
        ([res({"gpuscale.io/gpu-milli": 600}), res({"gpuscale.io/gpu-milli": 500})], ["add up to less than 1000"]),
        ([res({"gpuscale.io/gpu-milli": 500, "nvidia.com/gpu": 1})], ["whole GPUs", "and a GPU fraction"]),
        ([res({"nvidia.com/gpu": 1}), res({"gpuscale.io/gpu-milli": 500})], ["whole GPUs", "and a GPU fraction"]),
        ([res({"gpuscale.io/gpu-milli": "0.5"})], ["must be a whole number", "1..999"]),
        ([res({"nvidia.com/gpu": "0.5"})], ["must be a whole number", "use gpuscale.io/gpu-milli"]),
        ([res({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2})], ["requests and limits of nvidia.com/gpu must be equal"]),
        ([res({"cpu": "2"}, {"cpu": "1"})], ["requests.cpu", "exceeds the limit"]),
        ([res({"cpu": "-1"})], ["must not be negative"]),
        ([], ["spec.containers", "at least one container"]),
    ],
)
def test_request_validation(containers: list[dict[str, Any]], fragments: list[str]) -> None:
    msgs = errors_of(pod_doc(containers))
    assert len(msgs) == 1, msgs
    for frag in fragments:
        assert frag in msgs[0]


def test_bad_quantity_names_document_path_value_and_fix() -> None:
    text = "---\n" + pod_doc([res({"cpu": "500m"}), res({"cpu": "2x", "memory": "1Gi"})], name="train-0")
    (msg,) = errors_of(text)
    line = text.splitlines().index("        cpu: 2x") + 1  # the line of the field itself
    assert line > 2
    assert msg.startswith(f"snap.yaml:{line} (document 1, Pod ns/train-0) spec.containers[1].resources.requests.cpu")
    assert "'2x'" in msg and "write a Kubernetes quantity" in msg


def test_error_lines_follow_keys_with_dots() -> None:
    text = pod_doc(
        [res({"cpu": "1", "nvidia.com/gpu": "0.5"})],
        annotations={"gpuscale.io/gang": "g", "gpuscale.io/gang-size": "many"},
    )
    lines = text.splitlines()
    msgs = errors_of(text)
    gpu_line = lines.index("        nvidia.com/gpu: '0.5'") + 1
    gang_line = lines.index("    gpuscale.io/gang-size: many") + 1
    assert any(m.startswith(f"snap.yaml:{gpu_line} ") and "requests.nvidia.com/gpu:" in m for m in msgs), msgs
    assert any(m.startswith(f"snap.yaml:{gang_line} ") and "gpuscale.io/gang-size:" in m for m in msgs), msgs


def test_unmodelled_resources_are_notes() -> None:
    notes: list[str] = []
    snap = parse(pod_doc([res({"cpu": "1", "ephemeral-storage": "1Gi", "amd.com/gpu": 1})]), notes=notes)
    assert snap.pods[0].request == Request(1000)
    assert "resource 'ephemeral-storage' is not modelled; ignored" in notes
    assert "resource 'amd.com/gpu' is not modelled; ignored" in notes


def test_resources_typo_is_an_error() -> None:
    (msg,) = errors_of(pod_doc([{"name": "c", "resources": {"request": {"cpu": "1"}}}]))
    assert "spec.containers[0].resources.request" in msg and "did you mean requests" in msg


# ----------------------------------------------------------------------------------------- affinity, tolerations


def _affinity_pod(*terms: list[dict[str, Any]], fields: list[dict[str, Any]] | None = None) -> str:
    term_objs: list[dict[str, Any]] = [{"matchExpressions": t} for t in terms]
    if fields is not None:
        term_objs.append({"matchFields": fields})
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": term_objs}}}
    return pod_doc([res({"cpu": "1"})], spec={"affinity": aff})


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ({"key": "a", "operator": "In", "values": ["x", "y"]}, Requirement("a", SelectorOperator.IN, ("x", "y"))),
        ({"key": "a", "operator": "NotIn", "values": ["x"]}, Requirement("a", SelectorOperator.NOT_IN, ("x",))),
        ({"key": "a", "operator": "Exists"}, Requirement("a", SelectorOperator.EXISTS)),
        ({"key": "a", "operator": "DoesNotExist", "values": []}, Requirement("a", SelectorOperator.DOES_NOT_EXIST)),
        ({"key": "n", "operator": "Gt", "values": ["3"]}, Requirement("n", SelectorOperator.GT, ("3",))),
        ({"key": "n", "operator": "Lt", "values": ["-2"]}, Requirement("n", SelectorOperator.LT, ("-2",))),
    ],
)
def test_affinity_operators(expr: dict[str, Any], expected: Requirement) -> None:
    snap = parse(_affinity_pod([expr]))
    (term,) = snap.pods[0].affinity
    assert term.requirements == (expected,)


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ({"key": "a", "operator": "In"}, "operator In needs at least one value"),
        ({"key": "a", "operator": "NotIn", "values": []}, "operator NotIn needs at least one value"),
        ({"key": "a", "operator": "Exists", "values": ["x"]}, "operator Exists takes no values"),
        ({"key": "a", "operator": "DoesNotExist", "values": ["x"]}, "operator DoesNotExist takes no values"),
        ({"key": "n", "operator": "Gt", "values": ["1", "2"]}, "operator Gt needs exactly one value"),
        ({"key": "n", "operator": "Lt", "values": ["abc"]}, "operator Lt compares integers"),
        ({"key": "n", "operator": "Gt"}, "operator Gt needs exactly one value"),
        ({"key": "a", "operator": "Equals", "values": ["x"]}, "operator: is not a valid value (got 'Equals')"),
        ({"key": "a", "operator": "in", "values": ["x"]}, "did you mean In"),
        ({"key": "a", "operator": "In", "value": ["x"]}, "matchExpressions[0].value: unknown field"),
        ({"operator": "Exists"}, "matchExpressions[0].key: is required"),
        ({"key": "a", "operator": "In", "values": "x"}, "values: must be a list"),
        ({"key": "a", "operator": "In", "values": [3]}, 'quote it: "3"'),
    ],
)
def test_affinity_validation(expr: dict[str, Any], fragment: str) -> None:
    msgs = errors_of(_affinity_pod([expr]))
    assert any(fragment in m for m in msgs), msgs
    assert all("requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]" in m for m in msgs)


def test_affinity_terms_are_kept_separately_and_match_fields_become_hostname() -> None:
    snap = parse(
        _affinity_pod(
            [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "In", "values": ["1"]}],
            [{"key": "c", "operator": "DoesNotExist"}],
            fields=[{"key": "metadata.name", "operator": "In", "values": ["node-7"]}],
        )
    )
    terms = snap.pods[0].affinity
    assert [len(t.requirements) for t in terms] == [2, 1, 1]
    assert terms[2].requirements[0] == Requirement(L.HOSTNAME, SelectorOperator.IN, ("node-7",))


def test_match_fields_other_than_name_are_errors() -> None:
    msgs = errors_of(_affinity_pod(fields=[{"key": "spec.unschedulable", "operator": "In", "values": ["x"]}]))
    assert any("matchFields supports only metadata.name" in m for m in msgs)


@pytest.mark.parametrize(
    ("tol", "expected"),
    [
        ({"operator": "Exists"}, Toleration("", "Exists")),
        ({"key": "a", "value": "b"}, Toleration("a", "Equal", "b")),
        (
            {"key": "a", "operator": "Equal", "value": "b", "effect": "NoSchedule"},
            Toleration("a", "Equal", "b", TaintEffect.NO_SCHEDULE),
        ),
        (
            {"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            Toleration("a", "Exists", "", TaintEffect.NO_EXECUTE),
        ),
        ({"key": "a", "operator": "Exists", "effect": ""}, Toleration("a", "Exists")),
        ({"key": "a", "effect": "PreferNoSchedule"}, Toleration("a", "Equal", "", TaintEffect.PREFER_NO_SCHEDULE)),
    ],
)
def test_tolerations(tol: dict[str, Any], expected: Toleration) -> None:
    snap = parse(pod_doc([res()], spec={"tolerations": [tol]}))
    assert snap.pods[0].tolerations == (expected,)


@pytest.mark.parametrize(
    ("tol", "fragment"),
    [
        ({"key": "a", "operator": "Exists", "value": "b"}, "tolerations[0].value: must be empty with operator Exists"),
        ({"value": "b"}, "tolerations[0].operator: an empty key needs operator Exists"),
        ({"key": "a", "effect": "NoSchedul"}, "did you mean NoSchedule"),
        ({"key": "a", "operater": "Exists"}, "tolerations[0].operater: unknown field"),
        ({"key": "a", "operator": "exists"}, "did you mean Exists"),
        ({"key": "a", "tolerationSeconds": "30"}, "tolerationSeconds: must be an integer"),
    ],
)
def test_toleration_validation(tol: dict[str, Any], fragment: str) -> None:
    msgs = errors_of(pod_doc([res()], spec={"tolerations": [tol]}))
    assert any(fragment in m for m in msgs), msgs


def test_pod_scheduling_fields() -> None:
    snap = parse(
        pod_doc(
            [res({"cpu": "1"})],
            spec={"nodeSelector": {"nvidia.com/gpu.product": "A10"}, "priority": 100, "nodeName": "n1"},
            labels={"app": "x"},
            annotations={"gpuscale.io/gang": "g", "gpuscale.io/gang-size": "1"},
            ownerReferences=[{"kind": "DaemonSet", "name": "ds"}],
        )
        + "status: {phase: Running}\n"
    )
    (pod,) = snap.pods
    assert pod.key == "ns/p"
    assert dict(pod.node_selector) == {"nvidia.com/gpu.product": "A10"}
    assert (pod.priority, pod.node_name, pod.phase, pod.is_daemonset) == (100, "n1", "Running", True)
    assert (pod.gang, pod.gang_size, dict(pod.labels)) == ("g", 1, {"app": "x"})
    assert not pod.pending


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({"gpuscale.io/gang": "g"}, "gang-size: is required with gpuscale.io/gang"),
        ({"gpuscale.io/gang": "g", "gpuscale.io/gang-size": "two"}, "must be a positive integer"),
        ({"gpuscale.io/gang": "g", "gpuscale.io/gang-size": "0"}, "must be a positive integer"),
        ({"gpuscale.io/gang-size": "2"}, "is set but gpuscale.io/gang is not"),
    ],
)
def test_gang_annotation_validation(annotations: dict[str, str], fragment: str) -> None:
    msgs = errors_of(pod_doc([res()], annotations=annotations))
    assert any(fragment in m for m in msgs), msgs


def test_gang_sizes_must_agree() -> None:
    a = pod_doc([res()], name="a", annotations={"gpuscale.io/gang": "g", "gpuscale.io/gang-size": "2"})
    b = pod_doc([res()], name="b", annotations={"gpuscale.io/gang": "g", "gpuscale.io/gang-size": "3"})
    (msg,) = errors_of(a + "---\n" + b)
    assert "gang 'g' has gang-size 3 here but 2 on pod ns/a" in msg and "document 2" in msg


def test_non_string_node_selector_value_says_to_quote() -> None:
    (msg,) = errors_of(pod_doc([res()], spec={"nodeSelector": {"gpu": True}}))
    assert "spec.nodeSelector.gpu: must be a string, not a boolean" in msg and 'quote it: "true"' in msg


def test_completed_and_gated_pods_and_other_kinds_are_skipped_with_notes() -> None:
    done = pod_doc([res()], name="done") + "status: {phase: Succeeded}\n"
    failed = pod_doc([res()], name="failed") + "status: {phase: Failed}\n"
    gated = pod_doc([res()], name="gated", spec={"schedulingGates": [{"name": "wait"}]})
    svc = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n"
    notes: list[str] = []
    snap = parse("---\n".join([done, failed, gated, svc, svc]), notes=notes)
    assert snap.pods == ()
    assert notes == [
        "ignored completed pods (phase Succeeded)",
        "ignored completed pods (phase Failed)",
        "ignored pending pods with spec.schedulingGates (not ready for scheduling)",
        "ignored Service objects (not read by gpuscale) (x2)",
    ]


def test_bad_phase_is_an_error() -> None:
    msgs = errors_of(pod_doc([res()]) + "status: {phase: Runing}\n")
    assert any("status.phase: is not a valid value (got 'Runing'); did you mean Running" in m for m in msgs)


# ------------------------------------------------------------------------------------------------------- nodes


NODE = """\
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels:
    gpuscale.io/pool: gpu
    node.kubernetes.io/instance-type: gpu-a10-4
    topology.kubernetes.io/zone: zone-b
    gpuscale.io/capacity-type: spot
spec:
  unschedulable: true
  taints:
    - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
status:
  capacity: {cpu: "32", memory: 128Gi}
  allocatable: {cpu: 31850m, memory: 130000000Ki, nvidia.com/gpu: "4", pods: "58", hugepages-1Gi: "0"}
"""


def test_node() -> None:
    (node,) = parse(NODE).nodes
    assert node.name == "n1"
    assert node.allocatable == Resources(cpu_milli=31850, memory_mib=126953, gpus=4, pods=58)
    assert node.taints == (Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present"),)
    assert node.unschedulable and node.pool == "gpu"
    assert node.hourly_cost == pytest.approx(1.6)  # the spot offering in zone-b


def test_node_capacity_fallback_and_default_pods() -> None:
    text = "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {capacity: {cpu: 4, memory: 8Gi}}\n"
    (node,) = parse(text).nodes
    assert node.allocatable == Resources(4000, 8192, 0, 110)
    assert node.pool is None and node.hourly_cost == 0.0


@pytest.mark.parametrize(
    ("status", "fragment"),
    [
        ("{}", "status.allocatable: is required"),
        ("{allocatable: {cpu: 4}}", "status.allocatable.memory: is required"),
        ("{allocatable: {cpu: 4x, memory: 1Gi}}", "status.allocatable.cpu: not a valid quantity (got '4x')"),
        ("{allocatable: {cpu: 4, memory: 1Gi, nvidia.com/gpu: 1.5}}", "nvidia.com/gpu: must be a whole number"),
    ],
)
def test_node_validation(status: str, fragment: str) -> None:
    msgs = errors_of(f"apiVersion: v1\nkind: Node\nmetadata: {{name: n}}\nstatus: {status}\n")
    assert any(fragment in m for m in msgs), msgs


def test_node_taint_validation() -> None:
    text = NODE.replace("effect: NoSchedule", "effect: NoScheduling")
    (msg,) = errors_of(text)
    assert "(document 1, Node n1) spec.taints[0].effect: is not a valid value (got 'NoScheduling')" in msg


# -------------------------------------------------------------------------------------------------- List kind


def test_list_and_multi_document_mixed() -> None:
    node = yaml.safe_load(NODE)
    pod = yaml.safe_load(pod_doc([res({"cpu": "1"})], name="a"))
    listing = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [node, pod]}, sort_keys=False)
    pod_list = yaml.safe_dump({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []})
    snap = parse(listing + "---\n" + pod_doc([res()], name="b") + "---\n" + pod_list)
    assert [p.name for p in snap.pods] == ["a", "b"]
    assert [n.name for n in snap.nodes] == ["n1"]


def test_list_item_errors_name_the_item_and_its_line() -> None:
    text = """\
    apiVersion: v1
    kind: List
    items:
      - apiVersion: v1
        kind: Pod
        metadata: {name: ok}
        spec: {containers: [{name: c}]}
      - apiVersion: v1
        kind: Pod
        metadata: {name: bad}
        spec:
          containers:
            - name: c
              resources: {requests: {memory: 1Gb}}
    """
    (msg,) = errors_of(text)
    assert msg.startswith("snap.yaml:14 (document 1, items[1], Pod default/bad) ")
    assert "spec.containers[0].resources.requests.memory: not a valid quantity (got '1Gb')" in msg


def test_parse_documents_from_objects() -> None:
    docs = [yaml.safe_load(NODE), None, yaml.safe_load(pod_doc([res({"memory": "1Gi"})]))]
    snap = parse_documents(docs, source="api", catalog=CATALOG, now=NOW)
    assert len(snap.nodes) == 1 and snap.pods[0].request == Request(0, 1024)
    with pytest.raises(InputError, match=r"api \(document 2, Pod ns/p\) spec.containers\[0\].resources.requests.cpu"):
        parse_documents([None, yaml.safe_load(pod_doc([res({"cpu": "x"})]))], source="api", catalog=CATALOG, now=NOW)


# ------------------------------------------------------------------------------------------------------- pools


FULL_POOL = """\
apiVersion: gpuscale.io/v1alpha1
kind: GPUNodePool
metadata: {name: a10}
spec:
  instanceTypes: [gpu-a10-1, gpu-a10-4]
  requirements:
    - {key: nvidia.com/gpu.count, operator: Lt, values: ["8"]}
    - {key: gpuscale.io/capacity-type, operator: In, values: [spot, on-demand]}
  labels: {team: ml}
  taints:
    - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
  minNodes: 1
  maxNodes: 10
  limits: {cpu: "100", memory: 1Ti, nvidia.com/gpu: 32}
  weight: 50
  capacityTypes: [spot, on-demand]
  zones: [zone-a]
  daemonsetOverhead: {cpu: 300m, memory: 600Mi, pods: 3}
  allowSpotFallback: false
  disruption:
    consolidationPolicy: WhenEmpty
    consolidateAfter: 5m
    consolidateEmptyAfter: 30m
    utilizationThreshold: 0.3
    useMeasuredGpuUtilization: true
    budgets:
      - nodes: "20%"
      - nodes: "2"
        schedule: "@daily"
        duration: 1h30m
        reasons: [Empty, Drifted]
"""


def test_full_pool() -> None:
    (pool,) = parse(FULL_POOL).pools
    assert pool.name == "a10"
    assert pool.instance_types == ("gpu-a10-1", "gpu-a10-4")
    assert pool.requirements == (
        Requirement(L.GPU_COUNT, SelectorOperator.LT, ("8",)),
        Requirement(L.CAPACITY_TYPE, SelectorOperator.IN, ("spot", "on-demand")),
    )
    assert dict(pool.labels) == {"team": "ml"}
    assert pool.taints == (Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present"),)
    assert (pool.min_nodes, pool.max_nodes, pool.weight) == (1, 10, 50)
    assert pool.limits == PoolLimits(cpu_milli=100_000, memory_mib=1024 * 1024, gpus=32)
    assert pool.capacity_types == (CapacityType.SPOT, CapacityType.ON_DEMAND)
    assert pool.zones == ("zone-a",)
    assert pool.daemonset_overhead == Resources(cpu_milli=300, memory_mib=600, gpus=0, pods=3)
    assert pool.allow_spot_fallback is False
    d = pool.disruption
    assert d.consolidation_policy is ConsolidationPolicy.WHEN_EMPTY
    assert (d.consolidate_after_s, d.utilization_threshold, d.use_measured_gpu_utilization) == (300.0, 0.3, True)
    assert d.consolidate_empty_after_s == 1800.0
    assert (d.wait_s(empty=True), d.wait_s(empty=False)) == (1800.0, 300.0)
    assert d.budgets == (
        DisruptionBudget(nodes="20%"),
        DisruptionBudget(nodes="2", schedule="@daily", duration_s=5400.0, reasons=("Empty", "Drifted")),
    )


def test_minimal_pool_defaults() -> None:
    (pool,) = parse("apiVersion: gpuscale.io/v1alpha1\nkind: GPUNodePool\nmetadata: {name: p}\n").pools
    assert pool.instance_types == () and pool.max_nodes is None and pool.limits == PoolLimits()
    assert pool.daemonset_overhead == Resources(pods=0)
    assert pool.disruption.budgets == (DisruptionBudget(),)
    assert pool.disruption.consolidate_empty_after_s is None
    assert pool.disruption.wait_s(empty=True) == pool.disruption.consolidate_after_s == 30.0


def test_consolidate_after_never_and_empty_budgets() -> None:
    text = FULL_POOL.replace("consolidateAfter: 5m", "consolidateAfter: Never")
    text = text.replace("consolidateEmptyAfter: 30m", "consolidateEmptyAfter: Never")
    text = text[: text.index("    budgets:")] + "    budgets: []\n"
    (pool,) = parse(text).pools
    assert pool.disruption.consolidate_after_s == math.inf
    assert pool.disruption.consolidate_empty_after_s == math.inf
    assert pool.disruption.budgets == ()


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("  maxNodes: 10", "  maxNode: 10", "spec.maxNode: unknown field (got 'maxNode'); did you mean maxNodes"),
        ("gpu-a10-4]", "gpu-a10-8]", "spec.instanceTypes[1]: is not an instance type of the catalog in pool 'a10'"),
        ("gpu-a10-4]", "gpu-a10-8]", "close matches: gpu-a10-4, gpu-a10-1"),
        ("metadata: {name: a10}", "metadata: {labels: {a: b}}", "metadata.name: is required"),
        ("metadata: {name: a10}", "metadata: {name: A10_pool}", "metadata.name: must be a valid label value"),
        ("key: nvidia.com/gpu.count", "key: nvidia.com/gpu.cnt", "is not a label known before a node exists"),
        ("key: nvidia.com/gpu.count", "key: nvidia.com/gpu.cnt", "did you mean nvidia.com/gpu.count"),
        ("operator: Lt", "operator: LessThan", "spec.requirements[0].operator: is not a valid value"),
        ("labels: {team: ml}", "labels: {nvidia.com/gpu.product: A10}", "is set by gpuscale from the instance type"),
        ("  maxNodes: 10", "  maxNodes: 0", "spec.maxNodes: is below spec.minNodes (1)"),
        ("weight: 50", "weight: 500", "spec.weight: must be <= 100"),
        ("weight: 50", "weight: '50'", "spec.weight: must be an integer, not a string"),
        (
            "[spot, on-demand]\n  zones",
            "[Spot]\n  zones",
            "spec.capacityTypes[0]: is not a valid value (got 'Spot'); did you mean spot?",
        ),
        ("zones: [zone-a]", "zones: [zone-c]", "spec.zones[0]: is not a zone of any offering in the catalog"),
        ("memory: 1Ti", "memory: 1TB", "spec.limits.memory: not a valid quantity (got '1TB')"),
        ("nvidia.com/gpu: 32", "gpus: 32", "spec.limits.gpus: unknown field"),
        ("cpu: 300m", "cpus: 300m", "spec.daemonsetOverhead.cpus: unknown field (got 'cpus'); did you mean cpu"),
        ("allowSpotFallback: false", "allowSpotFallback: no-thanks", "must be true or false"),
        ("consolidationPolicy: WhenEmpty", "consolidationPolicy: Empty", "did you mean WhenEmpty"),
        (
            "consolidateAfter: 5m",
            "consolidateAfter: 5 minutes",
            "spec.disruption.consolidateAfter: not a valid duration",
        ),
        (
            "consolidateEmptyAfter: 30m",
            "consolidateEmptyAfter: half an hour",
            "spec.disruption.consolidateEmptyAfter: not a valid duration",
        ),
        ("utilizationThreshold: 0.3", "utilizationThreshold: 30", "must be between 0.0 and 1.0"),
        ('nodes: "20%"', 'nodes: "120%"', "spec.disruption.budgets[0].nodes: must be a node count or a percentage"),
        ('nodes: "2"', "nodes: 2", 'budgets[1].nodes: must be a string, not an integer (got 2); quote it: "2"'),
        ('schedule: "@daily"', 'schedule: "0 25 * * *"', "budgets[1].schedule: hour must be 0..23"),
        ('schedule: "@daily"', 'schedule: "0 9 * *"', "a cron schedule has 5 fields, this has 4"),
        ("        duration: 1h30m\n", "", "budgets[1]: schedule and duration must be set together"),
        ("reasons: [Empty, Drifted]", "reasons: [Empty, Drift]", "budgets[1].reasons[1]: is not a valid value"),
        ("  disruption:", "  disrupton:", "spec.disrupton: unknown field"),
        ("apiVersion: gpuscale.io/v1alpha1", "apiVersion: gpuscale.io/v1", "apiVersion: a GPUNodePool has apiVersion"),
        ("metadata: {name: a10}", "metadata: {name: a10}\nstatus2: {}", "status2: unknown field"),
    ],
)
def test_pool_errors(old: str, new: str, fragment: str) -> None:
    assert old in FULL_POOL
    text = FULL_POOL.replace(old, new)
    msgs = errors_of(text)
    hits = [m for m in msgs if fragment in m]
    assert hits, msgs
    assert all("(document 1, GPUNodePool" in m for m in msgs), msgs
    if new:  # the error points at a line of the changed text
        first = text[: text.index(new)].count("\n") + 1
        last = first + new.strip("\n").count("\n")
        line = int(hits[0].split(" ", 1)[0].split(":")[1])
        assert first <= line <= last, (line, first, last, hits[0])


def test_all_pool_errors_are_collected() -> None:
    text = FULL_POOL.replace("maxNodes: 10", "maxNode: 10").replace("weight: 50", "weight: -1")
    text = text.replace("memory: 1Ti", "memory: lots")
    msgs = errors_of(text)
    assert len(msgs) == 3
    assert [m.split(") ", 1)[1].split(":")[0] for m in msgs] == ["spec.maxNode", "spec.weight", "spec.limits.memory"]


@pytest.mark.parametrize(
    ("expr", "ok"),
    [
        ("0 9 * * 1-5", True),
        ("*/15 * * * *", True),
        ("0 0 1 JAN,JUL *", True),
        ("0 22 * * sun", True),
        ("@hourly", True),
        ("60 * * * *", False),
        ("* * 0 * *", False),
        ("* * * * 8", False),
        ("*/0 * * * *", False),
        ("* * * *", False),
        ("a b c d e", False),
    ],
)
def test_cron_validation(expr: str, ok: bool) -> None:
    assert (cron_problem(expr) is None) is ok


def test_duplicate_pools_nodes_and_pods() -> None:
    pool = "apiVersion: gpuscale.io/v1alpha1\nkind: GPUNodePool\nmetadata: {name: p}\n"
    pod = pod_doc([res()])
    msgs = errors_of("---\n".join([pool, pod, pool, NODE, NODE, pod]))
    assert len(msgs) == 3
    assert any("duplicate pod 'ns/p', first defined at snap.yaml:5 (document 2, Pod ns/p)" in m for m in msgs)
    assert any("duplicate node 'n1'" in m for m in msgs)
    assert any("duplicate GPUNodePool 'p'" in m for m in msgs)


def test_crd_schema_matches_the_parser() -> None:
    crd = yaml.safe_load((REPO / "deploy" / "crds" / "gpunodepool.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"]) == (
        "gpuscale.io",
        "v1alpha1",
        "GPUNodePool",
    )
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    # spec.headroom is read beside the pool parser, by the Kubernetes pool loader (gpuscale.kube.policy)
    assert set(spec) == {*pools_mod.SPEC_FIELDS, "headroom"}
    assert set(spec["limits"]["properties"]) == set(pools_mod.LIMIT_FIELDS)
    assert set(spec["daemonsetOverhead"]["properties"]) == set(pools_mod.OVERHEAD_FIELDS)
    assert set(spec["taints"]["items"]["properties"]) == set(pools_mod.POOL_TAINT_FIELDS)
    req = spec["requirements"]["items"]["properties"]
    assert tuple(req["key"]["enum"]) == L.TEMPLATE_KEYS
    assert set(req["operator"]["enum"]) == {str(o) for o in SelectorOperator}
    disruption = spec["disruption"]["properties"]
    assert set(disruption) == set(pools_mod.DISRUPTION_FIELDS)
    assert set(disruption["consolidationPolicy"]["enum"]) == {str(p) for p in ConsolidationPolicy}
    budget = disruption["budgets"]["items"]["properties"]
    assert set(budget) == set(pools_mod.BUDGET_FIELDS)
    assert tuple(budget["reasons"]["items"]["enum"]) == pools_mod.BUDGET_REASONS
    assert set(spec["capacityTypes"]["items"]["enum"]) == {str(c) for c in CapacityType}
    oa = yaml.safe_load((REPO / "deploy" / "crds" / "offeringavailability.yaml").read_text())
    entry = oa["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["unavailable"]
    assert set(entry["items"]["properties"]) == set(ENTRY_FIELDS)


def test_example_pools_validate_against_the_crd_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    crd = yaml.safe_load((REPO / "deploy" / "crds" / "gpunodepool.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pools = [
        d
        for d in yaml.safe_load_all((REPO / "examples" / "snapshot.yaml").read_text())
        if d and d["kind"] == "GPUNodePool"
    ]
    pools.append(yaml.safe_load(FULL_POOL))
    assert len(pools) == 4
    for doc in pools:
        jsonschema.validate(doc, schema)
    bad = yaml.safe_load(FULL_POOL.replace("weight: 50", "weight: 500"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


# ----------------------------------------------------------------------------------------- OfferingAvailability


def _availability(*entries: str) -> str:
    body = "".join(f"    - {e}\n" for e in entries)
    head = "apiVersion: gpuscale.io/v1alpha1\nkind: OfferingAvailability\nmetadata: {name: oa}\n"
    return f"{head}spec:\n  unavailable:\n{body}"


def test_offering_availability() -> None:
    snap = parse(
        _availability(
            '{instanceType: gpu-l4-1, zone: zone-a, capacityType: on-demand, until: "2025-06-15T16:26:40Z"}',
            "{instanceType: gpu-a10-1, zone: zone-b, capacityType: spot, until: 15m}",
            "{instanceType: gpu-a10-4, zone: zone-a, until: 90}",
            "{instanceType: gpu-a10-1, zone: zone-b, capacityType: spot, until: 5m}",
            "{instanceType: gpu-l4-1, zone: zone-a, capacityType: spot, until: 2025-06-15T17:00:00+01:00}",
        )
    )
    spot, od = CapacityType.SPOT, CapacityType.ON_DEMAND
    assert snap.unavailable == {
        OfferingKey("gpu-l4-1", "zone-a", od): 1_750_004_800.0,
        OfferingKey("gpu-a10-1", "zone-b", spot): NOW + 900,
        OfferingKey("gpu-a10-4", "zone-a", od): NOW + 90,
        OfferingKey("gpu-a10-4", "zone-a", spot): NOW + 90,
        OfferingKey("gpu-l4-1", "zone-a", spot): 1_750_003_200.0,
    }


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("{instanceType: gpu-a10-2, until: 5m}", "spec.unavailable[0].instanceType: is not an instance type"),
        ("{instanceType: gpu-a10-1, until: 2025-06-15T16:26:40}", "until: has no time zone"),
        ('{instanceType: gpu-a10-1, until: "2025-06-15T16:26:40"}', 'append "Z" for UTC'),
        ("{instanceType: gpu-a10-1, until: soon}", "until: is neither an RFC 3339 time nor a duration (got 'soon')"),
        ("{instanceType: gpu-a10-1, until: -5}", "until: must not be negative"),
        ("{instanceType: gpu-a10-1}", "until: is required"),
        ("{instanceType: gpu-a10-1, capacityType: reserved, until: 5m}", "capacityType: is not a valid value"),
        ("{instanceType: gpu-l4-1, zone: zone-b, until: 5m}", "matches no offering of gpu-l4-1"),
        ("{instanceType: gpu-a10-1, until: 5m, zones: [a]}", "spec.unavailable[0].zones: unknown field"),
    ],
)
def test_offering_availability_errors(entry: str, fragment: str) -> None:
    msgs = errors_of(_availability(entry))
    assert any(fragment in m for m in msgs), msgs
    assert all("(document 1, OfferingAvailability oa)" in m for m in msgs)


# ------------------------------------------------------------------------------------------ document-level errors


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: a\n", "snap.yaml:"),
        ("a: [1, 2\n", "YAML syntax error"),
        ("apiVersion: v1\nkind: Node\nkind: Pod\n", "found duplicate key 'kind'"),
        ("- 1\n- 2\n", "a document must be a Kubernetes object"),
        ("apiVersion: v1\nmetadata: {name: x}\n", "kind: is required"),
        ("apiVersion: v2\nkind: Pod\n", "apiVersion: a Pod has apiVersion v1 (got 'v2')"),
        ("apiVersion: v1\nkind: List\nitems: {a: 1}\n", "items: must be a list"),
    ],
)
def test_document_errors(text: str, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse(text)
    assert fragment in str(info.value)


def test_yaml_syntax_error_has_line_number() -> None:
    text = pod_doc([res()]) + "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: [unclosed\n"
    with pytest.raises(InputError) as info:
        parse(text)
    lines = len(pod_doc([res()]).splitlines())
    assert str(info.value).startswith(f"snap.yaml:{lines + 6}:")


def test_all_errors_of_a_file_are_reported_at_once() -> None:
    text = "---\n".join(
        [
            pod_doc([res({"cpu": "2x"})], name="a"),
            pod_doc([res({"memory": "lots"})], name="b"),
            "apiVersion: gpuscale.io/v1alpha1\nkind: GPUNodePool\nmetadata: {}\nspec: {maxNodes: -1}\n",
            pod_doc([res({"cpu": "1"})], name="fine"),
        ]
    )
    with pytest.raises(InputError) as info:
        parse(text)
    message = str(info.value)
    assert message.startswith("4 problems in snap.yaml:")
    for frag in (
        "Pod ns/a) spec.containers[0].resources.requests.cpu",
        "Pod ns/b) spec.containers[0].resources.requests.memory",
        "metadata.name: is required",
        "spec.maxNodes: must be >= 0 (got -1)",
    ):
        assert frag in message


def test_load_snapshot_file_directory_and_missing(tmp_path: Path) -> None:
    (tmp_path / "a-nodes.yaml").write_text(NODE)
    (tmp_path / "b-pods.yml").write_text(pod_doc([res({"cpu": "1"})]))
    (tmp_path / "notes.txt").write_text("not yaml: [")
    snap = load_snapshot(tmp_path, catalog=CATALOG, now=NOW)
    assert (len(snap.nodes), len(snap.pods)) == (1, 1)
    assert load_snapshot(tmp_path / "a-nodes.yaml", catalog=CATALOG, now=NOW).nodes == snap.nodes
    with pytest.raises(InputError, match="snapshot file not found"):
        load_snapshot(tmp_path / "nope.yaml", catalog=CATALOG, now=NOW)
    (tmp_path / "c-bad.yaml").write_text(pod_doc([res({"cpu": "2x"})]))
    with pytest.raises(InputError, match=r"c-bad.yaml:\d+ \(document 1, Pod ns/p\) spec.containers\[0\]"):
        load_snapshot(tmp_path, catalog=CATALOG, now=NOW)


# ------------------------------------------------------------------------------------------------------ example


def test_example_snapshot_loads_with_the_linode_catalog() -> None:
    catalogs = pytest.importorskip("gpuscale.catalogs")
    try:
        catalog = catalogs.load_catalog("linode")
    except InputError as exc:  # the shared price data is not present
        pytest.skip(str(exc))
    notes: list[str] = []
    snap = load_snapshot(REPO / "examples" / "snapshot.yaml", catalog=catalog, now=NOW, notes=notes)
    assert [p.name for p in snap.pools] == ["ada", "rtx6000", "inference"]
    assert len(snap.nodes) == 3
    pending = [p for p in snap.pods if p.pending]
    assert len(pending) == 15
    by_name = {p.name: p for p in snap.pods}
    assert by_name["train-vit-4gpu"].request == Request(16000, 102400, gpus=4)  # init container peak memory
    assert by_name["embed-api-7d9f8"].request.gpu_milli == 350
    assert by_name["metrics-exporter-2xq9d"].request == Request(500, 1024)
    assert {p.name for p in snap.pods if p.gang == "ddp-bert"} == {"ddp-worker-0", "ddp-worker-1"}
    assert by_name["nvidia-device-plugin-x9z2q"].is_daemonset
    gpu_node = next(n for n in snap.nodes if n.pool == "rtx6000")
    assert gpu_node.hourly_cost == pytest.approx(3.0) and gpu_node.allocatable.gpus == 2
    assert snap.unavailable == {OfferingKey("g2-gpu-rtx4000a2-s", "us-ord", CapacityType.ON_DEMAND): NOW + 1800}
    assert "ignored Deployment objects (not read by gpuscale)" in notes
