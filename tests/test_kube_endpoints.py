"""The controller's /metrics, /healthz and /readyz: the measurement from claims, pods and GPRs (pure), the exposition
text over real HTTP, liveness on a stalled loop, and readiness from the real cache and leader elector against the
Kubernetes API emulator (API server gone -> 503 naming why; back -> 200)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.clock import ManualClock
from gpuscale.core.model import CapacityType, Pod
from gpuscale.core.nodeclaim import ClaimEvent, NodeClaim, new_claim, transition
from gpuscale.core.resources import Request, Resources
from gpuscale.kube.health import EndpointServer, Health, cache_check, leader_check
from gpuscale.kube.metrics import ControllerMetrics, QueuedGpr, measure
from gpuscale.metrics.names import CONTROLLER

E = ClaimEvent
T0 = 1_800_000_000.0


def claim(rid: str, pool: str, *events: ClaimEvent, gpus: int = 4, price: float = 2.5) -> NodeClaim:
    c = new_claim(rid, pool, "g4", "z1", CapacityType.ON_DEMAND, T0, expected=Resources(gpus=gpus), hourly_price=price)
    for i, ev in enumerate(events):
        c = transition(c, ev, T0 + i + 1, node_id=f"id-{rid}" if ev is E.LAUNCHED else None)
    return c


@dataclass
class Result:
    planned: bool = False
    launched: int = 0
    disrupted: int = 0
    evicted: int = 0
    deleted: int = 0


PODS = [
    Pod("wait-gpu", request=Request(cpu_milli=1000, gpus=1)),
    Pod("wait-share", request=Request(cpu_milli=1000, gpu_milli=500)),
    Pod("wait-cpu", request=Request(cpu_milli=1000)),
    Pod("bound-gpu", request=Request(gpus=1), node_name="n1", phase="Running"),
]


# --------------------------------------------------------------------------------------------------- measurement
def test_measure_counts_nodes_gpus_cost_and_pending_gpu_pods() -> None:
    claims = [
        claim("a", "train", E.LAUNCHED, E.REGISTERED, E.INITIALIZED),
        claim("b", "train", E.LAUNCHED, E.REGISTERED, E.INITIALIZED),
        claim("c", "train"),  # requested: not billed yet
        claim("d", "infer", E.LAUNCHED, E.REGISTERED, E.GPU_INIT_TIMEOUT, gpus=1, price=0.5),  # failed, has a node
        claim("e", "infer", E.LAUNCH_TIMEOUT, gpus=1, price=0.5),  # failed before any node: not billed
        claim("f", "infer", E.LAUNCHED, E.LOST, gpus=1, price=0.5),  # gone: not shown
    ]
    m = measure(claims, PODS, [], T0 + 10)
    assert m.nodes == {("train", "Initialized"): 2, ("train", "Requested"): 1, ("infer", "Failed"): 2}
    assert m.gpus == {("train", "Initialized"): 8, ("train", "Requested"): 4, ("infer", "Failed"): 2}
    assert m.hourly_cost == {"train": 5.0, "infer": 0.5}
    assert m.pending_gpu_pods == 2
    assert m.launches == {"train": 2, "infer": 2}
    assert m.failures == {("infer", "GpuInitTimeout"): 1, ("infer", "LaunchTimeout"): 1}


def test_launches_and_failures_are_counted_once_across_rounds() -> None:
    first = measure([claim("a", "p", E.LAUNCHED)], [], [], T0)
    assert first.launches == {"p": 1}
    again = measure([claim("a", "p", E.LAUNCHED, E.REGISTERED)], [], [], T0 + 5, counted=first.counted)
    assert again.launches == {} and again.failures == {}
    failed = measure(
        [claim("a", "p", E.LAUNCHED, E.REGISTERED, E.GPU_INIT_TIMEOUT)], [], [], T0 + 9, counted=again.counted
    )
    assert failed.launches == {} and failed.failures == {("p", "GpuInitTimeout"): 1}


def test_gpr_queue_and_wait_when_a_request_leaves_the_queue() -> None:
    r1 = measure(
        [], [], [QueuedGpr("g1", True, T0), QueuedGpr("g2", True, T0 + 30), QueuedGpr("g3", False, T0)], T0 + 60
    )
    assert r1.gpr_queue == 2 and r1.gpr_waits == ()
    r2 = measure([], [], [QueuedGpr("g1", False, T0), QueuedGpr("g2", True, T0 + 30)], T0 + 100, queued=r1.queued)
    assert r2.gpr_queue == 1 and r2.gpr_waits == (100.0,)


# -------------------------------------------------------------------------------------------- over real HTTP
def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_exposition_over_http() -> None:
    metrics = ControllerMetrics()
    with EndpointServer(0, registry=metrics.registry, host="127.0.0.1") as srv:
        url = f"http://127.0.0.1:{srv.port}/metrics"
        claims = [claim("a", "train", E.LAUNCHED, E.REGISTERED, E.INITIALIZED), claim("b", "infer", E.LAUNCHED)]
        gprs = [QueuedGpr("g1", True, T0)]
        metrics.observe(claims, PODS, T0 + 10, gprs=gprs, result=Result(planned=True, launched=2), round_seconds=0.02)
        code, ctype, text = _get(url)
        assert code == 200 and ctype == CONTENT_TYPE_LATEST
        s = _samples(text)
        assert s[("gpuscale_nodes", (("pool", "train"), ("state", "Initialized")))] == 1
        assert s[("gpuscale_gpus", (("pool", "infer"), ("state", "Launched")))] == 4
        assert s[("gpuscale_hourly_cost_dollars", (("pool", "train"),))] == 2.5
        assert s[("gpuscale_pending_gpu_pods", ())] == 2
        assert s[("gpuscale_launches_total", (("pool", "train"),))] == 1
        assert s[("gpuscale_decisions_total", (("kind", "launch"),))] == 2
        assert s[("gpuscale_decisions_total", (("kind", "plan"),))] == 1
        assert s[("gpuscale_gpr_queue_length", ())] == 1
        assert s[("gpuscale_reconcile_seconds_count", ())] == 1

        # next round: train's node failed and infer's is gone; g1 left the queue after 60 s
        claims = [
            claim("a", "train", E.LAUNCHED, E.REGISTERED, E.INITIALIZED, E.DISRUPT, E.DRAINED),
            claim("b", "infer", E.LAUNCHED, E.LOST),
            claim("c", "train", E.LAUNCH_FAILED),
        ]
        metrics.observe(claims, [], T0 + 70, gprs=[QueuedGpr("g1", False, T0)], result=Result(deleted=1))
        s = _samples(_get(url)[2])
        assert ("gpuscale_nodes", (("pool", "train"), ("state", "Initialized"))) not in s  # stale series removed
        assert ("gpuscale_nodes", (("pool", "infer"), ("state", "Launched"))) not in s
        assert s[("gpuscale_nodes", (("pool", "train"), ("state", "Deleting")))] == 1
        assert s[("gpuscale_launches_total", (("pool", "train"),))] == 1  # not counted again
        assert s[("gpuscale_launch_failures_total", (("pool", "train"), ("reason", "LaunchFailed")))] == 1
        assert s[("gpuscale_pending_gpu_pods", ())] == 0
        assert s[("gpuscale_gpr_queue_length", ())] == 0
        assert s[("gpuscale_gpr_wait_seconds_count", ())] == 1 and s[("gpuscale_gpr_wait_seconds_sum", ())] == 70
        assert s[("gpuscale_decisions_total", (("kind", "delete"),))] == 1
        names = {n for (n, _) in s}
        documented = {
            n
            for n in CONTROLLER
            if n.startswith(
                (
                    "gpuscale_nodes",
                    "gpuscale_gpus",
                    "gpuscale_pending",
                    "gpuscale_launch",
                    "gpuscale_decisions",
                    "gpuscale_hourly",
                    "gpuscale_gpr",
                )
            )
        }
        assert all(any(name.startswith(d) for name in names) for d in documented)
        assert _get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 404  # not served without a Health


def test_healthz_fails_when_the_loop_stalls() -> None:
    clock = ManualClock(T0)
    health = Health(clock, stall_after_s=60)
    with EndpointServer(0, health=health, host="127.0.0.1") as srv:
        url = f"http://127.0.0.1:{srv.port}/healthz"
        assert _get(url)[0] == 200
        health.beat()
        clock.advance_to(T0 + 59)
        assert _get(url)[:1] == (200,)
        clock.advance_to(T0 + 61)
        code, _, text = _get(url)
        assert code == 500 and "has not run for 61s" in text
        health.beat()
        assert _get(url)[0] == 200
        assert _get(f"http://127.0.0.1:{srv.port}/metrics")[0] == 404


def test_readyz_lists_each_check_and_a_broken_check_is_a_reason() -> None:
    health = Health(ManualClock(T0))
    state: dict[str, str | None] = {"cache": None}
    health.add("cache", lambda: state["cache"])

    def broken() -> str | None:
        raise RuntimeError("boom")

    with EndpointServer(0, health=health, host="127.0.0.1") as srv:
        url = f"http://127.0.0.1:{srv.port}/readyz?verbose"
        assert _get(url)[::2] == (200, "[+]cache ok\nreadyz check passed\n")
        state["cache"] = "pods: watch failing"
        code, _, text = _get(url)
        assert code == 503 and "[-]cache failed: pods: watch failing" in text
        health.add("broken", broken)
        state["cache"] = None
        code, _, text = _get(url)
        assert code == 503 and "[-]broken failed: RuntimeError: boom" in text


# ----------------------------------------------------------------- readiness from the real cache and elector
if TYPE_CHECKING:
    from gpuscale.fakes import kube_api
else:
    kube_api = pytest.importorskip("gpuscale.fakes.kube_api")
pytest.importorskip("lightkube")


@pytest.fixture
def server() -> Iterator[kube_api.KubeAPIServer]:
    with kube_api.KubeAPIServer() as srv:
        yield srv


def _wait(pred: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_readyz_follows_the_cache_and_the_lease_as_the_api_server_goes_and_comes_back(
    server: kube_api.KubeAPIServer,
) -> None:
    from lightkube import KubeConfig

    from gpuscale.clock import SystemClock
    from gpuscale.core.leader import ElectionConfig
    from gpuscale.kube.cache import KubeCache
    from gpuscale.kube.client import KubeClient
    from gpuscale.kube.leader import LeaderElector

    config = KubeConfig.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "t", "cluster": {"server": server.url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
            "current-context": "t",
        }
    ).get()
    assert config is not None
    client = KubeClient(config, timeout_s=2.0)
    cache = KubeCache(client).start()
    elector = LeaderElector(
        client.api, SystemClock(), namespace="gpuscale-system", identity="pod-a", config=ElectionConfig(3, 2, 0.5)
    )
    health = Health(SystemClock())
    health.add("cache", cache_check(cache))
    health.add("leader-election", leader_check(elector))
    try:
        with EndpointServer(0, health=health, host="127.0.0.1") as srv:
            url = f"http://127.0.0.1:{srv.port}/readyz"
            cache.wait_synced(15)
            assert client.run(elector.try_once())
            code, _, text = _get(url)
            assert code == 200, text
            server.stop()
            assert not client.run(elector.try_once())
            _wait(lambda: _get(url)[0] == 503 and "[-]cache failed" in _get(url)[2])
            code, _, text = _get(url)
            assert "[-]leader-election failed: cannot read lease" not in text  # still leading within the deadline
            time.sleep(2.1)
            code, _, text = _get(url)
            assert (
                code == 503
                and "[-]leader-election failed: cannot read lease gpuscale-system/gpuscale-controller" in text
            )
            server.start()
            assert client.run(elector.try_once())
            _wait(lambda: _get(url)[0] == 200, timeout=20)
    finally:
        cache.stop()
        client.close()


def test_endpoint_server_closes_its_port() -> None:
    srv = EndpointServer(0, health=Health(ManualClock()), host="127.0.0.1").start()
    port = srv.port
    assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    srv.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
