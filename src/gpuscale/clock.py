"""Clocks. The core never reads time; adapters and the controller get a :class:`Clock` injected."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since an arbitrary epoch (the Unix epoch for :class:`SystemClock`)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock time."""

    def now(self) -> float:
        """Current Unix time."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds``."""
        time.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it. Used by tests and the simulator."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        """The current virtual time."""
        return self._now

    def sleep(self, seconds: float) -> None:
        """Advance virtual time by ``seconds``."""
        self._now += max(0.0, seconds)

    def advance_to(self, t: float) -> None:
        """Move to ``t`` (never backwards)."""
        self._now = max(self._now, t)
