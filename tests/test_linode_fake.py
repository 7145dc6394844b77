"""The fake Linode API: spec validation of requests and responses, LKE behaviour, fault knobs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from linode_api4 import ApiError, LinodeClient, LKECluster, LKENodePool

from gpuscale.clock import ManualClock
from gpuscale.fakes.linode_api import FakeLinodeAPI, FakeSpecViolation, load_spec, spec_load_seconds

GPU = "g2-gpu-rtx4000a1-s"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLinodeAPI]:
    with FakeLinodeAPI() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeLinodeAPI) -> FakeLinodeAPI:
    server.reset()
    server.clock = ManualClock(0.0)
    return server


def client(fake: FakeLinodeAPI, **kwargs: Any) -> LinodeClient:
    return LinodeClient(fake.token, base_url=fake.base_url, retry=False, **kwargs)


def call(fake: FakeLinodeAPI, method: str, path: str, body: Any = None, token: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token or fake.token}"} if token != "" else {}
    return requests.request(method, fake.base_url + path, json=body, headers=headers, timeout=5)


def test_the_spec_is_loaded_once_per_process(fake: FakeLinodeAPI) -> None:
    started = time.perf_counter()
    assert load_spec() is load_spec()
    assert time.perf_counter() - started < 0.05
    seconds = spec_load_seconds()
    assert seconds is not None and seconds < 30


def test_a_pool_create_without_type_is_rejected_and_recorded(fake: FakeLinodeAPI) -> None:
    cid = fake.create_cluster()
    with pytest.raises(ApiError) as info:
        client(fake).post(f"/lke/clusters/{cid}/pools", data={"count": 2})
    assert info.value.status == 400
    assert info.value.json == {"errors": [{"reason": "'type' is a required property", "field": "type"}]}
    (bad,) = fake.invalid_requests
    assert (bad.method, bad.status, bad.body) == ("POST", 400, {"count": 2})
    assert fake.pools(cid) == []
    fake.check()


@pytest.mark.parametrize(
    ("method", "suffix", "body", "field"),
    [
        ("POST", "/pools", {"type": GPU, "count": 0}, "count"),
        ("POST", "/pools", {"type": GPU, "count": 1, "taints": [{"key": "k", "value": "v", "effect": "Never"}]}, None),
        ("PUT", "/pools/{pid}", {"count": 2, "tags": ["gpuscale"]}, "tags"),
        ("PUT", "/pools/{pid}", {"taints": []}, "taints"),
    ],
)
def test_spec_violations_get_a_400_in_linode_format(
    fake: FakeLinodeAPI, method: str, suffix: str, body: dict[str, Any], field: str | None
) -> None:
    cid = fake.create_cluster()
    pid = fake.add_pool(cid, GPU, 1)
    response = call(fake, method, f"/lke/clusters/{cid}" + suffix.format(pid=pid), body)
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors and all(set(e) <= {"reason", "field"} for e in errors)
    if field is not None:
        assert errors[0]["field"] == field
    assert len(fake.invalid_requests) == 1
    assert fake.pools(cid)[0]["count"] == 1  # nothing happened


def test_authentication_is_required(fake: FakeLinodeAPI) -> None:
    cid = fake.create_cluster()
    assert call(fake, "GET", f"/lke/clusters/{cid}/pools", token="").status_code == 401
    assert call(fake, "GET", f"/lke/clusters/{cid}/pools", token="wrong").status_code == 401
    assert "Authorization" not in repr(fake.requests)


def test_every_endpoint_answers_with_spec_valid_responses(fake: FakeLinodeAPI) -> None:
    fake.page_size = 2
    cid = fake.create_cluster(region="us-ord")
    api = client(fake)
    cluster = api.load(LKECluster, cid)
    assert cluster.label == "gpuscale-test"
    created = [
        cluster.node_pool_create(
            GPU,
            2,
            labels={"gpuscale.io/pool": "gpu", "team": "ml"},
            taints=[{"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}],
            tags=["gpuscale", f"gpuscale-req:r{i}"],
        )
        for i in range(5)
    ]
    pools = list(LKECluster(api, cid).pools)  # three pages of two
    assert [p.id for p in pools] == [p.id for p in created]
    first = pools[0]
    assert first._raw_json["labels"] == {"gpuscale.io/pool": "gpu", "team": "ml"}
    node = cluster.node_view(first.nodes[0].id)
    assert node.status == "ready" and node.instance_id == int(first.nodes[0].instance_id)
    api.put(LKENodePool.api_endpoint, model=first, data={"count": 3, "labels": {"team": "ml"}})
    cluster.node_recycle(first.nodes[0].id)
    cluster.node_delete(first.nodes[1].id)
    api.load(LKENodePool, first.id, cid).recycle()
    created[1].delete()
    with pytest.raises(ApiError) as gone:
        cluster.node_view("no-such-node")
    assert gone.value.status == 404
    assert [p["count"] for p in fake.pools(cid)] == [2, 2, 2, 2]
    assert fake.invalid_requests == []
    assert fake.response_errors == []
    fake.check()
    assert len({r.path for r in fake.requests}) >= 6


def test_an_invalid_response_of_the_fake_raises(fake: FakeLinodeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    cid = fake.create_cluster()
    fake.add_pool(cid, GPU, 1)
    original = fake._render_pool

    def broken(pool: Any) -> dict[str, Any]:
        return {**original(pool), "count": "one"}

    monkeypatch.setattr(fake, "_render_pool", broken)
    assert call(fake, "GET", f"/lke/clusters/{cid}/pools").status_code == 500
    with pytest.raises(FakeSpecViolation, match="count"):
        fake.check()
    fake.response_errors.clear()


def test_nodes_become_ready_after_the_delay_on_the_injected_clock(fake: FakeLinodeAPI) -> None:
    clock = ManualClock(0.0)
    fake.clock = clock
    fake.ready_delay_s = 120.0
    fake.stick_not_ready(1)
    cid = fake.create_cluster()
    pid = fake.add_pool(cid, GPU, 2)

    def statuses() -> list[str]:
        return [n["status"] for n in fake.pools(cid)[0]["nodes"]]

    assert statuses() == ["not_ready", "not_ready"]
    clock.advance_to(120.0)
    assert statuses() == ["not_ready", "ready"]  # the first node is stuck
    stuck = fake.pools(cid)[0]["nodes"][0]["id"]
    assert call(fake, "POST", f"/lke/clusters/{cid}/nodes/{stuck}/recycle").status_code == 200
    clock.advance_to(240.0)
    assert statuses() == ["ready", "ready"]
    assert fake.pools(cid)[0]["id"] == pid


def test_lke_rules_last_node_count_decrease_quota_and_capacity(fake: FakeLinodeAPI) -> None:
    cid = fake.create_cluster()
    pid = fake.add_pool(cid, GPU, 3)
    nodes = [n["id"] for n in fake.pools(cid)[0]["nodes"]]
    response = call(fake, "PUT", f"/lke/clusters/{cid}/pools/{pid}", {"count": 1})
    assert response.status_code == 200
    assert fake.count_decreases == [(pid, 3, 1)]
    last = call(fake, "DELETE", f"/lke/clusters/{cid}/nodes/{nodes[0]}")
    assert last.status_code == 400 and "last node" in last.json()["errors"][0]["reason"]
    fake.max_pools = 1
    quota = call(fake, "POST", f"/lke/clusters/{cid}/pools", {"type": GPU, "count": 1})
    assert quota.status_code == 400 and "limit" in quota.json()["errors"][0]["reason"]
    fake.max_pools = None
    fake.unavailable_types.add(GPU)
    capacity = call(fake, "POST", f"/lke/clusters/{cid}/pools", {"type": GPU, "count": 1})
    assert capacity.status_code == 400 and capacity.json()["errors"][0]["field"] == "type"
    long_tag = call(fake, "POST", f"/lke/clusters/{cid}/pools", {"type": "g6", "count": 1, "tags": ["x" * 51]})
    assert long_tag.status_code == 400 and long_tag.json()["errors"][0]["field"] == "tags[0]"
    assert len(fake.pools(cid)) == 1
    assert fake.invalid_requests == []


def test_fault_knobs(fake: FakeLinodeAPI) -> None:
    cid = fake.create_cluster()
    fake.fail_next(429, times=2, retry_after=5, method="GET")
    fake.fail_next(500, method="POST")
    first = call(fake, "GET", f"/lke/clusters/{cid}/pools")
    assert (first.status_code, first.headers["Retry-After"]) == (429, "5")
    assert call(fake, "GET", f"/lke/clusters/{cid}/pools").status_code == 429
    assert call(fake, "GET", f"/lke/clusters/{cid}/pools").status_code == 200
    assert call(fake, "POST", f"/lke/clusters/{cid}/pools", {"type": GPU, "count": 1}).status_code == 500
    assert fake.pools(cid) == []  # a failed request has no effect
    fake.delay_next(0.5, method="POST")
    with pytest.raises(requests.Timeout):
        requests.post(
            f"{fake.base_url}/lke/clusters/{cid}/pools",
            json={"type": GPU, "count": 1},
            headers={"Authorization": f"Bearer {fake.token}"},
            timeout=0.1,
        )
    assert len(fake.pools(cid)) == 1  # a delayed request is applied; only its response is late
    fake.check()


def test_the_label_schema_patch_is_needed_and_sufficient() -> None:
    """The published LKE ``labels`` schema rejects its own example; the patched spec accepts label maps."""
    from openapi_schema_validator import OAS30Validator

    from gpuscale.fakes.linode_api import DEFAULT_SPEC_PATH, _read_spec_dict

    raw = _read_spec_dict(DEFAULT_SPEC_PATH.resolve())
    create = raw["paths"]["/{apiVersion}/lke/clusters/{clusterId}/pools"]["post"]
    published = create["requestBody"]["content"]["application/json"]["schema"]["allOf"][0]["properties"]["labels"]
    assert list(OAS30Validator(published).iter_errors(published["example"]))
    patched = load_spec().spec / "paths" / "/{apiVersion}/lke/clusters/{clusterId}/pools" / "post" / "requestBody"
    schema = (patched / "content" / "application/json" / "schema" / "allOf" / 0 / "properties" / "labels").read_value()
    assert not list(OAS30Validator(schema).iter_errors(published["example"]))
    assert list(OAS30Validator(schema).iter_errors({"k": 1}))
