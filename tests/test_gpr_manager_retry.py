"""The GPR manager's launch errors follow each error's RetryPolicy (one retry layer), and its capacity marks live in
a shared, persistable Availability record."""

from __future__ import annotations

from pathlib import Path

from gpuscale.clock import ManualClock
from gpuscale.controller.availability import Availability, MemoryStore, SqliteStore
from gpuscale.core.gpr import GprState
from gpuscale.core.model import CapacityType, OfferingKey
from gpuscale.core.reconcile import LaunchRules, next_try_in
from gpuscale.errors import (
    InsufficientCapacity,
    InvalidProviderRequest,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.server import build_manager
from gpuscale.gpr.store import GprStore
from test_gpr_manager import CATALOG, SPEC, FakeProvider, manager


def test_a_rate_limited_launch_waits_its_retry_after_with_the_same_request_id(tmp_path: Path) -> None:
    cloud = FakeProvider()
    cloud.faults["launch"] = [RateLimited("429", provider="fake", retry_after=30.0)]
    m, clock = manager(tmp_path, cloud)
    g = m.create({**SPEC, "numberOfGPUNodes": 1})
    assert m.reconcile().launched == []
    clock.sleep(10)
    m.reconcile()
    assert len(cloud.launch_calls) == 1  # not due yet: no call
    clock.sleep(21)
    assert m.reconcile().launched == [f"{g.gpr_id}-a0"]
    assert [c.request_id for c in cloud.launch_calls] == [f"{g.gpr_id}-a0"] * 2


def test_transient_errors_back_off_and_give_up_after_the_policys_attempts(tmp_path: Path) -> None:
    limit = TransientProviderError("x").retry.max_attempts
    cloud = FakeProvider()
    cloud.faults["launch"] = [TransientProviderError("503", provider="fake") for _ in range(limit)]
    m, clock = manager(tmp_path, cloud)
    g = m.create({**SPEC, "numberOfGPUNodes": 1})
    calls = []
    for _ in range(40):
        m.reconcile()
        calls.append(len(cloud.launch_calls))
        clock.sleep(1)
        if m.get(g.gpr_id).state is GprState.FAILED:
            break
    assert len(cloud.launch_calls) == limit  # 1 s, 2 s, 4 s, 8 s apart, then the attempt fails
    failed = m.get(g.gpr_id)
    assert failed.state is GprState.FAILED and f"gave up after {limit} attempts" in failed.status.failure_reason
    assert calls[:4] == [1, 2, 2, 3]


def test_an_invalid_request_fails_the_attempt_at_once(tmp_path: Path) -> None:
    cloud = FakeProvider()
    cloud.faults["launch"] = [InvalidProviderRequest("bad label", provider="fake", field="labels")]
    m, _ = manager(tmp_path, cloud)
    g = m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.FAILED


def test_capacity_marks_persist_in_a_shared_availability_record(tmp_path: Path) -> None:
    store = MemoryStore()
    shared = Availability(store)
    cloud = FakeProvider()
    cloud.faults["launch"] = [InsufficientCapacity("none left", provider="fake")]
    m, clock = manager(tmp_path, cloud, availability=shared)
    m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    marked = set(shared.unavailable_at(clock.now()))
    assert marked and all(k.capacity_type is CapacityType.ON_DEMAND for k in marked)
    assert set(Availability(store).offerings) == marked  # a restarted process reads them back
    # a mark made elsewhere (the node controller) steers the GPR manager too
    other = OfferingKey("elsewhere", "us-ord", CapacityType.ON_DEMAND)
    shared.mark_unavailable(other, clock.now() + 60)
    assert other in m.unavailable_offerings


def test_next_try_in_follows_the_policy() -> None:
    rules = LaunchRules()
    assert next_try_in(RateLimited("r", retry_after=9.0), 1, rules) == 9.0
    assert [next_try_in(TransientProviderError("t"), n, rules) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, None]
    assert next_try_in(QuotaExceeded("q"), 20, rules) == rules.max_backoff_s  # never gives up, capped
    assert next_try_in(InsufficientCapacity("c"), 1, rules) is None
    assert next_try_in(InvalidProviderRequest("i"), 1, rules) is None


def test_embedded_mode_keeps_capacity_marks_in_the_gpr_database(tmp_path: Path) -> None:
    """``gpuscale serve`` builds its manager with an Availability stored in the same SQLite file as the GPRs."""
    db = tmp_path / "gpr.db"
    first = build_manager(db, provider="sim", catalog="linode", env={})
    assert isinstance(first.availability.store, SqliteStore)
    key = OfferingKey("g2-gpu-rtx4000a1-s", "us-ord", CapacityType.ON_DEMAND)
    first.mark_unavailable(key.instance_type, key.zone, until=first.clock.now() + 600)
    first.store.close()
    again = build_manager(db, provider="sim", catalog="linode", env={})  # a restarted server
    assert key in again.unavailable_offerings
    again.store.close()


def _restart(tmp_path: Path, cloud: FakeProvider, clock: ManualClock, availability: Availability) -> GprManager:
    """A new manager on the same GPR database and clock."""
    return GprManager(GprStore(tmp_path / "gpr.db"), CATALOG, provider=cloud, clock=clock, availability=availability)


def test_a_restarted_manager_keeps_a_launchs_retry_due_time_and_attempts(tmp_path: Path) -> None:
    """Retry due times live in the Availability record: with its SQLite store (embedded mode) a restarted manager
    neither calls a rate-limited launch before its Retry-After nor forgets the attempts a transient error used."""
    cloud = FakeProvider()
    cloud.faults["launch"] = [RateLimited("429", provider="fake", retry_after=60.0)]
    db = tmp_path / "avail.db"
    m, clock = manager(tmp_path, cloud, availability=Availability(SqliteStore(db)))
    g = m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    assert len(cloud.launch_calls) == 1
    rid = f"{g.gpr_id}-a0"
    again = _restart(tmp_path, cloud, clock, Availability(SqliteStore(db)))
    pending = again.availability.retry(rid)
    assert pending is not None and pending.failures == 1 and pending.until == clock.now() + 60.0
    clock.sleep(30)
    again.reconcile()
    assert len(cloud.launch_calls) == 1  # not due yet, after the restart too
    clock.sleep(31)
    assert again.reconcile().launched == [rid]
    assert Availability(SqliteStore(db)).retry(rid) is None  # done: dropped from the store


def test_without_a_persistent_store_a_restart_forgets_the_retry(tmp_path: Path) -> None:
    """The failure the store prevents (and proof the test above can fail)."""
    cloud = FakeProvider()
    cloud.faults["launch"] = [RateLimited("429", provider="fake", retry_after=60.0)]
    m, clock = manager(tmp_path, cloud, availability=Availability(MemoryStore()))
    m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    again = _restart(tmp_path, cloud, clock, Availability(MemoryStore()))
    clock.sleep(30)
    again.reconcile()
    assert len(cloud.launch_calls) == 2  # called again before its Retry-After
