"""The exact solver: an integer program over packing patterns (HiGHS via SciPy, wall-clock limited) that replaces
the greedy new nodes only when strictly cheaper."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gpuscale.core.memo import Memo
from gpuscale.core.model import Pod
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner.bins import Bin
from gpuscale.core.planner.classes import PodClass, pod_order
from gpuscale.core.planner.context import Context, NewNodes
from gpuscale.core.planner.feasible import ClassOptions
from gpuscale.core.planner.options import Option
from gpuscale.core.planner.smallip import unique_optimum
from gpuscale.core.resources import Resources
from gpuscale.core.state import ClusterState, NodeShape


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


_COVER_STATES = 4096
"""At most this many demand vectors for :func:`_cover_cost` (beyond, it gives no bound and the solver runs)."""


def _cover_cost(
    columns: Sequence[tuple[float, Mapping[int, int]]], classes: Sequence[int], demand: Mapping[int, int]
) -> float:
    """The least cost of any number of copies of the ``columns`` (price, pods per class) that hold ``demand``: a
    lower bound of the integer program (which also has pool rows and column bounds), exact by dynamic programming
    over the demand still to cover; ``-inf`` (no bound) when there are too many demand vectors, ``inf`` when no
    columns hold the demand.

    Any cover of a demand vector uses a column holding its first class still short; without that column, the rest
    covers what is left of the demand, so the least cost of a vector is the least, over such columns, of the
    column's price plus the least cost of what it leaves."""
    need = tuple(demand[k] for k in classes)
    states = 1
    for d in need:
        states *= d + 1
    if states > _COVER_STATES or sum(need) > 256:
        return -np.inf
    vectors = [(price, tuple(p.get(k, 0) for k in classes)) for price, p in columns]
    by_class = [[(price, v) for price, v in vectors if v[j] > 0] for j in range(len(classes))]
    best: dict[tuple[int, ...], float] = {}

    def cost(left: tuple[int, ...]) -> float:
        got = best.get(left)
        if got is not None:
            return got
        j = next((i for i, d in enumerate(left) if d > 0), -1)
        if j < 0:
            return 0.0
        got = np.inf
        for price, v in by_class[j]:
            rest = tuple(d - c if d > c else 0 for d, c in zip(left, v, strict=True))
            got = min(got, price + cost(rest))
        best[left] = got
        return got

    return float(cost(need))


_MILP_SOLUTIONS: Memo[npt.NDArray[np.int64] | None] = Memo(512)
"""Solutions by the exact bytes of the integer program (same program, same answer)."""


def improve_with_milp(
    choices: ClassOptions,
    pod_classes: Sequence[PodClass],
    class_of: Callable[[Pod], PodClass],
    pods_by_key: Mapping[str, Pod],
    ctx: Context,
    config: PlannerConfig,
) -> list[NewNodes] | None:
    """Re-optimise the new nodes of a greedy plan with an integer program over packing patterns.

    Columns are the greedy patterns plus, for every class and every feasible option, the node filled with that
    class first and then the others. Rows cover every class's greedy-placed pods and keep every pool within
    ``maxNodes`` and ``limits``. Returns new groups only when strictly cheaper than the greedy plan; None otherwise
    (solver missing, timed out without a better incumbent, or no gain).
    """
    time_limit_s = config.solver_time_limit_s
    greedy_cost = sum(g.option.price * g.count for g in ctx.groups)
    demand: dict[int, int] = {}
    for g in ctx.groups:
        for k, n in g.pattern.items():
            demand[k] = demand.get(k, 0) + n * g.count
    classes = sorted(demand)
    if not classes or len(classes) > config.milp_max_classes:
        return None
    cls_by_index = {c.index: c for c in pod_classes}
    # Optimality certificate: every plan buys, for each class, some node able to host it, and room for all its pods
    # (a node of an option holds at most ``solo`` of them, so they cost at least demand x the cheapest price per pod).
    # When the greedy plan costs no more than the largest of these lower bounds, no integer program can beat it (the
    # solver is then neither imported nor run: a pods-only round of one class, the common case, never needs SciPy).
    floor = 0.0
    for k in classes:
        hosts = choices.hosts(cls_by_index[k])
        if hosts is not None:
            floor = max(floor, hosts[0], demand[k] * hosts[1])
    if greedy_cost <= floor * (1 + 1e-12) + 1e-9:
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
    feasible_sets = {k: {o.index for o in choices.feasible(cls_by_index[k])} for k in classes}
    for k in classes:
        ranked = sorted(
            (
                (o.price / n, o.price, o.index, o)
                for o, n in zip(choices.feasible(cls_by_index[k]), choices.solo(cls_by_index[k]), strict=True)
                if o.unavailable_until is None and n > 0
            ),
            key=lambda t: t[:3],
        )
        types_seen: set[tuple[str, str]] = set()
        for _, _, _, o in ranked:
            if (o.pool.name, o.itype.name) in types_seen:
                continue
            types_seen.add((o.pool.name, o.itype.name))
            if len(types_seen) > config.candidate_types:
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
    if _cover_cost([(o.price, p) for o, p in columns], classes, demand) >= greedy_cost - 1e-6 + 1e-9:
        return None  # no solution over these columns is cheaper, so the solver's could not be either
    if importlib.util.find_spec("scipy") is None:  # optional dependency
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
        direct = unique_optimum(cost, matrix, lo_a, hi_a, upper)  # a tiny program's clear answer, without SciPy
        if direct is not None:
            return direct
        from scipy.optimize import Bounds, LinearConstraint, milp  # imported only when a program is solved

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
                left[class_of(pods_by_key[pk]).index].append(pk)
    for k in classes:
        left[k].sort(key=lambda pk: pod_order(pods_by_key[pk]))
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
