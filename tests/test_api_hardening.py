"""The GPR REST API refuses what it cannot keep: validation before storage, bounded strings and numbers, unknown
fields with suggestions, EGS aliases, listing that survives bad rows, JSON errors on a kept-alive connection, the
loopback Host rule, and the Linode token scrubbed from exception chains."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import requests
from click.testing import CliRunner

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.core.gpr import GprConfig, GprSpec, new_gpr
from gpuscale.errors import InputError, ProviderError
from gpuscale.fakes.linode_api import FakeLinodeAPI
from gpuscale.gpr.api import create_app
from gpuscale.gpr.cli import _cell, gpr_group
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.server import ReconcileLoop, allowed_hosts_for, max_exit_from_env
from gpuscale.gpr.store import GprStore
from gpuscale.providers.linode import LinodeConfig, LinodeProvider
from gpuscale.sim.wallclock import WallClockSimCloud
from uvicorn_harness import serve

TOKEN = "hardening-token-7d21"
T0 = 1_700_000_000.0
SPEC = {"requestName": "train", "gpuShape": "RTX4000-Ada", "exitDuration": "8h"}


@dataclass
class Server:
    url: str
    port: int
    manager: GprManager
    http: httpx.Client
    db: Path


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    clock = ManualClock(T0)
    catalog = load_catalog("linode")
    db = tmp_path / "gpr.db"
    manager = GprManager(
        GprStore(db), catalog, provider=WallClockSimCloud(catalog, clock), clock=clock, config=GprConfig(max_nodes=2)
    )
    app = create_app(manager, token=TOKEN, allowed_hosts=allowed_hosts_for("127.0.0.1", ["gpu.example.org"]))
    running = serve(app, log_level="critical")
    http = httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    yield Server(running.url, running.port, manager, http, db)
    http.close()
    running.stop()
    manager.store.close()


def _post_raw(s: Server, body: str | bytes, path: str = "/api/v1/gpr", method: str = "POST") -> httpx.Response:
    return s.http.request(method, path, content=body, headers={"Content-Type": "application/json"})


def _fields(resp: httpx.Response) -> dict[str, str]:
    assert resp.status_code == 422, resp.text
    return {d["loc"][-1]: d["msg"] for d in resp.json()["detail"]}


def _count(s: Server) -> int:
    resp = s.http.get("/api/v1/gpr/list")
    assert resp.status_code == 200, resp.text
    return int(resp.json()["count"])


# --- 1. a lone surrogate is refused before storage, and listing keeps working ---------------------------------------


def test_lone_surrogate_request_name_is_422_and_nothing_is_stored(srv: Server) -> None:
    body = '{"requestName": "a\\ud800b", "gpuShape": "RTX4000-Ada", "exitDuration": "8h"}'
    assert "U+D800" in _fields(_post_raw(srv, body))["requestName"]
    assert _count(srv) == 0
    runner = CliRunner(env={"GPUSCALE_API_TOKEN": TOKEN})
    assert runner.invoke(gpr_group, ["list", "--url", srv.url]).exit_code == 0


def test_store_refuses_a_gpr_that_would_not_read_back(tmp_path: Path) -> None:
    catalog = load_catalog("linode")
    store = GprStore(tmp_path / "s.db")
    bad = GprSpec(request_name="x\ud800", exit_duration_s=3600, gpu_shape="RTX4000-Ada")
    with pytest.raises(InputError, match="cannot be stored"):
        store.insert(new_gpr("gpr-000000000001", bad, catalog, T0))
    assert store.list_checked() == ([], [])


# --- 2. strings, bounds and huge numbers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "field", "needle"),
    [
        ({"requestName": "n" * 41}, "requestName", "at most 40"),
        ({"requestName": "a\x00b"}, "requestName", "U+0000"),
        ({"requestName": "a\u202eb"}, "requestName", "U+202E"),
        ({"requestName": "a\x85b"}, "requestName", "U+0085"),
        ({"clusterName": "c" * 100_000}, "clusterName", "at most 253"),
        ({"clusterName": "Not_DNS"}, "clusterName", "DNS-1123"),
        ({"exitDuration": "99999999999d"}, "exitDuration", "at most 365d"),
        ({"exitDuration": "1" * 40 + "d"}, "exitDuration", "too long"),
        ({"exitDuration": "400d"}, "exitDuration", "at most 365d0h0m"),
        ({"exitDuration": "\u0663h"}, "exitDuration", "not a duration"),
        ({"idleTimeOutDuration": "999999d"}, "idleTimeOutDuration", "at most"),
        ({"numberOfGPUs": 65}, "numberOfGPUs", "between 1 and 64"),
        ({"numberOfGPUNodes": 10**30}, "numberOfGPUNodes", "huge number"),
        ({"memoryPerGpu": 10**9}, "memoryPerGpu", "between 0 and 4096"),
        ({"priority": 301}, "priority", "between 1 and 300"),
        ({"priority": "\u0663"}, "priority", "must be an integer"),
        ({"gpuShape": ["RTX"]}, "gpuShape", "must be a string"),
        ({"workloadSelector": {"matchLabels": {"app": "x\n"}}}, "workloadSelector", "invalid label value"),
    ],
)
def test_bad_strings_and_numbers_are_field_errors(
    srv: Server, patch: dict[str, object], field: str, needle: str
) -> None:
    resp = srv.http.post("/api/v1/gpr", json={**SPEC, **patch})
    msg = _fields(resp)[field]
    assert needle in msg, msg
    assert len(resp.content) < 2000  # a short prefix at most, never the value
    assert _count(srv) == 0


@pytest.mark.parametrize(
    "body",
    [
        '{"requestName": "t", "exitDuration": "8h", "gpuShape": "RTX4000-Ada", "numberOfGPUs": 1e400}',
        '{"requestName": "t", "exitDuration": "8h", "gpuShape": "RTX4000-Ada", "priority": ' + "9" * 6000 + "}",
        '{"requestName": "t", "exitDuration": "8h", "numberOfGPUs": NaN}',
        "[" * 20_000,
        '{"requestName": "' + "x" * 1_100_000 + '"}',
        "\xff\xfe not json",
        "[1, 2]",
    ],
    ids=["1e400", "6000-digits", "NaN", "deep-nesting", "huge-body", "bad-utf8", "not-an-object"],
)
def test_hostile_bodies_are_422(srv: Server, body: str) -> None:
    resp = _post_raw(srv, body.encode("latin-1"))
    assert resp.status_code == 422, resp.text
    assert len(resp.content) < 2000
    assert _count(srv) == 0


def test_max_exit_duration_is_configurable() -> None:
    assert max_exit_from_env({}) == 365 * 86400
    assert max_exit_from_env({"GPUSCALE_MAX_EXIT_DURATION": "30d"}) == 30 * 86400
    with pytest.raises(InputError):
        max_exit_from_env({"GPUSCALE_MAX_EXIT_DURATION": "soon"})


def test_server_max_exit_duration_applies(srv: Server) -> None:
    srv.manager.max_exit_s = 86400
    assert (
        "at most 1d0h0m" in _fields(srv.http.post("/api/v1/gpr", json={**SPEC, "exitDuration": "2d"}))["exitDuration"]
    )
    assert srv.http.post("/api/v1/gpr", json={**SPEC, "exitDuration": "1d"}).status_code == 201


# --- 3. unknown fields and EGS aliases --------------------------------------------------------------------------


def test_unknown_fields_are_422_with_the_closest_name(srv: Server) -> None:
    errs = _fields(srv.http.post("/api/v1/gpr", json={**SPEC, "numberOfGpus": 4, "EXITDURATION": "1h", "zzz": 1}))
    assert "did you mean numberOfGPUs?" in errs["numberOfGpus"]
    assert "did you mean exitDuration?" in errs["EXITDURATION"]
    assert "unknown field" in errs["zzz"]
    gid = srv.http.post("/api/v1/gpr", json=SPEC).json()["gprId"]
    assert (
        "did you mean priority?" in _fields(srv.http.put("/api/v1/gpr", json={"gprId": gid, "priorty": 5}))["priorty"]
    )
    errs = _fields(srv.http.post("/api/v1/gpr/waittime", json={"gpuShape": "RTX4000-Ada", "numberofgpus": 1}))
    assert "did you mean numberOfGPUs?" in errs["numberofgpus"]
    errs = _fields(srv.http.post("/api/v1/gpr/waittime", json={"gprId": gid, "bogus": 1}))
    assert "bogus" in errs
    assert _count(srv) == 1


def test_egs_rest_keys_are_accepted_as_aliases(srv: Server) -> None:
    body = {
        "gprName": "egs-style",
        "sliceName": "team-a",
        "clusterName": "worker-1",
        "enableAutoClusterSelection": False,
        "preferredClusters": ["worker-1"],
        "gpuShape": "RTX4000-Ada",
        "numberOfGPUs": 1,
        "numberOfGPUNodes": 1,
        "memoryPerGPU": 15,
        "priority": 201,
        "exitDuration": "0d0h5m",
    }
    resp = srv.http.post("/api/v1/gpr", json=body)
    assert resp.status_code == 201, resp.text
    spec = resp.json()["spec"]
    assert (spec["requestName"], spec["memoryPerGpu"], spec["clusterName"]) == ("egs-style", 15, "worker-1")
    both = _fields(srv.http.post("/api/v1/gpr", json={**SPEC, "gprName": "other"}))
    assert "alias of requestName" in both["gprName"]


def test_gpr_create_file_with_a_typo_exits_2_with_the_suggestion(srv: Server, tmp_path: Path) -> None:
    spec = tmp_path / "gpr.yaml"
    spec.write_text("requestName: t\ngpuShape: RTX4000-Ada\nexitDuration: 1h\nnumberOfGpus: 2\n", encoding="utf-8")
    runner = CliRunner(env={"GPUSCALE_API_TOKEN": TOKEN})
    result = runner.invoke(gpr_group, ["create", "--url", srv.url, "-f", str(spec)])
    assert result.exit_code == 2, result.output
    assert "did you mean numberOfGPUs?" in result.output
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [*a]\n", encoding="utf-8")
    result = runner.invoke(gpr_group, ["create", "--url", srv.url, "-f", str(bomb)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert _count(srv) == 0


# --- 4. listing survives rows that fail to decode ---------------------------------------------------------------


def test_listing_reports_corrupt_rows_instead_of_failing(srv: Server, caplog: pytest.LogCaptureFixture) -> None:
    ids = [srv.http.post("/api/v1/gpr", json={**SPEC, "requestName": f"r{i}"}).json()["gprId"] for i in range(3)]
    raw = sqlite3.connect(srv.db)
    raw.execute("UPDATE gprs SET spec=? WHERE gpr_id=?", ('{"requestName": "x\\ud800", "exitDuration": "1h"}', ids[0]))
    raw.execute("UPDATE gprs SET status=? WHERE gpr_id=?", ("{not json", ids[1]))
    raw.commit()
    raw.close()
    caplog.set_level(logging.ERROR)
    resp = srv.http.get("/api/v1/gpr/list")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [g["gprId"] for g in body["items"]] == [ids[2]]
    assert {e["gprId"] for e in body["errors"]} == {ids[0], ids[1]}
    assert ids[0] in caplog.text
    one = srv.http.get("/api/v1/gpr", params={"gprId": ids[0]})
    assert one.status_code == 500 and "cannot be decoded" in one.json()["detail"]
    srv.manager.reconcile()  # the controller skips the bad rows too
    runner = CliRunner(env={"GPUSCALE_API_TOKEN": TOKEN})
    piped = runner.invoke(gpr_group, ["list", "--url", srv.url])
    assert piped.exit_code == 0, piped.output
    assert ids[2] in piped.output and "unreadable" in piped.output


def test_gpr_list_prints_odd_unicode_safely() -> None:
    assert _cell("a\tb\nc\ud800\u202e[bold]") == "a?b?c??[bold]"
    assert len(_cell("x" * 1000)) == 80


def test_gpr_list_survives_odd_names_piped_and_on_a_terminal(srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("[bold]x[/bold]", "名前-\u00e9", "tab\u00a0name"):
        assert srv.http.post("/api/v1/gpr", json={**SPEC, "requestName": name}).status_code == 201
    runner = CliRunner(env={"GPUSCALE_API_TOKEN": TOKEN})
    piped = runner.invoke(gpr_group, ["list", "--url", srv.url])
    assert piped.exit_code == 0 and "[bold]x[/bold]" in piped.output
    assert all(line.count("\t") == 8 for line in piped.output.splitlines())
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    tty = runner.invoke(gpr_group, ["list", "--url", srv.url])
    assert tty.exit_code == 0, tty.output


# --- 5. errors keep the connection usable -----------------------------------------------------------------------


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    sock.sendall(request)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        rest += chunk
    return int(head.split(b" ")[1]), rest


def _req(method: str, path: str, body: bytes = b"", host: str = "127.0.0.1") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_a_500_keeps_the_connection_open(srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(spec: object) -> float:
        raise RuntimeError("estimator exploded")

    monkeypatch.setattr(srv.manager, "estimate_wait", broken)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        status, body = _exchange(sock, _req("POST", "/api/v1/gpr/waittime", b'{"gpuShape": "RTX4000-Ada"}'))
        assert status == 500 and json.loads(body) == {"detail": "internal error; the server log has details"}
        status, _ = _exchange(sock, _req("POST", "/api/v1/gpr", b'{"requestName": 5}'))
        assert status == 422
        status, body = _exchange(sock, _req("GET", "/api/v1/gpr/list"))
        assert status == 200 and json.loads(body)["count"] == 0


# --- 6. DNS rebinding -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1", 200),
        ("localhost:8080", 200),
        ("[::1]:8080", 200),
        ("gpu.example.org", 200),
        ("evil.example.com", 421),
        ("127.0.0.1.evil.example.com", 421),
        ("", 421),
    ],
)
def test_loopback_server_refuses_foreign_host_headers(srv: Server, host: str, status: int) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        for path in ("/healthz", "/api/v1/gpr/list"):
            got, _ = _exchange(sock, _req("GET", path, host=host))
            assert got == status, (host, path)


def test_host_rule_only_applies_to_loopback_binds() -> None:
    assert allowed_hosts_for("0.0.0.0") is None
    assert allowed_hosts_for("10.1.2.3") is None
    assert allowed_hosts_for("::1") == frozenset({"localhost", "127.0.0.1", "::1"})
    assert "proxy.local" in (allowed_hosts_for("localhost", ["Proxy.Local"]) or ())


# --- 7. the Linode token never leaves through exception chains --------------------------------------------------

SECRET = "tok-hardening-0123456789abcdef0123456789"


def test_linode_token_is_scrubbed_from_chained_exceptions(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with FakeLinodeAPI(token=SECRET) as fake:
        clock = ManualClock(0.0)
        fake.clock = clock
        cluster = fake.create_cluster(region="us-ord")
        config = LinodeConfig(cluster_id=cluster, region="us-ord", base_url=fake.base_url)
        provider = LinodeProvider(config, env={"LINODE_TOKEN": SECRET}, clock=clock)
        failures = [
            requests.exceptions.ConnectionError(f"proxy refused Authorization: Bearer {SECRET}"),
            RuntimeError(f"client bug, token={SECRET}"),
        ]
        for failure in failures:

            def boom(*_: object, failure: Exception = failure, **__: object) -> object:
                raise failure

            provider._client.get = boom
            with pytest.raises(ProviderError) as info:
                provider.list_nodes()
            logging.getLogger("gpuscale.test").error("provider failed", exc_info=info.value)
            chain: BaseException | None = info.value
            while chain is not None:
                assert SECRET not in str(chain) and SECRET not in repr(chain.args)
                chain = chain.__cause__ or chain.__context__
    assert SECRET not in caplog.text
    assert "provider failed" in caplog.text


def test_reconcile_loop_scrubs_secrets_from_logged_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    class Exploding:
        """A manager whose reconcile pass fails with the token in a chained exception."""

        calls = 0

        def reconcile(self) -> object:
            self.calls += 1
            try:
                raise ValueError(f"inner {SECRET}")
            except ValueError as exc:
                raise RuntimeError("outer") from exc

    manager = Exploding()
    loop = ReconcileLoop(manager, interval_s=0.01, secrets=(SECRET,))  # type: ignore[arg-type]
    caplog.set_level(logging.ERROR)
    loop.start()
    deadline = time.monotonic() + 5
    while manager.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.stop()
    assert "reconcile pass failed" in caplog.text and "inner ***" in caplog.text
    assert SECRET not in caplog.text
