"""GPUWorkloadScalers and GPUBudgets in the cluster, end to end over real HTTP: a real Prometheus scraping
``gpuscale agent --simulate`` (a load curve), the controller process (scalers, node reconcile, kwok provider) against
the emulated API server, a stand-in Deployment controller making pods and a stand-in scheduler binding them.

* load rises -> the scaler scales the Deployment through its ``scale`` subresource -> the new pods are pending ->
  the controller launches kwok nodes -> the scheduler binds them; status, conditions, Events and ``/metrics`` show it,
  and a restarted controller goes on from the state in the status;
* two scalers in one GPUBudget: the higher priority one wins the GPUs, the other keeps its guarantee, and when the
  winner's load falls the other gets the GPUs back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube import API_VERBS, PREFLIGHT_VERBS
from gpuscale.kube.command import ControllerProcess
from gpuscale.kube.endpoints import ProcessEndpoints
from gpuscale.metrics.prometheus import PrometheusClient
from kube_harness import CONFIG, TOLERATE_KWOK, RoundsWorld, Scheduler, client_for, kwok_pool
from prom_harness import Prometheus, agent, free_port, prometheus, wait_for

pytest.importorskip("lightkube")

CATALOG = load_catalog("linode")
POOL = kwok_pool(consolidate_after="600s")
HOSTNAME = "kube-scalers"
QUERY = f'sum(DCGM_FI_DEV_GPU_UTIL{{Hostname="{HOSTNAME}"}})'
LOW_S = 5.0
"""Seconds of the curve at 25 % per GPU (50 in all: one replica at target) before it rises to 100 % (200: four)."""


# ------------------------------------------------------------------------------------------------ harness
def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "tolerations": TOLERATE_KWOK,
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}}
                    ],
                },
            },
        },
    }


def scaler(name: str, query: str, server: str, *, threshold: str = "50", **spec: Any) -> dict[str, Any]:
    trigger = {"type": "prometheus", "name": "gpu", "metadata": {"serverAddress": server, "query": query,
                                                                  "threshold": threshold}}  # fmt: skip
    return {
        "apiVersion": "gpuscale.io/v1alpha1",
        "kind": "GPUWorkloadScaler",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"scaleTargetRef": {"name": name}, "minReplicaCount": 1, "maxReplicaCount": 4,
                 "pollingInterval": 5, "triggers": [trigger], **spec},
    }  # fmt: skip


class Deployments:
    """Plays the Deployment controller: a Deployment NAME runs pods NAME-0 .. NAME-(replicas-1) from its template."""

    def __init__(self, server: KubeAPIServer) -> None:
        self.server = server

    def step(self) -> None:
        pods = {p["metadata"]["name"] for p in self.server.items("pods", "ml")}
        for d in self.server.items("deployments", "ml"):
            name, want = d["metadata"]["name"], int(d["spec"]["replicas"])
            template = d["spec"]["template"]
            for i in range(want):
                if f"{name}-{i}" not in pods:
                    pod = {"metadata": {**template["metadata"], "name": f"{name}-{i}"}, "spec": template["spec"]}
                    self.server.create("pods", pod, namespace="ml")
            have = sorted(int(p.rsplit("-", 1)[1]) for p in pods if p.rsplit("-", 1)[0] == name)
            for i in have:
                if i >= want:
                    self.server.delete("pods", f"{name}-{i}", namespace="ml")
            self.server.patch("deployments", name, {"status": {"replicas": want}}, "ml", status=True)


class World(RoundsWorld):
    def __init__(self, server: KubeAPIServer) -> None:
        self.server = server
        self.scheduler = Scheduler(server)
        self.deployments = Deployments(server)
        self.clock = ManualClock(1_000_000.0)
        self.proc = self.start()

    def start(self) -> ControllerProcess:
        proc = ControllerProcess(client_for(self.server), CATALOG, "kwok", clock=self.clock, config=CONFIG)
        proc.start(sync_timeout_s=5)
        proc.endpoints = ProcessEndpoints(proc.client, proc.cache, self.clock, namespace="gpuscale",
                                          leader_elect=False, metrics_port=0, health_port=0,
                                          host="127.0.0.1").start()  # fmt: skip
        return proc

    def settle(self) -> None:
        last = -1
        for _ in range(100):
            time.sleep(0.02)
            assert self.proc.scalers is not None
            version = self.proc.cache.version + self.proc.scalers.cache.version
            if version == last:
                return
            last = version

    def round(self, advance: float = 0.0) -> None:
        self.clock.sleep(advance)
        self.settle()
        self.proc.step()
        self.deployments.step()
        self.settle()
        self.scheduler.step()
        self.settle()

    def events(self, reason: str) -> list[dict[str, Any]]:
        assert self.proc.scalers is not None
        self.proc.scalers.events.flush()
        return [e for e in self.server.items("events", "ml") if e.get("reason") == reason]

    def replicas(self, name: str) -> int:
        d = self.server.get("deployments", name, namespace="ml")
        assert d is not None
        return int(d["spec"]["replicas"])

    def status(self, resource: str, name: str) -> dict[str, Any]:
        obj = self.server.get(resource, name, namespace="ml")
        assert obj is not None
        return dict(obj.get("status") or {})

    def bound(self, app: str) -> list[str]:
        pods = self.server.items("pods", "ml")
        return sorted(p["spec"]["nodeName"] for p in pods if p["metadata"]["labels"].get("app") == app
                      and p["spec"].get("nodeName"))  # fmt: skip

    def close(self) -> None:
        self.proc.close()


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, int]]:
    """A Prometheus scraping a port the curve's agent will listen on (down until a test starts it)."""
    tmp = tmp_path_factory.mktemp("scalers-prom")
    port = free_port()
    with prometheus(tmp, [f"127.0.0.1:{port}"]) as p, PrometheusClient(p.url) as client:
        # target discovery takes a few seconds: wait until the (still down) target is being scraped
        wait_for(lambda: client.query(f'up{{instance="127.0.0.1:{port}"}}'), timeout=20)
        yield p, port


@pytest.fixture
def world() -> Iterator[World]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", POOL)
        w = World(srv)
        try:
            yield w
        finally:
            w.close()


def _condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    c = next(c for c in status["conditions"] if c["type"] == kind)
    return c["status"], c["reason"]


# ------------------------------------------------------------------------------------------------ tests
def test_load_in_prometheus_scales_the_deployment_and_its_pending_pods_get_nodes(
    world: World, prom: tuple[Prometheus, int], tmp_path: Path
) -> None:
    p, port = prom
    server = world.server
    server.create("deployments", deployment("llm"), namespace="ml")
    world.until(lambda: len(world.bound("llm")) == 1)  # the first replica needs a node too
    curve = f"0:25,{LOW_S}:25,{LOW_S + 0.01}:100"
    args = ["--simulate", "--gpus", "2", "--model", "l4", "--curve", curve, "--hostname", HOSTNAME, "--port", str(port)]
    with agent(tmp_path, args) as a, PrometheusClient(p.url) as client:
        wait_for(lambda: client.query(QUERY), timeout=LOW_S - 1)
        server.create("gpuworkloadscalers", scaler("llm", QUERY, p.url), namespace="ml")
        world.round(1)
        first_poll = world.clock.now()
        assert time.time() < a.started + LOW_S, "the first poll came after the load rose"
        st = world.status("gpuworkloadscalers", "llm")
        assert (st["currentReplicas"], st["desiredReplicas"]) == (1, 1), st["reason"]
        assert "within tolerance" in st["reason"]
        assert _condition(st, "ScalingActive") == ("True", "ValidMetricFound")
        gets = server.requests().count(("get", "deployments.apps/scale"))
        for _ in range(4):
            world.round(1)  # not due before pollingInterval (5 s): nothing is read or scaled
        assert world.replicas("llm") == 1
        assert server.requests().count(("get", "deployments.apps/scale")) == gets, "no GET of the scale between polls"
        wait_for(lambda: client.value(QUERY) == 200, timeout=LOW_S + 5)
        world.round(1)  # due: 200 / 50 per replica -> 4
    assert world.replicas("llm") == 4
    st = world.status("gpuworkloadscalers", "llm")
    assert (st["currentReplicas"], st["desiredReplicas"]) == (1, 4), st["reason"]
    assert _condition(st, "AbleToScale") == ("True", "SucceededRescale")
    assert _condition(st, "ScalingLimited") == ("False", "DesiredWithinRange")
    assert st["lastScaleTime"] and st["scalerState"]["scaleUpEvents"] == [{"time": first_poll + 5, "replicas": 3}]
    (event,) = world.events("SuccessfulRescale")
    assert event["message"].startswith("New size: 4; reason: gpu proposes 4 (total 200 / 50 per pod)")
    assert event["involvedObject"]["kind"] == "GPUWorkloadScaler"

    world.until(lambda: len(world.bound("llm")) == 4, advance=2)  # pending pods -> kwok nodes -> bound
    assert len(set(world.bound("llm"))) == 4, "one 1-GPU node per replica"
    assert world.proc.endpoints is not None
    text = httpx.get(f"http://127.0.0.1:{world.proc.endpoints.ports[0]}/metrics").text
    assert 'gpuscale_scaler_desired_replicas{namespace="ml",scaler="llm"} 4.0' in text
    assert server.requests() and set(server.requests()) <= set(API_VERBS) | set(PREFLIGHT_VERBS)

    before = world.proc.scalers._memory["ml/llm"].state if world.proc.scalers else None
    world.restart()  # a new process goes on from the status: same state, no rescale
    world.round(0)
    assert world.proc.scalers is not None
    assert world.proc.scalers._memory["ml/llm"].state == before
    assert world.replicas("llm") == 4 and len(world.events("SuccessfulRescale")) == 1


def test_two_scalers_in_one_budget_priority_wins_above_the_guarantee(
    world: World, prom: tuple[Prometheus, int]
) -> None:
    p, _ = prom
    server = world.server
    server.create("gpubudgets", {
        "apiVersion": "gpuscale.io/v1alpha1", "kind": "GPUBudget", "metadata": {"name": "shared", "namespace": "ml"},
        "spec": {"totalGPUs": 4, "models": [{"name": "llama", "guaranteedGPUs": 1},
                                            {"name": "mistral", "guaranteedGPUs": 1}]},
    }, namespace="ml")  # fmt: skip
    for name, model, prio in (("chat", "llama", 10), ("batch", "mistral", 1)):
        server.create("deployments", deployment(name), namespace="ml")
        spec = {"priority": prio, "gpuBudget": {"name": "shared", "model": model},
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}  # fmt: skip
        server.create("gpuworkloadscalers", scaler(name, "vector(400)", p.url, threshold="100", **spec), "ml")
    world.round(1)
    assert (world.replicas("chat"), world.replicas("batch")) == (3, 1)
    batch = world.status("gpuworkloadscalers", "batch")
    assert (batch["desiredReplicas"], batch["grantedReplicas"]) == (1, 1)
    assert _condition(batch, "ScalingLimited") == ("True", "BudgetLimited")
    budget = world.status("gpubudgets", "shared")
    grants = {g["scaler"]: (g["desired"], g["granted"]) for g in budget["grants"]}
    assert grants == {"chat": (4, 3), "batch": (4, 1)} and budget["usedGPUs"] == 4
    assert budget["models"] == {"llama": {"grantedGPUs": 3}, "mistral": {"grantedGPUs": 1}}
    refused = {e["message"].split(":")[0]: e for e in world.events("BudgetRefused")}
    assert set(refused) == {"chat (llama)", "batch (mistral)"} and not world.events("BudgetGranted")
    assert refused["batch (mistral)"]["involvedObject"]["kind"] == "GPUBudget"
    message = refused["batch (mistral)"]["message"]
    assert "granted 1 of 4 replicas (1 GPUs)" in message and "higher priority first: ml/chat" in message

    # chat's load falls to one replica: batch gets the GPUs back at its next poll (chat lends its idle share)
    obj = server.get("gpuworkloadscalers", "chat", namespace="ml")
    assert obj is not None
    obj["spec"]["triggers"][0]["metadata"]["query"] = "vector(50)"
    server.patch("gpuworkloadscalers", "chat", {"spec": obj["spec"]}, namespace="ml")
    world.round(5)
    assert (world.replicas("chat"), world.replicas("batch")) == (1, 3)
    grants_now = {g["scaler"]: g["granted"] for g in world.status("gpubudgets", "shared")["grants"]}
    assert grants_now == {"chat": 1, "batch": 3}
    (granted,) = world.events("BudgetGranted")
    assert granted["message"].startswith("chat (llama): granted 1 of 1 replicas")
    assert world.proc.scalers is not None
    assert world.proc.scalers.granted_gpus == {("ml", "shared", "llama"): 1, ("ml", "shared", "mistral"): 3}
