"""The cache's compact pod record: every reader of the cache reads the same from it as from the full object, common
parts are stored once, and the cache keeps records (listed in pages and watched)."""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuscale.core import labels as L
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.backend import is_pending
from gpuscale.kube.cache import WATCHED, KubeCache
from gpuscale.kube.podrecord import SharedParts, compact_pod
from gpuscale.manifests.pods import read_pod
from gpuscale.manifests.problems import Doc, Notes
from kube_harness import client_for

pytest.importorskip("lightkube")


def full_pod(name: str, **over: Any) -> dict[str, Any]:
    """A pod as the API server sends it: most of it is nothing gpuscale reads."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "resourceVersion": "42",
            "generateName": "train-",
            "creationTimestamp": "2026-11-24T00:00:00Z",
            "labels": {"app": "train", "pod-template-hash": "abc"},
            "annotations": {L.GANG_ANNOTATION: "g1", "gpuscale.io/gang-size": "2", "note": "x" * 500},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "train-abc",
                    "uid": "rs-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "command": ["python", "train.py"],
                    "env": [{"name": f"E{i}", "value": "v" * 40} for i in range(20)],
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "initContainers": [
                {
                    "name": "proxy",
                    "image": "proxy:1",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
                },
                {"name": "fetch", "image": "fetch:1", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}},
            ],
            "nodeSelector": {L.GPU_PRODUCT: "RTX4000-Ada"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": L.ZONE, "operator": "In", "values": ["us-ord", "us-sea"]}]}
                        ]
                    }
                }
            },
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priority": 1000,
            "priorityClassName": "high",
            "overhead": {"cpu": "100m"},
            "volumes": [{"name": "data", "emptyDir": {}}],
            "serviceAccountName": "default",
        },
        "status": {
            "phase": "Pending",
            "nominatedNodeName": "gpu-1",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available",
                    "lastTransitionTime": "2026-11-24T00:00:01Z",
                },
            ],
            "qosClass": "Burstable",
        },
    }
    for path, value in over.items():
        section, _, key = path.partition("__")
        if key:
            pod[section][key] = value
        else:
            pod[section] = value
    return pod


def read(obj: dict[str, Any]) -> tuple[Any, list[str], list[str]]:
    doc, notes = Doc(source="cluster", index=1, line=None, problems=[], kind="Pod"), Notes()
    return read_pod(doc, obj, notes), [str(p) for p in doc.problems], sorted(notes.counts)


VARIANTS = {
    "pending gang pod": full_pod("a"),
    "bound and running": full_pod("b", spec__nodeName="gpu-1", status={"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastProbeTime": None}]}),
    "daemonset pod": full_pod("c", metadata={"name": "c", "namespace": "kube-system", "ownerReferences": [
        {"kind": "DaemonSet", "name": "dp", "apiVersion": "apps/v1"}]}),
    "completed": full_pod("d", status={"phase": "Succeeded"}),
    "gated": full_pod("e", spec__schedulingGates=[{"name": "wait"}]),
    "pod-level resources": full_pod("f", spec__resources={"requests": {"cpu": "3", "memory": "2Gi"}}),
    "fractional and whole GPUs (a problem)": full_pod("g", spec__containers=[
        {"name": "m", "resources": {"requests": {"nvidia.com/gpu": "1", "gpuscale.io/gpu-milli": "500"}}}]),
    "spec not a mapping": full_pod("h", spec=["bad"]),
    "no containers": full_pod("i", spec__containers=[]),
    "bad toleration": full_pod("j", spec__tolerations=[{"operator": "Sideways"}]),
    "deleting": full_pod("k", metadata={"name": "k", "namespace": "ml", "deletionTimestamp": "2026-11-24T01:00:00Z"}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_reader_reads_the_same_from_the_record(name: str) -> None:
    obj = VARIANTS[name]
    rec = compact_pod(copy.deepcopy(obj), SharedParts())
    assert read(rec) == read(obj)
    assert is_pending(rec) == is_pending(obj)
    for section, keys in (("metadata", ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")),
                          ("status", ("phase", "nominatedNodeName"))):  # fmt: skip
        if isinstance(obj.get(section), dict):
            assert {k: rec[section].get(k) for k in keys} == {k: obj[section].get(k) for k in keys}
    ready = [(c.get("type"), c.get("status")) for c in (obj.get("status") or {}).get("conditions") or []]
    assert [(c.get("type"), c.get("status")) for c in (rec.get("status") or {}).get("conditions") or []] == ready


def test_the_record_drops_what_nothing_reads_and_shares_common_parts() -> None:
    shared = SharedParts()
    a, b = compact_pod(full_pod("a"), shared), compact_pod(full_pod("b"), shared)
    assert set(a) == {"metadata", "spec", "status"}
    assert "image" not in a["spec"]["containers"][0] and "env" not in a["spec"]["containers"][0]
    assert "volumes" not in a["spec"] and "managedFields" not in a["metadata"]
    assert "message" not in a["status"]["conditions"][0]
    assert a["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-abc",
                                                 "uid": "rs-1", "controller": True}]  # fmt: skip
    for path in (("spec", "containers"), ("spec", "affinity"), ("spec", "tolerations"), ("metadata", "labels"),
                 ("metadata", "annotations"), ("metadata", "ownerReferences"), ("status",)):  # fmt: skip
        x, y = a, b
        for k in path:
            x, y = x[k], y[k]
        assert x is y, path  # stored once
    assert a["metadata"]["name"] == "a" and b["metadata"]["uid"] == "uid-b"
    other = compact_pod(full_pod("c", metadata={"name": "c", "namespace": "ml", "labels": {"app": "other"}}), shared)
    assert other["metadata"]["labels"] == {"app": "other"}  # an equal hash is not enough: values are compared


def test_parts_no_record_uses_leave_the_table() -> None:
    shared = SharedParts()
    records = [compact_pod(full_pod(f"p{i}"), shared) for i in range(3)]
    held = len(shared)
    assert held > 0
    unique = compact_pod(full_pod("u", metadata={"name": "u", "labels": {"only": "u"}}), shared)
    assert len(shared) == held + 1
    del unique
    gc.collect()
    assert len(shared) == held  # a deleted pod leaves nothing behind
    del records
    gc.collect()
    assert len(shared) == 0


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        yield srv


def test_the_cache_keeps_records_from_the_list_and_the_watch(server: KubeAPIServer) -> None:
    server.create("pods", full_pod("listed"), "ml")
    client = client_for(server)
    cache = KubeCache(client, tuple(w for w in WATCHED if w.name == "pods")).start()
    try:
        cache.wait_synced(10)
        server.create("pods", full_pod("watched"), "ml")
        for _ in range(100):
            if cache.get("pods", "ml/watched") is not None:
                break
            time.sleep(0.05)
        for name in ("listed", "watched"):
            got = cache.get("pods", f"ml/{name}")
            assert got is not None and "image" not in got["spec"]["containers"][0]
            stored = server.get("pods", name, namespace="ml")
            assert stored is not None
            assert read(got) == read(stored)
            assert got["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    finally:
        cache.stop()
        client.close()
