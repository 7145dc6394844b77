"""Fuzzing the GPR REST API: schemathesis from the app's own OpenAPI document (positive and negative cases per
operation), and hypothesis bodies beyond the schema against a real uvicorn server. Seeded (derandomized), a fixed
number of examples. Asserted: no 5xx, every 2xx create can be read back and is listed, listing always works."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from starlette.testclient import TestClient

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.core.gpr import SPEC_FIELDS
from gpuscale.gpr.api import create_app
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.server import allowed_hosts_for
from gpuscale.gpr.store import GprStore
from gpuscale.sim.wallclock import WallClockSimCloud
from uvicorn_harness import serve

TOKEN = "fuzz-token-91c2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 60
"""Examples per operation and generation mode (x2 modes, x6 operations)."""
HOSTILE_EXAMPLES = 300

CATALOG = load_catalog("linode")
CLOCK = ManualClock(1_700_000_000.0)
MANAGER = GprManager(GprStore(":memory:"), CATALOG, provider=WallClockSimCloud(CATALOG, CLOCK), clock=CLOCK)
APP = create_app(MANAGER, token=TOKEN)
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
OPERATIONS = [
    ("/api/v1/gpr", "POST"),
    ("/api/v1/gpr", "GET"),
    ("/api/v1/gpr", "PUT"),
    ("/api/v1/gpr", "DELETE"),
    ("/api/v1/gpr/list", "GET"),
    ("/api/v1/gpr/waittime", "POST"),
]
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _read_back(body: dict[str, Any]) -> None:
    gid = body["gprId"]
    got = APP_CLIENT.get("/api/v1/gpr", params={"gprId": gid}, headers=AUTH)
    assert got.status_code == 200, got.text
    assert got.json()["spec"] == body["spec"]
    listed = APP_CLIENT.get("/api/v1/gpr/list", headers=AUTH)
    assert listed.status_code == 200 and not listed.json()["errors"]
    assert gid in {g["gprId"] for g in listed.json()["items"]}


APP_CLIENT = TestClient(APP)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_schemathesis_finds_no_server_error(path: str, method: str, mode: GenerationMode) -> None:
    operation = SCHEMA[path][method]
    statuses: Counter[int] = Counter()

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode), servable=st.booleans())
    def run(case: Any, servable: bool) -> None:
        if servable and method == "POST" and isinstance(case.body, dict):
            case.body.setdefault("gpuShape", "RTX4000-Ada")  # half the bodies can pass the catalog check
        resp = case.call(headers=AUTH)
        statuses[resp.status_code] += 1
        case.validate_response(resp, checks=[not_a_server_error])
        if path == "/api/v1/gpr" and method == "POST" and resp.status_code == 201:
            _read_back(resp.json())

    run()
    codes = dict(sorted(statuses.items()))
    print(f"\n{method} {path} [{mode.value}]: {sum(statuses.values())} requests, statuses {codes}")
    assert sum(statuses.values()) >= EXAMPLES // 2
    assert all(code < 500 for code in statuses)
    listed = APP_CLIENT.get("/api/v1/gpr/list", headers=AUTH)
    assert listed.status_code == 200 and listed.json()["errors"] == []


# --- hostile bodies beyond the schema, over real HTTP ------------------------------------------------------------

_text = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202etxet", "\u0663h", "x" * 300, "1e400", "99999999999d"]),
)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**20, max_value=10**40),
    st.floats(allow_nan=False),
    _text,
)
_junk = st.recursive(
    _scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=12
)
_keys = st.one_of(
    st.sampled_from([*SPEC_FIELDS, "gprName", "sliceName", "memoryPerGPU", "gprId"]),
    st.sampled_from(["numberOfGpus", "REQUESTNAME", "exit_duration", "priorty", "", "\ud800", "a\x00"]),
    st.text(max_size=20),
)
_bodies = st.one_of(
    st.dictionaries(_keys, _junk, max_size=8),
    st.fixed_dictionaries(
        {"requestName": _text, "gpuShape": st.just("RTX4000-Ada"), "exitDuration": _text},
        optional={"numberOfGPUs": _scalar, "priority": _scalar, "clusterName": _text, "workloadSelector": _junk},
    ),
    _junk,
)
_raw = st.sampled_from(
    [
        b"[" * 50_000,
        b'{"a": ' * 5000 + b"1" + b"}" * 5000,
        b'{"priority": ' + b"9" * 5000 + b"}",
        b'{"numberOfGPUs": 1e400, "requestName": "x", "exitDuration": "1h"}',
        b"\xff\xfe\x00",
        b"",
        b"null",
        b'{"requestName": "\\ud800", "gpuShape": "RTX4000-Ada", "exitDuration": "1h"}',
    ]
)


@pytest.fixture(scope="module")
def live() -> Iterator[httpx.Client]:
    catalog = load_catalog("linode")
    clock = ManualClock(1_700_000_000.0)
    manager = GprManager(GprStore(":memory:"), catalog, provider=WallClockSimCloud(catalog, clock), clock=clock)
    app = create_app(manager, token=TOKEN, allowed_hosts=allowed_hosts_for("127.0.0.1"))
    running = serve(app, log_level="critical")
    with httpx.Client(base_url=running.url, headers=AUTH, timeout=30) as http:
        yield http
    running.stop()


ROUTES = [("POST", "/api/v1/gpr"), ("PUT", "/api/v1/gpr"), ("POST", "/api/v1/gpr/waittime")]


def test_hostile_bodies_over_http_never_5xx_and_listing_survives(live: httpx.Client) -> None:
    statuses: Counter[tuple[str, int]] = Counter()

    @settings(
        max_examples=HOSTILE_EXAMPLES, derandomize=True, deadline=None, database=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(route=st.sampled_from(ROUTES), body=st.one_of(_bodies.map(_encode), _raw))
    def run(route: tuple[str, str], body: bytes) -> None:
        method, path = route
        resp = live.request(method, path, content=body, headers={"Content-Type": "application/json"})
        statuses[(f"{method} {path}", resp.status_code)] += 1
        assert resp.status_code < 500, (body[:200], resp.text[:300])
        assert len(resp.content) < 20_000
        resp.json()  # always a JSON body
        if resp.status_code == 201:
            gid = resp.json()["gprId"]
            assert live.get("/api/v1/gpr", params={"gprId": gid}).status_code == 200
        listed = live.get("/api/v1/gpr/list")
        assert listed.status_code == 200 and listed.json()["errors"] == []

    run()
    print("\nhostile bodies:", dict(sorted(statuses.items())))
    assert sum(statuses.values()) >= HOSTILE_EXAMPLES // 2


def _encode(value: object) -> bytes:
    """JSON of ``value``, keeping lone surrogates as ``\\udXXX`` escapes (as a hostile client would send them)."""
    return json.dumps(value).encode()
