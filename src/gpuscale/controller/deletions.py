"""The timers of the way out: when a node's deletion is retried or rechecked, since when a draining node's pods have
been evicted (its grace period), and since when a Node object has had no cloud node (an orphan, removed after a grace
period).

A small state object of the controller's round (it decides nothing: :func:`gpuscale.core.reconcile.drain_step` reads
the retry times, :func:`gpuscale.core.reconcile.orphan_step` returns the orphan clocks). Nothing here needs to survive
a restart: a new controller rechecks every deletion at once and starts the drain and orphan clocks again, which only
delays a removal by one grace period.
"""

from __future__ import annotations

from collections.abc import Mapping


class Deletions:
    """Delete retry times by claim key and orphan clocks by Node name (see the module docstring)."""

    def __init__(self, orphan_grace_s: float) -> None:
        self.orphan_grace_s = orphan_grace_s
        self.retry_at: dict[str, float] = {}
        """Claim key -> when its node's deletion is tried or checked again."""
        self.orphan_since: dict[str, float] = {}
        """Node name -> since when it has had no cloud node."""
        self.evicting_since: dict[str, float] = {}
        """Claim key -> when the backend first accepted an eviction from its draining node."""
        self.drain_deadline: dict[str, float] = {}
        """Claim key -> when its drain's grace period ends (a wake-up time; the drain step decides)."""

    def evicted(self, key: str, now: float, grace_s: float | None) -> None:
        """The backend accepted an eviction from the claim ``key``'s node; the first one starts its grace period."""
        if key not in self.evicting_since:
            self.evicting_since[key] = now
            if grace_s is not None:
                self.drain_deadline[key] = now + grace_s

    def retry(self, key: str, at: float) -> None:
        """Try or check the deletion of the claim ``key``'s node again at ``at``."""
        self.retry_at[key] = at

    def forget(self, key: str) -> None:
        """The claim finished: no deletion pending."""
        self.retry_at.pop(key, None)
        self.evicting_since.pop(key, None)
        self.drain_deadline.pop(key, None)

    def orphans(self, since: Mapping[str, float]) -> None:
        """The orphan clocks after a scan (empty: no orphan)."""
        self.orphan_since = dict(since) if since else {}

    def wake_times(self) -> list[float]:
        """When a deletion is due again, a drain's or an orphan's grace period ends."""
        times = [*self.retry_at.values(), *self.drain_deadline.values()]
        if self.orphan_since:
            grace = self.orphan_grace_s
            times += [t + grace for t in self.orphan_since.values()]
        return times
