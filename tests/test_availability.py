"""Offering availability and back-offs (controller.availability): marks, back-off arithmetic, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.controller.availability import (
    Availability,
    AvailabilityStore,
    Backoff,
    Mark,
    MarkKind,
    MemoryStore,
    SqliteStore,
    offering_key_text,
    parse_offering_key,
)
from gpuscale.core.model import CapacityType, OfferingKey

A = OfferingKey("g2-gpu-rtx4000a1-s", "us-ord", CapacityType.ON_DEMAND)
B = OfferingKey("p3.2xlarge", "us-east-1a", CapacityType.SPOT)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> AvailabilityStore:
    if request.param == "memory":
        return MemoryStore()
    db = SqliteStore(tmp_path / "availability.db")
    request.addfinalizer(db.close)
    return db


def test_offering_key_round_trips() -> None:
    for key in (A, B):
        assert parse_offering_key(offering_key_text(key)) == key


def test_a_mark_only_extends(store: AvailabilityStore) -> None:
    av = Availability(store)
    assert av.mark_unavailable(A, 100.0, "capacity")
    assert not av.mark_unavailable(A, 50.0)  # an earlier end changes nothing
    assert not av.mark_unavailable(A, 100.0)
    assert av.offerings[A] == 100.0
    assert av.mark_unavailable(A, 150.0)
    assert av.unavailable_at(149.0) == {A: 150.0}
    assert av.unavailable_at(150.0) == {}


def test_backoff_doubles_to_the_cap_and_clears_on_success(store: AvailabilityStore) -> None:
    av = Availability(store)
    delays = [av.back_off("gpu", 0.0, 60.0, 600.0) for _ in range(6)]
    assert delays == [60.0, 120.0, 240.0, 480.0, 600.0, 600.0]
    assert av.backoffs["gpu"] == Backoff(600.0, 6)
    assert av.backed_off("gpu", 599.0) and not av.backed_off("gpu", 600.0)
    assert av.back_off("gpu", 0.0, 7.0, 600.0, exponential=False) == 7.0  # a Retry-After is waited as given
    av.clear_backoff("gpu")
    assert not av.backed_off("gpu", 0.0)
    assert av.back_off("gpu", 0.0, 60.0, 600.0) == 60.0  # the count started again


def test_a_restart_keeps_every_mark(store: AvailabilityStore) -> None:
    av = Availability(store)
    av.mark_unavailable(A, 100.0, "capacity")
    av.mark_unavailable(B, 200.0, "spot interruption")
    av.back_off("gpu", 10.0, 60.0, 600.0)
    av.back_off("gpu", 10.0, 60.0, 600.0)
    av.allow_fallback("spot-pool", 300.0)
    again = Availability(store)  # a new controller on the same store
    assert dict(again.offerings) == {A: 100.0, B: 200.0}
    assert dict(again.backoffs) == {"gpu": Backoff(130.0, 2)}
    assert again.fallback_active("spot-pool", 299.0) and not again.fallback_active("spot-pool", 300.0)
    assert again.back_off("gpu", 10.0, 60.0, 600.0) == 240.0  # the failure count survived too


def test_sqlite_store_survives_a_new_connection(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    first = SqliteStore(path)
    Availability(first).mark_unavailable(A, 42.0, "capacity")
    first.close()
    second = SqliteStore(path)
    try:
        assert second.load() == [Mark(MarkKind.OFFERING, offering_key_text(A), 42.0, 0, "capacity")]
    finally:
        second.close()


def test_expire_forgets_ended_marks_but_keeps_backoff_counts(store: AvailabilityStore) -> None:
    av = Availability(store)
    av.mark_unavailable(A, 100.0)
    av.mark_unavailable(B, 300.0)
    av.allow_fallback("p", 50.0)
    av.back_off("gpu", 0.0, 10.0, 600.0)
    assert av.expire(100.0) == 2
    assert dict(av.offerings) == {B: 300.0}
    assert not av.fallbacks
    assert "gpu" in av.backoffs
    assert {m.kind for m in store.load()} == {MarkKind.OFFERING, MarkKind.BACKOFF}
    assert sorted(av.expiries()) == [10.0, 300.0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["mark", "backoff", "clear", "fallback", "expire"]), st.integers(0, 3), st.integers(0, 500)
        ),
        max_size=30,
    )
)
def test_a_reloaded_record_equals_the_live_one(ops: list[tuple[str, int, int]]) -> None:
    """Whatever sequence of changes, a new Availability on the same store holds exactly the live state."""
    keys = [A, B, OfferingKey("x", "z", CapacityType.SPOT), OfferingKey("y", "z", CapacityType.ON_DEMAND)]
    store = MemoryStore()
    av = Availability(store)
    for op, i, t in ops:
        if op == "mark":
            av.mark_unavailable(keys[i], float(t))
        elif op == "backoff":
            av.back_off(f"pool{i}", float(t), 5.0, 100.0)
        elif op == "clear":
            av.clear_backoff(f"pool{i}")
        elif op == "fallback":
            av.allow_fallback(f"pool{i}", float(t))
        else:
            av.expire(float(t))
    again = Availability(store)
    assert dict(again.offerings) == dict(av.offerings)
    assert dict(again.backoffs) == dict(av.backoffs)
    assert dict(again.fallbacks) == dict(av.fallbacks)
