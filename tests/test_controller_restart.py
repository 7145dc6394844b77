"""A restarted controller keeps offering marks and pool back-offs when its Availability has a persistent store
(embedded mode: SQLite), and the launcher never sleeps: a rate-limited launch is retried at its due time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuscale.controller.availability import Availability, SqliteStore
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.model import CapacityType, OfferingKey
from gpuscale.sim.cloud import CapacityRule, Faults
from test_controller import CATALOG, CONFIG, FAST, Harness, gpod, gpu_pool

OD = CapacityType.ON_DEMAND


class StoredHarness(Harness):
    """A harness whose controllers share one SQLite availability store (a restart opens it again)."""

    def __init__(self, path: Path, **kw: Any) -> None:
        self.path = path
        super().__init__(**kw)

    def new_controller(self) -> Controller:
        store = SqliteStore(self.path)
        return Controller(
            self.backend,
            self.provider,
            self.pools,
            CATALOG,
            self.engine.clock,
            self.config,
            availability=Availability(store),
        )


def test_a_restart_remembers_an_offering_out_of_capacity(tmp_path: Path) -> None:
    ice = replace(FAST, capacity=(CapacityRule(0, instance_type="g1", zone="z1"),))
    h = StoredHarness(tmp_path / "a.db", pools=[gpu_pool(instance_types=("g1",))], behaviour=ice)
    h.add(gpod("a"))
    h.run(2.0)
    key = OfferingKey("g1", "z1", OD)
    assert key in h.ctrl.unavailable
    tried = h.cloud.counters.launch_calls
    h.ctrl = h.new_controller()  # crash and restart
    assert h.ctrl.unavailable[key] > h.engine.now()
    h.add(gpod("b"))
    h.run(10.0)
    assert h.cloud.counters.launch_calls == tried + 1  # straight to z2: the mark survived the restart
    assert {n.zone for n in h.alive()} == {"z2"}
    failures = [e for e in h.events(EventKind.LAUNCH_FAILED)]
    assert len(failures) == 1


def test_a_restart_keeps_a_pool_backoff_and_its_failure_count(tmp_path: Path) -> None:
    quota = replace(FAST, quota_nodes=1)
    cfg = replace(CONFIG, quota_backoff_s=60.0)
    h = StoredHarness(tmp_path / "b.db", pools=[gpu_pool(instance_types=("g1",))], behaviour=quota, config=cfg)
    h.add(gpod("a"))
    h.add(gpod("b"))
    h.run(2.0)
    assert len(h.events(EventKind.BACKOFF)) == 1
    calls = h.cloud.counters.launch_calls
    h.ctrl = h.new_controller()
    h.run(55.0)
    assert h.cloud.counters.launch_calls == calls  # the new controller honours the back-off too
    h.run(70.0)
    backoffs = h.events(EventKind.BACKOFF)
    assert len(backoffs) == 2 and "for 120s" in backoffs[-1].message  # the count went on: 60 s, then 120 s


def test_rate_limited_launches_wait_their_retry_after_without_sleeping() -> None:
    limited = replace(FAST, faults=Faults(rate_limited=1.0, retry_after_s=7, methods=("launch",)))
    h = Harness([gpu_pool(instance_types=("g1",))], behaviour=limited)
    h.add(gpod("a"))
    h.run(3.0)
    retries = h.events(EventKind.LAUNCH_RETRY)
    assert retries and retries[0].reason == "RateLimited"
    assert h.engine.now() == 3.0  # the reconcile did not wait
    wake = h.ctrl.next_wakeup()
    assert wake is not None and wake <= retries[0].at + 7.0
    calls = h.cloud.counters.launch_calls
    h.run(retries[0].at + 6.0)
    assert h.cloud.counters.launch_calls == calls  # not due yet
