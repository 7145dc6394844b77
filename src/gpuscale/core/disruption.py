"""Scale-down and consolidation decisions (pure).

For every node of a managed pool, :func:`plan_disruption` decides *delete*, *replace* or *keep*, with a reason:

* A node is a candidate when it is **Empty** (no workload pods; on a GPU node, only CPU-only pods also count as
  empty, because CPU work alone must not keep a GPU node alive), **Underutilized** (pool policy
  ``WhenEmptyOrUnderutilized`` and the node's request share is below the pool's ``utilization_threshold``; GPU nodes
  are judged by their GPU requests, CPU nodes by the larger of CPU and memory), or **Drifted** (its instance type,
  zone or capacity type no longer conforms to its pool, e.g. an on-demand node launched as a spot fallback in a
  spot-only pool). With ``use_measured_gpu_utilization`` a GPU node is underutilised only if its *measured* GPU
  utilisation is below the threshold as well (busy GPUs are kept even when requests look small); nodes without a
  measurement are judged by requests alone.
* Empty and Underutilized candidates must stay candidates for ``consolidate_after_s`` first (Empty ones for
  ``consolidate_empty_after_s`` when set; the caller keeps the ``since`` map and gets the updated one back); Drifted
  nodes need no wait.
* A candidate whose workload pods all fit on the other nodes (kube-scheduler predicates and per-GPU accounting of
  :class:`~gpuscale.core.state.ClusterState`) is **deleted**. Otherwise the pods that do not fit must fit on one new
  node: cheaper than the candidate for Empty/Underutilized (a spot node is not replaced by another spot node), or
  conforming to the pool for Drifted; the candidate is then **replaced**. An Underutilized candidate with two or more
  pods left may instead be replaced by several new nodes (the scale-up planner's greedy packing into the pools'
  remaining room) when they cost less in all than the best single node, or than the candidate if there is none.
* Blockers, in order: a pod annotated ``gpuscale.io/do-not-disrupt: "true"``; a PodDisruptionBudget with no
  disruption left; the pool's ``min_nodes``; the pool's disruption budgets for that reason (the most restrictive
  active budget wins; percentages round up; nodes already being disrupted count against it).

Budget schedules are 5-field cron expressions evaluated in UTC on the caller's clock (seconds since the Unix epoch):
a budget with ``schedule`` and ``duration_s`` is active during ``[hit, hit + duration)`` for every schedule hit.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any

import numpy as np

from gpuscale.core import labels as L
from gpuscale.core.memo import Memo
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    ConsolidationPolicy,
    DisruptionBudget,
    InstanceType,
    Node,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
    PoolLimits,
    Snapshot,
    Taint,
)
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources
from gpuscale.core.state import ClusterState, NodeShape, fits_room, gpu_room
from gpuscale.core.templates import pool_templates, pool_totals, template_allocatable
from gpuscale.errors import InputError

# ---------------------------------------------------------------------------------------------------------------------
# Cron (5 fields: minute hour day-of-month month day-of-week), UTC
# ---------------------------------------------------------------------------------------------------------------------

_MONTHS = {
    m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))
}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS: tuple[tuple[str, int, int, Mapping[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed 5-field cron expression. Day-of-week 0 and 7 are Sunday.

    As in cron, when both day-of-month and day-of-week are restricted, a day matches if either matches.
    """

    expr: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    def day_matches(self, d: date) -> bool:
        """True if the schedule fires on calendar day ``d``."""
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return dow
        if self.any_weekday:
            return dom
        return dom or dow

    def matches(self, t: float) -> bool:
        """True if the schedule fires at the minute containing Unix time ``t`` (UTC)."""
        dt = datetime.fromtimestamp(t, tz=UTC)
        return self.day_matches(dt.date()) and dt.hour in self.hours and dt.minute in self.minutes

    def last_fire(self, t: float, horizon_s: float) -> float | None:
        """The latest fire time in ``(t - horizon_s, t]``, or None."""
        limit = t - horizon_s
        dt = datetime.fromtimestamp(t, tz=UTC)
        day = dt.date()
        while True:
            start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
            if start + 86400.0 <= limit:
                return None
            if self.day_matches(day):
                for h in reversed(self.hours):
                    for m in reversed(self.minutes):
                        ts = start + h * 3600.0 + m * 60.0
                        if ts <= t:
                            return ts if ts > limit else None
            if day == date.min:
                return None
            day -= timedelta(days=1)


def _parse_atom(atom: str, lo: int, hi: int, names: Mapping[str, int], where: str, expr: str) -> int:
    key = atom.lower()
    if key in names:
        return names[key]
    try:
        v = int(atom)
    except ValueError:
        raise InputError(
            f"cron {where} value is not a number", where=where, value=expr, fix=f"use {lo}-{hi} (or a name)"
        ) from None
    if not lo <= v <= hi:
        raise InputError(f"cron {where} value {v} out of range", where=where, value=expr, fix=f"use {lo}-{hi}")
    return v


def _parse_field(text: str, lo: int, hi: int, names: Mapping[str, int], where: str, expr: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise InputError(f"empty cron {where} list item", where=where, value=expr, fix="remove the extra comma")
        base, _, step_s = part.partition("/")
        step = 1
        if step_s:
            try:
                step = int(step_s)
            except ValueError:
                step = 0
            if step <= 0:
                raise InputError(f"bad cron {where} step", where=where, value=expr, fix="use a positive step")
        if base == "*":
            first, last = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            first = _parse_atom(a, lo, hi, names, where, expr)
            last = _parse_atom(b, lo, hi, names, where, expr)
            if first > last:
                raise InputError(f"cron {where} range is reversed", where=where, value=expr, fix="write low-high")
        else:
            first = _parse_atom(base, lo, hi, names, where, expr)
            last = hi if step_s else first
        out.update(range(first, last + 1, step))
    return out


@lru_cache(maxsize=256)
def parse_cron(expr: str, where: str = "schedule") -> CronSchedule:
    """Parse a 5-field cron expression (``*``, lists, ranges, steps, month/day names, ``@daily``-style macros).

    Raises :class:`~gpuscale.errors.InputError` naming ``where`` and the fix for a malformed expression.
    """
    text = _MACROS.get(expr.strip().lower(), expr.strip())
    fields = text.split()
    if len(fields) != 5:
        raise InputError(
            f"cron expression needs 5 fields, got {len(fields)}",
            where=where,
            value=expr,
            fix='write "minute hour day-of-month month day-of-week", e.g. "0 9 * * 1-5"',
        )
    parsed = [
        _parse_field(f, lo, hi, names, f"{where} ({name})", expr)
        for f, (name, lo, hi, names) in zip(fields, _FIELDS, strict=True)
    ]
    weekdays = frozenset(d % 7 for d in parsed[4])
    return CronSchedule(
        expr=expr,
        minutes=tuple(sorted(parsed[0])),
        hours=tuple(sorted(parsed[1])),
        days=frozenset(parsed[2]),
        months=frozenset(parsed[3]),
        weekdays=weekdays,
        any_day=fields[2] == "*",
        any_weekday=fields[4] == "*",
    )


# ---------------------------------------------------------------------------------------------------------------------
# Budgets
# ---------------------------------------------------------------------------------------------------------------------


class DisruptionReason(StrEnum):
    """Why a node is disrupted (the values budgets' ``reasons`` refer to)."""

    EMPTY = "Empty"
    UNDERUTILIZED = "Underutilized"
    DRIFTED = "Drifted"


def budget_limit(budget: DisruptionBudget, total_nodes: int, where: str = "budget.nodes") -> int:
    """How many of ``total_nodes`` the budget lets be disrupted at once (a percentage rounds up)."""
    text = str(budget.nodes).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return math.ceil(total_nodes * pct / 100.0 - 1e-9)
        n = int(text)
        if n < 0:
            raise ValueError
        return n
    except ValueError:
        raise InputError(
            "disruption budget nodes must be a non-negative integer or a percentage 0-100%",
            where=where,
            value=budget.nodes,
            fix='write e.g. nodes: "2" or nodes: "10%"',
        ) from None


def budget_active(budget: DisruptionBudget, now: float, where: str = "budget") -> bool:
    """True if the budget applies at ``now``: always without a schedule, else within ``duration_s`` of a hit."""
    if budget.schedule is None:
        return True
    if budget.duration_s is None or budget.duration_s <= 0:
        raise InputError(
            "a disruption budget with a schedule needs a positive duration",
            where=f"{where}.duration",
            value=budget.duration_s,
            fix='add e.g. duration: "8h"',
        )
    cron = parse_cron(budget.schedule, f"{where}.schedule")
    return cron.last_fire(now, budget.duration_s) is not None


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """How many more nodes may be disrupted for a reason, and which budget decided it (None: unlimited)."""

    allowed: int | None
    budget: DisruptionBudget | None = None


def allowed_disruptions(
    pool: NodePool, reason: DisruptionReason, total_nodes: int, disrupting: int, now: float
) -> BudgetVerdict:
    """The most restrictive active budget of ``pool`` for ``reason`` minus nodes already being disrupted."""
    best: BudgetVerdict = BudgetVerdict(None)
    for i, b in enumerate(pool.disruption.budgets):
        where = f"pool {pool.name}: disruption.budgets[{i}]"
        if b.reasons and str(reason) not in b.reasons:
            continue
        if not budget_active(b, now, where):
            continue
        left = max(0, budget_limit(b, total_nodes, f"{where}.nodes") - disrupting)
        if best.allowed is None or left < best.allowed:
            best = BudgetVerdict(left, b)
    return best


# ---------------------------------------------------------------------------------------------------------------------
# Pool offerings (what a pool could launch now)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolOffering:
    """One offering a pool may launch, with the node it would produce."""

    pool: NodePool
    instance_type: InstanceType
    offering: Offering
    labels: Mapping[str, str]
    allocatable: Resources

    @property
    def key(self) -> OfferingKey:
        """The offering's key (type, zone, capacity type)."""
        return OfferingKey(self.instance_type.name, self.offering.zone, self.offering.capacity_type)

    @property
    def price(self) -> float:
        """$/h of one node."""
        return self.offering.hourly_price


def pool_offerings(
    pool: NodePool,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float] | None = None,
    capacity_types: Collection[CapacityType] | None = None,
) -> list[PoolOffering]:
    """The pool's launchable offerings, cheapest first: allowed types, requirements, zones and capacity types,
    available in the catalog and not marked unavailable past ``now``. ``capacity_types`` overrides the pool's.

    Memoised per (pool, catalog) objects, capacity types and the offerings unavailable at ``now``."""
    unavailable = unavailable or {}
    values = (
        tuple(capacity_types) if capacity_types is not None else None,
        frozenset((k, t) for k, t in unavailable.items() if t > now),
    )
    found = _OFFERINGS.get(
        lambda: tuple(_pool_offerings(pool, catalog, now, unavailable, capacity_types)), values, objects=(pool, catalog)
    )
    return list(found)


_OFFERINGS: Memo[tuple[PoolOffering, ...]] = Memo(1024)


def _pool_offerings(
    pool: NodePool,
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
    capacity_types: Collection[CapacityType] | None,
) -> list[PoolOffering]:
    cts = set(capacity_types if capacity_types is not None else pool.capacity_types)
    out: list[PoolOffering] = []
    for t in pool_templates(pool, catalog):
        off = t.offering
        if not off.available or (cts and off.capacity_type not in cts):
            continue
        if unavailable and unavailable.get(OfferingKey(t.itype.name, off.zone, off.capacity_type), -math.inf) > now:
            continue
        out.append(PoolOffering(pool, t.itype, off, t.labels, t.alloc))
    out.sort(
        key=lambda po: (po.price, -pool.weight, po.instance_type.name, po.offering.zone, po.offering.capacity_type)
    )
    return out


SPOT_FALLBACK_LABEL = "gpuscale.io/spot-fallback"
"""Set to ``"true"`` on an on-demand node launched because spot capacity was unavailable (it drifts back to spot)."""


def is_spot_fallback(node: Node, pool: NodePool) -> bool:
    """True for an on-demand node launched as a spot fallback in a pool that wants spot."""
    return (
        node.labels.get(SPOT_FALLBACK_LABEL) == "true"
        and node.labels.get(L.CAPACITY_TYPE) == str(CapacityType.ON_DEMAND)
        and CapacityType.SPOT in pool.capacity_types
    )


def conforms(node: Node, pool: NodePool) -> str | None:
    """None if the node still matches its pool's spec, else a sentence naming what drifted."""
    if is_spot_fallback(node, pool):
        return f"on-demand node launched as a spot fallback; pool {pool.name} prefers spot"
    it = node.labels.get(L.INSTANCE_TYPE)
    if pool.instance_types and it is not None and it not in pool.instance_types:
        return f"instance type {it} is no longer allowed by pool {pool.name}"
    zone = node.labels.get(L.ZONE)
    if pool.zones and zone is not None and zone not in pool.zones:
        return f"zone {zone} is no longer allowed by pool {pool.name}"
    ct = node.labels.get(L.CAPACITY_TYPE)
    if pool.capacity_types and ct is not None and ct not in {str(c) for c in pool.capacity_types}:
        return f"capacity type {ct} is not one of pool {pool.name}'s ({', '.join(map(str, pool.capacity_types))})"
    return None


def node_price(node: Node, catalog: Catalog) -> float:
    """$/h of a node: from the catalog offering its labels name, else the node's own ``hourly_cost``."""
    it = catalog.by_name().get(node.labels.get(L.INSTANCE_TYPE, ""))
    if it is not None:
        zone, ct = node.labels.get(L.ZONE), node.labels.get(L.CAPACITY_TYPE)
        for off in it.offerings:
            if off.zone == zone and str(off.capacity_type) == ct:
                return off.hourly_price
    return node.hourly_cost


# ---------------------------------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget:
    """A PDB: pods matching ``selector`` in ``namespace`` may lose at most ``max_unavailable`` at once."""

    name: str
    namespace: str
    selector: Mapping[str, str]
    max_unavailable: int = 0

    def matches(self, pod: Pod) -> bool:
        """True if the PDB selects ``pod``."""
        return pod.namespace == self.namespace and all(pod.labels.get(k) == v for k, v in self.selector.items())


def pdb_allowances(pdbs: Iterable[PodDisruptionBudget], pods: Iterable[Pod]) -> dict[str, int]:
    """Evictions each PDB (``namespace/name``) still allows: ``max_unavailable`` minus its pods not running now."""
    pods = tuple(pods)
    out: dict[str, int] = {}
    for pdb in pdbs:
        down = sum(1 for p in pods if pdb.matches(p) and p.node_name is None and p.phase == "Pending")
        out[f"{pdb.namespace}/{pdb.name}"] = max(0, pdb.max_unavailable - down)
    return out


DO_NOT_DISRUPT_VALUES = frozenset({"true", "True", "TRUE", "1", "yes"})


def do_not_disrupt(pod: Pod) -> bool:
    """True if the pod carries ``gpuscale.io/do-not-disrupt: "true"``."""
    return pod.annotations.get(L.DO_NOT_DISRUPT_ANNOTATION, "") in DO_NOT_DISRUPT_VALUES


class ActionKind(StrEnum):
    """What to do with a node."""

    DELETE = "Delete"
    REPLACE = "Replace"


class KeepReason(StrEnum):
    """Why a candidate node is kept."""

    WAITING = "ConsolidateAfter"
    DO_NOT_DISRUPT = "DoNotDisrupt"
    PDB = "PodDisruptionBudget"
    MIN_NODES = "MinNodes"
    BUDGET = "DisruptionBudget"
    PODS_DO_NOT_FIT = "PodsDoNotFit"
    NO_REPLACEMENT = "NoCheaperReplacement"


@dataclass(frozen=True, slots=True)
class Replacement:
    """One new node a replaced node's remaining pods go to (``pods``: those planned onto it)."""

    pool: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    hourly_price: float
    allocatable: Resources
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DisruptionAction:
    """Delete or replace ``node``; ``pods`` are the workload pods to evict."""

    kind: ActionKind
    node: str
    pool: str
    reason: DisruptionReason
    message: str
    pods: tuple[str, ...] = ()
    replacements: tuple[Replacement, ...] = ()
    """The new nodes of a REPLACE: usually one; several when splitting the pods over smaller nodes is cheaper."""
    savings_per_hour: float = 0.0

    @property
    def replacement(self) -> Replacement | None:
        """The first (usually only) new node of a REPLACE; None for a DELETE."""
        return self.replacements[0] if self.replacements else None


@dataclass(frozen=True, slots=True)
class Kept:
    """A candidate node that stays, and why."""

    node: str
    pool: str
    reason: KeepReason
    message: str
    candidate: DisruptionReason | None = None


@dataclass(frozen=True, slots=True)
class DisruptionPlan:
    """Actions to take now, candidates kept with their reason, and the updated candidate-since map."""

    actions: tuple[DisruptionAction, ...] = ()
    kept: tuple[Kept, ...] = ()
    since: Mapping[str, float] = field(default_factory=dict)


def _workload(pods: Iterable[Pod]) -> list[Pod]:
    return [p for p in pods if not p.is_daemonset]


def _live(p: Pod) -> bool:
    return p.phase in ("Pending", "Running") or p.phase == ""


def free_room(node: Node, pods: Iterable[Pod]) -> tuple[int, int, int, int]:
    """(CPU milli, memory MiB, milli-GPU over all GPUs, pod slots) left on ``node`` by ``pods``' requests; negative
    when the node is overcommitted. A per-node total: an upper bound on what one more pod can get."""
    cpu = mem = gpu = count = 0
    for p in pods:
        cpu += p.request.cpu_milli
        mem += p.request.memory_mib
        gpu += p.request.gpu_demand_milli
        count += 1
    a = node.allocatable
    return a.cpu_milli - cpu, a.memory_mib - mem, a.gpus * MILLI_PER_GPU - gpu, a.pods - count


def request_share(node: Node, pods: Sequence[Pod]) -> float:
    """Requested share of the node: GPU share on GPU nodes, else the larger of CPU and memory share."""
    a = node.allocatable
    if a.gpus > 0:
        return sum(p.request.gpu_demand_milli for p in pods) / (a.gpus * MILLI_PER_GPU)
    cpu = sum(p.request.cpu_milli for p in pods) / a.cpu_milli if a.cpu_milli else 0.0
    mem = sum(p.request.memory_mib for p in pods) / a.memory_mib if a.memory_mib else 0.0
    return max(cpu, mem)


def _classify(
    node: Node, pool: NodePool, pods: Sequence[Pod], utilization: Mapping[str, float]
) -> tuple[DisruptionReason, str] | None:
    drift = conforms(node, pool)
    if drift is not None:
        return DisruptionReason.DRIFTED, drift
    if not pods:
        return DisruptionReason.EMPTY, "no workload pods"
    if node.allocatable.gpus > 0 and not any(p.request.wants_gpu for p in pods):
        return DisruptionReason.EMPTY, f"GPU node runs only CPU-only pods ({len(pods)})"
    d = pool.disruption
    if d.consolidation_policy is not ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED:
        return None
    share = request_share(node, pods)
    if share >= d.utilization_threshold:
        return None
    msg = f"requests use {share:.0%} of the node (threshold {d.utilization_threshold:.0%})"
    if d.use_measured_gpu_utilization and node.allocatable.gpus > 0 and node.name in utilization:
        measured = utilization[node.name]
        if measured >= d.utilization_threshold:
            return None
        msg += f", measured GPU utilisation {measured:.0%}"
    return DisruptionReason.UNDERUTILIZED, msg


def classify_node(
    node: Node, pool: NodePool, pods: Sequence[Pod], utilization: Mapping[str, float] | None = None
) -> DisruptionReason | None:
    """Why ``node`` (of ``pool``, running ``pods``) is a disruption candidate (empty, drifted, underutilised), or None.

    The cheap first step of :func:`plan_disruption`, which callers use to start ``consolidateAfter`` clocks without
    simulating anything."""
    cls = _classify(node, pool, _workload(p for p in pods if _live(p)), utilization or {})
    return cls[0] if cls is not None else None


def _sort_pods(pods: Iterable[Pod]) -> list[Pod]:
    return sorted(pods, key=lambda p: (-p.request.gpu_demand_milli, -p.request.cpu_milli, -p.request.memory_mib, p.key))


@dataclass(slots=True)
class _Sim:
    """Free capacity of the destination nodes, with a mask of rows that may take pods."""

    nodes: list[Node]
    state: ClusterState
    usable: np.typing.NDArray[np.bool_]
    received: set[int] = field(default_factory=set)
    """Rows that took pods from a node disrupted this round (no longer candidates this round)."""

    def fit_elsewhere(self, pods: Sequence[Pod], exclude: int) -> tuple[ClusterState, list[Pod], set[int]]:
        """Place ``pods`` best-fit on usable rows other than ``exclude``.

        Returns the new state, the pods left over and the rows that received pods.
        """
        dests: set[int] = set()
        st = self.state.copy()
        mask = self.usable.copy()
        if exclude >= 0:
            mask[exclude] = False
        left: list[Pod] = []
        for pod in _sort_pods(pods):
            ok = st.fits(pod.request) & mask
            rows = np.flatnonzero(ok)
            rows = np.array(
                [r for r in rows if static_fit(pod, self.nodes[r].labels, self.nodes[r].taints) is None],
                dtype=np.int64,
            )
            if rows.size == 0:
                left.append(pod)
                continue
            best = _best_fit(st, pod.request, rows)
            st.place(pod.request, best)
            dests.add(best)
        return st, left, dests


def _best_fit(st: ClusterState, req: Request, rows: np.typing.NDArray[np.int64]) -> int:
    gcap = np.maximum(st.gpu_cap[rows] * MILLI_PER_GPU, 1)
    score = (
        (st.cpu_free[rows] - req.cpu_milli) / np.maximum(st.cpu_cap[rows], 1)
        + (st.mem_free[rows] - req.memory_mib) / np.maximum(st.mem_cap[rows], 1)
        + (st.gpu_free_milli[rows] - req.gpu_demand_milli) / gcap
    )
    return int(rows[int(np.argmin(score))])


def _fits_one_node(pods: Sequence[Pod], labels: Mapping[str, str], taints: tuple[Taint, ...], alloc: Resources) -> bool:
    if (
        sum(p.request.cpu_milli for p in pods) > alloc.cpu_milli
        or sum(p.request.memory_mib for p in pods) > alloc.memory_mib
        or len(pods) > alloc.pods
        or sum(p.request.gpu_demand_milli for p in pods) > alloc.gpus * MILLI_PER_GPU
    ):
        return False
    if any(static_fit(p, labels, taints) is not None for p in pods):
        return False
    st = ClusterState([NodeShape("new", alloc, labels.get(L.GPU_PRODUCT))])
    for p in _sort_pods(pods):
        if not st.fits_one(p.request, 0):
            return False
        st.place(p.request, 0)
    return True


def plan_disruption(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    pools: Sequence[NodePool],
    catalog: Catalog,
    now: float,
    *,
    since: Mapping[str, float] | None = None,
    candidates: Collection[str] | None = None,
    disrupting: Collection[str] = (),
    protected: Collection[str] = (),
    pdbs: Sequence[PodDisruptionBudget] = (),
    utilization: Mapping[str, float] | None = None,
    unavailable: Mapping[OfferingKey, float] | None = None,
    allow_replace: bool = True,
) -> DisruptionPlan:
    """Decide which nodes to delete or replace now (see the module docstring for the rules).

    ``nodes``/``pods`` are the whole cluster (launching nodes included, marked ``launching``). ``candidates``
    restricts which nodes may be disrupted (None: every non-launching, schedulable node of a pool in ``pools``);
    ``disrupting`` names nodes already being drained or deleted (they count against budgets and take no pods);
    ``protected`` names nodes that must be kept this round (e.g. pending pods were just planned onto them).
    ``since`` maps node names to the time they became candidates; the result carries the updated map.
    ``allow_replace=False`` only ever deletes (a node whose pods do not all fit elsewhere is kept).
    """
    since = since or {}
    utilization = utilization or {}
    pool_by_name = {p.name: p for p in pools}
    disrupting_set = set(disrupting)
    live = [p for p in pods if _live(p)]
    by_node: dict[str, list[Pod]] = {}
    for p in live:
        if p.node_name is not None:
            by_node.setdefault(p.node_name, []).append(p)

    dest = [n for n in nodes if not n.launching and not n.unschedulable and n.name not in disrupting_set]
    row: dict[str, int] = {}  # simulated destination rows, by node name (filled when the simulation is built)
    lazy: list[_Sim] = []
    removed: set[str] = set()
    # Free room per destination and in total: an upper bound that rules out most hopeless moves without simulating.
    free_of = {n.name: free_room(n, by_node.get(n.name, ())) for n in dest}
    total = [0, 0, 0, 0]
    for f in free_of.values():
        for dim in range(4):
            if f[dim] > 0:
                total[dim] += f[dim]
    free_total = tuple(total)

    def may_fit_elsewhere(n: Node, wl: Sequence[Pod]) -> bool:
        own = free_of.get(n.name, (0, 0, 0, 0))
        need = (
            sum(p.request.cpu_milli for p in wl),
            sum(p.request.memory_mib for p in wl),
            sum(p.request.gpu_demand_milli for p in wl),
            len(wl),
        )
        return all(need[k] <= free_total[k] - max(0, own[k]) for k in range(4))

    receivers: list[list[tuple[Node, tuple[int, int, int, int]]]] = []

    def may_receive() -> list[tuple[Node, tuple[int, int, int, int]]]:
        """The destinations that might take a candidate's pod, with their room before this pass (free CPU, memory,
        entirely free GPUs, largest free GPU share).

        A node without the CPU, memory or pod slot the smallest candidate pod needs never takes a pod this pass (room
        only shrinks), so it is left out; the order of the others (which breaks ties) is kept."""
        if not receivers:
            movers = [p.request for c in cands for p in c[-1]]
            lo_cpu = min((r.cpu_milli for r in movers), default=0)
            lo_mem = min((r.memory_mib for r in movers), default=0)
            out = []
            for n in dest:
                f = free_of[n.name]
                if f[3] >= 1 and max(0, f[0]) >= lo_cpu and max(0, f[1]) >= lo_mem:
                    gpus = gpu_room(n.allocatable.gpus, [p.request for p in by_node.get(n.name, ())])
                    out.append((n, (max(0, f[0]), max(0, f[1]), *gpus)))
            receivers.append(out)
        return receivers[0]

    def any_may_move(n: Node, wl: Sequence[Pod]) -> bool:
        """False if no pod of ``wl`` fits any other destination even before this pass took room (then simulating
        would move none of them)."""
        for p in wl:
            for m, (cpu, mem, full, top) in may_receive():
                if (
                    m.name != n.name
                    and fits_room(p.request, cpu, mem, 1, full, top, m.gpu_model)
                    and static_fit(p, m.labels, m.taints) is None
                ):
                    return True
        return False

    def simulation() -> _Sim:
        """The destination nodes' free capacity (built only once a candidate passes the cheap checks)."""
        if not lazy:
            rows = [n for n, _ in may_receive()]
            row.update((n.name, i) for i, n in enumerate(rows))
            state = ClusterState([NodeShape(n.name, n.allocatable, n.gpu_model) for n in rows])
            state.occupy_all([[p.request for p in by_node.get(n.name, ())] for n in rows])
            usable = np.ones(len(rows), dtype=bool)
            usable[[row[name] for name in removed if name in row]] = False
            lazy.append(_Sim(rows, state, usable))
        return lazy[0]

    # Classify.
    new_since: dict[str, float] = {}
    cands: list[tuple[int, float, float, str, Node, NodePool, DisruptionReason, str, list[Pod]]] = []
    for n in dest:
        pool = pool_by_name.get(n.pool or "")
        if pool is None or (candidates is not None and n.name not in candidates):
            continue
        wl = _workload(by_node.get(n.name, ()))
        cls = _classify(n, pool, wl, utilization)
        if cls is None:
            continue
        reason, msg = cls
        new_since[n.name] = since.get(n.name, now)
        order = {DisruptionReason.EMPTY: 0, DisruptionReason.DRIFTED: 1, DisruptionReason.UNDERUTILIZED: 2}[reason]
        price = node_price(n, catalog)
        cands.append((order, request_share(n, wl), -price, n.name, n, pool, reason, msg, wl))
    cands.sort(key=lambda c: c[:4])

    # Budgets and counts per pool.
    counts: dict[str, int] = {}
    totals_all: dict[str, int] = {}
    disrupting_by_pool: dict[str, int] = {}
    for n in nodes:
        if n.launching or n.pool is None:
            continue
        totals_all[n.pool] = totals_all.get(n.pool, 0) + 1
        if n.name in disrupting_set:
            disrupting_by_pool[n.pool] = disrupting_by_pool.get(n.pool, 0) + 1
        else:
            counts[n.pool] = counts.get(n.pool, 0) + 1
    market = _Market(tuple(pools), catalog, now, unavailable or {}, nodes)

    pdb_left = pdb_allowances(pdbs, live)
    pdb_of = {f"{b.namespace}/{b.name}": b for b in pdbs}

    actions: list[DisruptionAction] = []
    kept: list[Kept] = []

    def keep(n: Node, pool: NodePool, why: KeepReason, msg: str, cand: DisruptionReason) -> None:
        kept.append(Kept(n.name, pool.name, why, msg, cand))

    for *_, n, pool, reason, msg, wl in cands:
        if lazy and row.get(n.name, -1) in lazy[0].received:
            continue
        d = pool.disruption
        after = d.wait_s(reason is DisruptionReason.EMPTY)
        if reason is not DisruptionReason.DRIFTED and now - new_since[n.name] < after:
            wait = after - (now - new_since[n.name])
            setting = (
                "consolidateEmptyAfter"
                if reason is DisruptionReason.EMPTY and d.consolidate_empty_after_s is not None
                else "consolidateAfter"
            )
            keep(n, pool, KeepReason.WAITING, f"{reason.value.lower()} ({msg}); {setting} in {wait:.0f}s", reason)
            continue
        if n.name in protected:
            keep(n, pool, KeepReason.PODS_DO_NOT_FIT, "pending pods were just planned onto this node", reason)
            continue
        blocker = next((p for p in wl if do_not_disrupt(p)), None)
        if blocker is not None:
            keep(n, pool, KeepReason.DO_NOT_DISRUPT, f"pod {blocker.key} is annotated do-not-disrupt", reason)
            continue
        need: dict[str, int] = {}
        for p in wl:
            for key, pdb in pdb_of.items():
                if pdb.matches(p):
                    need[key] = need.get(key, 0) + 1
        short = next((k for k, c in need.items() if pdb_left.get(k, 0) < c), None)
        if short is not None:
            keep(
                n,
                pool,
                KeepReason.PDB,
                f"PodDisruptionBudget {short} allows {pdb_left.get(short, 0)} eviction(s)",
                reason,
            )
            continue
        verdict = allowed_disruptions(
            pool, reason, totals_all.get(pool.name, 0), disrupting_by_pool.get(pool.name, 0), now
        )
        if verdict.allowed is not None and verdict.allowed <= 0:
            b = verdict.budget
            what = f"budget nodes={b.nodes}" if b is not None else "budget"
            if b is not None and b.schedule:
                what += f" (schedule {b.schedule!r})"
            keep(n, pool, KeepReason.BUDGET, f"{reason} disruptions of pool {pool.name} exhausted by {what}", reason)
            continue

        if may_fit_elsewhere(n, wl) and any_may_move(n, wl):
            sim = simulation()
            new_state, left, dests = sim.fit_elsewhere(wl, row.get(n.name, -1))
        else:
            new_state, left, dests = None, list(wl), set()
        price = node_price(n, catalog)
        replacements: tuple[Replacement, ...] = ()
        if left and not allow_replace:
            keep(
                n, pool, KeepReason.PODS_DO_NOT_FIT, f"{reason.value.lower()} ({msg}) but its pods fit nowhere", reason
            )
            continue
        if left:
            single = _find_replacement(n, pool, reason, left, price, market)
            replacements = (single,) if single is not None else ()
            if reason is DisruptionReason.UNDERUTILIZED and len(left) > 1:
                split = _split_replacement(n, pool, left, single.hourly_price if single else price, market)
                if split:
                    replacements = split
            if not replacements:
                why = KeepReason.PODS_DO_NOT_FIT if reason is DisruptionReason.DRIFTED else KeepReason.NO_REPLACEMENT
                detail = (
                    "no conforming offering is available for its pods"
                    if reason is DisruptionReason.DRIFTED
                    else f"{len(left)} pod(s) fit neither elsewhere nor on cheaper new nodes"
                )
                keep(n, pool, why, f"{reason.value.lower()} ({msg}) but {detail}", reason)
                continue
        stays_in_pool = any(r.pool == pool.name for r in replacements)
        if not stays_in_pool and counts.get(pool.name, 0) - 1 < pool.min_nodes:
            keep(n, pool, KeepReason.MIN_NODES, f"pool {pool.name} would drop below minNodes={pool.min_nodes}", reason)
            continue

        # Commit.
        if new_state is not None:
            sim = simulation()
            sim.state = new_state
            sim.received |= dests
        removed.add(n.name)
        if lazy and n.name in row:
            lazy[0].usable[row[n.name]] = False
        if not stays_in_pool:
            counts[pool.name] = counts.get(pool.name, 0) - 1
        disrupting_by_pool[pool.name] = disrupting_by_pool.get(pool.name, 0) + 1
        for k, c in need.items():
            pdb_left[k] -= c
        pod_keys = tuple(p.key for p in _sort_pods(wl))
        if not replacements:
            actions.append(
                DisruptionAction(
                    ActionKind.DELETE,
                    n.name,
                    pool.name,
                    reason,
                    f"{reason.value.lower()} ({msg}); "
                    + (f"its {len(wl)} pod(s) fit on other nodes" if wl else "nothing to move"),
                    pod_keys,
                    (),
                    price,
                )
            )
        else:
            for r in replacements:
                market.bought(r)
            new_price = sum(r.hourly_price for r in replacements)
            r0 = replacements[0]
            what = (
                f"{r0.instance_type} {r0.capacity_type} in {r0.zone}"
                if len(replacements) == 1
                else f"{len(replacements)} nodes (" + ", ".join(sorted(r.instance_type for r in replacements)) + ")"
            )
            actions.append(
                DisruptionAction(
                    ActionKind.REPLACE,
                    n.name,
                    pool.name,
                    reason,
                    f"{reason.value.lower()} ({msg}); replace by {what} (${new_price:.4g}/h instead of ${price:.4g}/h)",
                    pod_keys,
                    replacements,
                    price - new_price,
                )
            )
    return DisruptionPlan(tuple(actions), tuple(kept), new_since)


@dataclass(slots=True)
class _Market:
    """The new nodes a disruption pass may still buy: pools, catalog and offerings unavailable at ``now``, with the
    nodes per pool (launching ones included, for ``maxNodes``) and their raw capacity per pool (for ``limits``, as the
    planner and the launcher count it). Replacements decided in the pass are added."""

    pools: tuple[NodePool, ...]
    catalog: Catalog
    now: float
    unavailable: Mapping[OfferingKey, float]
    nodes: Sequence[Node]
    _totals: tuple[dict[str, int], dict[str, Resources]] | None = None

    def _get(self) -> tuple[dict[str, int], dict[str, Resources]]:
        if self._totals is None:
            self._totals = pool_totals(self.nodes, self.catalog)
        return self._totals

    def counts(self) -> dict[str, int]:
        """Nodes per pool."""
        return self._get()[0]

    def capacity(self) -> dict[str, Resources]:
        """Raw capacity per pool."""
        return self._get()[1]

    def bought(self, r: Replacement) -> None:
        """Count a replacement decided in this pass."""
        counts, capacity = self._get()
        counts[r.pool] = counts.get(r.pool, 0) + 1
        cap = replace(self.catalog.by_name()[r.instance_type].capacity, pods=0)
        capacity[r.pool] = capacity.get(r.pool, Resources(pods=0)) + cap


def _split_replacement(
    node: Node, pool: NodePool, pods: Sequence[Pod], ceiling: float, market: _Market
) -> tuple[Replacement, ...]:
    """Two or more new nodes for ``pods`` costing less than ``ceiling`` $/h in all, or () (see module docstring).

    The pods are packed by the scale-up planner's greedy packing (no integer program) into the pools' remaining room
    in ``market``; a spot node is not replaced by spot nodes, and a spot-fallback node only by spot nodes.
    """
    pools, catalog, now, unavailable = market.pools, market.catalog, market.now, market.unavailable
    fallback = is_spot_fallback(node, pool)
    no_spot = node.labels.get(L.CAPACITY_TYPE) == str(CapacityType.SPOT)
    room = _pools_with_room(pools, market.counts(), market.capacity(), fallback, no_spot)
    if not room:
        return ()
    values = (
        tuple((p.key, p.request, tuple(sorted(p.node_selector.items())), p.affinity, p.tolerations) for p in pods),
        frozenset((k, t) for k, t in unavailable.items() if t > now),
    )
    found = _SPLITS.get(lambda: _pack_split(pods, room, catalog, now, unavailable), values, objects=(*room, catalog))
    if len(found) < 2 or sum(r.hourly_price for r in found) >= ceiling - 1e-9:
        return ()
    return found


_SPLITS: Memo[tuple[Replacement, ...]] = Memo(1024)
"""Split packings by (pods and their scheduling shapes, unavailable offerings, pools, catalog)."""


def _pools_with_room(
    pools: Sequence[NodePool],
    counts: Mapping[str, int],
    capacity: Mapping[str, Resources],
    only_spot: bool,
    no_spot: bool,
) -> tuple[NodePool, ...]:
    """The pools as the planner should see them for new nodes: room left under maxNodes (less ``counts``) and limits
    (less the raw ``capacity`` already used), capacity types restricted. Pools needing no change are passed as they
    are (the planner memoises per pool object)."""
    out: list[NodePool] = []
    for p in pools:
        changes: dict[str, Any] = {}
        if p.max_nodes is not None:
            left = p.max_nodes - counts.get(p.name, 0)
            if left <= 0:
                continue
            changes["max_nodes"] = left
        lim = p.limits
        if p.limits.bounded:
            used = capacity.get(p.name, Resources(pods=0))
            changes["limits"] = PoolLimits(
                None if lim.cpu_milli is None else lim.cpu_milli - used.cpu_milli,
                None if lim.memory_mib is None else lim.memory_mib - used.memory_mib,
                None if lim.gpus is None else lim.gpus - used.gpus,
            )
        if only_spot or no_spot:
            types = p.capacity_types or tuple(CapacityType)
            types = tuple(t for t in types if (t is CapacityType.SPOT) == only_spot) if only_spot else types
            types = tuple(t for t in types if t is not CapacityType.SPOT) if no_spot else types
            if not types:
                continue
            changes["capacity_types"] = types
        out.append(_derived(p, changes) if changes else p)
    return tuple(out)


def _derived(pool: NodePool, changes: dict[str, Any]) -> NodePool:
    """``replace(pool, **changes)``, the same object for the same changes (so the planner's per-pool memos hold)."""
    return _DERIVED.get(lambda: replace(pool, **changes), tuple(sorted(changes.items())), objects=(pool,))


_DERIVED: Memo[NodePool] = Memo(1024)


def _pack_split(
    pods: Sequence[Pod],
    pools: tuple[NodePool, ...],
    catalog: Catalog,
    now: float,
    unavailable: Mapping[OfferingKey, float],
) -> tuple[Replacement, ...]:
    """The planner's greedy new nodes for ``pods`` (every pod placed), as replacements; () if some pod is left."""
    from gpuscale.core.planner import plan  # the planner does not import this module

    snap = Snapshot(
        pods=tuple(replace(p, node_name=None, phase="Pending") for p in pods),
        pools=pools,
        catalog=catalog,
        unavailable=unavailable,
    )
    result = plan(snap, PlannerConfig(exact_solver=False), now)
    if result.blocked or len(result.placements) != len(pods):
        return ()
    by_node: dict[str, list[str]] = {}
    for pod_key, where in result.placements.items():
        by_node.setdefault(where, []).append(pod_key)
    launch_of = {launch.id: launch for launch in result.launches}
    pool_of = {p.name: p for p in pools}
    types = catalog.by_name()
    out: list[Replacement] = []
    for where in sorted(by_node):
        launch = launch_of.get(where.rsplit("/", 1)[0])
        if launch is None:
            return ()
        per_node = launch.hourly_cost / launch.count
        alloc = template_allocatable(pool_of[launch.pool], types[launch.instance_type])
        out.append(
            Replacement(
                launch.pool,
                launch.instance_type,
                launch.zone,
                launch.capacity_type,
                per_node,
                alloc,
                tuple(sorted(by_node[where])),
            )
        )
    return tuple(out)


def _find_replacement(
    node: Node,
    pool: NodePool,
    reason: DisruptionReason,
    pods: Sequence[Pod],
    price: float,
    market: _Market,
) -> Replacement | None:
    """The cheapest single node for ``pods`` (see module docstring), or None."""
    pools, catalog, now, unavailable = market.pools, market.catalog, market.now, market.unavailable
    counts, capacity = market.counts(), market.capacity()
    drifted = reason is DisruptionReason.DRIFTED
    node_is_spot = node.labels.get(L.CAPACITY_TYPE) == str(CapacityType.SPOT)
    only: tuple[CapacityType, ...] | None = (CapacityType.SPOT,) if is_spot_fallback(node, pool) else None
    best: PoolOffering | None = None
    for cand_pool in [pool] if drifted else sorted(pools, key=lambda p: (-p.weight, p.name)):
        if cand_pool.max_nodes is not None and counts.get(cand_pool.name, 0) + 1 > cand_pool.max_nodes:
            continue
        for po in pool_offerings(cand_pool, catalog, now, unavailable, only):
            if best is not None and po.price >= best.price:
                break
            if not drifted:
                if po.price >= price:
                    break
                if node_is_spot and po.offering.capacity_type is CapacityType.SPOT:
                    continue
            used = capacity.get(cand_pool.name, Resources(pods=0)) + po.instance_type.capacity
            if not cand_pool.limits.allows(used):
                continue
            if _fits_one_node(pods, po.labels, cand_pool.taints, po.allocatable):
                best = po
                break
    if best is None:
        return None
    return Replacement(
        best.pool.name,
        best.instance_type.name,
        best.offering.zone,
        best.offering.capacity_type,
        best.price,
        best.allocatable,
        tuple(p.key for p in _sort_pods(pods)),
    )
