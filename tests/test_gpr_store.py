"""GprStore: WAL, schema versioning, compare-and-set, restarts and crashes between persisting and acting."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builders import GPR_SPEC
from gpuscale.clock import ManualClock
from gpuscale.core.gpr import GprState, Trigger, parse_gpr_spec, transition
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering
from gpuscale.errors import InputError
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.store import SCHEMA_VERSION, GprNotFound, GprStore, StaleWrite
from gpuscale.sim.wallclock import WallClockSimCloud

T0 = 1_700_000_000.0
CATALOG = Catalog(
    "test",
    (
        InstanceType(
            name="g2-rtx4000a4-s",
            provider="linode",
            vcpus=16,
            memory_mib=65536,
            gpu_count=4,
            gpu_model="RTX4000-Ada",
            gpu_memory_mib=20480,
            offerings=(Offering("us-ord", CapacityType.ON_DEMAND, 2.96),),
        ),
    ),
)
SPEC = GPR_SPEC
SRC = str(Path(__file__).resolve().parents[1] / "src")


class Crash(Exception):
    """Stands for the process dying at a hook point."""


def test_wal_mode_and_schema_version(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    store = GprStore(db)
    assert store.journal_mode == "wal" and store.schema_version() == SCHEMA_VERSION
    m = GprManager(store, CATALOG, clock=ManualClock(T0))
    m.create(SPEC)
    assert (tmp_path / "g.db-wal").exists()
    other = sqlite3.connect(db)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert other.execute("SELECT COUNT(*) FROM gprs").fetchone()[0] == 1
    other.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    GprStore(db).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="schema version 99 is newer"):
        GprStore(db)


def test_restart_keeps_gprs_events_and_versions(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    clock = ManualClock(T0)
    m = GprManager(GprStore(db), CATALOG, clock=clock)
    a = m.create(SPEC)
    b = m.create({**SPEC, "priority": 250, "idleTimeOutDuration": "30m", "workloadSelector": {"app": "x"}})
    m.cancel(a.gpr_id)
    m.set_priority(b.gpr_id, 260)
    m.store.close()
    again = GprStore(db)
    assert again.get(a.gpr_id).gpr.state is GprState.CANCELLED
    got_b = again.get(b.gpr_id)
    assert got_b.gpr.spec.priority == 260 and got_b.gpr.spec.workload_selector == {"app": "x"}
    assert got_b.gpr.spec.idle_timeout_s == 1800 and got_b.version == 2
    assert [e.trigger for e in again.events(a.gpr_id)] == [Trigger.CANCEL]
    assert [s.gpr.gpr_id for s in again.list_gprs()] == [a.gpr_id, b.gpr_id]
    assert [s.gpr.gpr_id for s in again.list_gprs([GprState.QUEUED])] == [b.gpr_id]
    with pytest.raises(GprNotFound):
        again.get("gpr-nope")


def test_stale_plan_is_rolled_back_entirely(tmp_path: Path) -> None:
    store = GprStore(tmp_path / "g.db")
    m = GprManager(store, CATALOG, clock=ManualClock(T0))
    g = m.create(SPEC)
    read = store.get(g.gpr_id)
    m.set_priority(g.gpr_id, 7)  # a user change lands between the manager's read and its write
    admitted = transition(read.gpr, Trigger.ADMIT, T0)
    with pytest.raises(StaleWrite):
        store.apply([(admitted, read.version)], [], [("launch", "rid", g.gpr_id, {})], now=T0)
    assert store.get(g.gpr_id).gpr.state is GprState.QUEUED and store.get(g.gpr_id).gpr.spec.priority == 7
    assert store.journal() == [] and store.events() == []


def test_two_connections_see_each_others_commits(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    api = GprManager(GprStore(db), CATALOG, clock=ManualClock(T0))
    loop = GprStore(db)
    g = api.create(SPEC)
    assert loop.get(g.gpr_id).gpr == g
    loop.modify(g.gpr_id, lambda x: transition(x, Trigger.CANCEL, T0), now=T0)
    assert api.get(g.gpr_id).state is GprState.CANCELLED


def test_a_killed_process_loses_no_committed_request(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {SRC!r})
        from gpuscale.core.gpr import new_gpr, spec_from_dict
        from gpuscale.core.model import Catalog
        from gpuscale.gpr.store import GprStore
        store = GprStore({str(db)!r})
        spec = spec_from_dict({{"requestName": "r", "gpuShape": "T4", "exitDuration": "1h"}})
        store.insert(new_gpr("gpr-killed", spec, Catalog("c", ()), 1.0))
        os._exit(9)  # no close, no checkpoint
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert proc.returncode == 9
    assert GprStore(db).get("gpr-killed").gpr.spec.request_name == "r"


def _manager(db: Path, sim: WallClockSimCloud, clock: ManualClock) -> GprManager:
    return GprManager(GprStore(db), CATALOG, provider=sim, clock=clock)


@pytest.mark.parametrize("point", ["launch:before", "launch:after"])
def test_crash_between_persisting_and_launching_neither_loses_nor_doubles(tmp_path: Path, point: str) -> None:
    db = tmp_path / "g.db"
    clock = ManualClock(T0)
    sim = WallClockSimCloud(CATALOG, clock, latency_s=5.0)
    m = _manager(db, sim, clock)
    g = m.create(SPEC)

    def crash(at: str) -> None:
        if at == point:
            raise Crash(at)

    sim.cloud.hook = crash
    with pytest.raises(Crash):
        m.reconcile()
    persisted = GprStore(db).get(g.gpr_id).gpr
    assert persisted.state is GprState.PROVISIONING  # the decision was written before acting
    assert [e.kind for e in GprStore(db).journal(pending_only=True)] == ["launch"]
    assert sim.cloud.counters.nodes_launched == (2 if point == "launch:after" else 0)
    # Restart: a new manager on the same database, the cloud unchanged.
    sim.cloud.hook = None
    m2 = _manager(db, sim, clock)
    assert m2.store.journal(pending_only=True) == []
    m2.reconcile()
    clock.sleep(11)
    m2.reconcile()
    assert sim.cloud.counters.nodes_launched == 2 and sim.cloud.counters.duplicate_nodes == 0
    done = m2.get(g.gpr_id)
    assert done.state is GprState.PROVISIONED and len(done.status.node_pool_details.node_ids) == 2


def test_crash_before_deleting_nodes_of_a_finished_gpr_is_cleaned_up_after_restart(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    clock = ManualClock(T0)
    sim = WallClockSimCloud(CATALOG, clock, latency_s=5.0)
    m = _manager(db, sim, clock)
    g = m.create(SPEC)
    m.reconcile()
    clock.sleep(11)
    m.reconcile()
    m.release(g.gpr_id)

    def crash(at: str) -> None:
        if at == "delete_node:before":
            raise Crash(at)

    sim.cloud.hook = crash
    with pytest.raises(Crash):
        m.reconcile()
    assert GprStore(db).get(g.gpr_id).gpr.state is GprState.RELEASED
    assert len(sim.cloud.alive()) == 2
    sim.cloud.hook = None
    m2 = _manager(db, sim, clock)
    r = m2.reconcile()
    assert len(r.deleted) == 2 and sim.cloud.counters.nodes_deleted == 2
    clock.sleep(6)
    assert m2.reconcile().deleted == []


def test_spec_survives_storage_unchanged(tmp_path: Path) -> None:
    store = GprStore(tmp_path / "g.db")
    m = GprManager(store, CATALOG, clock=ManualClock(T0))
    g = m.create({**SPEC, "memoryPerGpu": 20, "enableEviction": True, "requeueOnFailure": True})
    assert store.get(g.gpr_id).gpr == g
    assert g.spec == parse_gpr_spec({**SPEC, "memoryPerGpu": 20, "enableEviction": True, "requeueOnFailure": True},
                                    CATALOG)  # fmt: skip
