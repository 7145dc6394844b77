"""GprManager: reconcile through a stateful fake provider, ENABLE_DYNAMIC_NODE=false, missing LINODE_TOKEN."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from builders import GPR_SPEC
from gpuscale.clock import ManualClock
from gpuscale.core.gpr import GPR_LABEL, GPR_TAINT, GprConfig, GprNode, GprState, Trigger
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering, TaintEffect
from gpuscale.errors import InsufficientCapacity, ProviderError, TransientProviderError
from gpuscale.gpr.manager import GprManager, StaticInventory, config_from_env
from gpuscale.gpr.store import GprStore
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    ProviderCapabilities,
    ProviderEvent,
    ProviderEventKind,
)
from gpuscale.providers.registry import linode_factory
from gpuscale.sim.wallclock import WallClockSimCloud

T0 = 1_700_000_000.0
TOKEN_MESSAGE = "LINODE_TOKEN environment variable is not set"


def _it(name: str, model: str, gpus: int, price: float) -> InstanceType:
    return InstanceType(
        name=name,
        provider="linode",
        vcpus=8,
        memory_mib=65536,
        gpu_count=gpus,
        gpu_model=model,
        gpu_memory_mib=20480,
        offerings=(Offering("us-ord", CapacityType.ON_DEMAND, price),),
    )


CATALOG = Catalog(
    "test", (_it("g2-rtx4000a1-s", "RTX4000-Ada", 1, 0.52), _it("g2-rtx4000a4-s", "RTX4000-Ada", 4, 2.96))
)


class FakeProvider:
    """A stateful provider: nodes per request id (idempotent), READY when told, faults queued per method."""

    name = "fake"

    def __init__(self) -> None:
        self.nodes: dict[str, CloudNode] = {}
        self.by_request: dict[str, list[str]] = {}
        self.launch_calls: list[LaunchRequest] = []
        self.delete_calls: list[str] = []
        self.list_calls = 0
        self.faults: dict[str, list[ProviderError]] = {}
        self.events: list[ProviderEvent] = []
        self._seq = 0

    @property
    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(zones=("us-ord",))

    def _fault(self, method: str) -> None:
        queue = self.faults.get(method)
        if queue:
            raise queue.pop(0)

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        self.launch_calls.append(request)
        self._fault("launch")
        if request.request_id in self.by_request:
            return [self.nodes[i] for i in self.by_request[request.request_id] if i in self.nodes]
        ids = []
        for _ in range(request.count):
            self._seq += 1
            nid = f"{self._seq}"
            self.nodes[nid] = CloudNode(
                node_id=nid,
                request_id=request.request_id,
                pool=request.pool,
                instance_type=request.instance_type,
                zone=request.zone,
                capacity_type=request.capacity_type,
                state=CloudNodeState.PROVISIONING,
                node_name=f"lke-{nid}",
                labels=dict(request.labels),
            )
            ids.append(nid)
        self.by_request[request.request_id] = ids
        return [self.nodes[i] for i in ids]

    def make_ready(self) -> None:
        from dataclasses import replace

        for nid, n in self.nodes.items():
            self.nodes[nid] = replace(n, state=CloudNodeState.READY)

    def delete_node(self, node_id: str) -> None:
        self.delete_calls.append(node_id)
        self._fault("delete_node")
        self.nodes.pop(node_id, None)

    def list_nodes(self) -> Sequence[CloudNode]:
        self.list_calls += 1
        self._fault("list_nodes")
        return list(self.nodes.values())

    def poll_errors(self) -> Sequence[ProviderEvent]:
        out, self.events = self.events, []
        return out


def manager(tmp_path: Path, provider: FakeProvider | None = None, **kw: Any) -> tuple[GprManager, ManualClock]:
    clock = ManualClock(T0)
    store = GprStore(tmp_path / "gpr.db")
    return GprManager(store, CATALOG, provider=provider, clock=clock, **kw), clock


SPEC = GPR_SPEC


def test_dynamic_scale_up_lifecycle_deletes_nodes_by_id(tmp_path: Path) -> None:
    cloud = FakeProvider()
    m, clock = manager(tmp_path, cloud, config=GprConfig(provider="fake"))
    g = m.create(SPEC)
    r1 = m.reconcile()
    assert r1.launched == [f"{g.gpr_id}-a0"]
    (req,) = cloud.launch_calls
    assert req.count == 2 and req.instance_type == "g2-rtx4000a4-s" and req.labels[GPR_LABEL] == g.gpr_id
    assert [(t.key, t.value, t.effect) for t in req.taints] == [(GPR_TAINT, g.gpr_id, TaintEffect.NO_SCHEDULE)]
    g1 = m.get(g.gpr_id)
    assert g1.state is GprState.PROVISIONING and g1.status.scale_up_triggered
    assert g1.status.node_pool_details.node_ids == ("1", "2")
    # Not ready yet: the launch is repeated with the same request id and creates nothing new.
    clock.sleep(30)
    m.reconcile()
    assert len(cloud.nodes) == 2 and {c.request_id for c in cloud.launch_calls} == {f"{g.gpr_id}-a0"}
    cloud.make_ready()
    clock.sleep(30)
    m.reconcile()
    g2 = m.get(g.gpr_id)
    assert g2.state is GprState.PROVISIONED and g2.status.node_list == ("lke-1", "lke-2")
    assert g2.status.num_gpus_allocated == 8 and g2.status.cost == pytest.approx(2 * 2.96 * 8)
    clock.sleep(8 * 3600)
    r = m.reconcile()
    assert m.get(g.gpr_id).state is GprState.COMPLETE
    assert sorted(r.deleted) == ["1", "2"] and cloud.nodes == {}
    assert isinstance(m.store, GprStore)  # the SQLite store, which also keeps the transition events
    assert [e.trigger for e in m.store.events(g.gpr_id)] == [Trigger.ADMIT, Trigger.NODES_READY, Trigger.EXIT_DURATION]
    assert m.store.journal(pending_only=True) == []


def test_transient_launch_error_retries_with_same_request_id(tmp_path: Path) -> None:
    cloud = FakeProvider()
    cloud.faults["launch"] = [TransientProviderError("503", provider="fake")]
    m, clock = manager(tmp_path, cloud)
    g = m.create({**SPEC, "numberOfGPUNodes": 1})
    r = m.reconcile()
    assert r.launched == [] and "503" in r.errors[0]
    assert m.get(g.gpr_id).state is GprState.PROVISIONING and cloud.nodes == {}
    clock.sleep(5)
    assert m.reconcile().launched == [f"{g.gpr_id}-a0"]
    assert len(cloud.nodes) == 1


def test_capacity_error_fails_the_attempt_and_requeue_uses_a_new_request_id(tmp_path: Path) -> None:
    cloud = FakeProvider()
    cloud.faults["launch"] = [InsufficientCapacity("no RTX4000 Ada in us-ord", provider="fake")]
    m, clock = manager(tmp_path, cloud)
    g = m.create({**SPEC, "requeueOnFailure": True})
    m.reconcile()
    failed = m.get(g.gpr_id)
    assert failed.state is GprState.FAILED and "no RTX4000 Ada" in failed.status.failure_reason
    clock.sleep(5)
    m.reconcile()
    # The only candidate offering is marked out of capacity: the requeued GPR waits for the mark to expire.
    waiting = m.get(g.gpr_id)
    assert waiting.state is GprState.QUEUED and waiting.status.retry_count == 1
    assert "insufficient capacity for every candidate offering" in waiting.status.failure_reason
    assert len(cloud.launch_calls) == 1
    clock.sleep(m.config.unavailable_ttl_s)
    m.reconcile()
    again = m.get(g.gpr_id)
    assert again.state is GprState.PROVISIONING and again.status.retry_count == 1
    assert cloud.launch_calls[-1].request_id == f"{g.gpr_id}-a1"


def test_async_launch_failure_event_fails_provisioning(tmp_path: Path) -> None:
    cloud = FakeProvider()
    m, clock = manager(tmp_path, cloud)
    g = m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    cloud.events.append(
        ProviderEvent(ProviderEventKind.LAUNCH_FAILED, node_id="1", request_id=f"{g.gpr_id}-a0", message="boom")
    )
    clock.sleep(5)
    r = m.reconcile()
    assert m.get(g.gpr_id).state is GprState.FAILED and m.get(g.gpr_id).status.failure_reason == "boom"
    assert r.deleted == ["1"] and cloud.nodes == {}


def test_list_failure_skips_the_pass_instead_of_declaring_nodes_lost(tmp_path: Path) -> None:
    cloud = FakeProvider()
    m, _ = manager(tmp_path, cloud)
    g = m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    cloud.make_ready()
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONED
    cloud.faults["list_nodes"] = [TransientProviderError("timeout", provider="fake")]
    r = m.reconcile()
    assert r.skipped and m.get(g.gpr_id).state is GprState.PROVISIONED


def test_idle_timeout_from_utilization_releases_and_deletes(tmp_path: Path) -> None:
    cloud = FakeProvider()
    util: dict[str, float] = {}
    m, clock = manager(tmp_path, cloud, utilization=lambda: util)
    g = m.create({**SPEC, "numberOfGPUNodes": 1, "idleTimeOutDuration": "30m"})
    m.reconcile()
    cloud.make_ready()
    m.reconcile()
    util["lke-1"] = 0.0
    clock.sleep(60)
    m.reconcile()
    clock.sleep(1800)
    r = m.reconcile()
    assert m.get(g.gpr_id).state is GprState.RELEASED and r.deleted == ["1"]


def test_dynamic_nodes_disabled_serves_inventory_only_and_never_touches_the_provider(tmp_path: Path) -> None:
    built: list[int] = []

    def factory() -> FakeProvider:
        built.append(1)
        return FakeProvider()

    inv = StaticInventory(
        [GprNode(name=f"n{i}", instance_type="g2-rtx4000a4-s", gpu_model="RTX4000-Ada", gpu_count=4) for i in (1, 2)]
    )
    cfg = config_from_env({"ENABLE_DYNAMIC_NODE": "false"})
    m, clock = manager(tmp_path, None, provider_factory=factory, inventory=inv, config=cfg)
    g = m.create(SPEC)
    other = m.create({**SPEC, "numberOfGPUNodes": 1, "priority": 50})
    m.reconcile()
    assert {n.name: n.gpr_id for n in inv.nodes()} == {"n1": g.gpr_id, "n2": g.gpr_id}
    assert inv.taints["n1"][0].value == g.gpr_id
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONED
    waiting = m.get(other.gpr_id)
    assert waiting.state is GprState.QUEUED and "ENABLE_DYNAMIC_NODE is false" in waiting.status.failure_reason
    assert waiting.status.estimated_wait_time_s == pytest.approx(8 * 3600)
    m.release(g.gpr_id)
    clock.sleep(10)
    r = m.reconcile()
    assert m.get(g.gpr_id).state is GprState.RELEASED
    # The freed inventory goes to the waiting GPR in the same pass: n1 is relabelled, n2 unlabelled.
    assert r.assigned == ["n1"] and r.unassigned == ["n2"] and r.deleted == []
    assert m.get(other.gpr_id).state is GprState.PROVISIONING
    assert {n.name: n.gpr_id for n in inv.nodes()} == {"n1": other.gpr_id, "n2": None}
    assert built == []


def test_missing_linode_token_is_reported_exactly_and_no_call_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpuscale.providers.linode import LinodeConfig, LinodeProvider

    calls: list[str] = []

    def factory() -> LinodeProvider:
        calls.append("construct")
        return LinodeProvider(LinodeConfig(cluster_id=1, region="us-ord", base_url="http://127.0.0.1:9"), env={})

    caplog.set_level(logging.INFO)
    m, clock = manager(tmp_path, None, provider_factory=factory)
    g = m.create(SPEC)
    r = m.reconcile()
    got = m.get(g.gpr_id)
    assert got.state is GprState.QUEUED and got.status.failure_reason == TOKEN_MESSAGE
    assert r.launched == [] and m.blocked_reason == TOKEN_MESSAGE
    clock.sleep(60)
    m.reconcile()
    assert calls == ["construct"]  # the provider is never retried (nor called: its constructor refused)
    assert TOKEN_MESSAGE in caplog.text


def test_server_linode_factory_checks_the_token_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m, _ = manager(tmp_path, None, provider_factory=linode_factory({}, ManualClock(T0)))
    g = m.create(SPEC)
    m.reconcile()
    assert m.get(g.gpr_id).status.failure_reason == TOKEN_MESSAGE
    secret = "tok-0123456789abcdef"
    m2 = GprManager(
        GprStore(tmp_path / "b.db"),
        CATALOG,
        provider_factory=linode_factory({"LINODE_TOKEN": secret}, ManualClock(T0)),
        clock=ManualClock(T0),
    )
    g2 = m2.create(SPEC)
    m2.reconcile()
    reason = m2.get(g2.gpr_id).status.failure_reason
    assert "LINODE_REGION" in reason and secret not in reason and secret not in caplog.text


def test_config_from_env_rejects_bad_values() -> None:
    from gpuscale.errors import InputError

    cfg = config_from_env({"MAX_DELAYED_COUNT": "5", "MAX_NODE_COUNT": "7"})
    assert cfg.enable_dynamic_node and cfg.max_delayed_count == 5 and cfg.max_nodes == 7
    with pytest.raises(InputError, match="ENABLE_DYNAMIC_NODE: is not a boolean"):
        config_from_env({"ENABLE_DYNAMIC_NODE": "maybe"})
    with pytest.raises(InputError, match="MAX_DELAYED_COUNT: is not a number"):
        config_from_env({"MAX_DELAYED_COUNT": "many"})


def test_with_the_simulated_cloud(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    sim = WallClockSimCloud(CATALOG, clock, latency_s=5.0)
    m = GprManager(GprStore(tmp_path / "s.db"), CATALOG, provider=sim, clock=clock)
    g = m.create(SPEC)
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONING
    clock.sleep(11)
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONED
    m.release(g.gpr_id)
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.RELEASED
    assert sim.cloud.counters.nodes_launched == 2 and sim.cloud.counters.nodes_deleted == 2
    assert sim.cloud.counters.duplicate_nodes == 0


class RunningOnlyProvider(FakeProvider):
    """A cloud whose last word on a node is RUNNING (EC2, GCE, ECS): it never says READY."""

    @property
    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities(zones=("us-ord",), reports_node_ready=False)

    def make_running(self) -> None:
        from dataclasses import replace

        for nid, n in self.nodes.items():
            self.nodes[nid] = replace(n, state=CloudNodeState.RUNNING)


def test_a_provider_that_never_says_ready_provisions_when_its_nodes_run(tmp_path: Path) -> None:
    cloud = RunningOnlyProvider()
    m, clock = manager(tmp_path, cloud, config=GprConfig(provider="fake"))
    g = m.create(SPEC)
    m.reconcile()
    clock.sleep(30)
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONING  # still provisioning: not running yet
    cloud.make_running()
    clock.sleep(30)
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONED


def test_running_is_not_ready_for_a_provider_that_says_ready(tmp_path: Path) -> None:
    cloud = FakeProvider()  # LKE-like: RUNNING is a step before READY
    m, clock = manager(tmp_path, cloud, config=GprConfig(provider="fake"))
    g = m.create(SPEC)
    m.reconcile()
    for n in list(cloud.nodes):
        from dataclasses import replace

        cloud.nodes[n] = replace(cloud.nodes[n], state=CloudNodeState.RUNNING)
    clock.sleep(30)
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONING
