"""The Linode LKE provider against the fake Linode API (real HTTP, real linode_api4, spec-validated)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from linode_api4 import ApiError

from gpuscale.clock import ManualClock
from gpuscale.core import labels as wk
from gpuscale.core.model import Taint, TaintEffect
from gpuscale.errors import (
    AuthenticationError,
    InputError,
    InvalidProviderRequest,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.fakes.linode_api import FakeLinodeAPI
from gpuscale.providers.base import CloudNodeState, LaunchRequest, ProviderEventKind
from gpuscale.providers.linode import (
    LEDGER_LABEL_PREFIX,
    MANAGED_TAG,
    MISSING_TOKEN_MESSAGE,
    LinodeConfig,
    LinodeProvider,
    tag_key,
)

GPU = "g2-gpu-rtx4000a1-s"
REGION = "us-ord"
SECRET = "tok-3f9c1e7a5b2d4c6e8f0a1b2c3d4e5f60"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLinodeAPI]:
    with FakeLinodeAPI(token=SECRET) as fake:
        yield fake


@dataclass
class Env:
    fake: FakeLinodeAPI
    clock: ManualClock
    cluster_id: int
    providers: list[LinodeProvider] = field(default_factory=list)

    def provider(self, **overrides: Any) -> LinodeProvider:
        """A fresh provider (a fresh process, as far as its memory goes)."""
        settings: dict[str, Any] = {
            "cluster_id": self.cluster_id,
            "region": REGION,
            "base_url": self.fake.base_url,
            "timeout_s": 5.0,
        }
        settings.update(overrides)
        provider = LinodeProvider(
            LinodeConfig(**settings),
            env={"LINODE_TOKEN": self.fake.token},
            clock=self.clock,
        )
        self.providers.append(provider)
        return provider

    def pool_of(self, node_id: str) -> dict[str, object]:
        return next(p for p in self.fake.pools(self.cluster_id) if any(n["id"] == node_id for n in p["nodes"]))


@pytest.fixture
def env(server: FakeLinodeAPI) -> Iterator[Env]:
    server.reset()
    clock = ManualClock(0.0)
    server.clock = clock
    env = Env(server, clock, server.create_cluster(region=REGION))
    yield env
    assert server.invalid_requests == [], "the provider sent requests that violate the Linode OpenAPI spec"
    server.check()


def req(request_id: str, count: int = 1, pool: str = "gpu", labels: dict[str, str] | None = None) -> LaunchRequest:
    return LaunchRequest(request_id, pool, GPU, REGION, count=count, labels=labels or {})


# --- token ------------------------------------------------------------------------------------------------------


def test_missing_token_fails_with_the_exact_message_and_makes_no_call(env: Env) -> None:
    config = LinodeConfig(cluster_id=env.cluster_id, region=REGION, base_url=env.fake.base_url)
    for environment in ({}, {"LINODE_TOKEN": ""}):
        with pytest.raises(AuthenticationError) as info:
            LinodeProvider(config, env=environment)
        assert str(info.value) == MISSING_TOKEN_MESSAGE
    assert env.fake.requests == []


def test_token_never_appears_in_logs_errors_or_reprs(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    provider = env.provider()
    errors: list[BaseException] = []
    env.fake.fail_next(429, retry_after=1)
    with pytest.raises(RateLimited) as limited:
        provider.launch(req("r1", count=2))
    errors.append(limited.value)
    nodes = provider.launch(req("r1", count=2))  # the caller's retry, same request id
    env.fake.fail_next(503, times=1)
    with pytest.raises(TransientProviderError) as transient:
        provider.list_nodes()
    errors.append(transient.value)
    with pytest.raises(InvalidProviderRequest) as invalid:
        provider.launch(req("r2", labels={"bad key!": "x"}))
    errors.append(invalid.value)
    provider.delete_node(nodes[0].node_id)
    wrong = LinodeProvider(
        LinodeConfig(cluster_id=env.cluster_id, region=REGION, base_url=env.fake.base_url),
        env={"LINODE_TOKEN": "some-other-token"},
    )
    with pytest.raises(AuthenticationError) as denied:
        wrong.list_nodes()
    errors.append(denied.value)

    assert SECRET not in caplog.text
    assert "retry policy" in caplog.text  # the failures were logged, without the token
    assert SECRET not in repr(provider) and SECRET not in str(provider)
    for err in errors:
        chain: BaseException | None = err
        while chain is not None:
            assert SECRET not in str(chain) and SECRET not in repr(chain)
            chain = chain.__cause__


# --- retries and error mapping ------------------------------------------------------------------------------------


def test_429_is_raised_at_once_with_retry_after_and_the_callers_retry_creates_one_pool(env: Env) -> None:
    provider = env.provider()
    env.fake.fail_next(429, times=1, retry_after=7, method="POST")
    with pytest.raises(RateLimited) as info:
        provider.launch(req("r1", count=2))
    assert info.value.retry_after == 7.0 and info.value.retry.delay_s == 7.0
    assert info.value.status == 429
    assert isinstance(info.value.__cause__, ApiError)
    assert env.clock.now() == 0.0  # never sleeps: the launcher retries at the due time
    assert env.fake.pools(env.cluster_id) == []
    nodes = provider.launch(req("r1", count=2))
    assert len(nodes) == 2
    assert len(env.fake.pools(env.cluster_id)) == 1


def test_429_without_retry_after_carries_the_default_delay(env: Env) -> None:
    provider = env.provider(default_retry_after_s=4.0)
    env.fake.fail_next(429, times=1)
    with pytest.raises(RateLimited) as info:
        provider.list_nodes()
    assert info.value.retry_after == 4.0
    assert env.clock.now() == 0.0


def test_5xx_is_raised_once_as_a_transient_error_chained(env: Env) -> None:
    provider = env.provider()
    env.fake.fail_next(503, times=1)
    sent = len(env.fake.requests)
    with pytest.raises(TransientProviderError) as info:
        provider.list_nodes()
    assert info.value.status == 503
    assert info.value.retry.kind == "backoff"
    assert isinstance(info.value.__cause__, ApiError)
    assert len(env.fake.requests) == sent + 1  # one attempt
    assert env.clock.now() == 0.0


def test_a_5xx_in_the_middle_of_a_launch_is_resumed_by_the_same_request_id(env: Env) -> None:
    provider = env.provider()
    env.fake.fail_next(502, times=1, method="POST")
    with pytest.raises(TransientProviderError):
        provider.launch(req("r1"))
    nodes = provider.launch(req("r1"))
    assert len(nodes) == 1
    assert len(env.fake.pools(env.cluster_id)) == 1
    assert env.clock.now() == 0.0


def test_timeout_is_raised_and_a_lost_create_response_does_not_duplicate_the_pool(env: Env) -> None:
    provider = env.provider(timeout_s=0.2)
    env.fake.delay_next(0.6, method="POST", path="/pools")  # the pool is created, the response is lost
    with pytest.raises(TransientProviderError, match="timed out"):
        provider.launch(req("r1", count=2))
    nodes = provider.launch(req("r1", count=2))  # the caller's retry finds the pool by its ledger
    assert len(nodes) == 2
    assert len(env.fake.pools(env.cluster_id)) == 1
    assert [r.method for r in env.fake.requests].count("POST") == 1
    assert env.clock.now() == 0.0


def test_400_surfaces_the_api_reason_and_field(env: Env) -> None:
    provider = env.provider()
    with pytest.raises(InvalidProviderRequest) as info:
        provider.launch(req("r1", labels={"bad key!": "x"}))
    assert info.value.field == "labels"
    assert "Invalid label key" in info.value.reason
    assert info.value.status == 400
    assert isinstance(info.value.__cause__, ApiError)
    assert env.clock.now() == 0.0  # never retried


def test_spec_violation_400_names_the_offending_field(env: Env) -> None:
    provider = env.provider()
    bad = LaunchRequest("r1", "gpu", GPU, REGION, taints=(Taint("bad key", TaintEffect.NO_SCHEDULE),))
    with pytest.raises(InvalidProviderRequest) as info:
        provider.launch(bad)
    assert info.value.field == "taints.0.key"
    assert "does not match" in info.value.reason
    assert len(env.fake.invalid_requests) == 1
    env.fake.requests.clear()  # this test sends an invalid request on purpose


def test_config_rejects_bad_environment_values() -> None:
    with pytest.raises(InputError, match="MAX_NODE_POOL_COUNT"):
        LinodeConfig.from_env({"LINODE_CLUSTER_ID": "7", "LINODE_REGION": REGION, "MAX_NODE_POOL_COUNT": "ten"})
    with pytest.raises(InputError, match="LINODE_CLUSTER_ID"):
        LinodeConfig.from_env({"LINODE_REGION": REGION})
    config = LinodeConfig.from_env({"LINODE_CLUSTER_ID": "7", "LINODE_REGION": REGION, "MAX_NODE_POOL_COUNT": "3"})
    assert (config.cluster_id, config.max_node_pool_count, config.max_nodes) == (7, 3, 100)


# --- pools, growth, shrinking --------------------------------------------------------------------------------------


def test_pools_are_tagged_and_labelled(env: Env) -> None:
    provider = env.provider()
    provider.launch(req("r1", count=2, pool="train", labels={"team": "ml"}))
    (pool,) = env.fake.pools(env.cluster_id)
    assert pool["tags"] == [MANAGED_TAG, "gpuscale-pool:train", "gpuscale-req:r1"]
    assert pool["labels"] == {"team": "ml", wk.POOL: "train", LEDGER_LABEL_PREFIX + "r1": "1.2"}
    assert pool["type"] == GPU and pool["count"] == 2


def test_max_node_pool_count_grows_an_existing_pool_instead_of_creating(env: Env) -> None:
    provider = env.provider(max_node_pool_count=2)
    a = provider.launch(req("a", count=2))
    b = provider.launch(req("b", count=1, pool="other"))
    c = provider.launch(req("c", count=3))  # cap reached: grows a's pool (same type, labels, taints)
    pools = {p["id"]: p for p in env.fake.pools(env.cluster_id)}
    assert len(pools) == 2
    grown = env.pool_of(c[0].node_id)
    assert grown["count"] == 5 and env.pool_of(a[0].node_id)["id"] == grown["id"]
    assert {n.node_id for n in provider.launch(req("a", count=2))} == {n.node_id for n in a}
    assert {n.node_id for n in provider.launch(req("c", count=3))} == {n.node_id for n in c}
    by_request: dict[str, int] = {}
    for node in provider.list_nodes():
        by_request[node.request_id] = by_request.get(node.request_id, 0) + 1
    assert by_request == {"a": 2, "b": 1, "c": 3}
    assert len(b) == 1
    posts = [r for r in env.fake.requests if r.method == "POST"]
    assert len(posts) == 2
    # A type no pool can grow into: quota, and nothing is created.
    with pytest.raises(QuotaExceeded, match="MAX_NODE_POOL_COUNT=2"):
        provider.launch(LaunchRequest("d", "gpu", "g1-gpu-rtx6000-1", REGION))
    assert len(env.fake.pools(env.cluster_id)) == 2


def test_growth_survives_a_crash_without_doubling(env: Env) -> None:
    provider = env.provider(max_node_pool_count=1)
    provider.launch(req("a", count=1))
    env.fake.delay_next(0.6, method="PUT")  # the growth is applied, its response lost
    slow = env.provider(max_node_pool_count=1, timeout_s=0.2)
    with pytest.raises(TransientProviderError, match="timed out"):
        slow.launch(req("b", count=2))
    grown = slow.launch(req("b", count=2))  # the caller's retry: the ledger says it was served
    assert len(grown) == 2
    restarted = env.provider(max_node_pool_count=1)  # a new process relaunching "b"
    again = restarted.launch(req("b", count=2))
    assert {n.node_id for n in again} == {n.node_id for n in grown}
    (pool,) = env.fake.pools(env.cluster_id)
    assert pool["count"] == 3


def test_max_node_count_is_honoured(env: Env) -> None:
    provider = env.provider(max_nodes=3)
    provider.launch(req("a", count=2))
    with pytest.raises(QuotaExceeded, match="maximum node count 3"):
        provider.launch(req("b", count=2))
    assert len(env.fake.pools(env.cluster_id)) == 1


def test_scale_down_deletes_specific_nodes_and_never_lowers_a_count(env: Env) -> None:
    provider = env.provider(max_node_pool_count=1)
    a = provider.launch(req("a", count=2))
    b = provider.launch(req("b", count=2))  # grows the same pool to 4
    provider.delete_node(b[0].node_id)
    provider.delete_node(a[1].node_id)
    remaining = {n.node_id: n.request_id for n in provider.list_nodes()}
    assert remaining == {a[0].node_id: "a", b[1].node_id: "b"}
    (pool,) = env.fake.pools(env.cluster_id)
    assert pool["labels"][LEDGER_LABEL_PREFIX + "a"] == "1.1"
    assert pool["labels"][LEDGER_LABEL_PREFIX + "b"] == "2.1"
    provider.delete_node(b[1].node_id)
    assert LEDGER_LABEL_PREFIX + "b" not in env.fake.pools(env.cluster_id)[0]["labels"]
    provider.delete_node(a[0].node_id)  # the pool's last node: the pool is deleted
    assert env.fake.pools(env.cluster_id) == []
    assert env.fake.count_decreases == []
    counts = [r.body["count"] for r in env.fake.requests if r.method == "PUT" and "count" in r.body]
    assert counts == [4]
    deletes = [r.path.rsplit("/", 2)[-2:] for r in env.fake.requests if r.method == "DELETE"]
    assert deletes == [
        ["nodes", b[0].node_id],
        ["nodes", a[1].node_id],
        ["nodes", b[1].node_id],
        ["pools", str(pool["id"])],
    ]


def test_release_deletes_a_requests_whole_pool(env: Env) -> None:
    provider = env.provider()
    a = provider.launch(req("a", count=2))
    b = provider.launch(req("b", count=1))
    assert sorted(provider.release("a")) == sorted(n.node_id for n in a)
    assert {n.node_id for n in provider.list_nodes()} == {b[0].node_id}
    assert provider.release("a") == []


def test_foreign_pools_are_ignored_and_protected(env: Env) -> None:
    foreign = env.fake.add_pool(env.cluster_id, "g6-standard-4", 2, tags=["team-pool"])
    provider = env.provider()
    provider.launch(req("a"))
    assert {n.request_id for n in provider.list_nodes()} == {"a"}
    (foreign_pool,) = [p for p in env.fake.pools(env.cluster_id) if p["id"] == foreign]
    with pytest.raises(InvalidProviderRequest, match="does not manage"):
        provider.delete_node(foreign_pool["nodes"][0]["id"])
    assert provider.orphans([]) and all(o.pool_id != foreign for o in provider.orphans([]))


# --- crash recovery -----------------------------------------------------------------------------------------------


def test_orphans_are_adopted_or_garbage_collected_after_a_crash(env: Env) -> None:
    before = env.provider(max_node_pool_count=2)
    a = before.launch(req("a", count=2))
    b = before.launch(req("b", count=2, pool="other"))
    c = before.launch(req("c", count=1))  # grows a's pool
    # Crash: the controller's database only knows "a". A new provider instance starts with an empty memory.
    after = env.provider(max_node_pool_count=2)
    adopted = after.adopt(["a"])
    assert {n.node_id for n in adopted["a"]} == {n.node_id for n in a}
    orphans = {o.request_key: o for o in after.orphans(["a"])}
    assert set(orphans) == {"b", "c"}
    assert orphans["b"].whole_pool and set(orphans["b"].node_ids) == {n.node_id for n in b}
    assert not orphans["c"].whole_pool and set(orphans["c"].node_ids) == {c[0].node_id}
    after.collect_garbage(["a"])
    assert {n.node_id: n.request_id for n in after.list_nodes()} == {n.node_id: "a" for n in a}
    assert len(env.fake.pools(env.cluster_id)) == 1
    assert after.orphans(["a"]) == []
    assert env.fake.count_decreases == []


def test_long_request_ids_are_hashed_into_tags_and_mapped_back(env: Env) -> None:
    rid = "gpr/" + "x" * 80
    provider = env.provider()
    nodes = provider.launch(req(rid, count=1))
    assert nodes[0].request_id == rid
    (pool,) = env.fake.pools(env.cluster_id)
    assert all(3 <= len(t) <= 50 for t in pool["tags"])
    assert f"gpuscale-req:{tag_key(rid)}" in pool["tags"]
    restarted = env.provider()
    assert restarted.list_nodes()[0].request_id == tag_key(rid)
    assert [n.node_id for n in restarted.adopt([rid])[rid]] == [nodes[0].node_id]
    assert restarted.list_nodes()[0].request_id == rid


# --- readiness ----------------------------------------------------------------------------------------------------


def test_nodes_not_ready_past_the_deadline_are_reported_and_recycled(env: Env) -> None:
    env.fake.ready_delay_s = 60.0
    env.fake.stick_not_ready(1)
    provider = env.provider(not_ready_deadline_s=300.0)
    nodes = provider.launch(req("a", count=2))
    assert {n.state for n in nodes} == {CloudNodeState.NOT_READY}
    env.clock.advance_to(100.0)
    states = {n.node_id: n.state for n in provider.list_nodes()}
    assert sorted(states.values()) == [CloudNodeState.NOT_READY, CloudNodeState.READY]
    (stuck_id,) = [k for k, v in states.items() if v is CloudNodeState.NOT_READY]
    assert provider.recycle_stuck_nodes() == []  # not past the deadline yet
    assert provider.poll_errors() == []
    env.clock.advance_to(400.0)
    old_instance = next(n.instance_id for n in provider.list_nodes() if n.node_id == stuck_id)
    events = provider.poll_errors()
    assert [(e.kind, e.node_id, e.request_id) for e in events] == [(ProviderEventKind.NODE_FAILED, stuck_id, "a")]
    assert provider.recycle_stuck_nodes() == [stuck_id]
    recycled = next(n for n in provider.list_nodes() if n.node_id == stuck_id)
    assert recycled.instance_id != old_instance and recycled.state is CloudNodeState.NOT_READY
    env.clock.advance_to(470.0)
    assert {n.state for n in provider.list_nodes()} == {CloudNodeState.READY}
    assert provider.poll_errors() == []
