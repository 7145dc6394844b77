"""Offering availability and back-offs: the one record every launcher reads, kept across restarts.

:class:`Availability` holds three kinds of marks, each with an expiry time:

- **offering** marks (instance type x zone x capacity type): not to be bought until then (insufficient capacity, a
  node that never registered, a spot interruption, GPUs that never appeared);
- **pool back-offs**: no launches in the pool until then, with the count of consecutive failures that set the
  delay (quota errors double it up to a maximum; a rate limit waits its ``Retry-After``);
- **spot fallbacks**: a spot-only pool that may buy on-demand until then;
- **launch retries** (the GPR manager's): a launch request id not to be tried again until then, with its failed
  attempts so far (per the last error's retry policy). They are not wake-up times of the node controller.

Every change is written through to an :class:`AvailabilityStore`, and a new :class:`Availability` starts from what
its store holds, so a restarted controller neither retries an offering it just found empty nor forgets a back-off.
:class:`MemoryStore` keeps nothing across processes (tests, the simulator); :class:`SqliteStore` is the embedded
mode's store; in a cluster the store is the ``OfferingAvailability`` objects (``deploy/crds/``).
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from gpuscale.core.model import CapacityType, OfferingKey
from gpuscale.core.reconcile.launching import capped_backoff_s


class MarkKind(StrEnum):
    """What a mark is about."""

    OFFERING = "offering"
    BACKOFF = "backoff"
    FALLBACK = "fallback"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class Mark:
    """One stored mark. ``key`` is the pool name, or ``type/zone/capacity-type`` for an offering."""

    kind: MarkKind
    key: str
    until: float
    failures: int = 0
    reason: str = ""


def offering_key_text(key: OfferingKey) -> str:
    """The stored form of an offering key."""
    return f"{key.instance_type}/{key.zone}/{key.capacity_type}"


def parse_offering_key(text: str) -> OfferingKey:
    """Inverse of :func:`offering_key_text` (instance types and zones contain no ``/``)."""
    it, zone, ct = text.rsplit("/", 2)
    return OfferingKey(it, zone, CapacityType(ct))


class AvailabilityStore(Protocol):
    """Where marks persist. ``put`` replaces the mark of the same kind and key."""

    def load(self) -> list[Mark]:
        """Every stored mark."""
        ...

    def put(self, mark: Mark) -> None:
        """Store ``mark``."""
        ...

    def drop(self, kind: MarkKind, key: str) -> None:
        """Remove a mark (no error when absent)."""
        ...


class MemoryStore:
    """An :class:`AvailabilityStore` in memory (survives a new :class:`Availability`, not a new process)."""

    def __init__(self, marks: Iterable[Mark] = ()) -> None:
        self._marks: dict[tuple[MarkKind, str], Mark] = {(m.kind, m.key): m for m in marks}

    def load(self) -> list[Mark]:
        """Every stored mark."""
        return list(self._marks.values())

    def put(self, mark: Mark) -> None:
        """Store ``mark``."""
        self._marks[mark.kind, mark.key] = mark

    def drop(self, kind: MarkKind, key: str) -> None:
        """Remove a mark."""
        self._marks.pop((kind, key), None)


class SqliteStore:
    """An :class:`AvailabilityStore` in a SQLite file (embedded mode). Each change is one committed statement; the
    table ``availability`` may share a file with other tables (the GPR store's)."""

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS availability ("
            " kind TEXT NOT NULL, key TEXT NOT NULL, until REAL NOT NULL, failures INTEGER NOT NULL DEFAULT 0,"
            " reason TEXT NOT NULL DEFAULT '', PRIMARY KEY (kind, key))"
        )

    def load(self) -> list[Mark]:
        """Every stored mark."""
        with self._lock:
            rows = self._db.execute("SELECT kind, key, until, failures, reason FROM availability").fetchall()
        return [Mark(MarkKind(k), key, float(u), int(f), str(r)) for k, key, u, f, r in rows]

    def put(self, mark: Mark) -> None:
        """Store ``mark``."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO availability (kind, key, until, failures, reason) VALUES (?, ?, ?, ?, ?)",
                (str(mark.kind), mark.key, mark.until, mark.failures, mark.reason),
            )

    def drop(self, kind: MarkKind, key: str) -> None:
        """Remove a mark."""
        with self._lock:
            self._db.execute("DELETE FROM availability WHERE kind = ? AND key = ?", (str(kind), key))

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


@dataclass(frozen=True, slots=True)
class Backoff:
    """A pool's back-off: no launches until ``until``; ``failures`` consecutive failures set it."""

    until: float
    failures: int


class Availability:
    """Offering marks, pool back-offs and spot fallbacks (see the module docstring), written through to ``store``.

    ``offerings`` is a read-only view the planner and consolidation read directly (expired marks stay until
    :meth:`expire`; readers compare with ``now``).
    """

    def __init__(self, store: AvailabilityStore | None = None) -> None:
        self.store: AvailabilityStore = store if store is not None else MemoryStore()
        self._offerings: dict[OfferingKey, float] = {}
        self._backoffs: dict[str, Backoff] = {}
        self._fallbacks: dict[str, float] = {}
        self._retries: dict[str, Backoff] = {}
        for m in self.store.load():
            if m.kind is MarkKind.OFFERING:
                self._offerings[parse_offering_key(m.key)] = m.until
            elif m.kind is MarkKind.BACKOFF:
                self._backoffs[m.key] = Backoff(m.until, m.failures)
            elif m.kind is MarkKind.RETRY:
                self._retries[m.key] = Backoff(m.until, m.failures)
            else:
                self._fallbacks[m.key] = m.until

    # ------------------------------------------------------------------------------------------------ offerings
    @property
    def offerings(self) -> Mapping[OfferingKey, float]:
        """Offering -> unavailable until."""
        return self._offerings

    def unavailable_at(self, now: float) -> dict[OfferingKey, float]:
        """The offerings still unavailable at ``now``."""
        return {k: t for k, t in self._offerings.items() if t > now}

    def mark_unavailable(self, key: OfferingKey, until: float, reason: str = "") -> bool:
        """Make ``key`` unavailable until ``until``; False (and nothing changes) if it already is until then."""
        if self._offerings.get(key, -math.inf) >= until:
            return False
        self._offerings[key] = until
        self.store.put(Mark(MarkKind.OFFERING, offering_key_text(key), until, 0, reason))
        return True

    # ------------------------------------------------------------------------------------------------ back-offs
    @property
    def backoffs(self) -> Mapping[str, Backoff]:
        """Pool -> back-off."""
        return self._backoffs

    def backed_off(self, pool: str, now: float) -> bool:
        """True while ``pool`` may not launch."""
        b = self._backoffs.get(pool)
        return b is not None and b.until > now

    def back_off(
        self, pool: str, now: float, base_s: float, max_s: float, *, exponential: bool = True, reason: str = ""
    ) -> float:
        """Back ``pool`` off after one more consecutive failure; return the delay (``base_s`` doubled per earlier
        failure when ``exponential``, capped at ``max_s``)."""
        prev = self._backoffs.get(pool)
        failures = (prev.failures + 1) if prev is not None else 1
        delay = capped_backoff_s(failures, base_s, max_s) if exponential else min(max_s, base_s)
        self._backoffs[pool] = Backoff(now + delay, failures)
        self.store.put(Mark(MarkKind.BACKOFF, pool, now + delay, failures, reason))
        return delay

    def clear_backoff(self, pool: str) -> None:
        """A launch in ``pool`` succeeded: the failure count starts again."""
        if self._backoffs.pop(pool, None) is not None:
            self.store.drop(MarkKind.BACKOFF, pool)

    # ------------------------------------------------------------------------------------------------ fallbacks
    @property
    def fallbacks(self) -> Mapping[str, float]:
        """Pool -> on-demand allowed until."""
        return self._fallbacks

    def fallback_active(self, pool: str, now: float) -> bool:
        """True while the spot-only ``pool`` may buy on-demand."""
        return self._fallbacks.get(pool, -math.inf) > now

    def allow_fallback(self, pool: str, until: float, reason: str = "") -> None:
        """Let ``pool`` buy on-demand until ``until``."""
        self._fallbacks[pool] = until
        self.store.put(Mark(MarkKind.FALLBACK, pool, until, 0, reason))

    # ------------------------------------------------------------------------------------------------ retries
    def retry(self, request_id: str) -> Backoff | None:
        """When the launch ``request_id`` may be tried again and its failed attempts so far (None: no retry
        pending)."""
        return self._retries.get(request_id)

    def set_retry(self, request_id: str, until: float, attempts: int, reason: str = "") -> None:
        """Try the launch ``request_id`` again at ``until``, after ``attempts`` failed attempts."""
        self._retries[request_id] = Backoff(until, attempts)
        self.store.put(Mark(MarkKind.RETRY, request_id, until, attempts, reason))

    def clear_retry(self, request_id: str) -> None:
        """The launch succeeded or was given up: no retry pending."""
        if self._retries.pop(request_id, None) is not None:
            self.store.drop(MarkKind.RETRY, request_id)

    # ------------------------------------------------------------------------------------------------ upkeep
    def expiries(self) -> list[float]:
        """Every expiry time held (wake-up candidates)."""
        times = list(self._offerings.values())
        if self._backoffs:  # (asked every round while pods are pending: no generator for empty maps)
            times += [b.until for b in self._backoffs.values()]
        if self._fallbacks:
            times += self._fallbacks.values()
        return times

    def expire(self, now: float) -> int:
        """Forget marks that ended before ``now`` (in memory and in the store); return how many. A back-off is
        kept: its failure count matters until a launch succeeds."""
        gone = [k for k, t in self._offerings.items() if t <= now]
        for k in gone:
            del self._offerings[k]
            self.store.drop(MarkKind.OFFERING, offering_key_text(k))
        old = [p for p, t in self._fallbacks.items() if t <= now]
        for p in old:
            del self._fallbacks[p]
            self.store.drop(MarkKind.FALLBACK, p)
        return len(gone) + len(old)
