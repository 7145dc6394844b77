"""The Kubernetes adapter's pieces: pending-pod rules, PDBs, DaemonSet overhead, Events, provider-id matching, the
kubeconfig, and the Linode provider (on the fake Linode API) with a stand-in kubelet registering its nodes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.controller.backend import Event
from gpuscale.controller.loop import ControllerConfig
from gpuscale.core.model import NodePool, Taint, TaintEffect
from gpuscale.errors import InputError
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.fakes.linode_api import FakeLinodeAPI
from gpuscale.kube.backend import daemonset_overhead, is_pending
from gpuscale.kube.command import ControllerProcess
from gpuscale.kube.events import BURST, EventRecorder, kube_reason, redact
from gpuscale.kube.matching import ProviderIdMatcher
from gpuscale.providers.linode import LinodeConfig, LinodeProvider
from kube_harness import Scheduler, client_for, kubeconfig_for

pytest.importorskip("lightkube")

CATALOG = load_catalog("linode")


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        yield srv


def _pod(name: str, *, node: str | None = None, status: dict[str, Any] | None = None, **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels}, "spec": spec, "status": status or {}}


UNSCHEDULABLE = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}


def test_pending_means_the_scheduler_gave_up() -> None:
    assert is_pending({"status": UNSCHEDULABLE})
    assert not is_pending({"status": {}})
    gated = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    assert not is_pending({"status": gated})


def _proc(server: KubeAPIServer, **kw: Any) -> ControllerProcess:
    return ControllerProcess(client_for(server), CATALOG, "kwok", clock=ManualClock(1e6), **kw).start(sync_timeout_s=5)


def _wait(cond: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_backend_views_from_the_cache(server: KubeAPIServer) -> None:
    server.create(
        "nodes",
        {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}}},
    )
    server.create("pods", _pod("judged"))
    server.patch("pods", "judged", {"status": UNSCHEDULABLE}, status=True)
    server.create("pods", _pod("fresh"))  # not yet seen by the scheduler: not pending for gpuscale
    server.create("pods", _pod("nominated"))
    server.patch("pods", "nominated", {"status": {**UNSCHEDULABLE, "nominatedNodeName": "n1"}}, status=True)
    server.create("pods", _pod("running", node="n1", app="db"))
    server.patch("pods", "running", {"status": {"phase": "Running"}}, status=True)
    server.create("pods", _pod("done", node="n1"))
    server.patch("pods", "done", {"status": {"phase": "Succeeded"}}, status=True)
    server.create(
        "poddisruptionbudgets",
        {"metadata": {"name": "db"}, "spec": {"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "db"}}}},
    )
    proc = _proc(server)
    try:
        be = proc.backend
        _wait(lambda: len(be.list_pods()) == 3 and be.list_pdbs())
        pods = {p.name: p for p in be.list_pods()}
        assert set(pods) == {"judged", "nominated", "running"}
        assert pods["judged"].node_name is None
        assert pods["nominated"].node_name == "n1", "a nominated pod counts on its node, not as pending"
        assert [n.name for n in be.list_nodes()] == ["n1"]
        assert be.list_nodes() is be.list_nodes(), "views are rebuilt only when the cache changed"
        (pdb,) = be.list_pdbs()
        assert (pdb.name, pdb.max_unavailable, dict(pdb.selector)) == ("db", 1, {"app": "db"})
    finally:
        proc.close()


def test_daemonset_overhead_counts_daemonsets_that_land_on_the_pool() -> None:
    def ds(name: str, cpu: str, **spec: Any) -> dict[str, Any]:
        tpl = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}}}], **spec}
        return {"metadata": {"name": name}, "spec": {"template": {"spec": tpl}}}

    gpu_taint = Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present")
    pool = NodePool("ada", labels={"team": "ml"}, taints=(gpu_taint,))
    tolerant = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    sets = [
        ds("dcgm", "200m", tolerations=tolerant),
        ds("plain", "100m"),  # does not tolerate the GPU taint
        ds("other-team", "300m", tolerations=tolerant, nodeSelector={"team": "web"}),
    ]
    total = daemonset_overhead(sets, pool)
    assert total is not None and (total.cpu_milli, total.memory_mib, total.pods) == (200, 128, 1)
    assert daemonset_overhead([], pool) is None


def test_event_reasons_users_know() -> None:
    def ev(kind: str, obj: str = "node/n1", reason: str = "", **data: object) -> Event:
        return Event(0.0, kind, obj, reason, "m", data)

    assert kube_reason(ev("ScaleUp")) == ("TriggeredScaleUp", "Normal")
    assert kube_reason(ev("Blocked", "pod/ml/a")) == ("NotTriggerScaleUp", "Normal")
    assert kube_reason(ev("Blocked", "pool/ada")) is None
    assert kube_reason(ev("Consolidate", action="Delete")) == ("ScaleDown", "Normal")
    assert kube_reason(ev("Consolidate", action="Replace")) == ("ConsolidationReplace", "Normal")
    assert kube_reason(ev("SpotInterruption")) == ("SpotInterrupted", "Warning")
    assert kube_reason(ev("NodeClaimTimeout", reason="GpuInitTimeout")) == ("GPUInitTimeout", "Warning")
    assert kube_reason(ev("OfferingUnavailable", "offering/x")) is None


def test_messages_never_carry_secrets() -> None:
    text = redact("call failed: Authorization: Bearer abc.def token=s3cr3t password: hunter2 id " + "ab" * 20)
    assert "abc.def" not in text and "s3cr3t" not in text and "hunter2" not in text and "ab" * 20 not in text
    assert len(redact("x" * 5000)) == 1024


def test_events_are_aggregated_and_rate_limited(server: KubeAPIServer) -> None:
    client = client_for(server)
    clock = ManualClock(1e6)
    rec = EventRecorder(client, None, clock)
    try:
        blocked = Event(0.0, "Blocked", "pod/ml/a", "NoMatchingPool", "no pool selects it")
        for _ in range(3):
            rec.record(blocked)
        rec.flush()
        (only,) = server.items("events", "ml")
        assert (only["reason"], only["count"], only["involvedObject"]["name"]) == ("NotTriggerScaleUp", 3, "a")
        for i in range(BURST + 5):
            rec.record(Event(0.0, "Evict", "node/n1", "Drain", f"evicted {i}"))
        rec.flush()
        assert len(server.items("events", "default")) == BURST  # the burst, then nothing
        assert rec.dropped == 5
        clock.sleep(3600)  # the bucket refills
        rec.record(Event(0.0, "Evict", "node/n1", "Drain", "later"))
        rec.flush()
        assert any(e["message"] == "later" for e in server.items("events", "default"))
    finally:
        client.close()


def test_kubeconfig_problems_are_input_errors(tmp_path: Path, server: KubeAPIServer) -> None:
    from gpuscale.kube.client import load_config

    with pytest.raises(InputError, match="not found"):
        load_config(str(tmp_path / "missing"), env={})
    path = kubeconfig_for(server, tmp_path / "config")
    with pytest.raises(InputError, match="context 'nope' is not in the kubeconfig"):
        load_config(str(path), "nope", env={})
    assert load_config(None, None, env={"KUBECONFIG": str(path)}).cluster.server == server.url
    (tmp_path / "broken").write_text("clusters: 3\n")
    with pytest.raises(InputError, match="unreadable kubeconfig"):
        load_config(str(tmp_path / "broken"), env={})


class Kubelet:
    """Registers a Node for every ready Linode LKE node (labels and taints of its pool, providerID linode://ID)."""

    def __init__(self, fake: FakeLinodeAPI, cluster_id: int, server: KubeAPIServer) -> None:
        self.fake, self.cluster_id, self.server = fake, cluster_id, server

    def step(self) -> None:
        types = CATALOG.by_name()
        live = set()
        for pool in self.fake.pools(self.cluster_id):
            it = types[pool["type"]]
            for n in pool["nodes"]:
                name = f"lke-{n['id']}"
                live.add(name)
                if n["status"] != "ready" or self.server.get("nodes", name) is not None:
                    continue
                alloc = {"cpu": str(it.vcpus), "memory": f"{it.memory_mib}Mi", "nvidia.com/gpu": str(it.gpu_count)}
                self.server.create(
                    "nodes",
                    {
                        "metadata": {"name": name, "labels": {**pool["labels"], "kubernetes.io/hostname": name}},
                        "spec": {"providerID": f"linode://{n['instance_id']}", "taints": pool["taints"]},
                        "status": {"allocatable": alloc, "capacity": alloc},
                    },
                )
        for node in self.server.items("nodes"):
            name = node["metadata"]["name"]
            if name.startswith("lke-") and name not in live:
                self.server.delete("nodes", name)


def test_simulated_linode_node_is_matched_by_provider_id_and_removed(server: KubeAPIServer) -> None:
    pool = {
        "apiVersion": "gpuscale.io/v1alpha1",
        "kind": "GPUNodePool",
        "metadata": {"name": "ada"},
        "spec": {
            "instanceTypes": ["g2-gpu-rtx4000a1-s"],
            "zones": ["us-ord"],
            "capacityTypes": ["on-demand"],
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30s"},
        },
    }
    server.create("gpunodepools", pool)
    clock = ManualClock(1e6)
    with FakeLinodeAPI() as fake:
        fake.clock = clock
        cid = fake.create_cluster(region="us-ord")
        config = LinodeConfig(cluster_id=cid, region="us-ord", base_url=fake.base_url, timeout_s=5.0)
        holder: dict[str, ProviderIdMatcher] = {}

        def provider() -> ProviderIdMatcher:
            linode = LinodeProvider(config, env={"LINODE_TOKEN": fake.token}, clock=clock)
            holder["p"] = ProviderIdMatcher(linode, proc.cache)
            return holder["p"]

        proc = ControllerProcess(
            client_for(server),
            CATALOG,
            "linode",
            clock=clock,
            config=ControllerConfig(batch_idle_s=0, batch_max_s=0),
            provider_factory=provider,
        )
        proc.start(sync_timeout_s=5)
        kubelet, scheduler = Kubelet(fake, cid, server), Scheduler(server)
        try:
            server.create("pods", _pod("train", app="x"), namespace="ml")
            scheduler.step()

            def round_(advance: float) -> None:
                clock.sleep(advance)
                time.sleep(0.1)
                proc.step()
                kubelet.step()
                time.sleep(0.1)
                scheduler.step()

            for _ in range(30):
                round_(30)
                pod = server.get("pods", "train", "ml") or {}
                if (pod.get("spec") or {}).get("nodeName"):
                    break
            node_name = server.get("pods", "train", "ml")["spec"]["nodeName"]  # type: ignore[index]
            assert node_name.startswith("lke-")
            listed = holder["p"].list_nodes()
            assert [c.node_name for c in listed] == [node_name], "matched by providerID"
            scheduler.complete("ml/train")
            for _ in range(30):
                round_(30)
                if not fake.node_ids(cid) and server.get("nodes", node_name) is None:
                    break
            assert not fake.node_ids(cid), "the cloud node is deleted"
            assert server.get("nodes", node_name) is None, "then the Node object"
            assert fake.invalid_requests == []
        finally:
            proc.close()


class _Cache:
    """The two things the matcher reads from a KubeCache."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.version = 1
        self._nodes = nodes

    def objects(self, name: str) -> list[dict[str, Any]]:
        assert name == "nodes"
        return self._nodes


class _Cloud:
    """A provider listing fixed cloud nodes."""

    name = "cloud"
    capabilities = None

    def __init__(self, nodes: list[Any]) -> None:
        self.nodes = nodes

    def list_nodes(self) -> list[Any]:
        return self.nodes


def test_provider_ids_of_each_cloud_match_their_nodes() -> None:
    from gpuscale.core.model import CapacityType
    from gpuscale.providers.base import CloudNode, CloudNodeState

    def node(name: str, pid: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"providerID": pid}}

    def cloud(node_id: str, instance_id: str = "") -> CloudNode:
        return CloudNode(
            node_id, "r", "p", "t", "z", CapacityType.ON_DEMAND, CloudNodeState.READY, instance_id=instance_id
        )

    cache = _Cache(
        [
            node("lke-1", "linode://12345"),
            node("ip-10-0-0-1", "aws:///us-east-1a/i-0abc"),
            node("gke-a", "gce://proj/us-central1-a/gke-a"),
            node("ack-1", "cn-hangzhou.i-xyz"),
        ]
    )
    nodes = [cloud("7", "12345"), cloud("i-0abc"), cloud("gke-a"), cloud("i-xyz"), cloud("other")]
    got = ProviderIdMatcher(_Cloud(nodes), cache).list_nodes()  # type: ignore[arg-type]
    assert [c.node_name for c in got] == ["lke-1", "ip-10-0-0-1", "gke-a", "ack-1", ""]


def test_missing_crds_name_the_fix(server: KubeAPIServer) -> None:
    server.call(lambda: server.emulator._types.pop(("gpuscale.io", "v1alpha1", "gpunodepools")))
    proc = ControllerProcess(client_for(server), CATALOG, "kwok", clock=ManualClock(1e6))
    try:
        with pytest.raises(InputError, match="gpunodepools") as info:
            proc.start(sync_timeout_s=5)
        assert "kubectl apply -k deploy/crds" in str(info.value)
    finally:
        proc.close()
