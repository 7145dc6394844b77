"""Right-sizing applied in the cluster, end to end: a real Prometheus holding two days of usage history backfilled with
``promtool tsdb create-blocks-from openmetrics``, the controller process against the emulated API server, and two
over-requested Deployments whose GPUWorkloadScalers opt in to right-sizing.

* ``Recreate``: blocked while the PodDisruptionBudget allows no disruption; then exactly one JSON patch of the pod
  template's CPU and memory requests to targets within the recommended band (the GPU request untouched); no second
  patch inside ``updateInterval`` even when the requests are over-requested again (nor after a restart of the
  controller: the last update is read back from the status); the next one after it;
* ``Off``: never patched, the recommendation in the status and an Event; the GPU advice (a fractional GPU) in both;
* a workload without history: no recommendation, no patch;
* the reader of ``spec.rightsizing`` and the CRD's schema agree.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.core.autoscale.rightsize_update import UpdateMode
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube import API_VERBS, PREFLIGHT_VERBS
from gpuscale.manifests import rightsizing as rz
from gpuscale.manifests.problems import Doc
from gpuscale.manifests.quantity import cpu_milli, memory_mib
from prom_harness import prometheus, tool
from test_kube_scalers_e2e import POOL, World, deployment, scaler

pytest.importorskip("lightkube")

STEP = 60
DAYS = 2
PODS = {"llm-5d8f7c9b4-abcde": ("llm", 0.2, 300), "web-6c9d8f7b5-qwert": ("web", 0.1, 200)}
"""Pod -> (Deployment, CPU cores used, working-set MiB)."""


def _history(start: float) -> str:
    n = DAYS * 86_400 // STEP
    cpu, mem, fb_used, fb_free = [], [], [], []
    for pod, (_, cores, mib) in PODS.items():
        sel = f'namespace="ml",pod="{pod}",container="c"'
        for i in range(n):
            t = f"{start + STEP * i:.0f}"
            cpu.append(f"container_cpu_usage_seconds_total{{{sel}}} {cores * STEP * i:.1f} {t}")
            mem.append(f"container_memory_working_set_bytes{{{sel}}} {(mib + i % 7) * 2**20} {t}")
        dcgm = f'namespace="ml",pod="{pod}",gpu="0",modelName="NVIDIA L4"'
        for i in range(0, n, 10):
            t = f"{start + STEP * i:.0f}"
            fb_used.append(f"DCGM_FI_DEV_FB_USED{{{dcgm}}} 3000 {t}")
            fb_free.append(f"DCGM_FI_DEV_FB_FREE{{{dcgm}}} 19528 {t}")
    lines = ["# TYPE container_cpu_usage_seconds counter", *cpu]
    lines += ["# TYPE container_memory_working_set_bytes gauge", *mem]
    lines += ["# TYPE DCGM_FI_DEV_FB_USED gauge", *fb_used, "# TYPE DCGM_FI_DEV_FB_FREE gauge", *fb_free]
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("rightsize-prom")
    promtool = tool("promtool")
    start = (time.time() // STEP) * STEP - DAYS * 86_400
    om, data = tmp / "history.om", tmp / "data"
    om.write_text(_history(start))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    with prometheus(tmp, [], data=data) as p:
        yield p.url


@pytest.fixture
def world() -> Iterator[World]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", POOL)
        w = World(srv)
        w.clock._now = time.time()  # the history is real time
        try:
            yield w
        finally:
            w.close()


def over_requested(name: str) -> dict[str, Any]:
    d = deployment(name)
    d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {
        "nvidia.com/gpu": "1", "cpu": "2", "memory": "4Gi"}  # fmt: skip
    return d


def _requests(world: World, name: str) -> dict[str, str]:
    d = world.server.get("deployments", name, namespace="ml")
    assert d is not None
    return dict(d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"])


def _check(world: World, advance: float) -> None:
    world.round(advance)
    assert world.proc.scalers is not None
    world.proc.scalers.events.flush()


def test_recreate_patches_once_within_the_band_and_off_only_recommends(world: World, prom_url: str) -> None:
    srv = world.server
    for name in ("llm", "web", "new"):  # "new" has no usage history yet
        srv.create("deployments", over_requested(name), namespace="ml")
    pdb = {"metadata": {"name": "llm-pdb", "namespace": "ml"},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "llm"}}}}  # fmt: skip
    srv.create("poddisruptionbudgets", pdb, namespace="ml")
    srv.patch("poddisruptionbudgets", "llm-pdb", {"status": {"disruptionsAllowed": 0}}, "ml", status=True)
    policy = {"updateInterval": 3600, "historyWindow": 3 * 86_400}
    recreate = scaler("llm", "vector(50)", prom_url, rightsizing={"updateMode": "Recreate", **policy})
    srv.create("gpuworkloadscalers", recreate, namespace="ml")
    fresh = scaler("new", "vector(50)", prom_url, rightsizing={"updateMode": "Recreate", **policy})
    srv.create("gpuworkloadscalers", fresh, namespace="ml")
    srv.create("gpuworkloadscalers", scaler("web", "vector(50)", prom_url, rightsizing=policy), namespace="ml")

    _check(world, 1)
    st = world.status("gpuworkloadscalers", "llm")["rightsizing"]
    assert st["verdict"] == "DisruptionBudget" and "llm-pdb" in st["message"], st
    assert _requests(world, "llm")["cpu"] == "2", "a PDB allowing no disruption blocks the patch"
    (blocked,) = world.events("RightsizeBlocked")
    assert blocked["type"] == "Warning"

    srv.patch("poddisruptionbudgets", "llm-pdb", {"status": {"disruptionsAllowed": 1}}, "ml", status=True)
    _check(world, 301)  # the next check (every 300 s)
    st = world.status("gpuworkloadscalers", "llm")["rightsizing"]
    assert st["verdict"] == "Apply" and st["lastUpdateTime"], st
    (rec,) = st["recommendations"]
    got = _requests(world, "llm")
    assert got["nvidia.com/gpu"] == "1", "the GPU request is never changed"
    assert got["cpu"] == rec["cpu"]["target"] and got["memory"] == rec["memory"]["target"]
    for res, read in (("cpu", cpu_milli), ("memory", memory_mib)):
        lower, target, upper = (read(rec[res][k]) for k in ("lower", "target", "upper"))
        assert lower <= target <= upper, (res, rec)
    assert 200 <= cpu_milli(got["cpu"]) <= 400, "0.2 cores used, 2 requested"
    assert 300 <= memory_mib(got["memory"]) <= 500, "300 MiB used, 4 GiB requested"
    patches = [r for r in srv.requests() if r == ("patch", "deployments.apps")]
    assert len(patches) == 1
    (applied,) = world.events("RightsizeApplied")
    assert "c cpu 2000m -> " in applied["message"] and "c memory 4096Mi -> " in applied["message"]

    # someone puts the old requests back: outside the band again, but inside updateInterval
    srv.patch("deployments", "llm", over_requested("llm"), "ml")
    _check(world, 301)
    assert world.status("gpuworkloadscalers", "llm")["rightsizing"]["verdict"] == "RateLimited"
    assert _requests(world, "llm")["cpu"] == "2"
    assert [r for r in srv.requests() if r == ("patch", "deployments.apps")] == patches
    world.restart()  # a new process reads lastUpdateTime back from the status: still rate-limited
    _check(world, 1)
    assert world.status("gpuworkloadscalers", "llm")["rightsizing"]["verdict"] == "RateLimited"
    assert _requests(world, "llm")["cpu"] == "2"
    _check(world, 3600)  # past the interval: the next change is allowed
    assert _requests(world, "llm")["cpu"] == got["cpu"]

    # updateMode Off (the default): never patched, recommended in the status and an Event
    web = world.status("gpuworkloadscalers", "web")["rightsizing"]
    assert web["updateMode"] == "Off" and web["verdict"] == "Off" and "lastUpdateTime" not in web
    assert _requests(world, "web") == {"nvidia.com/gpu": "1", "cpu": "2", "memory": "4Gi"}
    recs = world.events("RightsizeRecommendation")
    assert recs and all(e["involvedObject"]["name"] == "web" for e in recs)
    # GPU memory: 3000 of 22528 MiB -> a share would do; the advice says so, the GPU request stays
    assert web["gpu"]["verdict"] == "fractional" and web["gpu"]["gpuMilli"] == 200
    advice = {e["involvedObject"]["name"] for e in world.events("GPURightsizeAdvice")}
    assert advice == {"llm", "web"}
    jsonschema = pytest.importorskip("jsonschema")
    for name in ("llm", "web", "new"):  # what the controller writes is what the CRD declares
        jsonschema.validate(world.status("gpuworkloadscalers", name), _crd_schema()["properties"]["status"],
                            format_checker=jsonschema.FormatChecker())  # fmt: skip
    assert world.status("gpuworkloadscalers", "new")["rightsizing"]["verdict"] == "NoRecommendation"
    assert _requests(world, "new")["cpu"] == "2", "no history: nothing to apply"
    assert set(srv.requests()) <= set(API_VERBS) | set(PREFLIGHT_VERBS), "RBAC: nothing beyond the granted verbs"


READER_CASES = [
    ({}, UpdateMode.OFF, None),
    ({"updateMode": "Recreate", "controlledResources": ["memory"], "minAllowed": {"cpu": "100m"},
      "maxAllowed": {"memory": "8Gi"}, "updateInterval": 600}, UpdateMode.RECREATE, None),
    ({"updateMode": "recreate"}, None, "spec.rightsizing.updateMode: is not a valid value"),
    ({"controlledResources": ["gpu"]}, None, "spec.rightsizing.controlledResources[0]: is not a valid value"),
    ({"minAllowed": {"cpu": "2"}, "maxAllowed": {"cpu": "1"}}, None, "spec.rightsizing.maxAllowed.cpu: is below"),
    ({"serverAddress": "prometheus:9090"}, None, "must be an http(s) URL"),
    ({"updateMode": "Off", "interval": 5}, None, "spec.rightsizing.interval: unknown field"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "mode", "error"), READER_CASES)
def test_the_rightsizing_reader(raw: dict[str, Any], mode: UpdateMode | None, error: str | None) -> None:
    doc = Doc("s.yaml", 1, None, [], kind="GPUWorkloadScaler")
    got = rz.read_rightsizing(doc, raw, "http://prom:9090")
    if error is None:
        assert got is not None and got.mode is mode and got.server == "http://prom:9090", doc.problems
    else:
        assert got is None and error in str(doc.problems[0]), doc.problems


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((Path(__file__).resolve().parents[1] / "deploy/crds/gpuworkloadscaler.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_the_crd_schema_follows_the_reader() -> None:
    schema = _crd_schema()
    spec = schema["properties"]["spec"]["properties"]["rightsizing"]
    assert list(spec["properties"]) == list(rz.RIGHTSIZING_FIELDS)
    assert spec["properties"]["updateMode"]["enum"] == list(rz.UPDATE_MODES)
    assert spec["properties"]["controlledResources"]["items"]["enum"] == list(rz.RESOURCE_FIELDS)
    assert spec["properties"]["updateInterval"]["default"] == rz.DEFAULT_UPDATE_INTERVAL_S
    assert spec["properties"]["historyWindow"]["default"] == rz.DEFAULT_HISTORY_S
    for key in ("minAllowed", "maxAllowed"):
        assert list(spec["properties"][key]["properties"]) == list(rz.RESOURCE_FIELDS)
    assert "rightsizing" in schema["properties"]["status"]["properties"]
