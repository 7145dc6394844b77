"""End to end over real HTTP: the controller with the Kubernetes adapter and the kwok provider against the emulated
API server, a stand-in scheduler binding pods, and a manual clock (every flow runs in about a second).

With ``GPUSCALE_E2E_KUBECONFIG`` set, ``test_real_cluster_smoke`` runs against that cluster instead (kind, or a real
one with kwok installed); see docs/kubernetes.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL
from gpuscale.fakes.kube_api import KubeAPIEmulator, KubeAPIServer
from gpuscale.kube import API_VERBS, PREFLIGHT_VERBS
from gpuscale.kube.backend import DISRUPTED_TAINT
from gpuscale.kube.command import ControllerProcess
from gpuscale.kube.endpoints import ProcessEndpoints
from gpuscale.kube.kwok import KwokConfig, KwokProvider
from kube_harness import CONFIG, TOLERATE_KWOK, RoundsWorld, Scheduler, client_for, kubeconfig_for, kwok_pool

pytest.importorskip("lightkube")

CATALOG = load_catalog("linode")
POOL = kwok_pool(consolidate_after="60s")


def gpu_pod(name: str, **labels: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": labels},
        "spec": {
            "tolerations": TOLERATE_KWOK,
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}}],
        },
    }


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", POOL)
        yield srv


class World(RoundsWorld):
    """The emulated cluster, a scheduler, a clock and a controller process (restartable)."""

    def __init__(self, server: KubeAPIServer, kwok: KwokConfig | None = None) -> None:
        self.server = server
        self.scheduler = Scheduler(server)
        self.clock = ManualClock(1_000_000.0)
        self.kwok = kwok or KwokConfig()
        self.proc = self.start()

    def start(self) -> ControllerProcess:
        proc = ControllerProcess(
            client_for(self.server), CATALOG, "kwok", clock=self.clock, config=CONFIG, kwok=self.kwok
        )
        return proc.start(sync_timeout_s=5)

    def events(self, reason: str) -> list[dict[str, object]]:
        self.proc.backend.events.flush()
        return [e for e in self.server.items("events") if e.get("reason") == reason]

    def close(self) -> None:
        self.proc.close()


@pytest.fixture
def world(server: KubeAPIServer) -> Iterator[World]:
    w = World(server)
    yield w
    w.close()


def _bound(server: KubeAPIServer, name: str) -> str | None:
    pod = server.get("pods", name, namespace="ml")
    return None if pod is None else (pod.get("spec") or {}).get("nodeName")


def test_pending_gpu_pod_scales_up_binds_completes_and_the_node_goes(world: World, server: KubeAPIServer) -> None:
    server.create("pods", gpu_pod("train-0"), namespace="ml")
    world.scheduler.step()  # nothing fits: Unschedulable
    world.until(lambda: bool(world.kwok_nodes()))
    (node,) = world.kwok_nodes()
    meta = node["metadata"]
    assert meta["labels"]["gpuscale.io/pool"] == "ada"
    assert meta["labels"]["nvidia.com/gpu.product"] == "RTX4000-Ada"
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
    world.until(lambda: _bound(server, "train-0") is not None)
    assert _bound(server, "train-0") == meta["name"]
    scaled = world.events("TriggeredScaleUp")
    assert [e["involvedObject"]["name"] for e in scaled] == ["train-0"]  # type: ignore[index]
    assert "ada" in str(scaled[0]["message"])
    world.scheduler.complete("ml/train-0")
    world.round(1)
    world.round(30)
    assert world.kwok_nodes(), "the node stays until consolidateAfter has passed"
    world.until(lambda: not world.kwok_nodes(), advance=40)
    assert world.events("ScaleDown"), "removing the empty node is reported on it"
    assert server.requests() and set(server.requests()) <= set(API_VERBS) | set(PREFLIGHT_VERBS)


def test_gpus_counted_only_once_allocatable_and_no_second_launch_meanwhile(server: KubeAPIServer) -> None:
    w = World(server, KwokConfig(device_plugin_delay_s=30.0))
    try:
        server.create("pods", gpu_pod("slow-0"), namespace="ml")
        w.scheduler.step()
        w.until(lambda: bool(w.kwok_nodes()))
        for _ in range(5):
            w.round(2)  # the device plugin is not ready: the pod stays pending, the node in flight covers it
        assert len(w.kwok_nodes()) == 1 and _bound(server, "slow-0") is None
        w.until(lambda: _bound(server, "slow-0") is not None, advance=10)
        assert len(w.kwok_nodes()) == 1
    finally:
        w.close()


def test_a_pod_disruption_budget_blocks_the_drain_until_it_allows(world: World, server: KubeAPIServer) -> None:
    server.create("pods", gpu_pod("db-0", app="db"), namespace="ml")
    world.scheduler.step()
    world.until(lambda: _bound(server, "db-0") is not None)
    node = _bound(server, "db-0")
    assert node is not None
    server.create(
        "poddisruptionbudgets",
        {"metadata": {"name": "db"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}},
        namespace="ml",
    )
    world.settle()
    provider = world.proc.provider
    assert isinstance(provider, KwokProvider)
    provider.interrupt(node)  # a spot notice: cordon, replace, drain (the PDB still decides when the pod may go)
    for _ in range(4):
        world.round(5)
    cordoned = server.get("nodes", node)
    assert cordoned is not None and cordoned["spec"]["unschedulable"] is True
    assert any(t["key"] == DISRUPTED_TAINT for t in cordoned["spec"]["taints"])
    assert _bound(server, "db-0") == node, "the PDB keeps the pod"
    server.patch("poddisruptionbudgets", "db", {"spec": {"minAvailable": 0}}, namespace="ml")
    world.until(lambda: server.get("pods", "db-0", namespace="ml") is None or _bound(server, "db-0") != node)
    world.until(lambda: node not in {n["metadata"]["name"] for n in world.kwok_nodes()}, advance=5)
    assert world.events("SpotInterrupted")


def test_a_restart_mid_flow_neither_leaks_nor_duplicates(world: World, server: KubeAPIServer) -> None:
    for i in range(2):
        server.create("pods", gpu_pod(f"job-{i}"), namespace="ml")
    world.scheduler.step()
    world.round(1)
    launched = {n["metadata"]["name"] for n in world.kwok_nodes()}
    assert len(launched) == 2
    world.restart()  # a new controller: state rebuilt from the cluster
    for _ in range(5):
        world.round(1)
    assert {n["metadata"]["name"] for n in world.kwok_nodes()} == launched
    world.until(lambda: all(_bound(server, f"job-{i}") for i in range(2)))
    for i in range(2):
        world.scheduler.complete(f"ml/job-{i}")
    world.until(lambda: not world.kwok_nodes(), advance=30)
    assert not [n for n in server.items("nodes") if REQUEST_ID_LABEL in (n["metadata"].get("labels") or {})]


def test_the_api_server_going_away_and_coming_back(world: World, server: KubeAPIServer) -> None:
    relists = dict(world.proc.cache.relists)
    server.stop()
    time.sleep(0.5)
    assert not world.proc.cache.healthy
    assert world.proc.step() is False, "no decisions on a stale view"
    server.create("pods", gpu_pod("late-0"), namespace="ml")  # written while the controller cannot see
    server.start()
    for _ in range(100):
        if world.proc.cache.healthy:
            break
        time.sleep(0.05)
    assert world.proc.cache.healthy
    assert all(world.proc.cache.relists[k] > relists[k] for k in relists)
    world.scheduler.step()
    world.until(lambda: _bound(server, "late-0") is not None)


def test_a_410_on_a_watch_relists(world: World, server: KubeAPIServer) -> None:
    before = world.proc.cache.relists["pods"]
    server.create("configmaps", {"metadata": {"name": "bump"}})  # history moves on without a pod event
    server.compact()
    server.drop_watches()  # the watches resume from their resourceVersion, which is now too old: 410 Gone
    for _ in range(100):
        if world.proc.cache.relists["pods"] > before:
            break
        time.sleep(0.05)
    assert world.proc.cache.relists["pods"] > before
    server.create("pods", gpu_pod("after-410"), namespace="ml")  # and the new watch sees what comes next
    for _ in range(100):
        if world.proc.cache.get("pods", "ml/after-410") is not None:
            break
        time.sleep(0.05)
    assert world.proc.cache.get("pods", "ml/after-410") is not None


ENDPOINTS = ("--bind-address", "127.0.0.1", "--metrics-port", "0", "--health-port", "0")


def _cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuscale.cli", "controller", "--kubeconfig", str(kubeconfig), *ENDPOINTS, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBERNETES_SERVICE_HOST": ""},
    )


def test_command_runs_once_against_the_server(server: KubeAPIServer, tmp_path: Path) -> None:
    server.create("pods", gpu_pod("cli-0"), namespace="ml")
    Scheduler(server).step()
    config = kubeconfig_for(server, tmp_path / "config")
    sim = _cli(config, "--provider", "sim", "--once")
    assert sim.returncode == 2 and "cannot add nodes to a live cluster" in sim.stderr
    unknown = _cli(config, "--provider", "nimbus", "--once")
    assert unknown.returncode == 2 and "unknown provider" in unknown.stderr
    done = _cli(config, "--provider", "kwok", "--once")
    assert done.returncode == 0, done.stderr
    assert any((n["metadata"].get("labels") or {}).get("type") == "kwok" for n in server.items("nodes"))


def test_command_start_up_failures_are_one_line_and_exit_2(tmp_path: Path) -> None:
    emulator = KubeAPIEmulator(token="right", forbidden={("patch", "nodes")})
    with KubeAPIServer(emulator) as srv:
        config = kubeconfig_for(srv, tmp_path / "config")  # token "test-token": rejected
        bad_token = _cli(config, "--provider", "kwok", "--once")
        assert bad_token.returncode == 2
        assert "credentials" in bad_token.stderr and "Traceback" not in bad_token.stderr
        emulator.token = None
        refused = _cli(config, "--provider", "kwok", "--once")
        assert refused.returncode == 2
        assert "may not patch nodes" in refused.stderr and "Traceback" not in refused.stderr
        port = srv.port
    gone = _cli(config, "--provider", "kwok", "--once")
    assert gone.returncode == 2 and "unreachable" in gone.stderr, (port, gone.stderr)
    missing = _cli(tmp_path / "nope", "--provider", "kwok")
    assert missing.returncode == 2 and "kubeconfig file not found" in missing.stderr


@pytest.mark.skipif(not os.environ.get("GPUSCALE_E2E_KUBECONFIG"), reason="GPUSCALE_E2E_KUBECONFIG is not set")
def test_real_cluster_smoke() -> None:  # pragma: no cover - needs a cluster
    from gpuscale.kube.client import KubeClient, load_config

    client = KubeClient(load_config(os.environ["GPUSCALE_E2E_KUBECONFIG"], os.environ.get("GPUSCALE_E2E_CONTEXT")))
    proc = ControllerProcess(client, CATALOG, "kwok", config=CONFIG).start(sync_timeout_s=30)
    try:
        assert proc.step()
    finally:
        proc.close()


def test_two_replicas_one_lease_only_the_leader_acts(server: KubeAPIServer) -> None:
    server.create("namespaces", {"metadata": {"name": "gpuscale"}})
    clock = ManualClock(1_000_000.0)
    procs = []
    try:
        for _ in range(2):
            proc = ControllerProcess(client_for(server), CATALOG, "kwok", clock=clock, config=CONFIG).start(
                sync_timeout_s=5
            )
            proc.endpoints = ProcessEndpoints(
                proc.client,
                proc.cache,
                clock,
                namespace="gpuscale",
                leader_elect=True,
                metrics_port=0,
                health_port=0,
                host="127.0.0.1",
            ).start()
            procs.append(proc)
            for _ in range(600):  # the first replica takes the free Lease at once (up to 30 s on a loaded machine)
                if procs[0].endpoints and procs[0].endpoints.may_act():
                    break
                time.sleep(0.05)
        leader, standby = procs
        assert leader.endpoints is not None and leader.endpoints.may_act()
        assert standby.endpoints is not None and not standby.endpoints.may_act()
        server.create("pods", gpu_pod("ha-0"), namespace="ml")
        Scheduler(server).step()
        for _ in range(5):
            time.sleep(0.1)
            for p in procs:
                p.step()
            clock.sleep(1)
        assert leader.rounds > 0 and standby.rounds == 0
        assert len([n for n in server.items("nodes") if (n["metadata"].get("labels") or {}).get("type") == "kwok"]) == 1
    finally:
        for p in procs:
            p.close()
