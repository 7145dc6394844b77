"""Offering marks and back-offs on the OfferingAvailability object, against the emulated API server."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.controller.availability import Availability, Mark, MarkKind
from gpuscale.core.model import CapacityType, OfferingKey
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.availability_store import OBJECT_NAME, KubeAvailabilityStore
from gpuscale.kube.client import KubeClient
from gpuscale.kube.command import ControllerProcess
from gpuscale.kube.kwok import KwokConfig
from kube_harness import CONFIG, client_for, kwok_pool
from test_kube_e2e import World, gpu_pod

pytest.importorskip("lightkube")

CATALOG = load_catalog("linode")
T0 = 1_000_000.0
ADA = OfferingKey("g2-gpu-rtx4000a1-s", "us-ord", CapacityType.ON_DEMAND)
RES = "offeringavailabilities"
RBAC = f"{RES}.gpuscale.io"


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", kwok_pool(consolidate_after="60s"))
        yield srv


@pytest.fixture
def client(server: KubeAPIServer) -> Iterator[KubeClient]:
    c = client_for(server)
    yield c
    c.close()


def _obj(server: KubeAPIServer) -> dict[str, Any]:
    got = server.get(RES, OBJECT_NAME)
    assert got is not None
    return got


def _writes(server: KubeAPIServer, since: int) -> list[tuple[str, str]]:
    return [r for r in server.requests()[since:] if r[1].startswith(RES)]


# ------------------------------------------------------------------------------------------------ the store alone
def test_marks_are_written_once_per_flush_and_read_back(server: KubeAPIServer, client: KubeClient) -> None:
    clock = ManualClock(T0)
    store = KubeAvailabilityStore(client, CATALOG, clock)
    av = Availability(store)
    assert server.get(RES, OBJECT_NAME) is None
    av.mark_unavailable(ADA, T0 + 300, "insufficient capacity")
    other = OfferingKey("g2-gpu-rtx4000a1-s", "us-sea", CapacityType.ON_DEMAND)
    av.mark_unavailable(other, T0 + 120)
    av.back_off("ada", T0, 60, 600, reason="quota")
    av.allow_fallback("spotty", T0 + 90)
    av.set_retry("req-1", T0 + 30, 2, "rate limited")
    before = len(server.requests())
    assert store.flush()
    calls = _writes(server, before)
    assert calls == [("create", RBAC), ("patch", RBAC), ("patch", f"{RBAC}/status")]  # read at start: absent

    obj = _obj(server)
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuscale"}
    entries = obj["spec"]["unavailable"]
    assert {"instanceType": "g2-gpu-rtx4000a1-s", "zone": "us-ord", "capacityType": "on-demand",
            "until": _stamp(T0 + 300)} in entries  # fmt: skip
    marks = {m["kind"]: m for m in obj["status"]["marks"]}
    assert marks["backoff"] == {"kind": "backoff", "key": "ada", "until": _stamp(T0 + 60), "failures": 1,
                                "reason": "quota"}  # fmt: skip
    assert marks["retry"]["failures"] == 2 and marks["fallback"]["key"] == "spotty"

    before = len(server.requests())
    assert store.flush()  # nothing changed: no call at all
    assert _writes(server, before) == []

    again = Availability(KubeAvailabilityStore(client_for(server), CATALOG, clock))
    assert again.unavailable_at(T0) == {ADA: T0 + 300, other: T0 + 120}
    assert again.backoffs["ada"].failures == 1 and again.backed_off("ada", T0 + 59)
    assert again.fallback_active("spotty", T0 + 10) and again.retry("req-1") is not None


def test_expired_marks_are_pruned_on_flush(server: KubeAPIServer, client: KubeClient) -> None:
    clock = ManualClock(T0)
    store = KubeAvailabilityStore(client, CATALOG, clock)
    av = Availability(store)
    av.mark_unavailable(ADA, T0 + 10)
    av.allow_fallback("spotty", T0 + 10)
    av.back_off("ada", T0, 5, 600)
    store.flush()
    hand = [{"instanceType": "g2-gpu-rtx4000a1-s", "until": _stamp(T0 + 15)}, {"instanceType": "x", "until": "1h"}]
    entries = [*_obj(server)["spec"]["unavailable"], *hand]
    server.patch(RES, OBJECT_NAME, {"spec": {"unavailable": entries}})
    store.load()
    clock.sleep(20)
    store.flush()
    obj = _obj(server)
    assert obj["spec"]["unavailable"] == [hand[1]]  # a relative time is left to its writer
    assert [m["kind"] for m in obj["status"]["marks"]] == ["backoff"]  # its count stays


def test_a_conflicting_write_is_retried_next_round_keeping_the_other_change(
    server: KubeAPIServer, client: KubeClient
) -> None:
    clock = ManualClock(T0)
    store = KubeAvailabilityStore(client, CATALOG, clock)
    av = Availability(store)
    av.mark_unavailable(ADA, T0 + 300)
    assert store.flush()
    hand = {"instanceType": "g2-gpu-rtx4000a1-s", "until": "2099-01-01T00:00:00Z"}
    entries = [*_obj(server)["spec"]["unavailable"], hand]
    server.patch(RES, OBJECT_NAME, {"spec": {"unavailable": entries}})  # a user edits meanwhile
    av.back_off("ada", T0, 60, 600)
    av.mark_unavailable(ADA, T0 + 900)
    assert not store.flush()  # 409 Conflict: left dirty, no waiting
    assert store.conflicts == 1 and store.dirty
    assert store.flush()  # next round: re-read, then written on the new resourceVersion
    obj = _obj(server)
    assert hand in obj["spec"]["unavailable"]
    ours = [e for e in obj["spec"]["unavailable"] if e.get("zone") == "us-ord"]
    assert [e["until"] for e in ours] == [_stamp(T0 + 900)]
    assert obj["status"]["marks"][0]["key"] == "ada"


def test_a_hand_written_bad_entry_is_skipped_with_a_warning(server: KubeAPIServer) -> None:
    good = {"instanceType": "g2-gpu-rtx4000a1-s", "zone": "us-ord", "capacityType": "on-demand",
            "until": _stamp(T0 + 600)}  # fmt: skip
    server.create(
        RES,
        {
            "apiVersion": "gpuscale.io/v1alpha1",
            "kind": "OfferingAvailability",
            "metadata": {"name": OBJECT_NAME},
            "spec": {"unavailable": [{"instanceType": "g9-no-such-type", "until": "1h"}, good,
                                     {"instanceType": "g2-gpu-rtx4000a1-s", "until": "soonish"}]},
        },
        namespace="",
    )  # fmt: skip
    server.patch(RES, OBJECT_NAME, {"status": {"marks": [{"kind": "backoff", "key": "ada", "until": "tomorrow"}]}},
                 status=True)  # fmt: skip
    clock = ManualClock(T0)
    proc = ControllerProcess(client_for(server), CATALOG, "kwok", clock=clock, config=CONFIG).start(sync_timeout_s=5)
    try:
        store = proc.availability_store
        assert store is not None
        assert proc.controller.availability.unavailable_at(T0) == {ADA: T0 + 600}
        assert not proc.controller.availability.backoffs
        text = "\n".join(store.warnings)
        assert "spec.unavailable[0].instanceType" in text and "spec.unavailable[2].until" in text
        assert "status.marks[0]" in text and len(store.warnings) == 3
        proc.backend.events.flush()
        events = [e for e in server.items("events") if e.get("reason") == "BadAvailabilityEntry"]
        assert events and all(e["type"] == "Warning" for e in events)
    finally:
        proc.close()


# ------------------------------------------------------------------------------------------------ across restarts
def test_an_empty_offering_is_not_retried_after_a_restart_before_its_until(server: KubeAPIServer) -> None:
    kwok = KwokConfig(unavailable_types={"g2-gpu-rtx4000a1-s"})
    world = World(server, kwok)
    try:
        server.create("pods", gpu_pod("train-0"), namespace="ml")
        world.until(lambda: bool(world.proc.controller.availability.unavailable_at(world.clock.now())))
        until = world.proc.controller.availability.offerings[ADA]
        entries = _obj(server)["spec"]["unavailable"]
        assert [e["zone"] for e in entries] == ["us-ord"]
        kwok.unavailable_types.clear()  # capacity is back, but the new process must not know it yet
        world.restart()
        assert world.proc.controller.availability.offerings[ADA] >= until
        for _ in range(5):
            world.round(1.0)
        assert world.kwok_nodes() == []
        world.clock.sleep(until - world.clock.now() + 1)
        world.until(lambda: bool(world.kwok_nodes()))
    finally:
        world.close()


def test_a_pool_back_off_survives_a_restart(server: KubeAPIServer) -> None:
    kwok = KwokConfig(max_nodes=0)
    world = World(server, kwok)
    try:
        server.create("pods", gpu_pod("train-0"), namespace="ml")
        world.until(lambda: "ada" in world.proc.controller.availability.backoffs)
        until = world.proc.controller.availability.backoffs["ada"].until
        assert until > world.clock.now() + 2
        marks = _obj(server)["status"]["marks"]
        assert [(m["kind"], m["key"]) for m in marks] == [("backoff", "ada")]
        kwok.max_nodes = None
        world.restart()
        assert world.proc.controller.availability.backed_off("ada", world.clock.now())
        world.round(1.0)
        assert world.kwok_nodes() == []
        world.clock.sleep(until - world.clock.now() + 1)
        world.until(lambda: bool(world.kwok_nodes()))
    finally:
        world.close()


def test_a_controller_round_writes_marks_in_at_most_two_calls(server: KubeAPIServer) -> None:
    world = World(server, KwokConfig(unavailable_types={"g2-gpu-rtx4000a1-s"}))
    try:
        for i in range(3):
            server.create("pods", gpu_pod(f"train-{i}"), namespace="ml")
        before = len(server.requests())
        world.until(lambda: bool(world.proc.controller.availability.offerings))
        writes = [r for r in _writes(server, before) if r[0] != "watch" and r[0] != "list"]
        assert writes.count(("patch", RBAC)) == 1 and len(writes) <= 3, writes  # create, spec (, status)
    finally:
        world.close()


def test_marks_can_be_left_in_memory(server: KubeAPIServer) -> None:
    proc = ControllerProcess(
        client_for(server), CATALOG, "kwok", clock=ManualClock(T0), config=CONFIG, persist_availability=False
    ).start(sync_timeout_s=5)
    try:
        assert proc.availability_store is None
        proc.controller.availability.mark_unavailable(ADA, T0 + 60)
        proc.step()
        assert server.get(RES, OBJECT_NAME) is None
    finally:
        proc.close()


def test_a_mark_without_zone_is_read_but_never_rewritten(server: KubeAPIServer, client: KubeClient) -> None:
    hand = {"instanceType": "g2-gpu-rtx4000a1-s", "until": _stamp(T0 + 100)}
    server.create(
        RES,
        {"apiVersion": "gpuscale.io/v1alpha1", "kind": "OfferingAvailability", "metadata": {"name": OBJECT_NAME},
         "spec": {"unavailable": [hand]}},
        namespace="",
    )  # fmt: skip
    clock = ManualClock(T0)
    store = KubeAvailabilityStore(client, CATALOG, clock)
    av = Availability(store)
    assert ADA in av.unavailable_at(T0)
    av.back_off("ada", T0, 60, 600)
    av.mark_unavailable(OfferingKey("g2-gpu-rtx4000a1-s", "us-sea", CapacityType.SPOT), T0 + 50)
    store.flush()
    assert _obj(server)["spec"]["unavailable"][0] == hand
    assert Mark(MarkKind.BACKOFF, "ada", T0 + 60, 1, "") in store.load()


def test_an_offering_blocked_by_hand_while_running_is_not_bought(server: KubeAPIServer) -> None:
    world = World(server)
    try:
        world.round()
        server.create(
            RES,
            {"apiVersion": "gpuscale.io/v1alpha1", "kind": "OfferingAvailability", "metadata": {"name": "maintenance"},
             "spec": {"unavailable": [{"instanceType": "g2-gpu-rtx4000a1-s", "until": "10m"},
                                      {"instanceType": "g9-no-such-type", "until": "10m"}]}},
            namespace="",
        )  # fmt: skip
        world.settle()
        server.create("pods", gpu_pod("train-0"), namespace="ml")
        for _ in range(5):
            world.round(1.0)
        assert world.kwok_nodes() == []
        assert ADA in world.proc.controller.availability.unavailable_at(world.clock.now())
        store = world.proc.availability_store
        assert store is not None and any("maintenance" in w and "g9-no-such-type" in w for w in store.warnings)
        world.clock.sleep(600)
        world.until(lambda: bool(world.kwok_nodes()))
    finally:
        world.close()
