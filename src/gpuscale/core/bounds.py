"""Lower bounds on what serving a workload must cost.

At every instant the nodes running the set ``A`` of running pods cost some rate ($/h); integrating a lower bound on
that rate over time gives the offline lower bound of :func:`cost_lower_bound`: no policy, however clairvoyant, serves
the pods at the times they ask for for less. Two per-instant bounds are implemented, both in terms of the options
``o`` (pool × instance type × offering, buyable now) a pod may run on: its labels and taints admit the pod and an empty
node holds one. Pods no option can host are left out (no policy can serve them either).

**Weak bound** (``method="weak"``). A node hosting pod ``p`` spends at least ``price_o × share_d(p, o)`` on it for
each dimension ``d`` (CPU, memory, GPU), ``share_d`` being the request over the node's allocatable, and the pods of a
node never share more than the whole node on one dimension, so the rate is at least
``max_d Σ_{p∈A} min_o price_o × share_d(p, o)``. It prices each dimension on its cheapest option independently: a
12-CPU/1-GPU pod gets half of a 2-GPU/16-CPU node although that node cannot host two of them.

**LP bound** (``method="lp"``, the default). Group ``A`` into classes ``c`` of identical pods (``n_c`` each). Every
integral packing is a feasible point of the LP relaxation of bin packing: ``y_{c,o} ≥ 0`` pods of ``c`` on option
``o`` (only where ``c`` may run), ``x_o ≥ 0`` nodes of ``o``, ``Σ_o y_{c,o} = n_c``,
``Σ_c y_{c,o} share_d(c, o) ≤ x_o`` for every ``o`` and ``d`` in (CPU, memory, GPU, pod slots); minimise
``Σ_o price_o x_o``. So its optimum is a lower bound on the rate. Rather than trusting the solver's primal value, the
bound uses its *dual*: any ``v_{o,d} ≥ 0`` with ``Σ_d v_{o,d} ≤ price_o`` for every option (a split of each node's
price over its dimensions) gives every class the value ``u_c = min_o Σ_d v_{o,d} share_d(c, o)`` and
``Σ_c n_c u_c`` is a lower bound, because for any feasible packing
``Σ_c n_c u_c ≤ Σ_{c,o} y_{c,o} Σ_d v_{o,d} share_d(c, o) ≤ Σ_{o,d} v_{o,d} x_o ≤ Σ_o price_o x_o``. Such a ``v``
does not depend on which pods run, so one dual is a valid bound at *every* instant. The weak bound is the maximum of
the duals that put each node's whole price on one dimension, so the LP bound (a pool of duals including those) is
never below it. Options dominated by another (no dearer, at least as large on every dimension, usable by every class
that can use them) are dropped first: a packing using them moves to the dominating option at no extra cost.

**Packing cuts.** The plain LP lets three 12-CPU pods share two 16-CPU nodes (3 × 12/16 = 2.25 ≤ 3 nodes' worth,
fractionally), which no scheduler can do. The bound therefore adds, per node type, dimensions that hold for every
integral packing: for a *dual feasible function* ``u`` (any shares of one bin that sum to at most 1 map to values
that sum to at most 1), the pods of a node satisfy ``Σ u(share_d) ≤ 1`` for each resource ``d``. It uses the
Fekete-Schepers functions ``u_k(x) = x`` if ``(k+1)x`` is whole, else ``floor((k+1)x)/k`` (``k`` in
:data:`CUT_ORDERS`) on the CPU, memory and GPU-total shares, and per physical GPU (a GPU fraction runs on one GPU,
a whole GPU holds nothing else, so a node's GPUs hold at most its GPU count of ``u_k(fraction)`` plus whole GPUs).
These are more rows of the same LP, so the dual argument above holds unchanged; the 12-CPU pods then cost a whole
16-CPU node each (``u_1(0.75) = 1``), as they do in reality. On the openb trace the cuts raise the bound by about
5 %.

Speed: the workload changes one pod at a time, so :func:`cost_lower_bound` keeps a pool of duals (each cleaned to be
exactly feasible, then scaled so every option's split sums to its price, which only raises the bound) and a feasible
fractional packing updated greedily as pods come and go. At an instant whose best pooled dual is within ``tolerance``
(relative) of that packing's cost the pooled dual is used; otherwise the LP is solved (SciPy's HiGHS), its dual joins
the pool and its solution replaces the packing. Every instant's value is therefore a dual bound (valid) and at least
``(1 - tolerance)`` times the LP optimum there; ``tolerance=0`` solves wherever the pool is not provably optimal.
Without SciPy the LP bound falls back to the weak bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from gpuscale.core.model import Pod, Snapshot
from gpuscale.core.planner import Option, build_options, class_key, solo_count
from gpuscale.core.predicates import static_failure
from gpuscale.core.resources import MILLI_PER_GPU

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DIMENSIONS = ("cpu", "memory", "gpu")
"""Dimensions of the weak bound."""

LP_DIMENSIONS = ("cpu", "memory", "gpu", "pods")
"""Resource dimensions of the LP bound (pod slots too). Packing cuts are added to them (see :func:`cut_shares`)."""

CUT_ORDERS = (1, 2, 3, 4, 5)
"""The ``k`` of the Fekete-Schepers functions the LP bound's cuts use."""

CUT_BASES = ("cpu", "memory", "gpu", "per-gpu")
"""What the cuts are taken of: the node's CPU, memory and GPU total, and each physical GPU."""

ND = len(LP_DIMENSIONS) + len(CUT_BASES) * len(CUT_ORDERS)
"""Dimensions of the LP bound in all."""


def fekete_schepers(num: npt.ArrayLike, den: npt.ArrayLike, k: int) -> FloatArray:
    """The dual feasible function of Fekete and Schepers at the share ``num / den`` (integers, broadcast):
    ``x`` where ``(k+1)x`` is whole, else ``floor((k+1)x) / k``; 0 where ``den`` is 0. Shares that sum to at most 1
    map to values that sum to at most 1, so one bin's items obey the mapped constraint too. Computed in integers, so
    no share is ever rounded up to a step."""
    n, d = np.broadcast_arrays(np.asarray(num, dtype=np.int64), np.asarray(den, dtype=np.int64))
    q, r = np.divmod((k + 1) * n, np.where(d > 0, d, 1))
    return np.asarray(np.where(d > 0, np.where(r == 0, q / (k + 1), q / k), 0.0), dtype=float)


def cut_shares(requests: IntArray, allocs: IntArray, whole_gpus: IntArray, gpu_milli: IntArray) -> FloatArray:
    """The LP bound's packing cuts for pods × node types, as extra share dimensions (each at most 1 per node).

    ``requests[c]`` and ``allocs[o]`` are (CPU milli, memory MiB, milli-GPU) of pod ``c`` and of a node of type
    ``o``; ``whole_gpus[c]`` and ``gpu_milli[c]`` are pod ``c``'s whole GPUs or GPU fraction (a fraction runs on one
    physical GPU). For every ``k`` of :data:`CUT_ORDERS`: the Fekete-Schepers value of each of the three shares, and
    per physical GPU the pod's whole GPUs, or the value of its fraction, over the node's GPUs. Order:
    :data:`CUT_BASES` × :data:`CUT_ORDERS`.
    """
    shape = (len(requests), len(allocs))
    cuts = [fekete_schepers(requests[:, None, d], allocs[None, :, d], k) for d in range(3) for k in CUT_ORDERS]
    node_gpus = allocs[:, 2] / MILLI_PER_GPU
    for k in CUT_ORDERS:
        slots = np.where(whole_gpus > 0, whole_gpus, fekete_schepers(gpu_milli, MILLI_PER_GPU, k))
        per = np.divide(slots[:, None], node_gpus[None, :], out=np.zeros(shape), where=node_gpus[None, :] > 0)
        cuts.append(per)
    return np.stack(cuts, axis=2)


DEFAULT_TOLERANCE = 1e-2
"""Default relative gap below which the LP bound reuses a pooled dual instead of solving (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A pod running from ``start`` to ``end`` (seconds)."""

    pod: Pod
    start: float
    end: float


# --------------------------------------------------------------------------------------------------------- weak bound
def can_host(option: Option, pod: Pod) -> bool:
    """True if ``pod`` may run on a node of ``option`` bought now: available, labels/taints admit it, one fits."""
    return (
        option.unavailable_until is None
        and solo_count(option, pod.request, 1) >= 1
        and static_failure(pod, option.labels, option.taints) is None
    )


def pod_rate_bounds(pod: Pod, options: Sequence[Option]) -> tuple[float, float, float] | None:
    """Per-dimension minimum $/h the pod forces on any node it can run on; None if no option can host it."""
    best = [float("inf")] * 3
    r = pod.request
    for o in options:
        if not can_host(o, pod):
            continue
        a = o.alloc
        shares = (
            r.cpu_milli / a.cpu_milli if a.cpu_milli else 0.0,
            r.memory_mib / a.memory_mib if a.memory_mib else 0.0,
            r.gpu_demand_milli / (a.gpus * MILLI_PER_GPU) if a.gpus else 0.0,
        )
        best = [min(b, o.price * s) for b, s in zip(best, shares, strict=True)]
    return None if best[0] == float("inf") else (best[0], best[1], best[2])


def weak_rate_bound(pods: Iterable[Pod], options: Sequence[Option]) -> float:
    """The weak lower bound ($/h) on running ``pods`` at once: ``max_d Σ_p min_o price_o × share_d(p, o)``."""
    level = [0.0, 0.0, 0.0]
    for p in pods:
        rates = pod_rate_bounds(p, options)
        if rates is not None:
            level = [x + y for x, y in zip(level, rates, strict=True)]
    return max(level)


# ----------------------------------------------------------------------------------------------------------- LP model
def have_solver() -> bool:
    """True if SciPy's LP solver is importable (the LP bound needs it)."""
    try:
        from scipy.optimize import linprog  # noqa: F401
    except ImportError:  # optional dependency
        return False
    return True


class _Model:
    """Classes × options of one workload: who may run where, shares, prices; dominated options dropped."""

    def __init__(self, examples: Sequence[Pod], options: Sequence[Option]) -> None:
        opts = [o for o in options if o.unavailable_until is None]
        allowed = np.zeros((len(examples), len(opts)), dtype=bool)
        for c, p in enumerate(examples):
            allowed[c] = [can_host(o, p) for o in opts]
        alloc = np.array(
            [[o.alloc.cpu_milli, o.alloc.memory_mib, o.alloc.gpus * MILLI_PER_GPU, o.alloc.pods] for o in opts],
            dtype=float,
        ).reshape(-1, 4)
        price = np.array([o.price for o in opts], dtype=float)
        keep = _undominated(price, alloc, allowed)
        self.options = [opts[i] for i in keep]
        self.allowed: BoolArray = allowed[:, keep]
        self.price: FloatArray = price[keep]
        alloc = alloc[keep]
        req = np.array(
            [[p.request.cpu_milli, p.request.memory_mib, p.request.gpu_demand_milli, 1] for p in examples], dtype=float
        ).reshape(-1, 4)
        # share[c, o, d]: fraction of a node of o one pod of c takes on d (0 where o lacks d: c cannot run there then)
        base = np.divide(
            req[:, None, :], alloc[None, :, :], out=np.zeros((len(req), len(alloc), 4)), where=alloc[None, :, :] > 0
        )
        cuts = cut_shares(
            req[:, :3].astype(np.int64),
            alloc[:, :3].astype(np.int64),
            np.array([p.request.gpus for p in examples], dtype=np.int64),
            np.array([0 if p.request.gpus else p.request.gpu_milli for p in examples], dtype=np.int64),
        )
        self.share: FloatArray = np.concatenate([base, cuts], axis=2)
        self.hostable: BoolArray = np.asarray(self.allowed.any(axis=1), dtype=bool)

    def class_values(self, v: FloatArray) -> FloatArray:
        """``u_c = min_{o allowed} Σ_d v[o, d] share[c, o, d]`` (inf for classes nothing hosts)."""
        per = np.einsum("cod,od->co", self.share, v)
        return np.asarray(np.where(self.allowed, per, np.inf).min(axis=1, initial=np.inf), dtype=float)

    def lift(self, v: FloatArray) -> FloatArray:
        """Make ``v`` exactly dual feasible and raise it: non-negative, every option's row summing to its price."""
        v = np.clip(np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0), 0.0, None)
        total = v.sum(axis=1)
        used = total > 0
        out = np.zeros_like(v)
        out[used] = v[used] * (self.price[used] / total[used])[:, None]
        if used.any() and not used.all():
            # options the LP did not price: split their price like the average priced option (any split is valid)
            direction = (out[used] / self.price[used][:, None]).mean(axis=0)
            out[~used] = self.price[~used][:, None] * direction[None, :]
        elif not used.any():
            out[:, 2] = self.price  # nothing priced: the GPU-only split
        return out

    def weak_duals(self) -> list[FloatArray]:
        """The duals putting every node's whole price on one dimension (those of CPU, memory and GPU give the weak
        bound)."""
        out = []
        for d in range(ND):
            v = np.zeros((len(self.price), ND))
            v[:, d] = self.price
            out.append(v)
        return out

    def solve(self, counts: dict[int, int]) -> tuple[FloatArray, FloatArray] | None:
        """Solve the LP for ``counts`` (class -> pods): (dual v over all options, y[c, o] over all classes).

        None if the solver fails. Needs SciPy (see :func:`have_solver`).
        """
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        classes = np.array(sorted(c for c, n in counts.items() if n > 0), dtype=np.intp)
        ci, co = np.nonzero(self.allowed[classes])  # one y column per (class, option) the class may use
        cc = classes[ci]
        used, orow = np.unique(co, return_inverse=True)
        ny, nx = len(co), len(used)
        shares = self.share[cc, co]  # ny x ND
        ub_r = (ND * orow[:, None] + np.arange(ND)[None, :]).ravel()
        ub_c = np.repeat(np.arange(ny), ND)
        ub_v = shares.ravel()
        nz = ub_v > 0
        x_r = np.arange(ND * nx)
        x_c = ny + np.repeat(np.arange(nx), ND)
        a_ub = coo_matrix(
            (
                np.concatenate([ub_v[nz], -np.ones(ND * nx)]),
                (np.concatenate([ub_r[nz], x_r]), np.concatenate([ub_c[nz], x_c])),
            ),
            shape=(ND * nx, ny + nx),
        ).tocsr()
        a_eq = coo_matrix((np.ones(ny), (ci, np.arange(ny))), shape=(len(classes), ny + nx)).tocsr()
        res: Any = linprog(
            np.concatenate([np.zeros(ny), self.price[used]]),
            A_ub=a_ub,
            b_ub=np.zeros(ND * nx),
            A_eq=a_eq,
            b_eq=np.array([counts[int(c)] for c in classes], dtype=float),
            bounds=(0, None),
            method="highs",
        )
        if res.status != 0 or res.x is None:
            return None
        v = np.zeros((len(self.price), ND))
        v[used] = -np.asarray(res.ineqlin.marginals, dtype=float).reshape(nx, ND)
        y = np.zeros(self.allowed.shape)
        y[cc, co] = np.clip(np.asarray(res.x[:ny], dtype=float), 0.0, None)
        return v, y


def _undominated(price: FloatArray, alloc: FloatArray, allowed: BoolArray) -> list[int]:
    """Indices of options no other option dominates (ties keep the first)."""
    n = len(price)
    keep = []
    for i in range(n):
        cover = (price <= price[i]) & (alloc >= alloc[i]).all(axis=1) & (allowed >= allowed[:, [i]]).all(axis=0)
        cover[i] = False
        # j dominates i unless i equally dominates j and comes first
        back = (price[i] <= price) & (alloc[i] >= alloc).all(axis=1) & (allowed[:, [i]] >= allowed).all(axis=0)
        strict = cover & ~(back & (np.arange(n) > i))
        if not strict.any():
            keep.append(i)
    return keep


class _Packing:
    """A feasible fractional packing of the running pods, updated greedily (its cost bounds the LP from above)."""

    def __init__(self, model: _Model) -> None:
        self.m = model
        self.y: FloatArray = np.zeros(model.allowed.shape)
        self.load: FloatArray = np.zeros((len(model.price), ND))

    def cost(self) -> float:
        return float(self.m.price @ self.load.max(axis=1, initial=0.0))

    def reset(self, y: FloatArray) -> None:
        self.y = y.copy()
        self.load = np.einsum("co,cod->od", self.y, self.m.share)

    def add(self, c: int) -> None:
        m = self.m
        opts = np.flatnonzero(m.allowed[c])
        before = self.load[opts].max(axis=1, initial=0.0)
        after = (self.load[opts] + m.share[c, opts]).max(axis=1)
        o = int(opts[np.argmin(m.price[opts] * (after - before))])
        self.y[c, o] += 1.0
        self.load[o] += m.share[c, o]

    def remove(self, c: int, left: int) -> None:
        m = self.m
        if left == 0:
            self.load -= self.y[c][:, None] * m.share[c]
            self.y[c] = 0.0
            return
        need = 1.0
        while need > 1e-12:
            opts = np.flatnonzero(self.y[c] > 1e-12)
            if not len(opts):
                break
            q = np.minimum(self.y[c, opts], need)
            before = self.load[opts].max(axis=1, initial=0.0)
            after = (self.load[opts] - q[:, None] * m.share[c, opts]).max(axis=1, initial=0.0)
            k = int(np.argmax(m.price[opts] * (before - after) / q))
            o = int(opts[k])
            self.y[c, o] -= q[k]
            self.load[o] -= q[k] * m.share[c, o]
            need -= float(q[k])


class _DualPool:
    """Pooled duals as class values ``u[c, k]``, with each one's value ``Σ_c n_c u[c, k]`` now kept up to date."""

    def __init__(self, n_classes: int) -> None:
        self.values: FloatArray = np.zeros((n_classes, 16))
        self.levels: FloatArray = np.zeros(16)
        self.size = 0

    def add(self, u: FloatArray, counts: FloatArray) -> None:
        if self.size == self.levels.shape[0]:
            self.values = np.concatenate([self.values, np.zeros_like(self.values)], axis=1)
            self.levels = np.concatenate([self.levels, np.zeros_like(self.levels)])
        u = np.where(np.isfinite(u), u, 0.0)
        self.values[:, self.size] = u
        self.levels[self.size] = float(u @ counts)
        self.size += 1

    def step(self, c: int, sign: int) -> None:
        self.levels[: self.size] += sign * self.values[c, : self.size]

    def best(self) -> float:
        return float(self.levels[: self.size].max(initial=0.0))


def lp_rate_bound(pods: Iterable[Pod], options: Sequence[Option]) -> float:
    """The LP lower bound ($/h) on running ``pods`` at once, solved exactly (the weak bound without SciPy)."""
    pods = list(pods)
    keys: dict[tuple[object, ...], int] = {}
    examples: list[Pod] = []
    counts: dict[int, int] = {}
    for p in pods:
        k = keys.setdefault(class_key(p), len(keys))
        if k == len(examples):
            examples.append(p)
        counts[k] = counts.get(k, 0) + 1
    model = _Model(examples, options)
    counts = {c: n for c, n in counts.items() if model.hostable[c]}
    weak = weak_rate_bound(pods, options)
    if not counts:
        return weak
    n = np.zeros(len(examples))
    for c, k in counts.items():
        n[c] = k
    solved = model.solve(counts) if have_solver() else None
    if solved is None:
        return weak
    lp = float(model.class_values(model.lift(solved[0]))[n > 0] @ n[n > 0])
    return max(weak, lp)


# ---------------------------------------------------------------------------------------------------- over the trace
def cost_lower_bound(
    intervals: Iterable[Interval],
    snapshot: Snapshot,
    now: float = 0.0,
    *,
    method: Literal["lp", "weak"] = "lp",
    tolerance: float = DEFAULT_TOLERANCE,
) -> float:
    """Offline lower bound (USD) on serving every interval with nodes of ``snapshot``'s pools and catalog.

    ``method`` picks the per-instant bound (see the module docstring); ``tolerance`` is the LP bound's relative gap
    to the LP optimum it may leave at an instant to save a solve. Pods no option can host are left out (no policy can
    serve them either).
    """
    if method not in ("lp", "weak"):
        raise ValueError(f"method must be 'lp' or 'weak', got {method!r}")
    if tolerance < 0:
        raise ValueError("tolerance must not be negative")
    options = build_options(snapshot, now)
    keys: dict[tuple[object, ...], int] = {}
    examples: list[Pod] = []
    spans: list[tuple[float, float, int]] = []
    for iv in intervals:
        if iv.end <= iv.start:
            continue
        k = keys.setdefault(class_key(iv.pod), len(keys))
        if k == len(examples):
            examples.append(iv.pod)
        spans.append((iv.start, iv.end, k))
    if method == "weak" or not have_solver():
        return _weak_integral(spans, examples, options)
    return _lp_integral(spans, examples, options, tolerance)


def _events(spans: Iterable[tuple[float, float, int]], keep: Sequence[bool]) -> list[tuple[float, int, int]]:
    events = []
    for start, end, c in spans:
        if keep[c]:
            events.append((start, 1, c))
            events.append((end, -1, c))
    events.sort(key=lambda e: (e[0], e[1]))
    return events


def _weak_integral(spans: list[tuple[float, float, int]], examples: list[Pod], options: Sequence[Option]) -> float:
    rates = [pod_rate_bounds(p, options) for p in examples]
    total = 0.0
    level = [0.0, 0.0, 0.0]
    events = _events(spans, [r is not None for r in rates])
    last = events[0][0] if events else 0.0
    for t, sign, c in events:
        if t > last:
            total += max(level) * (t - last) / 3600.0
            last = t
        r = rates[c]
        assert r is not None
        level = [x + sign * y for x, y in zip(level, r, strict=True)]
    return total


def _lp_integral(
    spans: list[tuple[float, float, int]], examples: list[Pod], options: Sequence[Option], tolerance: float
) -> float:
    model = _Model(examples, options)
    events = _events(spans, [bool(h) for h in model.hostable])
    if not events:
        return 0.0
    n = np.zeros(len(examples))
    counts: dict[int, int] = {}
    pool = _DualPool(len(examples))
    for v in model.weak_duals():
        pool.add(model.class_values(v), n)
    packing = _Packing(model)
    solved: set[tuple[tuple[int, int], ...]] = set()
    total = 0.0
    last = events[0][0]
    i = 0
    while i < len(events):
        t = events[i][0]
        if t > last and counts:
            lower = pool.best()
            if packing.cost() > lower + tolerance * packing.cost() + 1e-12:
                key = tuple(sorted(counts.items()))
                if key not in solved:
                    solved.add(key)
                    result = model.solve(counts)
                    if result is not None:  # else (a failed solve) the pooled duals stand
                        pool.add(model.class_values(model.lift(result[0])), n)
                        packing.reset(result[1])
                        lower = pool.best()
            total += lower * (t - last) / 3600.0
        last = max(last, t)
        while i < len(events) and events[i][0] == t:
            _, sign, c = events[i]
            i += 1
            left = counts.get(c, 0) + sign
            if left:
                counts[c] = left
            else:
                counts.pop(c, None)
            n[c] = left
            pool.step(c, sign)
            if sign > 0:
                packing.add(c)
            else:
                packing.remove(c, left)
    return total
