"""The kwok provider's concurrent Node creates and the cache's slimmed objects, against the Kubernetes API emulator."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.cache import WATCHED, KubeCache
from gpuscale.kube.kwok import LAUNCHED_FOR_ANNOTATION, KwokConfig, KwokProvider
from gpuscale.providers.base import CloudNodeState, LaunchRequest, ProviderEventKind
from kube_harness import client_for

CATALOG = load_catalog("linode")
TYPE, ZONE = "g2-gpu-rtx4000a1-s", "us-ord"


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    s = KubeAPIServer().start()
    yield s
    s.close()


def _request(rid: str, pods: tuple[str, ...] = ()) -> LaunchRequest:
    return LaunchRequest(request_id=rid, pool="ada", instance_type=TYPE, zone=ZONE, pods=pods)


def test_launches_return_at_once_and_their_nodes_are_created_concurrently_within_the_bound(
    server: KubeAPIServer,
) -> None:
    client = client_for(server)
    provider = KwokProvider(client, CATALOG, ManualClock(1e6), KwokConfig(parallel_creates=3))
    real_create = client.api.create
    running, peak = 0, 0

    async def counted(obj: Any, *a: Any, **kw: Any) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(0.05)  # hold each create a moment so overlapping ones are seen
            return await real_create(obj, *a, **kw)
        finally:
            running -= 1

    client.api.create = counted
    try:
        launched = [provider.launch(_request(f"r{i}", (f"ml/p{i}",)))[0] for i in range(8)]
        assert all(n.state is CloudNodeState.PROVISIONING for n in launched)
        listed = {n.node_id: n for n in provider.list_nodes()}  # waits for the creates in flight
        assert set(listed) == {n.node_id for n in launched}
        assert peak == 3  # concurrent, never more than parallel_creates
        assert list(provider.poll_errors()) == []
        node = server.get("nodes", launched[5].node_id)
        assert node is not None
        assert node["metadata"]["annotations"][LAUNCHED_FOR_ANNOTATION] == "ml/p5"
        again = provider.launch(_request("r5", ("ml/p5",)))  # same request id: the same node, no second create
        assert [n.node_id for n in again] == [launched[5].node_id]
        assert len(provider.list_nodes()) == 8
    finally:
        client.close()


def test_a_refused_create_is_a_launch_failed_event_for_its_request(server: KubeAPIServer) -> None:
    client = client_for(server)
    provider = KwokProvider(client, CATALOG, ManualClock(1e6), KwokConfig())
    try:
        server.stop()  # the API server goes away: the create cannot be made
        [node] = provider.launch(_request("lost"))
        assert node.state is CloudNodeState.PROVISIONING
        [event] = provider.poll_errors()
        assert event.kind is ProviderEventKind.LAUNCH_FAILED
        assert event.request_id == "lost" and event.node_id == node.node_id
        assert list(provider.poll_errors()) == []
    finally:
        client.close()


def test_a_long_pod_list_is_cut_at_a_pod_boundary(server: KubeAPIServer) -> None:
    client = client_for(server)
    provider = KwokProvider(client, CATALOG, ManualClock(1e6), KwokConfig())
    pods = tuple(f"ml/train-{i:04d}" for i in range(200))
    try:
        [node] = provider.launch(_request("many", pods))
        provider.settle()
        stored = server.get("nodes", node.node_id)
        assert stored is not None
        text = stored["metadata"]["annotations"][LAUNCHED_FOR_ANNOTATION]
        assert len(text) <= 1024
        assert text.split(",") == list(pods[: len(text.split(","))])
    finally:
        client.close()


def test_the_cache_keeps_pods_as_plain_dicts_without_managed_fields(server: KubeAPIServer) -> None:
    managed = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    server.create("pods", {"metadata": {"name": "a", "managedFields": managed}, "spec": {"containers": []}}, "ml")
    client = client_for(server)
    cache = KubeCache(client, tuple(w for w in WATCHED if w.name in ("pods", "nodes"))).start()
    try:
        cache.wait_synced(10)
        server.create("pods", {"metadata": {"name": "b", "managedFields": managed}, "spec": {"containers": []}}, "ml")
        for _ in range(100):
            if cache.get("pods", "ml/b") is not None:
                break
            time.sleep(0.05)
        for key in ("ml/a", "ml/b"):  # from the list and from the watch
            obj = cache.get("pods", key)
            assert type(obj) is dict
            assert "managedFields" not in obj["metadata"]
            assert obj["metadata"]["name"] == key[3:]
    finally:
        cache.stop()
        client.close()
