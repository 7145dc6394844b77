"""Mutable, vectorised free-capacity state of a set of nodes, with per-GPU milli-GPU accounting.

The scheduling simulation, the placement scorers and the openb packing benchmark all work on a :class:`ClusterState`.
Every node has a row; every physical GPU of a node has a column in ``gpu_free`` holding its free milli-GPU (0..1000).
GPU slots a node does not have hold ``-1`` so that they never fit anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import numpy.typing as npt

from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

ABSENT_GPU = -1


@dataclass(frozen=True, slots=True)
class NodeShape:
    """Static description of one node row: capacity and GPU model."""

    name: str
    capacity: Resources
    gpu_model: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request was placed: node row and the physical GPU indices it took."""

    node: int
    gpu_indices: tuple[int, ...]


class ClusterState:
    """Free capacity of ``n`` nodes as numpy arrays (see module docstring).

    Attributes are public for vectorised scorers; mutate only through :meth:`place` and :meth:`release`.
    """

    def __init__(self, shapes: Sequence[NodeShape], max_gpus: int | None = None) -> None:
        self._build([s.name for s in shapes], [s.capacity for s in shapes], [s.gpu_model for s in shapes], max_gpus)

    @classmethod
    def of(
        cls, names: list[str], caps: Sequence[Resources], models: Sequence[str | None], max_gpus: int | None = None
    ) -> ClusterState:
        """The same state as ``ClusterState(shapes)`` from the shapes' columns (no :class:`NodeShape` per row)."""
        new = object.__new__(cls)
        new._build(names, caps, models, max_gpus)
        return new

    @classmethod
    def occupied(
        cls,
        names: list[str],
        caps: Sequence[Resources],
        models: Sequence[str | None],
        requests_per_row: Sequence[Sequence[Request]],
    ) -> ClusterState:
        """The same state as ``ClusterState.of(names, caps, models)`` followed by :meth:`occupy_all` of
        ``requests_per_row``, built from per-row Python values (:func:`occupied_row`) in one conversion per array
        (every row is fresh, so its GPUs come from the ``_fresh_row`` table)."""
        width = max([*(c.gpus for c in caps), 1])
        rows = [occupied_row(c, width, reqs) for c, reqs in zip(caps, requests_per_row, strict=True)]
        return cls.from_rows(names, models, [r[0] for r in rows], [r[1] for r in rows], width)

    @classmethod
    def from_rows(
        cls,
        names: list[str],
        models: Sequence[str | None],
        values: Sequence[RowValues],
        gpu_rows: Sequence[list[int]],
        width: int,
    ) -> ClusterState:
        """The state of rows given by :func:`occupied_row` (``width``: the GPU columns, the same for every row; each
        GPU row holds ``width`` values)."""
        new = object.__new__(cls)
        new.names = names
        new.models = sorted(set(models), key=lambda m: (m is None, m or ""))
        model_index = {m: i for i, m in enumerate(new.models)}
        n = len(values)
        new.model_idx = np.fromiter([model_index[m] for m in models], dtype=np.int64, count=n)
        cols = np.fromiter(chain.from_iterable(values), dtype=np.int64, count=9 * n).reshape(n, 9).T.copy()
        new._set_columns(cols)  # each a contiguous row of one fresh array
        new.gpu_free = np.fromiter(chain.from_iterable(gpu_rows), dtype=np.int64, count=n * width).reshape(n, width)
        return new

    def _build(
        self, names: list[str], caps: Sequence[Resources], row_models: Sequence[str | None], max_gpus: int | None
    ) -> None:
        gpus = [c.gpus for c in caps]
        g = max([*gpus, max_gpus or 0, 1])
        self.names: list[str] = names
        self.models: list[str | None] = sorted(set(row_models), key=lambda m: (m is None, m or ""))
        model_index = {m: i for i, m in enumerate(self.models)}
        self.model_idx: IntArray = np.array([model_index[m] for m in row_models], dtype=np.int64)
        self.cpu_cap: IntArray = np.array([c.cpu_milli for c in caps], dtype=np.int64)
        self.mem_cap: IntArray = np.array([c.memory_mib for c in caps], dtype=np.int64)
        self.gpu_cap: IntArray = np.array(gpus, dtype=np.int64)
        self.pods_cap: IntArray = np.array([c.pods for c in caps], dtype=np.int64)
        self.cpu_free: IntArray = self.cpu_cap.copy()
        self.mem_free: IntArray = self.mem_cap.copy()
        self.pods_free: IntArray = self.pods_cap.copy()
        self.gpu_free: IntArray = np.where(
            np.arange(g)[None, :] < self.gpu_cap[:, None], MILLI_PER_GPU, ABSENT_GPU
        ).astype(np.int64)
        self.full_free: IntArray = self.gpu_cap.copy()
        """Number of entirely free GPUs per node."""
        self.max_free: IntArray = np.where(self.gpu_cap > 0, MILLI_PER_GPU, ABSENT_GPU).astype(np.int64)
        """Largest free milli-GPU on any single GPU per node."""

    def _set_columns(self, cols: IntArray) -> None:
        """The nine per-node columns from the rows of a (9, nodes) array, in the order of a row's values."""
        (
            self.cpu_cap,
            self.mem_cap,
            self.gpu_cap,
            self.pods_cap,
            self.cpu_free,
            self.mem_free,
            self.pods_free,
            self.full_free,
            self.max_free,
        ) = cols

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_free_milli(self) -> IntArray:
        """Total free milli-GPU per node."""
        out: IntArray = np.where(self.gpu_free > 0, self.gpu_free, 0).sum(axis=1)
        return out

    def total_gpu_milli(self) -> int:
        """Total GPU capacity in milli-GPU."""
        return int(self.gpu_cap.sum()) * MILLI_PER_GPU

    def allocated_gpu_milli(self) -> int:
        """GPU capacity currently allocated, in milli-GPU."""
        return self.total_gpu_milli() - int(self.gpu_free_milli.sum())

    def model_mask(self, models: frozenset[str] | None) -> BoolArray | None:
        """Rows whose GPU model is in ``models`` (None when unconstrained)."""
        if models is None:
            return None
        allowed = np.fromiter((m in models for m in self.models), dtype=bool, count=len(self.models))
        out: BoolArray = allowed[self.model_idx]  # a lookup per row (np.isin costs ten times as much)
        return out

    def fits(self, req: Request, rows: IntArray | None = None) -> BoolArray:
        """Boolean mask (over ``rows``, or all nodes) of nodes where ``req`` fits now."""
        ok = (self.cpu_free >= req.cpu_milli) & (self.mem_free >= req.memory_mib) & (self.pods_free >= 1)
        if req.gpus:
            ok &= self.full_free >= req.gpus
        elif req.gpu_milli:
            ok &= self.max_free >= req.gpu_milli
        if req.gpu_models is not None and req.wants_gpu:
            mm = self.model_mask(req.gpu_models)
            assert mm is not None
            ok &= mm
        # the whole arrays, then the rows: one gather instead of one per column (the rows are most of a planner's)
        return ok if rows is None else ok[rows]

    def fits_one(self, req: Request, i: int) -> bool:
        """True if ``req`` fits on node row ``i`` now (scalar twin of :meth:`fits`)."""
        # .item: Python ints (no numpy scalar per read, and int comparisons in fits_room): a quarter faster
        return fits_room(
            req,
            self.cpu_free.item(i),
            self.mem_free.item(i),
            self.pods_free.item(i),
            self.full_free.item(i),
            self.max_free.item(i),
            self.models[self.model_idx.item(i)],
        )

    def choose_gpus(self, req: Request, i: int) -> tuple[int, ...]:
        """Physical GPUs ``req`` would take on node ``i``.

        Whole GPUs: the lowest-indexed entirely free GPUs. A fraction: the GPU with the least free milli-GPU that
        still fits it (best fit within the node), so whole GPUs stay free for whole-GPU pods.
        """
        if req.gpus:
            row = self.gpu_free[i].tolist()
            return tuple([g for g, v in enumerate(row) if v == MILLI_PER_GPU][: req.gpus])
        if req.gpu_milli:
            return (_best_gpu(self.gpu_free[i].tolist(), req.gpu_milli),)
        return ()

    def place(self, req: Request, i: int) -> Placement:
        """Take ``req``'s resources on node ``i``. Raises ValueError if it does not fit."""
        if not self.fits_one(req, i):
            raise ValueError(f"request does not fit on node {self.names[i]}")
        self.cpu_free[i] -= req.cpu_milli
        self.mem_free[i] -= req.memory_mib
        self.pods_free[i] -= 1
        if not req.gpus and not req.gpu_milli:
            return Placement(i, ())  # no GPU taken: the GPU columns stay as they are
        gpus = self.choose_gpus(req, i)
        take = MILLI_PER_GPU if req.gpus else req.gpu_milli
        row = self.gpu_free[i].tolist()  # the update and _refresh on one copy of the row
        for g in gpus:
            row[g] -= take
            self.gpu_free[i, g] = row[g]
        self.full_free[i] = row.count(MILLI_PER_GPU)
        self.max_free[i] = max(row)
        return Placement(i, gpus)

    def occupy(self, req: Request, i: int) -> Placement:
        """Account for a pod already bound to node ``i``, even if the node looks overcommitted.

        Takes what it can (free values never go below zero; GPUs by the same rule as :meth:`place`).
        """
        if self.fits_one(req, i):
            return self.place(req, i)
        self.cpu_free[i] = max(0, int(self.cpu_free[i]) - req.cpu_milli)
        self.mem_free[i] = max(0, int(self.mem_free[i]) - req.memory_mib)
        self.pods_free[i] = max(0, int(self.pods_free[i]) - 1)
        row = self.gpu_free[i]
        taken: list[int] = []
        if req.gpus:
            for g in np.argsort(-row, kind="stable")[: req.gpus]:
                if row[g] > 0:
                    row[g] = 0
                    taken.append(int(g))
        elif req.gpu_milli and row.max() > 0:
            g = int(np.argmax(row))
            row[g] = max(0, int(row[g]) - req.gpu_milli)
            taken.append(g)
        self._refresh(i)
        return Placement(i, tuple(taken))

    def occupy_all(self, requests_per_row: Sequence[Sequence[Request]]) -> None:
        """Account for the pods already bound to every row at once (fast path of :meth:`occupy` for many pods).

        CPU, memory and pod slots are vectorised; per row, whole GPUs take the lowest entirely free GPUs, then each
        fraction the best-fitting GPU (the freest one when the node is overcommitted). Free values never go below 0.
        """
        n = len(self.names)
        cpu = [0] * n
        mem = [0] * n
        cnt = [0] * n
        gpu_cap = self.gpu_cap.tolist()
        full_free = self.full_free.tolist()
        width = self.gpu_free.shape[1]
        rows: list[list[int]] | None = None
        changed: dict[int, tuple[list[int], int, int]] = {}
        for i, reqs in enumerate(requests_per_row):
            if not reqs:
                continue
            c, m, whole, fractions = request_totals(reqs)
            cpu[i], mem[i], cnt[i] = c, m, len(reqs)
            if whole or fractions:
                if full_free[i] == gpu_cap[i]:  # an untouched node: the same requests always land the same way
                    changed[i] = _fresh_row(gpu_cap[i], width, whole, fractions)
                    continue
                if rows is None:
                    rows = self.gpu_free.tolist()
                row = rows[i]
                _take(row, whole, fractions)
                changed[i] = (row, row.count(MILLI_PER_GPU), max(row))
        if changed:
            idx = list(changed)
            vals = list(changed.values())
            self.gpu_free[idx] = [v[0] for v in vals]
            self.full_free[idx] = [v[1] for v in vals]
            self.max_free[idx] = [v[2] for v in vals]
        self.cpu_free = np.maximum(0, self.cpu_free - np.array(cpu, dtype=np.int64))
        self.mem_free = np.maximum(0, self.mem_free - np.array(mem, dtype=np.int64))
        self.pods_free = np.maximum(0, self.pods_free - np.array(cnt, dtype=np.int64))

    def release(self, req: Request, placement: Placement) -> None:
        """Give back what :meth:`place` took."""
        i = placement.node
        self.cpu_free[i] += req.cpu_milli
        self.mem_free[i] += req.memory_mib
        self.pods_free[i] += 1
        give = MILLI_PER_GPU if req.gpus else req.gpu_milli
        for g in placement.gpu_indices:
            self.gpu_free[i, g] += give
        self._refresh(i)

    def _refresh(self, i: int) -> None:
        row = self.gpu_free[i].tolist()
        self.full_free[i] = row.count(MILLI_PER_GPU)
        self.max_free[i] = max(row)

    def copy(self) -> ClusterState:
        """A deep copy (for what-if evaluation and transactions)."""
        new = object.__new__(ClusterState)
        for k, v in self.__dict__.items():
            setattr(new, k, v.copy() if isinstance(v, np.ndarray | list) else v)
        return new


RowValues = tuple[int, int, int, int, int, int, int, int, int]
"""One row of :meth:`ClusterState.from_rows`: (cpu_cap, mem_cap, gpu_cap, pods_cap, cpu_free, mem_free, pods_free,
full_free, max_free)."""


def request_totals(reqs: Sequence[Request]) -> tuple[int, int, int, tuple[int, ...]]:
    """(CPU milli, memory MiB, whole GPUs, the milli-GPU fractions in order) that ``reqs`` take on one node."""
    cpu = mem = whole = 0
    fractions: list[int] = []
    for r in reqs:
        cpu += r.cpu_milli
        mem += r.memory_mib
        whole += r.gpus
        if r.gpu_milli:
            fractions.append(r.gpu_milli)
    return cpu, mem, whole, tuple(fractions)


def occupied_row(cap: Resources, width: int, reqs: Sequence[Request]) -> tuple[RowValues, list[int]]:
    """(values, free milli-GPU per GPU column) of a node row of capacity ``cap`` in a state ``width`` GPUs wide once
    ``reqs`` are bound to it, as :meth:`ClusterState.occupy_all` accounts them on a new state. The GPU row is shared
    (``_fresh_row``): do not change it."""
    cm, mm, whole, fractions = request_totals(reqs)
    g = cap.gpus
    row, full, top = _fresh_row(g, width, whole, fractions)  # no request: the untouched row
    cpu, mem, pods = cap.cpu_milli, cap.memory_mib, cap.pods
    return (cpu, mem, g, pods, max(0, cpu - cm), max(0, mem - mm), max(0, pods - len(reqs)), full, top), row


class RowArena:
    """Rows of :meth:`ClusterState.from_rows`, each stored once (all ``width`` GPU columns wide) in growing arrays:
    the state of any list of stored rows is gathered with one indexing per array (a planner builds states again and
    again from mostly the same rows). Rows are only added; a caller drops the arena to forget them."""

    __slots__ = ("_gpus", "_model_columns", "_models", "_values", "size", "width")

    def __init__(self, width: int, capacity: int = 64) -> None:
        self.width = width
        self.size = 0
        self._values: IntArray = np.empty((9, capacity), dtype=np.int64)
        """One column per row: the row's :data:`RowValues`."""
        self._gpus: IntArray = np.empty((capacity, width), dtype=np.int64)
        self._models: list[str | None] = []
        self._model_columns: dict[tuple[str | None, ...], tuple[list[str | None], IntArray]] = {}
        """Per GPU model of each row of a state: the state's sorted models and its (read-only) model index per row
        (they depend on nothing else; states are gathered again and again from rows of the same models)."""

    def add(self, values: RowValues, gpu_row: list[int], model: str | None) -> int:
        """Store a row (``gpu_row``: ``width`` values); its slot."""
        i = self.size
        if i == self._gpus.shape[0]:
            self._values = np.concatenate([self._values, np.empty_like(self._values)], axis=1)
            self._gpus = np.concatenate([self._gpus, np.empty_like(self._gpus)])
        self._values[:, i] = values
        self._gpus[i] = gpu_row
        self._models.append(model)
        self.size = i + 1
        return i

    def alike(self, slots: Sequence[int]) -> bool:
        """True if the stored rows ``slots`` are equal in every value, GPU column and GPU model."""
        models = self._models
        first = models[slots[0]]
        if any(models[i] != first for i in slots):
            return False
        idx = np.fromiter(slots, dtype=np.intp, count=len(slots))
        values = self._values[:, idx]
        if not (values == values[:, :1]).all():
            return False
        gpus = self._gpus[idx]
        return bool((gpus == gpus[:1]).all())

    def state(self, names: list[str], slots: Sequence[int]) -> ClusterState:
        """The state whose rows are the stored ``slots`` in order, named ``names``: the same as
        :meth:`ClusterState.from_rows` of those rows."""
        new = object.__new__(ClusterState)
        idx = np.fromiter(slots, dtype=np.intp, count=len(slots))
        stored = self._models
        models = tuple([stored[i] for i in slots])
        columns = self._model_columns.get(models)
        if columns is None:
            order = sorted(set(models), key=lambda m: (m is None, m or ""))
            model_index = {m: i for i, m in enumerate(order)}
            column = np.fromiter([model_index[m] for m in models], dtype=np.int64, count=len(models))
            column.flags.writeable = False  # shared by the states of these models
            if len(self._model_columns) >= 256:
                self._model_columns.clear()
            columns = self._model_columns[models] = (order, column)
        new.names = names
        new.models = list(columns[0])
        new.model_idx = columns[1]
        # ndarray.take: one fresh C-ordered (9, rows) array, a row each; the GPU rows taken rather than fancy-indexed
        # (a quarter of the time for a (rows, width) gather)
        new._set_columns(self._values.take(idx, axis=1))
        new.gpu_free = self._gpus.take(idx, axis=0)
        return new


_FRESH_ROWS: dict[tuple[int, int, int, tuple[int, ...]], tuple[list[int], int, int]] = {}
"""Per-GPU free values of a fully free node row after :meth:`ClusterState.occupy_all`, by (GPUs, row width, whole
GPUs taken, fractions in order): the same requests on the same size of node always land the same way."""


def fits_room(req: Request, cpu: int, mem: int, pods: int, full: int, top: int, model: str | None) -> bool:
    """True if ``req`` fits a node with this room: free CPU milli, memory MiB and pod slots, entirely free GPUs,
    largest free milli-GPU on one GPU, and GPU model (what :meth:`ClusterState.fits_one` checks for a row)."""
    if cpu < req.cpu_milli or mem < req.memory_mib or pods < 1:
        return False
    if req.gpus:
        if full < req.gpus:
            return False
    elif req.gpu_milli and top < req.gpu_milli:
        return False
    return not (req.wants_gpu and req.gpu_models is not None and model not in req.gpu_models)


def _take(row: list[int], whole: int, fractions: Sequence[int]) -> None:
    """Take ``whole`` GPUs, then each fraction, from the per-GPU free values ``row`` (see :meth:`occupy_all`)."""
    if whole:
        free = [g for g, v in enumerate(row) if v == MILLI_PER_GPU]
        for g in free[:whole]:
            row[g] = 0
        short = whole - min(whole, len(free))
        if short:  # overcommitted: take the freest of what is left
            for g in sorted(range(len(row)), key=lambda x: -row[x])[:short]:
                row[g] = 0 if row[g] > 0 else row[g]
    for milli in fractions:
        g = _best_gpu(row, milli)
        if row[g] > 0:
            row[g] = max(0, row[g] - milli)


def _fresh_row(gpus: int, width: int, whole: int, fractions: tuple[int, ...]) -> tuple[list[int], int, int]:
    """(per-GPU free values, entirely free GPUs, largest free value) of a free node with ``gpus`` GPUs in a row of
    ``width`` after taking ``whole`` GPUs and ``fractions`` (remembered in ``_FRESH_ROWS``; do not change the row)."""
    key = (gpus, width, whole, fractions)
    done = _FRESH_ROWS.get(key)
    if done is None:
        row = [MILLI_PER_GPU] * gpus + [ABSENT_GPU] * (width - gpus)
        _take(row, whole, fractions)
        done = (row, row.count(MILLI_PER_GPU), max(row))
        if len(_FRESH_ROWS) > 4096:
            _FRESH_ROWS.clear()
        _FRESH_ROWS[key] = done
    return done


def fresh_gpu_row(gpus: int, whole: int, fractions: tuple[int, ...]) -> tuple[list[int], int, int]:
    """(free milli-GPU per physical GPU, entirely free GPUs, largest free value; ``[-1]`` and -1 without GPUs) of a
    node with ``gpus`` GPUs once pods taking ``whole`` GPUs and the ``fractions`` are bound, as
    :meth:`ClusterState.occupy_all` accounts them. The row is shared: copy it before changing it."""
    return _fresh_row(gpus, max(gpus, 1), whole, fractions)


def best_gpu(row: list[int], milli: int) -> int:
    """The GPU of ``row`` (free milli-GPU per GPU) that :meth:`ClusterState.place` gives a ``milli`` fraction."""
    return _best_gpu(row, milli)


def gpu_room(gpus: int, requests: Iterable[Request]) -> tuple[int, int]:
    """(entirely free GPUs, largest free milli-GPU on one GPU; -1 without GPUs) of a node with ``gpus`` GPUs once
    ``requests`` are bound to it, as :meth:`ClusterState.occupy_all` accounts them on a new state."""
    whole = 0
    fractions: list[int] = []
    for r in requests:
        whole += r.gpus
        if r.gpu_milli:
            fractions.append(r.gpu_milli)
    if not whole and not fractions:
        return gpus, MILLI_PER_GPU if gpus > 0 else ABSENT_GPU
    _, full, top = _fresh_row(gpus, max(gpus, 1), whole, tuple(fractions))
    return full, top


def _best_gpu(row: list[int], milli: int) -> int:
    """Index of the GPU with the least free milli-GPU that still holds ``milli`` (the first such on ties); the
    freest GPU (first on ties) when none does."""
    best = -1
    for g, v in enumerate(row):
        if v >= milli and (best < 0 or v < row[best]):
            best = g
    if best >= 0:
        return best
    return row.index(max(row))
