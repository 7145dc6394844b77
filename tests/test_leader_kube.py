"""Leader election over real HTTP against the Kubernetes API emulator: two replicas, one acts; the standby takes over
after expiry; simultaneous writers are settled by resourceVersion; a leader cut off from the API server stops acting
within the renew deadline; release on shutdown hands over at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from gpuscale.clock import ManualClock, SystemClock
from gpuscale.core.leader import ElectionConfig

if TYPE_CHECKING:
    from gpuscale.fakes import kube_api
else:
    kube_api = pytest.importorskip("gpuscale.fakes.kube_api")
pytest.importorskip("lightkube")

from lightkube import AsyncClient, KubeConfig

from gpuscale.kube.leader import PERMISSIONS, LeaderElector, default_identity

CFG = ElectionConfig(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)

NS = "gpuscale-system"


def _tick(clock: ManualClock, seconds: float) -> None:
    clock.advance_to(clock.now() + seconds)


@pytest.fixture
def server() -> Iterator[kube_api.KubeAPIServer]:
    with kube_api.KubeAPIServer() as srv:
        yield srv


def _client(url: str) -> AsyncClient:
    config = KubeConfig.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "t", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
            "current-context": "t",
        }
    )
    return AsyncClient(config.get())


def _pair(url: str, clock: ManualClock) -> tuple[LeaderElector, LeaderElector]:
    return (
        LeaderElector(_client(url), clock, namespace=NS, identity="pod-a", config=CFG),
        LeaderElector(_client(url), clock, namespace=NS, identity="pod-b", config=CFG),
    )


def test_two_replicas_one_leads_and_the_standby_takes_over_after_expiry(server: kube_api.KubeAPIServer) -> None:
    clock = ManualClock(1_800_000_000.0)

    async def scenario() -> None:
        a, b = _pair(server.url, clock)
        assert await a.try_once() and not await b.try_once()
        assert a.is_leader() and not b.is_leader() and b.status().holder == "pod-a"
        lease = server.get("leases", "gpuscale-controller", NS)
        assert lease is not None
        spec = lease["spec"]
        assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("pod-a", 15, 0)
        assert spec["renewTime"].startswith("2027-01-15T08:00:00")
        for _ in range(5):  # a renews, b stays standby
            _tick(clock, 2)
            assert await a.try_once() and not await b.try_once()
        version = lease["metadata"]["resourceVersion"]
        renewed = server.get("leases", "gpuscale-controller", NS)
        assert renewed is not None and renewed["metadata"]["resourceVersion"] != version
        # a stops renewing (hung): it stops acting at the renew deadline, before b may take over at the duration
        _tick(clock, CFG.renew_deadline_s)
        assert not a.is_leader() and not await b.try_once()
        _tick(clock, CFG.lease_duration_s - CFG.renew_deadline_s)
        assert await b.try_once() and b.is_leader()
        taken = server.get("leases", "gpuscale-controller", NS)
        assert taken is not None
        assert (taken["spec"]["holderIdentity"], taken["spec"]["leaseTransitions"]) == ("pod-b", 1)
        # a comes back: it sees b's lease and stands by
        _tick(clock, 1)
        assert not await a.try_once() and not a.is_leader() and b.is_leader()
        await a.client.close()
        await b.client.close()

    asyncio.run(scenario())
    verbs = {pair for pair in server.requests() if pair[1].startswith("leases")}
    assert verbs == set(PERMISSIONS)


def test_simultaneous_writers_one_wins_by_resource_version(server: kube_api.KubeAPIServer) -> None:
    clock = ManualClock(1_800_000_000.0)

    async def scenario() -> None:
        a, b = _pair(server.url, clock)
        won = await asyncio.gather(a.try_once(), b.try_once())
        assert sorted(won) == [False, True]
        # both see the lease expire and both try to take it over in the same round: one update gets 409
        c = LeaderElector(_client(server.url), clock, namespace=NS, identity="pod-c", config=CFG)
        assert not await c.try_once()
        loser = b if won[0] else a
        _tick(clock, CFG.lease_duration_s)
        results = await asyncio.gather(loser.try_once(), c.try_once())
        assert sorted(results) == [False, True] and loser.last_error == c.last_error == ""
        taken = server.get("leases", "gpuscale-controller", NS)
        assert taken is not None and taken["spec"]["leaseTransitions"] == 1
        for e in (a, b, c):
            await e.client.close()

    asyncio.run(scenario())


def test_a_leader_cut_off_from_the_api_server_stops_acting_within_the_renew_deadline(
    server: kube_api.KubeAPIServer,
) -> None:
    clock = ManualClock(1_800_000_000.0)

    async def scenario() -> None:
        a, _ = _pair(server.url, clock)
        assert await a.try_once()
        server.stop()
        _tick(clock, CFG.retry_period_s)
        assert not await a.try_once()
        assert a.is_leader() and "cannot read lease" in a.last_error  # still inside the renew deadline
        _tick(clock, CFG.renew_deadline_s - CFG.retry_period_s)
        assert not a.is_leader() and not a.status().leading
        server.start()
        assert await a.try_once() and a.is_leader() and a.last_error == ""
        await a.client.close()

    asyncio.run(scenario())


def test_run_loop_two_replicas_over_real_time_and_release_on_stop(server: kube_api.KubeAPIServer) -> None:
    fast = ElectionConfig(lease_duration_s=10.0, renew_deadline_s=5.0, retry_period_s=0.1)

    async def scenario() -> None:
        clock = SystemClock()
        a = LeaderElector(_client(server.url), clock, namespace=NS, identity="pod-a", config=fast)
        b = LeaderElector(_client(server.url), clock, namespace=NS, identity="pod-b", config=fast)
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.run(stop_b))]
        start = time.monotonic()
        while not (a.is_leader() or b.is_leader()):
            await asyncio.sleep(0.02)
            assert time.monotonic() - start < 10
        samples = []
        for _ in range(15):
            await asyncio.sleep(0.05)
            samples.append((a.is_leader(), b.is_leader()))
        assert all((x, y).count(True) == 1 for x, y in samples)  # one leader, through several renewals
        first, second, stop_first = (a, b, stop_a) if a.is_leader() else (b, a, stop_b)
        stop_first.set()
        start = time.monotonic()
        while not second.is_leader():  # the standby takes over on its next round
            await asyncio.sleep(0.02)
            assert time.monotonic() - start < 4.0  # released: not the 10 s lease duration
            assert not first.is_leader()
        (stop_b if second is b else stop_a).set()
        await asyncio.gather(*tasks)
        lease = server.get("leases", "gpuscale-controller", NS)
        assert lease is not None and "holderIdentity" not in lease["spec"]  # the last one released it too
        for e in (a, b):
            await e.client.close()

    asyncio.run(scenario())


def test_identity_and_timing_checks() -> None:
    assert default_identity({"POD_NAME": "ctl-7d9f"}).startswith("ctl-7d9f_")
    assert default_identity({"POD_NAME": "x"}) != default_identity({"POD_NAME": "x"})
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(_client("http://127.0.0.1:1"), ManualClock(), namespace=NS, config=ElectionConfig(5, 10, 1))
