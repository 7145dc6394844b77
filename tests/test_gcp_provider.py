"""The GKE provider on the real google-cloud-container / google-cloud-compute SDKs (REST transport) against the fake
GCP API, which checks every request and response against Google's discovery documents. Its factory (GCP_FACTORY) joins
the provider contract in tests/test_provider_contract.py."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.oauth2.credentials import Credentials

from gpuscale.catalogs import gcp as gcp_catalog
from gpuscale.clock import ManualClock
from gpuscale.core.model import CapacityType, Taint, TaintEffect
from gpuscale.errors import (
    AuthenticationError,
    InsufficientCapacity,
    InvalidProviderRequest,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.fakes.gcp_api import FakeGcpAPI, discovery_document
from gpuscale.providers.base import CloudNodeState, LaunchRequest, ProviderEventKind
from gpuscale.providers.gcp import API_CALLS, GcpConfig, GcpProvider, machine_spec, pool_name
from gpuscale.providers.gcp_support import op_error
from shared_fake import FakeBackend, FakeFactory, SharedFake, checked, launched

CLUSTER = "projects/proj-1/locations/us-central1/clusters/gpu-c"
ZONES = ("us-central1-a", "us-central1-b")
DOC = Path(__file__).resolve().parents[1] / "docs" / "providers" / "gcp.md"

_SHARED = SharedFake(lambda: FakeGcpAPI().start())
_stop_shared = _SHARED.stopper()


def _fake(clock: ManualClock, **kw: float) -> FakeGcpAPI:
    fake = _SHARED.get()
    fake.reset()
    fake.clock = clock
    fake.op_delay_s = kw.get("op_delay_s", 0.0)
    fake.boot_delay_s = kw.get("boot_delay_s", 0.0)
    fake.create_cluster("proj-1", "us-central1", "gpu-c")
    return fake


def _provider(fake: FakeGcpAPI, clock: ManualClock, credentials: object = None, **kw: Any) -> GcpProvider:
    config = GcpConfig("proj-1", "us-central1", "gpu-c", ZONES, api_endpoint=fake.endpoint, timeout_s=5.0, **kw)
    return GcpProvider(config, credentials=credentials or AnonymousCredentials(), clock=clock)  # type: ignore[no-untyped-call]  # google-auth leaves __init__ unannotated


def _req(
    rid: str, count: int = 1, zone: str = "us-central1-a", itype: str = "g2-standard-8", **kw: Any
) -> LaunchRequest:
    return LaunchRequest(rid, "gpu", itype, zone, count=count, labels={"team": "ml"}, **kw)


class GcpBackend(FakeBackend[GcpProvider, FakeGcpAPI]):
    def exhaust_capacity(self, instance_type: str) -> None:
        spec = machine_spec(instance_type)
        assert spec is not None
        self.fake.stockout.add(spec.machine_type)

    def exhaust_quota(self) -> None:
        self.fake.gpu_quota = 0


def _backend(clock: ManualClock) -> GcpBackend:
    fake = _fake(clock)
    return GcpBackend(_provider(fake, clock), fake, "n1-standard-8-t4x1", "us-central1-a")


GCP_FACTORY = FakeFactory("gcp", _backend)


@pytest.fixture
def env() -> Iterator[tuple[FakeGcpAPI, ManualClock]]:
    clock = ManualClock(1_000.0)
    yield from checked(_fake(clock, op_delay_s=60.0, boot_delay_s=30.0), clock)


def test_pool_is_created_for_the_offering_with_gpus_spot_taint_labels_and_driver(
    env: tuple[FakeGcpAPI, ManualClock],
) -> None:
    fake, clock = env
    p = _provider(fake, clock, gpu_driver_version="LATEST")
    req = _req(
        "r1",
        count=2,
        itype="n1-standard-8-t4x2",
        capacity_type=CapacityType.SPOT,
        taints=(Taint("team", TaintEffect.NO_SCHEDULE, "ml"),),
    )
    p.launch(req)
    body = fake.pools(CLUSTER)[pool_name(req)]["body"]
    cfg = body["config"]
    assert body["initialNodeCount"] == 2 and body["locations"] == ["us-central1-a"]
    assert cfg["machineType"] == "n1-standard-8" and cfg["spot"] is True
    assert cfg["accelerators"] == [
        {
            "acceleratorCount": "2",
            "acceleratorType": "nvidia-tesla-t4",
            "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"},
        }
    ]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"} in cfg["taints"]
    assert {"key": "team", "value": "ml", "effect": "NO_SCHEDULE"} in cfg["taints"]
    assert cfg["labels"]["team"] == "ml" and cfg["labels"]["gpuscale.io/pool"] == "gpu"
    assert cfg["resourceLabels"] == {
        "gpuscale-cluster": "gpu-c",
        "gpuscale-pool": "gpu",
        "gpuscale-type": "n1-standard-8-t4x2",
    }


def test_operations_are_polled_across_rounds_and_node_ids_stay(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    launched = p.launch(_req("r1", count=2))
    ids = [n.node_id for n in launched]
    assert all(n.state is CloudNodeState.PROVISIONING and not n.node_name for n in launched)
    assert [n.node_id for n in p.list_nodes()] == ids  # the create operation is still running: slots only
    clock.sleep(61)
    nodes = p.list_nodes()
    assert [n.node_id for n in nodes] == ids
    assert all(n.node_name.startswith("gke-gpu-c-gpuscale-") and n.state is CloudNodeState.PROVISIONING for n in nodes)
    assert all(n.instance_id == n.node_name for n in nodes)  # a Node's providerID is gce://project/zone/NAME
    clock.sleep(61)
    assert {n.state for n in p.list_nodes()} == {CloudNodeState.RUNNING}
    assert fake.calls.count("container.projects.locations.clusters.nodePools.create") == 1


def test_growing_uses_set_size_and_waits_for_a_busy_pool(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    p.launch(_req("r1"))
    b = p.launch(_req("r2", count=2))  # the create is still running: the resize waits
    assert len(b) == 2 and "container.projects.locations.clusters.nodePools.setSize" not in fake.calls
    clock.sleep(61)
    p.list_nodes()
    assert fake.calls.count("container.projects.locations.clusters.nodePools.setSize") == 1
    clock.sleep(61)
    nodes = p.list_nodes()
    assert sorted(n.request_id for n in nodes) == ["r1", "r2", "r2"] and all(n.node_name for n in nodes)
    assert list(fake.pools(CLUSTER)) == [pool_name(_req("r1"))]
    assert fake.pools(CLUSTER)[pool_name(_req("r1"))]["target"] == 3


def test_scale_down_removes_exactly_the_chosen_vm_and_idle_pools_go(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    nodes = p.launch(_req("r1", count=3))
    clock.sleep(61)
    nodes = p.list_nodes()
    victim = nodes[1]
    p.delete_node(victim.node_id)
    clock.sleep(61)
    left = fake.pools(CLUSTER)[pool_name(_req("r1"))]["instances"]
    assert victim.node_name not in left and len(left) == 2 and fake.random_removals == 0
    for n in p.list_nodes():
        p.delete_node(n.node_id)
    clock.sleep(61)
    assert p.list_nodes() == []
    clock.sleep(61)
    p.poll_errors()
    assert fake.pools(CLUSTER) == {}


def test_relaunch_after_restart_finds_the_labelled_vms(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    first = _provider(fake, clock)
    ids = [n.node_id for n in first.launch(_req("r1", count=2))]
    clock.sleep(61)
    first.list_nodes()
    clock.sleep(61)  # the label writes are done
    second = _provider(fake, clock)
    assert [n.node_id for n in second.list_nodes()] == ids
    assert [n.node_id for n in second.launch(_req("r1", count=2))] == ids
    assert fake.calls.count("container.projects.locations.clusters.nodePools.create") == 1


def test_the_vm_of_a_slot_deleted_before_it_came_is_deleted(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    p.launch(_req("r1", count=2))
    nodes = p.list_nodes()
    p.delete_node(nodes[0].node_id)  # before its VM exists: the VM that comes for it is surplus
    clock.sleep(61)
    assert len(p.list_nodes()) == 1
    clock.sleep(61)
    assert len(fake.pools(CLUSTER)[pool_name(_req("r1"))]["instances"]) == 1
    assert fake.random_removals == 0


def test_async_stockout_fails_the_slots_and_marks_the_offering(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    fake.stockout.add("g2-standard-8")
    p = _provider(fake, clock)
    launched = p.launch(_req("r1", count=2))
    clock.sleep(61)
    events = p.poll_errors()
    assert {e.node_id for e in events} == {n.node_id for n in launched}
    assert all(
        e.kind is ProviderEventKind.LAUNCH_FAILED and "ZONE_RESOURCE_POOL_EXHAUSTED" in e.message for e in events
    )
    assert p.list_nodes() == []
    assert ("g2-standard-8", "us-central1-a", CapacityType.ON_DEMAND) in p.unavailable_offerings()
    with pytest.raises(InsufficientCapacity):
        p.launch(_req("r2"))
    assert len(p.launch(_req("r3", zone="us-central1-b", itype="g2-standard-4"))) == 1
    clock.sleep(400)
    fake.stockout.clear()
    assert len(p.launch(_req("r2"))) == 1  # the mark expired


def test_stockout_while_growing_is_read_from_the_mig_errors(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    launched(p, clock, _req("r1"))
    fake.stockout.add("g2-standard-8")
    grown = p.launch(_req("r2", count=2))
    clock.sleep(61)
    p.list_nodes()  # the resize operation is done, but the group could not create the VMs
    events = p.poll_errors()
    assert {e.node_id for e in events} == {n.node_id for n in grown}
    assert [n.request_id for n in p.list_nodes()] == ["r1"]
    assert "compute.instanceGroupManagers.listErrors" in fake.calls


def test_quota_is_refused_at_launch(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    fake.gpu_quota = 2
    p = _provider(fake, clock)
    launched(p, clock, _req("r1", count=2))
    with pytest.raises(QuotaExceeded, match="QUOTA_EXCEEDED"):
        p.launch(_req("r2"))
    assert [n.request_id for n in p.list_nodes()] == ["r1", "r1"]


@pytest.mark.parametrize(
    ("status", "reason", "error"),
    [
        (429, "rateLimitExceeded", RateLimited),
        (403, "forbidden", AuthenticationError),
        (401, "authError", AuthenticationError),
        (503, "backendError", TransientProviderError),
        (400, "invalid", InvalidProviderRequest),
        (429, "QUOTA_EXCEEDED", QuotaExceeded),
        (403, "QUOTA_EXCEEDED", QuotaExceeded),
        (429, "ZONE_RESOURCE_POOL_EXHAUSTED", InsufficientCapacity),
    ],
)
def test_errors_map_to_the_tree_and_are_not_retried(
    env: tuple[FakeGcpAPI, ManualClock], status: int, reason: str, error: type[Exception]
) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    fake.fail_next(status, method_id="container.projects.locations.clusters.nodePools.list", reason=reason)
    with pytest.raises(error) as info:
        p.list_nodes()
    if status != 401:  # a 401 makes google-auth refresh the credentials first: anonymous ones cannot be refreshed
        assert info.value.__cause__ is not None
    assert fake.calls.count("container.projects.locations.clusters.nodePools.list") == 1


def test_no_credential_in_errors_or_logs(env: tuple[FakeGcpAPI, ManualClock], caplog: pytest.LogCaptureFixture) -> None:
    fake, clock = env
    secret = "ya29.very-secret-access-token"
    p = _provider(fake, clock, credentials=Credentials(token=secret))  # type: ignore[no-untyped-call]  # google-auth: unannotated __init__
    caplog.set_level(logging.DEBUG)
    fake.fail_next(403, reason="forbidden", message="caller lacks container.nodePools.list")
    with pytest.raises(AuthenticationError) as info:
        p.list_nodes()
    p.launch(_req("r1"))
    texts = [str(info.value), repr(info.value), str(info.value.__cause__), caplog.text]
    assert not any(secret in t for t in texts)
    assert getattr(info.value.__cause__, "response", None) is None


def test_unknown_type_and_zone_are_invalid(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    with pytest.raises(InvalidProviderRequest, match="instance_type"):
        p.launch(_req("r1", itype="m5.large"))
    with pytest.raises(InvalidProviderRequest, match="zone"):
        p.launch(_req("r1", zone="europe-west4-a"))
    assert fake.calls == []


def test_the_fake_rejects_requests_its_discovery_document_does_not_allow(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, _ = env
    url = f"{fake.endpoint}/v1/{CLUSTER}/nodePools"
    for body in ({"nodePool": {"name": "x", "initialNodeCount": "two"}}, {"nodePool": {"name": "x", "bogus": 1}}):
        req = urllib.request.Request(
            url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 400
    assert len(fake.invalid_requests) == 2 and "bogus" in fake.invalid_requests[1]
    fake.invalid_requests.clear()


def test_machine_specs_agree_with_the_catalog() -> None:
    specs = gcp_catalog.machine_specs()
    assert specs
    for name, spec in specs.items():
        mine = machine_spec(name)
        assert mine is not None, name
        assert (mine.machine_type, mine.accelerator_type, mine.accelerator_count) == (
            spec.machine_type,
            spec.accelerator_type,
            spec.accelerator_count,
        ), name


def test_every_api_call_is_documented_and_real() -> None:
    text = DOC.read_text()
    docs = {"container": discovery_document("container.v1"), "compute": discovery_document("compute.v1")}
    for call in API_CALLS:
        assert call in docs[call.split(".")[0]].methods, call
        assert f"`{call}`" in text, f"{call} is not in {DOC.name}"


def test_every_call_the_provider_made_is_in_api_calls(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    launched(p, clock, _req("r1", count=2))
    p.launch(_req("r2"))
    clock.sleep(61)
    fake.stockout.add("g2-standard-8")
    p.launch(_req("r3"))
    clock.sleep(61)
    for n in p.list_nodes():
        p.delete_node(n.node_id)
    clock.sleep(61)
    p.poll_errors()
    clock.sleep(61)
    p.poll_errors()
    assert set(fake.calls) == set(API_CALLS)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            "Google Compute Engine: ZONE_RESOURCE_POOL_EXHAUSTED: the zone does not have enough resources",
            InsufficientCapacity,
        ),
        ("Instance 'gke-x' creation failed: GCE_STOCKOUT", InsufficientCapacity),
        ("RESOURCE_EXHAUSTED: Quota 'NVIDIA_L4_GPUS' exceeded. Limit: 8.0 in region us-central1.", QuotaExceeded),
        ("Insufficient regional quota to satisfy request: QUOTA_EXCEEDED", QuotaExceeded),
    ],
)
def test_failed_operation_messages_map_to_capacity_or_quota(message: str, error: type[Exception]) -> None:
    err = op_error(message, "create pool p")
    assert type(err) is error and err.provider == "gcp"


def test_vms_a_crashed_launch_never_labelled_are_listed_for_adoption(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    first = _provider(fake, clock)
    first.launch(_req("r1", count=2))  # crashes before it sees the VMs: they never get their labels
    clock.sleep(61)
    second = _provider(fake, clock)
    vms = fake.pools(CLUSTER)[pool_name(_req("r1"))]["instances"]
    adopted = second.list_nodes()
    assert sorted(n.node_id for n in adopted) == vms and {n.request_id for n in adopted} == {""}
    assert {(n.pool, n.instance_type, n.node_name == n.node_id) for n in adopted} == {("gpu", "g2-standard-8", True)}
    clock.sleep(3600)
    assert len(second.list_nodes()) == 2  # never deleted on a guess
    for n in adopted:
        second.delete_node(n.node_id)
    clock.sleep(61)
    second.poll_errors()  # the VMs are gone: the idle pool is deleted
    clock.sleep(61)
    second.poll_errors()
    assert fake.pools(CLUSTER) == {} and fake.random_removals == 0


def test_bound_vms_carry_request_and_slot_labels(env: tuple[FakeGcpAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    launched(p, clock, _req("r1", count=2))
    clock.sleep(61)
    p.list_nodes()
    url = f"{fake.endpoint}/compute/v1/projects/proj-1/zones/us-central1-a/instances"
    with urllib.request.urlopen(url, timeout=5) as resp:
        items = json.load(resp)["items"]
    assert sorted((i["labels"]["gpuscale-req"], i["labels"]["gpuscale-slot"]) for i in items) == [
        ("r1", "0"),
        ("r1", "1"),
    ]
