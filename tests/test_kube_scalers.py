"""The in-cluster scaler reconcile against the emulated API server with a stateful metric source (no Prometheus):
a spec with problems, a target that does not exist, a StatefulSet target through its ``scale`` subresource, failing
queries holding ``fallback.replicas``, and the emulator's ``scale`` subresource itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpuscale.errors import MetricsUnavailable, NoData
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.command import ControllerProcess
from kube_harness import CONFIG, client_for
from test_kube_scalers_e2e import CATALOG, POOL, World, deployment, scaler

pytest.importorskip("lightkube")


class Readings:
    """A metric source answering from a dict: a number, NoData, or a failure (per query)."""

    def __init__(self) -> None:
        self.values: dict[str, float | Exception] = {}
        self.asked: list[str] = []

    def value(self, query: str, at: float | None = None) -> float:
        self.asked.append(query)
        got = self.values.get(query, NoData(f"{query}: no sample"))
        if isinstance(got, Exception):
            raise got
        return got

    def usage(self, query: str, start: float, end: float, step: float) -> list[Any]:
        raise NotImplementedError("scalers read instant values only")


class FakeWorld(World):
    def __init__(self, server: KubeAPIServer, readings: Readings) -> None:
        self.readings = readings
        super().__init__(server)

    def start(self) -> ControllerProcess:
        proc = ControllerProcess(client_for(self.server), CATALOG, "kwok", clock=self.clock, config=CONFIG,
                                 metric_sources=lambda server: self.readings)  # fmt: skip
        return proc.start(sync_timeout_s=5)


@pytest.fixture
def fake() -> Iterator[FakeWorld]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", POOL)
        w = FakeWorld(srv, Readings())
        try:
            yield w
        finally:
            w.close()


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


def test_a_spec_with_problems_is_reported_once_and_nothing_is_scaled(fake: FakeWorld) -> None:
    bad = scaler("llm", "q", "http://prom:9090", threshold="seventy")
    bad["spec"]["maxReplicaCount"] = 0
    fake.server.create("deployments", deployment("llm"), namespace="ml")
    fake.server.create("gpuworkloadscalers", bad, namespace="ml")
    fake.round(1)
    fake.round(5)
    assert fake.proc.scalers is not None and fake.proc.scalers.next_due() is None
    st = fake.status("gpuworkloadscalers", "llm")
    assert _conditions(st) == {"ScalingActive": ("False", "InvalidSpec")}
    (event,) = fake.events("InvalidSpec")
    assert "threshold" in event["message"] and "maxReplicaCount" in event["message"]
    assert event["count"] == 1 and fake.readings.asked == [] and fake.replicas("llm") == 1


def test_a_missing_target_is_a_failed_get_scale(fake: FakeWorld) -> None:
    fake.readings.values["q"] = 500.0
    fake.server.create("gpuworkloadscalers", scaler("ghost", "q", "http://prom:9090"), namespace="ml")
    fake.round(1)
    st = fake.status("gpuworkloadscalers", "ghost")
    assert _conditions(st) == {"AbleToScale": ("False", "FailedGetScale")}
    (event,) = fake.events("FailedGetScale")
    assert "deployments" in event["message"]
    proc = fake.proc
    assert proc.scalers is not None and proc.scalers.next_due() == fake.clock.now() + 5, "retried a poll later"
    gets = [r for r in fake.server.requests() if r == ("get", "deployments.apps/scale")]
    fake.round(1)
    assert [r for r in fake.server.requests() if r == ("get", "deployments.apps/scale")] == gets
    fake.server.create("deployments", deployment("ghost"), namespace="ml")
    fake.round(4)
    assert fake.replicas("ghost") == 4, "found at the retry and scaled: 500 / 50 per replica, at most 4"
    assert _conditions(fake.status("gpuworkloadscalers", "ghost"))["AbleToScale"] == ("True", "SucceededRescale")


def test_a_statefulset_holds_fallback_replicas_while_its_query_fails(fake: FakeWorld) -> None:
    sts = deployment("db", replicas=2)
    fake.server.create("statefulsets", sts, namespace="ml")
    spec = scaler("db", "q", "http://prom:9090", fallback={"failureThreshold": 1, "replicas": 3})
    spec["spec"]["scaleTargetRef"] = {"kind": "StatefulSet", "name": "db"}
    fake.readings.values["q"] = MetricsUnavailable("prometheus is down")
    fake.server.create("gpuworkloadscalers", spec, namespace="ml")
    fake.round(1)
    assert _conditions(fake.status("gpuworkloadscalers", "db"))["ScalingActive"] == ("False", "FailedGetMetrics")
    fake.round(5)  # the second failure in a row is past failureThreshold 1: fallback
    obj = fake.server.get("statefulsets", "db", namespace="ml")
    assert obj is not None and obj["spec"]["replicas"] == 3
    st = fake.status("gpuworkloadscalers", "db")
    assert st["fallback"] == {"active": True, "triggers": ["gpu"]} and st["health"]["gpu"]["numberOfFailures"] == 2
    assert fake.events("SuccessfulRescale")[0]["message"].startswith("New size: 3;")
    assert ("patch", "statefulsets.apps/scale") in fake.server.requests()


def test_the_emulated_scale_subresource(fake: FakeWorld) -> None:
    fake.server.create("deployments", deployment("web", replicas=2), namespace="ml")
    url = f"{fake.server.url}/apis/apps/v1/namespaces/ml/deployments/web/scale"
    got = httpx.get(url).json()
    assert (got["kind"], got["spec"], got["status"]["selector"]) == ("Scale", {"replicas": 2}, "app=web")
    patched = httpx.patch(url, json={"spec": {"replicas": 5}},
                          headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    assert patched.status_code == 200 and patched.json()["spec"]["replicas"] == 5
    obj = fake.server.get("deployments", "web", namespace="ml")
    assert obj is not None and obj["spec"]["replicas"] == 5
    bad = httpx.patch(url, json={"spec": {"replicas": -1}}, headers={"Content-Type": "application/merge-patch+json"})
    assert bad.status_code == 422
    assert httpx.get(f"{fake.server.url}/apis/apps/v1/namespaces/ml/daemonsets/web/scale").status_code == 404


def test_a_cluster_without_the_scaler_crds_is_one_line_naming_the_fix() -> None:
    from gpuscale.errors import InputError

    with KubeAPIServer() as srv:
        srv.call(lambda: srv.emulator._types.pop(("gpuscale.io", "v1alpha1", "gpuworkloadscalers")))
        proc = ControllerProcess(client_for(srv), CATALOG, "kwok", config=CONFIG)
        try:
            with pytest.raises(InputError) as err:
                proc.start(sync_timeout_s=5)
        finally:
            proc.close()
    assert "gpuworkloadscalers" in str(err.value) and "--no-scalers" in str(err.value)
    assert "\n" not in str(err.value)
