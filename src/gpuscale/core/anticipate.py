"""Demand-anticipating scale-up (``anticipate``, an option, off by default): when a plan launches nodes for pending
pods, it may buy a bigger node or one more node for the pods expected to arrive in the next ``lead_s``, when the
cold starts that room saves are worth more than what it costs before it fills.

Pure decisions, in three steps (the controller calls the planner between the first two):

1. :func:`expected_pods` -- the pods expected in the next ``lead_s``: the GPU demand forecast by
   :func:`gpuscale.core.headroom.forecast` (recent windows of ``lead_s`` and, with ``days``, the same window of past
   days: their ``quantile``), capped at ``max_extra_gpus``, as copies of the newest arrivals (newest first, as long
   as their GPUs fit the forecast). Each copy is a pending pod of its own (:func:`anticipated`), of the lowest
   priority, so the planner places real pods first and these only in the room left (free room of existing nodes and
   nodes in flight first: it is paid already).
2. :func:`weigh` -- the plan with those pods against the plan without: it is taken when it blocks no real pod the
   plain plan places, buys at most ``max_extra_gpus`` more GPUs, and the cold starts its extra room saves pay for
   it. A pod landing in room that is up (or coming up) instead of on a node launched for it saves
   ``cold_start_s`` of waiting, valued at ``wait_cost_per_gpu_hour`` per GPU, and ``cold_start_s`` of its share of
   a node (the boot a node of its own would be paid for); the extra room costs the price difference of the two
   plans over the whole ``lead_s`` (as if it stayed empty until the end of the window).
3. :func:`without_anticipated` -- the chosen decision with the expected pods taken out of its launch orders,
   placements and blocked list (claims carry only real pods; no event names an expected pod).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuscale.core.headroom import HeadroomSpec, forecast
from gpuscale.core.model import Catalog, Pod
from gpuscale.core.reconcile.scaleup import LaunchOrder, ScaleUpDecision
from gpuscale.core.resources import MILLI_PER_GPU

ANTICIPATED_NAMESPACE = "gpuscale.io~anticipated"
"""The namespace of the expected pods shown to the planner (no real pod can have it: ``~`` is not allowed)."""
LOWEST_PRIORITY = -(2**31)


@dataclass(frozen=True, slots=True)
class AnticipateSpec:
    """The ``anticipate`` setting (see the module docstring; times in seconds)."""

    lead_s: float = 600.0
    """The forecast window: room bought now for pods expected within this long."""
    quantile: float = 0.5
    recent_windows: int = 6
    days: int = 0
    """Time-of-day forecast over this many past days (0: recent windows only)."""
    wait_cost_per_gpu_hour: float = 4.0
    """What an hour of a GPU's worth of pending time costs the user."""
    cold_start_s: float = 200.0
    """What a pod landing in room already bought saves: this long of waiting and of a node's boot."""
    max_extra_gpus: int = 8
    """At most this many GPUs of expected pods per plan, and at most this many more GPUs bought than the plain plan."""

    @property
    def forecast_spec(self) -> HeadroomSpec:
        """The forecast's settings, as :func:`gpuscale.core.headroom.forecast` reads them."""
        return HeadroomSpec(
            max_nodes=1,
            max_hourly_cost=0.0,
            lead_s=self.lead_s,
            quantile=self.quantile,
            days=self.days,
            min_days=1,
            recent_windows=self.recent_windows,
        )

    @property
    def history_s(self) -> float:
        """How far back arrivals are needed."""
        return self.forecast_spec.history_s


def anticipated(pod: Pod) -> Pod:
    """The pending copy of an arrived pod that stands for one expected pod of its shape."""
    return replace(
        pod,
        namespace=ANTICIPATED_NAMESPACE,
        name=pod.key,
        node_name=None,
        phase="Pending",
        priority=LOWEST_PRIORITY,
        gang=None,
        gang_size=0,
    )


def is_anticipated(key: str) -> bool:
    """True for the key of an expected pod (:func:`anticipated`)."""
    return key.startswith(ANTICIPATED_NAMESPACE + "/")


def expected_pods(
    times: Sequence[float], pods: Sequence[Pod], first_seen: float, now: float, spec: AnticipateSpec
) -> tuple[Pod, ...]:
    """The pods expected in ``[now, now + lead_s)`` (see the module docstring). ``times``/``pods``: the GPU pods
    seen arriving, sorted by time; ``first_seen``: when observation started."""
    arrivals = [(t, p.request.gpu_demand_milli) for t, p in zip(times, pods, strict=True)]
    fc = forecast(arrivals, first_seen, now, spec.forecast_spec)
    budget = min(fc.milli, spec.max_extra_gpus * MILLI_PER_GPU)
    out: list[Pod] = []
    seen: set[str] = set()
    for p in reversed(pods):
        m = p.request.gpu_demand_milli
        if budget <= 0:
            break
        if m <= 0 or p.gang is not None or p.key in seen or m > budget:
            continue
        seen.add(p.key)
        out.append(anticipated(p))
        budget -= m
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Verdict:
    """:func:`weigh`'s answer."""

    take: bool
    extra_hourly: float
    """$/h the anticipating plan's launches cost more than the plain plan's."""
    extra_gpus: int
    saved: float
    """$ of cold starts the expected pods on new nodes would save."""
    spent: float
    """$ of the extra room over ``lead_s``."""
    reason: str


def order_price(order: LaunchOrder, catalog: Catalog) -> tuple[float, int]:
    """($/h, GPUs) of one launch order's node (0 $/h if the catalog lacks its offering)."""
    it = catalog.by_name().get(order.instance_type)
    if it is None:
        return 0.0, 0
    for o in it.offerings:
        if o.zone == order.zone and o.capacity_type == order.capacity_type:
            return o.hourly_price, it.gpu_count
    return 0.0, it.gpu_count


def weigh(
    plain: ScaleUpDecision,
    anticipating: ScaleUpDecision,
    expected: Sequence[Pod],
    catalog: Catalog,
    spec: AnticipateSpec,
) -> Verdict:
    """Whether to carry out ``anticipating`` (the plan with the ``expected`` pods) instead of ``plain``."""
    base = [order_price(o, catalog) for o in plain.launches]
    more = [order_price(o, catalog) for o in anticipating.launches]
    extra_hourly = sum(p for p, _ in more) - sum(p for p, _ in base)
    extra_gpus = sum(g for _, g in more) - sum(g for _, g in base)
    demand = {p.key: p.request.gpu_demand_milli / MILLI_PER_GPU for p in expected}
    saved = 0.0
    for order, (price, gpus) in zip(anticipating.launches, more, strict=True):
        per_gpu = price / gpus if gpus > 0 else 0.0
        for k in order.pods:
            g = demand.get(k, 0.0)
            saved += g * spec.cold_start_s / 3600.0 * (spec.wait_cost_per_gpu_hour + per_gpu)
    spent = max(0.0, extra_hourly) * spec.lead_s / 3600.0
    figures = (
        f"{len(expected)} expected pod(s): +{extra_gpus} GPU, +${extra_hourly:.3f}/h, "
        f"cold starts saved ${saved:.3f} against ${spent:.3f} over the lead"
    )

    def verdict(take: bool, why: str) -> Verdict:
        return Verdict(take, extra_hourly, extra_gpus, saved, spent, f"{figures}: {why}")

    if extra_hourly <= 1e-9:
        return verdict(False, "no room bought beyond the plain plan")
    lost = _placed(plain) - _placed(anticipating)
    if lost:
        return verdict(False, f"{len(lost)} pending pod(s) the plain plan places would not be")
    if extra_gpus > spec.max_extra_gpus:
        return verdict(False, f"more than maxExtraGpus={spec.max_extra_gpus}")
    if saved < spent:
        return verdict(False, "does not pay")
    return verdict(True, "taken")


def _placed(d: ScaleUpDecision) -> set[str]:
    """Real pods a decision places (on a node or a new node)."""
    out = {k for k in d.placed if not is_anticipated(k)}
    out.update(k for o in d.launches for k in o.pods if not is_anticipated(k))
    return out


def without_anticipated(d: ScaleUpDecision, expected: Sequence[Pod]) -> ScaleUpDecision:
    """``d`` with the ``expected`` pods taken out of its orders' pods, placements and blocked pods (the orders' seeds
    keep them: the same plan in a later round asks for the same request ids).

    The orders are launched in this order: those with real pods first, the ones with the least room for expected
    pods first, then those with none (so no node is launched for a real pod that fits in the spare room of a node
    launched before it in the same plan)."""
    if not expected:
        return d
    room = {p.key: p.request.gpu_demand_milli for p in expected}

    def order_key(item: tuple[int, LaunchOrder]) -> tuple[bool, int, int]:
        i, o = item
        real = any(k not in room for k in o.pods)
        return (not real, sum(room.get(k, 0) for k in o.pods), i)

    ordered = [o for _, o in sorted(enumerate(d.launches), key=order_key)]
    return replace(
        d,
        launches=tuple(replace(o, pods=tuple(k for k in o.pods if k not in room)) for o in ordered),
        placed={k: v for k, v in d.placed.items() if k not in room},
        blocked=tuple(b for b in d.blocked if b.pod not in room),
    )
