"""The ACK provider on the real alibabacloud-cs20151215 SDK over HTTP against the fake ACK API, which checks every
request and response against the SDK's own models and recomputes the ACS3 signature. Its factory (ALIBABA_FACTORY) joins
the provider contract in tests/test_provider_contract.py."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuscale.catalogs import load_catalog
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
from gpuscale.fakes.alibaba_api import ACTIONS, FakeAlibabaAPI
from gpuscale.providers.alibaba import (
    API_CALLS,
    AlibabaConfig,
    AlibabaProvider,
    Entry,
    bind,
    decode_ledger,
    encode_ledger,
    pool_name,
)
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, ProviderEventKind
from shared_fake import FakeBackend, FakeFactory, SharedFake, checked, launched

CLUSTER = "c-gpu"
VSWITCHES = {"us-east-1a": ("vsw-a1",), "us-east-1b": ("vsw-b1", "vsw-b2")}
ITYPE = "ecs.gn7i-c8g1.2xlarge"
DOC = Path(__file__).resolve().parents[1] / "docs" / "providers" / "alibaba.md"

_SHARED = SharedFake(lambda: FakeAlibabaAPI().start())
_stop_shared = _SHARED.stopper()


def _fake(clock: ManualClock, task_delay_s: float = 0.0, boot_delay_s: float = 0.0) -> FakeAlibabaAPI:
    fake = _SHARED.get()
    fake.reset()
    fake.clock, fake.task_delay_s, fake.boot_delay_s = clock, task_delay_s, boot_delay_s
    fake.create_cluster(CLUSTER)
    return fake


def _provider(fake: FakeAlibabaAPI, clock: ManualClock, secret: str | None = None, **kw: Any) -> AlibabaProvider:
    config = AlibabaConfig(
        CLUSTER, "us-east-1", VSWITCHES, endpoint=fake.endpoint, protocol="http", timeout_s=5.0, **kw
    )
    return AlibabaProvider(
        config, access_key_id=fake.access_key_id, access_key_secret=secret or fake.access_key_secret, clock=clock
    )


def _req(rid: str, count: int = 1, zone: str = "us-east-1a", **kw: Any) -> LaunchRequest:
    return LaunchRequest(rid, "gpu", ITYPE, zone, count=count, labels={"team": "ml"}, **kw)


class AlibabaBackend(FakeBackend[AlibabaProvider, FakeAlibabaAPI]):
    def exhaust_capacity(self, instance_type: str) -> None:
        self.fake.no_stock.add(instance_type)

    def exhaust_quota(self) -> None:
        self.fake.max_nodes_quota = 0


def _backend(clock: ManualClock) -> AlibabaBackend:
    fake = _fake(clock)
    return AlibabaBackend(_provider(fake, clock), fake, ITYPE, "us-east-1a")


ALIBABA_FACTORY = FakeFactory("alibaba", _backend)


@pytest.fixture
def env() -> Iterator[tuple[FakeAlibabaAPI, ManualClock]]:
    clock = ManualClock(1_000.0)
    yield from checked(_fake(clock, task_delay_s=60.0, boot_delay_s=30.0), clock)


def test_pool_has_type_vswitches_labels_taints_spot_limit_and_no_ack_autoscaling(
    env: tuple[FakeAlibabaAPI, ManualClock],
) -> None:
    fake, clock = env
    p = _provider(fake, clock, spot_price_limits={ITYPE: 0.85}, max_pool_nodes=50)
    req = _req(
        "r1",
        count=2,
        zone="us-east-1b",
        capacity_type=CapacityType.SPOT,
        taints=(Taint("team", TaintEffect.NO_SCHEDULE, "ml"),),
    )
    p.launch(req)
    (pool,) = fake.pools(CLUSTER).values()
    body = pool["body"]
    sg = body["scaling_group"]
    assert body["nodepool_info"] == {"name": pool_name(req), "type": "ess"}
    assert body["auto_scaling"] == {"enable": False} and body["max_nodes"] == 50
    assert sg["instance_types"] == [ITYPE] and sg["vswitch_ids"] == ["vsw-b1", "vsw-b2"] and sg["desired_size"] == 2
    assert sg["spot_strategy"] == "SpotWithPriceLimit"
    assert sg["spot_price_limit"] == [{"instance_type": ITYPE, "price_limit": "0.8500"}]
    assert {"key": "gpuscale", "value": "managed"} in sg["tags"]
    taints = body["kubernetes_config"]["taints"]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints
    assert {"key": "team", "value": "ml", "effect": "NoSchedule"} in taints
    labels = {t["key"]: t["value"] for t in body["kubernetes_config"]["labels"]}
    assert (
        labels["team"] == "ml" and labels["gpuscale.io/pool"] == "gpu" and labels["gpuscale.io/capacity-type"] == "spot"
    )


def test_spot_without_a_limit_follows_the_market_price(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    _provider(fake, clock).launch(_req("r1", capacity_type=CapacityType.SPOT))
    (pool,) = fake.pools(CLUSTER).values()
    assert pool["body"]["scaling_group"]["spot_strategy"] == "SpotAsPriceGo"


def test_tasks_are_polled_across_rounds_and_scale_out_waits_for_a_busy_pool(
    env: tuple[FakeAlibabaAPI, ManualClock],
) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    a = [n.node_id for n in p.launch(_req("r1", count=2))]
    b = [n.node_id for n in p.launch(_req("r2"))]  # the pool is still being created: the scale-out waits
    assert fake.calls.count("ModifyClusterNodePool") == 0
    assert [n.node_id for n in p.list_nodes()] == sorted(a + b)
    clock.sleep(61)
    nodes = p.list_nodes()  # create done: r1's nodes bound, the scale-out asked
    assert fake.calls.count("ModifyClusterNodePool") == 1
    assert sorted(n.node_id for n in nodes) == sorted(a + b)
    assert all(n.node_name for n in nodes if n.request_id == "r1")
    clock.sleep(61)
    nodes = p.list_nodes()
    assert sorted(n.node_id for n in nodes) == sorted(a + b) and all(n.instance_id for n in nodes)
    clock.sleep(31)
    assert {n.state for n in p.list_nodes()} == {CloudNodeState.RUNNING}
    assert len(fake.pools(CLUSTER)) == 1


def test_removal_names_the_node_skips_acks_drain_and_idle_pools_go(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    nodes = launched(p, clock, _req("r1", count=3))
    victim = nodes[1]
    p.delete_node(victim.node_id)  # first the ledger marks the node as going; the removal follows next round
    assert victim.node_id not in {n.node_id for n in p.list_nodes()}
    assert fake.removals == [] and f"~{victim.instance_id}" in _ledger_text(fake)
    clock.sleep(61)
    p.poll_errors()
    assert fake.removals == [
        {
            "pool": next(iter(fake.pools(CLUSTER))),
            "instance_ids": [victim.instance_id],
            "drain_node": "False",
            "release_node": "True",
        }
    ]
    clock.sleep(61)
    for n in p.list_nodes():
        p.delete_node(n.node_id)  # the pool is busy with the first removal for one more round: queued
    for _ in range(6):
        clock.sleep(61)
        p.poll_errors()
    assert p.list_nodes() == [] and fake.pools(CLUSTER) == {}
    assert sorted(i for r in fake.removals for i in r["instance_ids"]) == sorted(n.instance_id for n in nodes)


def test_no_stock_fails_the_slots_and_marks_the_offering(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    launched(p, clock, _req("r1"))
    fake.no_stock.add(ITYPE)
    grown = p.launch(_req("r2", count=2))
    clock.sleep(61)
    events = p.poll_errors()
    assert {e.node_id for e in events} == {n.node_id for n in grown}
    assert all(e.kind is ProviderEventKind.LAUNCH_FAILED and "NoStock" in e.message for e in events)
    assert [n.request_id for n in p.list_nodes()] == ["r1"]
    assert (ITYPE, "us-east-1a", CapacityType.ON_DEMAND) in p.unavailable_offerings()
    with pytest.raises(InsufficientCapacity):
        p.launch(_req("r3"))


def test_quota_is_refused_at_launch(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    fake.max_nodes_quota = 1
    p = _provider(fake, clock)
    launched(p, clock, _req("r1"))
    with pytest.raises(QuotaExceeded, match=r"QuotaExceed\.ElasticQuota"):
        p.launch(_req("r2"))


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (400, "Throttling.User", RateLimited),
        (403, "Forbidden.RAM", AuthenticationError),
        (503, "ServiceUnavailable", TransientProviderError),
        (400, "InvalidParameter", InvalidProviderRequest),
        (400, "QuotaExceed.ElasticQuota", QuotaExceeded),
        (400, "OperationDenied.NoStock", InsufficientCapacity),
    ],
)
def test_errors_map_to_the_tree_and_are_not_retried(
    env: tuple[FakeAlibabaAPI, ManualClock], status: int, code: str, error: type[Exception]
) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    fake.fail_next(status, code, action="DescribeClusterNodePools")
    with pytest.raises(error) as info:
        p.list_nodes()
    assert info.value.__cause__ is not None
    assert fake.calls.count("DescribeClusterNodePools") == 1


def test_a_wrong_secret_is_an_authentication_error_without_the_secret(
    env: tuple[FakeAlibabaAPI, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    fake, clock = env
    caplog.set_level(logging.DEBUG)
    secret = "wrong-secret-0123456789abcdef"
    p = _provider(fake, clock, secret=secret)
    with pytest.raises(AuthenticationError, match="SignatureDoesNotMatch") as info:
        p.list_nodes()
    chain = [info.value, info.value.__cause__]
    assert not any(secret in f"{e} {e!r}" for e in chain) and secret not in caplog.text
    assert secret not in repr(p)


def test_missing_credentials_fail_before_any_call(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    config = AlibabaConfig(CLUSTER, "us-east-1", VSWITCHES, endpoint=fake.endpoint, protocol="http")
    with pytest.raises(AuthenticationError, match="ALIBABA_CLOUD_ACCESS_KEY_ID"):
        AlibabaProvider(config, env={}, clock=clock)
    assert fake.calls == []


def test_unknown_zone_is_invalid(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    with pytest.raises(InvalidProviderRequest, match="zone"):
        _provider(fake, clock).launch(_req("r1", zone="us-east-1z"))


def test_the_fake_rejects_fields_the_sdk_model_does_not_know(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    client = p._client
    from alibabacloud_cs20151215 import models as cs

    req = cs.CreateClusterNodePoolRequest(nodepool_info=cs.CreateClusterNodePoolRequestNodepoolInfo(name="x"))
    with pytest.raises(InvalidProviderRequest, match="required"):
        p._call("create", lambda: client.create_cluster_node_pool_with_options(CLUSTER, req, {}, p._runtime))
    assert fake.invalid_requests and "scaling_group" in fake.invalid_requests[0]
    fake.invalid_requests.clear()
    # A field the model does not know: sent raw through the SDK's generic call path.
    from alibabacloud_tea_openapi import utils_models as om

    params = om.Params(
        action="ScaleClusterNodePool",
        version="2015-12-15",
        protocol="HTTP",
        pathname=f"/clusters/{CLUSTER}/nodepools/np1",
        method="POST",
        auth_type="AK",
        style="ROA",
        req_body_type="json",
        body_type="json",
    )
    with pytest.raises(InvalidProviderRequest, match="unknown field"):
        p._call("scale", lambda: client.call_api(params, om.OpenApiRequest(body={"count": 1, "bogus": 2}), p._runtime))
    fake.invalid_requests.clear()


def test_every_api_call_is_documented_and_a_real_action() -> None:
    text = DOC.read_text()
    policy = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))  # type: ignore[union-attr]
    allowed = {a for s in policy["Statement"] for a in s["Action"]}
    for call in API_CALLS:
        assert call in ACTIONS
        assert f"cs:{call}" in allowed, f"cs:{call} is not in the RAM policy of {DOC.name}"
    assert allowed == {f"cs:{c}" for c in API_CALLS}, "the RAM policy grants an action the provider never calls"


def test_every_call_the_provider_made_is_in_api_calls(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    p.launch(_req("r1", count=2))
    clock.sleep(61)
    p.launch(_req("r2"))
    for _ in range(6):
        clock.sleep(61)
        for n in p.list_nodes():
            p.delete_node(n.node_id)
    assert set(fake.calls) == set(API_CALLS)
    assert fake.pools(CLUSTER) == {}


def test_alibaba_catalog_types_launch(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    cat = load_catalog("alibaba:us-east-1")
    itype = next(t for t in cat.instance_types if any(o.zone == "us-east-1a" for o in t.offerings))
    p = _provider(fake, clock)
    nodes = p.launch(LaunchRequest("r1", "gpu", itype.name, "us-east-1a"))
    assert [n.instance_type for n in nodes] == [itype.name]


def _ledger_text(fake: FakeAlibabaAPI) -> str:
    """Every pool's ledger tags, joined (what ACK keeps, not what the provider remembers)."""
    return ",".join(
        t["value"]
        for pool in fake.pools(CLUSTER).values()
        for t in pool["body"]["scaling_group"].get("tags", [])
        if t["key"].startswith("gpuscale.ledger.")
    )


def _r1_r2_launched(fake: FakeAlibabaAPI, clock: ManualClock) -> AlibabaProvider:
    """A provider that launched r1 (2 nodes) and then r2 (1 node), each task done."""
    p = _provider(fake, clock)
    p.launch(_req("r1", count=2))
    clock.sleep(61)
    p.launch(_req("r2"))
    clock.sleep(61)
    return p


def _settle(p: AlibabaProvider, clock: ManualClock) -> None:
    """Three rounds of 61 s, each carrying the provider's pending work on."""
    for _ in range(3):
        clock.sleep(61)
        p.poll_errors()


def _by_request(nodes: Sequence[CloudNode]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for n in sorted(nodes, key=lambda n: n.node_id):
        out.setdefault(n.request_id, []).append((n.node_id, n.instance_id))
    return out


def test_ledger_round_trips_any_request_id_within_acks_tag_limits() -> None:
    entries = [
        Entry("claim/a,b~c", 0),
        Entry("ünïcode id with spaces", 3, "i-abc"),
        *(Entry("r" * 60 + str(i), i) for i in range(12)),
    ]
    tags = encode_ledger(entries)
    assert len(tags) > 1 and all(len(v) <= 128 for v in tags.values())
    assert decode_ledger({**tags, "gpuscale": "managed", "other": "x"}) == entries


def test_bind_pairs_nodes_and_slots_in_order_without_tombstoned_nodes() -> None:
    ledger = [Entry("a", 0), Entry("a", 1, "i-2"), Entry("b", 0), Entry("c", 0)]
    bound, open_ = bind(ledger, ["i-1", "i-2", "i-3"])  # i-2 is being removed
    assert bound == {"i-1": Entry("a", 0), "i-3": Entry("b", 0)} and open_ == [Entry("c", 0)]
    bound, open_ = bind(ledger, ["i-1", "i-3"])  # its removal done: the order is unchanged
    assert bound == {"i-1": Entry("a", 0), "i-3": Entry("b", 0)} and open_ == [Entry("c", 0)]


def test_the_ledger_is_written_in_the_call_that_scales_the_pool(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    p.launch(_req("r1", count=2))
    assert _ledger_text(fake) == "r1/0,r1/1"  # CreateClusterNodePool carried it
    clock.sleep(61)
    p.list_nodes()
    calls = len(fake.calls)
    p.launch(_req("r2"))
    assert fake.calls[calls:].count("ModifyClusterNodePool") == 1 and "ScaleClusterNodePool" not in fake.calls
    (pool,) = fake.pools(CLUSTER).values()
    assert pool["body"]["scaling_group"]["desired_size"] == 3 and _ledger_text(fake) == "r1/0,r1/1,r2/0"


def test_after_a_restart_every_node_has_its_request_and_a_relaunch_creates_nothing(
    env: tuple[FakeAlibabaAPI, ManualClock],
) -> None:
    fake, clock = env
    first = _r1_r2_launched(fake, clock)
    before = _by_request(first.list_nodes())
    assert sorted(before) == ["r1", "r2"] and all(i for ns in before.values() for _, i in ns)
    second = _provider(fake, clock)  # a restart: a new provider on the same cloud
    assert _by_request(second.list_nodes()) == before
    calls = len(fake.calls)
    again = second.launch(_req("r1", count=2))
    assert sorted(n.node_id for n in again) == [i for i, _ in before["r1"]]
    assert not {"CreateClusterNodePool", "ModifyClusterNodePool"} & set(fake.calls[calls:])
    assert len(fake.pools(CLUSTER)[next(iter(fake.pools(CLUSTER)))]["nodes"]) == 3


def test_a_crash_right_after_the_scale_call_leaves_slots_that_are_adopted_not_doubled(
    env: tuple[FakeAlibabaAPI, ManualClock],
) -> None:
    fake, clock = env
    first = _provider(fake, clock)
    first.launch(_req("r1"))
    clock.sleep(61)
    slot = first.launch(_req("r2", count=2))  # the scale-out task runs; the process dies now
    second = _provider(fake, clock)
    pending = [n for n in second.list_nodes() if n.request_id == "r2"]
    assert sorted(n.node_id for n in pending) == sorted(n.node_id for n in slot)
    assert {n.state for n in pending} == {CloudNodeState.PROVISIONING}
    calls = len(fake.calls)
    assert sorted(n.node_id for n in second.launch(_req("r2", count=2))) == sorted(n.node_id for n in slot)
    assert "ModifyClusterNodePool" not in fake.calls[calls:]
    clock.sleep(61)
    done = _by_request(second.list_nodes())
    assert [i for i, _ in done["r2"]] == sorted(n.node_id for n in slot) and all(i for _, i in done["r2"])
    assert sum(len(p["nodes"]) for p in fake.pools(CLUSTER).values()) == 3


def test_a_crash_between_the_tombstone_and_the_removal_still_removes_that_node_only(
    env: tuple[FakeAlibabaAPI, ManualClock],
) -> None:
    fake, clock = env
    first = _r1_r2_launched(fake, clock)
    nodes = _by_request(first.list_nodes())
    victim_id, victim = nodes["r1"][1]
    first.delete_node(victim_id)  # the ledger write; the process dies before RemoveNodePoolNodes
    second = _provider(fake, clock)
    assert victim not in {n.instance_id for n in second.list_nodes()}
    _settle(second, clock)
    assert [r["instance_ids"] for r in fake.removals] == [[victim]]
    third = _provider(fake, clock)  # the removal done: the other nodes keep their requests
    assert _by_request(third.list_nodes()) == {"r1": nodes["r1"][:1], "r2": nodes["r2"]}
    assert victim not in _ledger_text(fake)  # the finished tombstone was dropped


def test_a_failed_scale_out_reported_after_a_restart(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    first = _provider(fake, clock)
    launched(first, clock, _req("r1"))
    fake.no_stock.add(ITYPE)
    first.launch(_req("r2"))  # the task will fail; the process dies before it learns so
    clock.sleep(61)
    second = _provider(fake, clock)
    events = second.poll_errors()
    assert [(e.kind, e.request_id) for e in events] == [(ProviderEventKind.LAUNCH_FAILED, "r2")]
    assert [n.request_id for n in second.list_nodes()] == ["r1"] and "r2" not in _ledger_text(fake)


def test_a_ledger_beyond_acks_tag_limit_is_refused_at_launch(env: tuple[FakeAlibabaAPI, ManualClock]) -> None:
    fake, clock = env
    p = _provider(fake, clock, max_pool_nodes=100)
    with pytest.raises(QuotaExceeded, match="tags"):
        p.launch(_req("x" * 40, count=80))
    assert fake.pools(CLUSTER) == {}


def test_a_slot_cancelled_while_its_pool_is_busy_loses_its_node_and_keeps_the_others(
    env: tuple[FakeAlibabaAPI, ManualClock],
) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    slots = sorted(n.node_id for n in p.launch(_req("r1", count=2)))
    p.delete_node(slots[1])  # the pool is still being created
    assert [n.node_id for n in p.list_nodes()] == [slots[0]]
    _settle(p, clock)
    assert [(n.node_id, n.request_id) for n in p.list_nodes()] == [(slots[0], "r1")]
    (pool,) = fake.pools(CLUSTER).values()
    assert len(pool["nodes"]) == 1 and len(fake.removals) == 1
    assert [n.node_id for n in _provider(fake, clock).list_nodes()] == [slots[0]]


def test_a_node_outside_the_ledger_is_listed_for_adoption_and_removed_by_instance_id(
    env: tuple[FakeAlibabaAPI, ManualClock],
) -> None:
    fake, clock = env
    p = _provider(fake, clock)
    p.launch(_req("r1", count=2))
    clock.sleep(61)
    for pool in fake._clusters[CLUSTER].values():  # as a pool made before the ledger existed
        pool.body["scaling_group"]["tags"] = [{"key": "gpuscale", "value": "managed"}]
    nodes = _provider(fake, clock).list_nodes()
    assert {n.request_id for n in nodes} == {""} and all(n.node_id == n.instance_id for n in nodes)
    q = _provider(fake, clock)
    q.delete_node(nodes[0].node_id)
    _settle(q, clock)
    assert [n.node_id for n in q.list_nodes()] == [nodes[1].node_id]
    assert [r["instance_ids"] for r in fake.removals] == [[nodes[0].instance_id]]
