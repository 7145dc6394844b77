"""Fragmentation Gradient Descent (FGD), the scorer of Weng et al., USENIX ATC'23, from the paper's description.

The workload is summarised by its *typical* requests: the most frequent (CPU, GPU count, milli-GPU per GPU, GPU
models) shapes that together make up 95 % of the pods, with their frequencies renormalised. A node's fragmentation
is the expected amount of its free GPU (milli-GPU) that a random typical request could not use: all of it when the
request cannot run there (not enough CPU, no GPU that fits, wrong GPU model; and for CPU-only requests, which use no
GPU), otherwise only the free milli-GPU on GPUs too small for that request. FGD places a request on the node whose
fragmentation grows the least.

Per-node values are cached and recomputed only for the rows whose free capacity changed since the last call, so a
placement costs O(changed rows x typical shapes x GPUs) instead of O(nodes x ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.scoring.features import gpu_left, gpu_left_after
from gpuscale.core.state import BoolArray, ClusterState, FloatArray, IntArray


@dataclass(frozen=True, slots=True)
class TypicalShapes:
    """Typical request shapes as parallel arrays (length T) plus a model-access table (T x models)."""

    cpu: IntArray
    mem: IntArray
    count: IntArray
    """GPUs needed (0 for CPU-only)."""
    per_gpu: IntArray
    """Milli-GPU needed on each of those GPUs (1000 for whole GPUs)."""
    weight: FloatArray
    access: BoolArray
    """``access[t, m]``: shape ``t`` may run on GPU model index ``m`` of the cluster state."""


def typical_shapes(
    state: ClusterState, workload: Workload | None, coverage: float = 0.95, with_memory: bool = False
) -> TypicalShapes:
    """The most frequent request shapes covering ``coverage`` of the workload, renormalised.

    Memory is part of the shape only if ``with_memory`` (FGD ignores it). Without a workload, one whole GPU.
    """
    counts: dict[tuple[int, int, int, int, frozenset[str] | None], float] = {}
    classes = workload.classes if workload is not None and workload.classes else ()
    for c in classes:
        r = c.request
        count = r.gpus if r.gpus else (1 if r.gpu_milli else 0)
        per = MILLI_PER_GPU if r.gpus else r.gpu_milli
        key = (r.cpu_milli, r.memory_mib if with_memory else 0, count, per, r.gpu_models if count else None)
        counts[key] = counts.get(key, 0.0) + c.weight
    if not counts:
        counts[(0, 0, 1, MILLI_PER_GPU, None)] = 1.0
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][:4]))
    total = sum(w for _, w in ranked)
    kept: list[tuple[tuple[int, int, int, int, frozenset[str] | None], float]] = []
    cum = 0.0
    for key, w in ranked:
        kept.append((key, w))
        cum += w
        if cum >= coverage * total:
            break
    norm = sum(w for _, w in kept)
    access = np.ones((len(kept), len(state.models)), dtype=np.bool_)
    for t, ((_, _, _, _, models), _) in enumerate(kept):
        if models is not None:
            access[t] = [m in models for m in state.models]
    return TypicalShapes(
        cpu=np.array([k[0] for k, _ in kept], dtype=np.int64),
        mem=np.array([k[1] for k, _ in kept], dtype=np.int64),
        count=np.array([k[2] for k, _ in kept], dtype=np.int64),
        per_gpu=np.array([k[3] for k, _ in kept], dtype=np.int64),
        weight=np.array([w / norm for _, w in kept], dtype=np.float64),
        access=access,
    )


def expected_fragmentation(
    shapes: TypicalShapes, left: IntArray, cpu: IntArray, model: IntArray, mem: IntArray | None = None
) -> FloatArray:
    """FGD's fragmentation (milli-GPU) of rows with per-GPU free ``left`` (R x G), free ``cpu`` and GPU ``model``.

    ``mem`` (free memory) is checked too when given.
    """
    total = left.sum(axis=1).astype(np.float64)  # (R,)
    per = shapes.per_gpu[None, :, None]  # (1,T,1)
    fits_gpu = left[:, None, :] >= per  # (R,T,G)
    n_fit = fits_gpu.sum(axis=2)  # (R,T)
    small = (left[:, None, :] * ~fits_gpu).sum(axis=2).astype(np.float64)  # free milli on GPUs too small, (R,T)
    ok = (n_fit >= shapes.count[None, :]) & (cpu[:, None] >= shapes.cpu[None, :])
    if mem is not None:
        ok &= mem[:, None] >= shapes.mem[None, :]
    ok &= shapes.access[:, model].T
    ok &= shapes.count[None, :] > 0  # CPU-only requests never use the free GPU
    frag = np.where(ok, small, total[:, None])  # (R,T)
    result: FloatArray = frag @ shapes.weight
    return result


Evaluator = Callable[[IntArray, IntArray, IntArray, IntArray], FloatArray]
"""Maps (per-GPU free milli-GPU, free CPU, free memory, model index) of rows to one value per row."""


def lowest_after(state: ClusterState, req: Request, rows: IntArray, evaluate: Evaluator) -> tuple[FloatArray, IntArray]:
    """``evaluate`` of each row after placing ``req`` there, and the physical GPU used for a fraction.

    A fractional request tries every GPU that fits it and keeps the lowest value (first GPU on ties); other
    requests are placed as :meth:`ClusterState.place` would. The GPU index is -1 for non-fractional requests.
    """
    cpu = state.cpu_free[rows] - req.cpu_milli
    mem = state.mem_free[rows] - req.memory_mib
    model = state.model_idx[rows]
    if not req.gpu_milli:
        return evaluate(gpu_left_after(state, req, rows), cpu, mem, model), np.full(rows.size, -1, dtype=np.int64)
    left = gpu_left(state, rows)
    best = np.full(rows.size, np.inf)
    arg = np.full(rows.size, -1, dtype=np.int64)
    for j in range(left.shape[1]):
        ok = left[:, j] >= req.gpu_milli
        if not ok.any():
            continue
        trial = left.copy()
        trial[:, j] -= req.gpu_milli
        val = np.where(ok, evaluate(trial, cpu, mem, model), np.inf)
        better = val < best
        best = np.where(better, val, best)
        arg = np.where(better, j, arg)
    return best, arg


class RowCache:
    """Per-row cached values keyed by a request shape, invalidated when a row's free capacity changes."""

    def __init__(self) -> None:
        self.n = 0
        self.version: IntArray = np.zeros(0, dtype=np.int64)
        self._cpu: IntArray = np.zeros(0, dtype=np.int64)
        self._mem: IntArray = np.zeros(0, dtype=np.int64)
        self._gpu: IntArray = np.zeros((0, 0), dtype=np.int64)
        self._tick = 0
        self.values: dict[object, tuple[FloatArray, IntArray]] = {}

    def reset(self, state: ClusterState) -> None:
        self.n = len(state)
        self.version = np.zeros(self.n, dtype=np.int64)
        self._cpu = state.cpu_free.copy()
        self._mem = state.mem_free.copy()
        self._gpu = state.gpu_free.copy()
        self._tick = 0
        self.values = {}

    def sync(self, state: ClusterState) -> None:
        """Bump the version of every row whose free capacity changed since the last sync."""
        if len(state) != self.n or state.gpu_free.shape != self._gpu.shape:
            self.reset(state)
            return
        changed = (state.cpu_free != self._cpu) | (state.mem_free != self._mem)
        changed |= (state.gpu_free != self._gpu).any(axis=1)
        rows = np.flatnonzero(changed)
        if rows.size:
            self._tick += 1
            self.version[rows] = self._tick
            self._cpu[rows] = state.cpu_free[rows]
            self._mem[rows] = state.mem_free[rows]
            self._gpu[rows] = state.gpu_free[rows]

    def stale(self, key: object, rows: IntArray) -> tuple[FloatArray, IntArray]:
        """The value array for ``key`` and the subset of ``rows`` whose value must be recomputed."""
        entry = self.values.get(key)
        if entry is None:
            entry = (np.zeros(self.n, dtype=np.float64), np.full(self.n, -1, dtype=np.int64))
            self.values[key] = entry
        vals, ver = entry
        bad = rows[ver[rows] != self.version[rows]]
        ver[bad] = self.version[bad]
        return vals, bad


class FGD:
    """Minus the growth of expected GPU fragmentation on the node if the request is placed there.

    With ``quantize`` (the default), the score is the paper simulator's integer node score: the fragmentation drop in
    GPUs through a sigmoid, times 100, truncated (``int(100 / (1 + exp(-(before - after) / 1000)))``); nodes whose
    drops fall in the same integer tie, and the caller takes the first (lowest-row) node of the best score, as the
    simulator takes the lowest node name. Coarse scores make FGD fill low rows first among near-equal choices instead
    of spreading onto empty nodes for a few milli-GPU of difference. A fraction goes to the first GPU of the best
    integer score on the chosen node. ``quantize=False`` scores the exact drop (ties still to the lowest row).
    """

    name = "fgd"

    def __init__(self, coverage: float = 0.95, quantize: bool = True) -> None:
        self.coverage = coverage
        self.quantize = quantize
        self._shapes: TypicalShapes | None = None
        self._cache = RowCache()

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Derive the typical request shapes from ``workload`` and reset the per-row caches."""
        self._shapes = typical_shapes(state, workload, self.coverage)
        self._cache.reset(state)

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """The node score per candidate (higher is better): the integer score, or fragmentation before minus after."""
        self._cache.sync(state)
        before = self._before(state, candidates)
        after, _ = self._after(state, req, candidates)
        result: FloatArray = -after[candidates] if self.quantize else before[candidates] - after[candidates]
        return result

    def gpus_for(self, state: ClusterState, req: Request, node: int) -> tuple[int, ...] | None:
        """The GPU FGD would give a fractional ``req`` on ``node`` (None for other requests)."""
        if not req.gpu_milli:
            return None
        self._cache.sync(state)
        rows = np.array([node], dtype=np.int64)
        self._before(state, rows)
        _, choice = self._after(state, req, rows)
        return (int(choice[node]),) if choice[node] >= 0 else None

    def _before(self, state: ClusterState, rows: IntArray) -> FloatArray:
        """Expected fragmentation of ``rows`` as they are (cached per row version)."""
        shapes = self._shapes
        if shapes is None:
            self.prepare(state, None)
            shapes = self._shapes
        assert shapes is not None
        before, stale = self._cache.stale("before", rows)
        if stale.size:
            left = gpu_left(state, stale)
            before[stale] = expected_fragmentation(shapes, left, state.cpu_free[stale], state.model_idx[stale])
        return before

    def _after(self, state: ClusterState, req: Request, rows: IntArray) -> tuple[FloatArray, FloatArray]:
        """Per row after placing ``req`` (the best GPU for a fraction): the fragmentation, or with ``quantize``
        minus the integer score; and that GPU. ``_before`` must be current for ``rows``."""
        shapes = self._shapes
        assert shapes is not None
        key = (req.cpu_milli, req.gpus, req.gpu_milli)
        after, stale = self._cache.stale(key, rows)
        choice, _ = self._cache.stale(("gpu", *key), rows)
        if stale.size:
            before = self._cache.values["before"][0][stale]

            def evaluate(left: IntArray, cpu: IntArray, mem: IntArray, model: IntArray) -> FloatArray:
                frag = expected_fragmentation(shapes, left, cpu, model)
                if not self.quantize:
                    return frag
                drop = (before - frag) / MILLI_PER_GPU
                return -np.floor(100.0 / (1.0 + np.exp(-drop)))

            after[stale], choice[stale] = lowest_after(state, req, stale, evaluate)
        return after, choice
