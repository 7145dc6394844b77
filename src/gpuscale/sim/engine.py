"""A discrete-event engine on a virtual clock.

Events live in a heap of ``(time, seq, timer)``; ``seq`` is a global counter, so events due at the same instant run
in the order they were scheduled and every run with the same seed is identical. Time jumps from one event to the
next: an idle month costs nothing.

Randomness comes from :func:`stream`, which derives an independent, reproducible ``random.Random`` per named stream
from the scenario seed, so that turning on (say) API faults does not change the workload's arrivals.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any

from gpuscale.errors import InputError


class SimClock:
    """The virtual clock (implements :class:`gpuscale.clock.Clock`). Only the engine moves it forward.

    ``sleep`` advances it too, so a controller that sleeps inside a reconcile does not hang a simulation; events due
    in between then run late (at the new time), which the engine tolerates.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        """Current virtual time in seconds."""
        return self._now

    def sleep(self, seconds: float) -> None:
        """Advance virtual time by ``seconds``."""
        self._now += max(0.0, seconds)

    def advance_to(self, t: float) -> None:
        """Move to ``t`` (never backwards)."""
        if t > self._now:
            self._now = t


class Timer:
    """A scheduled callback; :meth:`cancel` makes it a no-op (lazy deletion from the heap)."""

    __slots__ = ("args", "cancelled", "fn", "time")

    def __init__(self, time: float, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.time = time
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run this event."""
        self.cancelled = True


class Engine:
    """Runs callbacks in virtual-time order. ``clock`` is the :class:`SimClock` to hand to everything else."""

    def __init__(self, start: float = 0.0) -> None:
        self.clock = SimClock(start)
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = 0
        self.processed = 0

    def now(self) -> float:
        """Current virtual time."""
        return self.clock.now()

    def at(self, t: float, fn: Callable[..., object], *args: Any) -> Timer:
        """Run ``fn(*args)`` at absolute time ``t`` (not before now)."""
        return self._push(t, fn, args)

    def after(self, delay: float, fn: Callable[..., object], *args: Any) -> Timer:
        """Run ``fn(*args)`` ``delay`` seconds from now."""
        return self._push(self.clock._now + (delay if delay > 0.0 else 0.0), fn, args)

    def _push(self, t: float, fn: Callable[..., object], args: tuple[Any, ...]) -> Timer:
        if t != t:
            raise ValueError("event time is NaN")
        now = self.clock._now
        timer = Timer(t if t >= now else now, fn, args)
        self._seq = seq = self._seq + 1
        heappush(self._heap, (timer.time, seq, timer))
        return timer

    def peek(self) -> float | None:
        """Time of the next live event, or None if there is none."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heappop(heap)
        return heap[0][0] if heap else None

    def pending(self) -> int:
        """Number of queued events (cancelled ones included until they surface)."""
        return len(self._heap)

    def run_until(self, t: float, *, inclusive: bool = True) -> int:
        """Run every event due before ``t`` (or at ``t`` when ``inclusive``), then move the clock to ``t``.

        Returns the number of events run.
        """
        n = 0
        heap = self._heap
        clock = self.clock
        while heap:
            due, _, timer = heap[0]
            if due > t or (due == t and not inclusive):
                break
            heappop(heap)
            if timer.cancelled:
                continue
            if due > clock._now:  # SimClock.advance_to, inline (once per event)
                clock._now = due
            timer.fn(*timer.args)
            n += 1
        if t > clock._now:  # SimClock.advance_to, inline
            clock._now = t
        self.processed += n
        return n

    def run_next_instant(self) -> float | None:
        """Run every event due at the earliest pending instant; returns that instant, or None if idle."""
        t = self.peek()
        if t is None:
            return None
        self.run_until(t)
        return t


def stream(seed: int, name: str) -> random.Random:
    """An independent, reproducible random stream for component ``name`` of a run seeded with ``seed``."""
    return random.Random(f"gpuscale-sim:{seed}:{name}")


@dataclass(frozen=True, slots=True)
class Dist:
    """A non-negative random duration (seconds).

    ``kind`` is ``constant`` (``a``), ``uniform`` (``a``..``b``), ``normal`` (mean ``a``, stddev ``b``),
    ``lognormal`` (median ``a``, log-space sigma ``b``) or ``exponential`` (mean ``a``). Samples are clipped at 0.
    """

    kind: str = "constant"
    a: float = 0.0
    b: float = 0.0

    KINDS = ("constant", "uniform", "normal", "lognormal", "exponential")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise InputError("unknown distribution", value=self.kind, fix=f"use one of {', '.join(self.KINDS)}")
        if self.a < 0 or self.b < 0:
            raise InputError("distribution parameters must not be negative", value=(self.a, self.b))
        if self.kind == "uniform" and self.b < self.a:
            raise InputError("uniform distribution needs min <= max", value=(self.a, self.b))

    @staticmethod
    def const(v: float) -> Dist:
        """Always ``v``."""
        return Dist("constant", v)

    def sample(self, rng: random.Random) -> float:
        """One draw."""
        k = self.kind
        if k == "constant":
            return self.a
        if k == "uniform":
            return rng.uniform(self.a, self.b)
        if k == "normal":
            return max(0.0, rng.gauss(self.a, self.b))
        if k == "lognormal":
            return self.a * math.exp(rng.gauss(0.0, self.b)) if self.a > 0 else 0.0
        return rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0

    @property
    def mean(self) -> float:
        """Expected value (before clipping)."""
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b * self.b / 2)
        return self.a
