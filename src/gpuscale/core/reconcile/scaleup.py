"""The decisions of one scale-up, as pure functions of the round's observation.

A round's scale-up is three calls, each pure (the controller's :mod:`~gpuscale.controller.scaleup` carries out
what they return):

1. :func:`gate_scale_up` decides whether to plan at all: nothing pending, the batch window still open, every
   pending pod already covered (by a claim in flight launched for it, or by a node the last plan put it on), or
   the same inputs as the last plan within ``replanInterval`` all skip the planner.
2. :func:`decide_scale_up` plans (through the injected pure planner) and returns the :class:`LaunchOrder` of every
   node to launch (request-id seed, offering, pods, reason), the pods placed on nodes that exist, and the pods'
   NotTriggerScaleUp reasons. The shell launches the orders in turn and asks :func:`after_launch` what an outcome
   means: go on, skip the rest of this plan launch, or re-plan. **Re-plan loop**: a capacity or quota error (the
   offering or pool is now marked in the availability) makes the shell call :func:`decide_scale_up` again at once
   with ``attempt + 1`` over a snapshot built from the new availability; it stops at the first plan whose launches
   end without such an error, or after ``max(1, max_replans)`` plans in one round (:attr:`ScaleUpDecision.may_replan`
   is False on the last allowed attempt), and the rest waits for the next round (whose gate is forced open).
3. :func:`min_node_orders` gives the ``minNodes`` launches once the scale-up's launches were carried out (so a
   node the scale-up failed to launch leaves its room to ``minNodes``).

:func:`scale_up_wake_times` says when the scale-up next has timed work. Before each launch (of these orders,
replacements and retries alike) :func:`pool_limit_refusal` checks the pool's
``maxNodes`` and ``limits`` against the claims and Nodes counted at that moment.

:class:`PlanningMemo` is what one plan leaves for the next round's gate (see :func:`gate_scale_up`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gpuscale.core.disruption import pool_offerings
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Node, NodePool, OfferingKey, Pod, Snapshot
from gpuscale.core.plan import Blocked, BlockReason, PlannerConfig, ScaleUpPlan
from gpuscale.core.reconcile.launching import Outcome
from gpuscale.core.resources import Resources

PlanFn = Callable[[Snapshot, PlannerConfig, float], ScaleUpPlan]
"""The planner's signature (:func:`gpuscale.core.planner.plan`)."""

STATIC_BLOCKS = frozenset(
    {BlockReason.TOO_LARGE, BlockReason.NO_MATCHING_POOL, BlockReason.TAINT_NOT_TOLERATED, BlockReason.INVALID_REQUEST}
)
"""Block reasons no change of nodes, capacity or time can lift (pools and catalog are fixed for a controller)."""


class Gate(StrEnum):
    """What :func:`gate_scale_up` decided."""

    IDLE = "idle"
    """Nothing pending: close the batch, forget where pods were planned, forget their reported reasons."""
    EMPTY = "empty"
    """Only pods no cluster change can help are pending: close the batch, plan nothing."""
    WAIT = "wait"
    """The batch window is still open."""
    COVERED = "covered"
    """Every pending pod has room on a node in flight: re-planning cannot launch less."""
    UNCHANGED = "unchanged"
    """The same inputs as the last plan, within ``replanInterval``."""
    PLAN = "plan"
    """Plan now."""


@dataclass(frozen=True, slots=True)
class PlanningMemo:
    """What the last plan saw and decided, read by the next rounds' gate.

    Invariant (checked by :class:`~gpuscale.controller.rounds.ScaleUpState` in check mode, see
    :func:`held_back`): when the gate skips a plan (``COVERED`` or ``UNCHANGED``), planning would have launched
    nothing the last plan did not already decide (every launch order it would give has a seed in :attr:`seeds`), so
    skipping gives the same launches as planning. One exception, by design: a pod the last plan put on an existing
    node less than ``replanInterval`` ago stays covered even if a pod the scheduler bound there since took its
    room; it is planned again at the latest ``replanInterval`` after that plan. (Planned now, such a pod may take
    the room of a node in flight launched for another pod, which then needs a node: that launch is the exception's
    too, see :func:`held_back`.)
    """

    last_plan_at: float = -math.inf
    signature: object = None
    """The inputs as they were after the last plan's launches (see :func:`plan_signature`)."""
    planned_on_node: Mapping[str, str] = field(default_factory=dict)
    """Pending pod -> the existing node the last plan put it on."""
    static_blocked: frozenset[str] = frozenset()
    """Pods blocked for a reason in :data:`STATIC_BLOCKS` (never planned again while pending)."""
    seeds: frozenset[tuple[str, ...]] = frozenset()
    """The seeds of every launch order the last plan's round tried."""


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """:func:`gate_scale_up`'s answer: the gate, the pods to plan for and the memo to keep."""

    gate: Gate
    real: tuple[Pod, ...]
    """The pending pods to plan for (pods statically blocked left out)."""
    memo: PlanningMemo
    pending: frozenset[str]
    """Every pending pod's key (real and virtual, statically blocked included)."""


@dataclass(frozen=True, slots=True)
class LaunchOrder:
    """One node to launch. ``group``: the plan launch it belongs to (or the pool, for ``minNodes``)."""

    seed: tuple[str, ...]
    """What the request id is derived from (the same order in a later round gets the same id)."""
    pool: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    pods: tuple[str, ...]
    reason: str
    group: int


class Step(StrEnum):
    """What the shell does after a launch order's outcome (:func:`after_launch`)."""

    NEXT = "next"
    """Launch the next order."""
    SKIP_GROUP = "skip-group"
    """Skip the rest of this order's group, go on with the next group."""
    REPLAN = "replan"
    """Stop launching this decision's orders; plan again now if :attr:`ScaleUpDecision.may_replan`."""


@dataclass(frozen=True, slots=True)
class ScaleUpDecision:
    """:func:`decide_scale_up`'s answer."""

    launches: tuple[LaunchOrder, ...]
    placed: Mapping[str, str]
    """Pending pod -> existing node (or node in flight) the plan puts it on."""
    blocked: tuple[Blocked, ...]
    """Pods that trigger no scale-up, with their reason."""
    attempt: int
    may_replan: bool
    """False on the last plan allowed in one round."""


def plan_signature(
    real: Collection[str],
    virtual: Collection[str],
    claims: Collection[tuple[str, object]],
    unavailable: Collection[OfferingKey],
    nodes: Collection[str],
    backed_off: Collection[str],
    fallbacks: Collection[str],
) -> object:
    """The inputs a plan depends on that change between rounds: pending and virtual pods, the claims and their
    phases, the offerings marked unavailable now, the node names, the pools backed off and the spot fallbacks."""
    return (
        frozenset(real),
        frozenset(virtual),
        frozenset(claims),
        frozenset(unavailable),
        frozenset(nodes),
        frozenset(backed_off),
        frozenset(fallbacks),
    )


def gate_scale_up(
    real: Sequence[Pod],
    virtual: Sequence[Pod],
    memo: PlanningMemo,
    *,
    batch_closed: bool,
    force: bool,
    in_flight_pods: Collection[str],
    coming_up: Collection[str],
    nodes: Mapping[str, Node],
    signature: Callable[[Sequence[Pod]], object],
    now: float,
    replan_interval_s: float,
) -> GateVerdict:
    """Whether this round plans (see :class:`Gate`), in this order: nothing pending (``IDLE``), the batch still
    open and nothing forcing a plan (``WAIT``), only statically blocked pods (``EMPTY``), every pending pod covered
    and no pod of a leaving node to move (``COVERED``), the same ``signature`` as after the last plan within
    ``replan_interval_s`` (``UNCHANGED``), else ``PLAN``. ``force`` (a launch failed since) skips the last two.

    A pod is covered when a claim in flight was launched for it (``in_flight_pods``), or the last plan put it on a
    node that is schedulable and still coming up (``coming_up``) or, within ``replan_interval_s``, on any
    schedulable node. ``signature`` is called (with the pods to plan for) only when it is compared."""
    pending = frozenset(p.key for p in real) | frozenset(p.key for p in virtual)
    if not real and not virtual:
        return GateVerdict(Gate.IDLE, (), replace(memo, planned_on_node={}) if memo.planned_on_node else memo, pending)
    if not batch_closed and not force:
        return GateVerdict(Gate.WAIT, tuple(real), memo, pending)
    static = memo.static_blocked & pending
    if static != memo.static_blocked:
        memo = replace(memo, static_blocked=static)
    todo = tuple(p for p in real if p.key not in static)
    if not todo and not virtual:
        return GateVerdict(Gate.EMPTY, (), memo, pending)
    fresh = now - memo.last_plan_at < replan_interval_s
    if not virtual and not force and all_covered(todo, memo, in_flight_pods, coming_up, nodes, fresh):
        return GateVerdict(Gate.COVERED, todo, memo, pending)
    if not force and fresh and signature(todo) == memo.signature:
        return GateVerdict(Gate.UNCHANGED, todo, memo, pending)
    return GateVerdict(Gate.PLAN, todo, memo, pending)


def all_covered(
    real: Sequence[Pod],
    memo: PlanningMemo,
    in_flight: Collection[str],
    coming_up: Collection[str],
    nodes: Mapping[str, Node],
    fresh: bool,
) -> bool:
    """True if every pod of ``real`` is covered (see :func:`gate_scale_up`); ``fresh``: the last plan is less than
    ``replanInterval`` old."""
    for p in real:
        if p.key in in_flight:
            continue
        target = memo.planned_on_node.get(p.key)
        node = nodes.get(target) if target is not None else None
        if node is not None and not node.unschedulable and (target in coming_up or fresh):
            continue
        return False
    return True


def decide_scale_up(
    snapshot: Snapshot,
    planner: PlanFn,
    config: PlannerConfig,
    now: float,
    *,
    attempt: int = 0,
    max_replans: int = 1,
) -> ScaleUpDecision:
    """Plan the snapshot's pending pods (claims in flight are launching nodes in it, so the room they bring is
    used before anything new is bought) and turn the plan into launch orders (see :func:`launch_orders`).
    ``attempt`` counts the plans of this round from 0; ``may_replan`` is False once
    ``attempt + 1 >= max(1, max_replans)``."""
    plan = planner(snapshot, config, now)
    orders, placed = launch_orders(plan)
    return ScaleUpDecision(
        launches=orders,
        placed=placed,
        blocked=plan.blocked,
        attempt=attempt,
        may_replan=attempt + 1 < max(1, max_replans),
    )


def launch_orders(plan: ScaleUpPlan) -> tuple[tuple[LaunchOrder, ...], dict[str, str]]:
    """A plan's launch orders and its placements on nodes that exist or are in flight.

    The n-th node of a plan launch carrying pods P gets the seed ``("up", pool, type, zone, capacity type, *P)``
    (a node without pods adds ``n``), so the same plan in a later round asks for the same request ids; each order's
    group is the index of its plan launch."""
    per_node: dict[str, list[str]] = {}
    for pod, target in plan.placements.items():
        per_node.setdefault(target, []).append(pod)
    orders: list[LaunchOrder] = []
    launched: set[str] = set()
    for group, launch in enumerate(plan.launches):
        for i in range(launch.count):
            node_id = f"{launch.id}/{i}"
            launched.add(node_id)
            pods = tuple(sorted(per_node.get(node_id, ())))
            seed: tuple[str, ...] = ("up", launch.pool, launch.instance_type, launch.zone, str(launch.capacity_type))
            seed = (*seed, *pods) if pods else (*seed, str(i))
            ct = launch.capacity_type
            orders.append(LaunchOrder(seed, launch.pool, launch.instance_type, launch.zone, ct, pods, "ScaleUp", group))
    placed = {k: v for k, v in plan.placements.items() if v not in launched}
    return tuple(orders), placed


def displaced(
    memo: PlanningMemo, reference: ScaleUpDecision, pending: Collection[str], now: float, replan_interval_s: float
) -> frozenset[str]:
    """The pending pods a skip kept covered only by the memo's exception: put on an existing node by a plan less than
    ``replan_interval_s`` old, yet put elsewhere (another node, or a new one) by the plan it skipped (``reference``)
    because pods bound there since took their room."""
    if now - memo.last_plan_at >= replan_interval_s:
        return frozenset()
    return frozenset(p for p, n in memo.planned_on_node.items() if p in pending and reference.placed.get(p) != n)


def held_back(
    memo: PlanningMemo,
    reference: ScaleUpDecision,
    moved: Collection[str],
    without: ScaleUpDecision | None = None,
) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """The seeds of the launch orders a skipped plan held back (those of ``reference``, the plan it skipped, whose
    seed the last plan did not decide), split into (against the memo's invariant, allowed by its exception).

    ``moved``: the pods the exception covered (:func:`displaced`); with none, every order held back is against the
    invariant. ``without``: the same round's plan with those pods left out. The room a moved pod takes on a node in
    flight may be the room a pod the node was launched for needed, so the launch it brings can be for another pod
    (the planner packs all pending pods at once): an order is allowed exactly when ``without`` does not hold it
    back too, and ``without``'s held-back orders are against the invariant. Without ``without``, an order is allowed
    when every pod of it was moved."""
    new = [o for o in reference.launches if o.seed not in memo.seeds]
    if not moved:
        return sorted(o.seed for o in new), []
    if without is not None:
        wrong = {o.seed for o in without.launches if o.seed not in memo.seeds}
        return sorted(wrong), sorted(o.seed for o in new if o.seed not in wrong)
    excused = [o.seed for o in new if o.pods and all(p in moved for p in o.pods)]
    return sorted(o.seed for o in new if o.seed not in excused), sorted(excused)


def after_launch(order: LaunchOrder, outcome: Outcome) -> Step:
    """What a launch order's outcome means for the orders after it.

    Launched, or to be retried later with the same id: the next order. Failed, or held back by a pool limit: skip
    the rest of the order's group. A capacity or quota error: re-plan (a ``minNodes`` order: skip the rest of its
    pool's orders instead; ``minNodes`` never re-plans)."""
    if outcome in (Outcome.OK, Outcome.RETRY):
        return Step.NEXT
    if outcome in (Outcome.CAPACITY, Outcome.QUOTA) and order.reason != "MinNodes":
        return Step.REPLAN
    return Step.SKIP_GROUP


def effective_pools(
    pools: Sequence[NodePool],
    nodes: Sequence[Node],
    fallback: Collection[str],
    backed_off: Collection[str],
) -> list[NodePool]:
    """The pools as a plan sees them: a spot-only pool whose spot fallback is active (``fallback``) may also buy
    on-demand; a backed-off pool may not grow past the nodes it has (counted in ``nodes``)."""
    counts: dict[str, int] = {}
    for n in nodes if backed_off else ():  # read only for a pool backed off
        if n.pool is not None:
            counts[n.pool] = counts.get(n.pool, 0) + 1
    out: list[NodePool] = []
    for p in pools:
        q = p
        if (
            p.name in fallback
            and p.allow_spot_fallback
            and CapacityType.SPOT in p.capacity_types
            and CapacityType.ON_DEMAND not in p.capacity_types
        ):
            q = replace(q, capacity_types=(*p.capacity_types, CapacityType.ON_DEMAND))
        if p.name in backed_off:
            q = replace(q, max_nodes=counts.get(p.name, 0))
        out.append(q)
    return out


def scale_up_wake_times(batch_closes: float | None, pending: bool, expiries: Iterable[float]) -> list[float]:
    """When the scale-up next has timed work: the open batch window closing (``batch_closes``) and, while pods are
    pending, each end of an offering mark, pool back-off or spot fallback (a plan may then launch what it could
    not). Anything else the scale-up reads changes only when the cluster or the cloud does."""
    times = [] if batch_closes is None else [batch_closes]
    if pending:
        times += expiries
    return times


def pool_limit_refusal(pool: NodePool, it: InstanceType, count: int, used: Resources) -> str | None:
    """Why one more ``it`` node would break ``pool``'s ``maxNodes`` or ``limits`` when the pool has ``count`` nodes
    of raw capacity ``used`` (every claim but Gone ones and Failed ones without a node, and every Node of the pool
    gpuscale did not launch), or None if it fits. Checked before each launch, whatever decided it."""
    if pool.max_nodes is not None and count + 1 > pool.max_nodes:
        return f"pool {pool.name} has {count} of maxNodes={pool.max_nodes} nodes"
    if not pool.limits.allows(used + replace(it.capacity, pods=0)):
        return f"a {it.name} would exceed the limits of pool {pool.name}"
    return None


@dataclass(frozen=True, slots=True)
class MinNodes:
    """:func:`min_node_orders`' answer: the orders (one group per pool) and the pools with no offering."""

    launches: tuple[LaunchOrder, ...] = ()
    blocked: tuple[str, ...] = ()


def min_node_orders(
    pools: Sequence[NodePool],
    have: Mapping[str, int],
    catalog: Catalog,
    unavailable: Mapping[OfferingKey, float],
    fallback: Collection[str],
    backed_off: Collection[str],
    now: float,
) -> MinNodes:
    """The launches that bring every pool not backed off up to its ``minNodes`` (``have``: nodes it has), each of
    the pool's cheapest available offering, seeded ``("min", pool, type, zone, capacity type, k)`` for its k-th node;
    a pool with no offering is listed in ``blocked``."""
    orders: list[LaunchOrder] = []
    blocked: list[str] = []
    for group, pool in enumerate(pools):
        if pool.min_nodes <= 0 or pool.name in backed_off:
            continue
        start = have.get(pool.name, 0)
        if start >= pool.min_nodes:
            continue
        eff = effective_pools([pool], [], fallback, backed_off)[0]
        offers = pool_offerings(eff, catalog, now, unavailable)
        if not offers:
            blocked.append(pool.name)
            continue
        po = offers[0]
        it, zone, ct = po.instance_type.name, po.offering.zone, po.offering.capacity_type
        for k in range(start, pool.min_nodes):
            seed = ("min", pool.name, it, zone, str(ct), str(k))
            orders.append(LaunchOrder(seed, pool.name, it, zone, ct, (), "MinNodes", group))
    return MinNodes(tuple(orders), tuple(blocked))
