"""Lower bounds on what serving a workload must cost.

For one pod ``p`` and one resource dimension ``d`` (CPU, memory, GPU), any node that hosts ``p`` spends at least
``price × share_d(p)`` per hour on it, where ``share_d`` is the pod's request over the node's allocatable on ``d``.
Pods sharing a node cannot share more than the node on any single dimension, so at every instant the nodes running a
set of pods ``A`` cost at least ``max_d Σ_{p∈A} min_o price_o × share_d(p, o)`` per hour, the minimum taken over the
options ``o`` the pod may run on. Integrating that over time gives the offline lower bound: no policy, however
clairvoyant, serves the pods at the times they ask for for less.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuscale.core.model import Pod, Snapshot
from gpuscale.core.planner import Option, build_options, solo_count
from gpuscale.core.predicates import static_failure
from gpuscale.core.resources import MILLI_PER_GPU

DIMENSIONS = ("cpu", "memory", "gpu")


@dataclass(frozen=True, slots=True)
class Interval:
    """A pod running from ``start`` to ``end`` (seconds)."""

    pod: Pod
    start: float
    end: float


def pod_rate_bounds(pod: Pod, options: Sequence[Option]) -> tuple[float, float, float] | None:
    """Per-dimension minimum $/h the pod forces on any node it can run on; None if no option can host it."""
    best = [float("inf")] * 3
    r = pod.request
    for o in options:
        if o.unavailable_until is not None or not solo_count(o, r, 1):
            continue
        if static_failure(pod, o.labels, o.taints) is not None:
            continue
        a = o.alloc
        shares = (
            r.cpu_milli / a.cpu_milli if a.cpu_milli else 0.0,
            r.memory_mib / a.memory_mib if a.memory_mib else 0.0,
            r.gpu_demand_milli / (a.gpus * MILLI_PER_GPU) if a.gpus else 0.0,
        )
        best = [min(b, o.price * s) for b, s in zip(best, shares, strict=True)]
    return None if best[0] == float("inf") else (best[0], best[1], best[2])


def cost_lower_bound(intervals: Iterable[Interval], snapshot: Snapshot, now: float = 0.0) -> float:
    """Offline lower bound (USD) on serving every interval with nodes of ``snapshot``'s pools and catalog.

    Pods no option can host are left out (no policy can serve them either).
    """
    options = build_options(snapshot, now)
    cache: dict[tuple[object, ...], tuple[float, float, float] | None] = {}
    events: list[tuple[float, int, tuple[float, float, float]]] = []
    for iv in intervals:
        if iv.end <= iv.start:
            continue
        key = (iv.pod.request, tuple(sorted(iv.pod.node_selector.items())), iv.pod.affinity, iv.pod.tolerations)
        if key not in cache:
            cache[key] = pod_rate_bounds(iv.pod, options)
        rates = cache[key]
        if rates is None:
            continue
        events.append((iv.start, 1, rates))
        events.append((iv.end, -1, rates))
    events.sort(key=lambda e: (e[0], e[1]))
    total = 0.0
    level = [0.0, 0.0, 0.0]
    last = events[0][0] if events else 0.0
    for t, sign, rates in events:
        if t > last:
            total += max(level) * (t - last) / 3600.0
            last = t
        level = [x + sign * y for x, y in zip(level, rates, strict=True)]
    return total
