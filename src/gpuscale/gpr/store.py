"""Durable GPR storage in SQLite (WAL mode, ``synchronous=FULL``).

Every change is one transaction, committed before anything acts on it (write-ahead): the manager persists a plan's
status updates and a journal entry for every provider effect it is about to cause, then acts, then marks the
journal entries done. After a crash the persisted GPRs hold everything needed to redo an effect idempotently
(launch request ids are deterministic per GPR and attempt), and the journal shows which effects were in doubt.

Concurrent writers (the API and the reconcile loop, possibly in different processes) are serialised by SQLite;
updates of a whole plan are compare-and-set on a per-GPR ``version`` so a plan computed from stale data is dropped
instead of overwriting a user's change.

Schema versioning: ``meta.schema_version``; :data:`MIGRATIONS` upgrades older files in place; a file written by a
newer gpuscale is refused with an :class:`InputError`.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscale.core.gpr import (
    Gpr,
    GprState,
    TransitionRecord,
    Trigger,
    spec_from_dict,
    spec_to_dict,
    status_from_record,
    status_to_record,
)
from gpuscale.errors import GpuscaleError, InputError, shorten

log = logging.getLogger("gpuscale.gpr.store")
_ID_RE = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}")

SCHEMA_VERSION = 1

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE IF NOT EXISTS gprs ("
        " gpr_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, created_at REAL NOT NULL, state TEXT NOT NULL,"
        " priority INTEGER NOT NULL, spec TEXT NOT NULL, status TEXT NOT NULL, version INTEGER NOT NULL,"
        " updated_at REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS gprs_state ON gprs(state)",
        "CREATE TABLE IF NOT EXISTS events ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, gpr_id TEXT NOT NULL, at REAL NOT NULL, from_state TEXT NOT NULL,"
        " to_state TEXT NOT NULL, trigger TEXT NOT NULL, reason TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS events_gpr ON events(gpr_id)",
        "CREATE TABLE IF NOT EXISTS journal ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, key TEXT NOT NULL, gpr_id TEXT NOT NULL,"
        " payload TEXT NOT NULL, created_at REAL NOT NULL, done_at REAL, outcome TEXT)",
        "CREATE INDEX IF NOT EXISTS journal_pending ON journal(done_at)",
    ),
}
"""Statements that bring a database from version ``n - 1`` to ``n``."""


class GprNotFound(GpuscaleError):
    """No GPR with this id."""


class CorruptGpr(GpuscaleError):
    """A stored GPR row cannot be decoded (written by a buggy or newer gpuscale, or edited by hand)."""

    def __init__(self, gpr_id: str, reason: str) -> None:
        self.gpr_id = gpr_id
        self.reason = reason
        super().__init__(f"stored GPR {gpr_id!r} cannot be decoded: {reason}")


class StaleWrite(GpuscaleError):
    """A GPR changed since it was read; the write was rolled back."""


@dataclass(frozen=True, slots=True)
class Stored:
    """A GPR and the version it was read at."""

    gpr: Gpr
    version: int


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One provider/node effect the manager decided on: ``kind`` (launch, delete, assign, unassign) and its key."""

    id: int
    kind: str
    key: str
    gpr_id: str
    payload: dict[str, Any]
    created_at: float
    done_at: float | None
    outcome: str | None


def new_gpr_id() -> str:
    """A fresh GPR id: ``gpr-`` and 12 hex digits (a valid Kubernetes label value)."""
    return f"gpr-{uuid.uuid4().hex[:12]}"


class GprStore:
    """GPRs, their transition events and the action journal in one SQLite file (or ``:memory:``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the GPR database: {exc}", where=self.path) from exc
        self._db.row_factory = sqlite3.Row
        self.journal_mode = str(self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._migrate()

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------------------------------------ schema
    def _migrate(self) -> None:
        with self._tx():
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise InputError(
                    f"database schema version {version} is newer than this gpuscale supports ({SCHEMA_VERSION})",
                    where=self.path,
                    fix="upgrade gpuscale or use another --db file",
                )
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for stmt in MIGRATIONS[v]:
                    self._db.execute(stmt)
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES('schema_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(SCHEMA_VERSION),),
            )

    def schema_version(self) -> int:
        """The database's schema version."""
        with self._lock:
            return int(self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    class _Tx:
        def __init__(self, store: GprStore) -> None:
            self.store = store

        def __enter__(self) -> sqlite3.Connection:
            self.store._lock.acquire()
            self.store._db.execute("BEGIN IMMEDIATE")
            return self.store._db

        def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
            try:
                self.store._db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.store._lock.release()

    def _tx(self) -> GprStore._Tx:
        return GprStore._Tx(self)

    # ------------------------------------------------------------------------------------------------ rows
    @staticmethod
    def _row_to_stored(row: sqlite3.Row) -> Stored:
        """Decode a row; any failure becomes :class:`CorruptGpr` naming the row."""
        gpr_id = str(row["gpr_id"])[:80]
        try:
            spec = spec_from_dict(json.loads(row["spec"]))
            status = status_from_record(json.loads(row["status"]))
            return Stored(Gpr(row["gpr_id"], spec, status, float(row["created_at"])), int(row["version"]))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, GpuscaleError) as exc:
            raise CorruptGpr(gpr_id, shorten(f"{type(exc).__name__}: {exc}", 300)) from None

    @staticmethod
    def _columns(gpr: Gpr) -> tuple[str, int, str, str]:
        return (
            gpr.state.value,
            gpr.spec.priority,
            json.dumps(spec_to_dict(gpr.spec), sort_keys=True),
            json.dumps(status_to_record(gpr.status), sort_keys=True),
        )

    # ------------------------------------------------------------------------------------------------ reads
    def get(self, gpr_id: str) -> Stored:
        """The GPR ``gpr_id``; raises :class:`GprNotFound`."""
        with self._lock:
            row = self._db.execute("SELECT * FROM gprs WHERE gpr_id=?", (gpr_id,)).fetchone()
        if row is None:
            raise GprNotFound(f"no GPR with gprId {gpr_id!r}")
        return self._row_to_stored(row)

    def list_gprs(self, states: Iterable[GprState] | None = None) -> list[Stored]:
        """GPRs in creation order, optionally only those in ``states``; rows that fail to decode are logged and
        skipped (:meth:`list_checked` reports them)."""
        good, bad = self.list_checked(states)
        for err in bad:
            log.error("%s", err)
        return good

    def list_checked(self, states: Iterable[GprState] | None = None) -> tuple[list[Stored], list[CorruptGpr]]:
        """GPRs in creation order (optionally only those in ``states``) and the rows that failed to decode."""
        with self._lock:
            if states is None:
                rows = self._db.execute("SELECT * FROM gprs ORDER BY seq").fetchall()
            else:
                names = [s.value for s in states]
                marks = ",".join("?" * len(names))
                rows = self._db.execute(f"SELECT * FROM gprs WHERE state IN ({marks}) ORDER BY seq", names).fetchall()
        good: list[Stored] = []
        bad: list[CorruptGpr] = []
        for r in rows:
            try:
                good.append(self._row_to_stored(r))
            except CorruptGpr as exc:
                bad.append(exc)
        return good, bad

    def events(self, gpr_id: str | None = None) -> list[TransitionRecord]:
        """Recorded transitions, oldest first."""
        with self._lock:
            q = "SELECT * FROM events" + (" WHERE gpr_id=?" if gpr_id else "") + " ORDER BY id"
            rows = self._db.execute(q, (gpr_id,) if gpr_id else ()).fetchall()
        return [
            TransitionRecord(
                r["gpr_id"], GprState(r["from_state"]), GprState(r["to_state"]), Trigger(r["trigger"]), r["reason"]
            )
            for r in rows
        ]

    def journal(self, *, pending_only: bool = False) -> list[JournalEntry]:
        """Journal entries, oldest first; ``pending_only`` keeps those not marked done (in doubt after a crash)."""
        with self._lock:
            q = "SELECT * FROM journal" + (" WHERE done_at IS NULL" if pending_only else "") + " ORDER BY id"
            rows = self._db.execute(q).fetchall()
        return [
            JournalEntry(
                r["id"],
                r["kind"],
                r["key"],
                r["gpr_id"],
                json.loads(r["payload"]),
                r["created_at"],
                r["done_at"],
                r["outcome"],
            )
            for r in rows
        ]

    # ------------------------------------------------------------------------------------------------ writes
    def insert(self, gpr: Gpr) -> Stored:
        """Persist a new GPR (version 1) in one transaction, after checking that the row decodes back to it
        (a GPR that could not be read back is refused with :class:`InputError` and nothing is written)."""
        state, prio, spec, status = self._columns(gpr)
        try:
            back = spec_from_dict(json.loads(spec))
        except GpuscaleError as exc:
            raise InputError(f"GPR cannot be stored: {exc}", where="spec") from None
        if back != gpr.spec or not _ID_RE.fullmatch(gpr.gpr_id):
            raise InputError("GPR cannot be stored: it does not read back unchanged", where="spec")
        with self._tx() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM gprs").fetchone()[0]
            db.execute(
                "INSERT INTO gprs(gpr_id, seq, created_at, state, priority, spec, status, version, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
                (gpr.gpr_id, seq, gpr.created_at, state, prio, spec, status, gpr.created_at),
            )
        return Stored(gpr, 1)

    def modify(
        self, gpr_id: str, fn: Callable[[Gpr], Gpr], *, now: float, transitions: Sequence[TransitionRecord] = ()
    ) -> Stored:
        """Atomically read GPR ``gpr_id``, apply ``fn`` and write the result (exceptions from ``fn`` roll back)."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM gprs WHERE gpr_id=?", (gpr_id,)).fetchone()
            if row is None:
                raise GprNotFound(f"no GPR with gprId {gpr_id!r}")
            cur = self._row_to_stored(row)
            new = fn(cur.gpr)
            if new == cur.gpr:
                return cur
            self._write(db, new, cur.version, now)
            before = cur.gpr.state
            for t in transitions:
                self._event(db, t, now)
            if new.state is not before and not transitions and new.status.last_trigger:
                trig = Trigger(new.status.last_trigger)
                self._event(db, TransitionRecord(gpr_id, before, new.state, trig, new.status.failure_reason), now)
            return Stored(new, cur.version + 1)

    def apply(
        self,
        updates: Sequence[tuple[Gpr, int]],
        transitions: Sequence[TransitionRecord],
        journal: Sequence[tuple[str, str, str, dict[str, Any]]],
        *,
        now: float,
    ) -> list[int]:
        """Write a plan in one transaction: GPR updates (each compare-and-set on the version it was read at),
        transition events and journal entries ``(kind, key, gpr_id, payload)``. Returns the journal ids.

        Raises :class:`StaleWrite` (and writes nothing) when any GPR changed since it was read.
        """
        ids: list[int] = []
        with self._tx() as db:
            for gpr, version in updates:
                self._write(db, gpr, version, now)
            for t in transitions:
                self._event(db, t, now)
            for kind, key, gpr_id, payload in journal:
                cur = db.execute(
                    "INSERT INTO journal(kind, key, gpr_id, payload, created_at) VALUES (?, ?, ?, ?, ?)",
                    (kind, key, gpr_id, json.dumps(payload, sort_keys=True), now),
                )
                ids.append(int(cur.lastrowid or 0))
        return ids

    def finish(self, journal_id: int, outcome: str, *, now: float) -> None:
        """Mark a journal entry done with its outcome (``ok`` or an error message)."""
        with self._tx() as db:
            db.execute("UPDATE journal SET done_at=?, outcome=? WHERE id=?", (now, outcome, journal_id))

    def _write(self, db: sqlite3.Connection, gpr: Gpr, version: int, now: float) -> None:
        state, prio, spec, status = self._columns(gpr)
        cur = db.execute(
            "UPDATE gprs SET state=?, priority=?, spec=?, status=?, version=version+1, updated_at=?"
            " WHERE gpr_id=? AND version=?",
            (state, prio, spec, status, now, gpr.gpr_id, version),
        )
        if cur.rowcount != 1:
            raise StaleWrite(f"GPR {gpr.gpr_id} changed since version {version}")

    @staticmethod
    def _event(db: sqlite3.Connection, t: TransitionRecord, now: float) -> None:
        db.execute(
            "INSERT INTO events(gpr_id, at, from_state, to_state, trigger, reason) VALUES (?, ?, ?, ?, ?, ?)",
            (t.gpr_id, now, t.from_state.value, t.to_state.value, t.trigger.value, t.reason),
        )
