"""Two controller replicas' endpoints against the Kubernetes API emulator over real HTTP: exactly one may act, both
are ready (leader and standby), metrics and probes are served, and closing the leader hands the Lease over at once."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("lightkube")
pytest.importorskip("prometheus_client")

from gpuscale.clock import SystemClock
from gpuscale.core.leader import ElectionConfig
from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import ClaimEvent, new_claim, transition
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.cache import KubeCache
from gpuscale.kube.client import KubeClient
from gpuscale.kube.endpoints import ProcessEndpoints
from kube_harness import client_for

FAST = ElectionConfig(lease_duration_s=10.0, renew_deadline_s=5.0, retry_period_s=0.1)
NS = "gpuscale-system"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _wait(pred: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


class Replica:
    def __init__(self, server: KubeAPIServer, name: str, *, leader_elect: bool = True, port: int = 0) -> None:
        self.client: KubeClient = client_for(server)
        self.cache = KubeCache(self.client).start()
        self.cache.wait_synced(10)
        self.endpoints = ProcessEndpoints(
            self.client,
            self.cache,
            SystemClock(),
            namespace=NS,
            leader_elect=leader_elect,
            metrics_port=port,
            health_port=port,
            host="127.0.0.1",
            identity=name,
            election=FAST,
        ).start()
        self.closed = False

    def url(self, path: str) -> str:
        port = self.endpoints.ports[0 if path == "/metrics" else -1]
        return f"http://127.0.0.1:{port}{path}"

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.endpoints.close()
            self.cache.stop()
            self.client.close()


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        yield srv


def test_two_replicas_one_acts_both_ready_and_close_hands_over(server: KubeAPIServer) -> None:
    a, b = Replica(server, "pod-a"), Replica(server, "pod-b")
    try:
        _wait(lambda: a.endpoints.may_act() or b.endpoints.may_act())
        for _ in range(20):  # never both, over a couple of renewals
            assert [a.endpoints.may_act(), b.endpoints.may_act()].count(True) == 1
            time.sleep(0.02)
        leader, standby = (a, b) if a.endpoints.may_act() else (b, a)
        assert len(set(leader.endpoints.ports)) == 2  # metrics and health on their own ports
        assert _get(leader.url("/metrics").replace("/metrics", "/readyz"))[0] == 404
        for r in (leader, standby):
            code, text = _get(r.url("/readyz"))
            assert code == 200, text
            assert "[+]cache ok" in text and "[+]leader-election ok" in text
            assert _get(r.url("/healthz"))[0] == 200

        claim = new_claim("gs-1", "ada", "g2-gpu-rtx4000a1-s", "us-ord", CapacityType.ON_DEMAND, 0.0, hourly_price=0.52)
        claim = transition(claim, ClaimEvent.LAUNCHED, 1.0, node_id="linode://1")
        leader.endpoints.after_round([claim], [], None, 0.01)
        code, text = _get(leader.url("/metrics"))
        assert code == 200
        assert 'gpuscale_hourly_cost_dollars{pool="ada"} 0.52' in text
        assert 'gpuscale_launches_total{pool="ada"} 1.0' in text

        leader.close()
        start = time.monotonic()
        _wait(standby.endpoints.may_act, timeout=8.0)  # released: taken over before the 10 s lease could expire
        assert time.monotonic() - start < 8.0
        lease = server.get("leases", "gpuscale-controller", NS)
        assert lease is not None and lease["spec"]["holderIdentity"] == standby.endpoints.elector.identity  # type: ignore[union-attr]
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        for r in (a, b):
            r.close()


def test_one_port_serves_probes_and_metrics_without_leader_election(server: KubeAPIServer) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = Replica(server, "solo", leader_elect=False, port=port)
    try:
        assert r.endpoints.ports == [port] and r.endpoints.may_act()
        for path in ("/metrics", "/healthz", "/readyz"):
            assert _get(r.url(path))[0] == 200, path
        assert "gpuscale_pending_gpu_pods" in _get(r.url("/metrics"))[1]
    finally:
        r.close()
