"""The simulated cloud: idempotent launches, lifecycle and latencies, capacity, faults, spot, cost accounting."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields

import pytest

from builders import OD, SPOT, catalog, itype
from gpuscale.core.model import CapacityType, InstanceType, Taint, TaintEffect
from gpuscale.errors import (
    InsufficientCapacity,
    InvalidProviderRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, ProviderEvent, ProviderEventKind
from gpuscale.sim.cloud import (
    CONTRACT_INSTANCE_TYPE,
    CONTRACT_NO_CAPACITY_TYPE,
    CONTRACT_ZONE,
    CapacityRule,
    CloudBehaviour,
    Faults,
    InFlightNode,
    SimCloud,
    TypeLatencies,
    make_contract_cloud,
)
from gpuscale.sim.engine import Dist, Engine
from provider_contract import ProviderContract, ProviderFactory

CAT = catalog(
    itype("cpu-4", 4, 16, price=0.2),
    itype("t4-1", 8, 32, 1, "T4", price=0.6, zones=("z1", "z2"), spot=0.2),
    itype("a100-8", 96, 1152, 8, "A100", price=22.0),
)
FIXED = CloudBehaviour(
    launch_latency=Dist.const(30),
    registration_latency=Dist.const(60),
    device_plugin_delay=Dist.const(120),
    deletion_latency=Dist.const(10),
)


class Listener:
    """Records what the cloud tells the cluster."""

    def __init__(self) -> None:
        self.registered: list[tuple[float, str, float | None, tuple[Taint, ...]]] = []
        self.terminated: list[tuple[float, str, str]] = []
        self.asked: list[tuple[str, tuple[str, ...], list[str]]] = []
        self.redundant = False
        self.engine: Engine | None = None

    def launch_is_redundant(self, request: LaunchRequest, in_flight: Collection[InFlightNode]) -> bool:
        self.asked.append((request.request_id, request.pods, [f.node.node_name for f in in_flight]))
        return self.redundant

    def node_registered(
        self,
        node: CloudNode,
        itype: InstanceType,
        taints: tuple[Taint, ...],
        hourly_price: float,
        gpu_delay: float | None,
    ) -> None:
        assert self.engine is not None
        self.registered.append((self.engine.now(), node.node_name, gpu_delay, taints))

    def node_terminated(self, node: CloudNode, reason: str) -> None:
        assert self.engine is not None
        self.terminated.append((self.engine.now(), node.node_name, reason))


def make(behaviour: CloudBehaviour = FIXED, seed: int = 0) -> tuple[Engine, SimCloud, Listener]:
    eng = Engine()
    lst = Listener()
    lst.engine = eng
    return eng, SimCloud(eng, CAT, behaviour, seed=seed, listener=lst), lst


def req(
    rid: str, it: str = "t4-1", count: int = 1, zone: str = "z1", ct: CapacityType = OD, pool: str = "gpu"
) -> LaunchRequest:
    return LaunchRequest(rid, pool, it, zone, ct, count)


def test_launch_is_idempotent_by_request_id() -> None:
    _, cloud, _ = make()
    first = cloud.launch(req("r1", count=3))
    again = cloud.launch(req("r1", count=3))
    assert [n.node_id for n in first] == [n.node_id for n in again]
    assert len({n.node_id for n in first}) == 3
    assert len(cloud.list_nodes()) == 3
    assert cloud.counters.nodes_launched == 3 and cloud.counters.idempotent_replays == 1
    assert cloud.counters.duplicate_nodes == 0
    with pytest.raises(InvalidProviderRequest) as exc:
        cloud.launch(req("r1", count=4))
    assert exc.value.field == "request_id"
    assert len(cloud.list_nodes()) == 3


def test_a_listed_node_equals_the_cloud_node_made_by_its_own_init() -> None:
    """The cloud's node snapshots set CloudNode's fields one by one: every field is set, to what __init__ would set."""
    eng, cloud, _ = make()
    (node,) = cloud.launch(LaunchRequest("r", "gpu", "t4-1", "z2", SPOT, 1, labels={"team": "a"}))
    eng.run_until(30.0)
    (listed,) = cloud.list_nodes()
    made = CloudNode(
        node_id=node.node_id,
        request_id="r",
        pool="gpu",
        instance_type="t4-1",
        zone="z2",
        capacity_type=SPOT,
        state=CloudNodeState.RUNNING,
        created_at=0.0,
        node_name=node.node_name,
        instance_id=node.node_id,
        labels={"team": "a"},
    )
    assert listed == made
    assert {f.name: getattr(listed, f.name) for f in fields(CloudNode)} == {
        f.name: getattr(made, f.name) for f in fields(CloudNode)
    }


def test_lifecycle_follows_the_latencies_and_tells_the_listener() -> None:
    eng, cloud, lst = make()
    (node,) = cloud.launch(
        LaunchRequest("r", "gpu", "t4-1", "z1", OD, 1, taints=(Taint("gpu", TaintEffect.NO_SCHEDULE),))
    )
    assert node.state is CloudNodeState.PROVISIONING and node.node_name
    eng.run_until(29.9)
    assert cloud.list_nodes()[0].state is CloudNodeState.PROVISIONING
    eng.run_until(30.0)
    assert cloud.list_nodes()[0].state is CloudNodeState.RUNNING
    eng.run_until(90.0)
    assert cloud.list_nodes()[0].state is CloudNodeState.READY
    assert lst.registered == [(90.0, node.node_name, 120.0, (Taint("gpu", TaintEffect.NO_SCHEDULE),))]
    cloud.delete_node(node.node_id)
    assert lst.terminated == [(90.0, node.node_name, "deleted by request")]
    assert cloud.list_nodes()[0].state is CloudNodeState.DELETING
    eng.run_until(100.0)
    assert cloud.list_nodes() == ()
    cloud.delete_node(node.node_id)  # already gone: fine
    cloud.delete_node("never-existed")  # nothing to delete: fine
    with pytest.raises(NotFound):
        cloud.interrupt("never-existed")


def test_the_listener_judges_each_node_launched_for_pods_against_the_nodes_in_flight() -> None:
    b = CloudBehaviour(
        launch_latency=Dist.const(30),
        registration_latency=Dist.const(60),
        deletion_latency=Dist.const(10),
    )
    eng, cloud, lst = make(b)
    (a,) = cloud.launch(req("a"))  # no pods (minNodes, replacement): the listener is not asked
    assert lst.asked == []
    pods = ("default/p", "default/q")
    b1, _b2 = cloud.launch(LaunchRequest("b", "gpu", "t4-1", "z1", OD, 2, pods=pods))
    # each node is judged without itself, with the nodes in flight before it (earlier ones of the request too)
    assert lst.asked == [("b", pods, [a.node_name]), ("b", pods, [a.node_name, b1.node_name])]
    assert cloud.counters.redundant_launches == 0 and cloud.redundant_nodes == []
    cloud.launch(LaunchRequest("b", "gpu", "t4-1", "z1", OD, 2, pods=pods))  # a replay creates nothing
    assert len(lst.asked) == 2
    eng.run_until(90.0)  # a, b1, b2 registered: no longer in flight
    assert cloud.in_flight() == []
    lst.redundant = True
    (c,) = cloud.launch(LaunchRequest("c", "gpu", "t4-1", "z1", OD, 1, pods=pods))
    (d,) = cloud.launch(LaunchRequest("d", "gpu", "t4-1", "z1", OD, 1, pods=pods))
    assert lst.asked[2:] == [("c", pods, []), ("d", pods, [c.node_name])]
    assert cloud.counters.redundant_launches == 2 and cloud.redundant_nodes == [c.node_name, d.node_name]
    cloud.delete_node(c.node_id)  # deleting: not in flight
    assert [f.node.node_name for f in cloud.in_flight()] == [d.node_name]
    assert cloud.in_flight()[0].itype.name == "t4-1" and cloud.in_flight()[0].hourly_price == 0.6

    eng, cloud, lst = make(CloudBehaviour(launch_latency=Dist.const(10), launch_failure_rate=1.0))
    cloud.launch(req("f"))
    eng.run_until(11.0)  # failed while provisioning: not in flight
    assert cloud.in_flight() == []


def test_per_type_latency_override_and_cpu_nodes_have_no_gpu_delay() -> None:
    b = CloudBehaviour(
        launch_latency=Dist.const(30),
        registration_latency=Dist.const(60),
        device_plugin_delay=Dist.const(120),
        per_type={"cpu-4": TypeLatencies(launch=Dist.const(5))},
    )
    eng, cloud, lst = make(b)
    cloud.launch(req("c", it="cpu-4"))
    eng.run_until(65.0)
    assert [(t, d) for t, _, d, _ in lst.registered] == [(65.0, 0.0)]


def test_deleting_while_provisioning_never_registers() -> None:
    eng, cloud, lst = make()
    (n,) = cloud.launch(req("r"))
    cloud.delete_node(n.node_id)
    eng.run_until(1000.0)
    assert lst.registered == [] and lst.terminated == [] and cloud.list_nodes() == ()


def test_capacity_rules_raise_insufficient_capacity_until_capacity_frees_up() -> None:
    b = CloudBehaviour(
        launch_latency=Dist.const(1),
        deletion_latency=Dist.const(5),
        capacity=(CapacityRule(2, instance_type="t4-1", zone="z1"), CapacityRule(0, capacity_type=SPOT, end=3600)),
    )
    eng, cloud, _ = make(b)
    nodes = cloud.launch(req("a", count=2))
    with pytest.raises(InsufficientCapacity):
        cloud.launch(req("b"))
    cloud.launch(req("c", zone="z2"))  # other zone is not limited
    with pytest.raises(InsufficientCapacity):
        cloud.launch(req("d", ct=SPOT, zone="z2"))
    assert cloud.counters.insufficient_capacity == 2 and cloud.counters.failed_launches == 2
    cloud.delete_node(nodes[0].node_id)  # a deleting node no longer holds capacity
    cloud.launch(req("b"))  # the same request id may be retried after an error
    eng.run_until(3600.0)
    cloud.launch(req("d", ct=SPOT, zone="z2"))  # the spot rule expired


def test_quota_and_invalid_requests() -> None:
    _, cloud, _ = make(CloudBehaviour(quota_nodes=2))
    cloud.launch(req("a", count=2))
    with pytest.raises(QuotaExceeded):
        cloud.launch(req("b"))
    for bad, field in (
        (req("x", it="nope"), "instance_type"),
        (req("x", zone="z9"), "zone"),
        (req("x", it="a100-8", ct=SPOT), "zone"),
        (req("x", count=0), "count"),
        (req("", count=1), "request_id"),
    ):
        with pytest.raises(InvalidProviderRequest) as exc:
            cloud.launch(bad)
        assert exc.value.field == field


def test_spot_notice_then_death_at_the_deadline() -> None:
    b = CloudBehaviour(
        launch_latency=Dist.const(10),
        registration_latency=Dist.const(10),
        spot_interruptions_per_hour=1.0,
        spot_notice_s=120.0,
    )
    eng, cloud, lst = make(b, seed=3)
    nodes = cloud.launch(req("s", ct=SPOT, count=5))
    notices: list[ProviderEvent] = []
    t = 0.0
    while len(notices) < 5 and t < 48 * 3600:
        t += 60.0
        eng.run_until(t)
        notices += cloud.poll_errors()
    assert {e.kind for e in notices} == {ProviderEventKind.SPOT_INTERRUPTION}
    assert {e.node_id for e in notices} == {n.node_id for n in nodes}
    for e in notices:
        assert e.deadline == pytest.approx(e.at + 120.0)
    eng.run_until(t + 121.0)
    assert cloud.list_nodes() == ()
    assert {name for _, name, reason in lst.terminated if reason == "spot-interruption"} == {n.node_name for n in nodes}
    assert cloud.counters.spot_notices == 5 and cloud.counters.spot_terminations == 5
    assert cloud.poll_errors() == []


def test_a_node_deleted_after_its_notice_is_not_killed_again() -> None:
    eng, cloud, lst = make()
    (n,) = cloud.launch(req("s", ct=SPOT))
    eng.run_until(100.0)
    cloud.interrupt(n.node_id)
    (ev,) = cloud.poll_errors()
    assert ev.deadline == 220.0
    cloud.delete_node(n.node_id)
    eng.run_until(1000.0)
    assert cloud.counters.spot_terminations == 0
    assert [r for _, _, r in lst.terminated] == ["deleted by request"]


def test_on_demand_nodes_are_never_interrupted() -> None:
    eng, cloud, _ = make(CloudBehaviour(spot_interruptions_per_hour=10.0))
    cloud.launch(req("od", count=3))
    eng.run_until(24 * 3600.0)
    assert cloud.poll_errors() == [] and len(cloud.list_nodes()) == 3


def test_fault_rates_and_timeouts_that_took_effect_never_duplicate_nodes() -> None:
    faults = Faults(rate_limited=0.1, server_error=0.1, timeout=0.1, timeout_took_effect=1.0, retry_after_s=7.0)
    _, cloud, _ = make(CloudBehaviour(faults=faults), seed=11)
    kinds: dict[str, int] = {"ok": 0, "429": 0, "5xx": 0, "timeout": 0}
    for _ in range(3000):
        try:
            cloud.list_nodes()
            kinds["ok"] += 1
        except RateLimited as exc:
            assert exc.retry_after == 7.0 and exc.status == 429
            kinds["429"] += 1
        except TransientProviderError as exc:
            kinds["timeout" if "timed out" in str(exc) else "5xx"] += 1
    for k in ("429", "5xx", "timeout"):
        assert 230 < kinds[k] < 370, kinds
    # launches: retry each request id until it succeeds; every timeout took effect, yet no node is duplicated
    for i in range(50):
        while True:
            try:
                cloud.launch(req(f"r{i}"))
                break
            except ProviderError:
                continue
    assert cloud.counters.nodes_launched == 50 and cloud.counters.duplicate_nodes == 0
    assert len(cloud.alive()) == 50
    assert cloud.counters.idempotent_replays >= 1


@pytest.mark.parametrize("rate", ["rate_limited", "server_error", "timeout"])
def test_list_nodes_faults_with_any_one_rate_set(rate: str) -> None:
    # list_nodes skips the fault draw only when every rate is 0: each rate alone still makes it fail
    rates = {"rate_limited": 0.0, "server_error": 0.0, "timeout": 0.0} | {rate: 0.5}
    faults = Faults(rates["rate_limited"], rates["server_error"], rates["timeout"], timeout_took_effect=0.0)
    _, cloud, _ = make(CloudBehaviour(faults=faults), seed=3)
    failed = 0
    for _ in range(40):
        try:
            cloud.list_nodes()
        except ProviderError:
            failed += 1
    assert 5 < failed < 35
    _, quiet, _ = make(CloudBehaviour(faults=Faults()), seed=3)
    assert all(quiet.list_nodes() == () for _ in range(40))


def test_fault_sequence_is_deterministic_for_a_seed() -> None:
    def run(seed: int) -> list[str]:
        _, cloud, _ = make(CloudBehaviour(faults=Faults(rate_limited=0.3, server_error=0.3)), seed=seed)
        out = []
        for _ in range(200):
            try:
                cloud.list_nodes()
                out.append("ok")
            except ProviderError as exc:
                out.append(type(exc).__name__)
        return out

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_async_launch_failures_and_gpu_init_failures() -> None:
    b = CloudBehaviour(launch_latency=Dist.const(10), launch_failure_rate=1.0)
    eng, cloud, lst = make(b)
    (n,) = cloud.launch(req("f"))
    eng.run_until(20.0)
    (ev,) = cloud.poll_errors()
    assert ev.kind is ProviderEventKind.LAUNCH_FAILED and ev.request_id == "f" and ev.node_id == n.node_id
    assert cloud.list_nodes() == () and lst.registered == []
    assert cloud.counters.failed_launches == 1

    eng, cloud, lst = make(CloudBehaviour(launch_latency=Dist.const(1), gpu_init_failure_rate=1.0))
    cloud.launch(req("g"))
    eng.run_until(1000.0)
    assert [d for _, _, d, _ in lst.registered] == [None]
    assert cloud.counters.gpu_init_failures == 1


def test_cost_is_node_seconds_times_price_per_pool_and_type() -> None:
    eng, cloud, _ = make()
    (a,) = cloud.launch(req("a", it="t4-1", pool="p1"))  # $0.6/h
    eng.run_until(1800.0)
    (b,) = cloud.launch(req("b", it="a100-8", pool="p2"))  # $22/h
    assert cloud.hourly_rate == pytest.approx(22.6)
    eng.run_until(3600.0)
    cloud.delete_node(a.node_id)  # billed until gone, 10 s later
    eng.run_until(7200.0)
    cost = cloud.cost_by_pool_type()
    assert cost[("p1", "t4-1")] == pytest.approx(0.6 * 3610 / 3600)
    assert cost[("p2", "a100-8")] == pytest.approx(22.0 * 5400 / 3600)
    assert cloud.total_cost() == pytest.approx(sum(cost.values()))
    assert cloud.gpu_hours_bought() == pytest.approx((3610 + 8 * 5400) / 3600)
    assert cloud.hourly_rate == pytest.approx(22.0)
    assert b.node_id in {n.node_id for n in cloud.list_nodes()}


def test_same_seed_same_latencies() -> None:
    def run(seed: int) -> list[float]:
        eng, cloud, lst = make(CloudBehaviour(), seed=seed)
        cloud.launch(req("x", count=10))
        eng.run_until(10_000.0)
        return [t for t, _, _, _ in lst.registered] + [d or 0.0 for _, _, d, _ in lst.registered]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_contract_cloud() -> None:
    cloud = make_contract_cloud()
    assert cloud.capabilities.spot and CONTRACT_ZONE in cloud.capabilities.zones
    nodes = cloud.launch(LaunchRequest("c1", "pool", CONTRACT_INSTANCE_TYPE, CONTRACT_ZONE, OD, 2))
    assert len(nodes) == 2 and all(n.request_id == "c1" for n in nodes)
    with pytest.raises(InsufficientCapacity):
        cloud.launch(LaunchRequest("c2", "pool", CONTRACT_NO_CAPACITY_TYPE, CONTRACT_ZONE, OD, 1))
    cloud.engine.run_until(3600.0)
    assert {n.state for n in cloud.list_nodes()} == {CloudNodeState.READY}


@dataclass
class SimContractBackend:
    """The simulated cloud as a backend of the generic provider contract (tests/provider_contract.py)."""

    provider: SimCloud
    instance_type: str = CONTRACT_INSTANCE_TYPE
    zone: str = CONTRACT_ZONE

    def exhaust_capacity(self, instance_type: str) -> None:
        self.provider.add_capacity_rule(CapacityRule(0, instance_type=instance_type))

    def exhaust_quota(self) -> None:
        self.provider.set_quota(0)

    def close(self) -> None:
        assert self.provider.counters.duplicate_nodes == 0


class TestSimCloudContract(ProviderContract):
    """Every generic provider contract test against the simulated cloud."""

    @pytest.fixture
    def provider_factory(self) -> ProviderFactory:
        return lambda: SimContractBackend(make_contract_cloud())
