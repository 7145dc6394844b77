"""Per-node empty wait (an option, off by default): how long an empty node is kept before consolidation deletes it,
from the node's price and the rate of arriving pods that would fit it -- a ski-rental rule.

Keeping an empty node costs its price per hour. A pod that arrives while it is kept lands on it at once instead of
waiting for a new node: that saves a cold start (``cold_start_s`` of a new node's price, here the pod's share of this
node's price, plus ``cold_start_s`` of waiting valued at ``wait_cost_per_gpu_hour`` per GPU). :func:`empty_wait`
estimates the saving per hour of keeping the node from the pods that fitted it and arrived in the last ``window_s``
(and, with ``days``, in the coming ``window_s`` of each of the last ``days`` days: the time-of-day forecast, their
mean), and keeps the node for ``max_wait_s`` when that saving pays its price, else lets it go after the pool's own
empty wait. Expensive shapes that few arriving pods fit go at once; cheap shapes many pods fit are kept warm.
Empty nodes of one shape share its arrivals (``share_arrivals``): the k-th cheapest is kept only if the saving
pays k times its price.

With ``learn`` the rule also learns from what keeping did (:class:`Outcomes`, per pool and instance type): how many
kept empty nodes a pod landed on, over how many hours of keeping. The arrivals say how many pods could land; the
outcomes say how many did. The rate a kept node is landed on is the mean of a Gamma posterior
(:func:`landing_rate`): the arrival rate (divided by the node's rank) as a prior worth ``LEARN_PRIOR_LANDINGS``
landings, updated by the landings seen and the hours kept; the saving is that rate times the mean saving of a fitting
arrival. Shapes whose kept nodes wait long for a pod are then kept less; with no outcome yet the rule is as without.
The decision then changes with time alone when an arrival leaves the window (``EmptyWait.until``), and when the
caller moves on to newer outcomes.

With ``learn_released`` the rule keeps nothing on the arrivals' say-so: it learns from evidence only, and also from
the empty nodes it lets go. A released node opens a would-be episode (:class:`Released`); a pod that had to wait for
a new node (a *needy* arrival: still pending ``NEEDY_S`` after it was first seen) and fits the episode's shape closes
it as a landing after the time between (:func:`settle_released`, oldest episode first, one per pod), and an episode
no such pod came for within ``max_wait_s`` closes without one. The landing rate is then the landings over the hours
kept, real and would-be, plus ``EVIDENCE_PRIOR_H`` hours of nothing landed (:func:`evidence_rate`). Where pods find
room on running nodes, or a kept node waits long for the next pod that needs one, nothing is kept.

Pure: arrivals are ``(time, Pod)`` pairs the caller records; the node is described by :class:`Shape`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuscale.core.model import Pod, Taint
from gpuscale.core.predicates import static_failure
from gpuscale.core.resources import MILLI_PER_GPU, Resources

DAY_S = 86400.0
LEARN_PRIOR_LANDINGS = 2.0
"""How many landings the arrival rate counts for in :func:`landing_rate` (a weak prior: a few hours of keeping
outweigh it)."""
LEARN_MEMORY_S = DAY_S
"""Outcomes fade with this time constant (:meth:`Outcomes.decayed`): the rule follows a workload that changes."""
EVIDENCE_PRIOR_H = 0.5
"""With ``learn_released``: the landing rate starts from this many hours kept with nothing landed (no keeping
without evidence)."""
NEEDY_S = 30.0
"""With ``learn_released``: a pod still pending this long after it was first seen had no room (it waits for a node)."""


@dataclass(frozen=True, slots=True)
class EmptyWaitSpec:
    """The ``emptyWait`` setting (see the module docstring; times in seconds)."""

    max_wait_s: float = 1800.0
    """How long a node worth keeping is kept empty (the consolidation wait of such a node)."""
    window_s: float = 3600.0
    """Arrivals of this long back (and of the coming window on past days) give the saving rate."""
    cold_start_s: float = 200.0
    """What one pod landing on the kept node saves: this long of a new node (launch to GPUs ready) and of waiting."""
    wait_cost_per_gpu_hour: float = 0.0
    """What an hour of a GPU's worth of pending time costs the user (0: only the new node's boot time counts)."""
    days: int = 0
    """Time-of-day forecast over this many past days (0: recent arrivals only)."""
    margin: float = 1.0
    """Keep when the saving per hour is at least ``margin`` times the node's price."""
    share_arrivals: bool = True
    """Empty nodes of one shape share its arrivals: the k-th cheapest is kept only if they pay k times its price
    (the pods reach it only after the k - 1 before it are taken)."""
    learn: bool = False
    """Learn the rate pods land on kept nodes from the outcomes of keeping (:func:`landing_rate`)."""
    learn_released: bool = False
    """Learn from evidence only, the released empty nodes' would-be episodes included (:func:`settle_released`,
    :func:`evidence_rate`); implies ``learn``."""

    @property
    def learns(self) -> bool:
        """True if outcomes are recorded (``learn`` or ``learn_released``)."""
        return self.learn or self.learn_released

    @property
    def history_s(self) -> float:
        """How far back arrivals are needed."""
        return self.days * DAY_S + self.window_s


@dataclass(frozen=True, slots=True)
class Shape:
    """An empty node as the rule sees it: what a pod must fit and what the node costs."""

    allocatable: Resources
    hourly_price: float
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_model: str | None = None


@dataclass(frozen=True, slots=True)
class EmptyWait:
    """The decision for one empty node."""

    wait_s: float | None
    """How long to keep the node empty (None: the pool's own wait)."""
    saving_per_hour: float
    """Expected saving of keeping it, $/h."""
    until: float
    """When the decision would change with time alone (no new arrival): a time to look again (inf: never)."""
    reason: str


@dataclass(frozen=True, slots=True)
class Outcomes:
    """What keeping empty nodes of one shape did: hours kept empty and pods landed (both fading, see
    :meth:`decayed`)."""

    kept_h: float = 0.0
    landings: float = 0.0

    def decayed(self, dt_s: float) -> Outcomes:
        """These outcomes ``dt_s`` later (weight ``exp(-dt_s / LEARN_MEMORY_S)``)."""
        if dt_s <= 0.0:
            return self
        f = math.exp(-dt_s / LEARN_MEMORY_S)
        return Outcomes(self.kept_h * f, self.landings * f)

    def add(self, kept_s: float, landed: bool) -> Outcomes:
        """With ``kept_s`` more of keeping, ending with a pod landed or not."""
        return Outcomes(self.kept_h + kept_s / 3600.0, self.landings + (1.0 if landed else 0.0))


def landing_rate(prior_per_hour: float, outcomes: Outcomes) -> float:
    """Pods landing on one kept node per hour: the mean of a Gamma posterior whose prior is ``prior_per_hour`` worth
    ``LEARN_PRIOR_LANDINGS`` landings, after ``outcomes.landings`` landings in ``outcomes.kept_h`` hours (0 with no
    prior: nothing arrives that fits)."""
    if prior_per_hour <= 0.0:
        return 0.0
    a = LEARN_PRIOR_LANDINGS
    return (a + outcomes.landings) / (a / prior_per_hour + outcomes.kept_h)


def evidence_rate(outcomes: Outcomes) -> float:
    """Pods landing on one kept node per hour from the outcomes alone (``learn_released``): the landings over the hours
    kept plus ``EVIDENCE_PRIOR_H`` hours of nothing landed."""
    return outcomes.landings / (outcomes.kept_h + EVIDENCE_PRIOR_H)


@dataclass(frozen=True, slots=True)
class Released:
    """A released empty node's would-be keeping (``learn_released``): since when, of which kind and shape."""

    node: str
    kind: tuple[str, str]
    start: float
    shape: Shape


def settle_released(
    open_: Sequence[Released], needy: Sequence[tuple[float, Pod]], now: float, max_wait_s: float, settle_s: float
) -> tuple[list[Released], list[tuple[tuple[str, str], float, bool]]]:
    """Close would-be episodes: each needy arrival ``(time first seen, pod)``, in time order, closes the oldest open
    episode it fits that started before it and at most ``max_wait_s`` before (a landing after the time between); an
    episode older than ``max_wait_s + settle_s`` (a needy pod is known up to ``settle_s`` after it arrived) closes
    without one after ``max_wait_s``. Returns the episodes still open and the closed ones as ``(kind, seconds kept,
    landed)``."""
    left = sorted(open_, key=lambda e: (e.start, e.node))
    closed: list[tuple[tuple[str, str], float, bool]] = []
    for t, pod in sorted(needy, key=lambda a: a[0]):
        for i, e in enumerate(left):
            if e.start <= t <= e.start + max_wait_s and fits(pod, e.shape):
                closed.append((e.kind, t - e.start, True))
                del left[i]
                break
    still: list[Released] = []
    for e in left:
        if now > e.start + max_wait_s + settle_s:
            closed.append((e.kind, max_wait_s, False))
        else:
            still.append(e)
    return still, closed


def fits(pod: Pod, shape: Shape) -> bool:
    """True if ``pod`` would fit ``shape`` when the node is empty (requests, GPU model, labels, taints)."""
    r, a = pod.request, shape.allocatable
    if r.cpu_milli > a.cpu_milli or r.memory_mib > a.memory_mib or a.pods < 1:
        return False
    if r.gpus > a.gpus or (r.gpu_milli and a.gpus < 1):
        return False
    if r.gpu_models is not None and r.wants_gpu and shape.gpu_model not in r.gpu_models:
        return False
    return static_failure(pod, shape.labels, shape.taints) is None


def pod_saving(pod: Pod, shape: Shape, spec: EmptyWaitSpec) -> float:
    """$ one pod landing on the kept node saves: its share of the node over a cold start, and its waiting."""
    gpus = pod.request.gpu_demand_milli / MILLI_PER_GPU
    share = min(1.0, gpus / shape.allocatable.gpus) if shape.allocatable.gpus > 0 else 1.0
    return spec.cold_start_s / 3600.0 * (shape.hourly_price * share + spec.wait_cost_per_gpu_hour * gpus)


def _savings(
    times: Sequence[float], pods: Sequence[Pod], start: float, end: float, shape: Shape, spec: EmptyWaitSpec
) -> list[tuple[float, float]]:
    """(time, saving) of the arrivals in ``(start, end]`` that fit ``shape`` (an arrival leaves a window ending
    ``now`` at exactly ``its time + window``)."""
    lo = bisect.bisect_right(times, start)
    hi = bisect.bisect_right(times, end)
    return [(times[i], pod_saving(pods[i], shape, spec)) for i in range(lo, hi) if fits(pods[i], shape)]


def empty_wait(
    times: Sequence[float],
    pods: Sequence[Pod],
    first_seen: float,
    now: float,
    shape: Shape,
    spec: EmptyWaitSpec,
    rank: int = 1,
    outcomes: Outcomes | None = None,
) -> EmptyWait:
    """The empty wait of a node of ``shape`` (see the module docstring). ``times``/``pods``: the arrivals, sorted by
    time; ``first_seen``: when observation started (past days before it are not counted); ``rank``: the node is the
    ``rank``-th empty node of its shape arriving pods would take (it is kept if the saving pays ``rank`` times its
    price); ``outcomes``: what keeping nodes of this shape did (read with ``spec.learn``)."""
    hours = spec.window_s / 3600.0
    recent = _savings(times, pods, now - spec.window_s, now, shape, spec)
    recent_rate = sum(s for _, s in recent) / hours
    days = [d for d in range(1, spec.days + 1) if now - d * DAY_S >= first_seen]
    seasonal_rate = 0.0
    if days:
        total = sum(
            s
            for d in days
            for _, s in _savings(times, pods, now - d * DAY_S, now - d * DAY_S + spec.window_s, shape, spec)
        )
        seasonal_rate = total / hours / len(days)
    rate = max(recent_rate, seasonal_rate)
    price = shape.hourly_price * spec.margin * max(1, rank)
    why = (
        f"saving ${rate:.3f}/h (recent {len(recent)} fitting pod(s): ${recent_rate:.3f}/h; time of day over "
        f"{len(days)} day(s): ${seasonal_rate:.3f}/h) against ${shape.hourly_price:.3f}/h"
        + (f" x {rank} (empty node {rank} of its shape)" if rank > 1 else "")
    )
    if spec.learn_released:
        # evidence only: what landed on kept nodes and would have landed on released ones, per node and hour
        o = outcomes or Outcomes()
        landed = evidence_rate(o)
        per_pod = sum(s for _, s in recent) / len(recent) if recent else 0.0
        learned = landed * per_pod
        why += (
            f"; evidence: {landed:.2f} pod(s)/h land on a kept node ({o.landings:.1f} in {o.kept_h:.1f} h kept or "
            f"released), saving ${learned:.3f}/h"
        )
        until = _next_arrival_change(now, days, spec)
        if recent:
            until = min(until, recent[0][0] + spec.window_s)
        kept = learned > 0.0 and learned >= shape.hourly_price * spec.margin
        return EmptyWait(spec.max_wait_s if kept else None, learned, until, f"{why}: {'' if kept else 'not '}kept")
    if spec.learn and outcomes is not None and recent and rate > 0.0:
        # per node and hour: the arrivals' rate is the prior, the landings seen on kept nodes update it
        per_pod = recent_rate / (len(recent) / hours)
        prior = rate / per_pod / max(1, rank)
        landed = landing_rate(prior, outcomes)
        learned = landed * per_pod
        why += (
            f"; learned: {landed:.2f} pod(s)/h land on a kept node ({outcomes.landings:.1f} in "
            f"{outcomes.kept_h:.1f} h kept, prior {prior:.2f}/h), saving ${learned:.3f}/h"
        )
        # the learned saving moves (either way: the mean saving of a pod too) when an arrival leaves the window
        until = min(_next_arrival_change(now, days, spec), recent[0][0] + spec.window_s)
        kept = learned >= shape.hourly_price * spec.margin
        return EmptyWait(spec.max_wait_s if kept else None, learned, until, f"{why}: {'' if kept else 'not '}kept")
    if rate < price or rate <= 0.0:
        return EmptyWait(None, rate, _next_arrival_change(now, days, spec), f"{why}: not kept")
    # with no new arrival the recent rate falls as its oldest arrivals leave the window; the seasonal one moves on
    until = _next_arrival_change(now, days, spec)
    if recent_rate >= price and seasonal_rate < price:
        left = recent_rate
        for t, s in recent:
            left -= s / hours
            if left < price - 1e-12:
                until = min(until, t + spec.window_s)
                break
    return EmptyWait(spec.max_wait_s, rate, until, f"{why}: kept")


def _next_arrival_change(now: float, days: Sequence[int], spec: EmptyWaitSpec) -> float:
    """A look again time for the time-of-day forecast (it moves with the clock): a quarter window on, or never."""
    return now + spec.window_s / 4 if days else math.inf
