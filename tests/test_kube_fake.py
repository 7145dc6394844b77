"""The Kubernetes API emulator (gpuscale.fakes.kube_api) over real HTTP: what the adapter relies on."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from gpuscale.fakes.kube_api import KubeAPIServer, label_matcher

pytest.importorskip("kmock")


@pytest.fixture(scope="module")
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        yield srv


@pytest.fixture
def http(server: KubeAPIServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=5) as c:
        yield c


def _pod(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {"containers": []}}


def test_create_stamps_server_metadata_and_answers_201(http: httpx.Client) -> None:
    r = http.post("/api/v1/namespaces/team-a/pods", json=_pod("stamp"))
    assert r.status_code == 201
    meta = r.json()["metadata"]
    assert meta["namespace"] == "team-a"
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert r.json()["status"] == {"phase": "Pending"}
    again = http.post("/api/v1/namespaces/team-a/pods", json=_pod("stamp"))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"
    assert again.headers["content-type"] == "application/json"


def test_namespace_in_body_must_match_the_url(http: httpx.Client) -> None:
    body = _pod("ns-mismatch")
    body["metadata"]["namespace"] = "other"  # type: ignore[index]
    assert http.post("/api/v1/namespaces/team-a/pods", json=body).status_code == 400


def test_stale_resource_version_conflicts(http: httpx.Client) -> None:
    created = http.post("/api/v1/nodes", json={"metadata": {"name": "conf-1"}, "status": {"allocatable": {}}}).json()
    rv = created["metadata"]["resourceVersion"]
    merge = {"Content-Type": "application/merge-patch+json"}
    ok = http.patch(
        "/api/v1/nodes/conf-1",
        headers=merge,
        content=json.dumps({"metadata": {"resourceVersion": rv}, "spec": {"unschedulable": True}}),
    )
    assert ok.status_code == 200 and ok.json()["spec"]["unschedulable"] is True
    stale = http.patch(
        "/api/v1/nodes/conf-1", headers=merge, content=json.dumps({"metadata": {"resourceVersion": rv}, "spec": {}})
    )
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    put = dict(ok.json())
    put["metadata"] = {**put["metadata"], "resourceVersion": rv}
    assert http.put("/api/v1/nodes/conf-1", json=put).status_code == 409


def test_patch_types_and_status_subresource(http: httpx.Client) -> None:
    http.post("/api/v1/nodes", json={"metadata": {"name": "st-1"}, "status": {"allocatable": {"cpu": "1"}}})
    # a write to the object ignores status; a write to /status changes only status
    merge = {"Content-Type": "application/merge-patch+json"}
    r = http.patch("/api/v1/nodes/st-1", headers=merge, content=json.dumps({"status": {"allocatable": {"cpu": "9"}}}))
    assert r.json()["status"]["allocatable"]["cpu"] == "1"
    r = http.patch(
        "/api/v1/nodes/st-1/status",
        headers=merge,
        content=json.dumps({"status": {"allocatable": {"cpu": "2"}}, "spec": {"unschedulable": True}}),
    )
    assert r.json()["status"]["allocatable"]["cpu"] == "2" and not r.json().get("spec", {}).get("unschedulable")
    jp = {"Content-Type": "application/json-patch+json"}
    r = http.patch(
        "/api/v1/nodes/st-1",
        headers=jp,
        content=json.dumps([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]),
    )
    assert r.json()["metadata"]["labels"] == {"a": "b"}
    smp = {"Content-Type": "application/strategic-merge-patch+json"}
    assert http.patch("/api/v1/nodes/st-1", headers=smp, content="{}").status_code == 415
    apply = {"Content-Type": "application/apply-patch+yaml"}
    assert http.patch("/api/v1/nodes/st-1", headers=apply, content="{}").status_code == 415


def test_label_and_field_selectors(http: httpx.Client) -> None:
    for name, tier in (("sel-a", "gpu"), ("sel-b", "cpu"), ("sel-c", "gpu")):
        http.post("/api/v1/namespaces/sel/pods", json=_pod(name, tier=tier))

    def names(r: httpx.Response) -> list[str]:
        return sorted(i["metadata"]["name"] for i in r.json()["items"])

    assert names(http.get("/api/v1/namespaces/sel/pods", params={"labelSelector": "tier=gpu"})) == ["sel-a", "sel-c"]
    assert names(http.get("/api/v1/namespaces/sel/pods", params={"labelSelector": "tier notin (gpu)"})) == ["sel-b"]
    got = http.get("/api/v1/pods", params={"fieldSelector": "metadata.namespace=sel,metadata.name!=sel-a"})
    assert names(got) == ["sel-b", "sel-c"]
    assert http.get("/api/v1/pods", params={"fieldSelector": "spec.bogus=x"}).status_code == 400
    assert label_matcher("a,!b")({"a": "1"}) and not label_matcher("a,!b")({"a": "1", "b": "2"})


def _watch(http: httpx.Client, path: str, params: dict[str, str]) -> list[dict[str, object]]:
    with http.stream("GET", path, params={"watch": "true", "timeoutSeconds": "1", **params}) as r:
        return [json.loads(line) for line in r.iter_lines() if line.strip()]


def test_watch_replays_from_a_resource_version_and_expires_after_compaction(
    server: KubeAPIServer, http: httpx.Client
) -> None:
    listed = http.get("/api/v1/namespaces/w/pods").json()
    rv = listed["metadata"]["resourceVersion"]
    http.post("/api/v1/namespaces/w/pods", json=_pod("w-1"))
    http.delete("/api/v1/namespaces/w/pods/w-1")
    events = _watch(http, "/api/v1/namespaces/w/pods", {"resourceVersion": rv})
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "w-1"), ("DELETED", "w-1")]  # type: ignore[index]
    as_go_parses_it = _watch(http, "/api/v1/namespaces/w/pods", {"resourceVersion": rv, "watch": "True"})
    assert len(as_go_parses_it) == 2
    server.compact()
    expired = _watch(http, "/api/v1/namespaces/w/pods", {"resourceVersion": rv})
    assert expired[0]["type"] == "ERROR" and expired[0]["object"]["code"] == 410  # type: ignore[index]


def test_an_open_watch_behind_a_compaction_gets_410_instead_of_spinning(server: KubeAPIServer) -> None:
    # a watch that had not yet read the last write when the history was compacted has lost events: it ends with
    # 410 Expired (the client relists); it used to loop on the server's event loop without yielding, freezing it
    em = server.emulator

    async def race() -> object:
        gen = em._watch(server._rt("pods"), None, {"resourceVersion": str(em.resource_version), "timeoutSeconds": "5"})
        assert await gen.__anext__() == b""
        await em.create_obj(server._rt("configmaps"), "default", {"metadata": {"name": "unread"}})
        em.compact()
        event = await gen.__anext__()
        await gen.aclose()  # type: ignore[attr-defined]  # an async generator
        return event

    event = server.run(race(), timeout=5)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410


def test_eviction_honours_pod_disruption_budgets(server: KubeAPIServer, http: httpx.Client) -> None:
    for name in ("ev-1", "ev-2"):
        server.create("pods", _pod(name, app="db"), namespace="ev")
        server.patch("pods", name, {"status": {"phase": "Running"}}, namespace="ev", status=True)
    server.create(
        "poddisruptionbudgets",
        {"metadata": {"name": "db"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}}},
        namespace="ev",
    )
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "ev-1", "namespace": "ev"}}
    refused = http.post("/api/v1/namespaces/ev/pods/ev-1/eviction", json=body)
    assert refused.status_code == 429 and refused.json()["reason"] == "TooManyRequests"
    server.patch("poddisruptionbudgets", "db", {"spec": {"minAvailable": 1}}, namespace="ev")
    assert http.post("/api/v1/namespaces/ev/pods/ev-1/eviction", json=body).status_code == 201
    assert server.get("pods", "ev-1", namespace="ev") is None
    assert (
        http.post("/api/v1/namespaces/ev/pods/ev-2/eviction", json={**body, "metadata": {"name": "ev-2"}}).status_code
        == 429
    )


def test_leases_update_with_optimistic_concurrency(http: httpx.Client) -> None:
    lease = {"metadata": {"name": "gpuscale"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    created = http.post("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", json=lease).json()
    upd = {**created, "spec": {"holderIdentity": "b", "leaseDurationSeconds": 15}}
    first = http.put("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuscale", json=upd)
    assert first.status_code == 200 and first.json()["spec"]["holderIdentity"] == "b"
    second = http.put("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuscale", json=upd)
    assert second.status_code == 409  # the same (now stale) resourceVersion


def test_unknown_resources_and_discovery(http: httpx.Client) -> None:
    assert http.get("/api/v1/widgets").status_code == 404
    groups = {g["name"] for g in http.get("/apis").json()["groups"]}
    assert {"policy", "apps", "coordination.k8s.io", "gpuscale.io"} <= groups
