"""The GPR REST API over real HTTP (uvicorn on 127.0.0.1, ephemeral port)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.core.gpr import GprConfig, GprState
from gpuscale.gpr.api import create_app
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.server import ReconcileLoop, build_manager
from gpuscale.gpr.store import GprStore
from gpuscale.sim.wallclock import WallClockSimCloud
from uvicorn_harness import serve

TOKEN = "test-token-4f1c0d"
T0 = 1_700_000_000.0
SPEC = {
    "requestName": "train",
    "clusterName": "lke-1",
    "gpuShape": "RTX4000-Ada",
    "numberOfGPUs": 4,
    "numberOfGPUNodes": 2,
    "priority": 201,
    "exitDuration": "0d8h0m",
    "idleTimeOutDuration": "30m",
    "workloadSelector": {"matchLabels": {"app": "train"}},
}


@dataclass
class Env:
    manager: GprManager
    clock: ManualClock
    http: httpx.Client
    anon: httpx.Client


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    clock = ManualClock(T0)
    catalog = load_catalog("linode")
    sim = WallClockSimCloud(catalog, clock, latency_s=5.0)
    db = tmp_path_factory.mktemp("api") / "gpr.db"
    manager = GprManager(GprStore(db), catalog, provider=sim, clock=clock, config=GprConfig(max_nodes=2))
    running = serve(create_app(manager, token=TOKEN))
    http = httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    anon = httpx.Client(base_url=running.url, timeout=10)
    yield Env(manager, clock, http, anon)
    http.close()
    anon.close()
    running.stop()


def fields(resp: httpx.Response) -> dict[str, str]:
    assert resp.status_code == 422, resp.text
    return {".".join(str(x) for x in d["loc"][1:]): d["msg"] for d in resp.json()["detail"]}


def test_requests_without_the_token_get_401(env: Env) -> None:
    assert env.anon.get("/api/v1/gpr/list").status_code == 401
    bad = env.anon.get("/api/v1/gpr/list", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
    assert env.anon.post("/api/v1/gpr", json={"priority": 0}).status_code == 401  # auth before validation
    assert env.anon.get("/healthz").status_code == 200


def test_openapi_schema_is_served(env: Env) -> None:
    doc = env.anon.get("/openapi.json").json()
    assert {"/api/v1/gpr", "/api/v1/gpr/list", "/api/v1/gpr/waittime"} <= set(doc["paths"])
    assert set(doc["paths"]["/api/v1/gpr"]) == {"get", "post", "put", "delete"}
    body = doc["paths"]["/api/v1/gpr"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    props = body["properties"]
    assert {"requestName", "gpuShape", "numberOfGPUNodes", "exitDuration", "enableEviction"} <= set(props)
    assert body["additionalProperties"] is False
    assert props["requestName"]["maxLength"] == 40 and props["priority"]["maximum"] == 300
    assert any(s.get("scheme") == "bearer" for s in doc["components"]["securitySchemes"].values())


def test_bad_input_is_422_with_field_messages_and_never_queued(env: Env) -> None:
    before = env.http.get("/api/v1/gpr/list").json()["count"]
    errs = fields(
        env.http.post(
            "/api/v1/gpr",
            json={**SPEC, "priority": 0, "numberOfGPUNodes": 0, "exitDuration": "-1h", "idleTimeOutDuration": "1x"},
        )
    )
    assert set(errs) == {"priority", "numberOfGPUNodes", "exitDuration", "idleTimeOutDuration"}
    assert "between 1 and 300" in errs["priority"] and "negative" in errs["exitDuration"]
    assert (
        "unknown GPU shape 'H100'"
        in fields(env.http.post("/api/v1/gpr", json={**SPEC, "gpuShape": "H100"}))["gpuShape"]
    )
    assert "numberOfGPUNodes" in fields(env.http.post("/api/v1/gpr", json={**SPEC, "numberOfGPUNodes": "2"}))
    assert "requestName" in fields(env.http.post("/api/v1/gpr", json={"exitDuration": "8h", "gpuShape": "T4"}))
    assert "exitDuration" in fields(env.http.post("/api/v1/gpr", json={**SPEC, "exitDuration": "8h30"}))
    assert env.http.get("/api/v1/gpr/list").json()["count"] == before


def test_create_get_list_update_cancel(env: Env) -> None:
    created = env.http.post("/api/v1/gpr", json=SPEC)
    assert created.status_code == 201
    body = created.json()
    gid = body["gprId"]
    assert body["status"]["provisioningStatus"] == "Queued"
    assert body["spec"]["exitDuration"] == "0d8h0m" and body["priorityBand"] == "high"
    assert body["status"]["cost"] == pytest.approx(2 * 2.96 * 8)
    got = env.http.get("/api/v1/gpr", params={"gprId": gid}).json()
    assert got["gprId"] == gid and got["spec"]["numberOfGPUNodes"] == 2
    assert got["spec"]["workloadSelector"] == {"matchLabels": {"app": "train"}}
    assert got["spec"]["enforceIdleTimeOut"] is True and got["spec"]["idleTimeOutDuration"] == "0d0h30m"
    listed = env.http.get("/api/v1/gpr/list", params={"status": "Queued"}).json()
    assert gid in [g["gprId"] for g in listed["items"]]
    assert env.http.get("/api/v1/gpr/list", params={"clusterName": "other"}).json()["count"] == 0
    put = env.http.put("/api/v1/gpr", json={"gprId": gid, "priority": 150})
    assert put.status_code == 200 and put.json()["spec"]["priority"] == 150
    assert "priority" in fields(env.http.put("/api/v1/gpr", json={"gprId": gid, "priority": 301}))
    assert "priority" in fields(env.http.put("/api/v1/gpr", json={"gprId": gid}))
    early = env.http.put("/api/v1/gpr", json={"gprId": gid, "earlyRelease": True})
    assert early.status_code == 409 and "cancel a queued one instead" in early.json()["detail"]
    cancelled = env.http.delete("/api/v1/gpr", params={"gprId": gid})
    assert cancelled.status_code == 200 and cancelled.json()["status"]["provisioningStatus"] == "Cancelled"
    assert env.http.delete("/api/v1/gpr", params={"gprId": gid}).status_code == 409
    assert env.http.get("/api/v1/gpr", params={"gprId": "gpr-unknown"}).status_code == 404


def test_provisioning_release_and_wait_time(env: Env) -> None:
    m, clock = env.manager, env.clock
    first = env.http.post("/api/v1/gpr", json=SPEC).json()["gprId"]
    m.reconcile()
    clock.sleep(11)
    m.reconcile()
    assert m.get(first).state is GprState.PROVISIONED
    # The node limit (2) is used up: a second GPR waits for the first one's exit duration.
    second = env.http.post("/api/v1/gpr", json={**SPEC, "priority": 101}).json()["gprId"]
    m.reconcile()
    w = env.http.post("/api/v1/gpr/waittime", json={"gprId": second}).json()
    assert w["provisioningStatus"] == "Queued" and w["servable"]
    assert w["estimatedWaitTimeSeconds"] == pytest.approx(8 * 3600 + 300)  # first ends 8h after it started (now)
    hypo = env.http.post("/api/v1/gpr/waittime", json={"gpuShape": "RTX4000-Ada", "numberOfGPUs": 4}).json()
    assert hypo["gprId"] is None and hypo["estimatedWaitTimeSeconds"] > 8 * 3600
    assert "gpuShape" in fields(env.http.post("/api/v1/gpr/waittime", json={"gpuShape": "H100"}))
    got = env.http.get("/api/v1/gpr", params={"gprId": first}).json()["status"]
    assert got["internalState"] == "Reserved" and len(got["nodeList"]) == 2
    assert got["nodePoolDetails"]["pool"] == first and len(got["nodePoolDetails"]["nodeIds"]) == 2
    rel = env.http.put("/api/v1/gpr", json={"gprId": first, "earlyRelease": True})
    assert rel.status_code == 200
    m.reconcile()
    assert env.http.get("/api/v1/gpr", params={"gprId": first}).json()["status"]["provisioningStatus"] == "Released"
    # Its nodes were being deleted during that pass (still counted against the limit); the next pass admits.
    m.reconcile()
    assert m.get(second).state is GprState.PROVISIONING


def test_server_with_background_reconcile_loop(tmp_path: Path) -> None:
    manager = build_manager(tmp_path / "s.db", provider="sim", env={}, sim_latency_s=0.0)
    loop = ReconcileLoop(manager, interval_s=0.05)
    loop.start()
    running = serve(create_app(manager, token=TOKEN))
    try:
        with httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as c:
            gid = c.post("/api/v1/gpr", json={**SPEC, "numberOfGPUNodes": 1}).json()["gprId"]
            deadline = time.monotonic() + 10
            state = ""
            while time.monotonic() < deadline:
                state = c.get("/api/v1/gpr", params={"gprId": gid}).json()["status"]["provisioningStatus"]
                if state == "Provisioned":
                    break
                time.sleep(0.05)
            assert state == "Provisioned"
    finally:
        running.stop()
        loop.stop()


def test_missing_linode_token_over_the_api(tmp_path: Path) -> None:
    manager = build_manager(
        tmp_path / "l.db", provider="linode", env={"LINODE_REGION": "us-ord", "LINODE_CLUSTER_ID": "1"}
    )
    running = serve(create_app(manager, token=TOKEN))
    try:
        with httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as c:
            gid = c.post("/api/v1/gpr", json=SPEC).json()["gprId"]
            manager.reconcile()
            status = c.get("/api/v1/gpr", params={"gprId": gid}).json()["status"]
            assert status["failureReason"] == "LINODE_TOKEN environment variable is not set"
            assert status["provisioningStatus"] == "Queued"
    finally:
        running.stop()


def test_cli_talks_to_the_server(env: Env, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from gpuscale.gpr.cli import gpr_group

    runner = CliRunner()
    url = str(env.http.base_url)
    ok_env = {"GPUSCALE_API_TOKEN": TOKEN}
    spec_file = tmp_path / "gpr.yaml"
    spec_file.write_text("spec:\n  requestName: from-file\n  gpuShape: RTX4000 Ada\n  exitDuration: 2h\n")
    res = runner.invoke(gpr_group, ["create", "--url", url, "-f", str(spec_file), "--priority", "50"], env=ok_env)
    assert res.exit_code == 0, res.output
    gid = json.loads(res.output)["gprId"]
    assert json.loads(runner.invoke(gpr_group, ["get", gid, "--url", url], env=ok_env).output)["spec"]["priority"] == 50
    listed = runner.invoke(gpr_group, ["list", "--url", url, "--json", "--status", "Queued"], env=ok_env)
    assert gid in [g["gprId"] for g in json.loads(listed.output)["items"]]
    table = runner.invoke(gpr_group, ["list", "--url", url], env=ok_env)
    assert table.exit_code == 0 and "from-file" in table.output
    wait = runner.invoke(gpr_group, ["wait-time", "--url", url, "--id", gid], env=ok_env)
    assert wait.exit_code == 0 and json.loads(wait.output)["gprId"] == gid
    prio = runner.invoke(gpr_group, ["priority", gid, "60", "--url", url], env=ok_env)
    assert json.loads(prio.output)["spec"]["priority"] == 60
    rel = runner.invoke(gpr_group, ["release", gid, "--url", url], env=ok_env)
    assert rel.exit_code == 1 and "HTTP 409" in rel.output
    cancel = runner.invoke(gpr_group, ["cancel", gid, "--url", url], env=ok_env)
    assert json.loads(cancel.output)["status"]["provisioningStatus"] == "Cancelled"
    bad = runner.invoke(
        gpr_group, ["create", "--url", url, "--name", "x", "--shape", "T4", "--exit", "-1h", "--nodes", "0"], env=ok_env
    )
    assert bad.exit_code == 2 and "exitDuration:" in bad.output and "numberOfGPUNodes:" in bad.output
    assert "Traceback" not in bad.output
    noauth = runner.invoke(gpr_group, ["list", "--url", url], env={"GPUSCALE_API_TOKEN": "wrong"})
    assert noauth.exit_code == 2 and "unauthorized" in noauth.output
    missing = runner.invoke(gpr_group, ["list", "--url", url], env={"GPUSCALE_API_TOKEN": ""})
    assert missing.exit_code == 2 and "GPUSCALE_API_TOKEN is not set" in missing.output
