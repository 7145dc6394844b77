"""Fill waste, fragmentation and a reserve ("fill-reserve"): gpuscale's second workload-aware placement scorer.

It adds two terms to fill-frag (``fillfrag.py``), each of which paid on the openb trace:

1. **A reserve for scarce slots.** fill-frag is local: on openb it packs the last tenth of the cluster better than
   FGD but loses 8-GPU pods from 65 % of arrived demand on, because breaking one more empty 8-GPU node costs the same
   few milli-GPU of local waste as the first one, and every 8-GPU pod that fails is 8 GPUs of demand lost. So for each
   request shape ``t`` of the workload the scorer keeps the *supply* ``S_t``: how many copies of ``t`` the cluster
   could still take (per node, whole copies by per-GPU remnants, CPU and memory, summed over nodes). The copies of
   ``t`` still to come before the cluster is full are taken as Poisson with mean ``lam_t = p_t * F / mu`` (``p_t`` the
   shape's share of pods, ``F`` the cluster's free milli-GPU, ``mu`` the mean GPU demand per pod), so one slot of
   ``t`` is worth ``d_t * P(N_t >= S_t)``, the demand ``d_t`` it saves from failing. A placement that removes slots
   pays their worth. While slots are plentiful the term is zero; as a shape's slots run short, the nodes that still
   hold them are kept for it.
2. **FGD's fragmentation beside the fill waste.** fill-frag's waste (for each shape, the GPU left unused after
   filling the node with copies of it, weighted toward small fractions) sees remnants and CPU-starved GPUs; FGD's
   fragmentation (for each typical shape, all the free GPU of a node the shape cannot use at all) sees whole-node
   shapes better. With multi-GPU pods half of the demand, fill waste alone ends 0.3 points behind FGD; the sum of
   the two growths, FGD's weighted by ``fgd_weight``, beats both.

A node's score is ``-(fill waste growth) - fgd_weight * (fragmentation growth) - reserve cost`` (milli-GPU; higher
is better, the lowest row wins ties). ``quantum`` optionally rounds scores to that many milli-GPU so near-equal nodes
tie (off: it did not pay here). One set of constants serves every workload; the workload enters only through its
request distribution. Per-node values are cached and recomputed only for rows whose free capacity changed.
"""

from __future__ import annotations

import math

import numpy as np

from gpuscale.core.resources import Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.scoring.features import gpu_left, gpu_left_after
from gpuscale.core.scoring.fgd import RowCache, TypicalShapes, expected_fragmentation, typical_shapes
from gpuscale.core.scoring.fillfrag import gpu_shapes
from gpuscale.core.state import BoolArray, ClusterState, FloatArray, IntArray


class SlotModel:
    """Copies of each GPU request shape that node rows can hold at once, and the rows' expected fill waste."""

    def __init__(self, shapes: TypicalShapes) -> None:
        self.shapes = shapes
        self.sizes, self.size_of = np.unique(shapes.per_gpu, return_inverse=True)
        self.count = np.maximum(shapes.count, 1)
        self.inv_cpu = 1.0 / np.maximum(shapes.cpu, 1)
        self.inv_mem = 1.0 / np.maximum(shapes.mem, 1)
        self.access_t: BoolArray = shapes.access.T.copy()  # (models, T)
        self.used = shapes.weight * shapes.count * shapes.per_gpu  # (T,) weighted milli-GPU per copy

    def subset(self, idx: IntArray) -> SlotModel:
        """The model restricted to the shapes ``idx``."""
        return SlotModel(
            TypicalShapes(
                cpu=self.shapes.cpu[idx],
                mem=self.shapes.mem[idx],
                count=self.shapes.count[idx],
                per_gpu=self.shapes.per_gpu[idx],
                weight=self.shapes.weight[idx],
                access=self.shapes.access[idx],
            )
        )

    def copies(self, left: IntArray, cpu: IntArray, mem: IntArray, model: IntArray) -> FloatArray:
        """Copies per row and shape (R x T): whole by GPU, fluid by CPU and memory; 0 where the model is not allowed."""
        pieces = (left[:, None, :] // self.sizes[None, :, None]).sum(axis=2)
        out: FloatArray = np.minimum(pieces[:, self.size_of] // self.count, np.multiply.outer(cpu, self.inv_cpu))
        np.minimum(out, np.multiply.outer(mem, self.inv_mem), out=out)
        out *= self.access_t[model]
        return out

    def waste(self, left: IntArray, copies: FloatArray) -> FloatArray:
        """Expected fill waste (milli-GPU) of rows with per-GPU free ``left`` and ``copies`` from :meth:`copies`."""
        out: FloatArray = left.sum(axis=1) - copies @ self.used
        return out


def poisson_tail(lam: FloatArray, k: FloatArray) -> FloatArray:
    """``P(N >= k)`` for ``N ~ Poisson(lam)``, elementwise (1 for ``k <= 0``), by the Wilson-Hilferty approximation.

    ``P(N >= k) = P(chi2(2k) <= 2 lam)``, and ``(chi2(v) / v) ** (1/3)`` is close to normal with mean
    ``1 - 2 / (9v)`` and variance ``2 / (9v)`` (within about 0.01 from k = 1 on).
    """
    kk = np.maximum(k, 1.0)
    z = (np.cbrt(lam / kk) - 1.0 + 1.0 / (9.0 * kk)) * np.sqrt(9.0 * kk)
    out: FloatArray = np.zeros(z.size)
    live = np.flatnonzero(z > -9.0)  # below, the tail is under 1e-18
    out[live] = [0.5 * math.erfc(-v / math.sqrt(2.0)) for v in z[live].tolist()]
    out[k <= 0] = 1.0
    return out


class FillReserve:
    """Minus the growth of fill waste and fragmentation and the worth of the slots a placement uses up (module doc)."""

    name = "fill-reserve"

    def __init__(
        self,
        size_power: float = -1.0,
        fgd_weight: float = 4.0,
        reserve: float = 1.0,
        quantum: float = 0.0,
        min_worth: float = 1e-3,
    ) -> None:
        self.size_power = size_power
        self.fgd_weight = fgd_weight
        self.reserve = reserve
        self.quantum = quantum
        self.min_worth = min_worth
        """Shapes whose slot is worth less than this share of their demand are left out of the reserve."""
        self._model: SlotModel | None = None
        self._frag: TypicalShapes | None = None
        self._cache = RowCache()
        self._p: FloatArray = np.zeros(0)
        self._demand: FloatArray = np.zeros(0)
        self._mu = 1.0
        self._slots: FloatArray = np.zeros((0, 0))
        self._seen: IntArray = np.zeros(0, dtype=np.int64)
        self._free: FloatArray = np.zeros(0)

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Derive the request shapes from ``workload`` (one whole GPU without one); reset the caches."""
        shapes = typical_shapes(state, workload, 1.0, with_memory=True)
        if not (shapes.count > 0).any():
            shapes = typical_shapes(state, None)
        mu = float((shapes.weight * shapes.count * shapes.per_gpu).sum())
        gpu = shapes.count > 0
        self._p = shapes.weight[gpu]
        waste_shapes = gpu_shapes(shapes, self.size_power)
        self._demand = (waste_shapes.count * waste_shapes.per_gpu).astype(np.float64)
        self._mu = max(mu, 1.0)
        self._model = SlotModel(waste_shapes)
        self._frag = typical_shapes(state, workload, 0.95)
        self._reset(state)

    def _reset(self, state: ClusterState) -> None:
        """Forget every per-row value (a new or resized cluster); the request shapes stay."""
        assert self._model is not None
        self._cache.reset(state)
        self._slots = np.zeros((len(state), len(self._model.used)))
        self._seen = np.full(len(state), -1, dtype=np.int64)
        self._free = np.zeros(len(state))

    def _sync(self, state: ClusterState) -> SlotModel:
        """Bring the per-row slot counts and free GPU totals up to date with ``state``."""
        if self._model is None:
            self.prepare(state, None)
        elif self._slots.shape[0] != len(state) or self._cache.n != len(state):
            self._reset(state)
        model = self._model
        assert model is not None
        self._cache.sync(state)
        rows = np.flatnonzero(self._seen != self._cache.version)
        if rows.size:
            self._seen[rows] = self._cache.version[rows]
            left = gpu_left(state, rows)
            self._free[rows] = left.sum(axis=1)
            self._slots[rows] = np.floor(
                model.copies(left, state.cpu_free[rows], state.mem_free[rows], state.model_idx[rows])
            )
        return model

    def slot_worth(self, state: ClusterState) -> FloatArray:
        """Per GPU shape, the expected demand (milli-GPU) one more slot of it would save, given the cluster now."""
        self._sync(state)
        return self._worth()

    def _worth(self) -> FloatArray:
        lam = self._p * float(self._free.sum()) / self._mu
        out: FloatArray = self._demand * poisson_tail(lam, self._slots.sum(axis=0))
        return out

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """Per candidate: minus the growth of waste and fragmentation, minus the worth of the slots used up."""
        model = self._sync(state)
        cache = self._cache
        key = (req.cpu_milli, req.memory_mib, req.gpus, req.gpu_milli)
        before, rows = cache.stale("before", candidates)
        if rows.size:
            before[rows] = self._local(state, rows, gpu_left(state, rows), state.cpu_free[rows],
                                       state.mem_free[rows], model)  # fmt: skip
        after, rows = cache.stale(key, candidates)
        if rows.size:
            after[rows] = self._local(state, rows, gpu_left_after(state, req, rows),
                                      state.cpu_free[rows] - req.cpu_milli, state.mem_free[rows] - req.memory_mib,
                                      model)  # fmt: skip
        score: FloatArray = before[candidates] - after[candidates]
        if self.reserve > 0:
            score -= self.reserve * self._reserve_cost(state, req, candidates, model)
        if self.quantum > 0:
            score = np.round(score / self.quantum)
        return score

    def _local(
        self, state: ClusterState, rows: IntArray, left: IntArray, cpu: IntArray, mem: IntArray, model: SlotModel
    ) -> FloatArray:
        """Fill waste plus ``fgd_weight`` times FGD's fragmentation of ``rows`` with the given free capacity."""
        mdl = state.model_idx[rows]
        out = model.waste(left, model.copies(left, cpu, mem, mdl))
        if self.fgd_weight > 0 and self._frag is not None:
            out += self.fgd_weight * expected_fragmentation(self._frag, left, cpu, mdl)
        return out

    def _reserve_cost(self, state: ClusterState, req: Request, rows: IntArray, model: SlotModel) -> FloatArray:
        """Worth of the slots each candidate row would lose (only shapes whose slots are worth something count)."""
        cost = np.zeros(rows.size)
        worth = self._worth()
        hot = np.flatnonzero(worth >= self.min_worth * self._demand)
        if hot.size == 0:
            return cost
        have = self._slots[np.ix_(rows, hot)]
        sel = np.flatnonzero(have.any(axis=1))
        if sel.size == 0:
            return cost
        r = rows[sel]
        after = model.subset(hot).copies(gpu_left_after(state, req, r), state.cpu_free[r] - req.cpu_milli,
                                         state.mem_free[r] - req.memory_mib, state.model_idx[r])  # fmt: skip
        cost[sel] = (have[sel] - np.floor(after)) @ worth[hot]
        return cost
