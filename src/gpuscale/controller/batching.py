"""The batch window of pending pods: planning waits until new pending pods stop arriving for a moment.

A pod not pending at the previous look opens a batch (or extends the open one). The batch closes ``idle_s`` after
the last new pending pod, or ``max_s`` after it opened, whichever comes first; until then the scale-up does not plan
(unless something forces it). :class:`PendingBatch` owns that window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


class PendingBatch:
    """The open batch of pending pods, if any (see the module docstring)."""

    def __init__(self, idle_s: float, max_s: float) -> None:
        self.idle_s = idle_s
        self.max_s = max_s
        self.start: float | None = None
        """When the open batch opened (None: no batch is open)."""
        self.last = -math.inf
        """When a new pending pod last arrived."""
        self.seen: set[str] = set()
        """The pending pods at the last look."""

    def update(self, pending: Iterable[str], now: float) -> bool:
        """Look at the pending pods (keys) at ``now``; True if no batch is open or it has closed (planning may run)."""
        keys = set(pending)
        if keys - self.seen:
            if self.start is None:
                self.start = now
            self.last = now
        self.seen = keys
        if self.start is None:
            return True
        return now - self.last >= self.idle_s or now - self.start >= self.max_s

    def close(self) -> None:
        """The batch was planned (or emptied): the next new pending pod opens a new one."""
        self.start = None

    def wake_time(self) -> float | None:
        """When the open batch closes, or None."""
        if self.start is None:
            return None
        return min(self.last + self.idle_s, self.start + self.max_s)
