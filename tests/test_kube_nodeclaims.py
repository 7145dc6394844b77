"""GPUNodeClaim objects over real HTTP against the emulated API server: written as claims change, deleted when a
node goes, read back by a restarted controller (no duplicate launch after a crash), bad records reported and
ignored, and failed writes retried in a later round without holding a round up."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL
from gpuscale.fakes.kube_api import KubeAPIEmulator, KubeAPIServer
from gpuscale.kube.command import ControllerProcess
from gpuscale.kube.kwok import KwokConfig, KwokProvider
from gpuscale.manifests.nodeclaims import rfc3339
from gpuscale.providers.base import CloudNode, LaunchRequest
from kube_harness import CONFIG, client_for, kwok_pool
from test_kube_e2e import World, gpu_pod

pytest.importorskip("lightkube")

CATALOG = load_catalog("linode")
RES = "gpunodeclaims"


class Killed(BaseException):
    """The controller process dies (nothing in the controller catches it)."""


class LaggingKwok(KwokProvider):
    """kwok nodes, with the first ``hidden`` node lists coming back empty (a cloud whose list lags its launches),
    an optional crash right after the launch call returned, and a log of the request ids launched."""

    def __init__(self, *args: Any, hidden: int = 0, crash: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.hidden = hidden
        self.crash = crash
        self.launched: list[str] = []

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        self.launched.append(request.request_id)
        nodes = super().launch(request)
        if self.crash:
            self.settle()  # the cloud made the node; the controller dies before recording the answer
            raise Killed
        return nodes

    def list_nodes(self) -> Sequence[CloudNode]:
        nodes = super().list_nodes()
        if self.hidden > 0:
            self.hidden -= 1
            return []
        return nodes


class ClaimWorld(World):
    """The e2e world whose controller runs on a :class:`LaggingKwok` (replaced on each start by ``next_provider``)."""

    def __init__(
        self, server: KubeAPIServer, *, check: bool = True, kwok: KwokConfig | None = None, **provider: Any
    ) -> None:
        self.check = check
        self.next_provider = provider
        self.providers: list[LaggingKwok] = []
        super().__init__(server, kwok)

    def start(self) -> ControllerProcess:
        client = client_for(self.server)
        opts, self.next_provider = self.next_provider, {}

        def make() -> LaggingKwok:
            p = LaggingKwok(client, CATALOG, self.clock, self.kwok, cache=proc.cache, **opts)
            self.providers.append(p)
            return p

        proc = ControllerProcess(client, CATALOG, "kwok", clock=self.clock, config=CONFIG, provider_factory=make)
        return proc.start(sync_timeout_s=5, check=self.check)

    def round(self, advance: float = 0.0) -> None:
        super().round(advance)
        self.written()

    def written(self) -> None:
        """Let the GPUNodeClaim writes in flight land and the watch deliver them."""
        assert self.proc.nodeclaims is not None
        self.proc.nodeclaims.settle()
        self.settle()

    def kill(self) -> None:
        """Stop the process without any shutdown write."""
        if self.proc.scalers is not None:
            self.proc.scalers.close()
        self.proc.cache.stop()
        time.sleep(0.1)  # let the watches see their cancellation
        self.proc.client.close()


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", kwok_pool(consolidate_after="60s"))
        yield srv


def _records(server: KubeAPIServer) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in server.items(RES)}


def _bound(server: KubeAPIServer, name: str) -> str | None:
    pod = server.get("pods", name, namespace="ml")
    return None if pod is None else (pod.get("spec") or {}).get("nodeName")


def test_a_scale_up_is_recorded_until_initialized_and_the_record_goes_with_the_node(server: KubeAPIServer) -> None:
    w = ClaimWorld(server)
    try:
        server.create("pods", gpu_pod("train-0"), namespace="ml")
        w.scheduler.step()
        w.until(lambda: bool(w.kwok_nodes()))
        w.written()
        (rid,) = _records(server)
        (node,) = w.kwok_nodes()
        assert node["metadata"]["labels"][REQUEST_ID_LABEL] == rid
        w.until(lambda: _records(server)[rid].get("status", {}).get("phase") == "Initialized")
        obj = _records(server)[rid]
        name = node["metadata"]["name"]
        assert obj["spec"]["pool"] == "ada" and obj["spec"]["instanceType"] == "g2-gpu-rtx4000a1-s"
        assert obj["spec"]["pods"] == ["ml/train-0"]
        assert obj["status"]["nodeName"] == name and obj["status"]["providerID"] == name
        assert obj["metadata"]["labels"] == {"gpuscale.io/pool": "ada"}
        w.until(lambda: _bound(server, "train-0") is not None)
        w.scheduler.complete("ml/train-0")
        w.until(lambda: not w.kwok_nodes(), advance=40)  # consolidateAfter 60s: drained, deleted
        w.until(lambda: not _records(server), advance=5)
        writes = [r for r in server.requests() if r[1].startswith(RES)]
        assert ("create", "gpunodeclaims.gpuscale.io") in writes and ("delete", "gpunodeclaims.gpuscale.io") in writes
        assert len(writes) <= 8, writes  # a create, a few coalesced status patches, a delete
    finally:
        w.close()


def test_killed_between_the_launch_call_and_the_listing_a_restart_relaunches_the_same_id(
    server: KubeAPIServer,
) -> None:
    w = ClaimWorld(server, kwok=KwokConfig(device_plugin_delay_s=30.0), crash=True)
    try:
        server.create("pods", gpu_pod("job-0"), namespace="ml")
        w.scheduler.step()
        w.settle()
        with pytest.raises(Killed):
            w.proc.step()
        w.written()  # the record's create went out before the launch call (a cloud call takes longer than it)
        w.kill()
        (rid,) = w.providers[0].launched
        record = _records(server)[rid]
        assert record.get("status", {}).get("phase", "Requested") == "Requested"
        assert record["spec"]["pods"] == ["ml/job-0"]
        assert len(w.kwok_nodes()) == 1, "the node was made"
        # meanwhile the job's pod is replaced by one of another name: a fresh plan would launch under a new id
        server.delete("pods", "job-0", namespace="ml")
        server.create("pods", gpu_pod("job-1"), namespace="ml")
        w.scheduler.step()

        w.next_provider = {"hidden": 3}  # the new controller's first lists do not show the node yet
        w.proc = w.start()
        w.round(1)
        restarted = w.providers[1]
        claim = w.proc.controller.claims[rid]
        assert claim.pods == ("ml/job-0",), "restored from the record (an adopted node has no pods)"
        assert restarted.launched == [rid], "launched again under the recorded id, nothing else"
        w.until(lambda: _bound(server, "job-1") is not None, advance=10)
        assert len(w.kwok_nodes()) == 1 and restarted.launched == [rid], "no duplicate node"
        w.until(lambda: _records(server)[rid].get("status", {}).get("phase") == "Initialized")
        assert list(_records(server)) == [rid]
    finally:
        w.close()


def _record(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpuscale.io/v1alpha1",
        "kind": "GPUNodeClaim",
        "metadata": {"name": name},
        "spec": {
            "requestId": name,
            "pool": "ada",
            "instanceType": "g2-gpu-rtx4000a1-s",
            "zone": "us-ord",
            "capacityType": "on-demand",
            "hourlyPrice": 0.52,
            "requestedAt": "1970-01-12T13:45:00Z",  # shortly before the world's clock
        },
    }


def _put(server: KubeAPIServer, obj: dict[str, Any], **status: Any) -> None:
    server.create(RES, obj)  # the server drops a new object's status: it is written through /status
    if status:
        server.patch(RES, obj["metadata"]["name"], {"status": status}, status=True)


def test_records_of_gone_nodes_are_deleted_and_bad_records_reported_and_ignored(server: KubeAPIServer) -> None:
    _put(server, _record("gs-gone"), phase="Initialized", providerID="kwok-x", nodeName="kwok-x")
    bad = _record("gs-bad")
    bad["spec"]["capacityType"] = "reserved"
    bad["spec"]["colour"] = "blue"
    _put(server, bad)
    w = ClaimWorld(server)
    try:
        w.round(1)
        w.round(1)
        assert w.proc.rounds == 2, "a bad record never stops a round"
        records = _records(server)
        assert "gs-gone" not in records, "its node is gone and the provider does not list it"
        assert "gs-bad" in records, "reported and left alone"
        assert w.proc.nodeclaims is not None
        (warning,) = w.proc.nodeclaims.warnings
        assert "spec.capacityType" in warning and "spec.colour" in warning
        (event,) = w.events("BadNodeClaim")
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == "gs-bad"  # type: ignore[index]
        assert not w.proc.controller.claims and not w.kwok_nodes(), "nothing launched for either"
        server.create("pods", gpu_pod("after-0"), namespace="ml")  # the controller works on
        w.scheduler.step()
        w.until(lambda: _bound(server, "after-0") is not None)
    finally:
        w.close()


def test_refused_writes_are_retried_in_a_later_round_without_holding_a_round_up() -> None:
    emulator = KubeAPIEmulator(forbidden={("create", "gpunodeclaims.gpuscale.io")})
    with KubeAPIServer(emulator) as server:
        server.create("gpunodepools", kwok_pool(consolidate_after="60s"))
        w = ClaimWorld(server, check=False)
        try:
            server.create("pods", gpu_pod("r-0"), namespace="ml")
            w.scheduler.step()
            started = time.perf_counter()
            w.round(0)
            assert len(w.kwok_nodes()) == 1, "the launch went ahead"
            writer = w.proc.nodeclaims
            assert writer is not None and writer.failed == 1 and writer.busy, "kept for a later round"
            emulator.forbidden = set()
            w.round(0.5)  # not due yet: retried 1 s after the failure
            assert not _records(server) and writer.failed == 1
            w.round(1.0)
            (rid,) = w.proc.controller.claims
            assert rid in _records(server)
            w.until(lambda: _records(server)[rid].get("status", {}).get("phase") == "Initialized")
            assert time.perf_counter() - started < 10
        finally:
            w.close()


def test_kubectl_get_gpunodeclaims_shows_phase_type_node_and_age() -> None:
    from gpuscale.manifests.crds import crd_specs

    spec = next(s for s in crd_specs() if s.kind == "GPUNodeClaim")
    columns = {c["name"]: c for c in spec.manifest()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Phase"]["jsonPath"] == ".status.phase" and columns["Node"]["jsonPath"] == ".status.nodeName"
    assert columns["Type"]["jsonPath"] == ".spec.instanceType" and columns["Age"]["type"] == "date"
    assert "priority" not in columns["Phase"] and "priority" not in columns["Node"], "shown without -o wide"


def test_launch_attempts_are_kept_on_the_record_and_restored(server: KubeAPIServer) -> None:
    _put(server, _record("gs-retry"), phase="Requested", phaseSince="1970-01-12T13:45:30Z", launchAttempts=2)
    w = ClaimWorld(server)
    try:
        w.settle()
        proc, writer = w.proc, w.proc.nodeclaims
        assert writer is not None
        restored = writer.restore(proc.controller, proc.cache.objects(RES), {})
        assert restored is not None and list(restored.claims) == ["gs-retry"]
        assert proc.controller.launcher.attempts == {"gs-retry": 2}
        proc.controller.launcher.attempts["gs-retry"] = 3  # another failed try
        writer.flush()
        w.written()
        status = _records(server)["gs-retry"]["status"]
        assert status["launchAttempts"] == 3 and status["phase"] == "Requested"
        assert status["phaseSince"] == rfc3339(w.clock.now()), "a fresh launch deadline"
    finally:
        w.close()
