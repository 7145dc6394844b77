"""Predictive warm headroom (an option per pool, off by default): a small, bounded, priced number of warm GPU nodes
kept ready when the GPU demand expected to arrive soon exceeds the free room of the pool.

Pure decisions, in two steps:

1. :func:`forecast` -- GPU demand (milli-GPU) expected to arrive in the next ``lead_s``, from the arrivals the
   controller saw (``(time, milli-GPU)`` pairs, the caller keeps them). Two explainable estimates, the larger wins:

   * **time of day**: on each of the last ``days`` days, the demand that arrived in the same ``lead_s`` window of
     the day; their ``quantile`` (needs at least ``min_days`` days of history);
   * **recent**: the demand of each of the last ``recent_windows`` windows of ``lead_s``; their ``quantile``
     (bursts come in runs).

2. :func:`size_headroom` -- how many warm nodes of one offering cover the forecast demand that the pool's free room
   does not, capped by ``max_nodes`` and ``max_hourly_cost``; and, when ``wait_cost_per_gpu_hour`` is given, only
   if the cold starts they avoid (``cold_start_s`` of waiting per forecast GPU) cost more than the nodes over the
   lead window.

:func:`keep_warm` picks the empty nodes that already serve as headroom (cheapest per GPU first), so consolidation
leaves them alone while the forecast holds, and removes them (as any empty node) once it drops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuscale.core.resources import MILLI_PER_GPU

DAY_S = 86400.0
PREDICTIVE = "Predictive"
HEADROOM_KEYS = (
    "policy",
    "maxNodes",
    "maxHourlyCost",
    "lead",
    "quantile",
    "days",
    "minDays",
    "recentWindows",
    "instanceType",
    "waitCostPerGpuHour",
    "coldStart",
    "launch",
)
"""The keys of a ``headroom`` setting, as the policy file and a GPUNodePool's ``spec.headroom`` spell them (read by
:func:`gpuscale.controller.policyopts.headroom_spec`; the CRD's schema lists the same)."""
HEADROOM_REQUIRED = ("maxNodes", "maxHourlyCost")


@dataclass(frozen=True, slots=True)
class HeadroomSpec:
    """A pool's ``headroom`` setting (see the module docstring)."""

    max_nodes: int
    max_hourly_cost: float
    policy: str = PREDICTIVE
    lead_s: float = 600.0
    """The forecast window: demand expected to arrive within this long (about a cold start and a margin)."""
    quantile: float = 0.5
    days: int = 7
    min_days: int = 2
    recent_windows: int = 6
    instance_type: str | None = None
    """The warm nodes' instance type (None: the pool's cheapest offering per GPU)."""
    wait_cost_per_gpu_hour: float | None = None
    """What an hour of a GPU's worth of pending time costs the user (None: the caps alone bound the headroom)."""
    cold_start_s: float = 200.0
    launch: bool = True
    """False: only keep empty nodes warm, never launch one for headroom."""

    @property
    def history_s(self) -> float:
        """How far back arrivals are kept."""
        return max(self.days * DAY_S, self.recent_windows * self.lead_s) + self.lead_s


@dataclass(frozen=True, slots=True)
class Forecast:
    """Expected GPU demand (milli-GPU) in the next ``lead_s`` and how it was estimated."""

    milli: int
    seasonal: int
    recent: int
    days_seen: int

    def explain(self) -> str:
        """One line for events."""
        return (
            f"forecast {self.milli / MILLI_PER_GPU:.2f} GPU (time of day over {self.days_seen} day(s): "
            f"{self.seasonal / MILLI_PER_GPU:.2f}; recent: {self.recent / MILLI_PER_GPU:.2f})"
        )


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``values`` (nearest rank, 0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return s[k]


def window_sum(arrivals: Sequence[tuple[float, int]], start: float, end: float) -> int:
    """Milli-GPU of the arrivals in ``[start, end)`` (``arrivals`` sorted by time)."""
    import bisect

    lo = bisect.bisect_left(arrivals, (start, -1))
    hi = bisect.bisect_left(arrivals, (end, -1))
    return sum(m for _, m in arrivals[lo:hi])


def forecast(arrivals: Sequence[tuple[float, int]], first_seen: float, now: float, spec: HeadroomSpec) -> Forecast:
    """GPU demand expected in ``[now, now + lead_s)`` (see the module docstring). ``arrivals`` are sorted
    ``(time, milli-GPU)`` pairs; ``first_seen`` is when observation started (days before it are not counted)."""
    lead = spec.lead_s
    seasonal_days = [
        float(window_sum(arrivals, now - d * DAY_S, now - d * DAY_S + lead))
        for d in range(1, spec.days + 1)
        if now - d * DAY_S >= first_seen
    ]
    seasonal = int(quantile(seasonal_days, spec.quantile)) if len(seasonal_days) >= spec.min_days else 0
    recent_windows = [
        float(window_sum(arrivals, now - (k + 1) * lead, now - k * lead))
        for k in range(spec.recent_windows)
        if now - (k + 1) * lead >= first_seen
    ]
    recent = int(quantile(recent_windows, spec.quantile))
    return Forecast(max(seasonal, recent), seasonal, recent, len(seasonal_days))


@dataclass(frozen=True, slots=True)
class Sizing:
    """How many warm nodes of an offering to have, and why."""

    nodes: int
    reason: str


def headroom_cap(spec: HeadroomSpec, hourly_price: float) -> int:
    """Most warm nodes ``max_nodes`` and ``max_hourly_cost`` allow at ``hourly_price`` each."""
    by_cost = math.floor(spec.max_hourly_cost / hourly_price + 1e-9) if hourly_price > 0 else spec.max_nodes
    return max(0, min(spec.max_nodes, by_cost))


def size_headroom(fc: Forecast, free_milli: int, node_gpus: int, hourly_price: float, spec: HeadroomSpec) -> Sizing:
    """Warm nodes of ``node_gpus`` GPUs at ``hourly_price`` each to cover ``fc`` beyond ``free_milli`` of free room
    already in the pool (not counting warm nodes), within the caps and, when priced, only if they pay."""
    if node_gpus <= 0:
        return Sizing(0, "the warm offering has no GPUs")
    deficit = fc.milli - max(0, free_milli)
    if deficit <= 0:
        return Sizing(0, f"{fc.explain()} fits the pool's free room ({free_milli / MILLI_PER_GPU:.2f} GPU)")
    want = math.ceil(deficit / (node_gpus * MILLI_PER_GPU))
    cap = headroom_cap(spec, hourly_price)
    nodes = min(want, cap)
    why = f"{fc.explain()}, free {free_milli / MILLI_PER_GPU:.2f} GPU: {want} node(s) wanted, cap {cap}"
    if spec.wait_cost_per_gpu_hour is not None and nodes > 0:
        covered = min(deficit, nodes * node_gpus * MILLI_PER_GPU) / MILLI_PER_GPU
        saved = covered * spec.cold_start_s / 3600.0 * spec.wait_cost_per_gpu_hour
        spent = nodes * hourly_price * spec.lead_s / 3600.0
        if saved < spent:
            return Sizing(0, f"{why}; cold starts avoided ${saved:.2f} < headroom ${spent:.2f} per window")
        why += f"; cold starts avoided ${saved:.2f} >= headroom ${spent:.2f} per window"
    return Sizing(nodes, why)


def pick_offer(offers: Sequence[tuple[int, float]], max_hourly_cost: float) -> int | None:
    """Index of the warm nodes' offering among ``(GPUs, $/h)`` pairs: the cheapest per GPU among those one of which
    fits ``max_hourly_cost`` (then the cheaper, then the first); None if none does."""
    fitting = [i for i, (g, p) in enumerate(offers) if g > 0 and p <= max_hourly_cost + 1e-9]
    if not fitting:
        return None
    return min(fitting, key=lambda i: (offers[i][1] / offers[i][0], offers[i][1], i))


@dataclass(frozen=True, slots=True)
class WarmNode:
    """An empty node of the pool that may serve as headroom."""

    name: str
    gpus: int
    hourly_price: float


def keep_warm(empty: Sequence[WarmNode], fc: Forecast, free_milli: int, spec: HeadroomSpec) -> tuple[str, ...]:
    """The empty nodes to keep warm (cheapest per GPU first, then by name) so their GPUs cover the forecast beyond
    ``free_milli``, at most ``max_nodes`` of them and ``max_hourly_cost`` in all."""
    deficit = fc.milli - max(0, free_milli)
    out: list[str] = []
    cost = 0.0
    for n in sorted(empty, key=lambda n: (n.hourly_price / max(1, n.gpus), n.name)):
        if deficit <= 0 or len(out) >= spec.max_nodes:
            break
        if n.gpus <= 0 or cost + n.hourly_price > spec.max_hourly_cost + 1e-9:
            continue
        out.append(n.name)
        cost += n.hourly_price
        deficit -= n.gpus * MILLI_PER_GPU
    return tuple(out)
