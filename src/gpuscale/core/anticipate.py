"""Demand-anticipating scale-up (``anticipate``, an option, off by default): when a plan launches nodes for pending
pods, it may also launch nodes for the pods expected in the next ``lead_s``, when the cold starts that room saves are
worth more than what it costs before it fills.

Pure decisions, in three steps (the controller calls the planner between the first two):

1. :func:`expected_pods` -- the pods expected in the next ``lead_s``: the GPU demand forecast by
   :func:`gpuscale.core.headroom.forecast` (recent windows of ``lead_s`` and, with ``days``, the same window of past
   days: their ``quantile``), capped at ``max_extra_gpus``, as copies of the newest arrivals (newest first, as long
   as their GPUs fit the forecast). Each copy is a pending pod of its own (:func:`anticipated`).
   :func:`after_plan` is the snapshot the plain plan leaves (its new nodes launching with the pods it put on them,
   the pods it places elsewhere bound there, the pods it blocks left out) with those pods pending: planned, they
   go to free room first (existing nodes, nodes in flight and the plain plan's new nodes: paid already) and to new
   nodes for the rest.
2. :func:`weigh` -- the new nodes for expected pods are launched when they are at most ``max_extra_gpus`` GPUs and the
   cold starts they save pay for them. An expected pod landing in room that is up (or coming up) instead of on a node
   launched for it saves ``cold_start_s`` of waiting, valued at ``wait_cost_per_gpu_hour`` per GPU, and
   ``cold_start_s`` of its share of a node (the boot a node of its own would be paid for); the extra nodes cost their
   price over the whole ``lead_s`` (as if they stayed empty until the end of the window).
3. :func:`with_extra` -- the plain decision with the extra nodes' launch orders appended, naming no pod (the pending
   pods keep the nodes the plain plan launches for them, so no node is launched for a pod that fits elsewhere).

The room bought is always one more node, never a bigger node instead of the plain plan's: a re-plan of the pending
pods together with the expected ones spreads them over its nodes differently, and a node then launched for a
pending pod that fits in the spare room of another launched in the same round is a redundant launch.

Extra nodes in flight leave spare room the planner's one-pod-at-a-time placement can miss (it puts a pod on the
node that suits it best, and a later pod then fits on none, where another assignment fits them all):
:func:`repack_in_flight` looks for such an assignment of the pods the plain plan puts on nodes in flight or launches
nodes for, by a small bounded search, and when every one of them fits drops the launches for them. And extra nodes
in flight were launched for no pod, so the planner may give their room to the pods of a draining node (shown to it
as pending) and launch a node for a pending pod: :func:`real_first` plans the pending pods first, then the draining
node's pods over what that leaves, when that costs no more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuscale.core.headroom import HeadroomSpec, forecast
from gpuscale.core.model import Catalog, Node, Offering, Pod, Snapshot
from gpuscale.core.predicates import static_failure
from gpuscale.core.reconcile.scaleup import LaunchOrder, ScaleUpDecision
from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.state import ClusterState, Placement
from gpuscale.core.templates import template_allocatable, template_labels

ANTICIPATED_NAMESPACE = "gpuscale.io~anticipated"
"""The namespace of the expected pods shown to the planner (no real pod can have it: ``~`` is not allowed)."""
LOWEST_PRIORITY = -(2**31)
"""The expected pods' priority: the planner places every real pod before them."""


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
    """At most this many GPUs of expected pods per plan, and of extra nodes."""
    learn_use: bool = False
    """Learn how often extra nodes run a pod (:class:`Use`) and buy that share of the room the forecast asks for
    (:func:`use_rate`): room that goes unused shrinks the room bought next."""
    use_memory_s: float = 3600.0
    """With ``learn_use``: outcomes fade with this time constant (:meth:`Use.decayed`)."""

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
    times: Sequence[float],
    pods: Sequence[Pod],
    first_seen: float,
    now: float,
    spec: AnticipateSpec,
    share: float = 1.0,
) -> tuple[Pod, ...]:
    """The pods expected in ``[now, now + lead_s)`` (see the module docstring). ``times``/``pods``: the GPU pods
    seen arriving, sorted by time; ``first_seen``: when observation started; ``share``: the part of the forecast
    demand to buy room for (``learn_use``: :func:`use_rate`), before the ``max_extra_gpus`` cap."""
    arrivals = [(t, p.request.gpu_demand_milli) for t, p in zip(times, pods, strict=True)]
    fc = forecast(arrivals, first_seen, now, spec.forecast_spec)
    budget = min(fc.milli if share >= 1.0 else int(fc.milli * share), spec.max_extra_gpus * MILLI_PER_GPU)
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


USE_PRIOR = 1.0
"""With ``learn_use``: the use rate starts from this many extra nodes that ran a pod (of as many): room is bought as
without ``learn_use`` until outcomes say otherwise."""


@dataclass(frozen=True, slots=True)
class Use:
    """What the extra nodes of one kind did (``learn_use``): how many ran a pod, of how many settled (both fading)."""

    used: float = 0.0
    total: float = 0.0

    def decayed(self, dt_s: float, memory_s: float) -> Use:
        """These outcomes ``dt_s`` later (weight ``exp(-dt_s / memory_s)``)."""
        if dt_s <= 0.0:
            return self
        f = math.exp(-dt_s / memory_s)
        return Use(self.used * f, self.total * f)

    def add(self, used: bool) -> Use:
        """With one more extra node settled, used or not."""
        return Use(self.used + (1.0 if used else 0.0), self.total + 1.0)


def use_rate(use: Use) -> float:
    """The share of extra nodes that run a pod: the mean of a Beta posterior that starts from ``USE_PRIOR`` used of
    as many."""
    return (use.used + USE_PRIOR) / (use.total + USE_PRIOR)


@dataclass(frozen=True, slots=True)
class Extra:
    """An extra node launched for expected pods, not yet settled (``learn_use``)."""

    request_id: str
    kind: tuple[str, str]
    """(pool, instance type)."""
    launched_at: float


def settle_extra(
    open_: Sequence[Extra], status: Mapping[str, str], now: float, window_s: float
) -> tuple[list[Extra], list[tuple[tuple[str, str], bool]]]:
    """Settle the extra nodes whose outcome is known: ``status`` maps a request id to ``"used"`` (a pod runs on its
    node), ``"gone"`` (its claim is gone, or its node is going) or ``"empty"`` (up or on its way, no pod yet; a
    request id missing from ``status`` is gone). A used node settles as used; one gone, or still empty
    ``window_s`` after its launch (the window its pods were expected in, and its cold start), as unused. Returns
    the nodes still open and the settled ones as ``(kind, used)``."""
    still: list[Extra] = []
    closed: list[tuple[tuple[str, str], bool]] = []
    for e in open_:
        st = status.get(e.request_id, "gone")
        if st == "used":
            closed.append((e.kind, True))
        elif st == "gone" or now - e.launched_at > window_s:
            closed.append((e.kind, False))
        else:
            still.append(e)
    return still, closed


@dataclass(frozen=True, slots=True)
class Verdict:
    """:func:`weigh`'s answer."""

    take: bool
    extra_hourly: float
    """$/h of the extra nodes."""
    extra_gpus: int
    saved: float
    """$ of cold starts the expected pods on the extra nodes would save."""
    spent: float
    """$ of the extra nodes over ``lead_s``."""
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
    extra: ScaleUpDecision,
    expected: Sequence[Pod],
    catalog: Catalog,
    spec: AnticipateSpec,
    use: Mapping[tuple[str, str], float] | None = None,
) -> Verdict:
    """Whether to launch ``extra``'s nodes (the plan of the ``expected`` pods over :func:`after_plan`). ``use``: the
    share of extra nodes of each (pool, instance type) that run a pod (``learn_use``; missing: 1): a node's saving
    counts that share."""
    priced = [order_price(o, catalog) for o in extra.launches]
    extra_hourly = sum(p for p, _ in priced)
    extra_gpus = sum(g for _, g in priced)
    demand = {p.key: p.request.gpu_demand_milli / MILLI_PER_GPU for p in expected}
    saved = 0.0
    for order, (price, gpus) in zip(extra.launches, priced, strict=True):
        per_gpu = price / gpus if gpus > 0 else 0.0
        share = use.get((order.pool, order.instance_type), 1.0) if use else 1.0
        for k in order.pods:
            gpu_h = demand.get(k, 0.0) * spec.cold_start_s / 3600.0
            saved += share * gpu_h * (spec.wait_cost_per_gpu_hour + per_gpu)
    spent = extra_hourly * spec.lead_s / 3600.0
    figures = (
        f"{len(expected)} expected pod(s): {len(extra.launches)} node(s), {extra_gpus} GPU, ${extra_hourly:.3f}/h, "
        f"cold starts saved ${saved:.3f} against ${spent:.3f} over the lead"
    )

    def verdict(take: bool, why: str) -> Verdict:
        return Verdict(take, extra_hourly, extra_gpus, saved, spent, f"{figures}: {why}")

    if not extra.launches:
        return verdict(False, "the expected pods fit in room there is or will be")
    if any(not is_anticipated(k) for o in extra.launches for k in o.pods):
        return verdict(False, "a pending pod the plain plan leaves out would get a node")
    if extra_gpus > spec.max_extra_gpus:
        return verdict(False, f"more than maxExtraGpus={spec.max_extra_gpus}")
    if saved < spent:
        return verdict(False, "does not pay")
    return verdict(True, "taken")


def after_plan(snapshot: Snapshot, plain: ScaleUpDecision, expected: Sequence[Pod]) -> Snapshot:
    """``snapshot`` as ``plain`` leaves it, with the ``expected`` pods pending (see the module docstring)."""
    pools = {p.name: p for p in snapshot.pools}
    types = snapshot.catalog.by_name()
    nodes = list(snapshot.nodes)
    on: dict[str, str] = dict(plain.placed)
    for i, o in enumerate(plain.launches):
        pool, it = pools.get(o.pool), types.get(o.instance_type)
        if pool is None or it is None:
            continue
        offer = next(
            (x for x in it.offerings if x.zone == o.zone and x.capacity_type == o.capacity_type),
            Offering(o.zone, o.capacity_type, 0.0),
        )
        name = f"{ANTICIPATED_NAMESPACE}/planned-{i}"
        labels = template_labels(pool, it, offer)
        alloc = template_allocatable(pool, it)
        nodes.append(Node(name, alloc, labels, pool.taints, False, pool.name, True, offer.hourly_price))
        on.update((k, name) for k in o.pods)
    blocked = {b.pod for b in plain.blocked}
    pods = [replace(p, node_name=on[p.key]) if p.pending and p.key in on else p for p in snapshot.pods]
    pods = [p for p in pods if p.key not in blocked or not p.pending]
    return replace(snapshot, pods=(*pods, *expected), nodes=tuple(nodes))


def with_extra(plain: ScaleUpDecision, extra: ScaleUpDecision) -> ScaleUpDecision:
    """``plain`` with ``extra``'s launch orders (planned over :func:`after_plan`) appended, naming no pod, in groups of
    their own after ``plain``'s."""
    first = 1 + max((o.group for o in plain.launches), default=-1)
    more = tuple(replace(o, pods=(), group=first + o.group) for o in extra.launches)
    return replace(plain, launches=plain.launches + more)


REPACK_MAX_PODS = 8
""":func:`repack_in_flight` looks at plans with at most this many pods to place on nodes in flight or new nodes."""
REPACK_MAX_NODES = 8
"""... and at most this many nodes in flight."""
REPACK_MAX_STEPS = 4096
"""... and tries at most this many placements (the search is exact below it, gives up above it)."""


def repack_in_flight(snapshot: Snapshot, plain: ScaleUpDecision) -> ScaleUpDecision:
    """``plain`` without its launches for pods, if the pods it places on nodes in flight and those it launches nodes
    for all fit in the free room of the nodes in flight (``snapshot``'s launching nodes) by some assignment; else
    ``plain``. The assignment is searched for pod by pod, largest first (GPUs, then CPU, then memory), trying each
    node in flight, backtracking, within :data:`REPACK_MAX_PODS`, :data:`REPACK_MAX_NODES` and
    :data:`REPACK_MAX_STEPS`. Launch orders naming no pod are kept. Gang members are left to the planner."""
    named = [k for o in plain.launches for k in o.pods]
    if not named:
        return plain
    flight = [n for n in snapshot.nodes if n.launching and not n.unschedulable]
    if not flight or len(flight) > REPACK_MAX_NODES:
        return plain
    names = {n.name for n in flight}
    keys = set(named) | {k for k, v in plain.placed.items() if v in names}
    if len(keys) > REPACK_MAX_PODS:
        return plain
    by_key = {p.key: p for p in snapshot.pods if p.key in keys}
    pods = [by_key[k] for k in sorted(keys) if k in by_key]
    if len(pods) != len(keys) or any(p.gang is not None or p.node_name is not None for p in pods):
        return plain
    pods.sort(key=lambda p: (-p.request.gpu_demand_milli, -p.request.cpu_milli, -p.request.memory_mib, p.key))
    bound: list[list[Request]] = [[] for _ in flight]
    index = {n.name: i for i, n in enumerate(flight)}
    for p in snapshot.pods:
        i = index.get(p.node_name)  # type: ignore[arg-type]
        if i is not None and p.phase in ("Pending", "Running"):
            bound[i].append(p.request)
    state = ClusterState.occupied(
        [n.name for n in flight], [n.allocatable for n in flight], [n.gpu_model for n in flight], bound
    )
    workloads = snapshot.workloads or None
    allowed = [
        [i for i, n in enumerate(flight) if static_failure(p, n.labels, n.taints, False, workloads) is None]
        for p in pods
    ]
    found = _assign(state, [p.request for p in pods], allowed)
    if found is None:
        return plain
    placed = dict(plain.placed)
    placed.update((p.key, flight[i].name) for p, i in zip(pods, found, strict=True))
    launches = tuple(o for o in plain.launches if not o.pods)
    return replace(plain, launches=launches, placed=placed)


def _assign(state: ClusterState, reqs: Sequence[Request], allowed: Sequence[Sequence[int]]) -> list[int] | None:
    """A row of ``state`` for each request, in order, every one fitting with those before it placed (None: none
    found within :data:`REPACK_MAX_STEPS` placements). ``state`` is left as it was."""
    rows: list[int] = []
    taken: list[Placement] = []
    steps = 0

    def go(k: int) -> bool:
        nonlocal steps
        if k == len(reqs):
            return True
        req = reqs[k]
        for i in allowed[k]:
            if steps >= REPACK_MAX_STEPS:
                return False
            if not state.fits_one(req, i):
                continue
            steps += 1
            taken.append(state.place(req, i))
            rows.append(i)
            if go(k + 1):
                return True
            rows.pop()
            state.release(req, taken.pop())
        return False

    ok = go(0)
    for req, pl in zip(reversed(reqs[: len(taken)]), reversed(taken), strict=True):
        state.release(req, pl)
    return rows if ok else None


def pending_first(plain: ScaleUpDecision, leaving: Collection[str]) -> ScaleUpDecision:
    """``plain`` with its launch orders that carry only pods of draining nodes (``leaving``) after the others, each
    order (and its group number) unchanged; ``plain`` itself if nothing moves. A node for a pod that waits is
    launched before a node for a pod that still runs: launched the other way round, the first node is in flight,
    empty, when the second is launched for a pod that would fit it (the draining node's pod has not left yet)."""
    if not leaving or not plain.launches:
        return plain

    def only_leaving(o: LaunchOrder) -> bool:
        return bool(o.pods) and all(k in leaving for k in o.pods)

    first = [o for o in plain.launches if not only_leaving(o)]
    later = [o for o in plain.launches if only_leaving(o)]
    if not later or plain.launches[len(first) :] == tuple(later):
        return plain
    return replace(plain, launches=(*first, *later))


def real_first(
    snapshot: Snapshot,
    plain: ScaleUpDecision,
    leaving: Collection[str],
    replan: Callable[[Snapshot], ScaleUpDecision],
    catalog: Catalog,
) -> ScaleUpDecision:
    """When ``plain`` launches a node for a pending pod while it places a pod of a draining node (``leaving``: their
    keys, shown pending in ``snapshot``) on a node in flight, the plan of the pending pods alone, then of the draining
    nodes' pods over what it leaves (:func:`after_plan`), if its nodes cost no more per hour than ``plain``'s and it
    blocks no pod ``plain`` does not; else ``plain``. Room in flight goes to pods that wait, before pods that still
    run."""
    if not leaving:
        return plain
    launching = {n.name for n in snapshot.nodes if n.launching}
    if not any(k not in leaving for o in plain.launches for k in o.pods):
        return plain
    if not any(k in leaving and v in launching for k, v in plain.placed.items()):
        return plain
    without = replace(snapshot, pods=tuple(p for p in snapshot.pods if p.key not in leaving))
    first = replan(without)
    moved = [p for p in snapshot.pods if p.key in leaving]
    then = replan(after_plan(without, first, moved))
    shift = 1 + max((o.group for o in first.launches), default=-1)
    both = ScaleUpDecision(
        first.launches + tuple(replace(o, group=shift + o.group) for o in then.launches),
        {**first.placed, **then.placed},
        first.blocked + then.blocked,
        plain.attempt,
        plain.may_replan,
    )

    def hourly(d: ScaleUpDecision) -> float:
        return sum(order_price(o, catalog)[0] for o in d.launches)

    if {b.pod for b in both.blocked} - {b.pod for b in plain.blocked}:
        return plain  # cheaper only by leaving a pod without room
    return both if hourly(both) <= hourly(plain) + 1e-9 else plain
