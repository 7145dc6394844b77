"""The scale-up planner: ``plan(snapshot, config, now) -> ScaleUpPlan``.

Pending pods are placed, in priority order, on existing nodes first, then on nodes already being launched, then on
new nodes. New nodes are chosen by a greedy, cost-aware packer over equivalence classes of identical pods:

1. Every (pool, instance type, zone, capacity type) the catalog offers is an *option* with a node template (labels,
   taints, allocatable). A class's feasible options are those whose template passes the class's label and taint
   predicates and whose allocatable holds one pod.
2. Repeatedly take the first class with pods left; for each of its feasible options (only pools with the highest
   weight that still have headroom) fill one fresh node with that class first, then with every other class that fits
   (per-GPU milli accounting for fractions). Score = $/h ÷ value packed, where a class's value is its cheapest
   stand-alone cost per pod; the lowest score wins. The winning pattern is repeated while the pods last, within the
   pool's ``maxNodes`` and ``limits``.
3. Optionally an integer program over the patterns (HiGHS via SciPy, wall-clock limited) re-optimises the new nodes;
   its plan is used only when it is cheaper, so the plan never costs more than the greedy one.

Gangs (``gpuscale.io/gang`` + ``gpuscale.io/gang-size``) are planned first, all-or-nothing, in a transaction. Every
pending pod left without a node gets a :class:`~gpuscale.core.plan.Blocked` reason naming the blocking requirement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpuscale.core.memo import Memo
from gpuscale.core.model import InstanceType, Node, NodePool, Offering, OfferingKey, Pod, Snapshot, Taint
from gpuscale.core.plan import Blocked, BlockReason, Launch, PlannerConfig, ScaleUpPlan
from gpuscale.core.predicates import FitFailure, FitFailureKind, static_failure
from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources
from gpuscale.core.scoring import Scorer, Workload, make_scorer, select
from gpuscale.core.state import ClusterState, IntArray, NodeShape
from gpuscale.core.templates import pool_templates, pool_totals

EPS = 1e-9


# ----------------------------------------------------------------------------------------------------------- options
@dataclass(frozen=True, slots=True)
class Option:
    """One way to buy a node: pool × instance type × offering, with the node template it yields."""

    index: int
    pool: NodePool
    itype: InstanceType
    offering: Offering
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    alloc: Resources
    unavailable_until: float | None
    """None if the offering can be bought now; else until when it cannot (``inf`` for "marked unavailable")."""

    @property
    def price(self) -> float:
        return self.offering.hourly_price

    @property
    def sort_key(self) -> tuple[float, str, str, str, str]:
        return (self.price, self.pool.name, self.itype.name, self.offering.zone, str(self.offering.capacity_type))


def build_options(snapshot: Snapshot, now: float) -> list[Option]:
    """Every option of every pool, sorted by price then names (deterministic)."""
    return list(option_table(snapshot, now))


def option_table(snapshot: Snapshot, now: float) -> tuple[Option, ...]:
    """:func:`build_options` as a shared tuple, memoised per (pools, catalog) objects and the offerings unavailable
    at ``now`` (a controller asks again and again with the same pools); the same tuple object while memoised."""
    blocked = frozenset((k, v) for k, v in snapshot.unavailable.items() if v > now)
    return _OPTIONS.get(
        lambda: tuple(_build_options(snapshot, now)), blocked, objects=(*snapshot.pools, snapshot.catalog)
    )


_OPTIONS: Memo[tuple[Option, ...]] = Memo(256)
_CLASS_OPTIONS: Memo[tuple[list[int], list[int], float]] = Memo(4096)
"""Per (class key, option table), the same for every plan: the indices of the options the class may use, how many of
its pods fit an empty node of each, and its reference cost (see :meth:`Planner.ref_cost`)."""


def _build_options(snapshot: Snapshot, now: float) -> list[Option]:
    out: list[Option] = []
    for pool in sorted(snapshot.pools, key=lambda p: p.name):
        for t in pool_templates(pool, snapshot.catalog):
            off = t.offering
            if pool.capacity_types and off.capacity_type not in pool.capacity_types:
                continue
            until = snapshot.unavailable.get(OfferingKey(t.itype.name, off.zone, off.capacity_type))
            blocked_until: float | None = None
            if not off.available:
                blocked_until = math.inf
            elif until is not None and until > now:
                blocked_until = until
            out.append(Option(0, pool, t.itype, off, t.labels, pool.taints, t.alloc, blocked_until))
    out.sort(key=lambda o: o.sort_key)
    return [
        Option(i, o.pool, o.itype, o.offering, o.labels, o.taints, o.alloc, o.unavailable_until)
        for i, o in enumerate(out)
    ]


# --------------------------------------------------------------------------------------------------------- a new node
class Bin:
    """Free capacity of one new node while it is being filled (per-GPU milli-GPU)."""

    __slots__ = ("cpu", "full", "gpus", "mem", "model", "pods", "room")

    def __init__(self, alloc: Resources, model: str | None) -> None:
        self.cpu = alloc.cpu_milli
        self.mem = alloc.memory_mib
        self.pods = alloc.pods
        self.gpus = [MILLI_PER_GPU] * alloc.gpus
        self.full = alloc.gpus
        """Entirely free GPUs."""
        self.room = alloc.gpus * MILLI_PER_GPU
        """Free milli-GPU over all GPUs."""
        self.model = model

    def has_gpu_room(self) -> bool:
        """True if any GPU has free milli-GPU."""
        return self.room > 0

    def fit_count(self, req: Request, limit: int) -> int:
        """How many pods of ``req`` fit (at most ``limit``)."""
        if req.wants_gpu and req.gpu_models is not None and self.model not in req.gpu_models:
            return 0
        n = min(limit, self.pods)
        if req.cpu_milli:
            n = min(n, self.cpu // req.cpu_milli)
        if req.memory_mib:
            n = min(n, self.mem // req.memory_mib)
        if req.gpus:
            n = min(n, self.full // req.gpus)
        elif req.gpu_milli and n > 0:
            n = min(n, sum(g // req.gpu_milli for g in self.gpus))
        return max(0, n)

    def add(self, req: Request, n: int) -> None:
        """Place ``n`` pods of ``req`` (the caller checked ``fit_count``)."""
        self.cpu -= req.cpu_milli * n
        self.mem -= req.memory_mib * n
        self.pods -= n
        if req.gpus:
            need = req.gpus * n
            for i, g in enumerate(self.gpus):
                if not need:
                    break
                if g == MILLI_PER_GPU:
                    self.gpus[i] = 0
                    need -= 1
            self.full -= req.gpus * n
            self.room -= req.gpus * n * MILLI_PER_GPU
        elif req.gpu_milli:
            left = n
            for i in sorted(range(len(self.gpus)), key=lambda j: (self.gpus[j], j)):
                take = min(left, self.gpus[i] // req.gpu_milli)
                if take:
                    if self.gpus[i] == MILLI_PER_GPU:
                        self.full -= 1
                    self.gpus[i] -= take * req.gpu_milli
                    left -= take
                if not left:
                    break
            self.room -= req.gpu_milli * n


def solo_count(opt: Option, req: Request, limit: int = 1 << 30) -> int:
    """How many pods of ``req`` fit on an empty node of ``opt``."""
    a = opt.alloc
    if req.wants_gpu and req.gpu_models is not None and opt.itype.gpu_model not in req.gpu_models:
        return 0
    n = min(limit, a.pods)
    if req.cpu_milli:
        n = min(n, a.cpu_milli // req.cpu_milli)
    if req.memory_mib:
        n = min(n, a.memory_mib // req.memory_mib)
    if req.gpus:
        n = min(n, a.gpus // req.gpus)
    elif req.gpu_milli:
        n = min(n, a.gpus * (MILLI_PER_GPU // req.gpu_milli))
    return max(0, n)


# ---------------------------------------------------------------------------------------------------------- classes
@dataclass(slots=True)
class PodClass:
    """Pods identical for scheduling: same request, selectors, affinity and tolerations."""

    index: int
    example: Pod
    pods: list[Pod] = field(default_factory=list)
    key: tuple[object, ...] = ()
    """:func:`class_key` of the pods."""

    @property
    def request(self) -> Request:
        return self.example.request


def referenced_keys(pod: Pod) -> tuple[str, ...]:
    """Label keys the pod's node selector and required affinity look at (sorted)."""
    keys = set(pod.node_selector)
    for term in pod.affinity:
        keys.update(r.key for r in term.requirements)
    return tuple(sorted(keys))


def class_key(pod: Pod) -> tuple[object, ...]:
    """Scheduling-equivalence key of a pod."""
    return (
        pod.request,
        tuple(sorted(pod.node_selector.items())),
        pod.affinity,
        tuple(sorted(pod.tolerations, key=repr)),
    )


def pod_order(pod: Pod) -> tuple[int, int, int, int, str]:
    """Planning order: higher priority first, then larger GPU, CPU, memory demand, then name."""
    r = pod.request
    return (-pod.priority, -r.gpu_demand_milli, -r.cpu_milli, -r.memory_mib, pod.key)


# ---------------------------------------------------------------------------------------------------------- context
@dataclass(slots=True)
class NewNodes:
    """``count`` identical new nodes of one option, each carrying ``pattern`` (class index -> pods per node)."""

    option: Option
    pattern: dict[int, int]
    count: int
    pods: list[list[str]] = field(default_factory=list)
    """Pods per node (filled when pods are assigned)."""


@dataclass(slots=True)
class Context:
    """Mutable planning state (copied for gang transactions)."""

    state: ClusterState
    pool_nodes: dict[str, int]
    pool_usage: dict[str, Resources]
    groups: list[NewNodes]
    placements: dict[str, str]
    blocked: list[Blocked]

    def copy(self) -> Context:
        return Context(
            self.state.copy(),
            dict(self.pool_nodes),
            dict(self.pool_usage),
            [NewNodes(g.option, dict(g.pattern), g.count, [list(p) for p in g.pods]) for g in self.groups],
            dict(self.placements),
            list(self.blocked),
        )

    def headroom(self, pool: NodePool, itype: InstanceType) -> int:
        """How many more nodes of ``itype`` the pool may get (max nodes and limits)."""
        n = 1 << 30
        if pool.max_nodes is not None:
            n = min(n, pool.max_nodes - self.pool_nodes.get(pool.name, 0))
        used = self.pool_usage.get(pool.name, Resources(pods=0))
        lim = pool.limits
        for cap, have, each in (
            (lim.cpu_milli, used.cpu_milli, itype.vcpus * 1000),
            (lim.memory_mib, used.memory_mib, itype.memory_mib),
            (lim.gpus, used.gpus, itype.gpu_count),
        ):
            if cap is not None and each > 0:
                n = min(n, (cap - have) // each)
        return max(0, n)

    def add_nodes(self, opt: Option, count: int) -> None:
        pool = opt.pool.name
        self.pool_nodes[pool] = self.pool_nodes.get(pool, 0) + count
        cap = Resources(opt.itype.vcpus * 1000, opt.itype.memory_mib, opt.itype.gpu_count, 0).scaled(count)
        self.pool_usage[pool] = self.pool_usage.get(pool, Resources(pods=0)) + cap


# ----------------------------------------------------------------------------------------------------------- planner
class Planner:
    """One planning run. Use :func:`plan`."""

    def __init__(self, snapshot: Snapshot, config: PlannerConfig, now: float) -> None:
        self.snapshot = snapshot
        self.config = config
        self.now = now
        self._table = option_table(snapshot, now)
        self.options = list(self._table)
        self.scorer: Scorer = make_scorer(config.scorer)
        self.nodes: list[Node] = sorted(snapshot.nodes, key=lambda n: (n.launching, n.name))
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.launching = np.array([n.launching for n in self.nodes], dtype=bool)
        self.classes: list[PodClass] = []
        self._class_of: dict[tuple[object, ...], PodClass] = {}
        self.pods_by_key: dict[str, Pod] = {p.key: p for p in snapshot.pods}
        self._rows_cache: dict[int, tuple[IntArray, IntArray]] = {}
        self._groups_cache: dict[tuple[str, ...], list[IntArray]] = {}
        self._opt_groups_cache: dict[tuple[str, ...], list[IntArray]] = {}
        oa = [o.alloc for o in self.options]
        self.opt_cpu = np.array([a.cpu_milli for a in oa], dtype=np.int64)
        self.opt_mem = np.array([a.memory_mib for a in oa], dtype=np.int64)
        self.opt_gpus = np.array([a.gpus for a in oa], dtype=np.int64)
        self.opt_pods = np.array([a.pods for a in oa], dtype=np.int64)
        self.opt_models = [o.itype.gpu_model for o in self.options]
        self._class_opts: dict[int, tuple[list[Option], list[int], float]] = {}
        """Per class index: its feasible options, pods per empty node of each, reference cost."""
        self._scorer_ready = False

    # -- setup
    def _initial_context(self) -> Context:
        nodes = self.nodes
        state = ClusterState.of([n.name for n in nodes], [n.allocatable for n in nodes], [n.gpu_model for n in nodes])
        pool_nodes, pool_usage = pool_totals(self.nodes, self.snapshot.catalog)
        bound: list[list[Request]] = [[] for _ in self.nodes]
        for pod in sorted(self.snapshot.pods, key=lambda p: p.key):
            if pod.node_name is not None and pod.phase in ("Pending", "Running") and pod.node_name in self.node_index:
                bound[self.node_index[pod.node_name]].append(pod.request)
        state.occupy_all(bound)
        self._scorer_ready = False
        if any(p.gang for p in self.snapshot.pods if p.pending):
            self._prepare_scorer(state)  # gang trials change the state before the first placement
        return Context(state, pool_nodes, pool_usage, [], {}, [])

    def _classify(self, pods: Iterable[Pod]) -> None:
        for pod in pods:
            key = class_key(pod)
            cls = self._class_of.get(key)
            if cls is None:
                cls = PodClass(len(self.classes), pod, key=key)
                self.classes.append(cls)
                self._class_of[key] = cls
            cls.pods.append(pod)

    def class_of(self, pod: Pod) -> PodClass:
        return self._class_of[class_key(pod)]

    # -- existing and launching nodes
    def _rows(self, cls: PodClass) -> tuple[IntArray, IntArray]:
        """Rows of existing and of launching nodes that pass the class's label/taint predicates."""
        cached = self._rows_cache.get(cls.index)
        if cached is not None:
            return cached
        pod = cls.example
        ok = np.zeros(len(self.nodes), dtype=bool)
        for rows in self._node_groups(referenced_keys(pod)):
            n = self.nodes[rows[0]]
            if static_failure(pod, n.labels, n.taints, n.unschedulable) is None:
                ok[rows] = True
        result = (np.flatnonzero(ok & ~self.launching), np.flatnonzero(ok & self.launching))
        self._rows_cache[cls.index] = result
        return result

    def _node_groups(self, keys: tuple[str, ...]) -> list[IntArray]:
        """Node rows grouped by their labels on ``keys``, taints and cordon state (cached per key set)."""
        got = self._groups_cache.get(keys)
        if got is None:
            groups: dict[tuple[object, ...], list[int]] = {}
            for i, n in enumerate(self.nodes):
                sig = (tuple(n.labels.get(k) for k in keys), n.taints, n.unschedulable)
                groups.setdefault(sig, []).append(i)
            got = [np.array(v, dtype=np.int64) for v in groups.values()]
            self._groups_cache[keys] = got
        return got

    def _prepare_scorer(self, state: ClusterState) -> None:
        """Give the scorer the cluster and the expected workload (all pending and running pods' requests)."""
        scoring_requests = [p.request for p in self.snapshot.pods if p.phase in ("Pending", "Running")]
        self.scorer.prepare(state, Workload.from_requests(scoring_requests) if scoring_requests else None)
        self._scorer_ready = True

    def _place_existing(self, ctx: Context, pods: Sequence[Pod]) -> list[Pod]:
        """Place pods on existing, then launching nodes; return those left."""
        left: list[Pod] = []
        exhausted: set[tuple[int, int]] = set()
        for pod in pods:
            cls = self.class_of(pod)
            placed = False
            for phase, rows in enumerate(self._rows(cls)):
                if (cls.index, phase) in exhausted or rows.size == 0:
                    continue
                cand = rows[ctx.state.fits(pod.request, rows)]
                if cand.size == 0:
                    exhausted.add((cls.index, phase))  # capacity only shrinks during planning
                    continue
                if not self._scorer_ready:  # prepared on first use: most plans place nothing on existing nodes
                    self._prepare_scorer(ctx.state)
                i = select(self.scorer, ctx.state, pod.request, cand)
                assert i is not None
                ctx.state.place(pod.request, i)
                ctx.placements[pod.key] = self.nodes[i].name
                placed = True
                break
            if not placed:
                left.append(pod)
        return left

    # -- new nodes
    def feasible(self, cls: PodClass) -> list[Option]:
        """Options whose template passes the class's predicates and holds one pod (available or not)."""
        return self._options_of(cls)[0]

    def _options_of(self, cls: PodClass) -> tuple[list[Option], list[int], float]:
        got = self._class_opts.get(cls.index)
        if got is None:
            indices, solos, ref = _CLASS_OPTIONS.get(lambda: self._class_options(cls), cls.key, objects=(self._table,))
            got = self._class_opts[cls.index] = ([self.options[i] for i in indices], solos, ref)
        return got

    def _class_options(self, cls: PodClass) -> tuple[list[int], list[int], float]:
        """(:meth:`_feasible_indices`, pods per empty node of each, reference cost) of a class."""
        indices = self._feasible_indices(cls)
        solos = [solo_count(self.options[i], cls.request) for i in indices]
        costs = [
            self.options[i].price / n
            for i, n in zip(indices, solos, strict=True)
            if self.options[i].unavailable_until is None
        ]
        return indices, solos, min(costs) if costs else 0.0

    def _feasible_indices(self, cls: PodClass) -> list[int]:
        """Indices into the option table of the options :meth:`feasible` returns."""
        pod, r = cls.example, cls.request
        fit = (self.opt_cpu >= r.cpu_milli) & (self.opt_mem >= r.memory_mib) & (self.opt_pods >= 1)
        if r.gpus:
            fit &= self.opt_gpus >= r.gpus
        elif r.gpu_milli:
            fit &= self.opt_gpus >= 1
        if r.wants_gpu and r.gpu_models is not None:
            fit &= np.array([m in r.gpu_models for m in self.opt_models], dtype=bool)
        ok = np.zeros(len(self.options), dtype=bool)
        for rows in self._option_groups(referenced_keys(pod)):
            rows = rows[fit[rows]]
            if rows.size:
                o = self.options[int(rows[0])]
                if static_failure(pod, o.labels, o.taints) is None:
                    ok[rows] = True
        return [int(i) for i in np.flatnonzero(ok)]

    def _option_groups(self, keys: tuple[str, ...]) -> list[IntArray]:
        """Options grouped by their template labels on ``keys`` and taints (cached per key set)."""
        got = self._opt_groups_cache.get(keys)
        if got is None:
            groups: dict[tuple[object, ...], list[int]] = {}
            for o in self.options:
                groups.setdefault((tuple(o.labels.get(k) for k in keys), o.taints), []).append(o.index)
            got = [np.array(v, dtype=np.int64) for v in groups.values()]
            self._opt_groups_cache[keys] = got
        return got

    def _solo(self, cls: PodClass) -> list[int]:
        """Pods of the class that fit an empty node, per feasible option (cached)."""
        return self._options_of(cls)[1]

    def ref_cost(self, cls: PodClass) -> float:
        """The cheapest stand-alone $/h per pod of the class (its value when packed)."""
        return self._options_of(cls)[2]

    def _pack_new(self, ctx: Context, pods: Sequence[Pod]) -> list[Pod]:
        """Greedy pattern packing of ``pods`` onto new nodes. Returns the pods left without a node."""
        order: list[PodClass] = []
        remaining: dict[int, list[Pod]] = {}
        for pod in pods:
            cls = self.class_of(pod)
            if cls.index not in remaining:
                remaining[cls.index] = []
                order.append(cls)
            remaining[cls.index].append(pod)
        compatible: dict[tuple[int, bool], list[PodClass]] = {}
        for c in order:
            for o in self.feasible(c):
                compatible.setdefault((o.index, c.request.wants_gpu), []).append(c)
        left: list[Pod] = []
        for cls in order:
            while remaining[cls.index]:
                choice = self._best_pattern(ctx, cls, remaining, compatible)
                if choice is None:
                    left.extend(remaining[cls.index])
                    remaining[cls.index] = []
                    break
                opt, pattern = choice
                reps = min(len(remaining[k]) // n for k, n in pattern.items())
                reps = max(1, min(reps, ctx.headroom(opt.pool, opt.itype)))
                group = NewNodes(opt, pattern, reps)
                for _ in range(reps):
                    node_pods: list[str] = []
                    for k, n in pattern.items():
                        take, remaining[k] = remaining[k][:n], remaining[k][n:]
                        node_pods.extend(p.key for p in take)
                    group.pods.append(node_pods)
                ctx.add_nodes(opt, reps)
                ctx.groups.append(group)
        return left

    def _best_pattern(
        self,
        ctx: Context,
        cls: PodClass,
        remaining: Mapping[int, list[Pod]],
        compatible: dict[tuple[int, bool], list[PodClass]],
    ) -> tuple[Option, dict[int, int]] | None:
        """The cheapest-per-value way to open one node for ``cls`` (filled with whatever else fits)."""
        n_left = len(remaining[cls.index])
        ref = self.ref_cost(cls)
        ranked: list[tuple[float, float, int, Option]] = []
        top_weight: int | None = None
        room: dict[tuple[str, str], int] = {}
        for o, solo_max in zip(self.feasible(cls), self._solo(cls), strict=True):
            if o.unavailable_until is not None:
                continue
            rk = (o.pool.name, o.itype.name)
            if rk not in room:
                room[rk] = ctx.headroom(o.pool, o.itype)
            if room[rk] <= 0:
                continue
            if top_weight is None or o.pool.weight > top_weight:
                top_weight, ranked = o.pool.weight, []
            elif o.pool.weight < top_weight:
                continue
            solo = min(n_left, solo_max)
            ranked.append((o.price / (solo * ref) if ref > 0 else o.price, o.price, o.index, o))
        if not ranked:
            return None
        ranked.sort(key=lambda t: t[:3])
        best: tuple[float, float, float, int] | None = None
        chosen: tuple[Option, dict[int, int]] | None = None
        seen_types: set[tuple[str, str]] = set()
        for _, _, _, o in ranked:
            if (o.pool.name, o.itype.name) in seen_types:
                continue
            seen_types.add((o.pool.name, o.itype.name))
            pattern, value = self._fill(o, cls, remaining, compatible)
            score = o.price / value if value > EPS else math.inf
            key = (round(score, 9), -round(value, 9), o.price, o.index)
            if best is None or key < best:
                best, chosen = key, (o, pattern)
            if len(seen_types) >= self.config.candidate_types:
                break
        return chosen

    def _fill(
        self,
        o: Option,
        first: PodClass,
        remaining: Mapping[int, list[Pod]],
        compatible: dict[tuple[int, bool], list[PodClass]],
    ) -> tuple[dict[int, int], float]:
        """Fill one empty node of ``o`` with ``first``, then every compatible class in order; (pattern, value)."""
        b = Bin(o.alloc, o.itype.gpu_model)
        n = b.fit_count(first.request, len(remaining[first.index]))
        b.add(first.request, n)
        pattern = {first.index: n}
        value = n * self.ref_cost(first)
        for wants_gpu in (True, False):
            key = (o.index, wants_gpu)
            classes = compatible.get(key, [])
            exhausted = 0
            for k in classes:
                if b.pods <= 0 or b.cpu <= 0 or (wants_gpu and b.room <= 0):
                    break
                left = len(remaining[k.index])
                if not left:
                    exhausted += 1
                    continue
                if k.index == first.index:
                    continue
                n = b.fit_count(k.request, left)
                if n:
                    b.add(k.request, n)
                    pattern[k.index] = n
                    value += n * self.ref_cost(k)
            if exhausted > 16 and exhausted * 4 > len(classes):  # compact: exhausted classes never come back
                compatible[key] = [k for k in classes if remaining[k.index]]
        return pattern, value

    # -- explanations
    def explain(self, ctx: Context, pod: Pod) -> Blocked:
        """Why ``pod`` got no node: the most specific reason across all pools."""
        cls = self.class_of(pod)
        req = pod.request
        if not self.snapshot.pools:
            return Blocked(pod.key, BlockReason.NO_POOLS, "no GPUNodePool is configured, so no node can be added")
        feasible = self.feasible(cls)
        if not feasible:
            return self._explain_infeasible(pod)
        available = [o for o in feasible if o.unavailable_until is None]
        if not available:
            until = min(o.unavailable_until or math.inf for o in feasible)
            names = sorted({f"{o.itype.name}/{o.offering.zone}/{o.offering.capacity_type}" for o in feasible})
            when = "until further notice" if math.isinf(until) else f"until t={until:.0f}"
            return Blocked(
                pod.key,
                BlockReason.NO_OFFERING_AVAILABLE,
                f"every offering that fits is unavailable {when}: {', '.join(names[:6])}"
                + (" ..." if len(names) > 6 else ""),
            )
        pools = sorted({o.pool.name: o.pool for o in available}.values(), key=lambda p: p.name)
        at_max = [p for p in pools if p.max_nodes is not None and ctx.pool_nodes.get(p.name, 0) >= p.max_nodes]
        if len(at_max) == len(pools):
            detail = ", ".join(f"{p.name} ({ctx.pool_nodes.get(p.name, 0)}/{p.max_nodes} nodes)" for p in at_max)
            return Blocked(pod.key, BlockReason.POOL_AT_MAX_NODES, f"every pool that fits is at maxNodes: {detail}")
        blocked_by_limits = all(ctx.headroom(o.pool, o.itype) == 0 for o in available if o.pool not in at_max)
        if blocked_by_limits:
            limited = ", ".join(p.name for p in pools if p not in at_max)
            return Blocked(
                pod.key, BlockReason.POOL_AT_LIMITS, f"adding a node would exceed the limits of pool(s) {limited}"
            )
        return Blocked(
            pod.key,
            BlockReason.GANG_INCOMPLETE if pod.gang else BlockReason.POOL_AT_LIMITS,
            f"not enough capacity left in pools for {_fmt_request(req)}",
        )

    def _explain_infeasible(self, pod: Pod) -> Blocked:
        req = pod.request
        label_fail: dict[str, FitFailure] = {}
        taint_fail: dict[str, FitFailure] = {}
        size_fail: dict[str, Option] = {}
        pools_without_types = []
        by_pool: dict[str, list[Option]] = {}
        for o in self.options:
            by_pool.setdefault(o.pool.name, []).append(o)
        for pool in sorted(self.snapshot.pools, key=lambda p: p.name):
            opts = by_pool.get(pool.name, [])
            if not opts:
                pools_without_types.append(pool.name)
                continue
            label_ok = []
            for o in opts:
                f = static_failure(pod, o.labels, ())
                if f is None:
                    label_ok.append(o)
                else:
                    label_fail.setdefault(pool.name, f)
            if not label_ok:
                continue
            label_fail.pop(pool.name, None)
            taint_ok = []
            for o in label_ok:
                f = static_failure(pod, o.labels, o.taints)
                if f is None:
                    taint_ok.append(o)
                else:
                    taint_fail.setdefault(pool.name, f)
            if not taint_ok:
                continue
            taint_fail.pop(pool.name, None)
            biggest = max(taint_ok, key=lambda o: (o.alloc.gpus, o.alloc.cpu_milli, o.alloc.memory_mib, -o.index))
            size_fail[pool.name] = biggest
        if size_fail:
            sizes = "; ".join(
                f"pool {p}: largest {o.itype.name} has {_fmt_resources(o.alloc, o.itype.gpu_model)}"
                for p, o in sorted(size_fail.items())
            )
            model = f" on GPU model {'|'.join(sorted(req.gpu_models))}" if req.gpu_models and req.wants_gpu else ""
            return Blocked(
                pod.key,
                BlockReason.TOO_LARGE,
                f"request {_fmt_request(req)}{model} is larger than the biggest instance type of every matching "
                f"pool ({sizes})",
            )
        if taint_fail:
            detail = "; ".join(f"pool {p}: {f.detail}" for p, f in sorted(taint_fail.items()))
            return Blocked(pod.key, BlockReason.TAINT_NOT_TOLERATED, f"matching pools taint their nodes: {detail}")
        if label_fail:
            keys = sorted({f.key for f in label_fail.values() if f.key})
            detail = "; ".join(
                f"pool {p}: {_requirement_text(pod, f)}{_offered(by_pool[p], f.key)}"
                for p, f in sorted(label_fail.items())
            )
            return Blocked(
                pod.key,
                BlockReason.NO_MATCHING_POOL,
                f"no pool matches the pod's node selector/affinity on {', '.join(keys) or 'labels'} ({detail})",
            )
        return Blocked(
            pod.key,
            BlockReason.NO_MATCHING_POOL,
            f"no pool has instance types in the catalog ({', '.join(pools_without_types)})",
        )

    # -- driver
    def run(self) -> ScaleUpPlan:
        pending = sorted((p for p in self.snapshot.pods if p.pending and not p.is_daemonset), key=pod_order)
        self._classify(pending)
        ctx = self._initial_context()
        gangs: dict[str, list[Pod]] = {}
        singles: list[Pod] = []
        for p in pending:
            if p.gang:
                gangs.setdefault(p.gang, []).append(p)
            else:
                singles.append(p)
        bound_members: dict[str, int] = {}
        for p in self.snapshot.pods:
            if p.gang and p.node_name is not None and p.phase in ("Pending", "Running"):
                bound_members[p.gang] = bound_members.get(p.gang, 0) + 1
        for name in sorted(gangs):
            ctx = self._plan_gang(ctx, name, gangs[name], bound_members.get(name, 0))
        left = self._place_existing(ctx, singles)
        left = self._pack_new(ctx, left)
        for pod in left:
            ctx.blocked.append(self.explain(ctx, pod))
        groups = ctx.groups
        solver = "greedy"
        if self.config.exact_solver and groups:
            improved = improve_with_milp(self, ctx, self.config.solver_time_limit_s)
            if improved is not None:
                groups, solver = improved, "milp"
        return self._result(ctx, groups, solver)

    def _plan_gang(self, ctx: Context, name: str, members: list[Pod], bound: int) -> Context:
        size = max(p.gang_size for p in members)
        if size and len(members) + bound < size:
            for p in members:
                ctx.blocked.append(
                    Blocked(
                        p.key,
                        BlockReason.GANG_INCOMPLETE,
                        f"gang {name} has {len(members) + bound} of {size} members; waiting for the rest",
                    )
                )
            return ctx
        trial = ctx.copy()
        left = self._place_existing(trial, members)
        left = self._pack_new(trial, left)
        if not left:
            return trial
        why = self.explain(trial, left[0])
        for p in members:
            ctx.blocked.append(
                Blocked(
                    p.key,
                    BlockReason.GANG_INCOMPLETE,
                    f"gang {name} ({size or len(members)} pods) cannot be placed all together: {left[0].key}: "
                    f"{why.message}",
                )
            )
        return ctx

    def _result(self, ctx: Context, groups: list[NewNodes], solver: str) -> ScaleUpPlan:
        merged: dict[tuple[str, str, str, str], list[NewNodes]] = {}
        for g in groups:
            o = g.option
            merged.setdefault((o.pool.name, o.itype.name, o.offering.zone, str(o.offering.capacity_type)), []).append(g)
        launches: list[Launch] = []
        placements = dict(ctx.placements)
        for n, key in enumerate(sorted(merged, key=lambda k: (merged[k][0].option.sort_key, k))):
            parts = merged[key]
            opt = parts[0].option
            lid = f"{self.config.launch_id_prefix}-{n + 1}"
            node_pods = [pods for g in parts for pods in g.pods]
            count = sum(g.count for g in parts)
            all_pods: list[str] = []
            for idx, pods in enumerate(node_pods):
                for pk in pods:
                    placements[pk] = f"{lid}/{idx}"
                    all_pods.append(pk)
            launches.append(
                Launch(
                    lid,
                    opt.pool.name,
                    opt.itype.name,
                    opt.offering.capacity_type,
                    opt.offering.zone,
                    count,
                    opt.price * count,
                    tuple(all_pods),
                )
            )
        blocked = tuple(sorted(ctx.blocked, key=lambda b: b.pod))
        return ScaleUpPlan(tuple(launches), placements, blocked, solver)


def _requirement_text(pod: Pod, f: FitFailure) -> str:
    """The pod's own requirement that failed, without the node's side (the options are listed separately)."""
    if f.kind is FitFailureKind.NODE_SELECTOR and f.key in pod.node_selector:
        return f"nodeSelector {f.key}={pod.node_selector[f.key]}"
    return f.detail


def _offered(opts: Sequence[Option], key: str) -> str:
    values = sorted({o.labels[key] for o in opts if key in o.labels})
    if not key:
        return ""
    if not values:
        return f"; its nodes have no {key} label"
    shown = ", ".join(values[:8]) + (" ..." if len(values) > 8 else "")
    return f"; its nodes offer {key} in [{shown}]"


def _fmt_request(r: Request) -> str:
    parts = [f"cpu={r.cpu_milli}m", f"memory={r.memory_mib}Mi"]
    if r.gpus:
        parts.append(f"nvidia.com/gpu={r.gpus}")
    if r.gpu_milli:
        parts.append(f"gpuscale.io/gpu-milli={r.gpu_milli}")
    return ", ".join(parts)


def _fmt_resources(a: Resources, model: str | None) -> str:
    gpu = f", {a.gpus}x {model or 'GPU'}" if a.gpus else ", no GPU"
    return f"cpu={a.cpu_milli}m, memory={a.memory_mib}Mi{gpu}"


# ------------------------------------------------------------------------------------------------------ exact solver
def _realizable(opt: Option, pattern: Mapping[int, int], classes: Mapping[int, PodClass]) -> bool:
    """True if the pattern's pods fit one node of ``opt`` when bound one by one in planning order, each fraction taking
    the best-fitting physical GPU (as the scheduler and device plugin would), not only in total per GPU."""
    if not any(classes[k].request.gpu_milli for k in pattern):
        return True  # whole GPUs, CPU and memory are additive: the pattern's counts already fit
    state = ClusterState([NodeShape("new", opt.alloc, opt.itype.gpu_model)])
    for k in sorted(pattern, key=lambda k: pod_order(classes[k].example)):
        for _ in range(pattern[k]):
            if not state.fits_one(classes[k].request, 0):
                return False
            state.place(classes[k].request, 0)
    return True


_MILP_SOLUTIONS: Memo[npt.NDArray[np.int64] | None] = Memo(512)
"""Solutions by the exact bytes of the integer program (same program, same answer)."""


def improve_with_milp(planner: Planner, ctx: Context, time_limit_s: float) -> list[NewNodes] | None:
    """Re-optimise the new nodes of a greedy plan with an integer program over packing patterns.

    Columns are the greedy patterns plus, for every class and every feasible option, the node filled with that
    class first and then the others. Rows cover every class's greedy-placed pods and keep every pool within
    ``maxNodes`` and ``limits``. Returns new groups only when strictly cheaper than the greedy plan; None otherwise
    (solver missing, timed out without a better incumbent, or no gain).
    """
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:  # optional dependency
        return None
    greedy_cost = sum(g.option.price * g.count for g in ctx.groups)
    demand: dict[int, int] = {}
    for g in ctx.groups:
        for k, n in g.pattern.items():
            demand[k] = demand.get(k, 0) + n * g.count
    classes = sorted(demand)
    if not classes or len(classes) > planner.config.milp_max_classes:
        return None
    cls_by_index = {c.index: c for c in planner.classes}
    # Optimality certificate: every plan buys, for each class, some node able to host it. When the greedy plan costs
    # no more than the dearest of those cheapest hosts, no integer program can beat it.
    floor = 0.0
    for k in classes:
        cls = cls_by_index[k]
        hosts = [
            o.price
            for o, n in zip(planner.feasible(cls), planner._solo(cls), strict=True)
            if o.unavailable_until is None and n > 0
        ]
        floor = max(floor, min(hosts, default=0.0))
    if greedy_cost <= floor + 1e-9:
        return None
    columns: list[tuple[Option, dict[int, int]]] = []
    seen: set[tuple[int, tuple[tuple[int, int], ...]]] = set()

    def add(opt: Option, pattern: dict[int, int]) -> None:
        key = (opt.index, tuple(sorted(pattern.items())))
        if pattern and key not in seen:
            seen.add(key)
            if _realizable(opt, pattern, cls_by_index):
                columns.append((opt, pattern))

    for g in ctx.groups:
        add(g.option, g.pattern)
    feasible_sets = {k: {o.index for o in planner.feasible(cls_by_index[k])} for k in classes}
    for k in classes:
        ranked = sorted(
            (
                (o.price / n, o.price, o.index, o)
                for o, n in zip(planner.feasible(cls_by_index[k]), planner._solo(cls_by_index[k]), strict=True)
                if o.unavailable_until is None and n > 0
            ),
            key=lambda t: t[:3],
        )
        types_seen: set[tuple[str, str]] = set()
        for _, _, _, o in ranked:
            if (o.pool.name, o.itype.name) in types_seen:
                continue
            types_seen.add((o.pool.name, o.itype.name))
            if len(types_seen) > planner.config.candidate_types:
                break
            b = Bin(o.alloc, o.itype.gpu_model)
            pattern: dict[int, int] = {}
            for j in [k, *classes]:
                if o.index not in feasible_sets[j]:
                    continue
                n = b.fit_count(cls_by_index[j].request, demand[j] - pattern.get(j, 0))
                if n:
                    b.add(cls_by_index[j].request, n)
                    pattern[j] = pattern.get(j, 0) + n
            add(o, pattern)
    if len(columns) > 20000:
        return None
    ncol = len(columns)
    cost = np.array([o.price for o, _ in columns])
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []
    for k in classes:
        rows.append(np.array([p.get(k, 0) for _, p in columns], dtype=float))
        lo.append(demand[k])
        hi.append(np.inf)
    # pools: greedy counts were already added to ctx; the solver's must fit in the same room
    pools = {o.pool.name: o.pool for o, _ in columns}
    for name, pool in sorted(pools.items()):
        in_pool = np.array([1.0 if o.pool.name == name else 0.0 for o, _ in columns])
        used_by_greedy = sum(g.count for g in ctx.groups if g.option.pool.name == name)
        if pool.max_nodes is not None:
            rows.append(in_pool)
            lo.append(-np.inf)
            hi.append(pool.max_nodes - ctx.pool_nodes.get(name, 0) + used_by_greedy)
        usage = ctx.pool_usage.get(name, Resources(pods=0))
        greedy_use = [
            sum(getattr(g.option.itype, attr) * g.count for g in ctx.groups if g.option.pool.name == name)
            for attr in ("vcpus", "memory_mib", "gpu_count")
        ]
        for cap, have, attr, gu, mult in (
            (pool.limits.cpu_milli, usage.cpu_milli, "vcpus", greedy_use[0], 1000),
            (pool.limits.memory_mib, usage.memory_mib, "memory_mib", greedy_use[1], 1),
            (pool.limits.gpus, usage.gpus, "gpu_count", greedy_use[2], 1),
        ):
            if cap is None:
                continue
            rows.append(in_pool * np.array([getattr(o.itype, attr) * mult for o, _ in columns], dtype=float))
            lo.append(-np.inf)
            hi.append(cap - have + gu * mult)
    upper = np.array([max(demand.values())] * ncol, dtype=float)
    matrix, lo_a, hi_a = np.vstack(rows), np.array(lo), np.array(hi)
    key: tuple[object, ...] = (matrix.shape, matrix.tobytes(), cost.tobytes(), lo_a.tobytes(), hi_a.tobytes())
    key += (upper.tobytes(), time_limit_s)

    def solve() -> npt.NDArray[np.int64] | None:
        res = milp(
            c=cost,
            constraints=LinearConstraint(matrix, lo_a, hi_a),
            integrality=np.ones(ncol),
            bounds=Bounds(np.zeros(ncol), upper),
            options={"time_limit": max(0.05, time_limit_s), "presolve": True},
        )
        return None if res.x is None else np.round(res.x).astype(int)

    # the same integer program again (a controller re-plans similar batches) gets the same answer
    solution = _MILP_SOLUTIONS.get(solve, key)
    if solution is None:
        return None
    x = solution
    new_cost = float(cost @ x)
    if new_cost >= greedy_cost - 1e-6:
        return None
    # assign pods: every node of a column takes up to its pattern from what is left of each class
    left: dict[int, list[str]] = {k: [] for k in classes}
    for g in ctx.groups:
        for pods in g.pods:
            for pk in pods:
                left[planner.class_of(planner.pods_by_key[pk]).index].append(pk)
    for k in classes:
        left[k].sort(key=lambda pk: pod_order(planner.pods_by_key[pk]))
    groups: list[NewNodes] = []
    for (opt, pattern), n in sorted(zip(columns, x, strict=True), key=lambda t: t[0][0].sort_key):
        if n <= 0:
            continue
        group = NewNodes(opt, pattern, 0)
        for _ in range(int(n)):
            node_pods: list[str] = []
            for k, m in pattern.items():
                take, left[k] = left[k][:m], left[k][m:]
                node_pods.extend(take)
            if node_pods:
                group.pods.append(node_pods)
                group.count += 1
        if group.count:
            groups.append(group)
    if any(left[k] for k in classes):
        return None
    return groups


def plan(snapshot: Snapshot, config: PlannerConfig | None = None, now: float = 0.0) -> ScaleUpPlan:
    """Plan placements and new nodes for every pending pod of ``snapshot`` (pure; deterministic)."""
    return Planner(snapshot, config or PlannerConfig(), now).run()
