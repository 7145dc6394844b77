"""Fill-aware fragmentation ("fill-frag"): gpuscale's own workload-aware placement scorer.

FGD (Weng et al., ATC'23) asks, for each typical request shape, whether *one* more such request fits on a node, and
counts the node's free GPU as fragmented if not. That misses the commonest way GPUs get stranded in the openb trace:
a node takes one more typical request, then runs out of CPU or memory with GPUs still free (8-GPU nodes with 12 cores
per GPU sit next to 2-GPU nodes with 52), and it ignores what remains on each GPU after several fractional requests.

fill-frag asks, for each request shape ``t`` of the workload (CPU, memory, GPU count, milli-GPU per GPU, allowed GPU
models; all shapes, multi-GPU and rare ones included), how many copies of ``t`` the node could hold *at once*: each
GPU holds ``free // per_gpu`` pieces, the node ``pieces // count`` copies by GPU, and CPU and memory bound the copies
fluidly. The free milli-GPU left after that fill is ``t``'s waste on the node. The node's expected waste is the mean
over shapes, weighted by frequency times ``(1000 / per_gpu) ** -size_power`` (by default, the number of such requests
one GPU holds: small fractions matter more because they are what can still use the remnants of shared GPUs). A
request goes where the expected waste grows the least. The workload enters only through its distribution: one set of
constants serves every workload.

Per-node values are cached and recomputed only for rows whose free capacity changed (see ``fgd.RowCache``).
"""

from __future__ import annotations

import numpy as np

from gpuscale.core.memo import Memo
from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.scoring.features import gpu_left, gpu_left_after
from gpuscale.core.scoring.fgd import RowCache, TypicalShapes, typical_shapes
from gpuscale.core.state import ClusterState, FloatArray, IntArray


class WasteModel:
    """Expected fill waste of node rows for a set of GPU request shapes (see the module docstring).

    Calling it with the rows' per-GPU free milli-GPU ``left`` (R x G), free ``cpu``, free ``mem`` and GPU ``model``
    index returns, per row, the frequency-weighted free milli-GPU that filling the row with copies of each shape
    would leave unused.
    """

    def __init__(self, shapes: TypicalShapes) -> None:
        self.shapes = shapes
        self.sizes, self.size_of = np.unique(shapes.per_gpu, return_inverse=True)
        self.count = shapes.count
        self.inv_cpu = 1.0 / np.maximum(shapes.cpu, 1)
        self.inv_mem = 1.0 / np.maximum(shapes.mem, 1)
        # weight x GPU milli per copy, zero where the shape may not use the model: (models, T)
        self.used_weight = (shapes.access * (shapes.weight * shapes.count * shapes.per_gpu)[:, None]).T.copy()

    def __call__(self, left: IntArray, cpu: IntArray, mem: IntArray, model: IntArray) -> FloatArray:
        total = left.sum(axis=1).astype(np.float64)
        pieces = (left[:, None, :] // self.sizes[None, :, None]).sum(axis=2)  # (R, distinct per-GPU sizes)
        copies = np.minimum(pieces[:, self.size_of] // self.count, np.multiply.outer(cpu, self.inv_cpu))
        np.minimum(copies, np.multiply.outer(mem, self.inv_mem), out=copies)
        waste: FloatArray = total - (copies * self.used_weight[model]).sum(axis=1)
        return waste


def gpu_shapes(shapes: TypicalShapes, size_power: float) -> TypicalShapes:
    """The GPU shapes of ``shapes``, reweighted by ``(per_gpu / 1000) ** size_power`` and renormalised."""
    keep = shapes.count > 0
    w = shapes.weight[keep] * (shapes.per_gpu[keep] / MILLI_PER_GPU) ** size_power
    return TypicalShapes(
        cpu=shapes.cpu[keep],
        mem=shapes.mem[keep],
        count=shapes.count[keep],
        per_gpu=shapes.per_gpu[keep],
        weight=w / w.sum(),
        access=shapes.access[keep],
    )


_WASTE_MODELS: Memo[WasteModel] = Memo(256)
"""Per (workload object, the state's GPU models, constants): the waste model (read-only; it depends on nothing else
of the state). Workloads are memoised by their request counts (:meth:`Workload.from_requests`), so the same counts
hit here."""


class FillFrag:
    """Minus the growth of the node's expected fill waste if the request is placed there (module docstring)."""

    name = "fill-frag"
    rowwise = True
    """Each row's score is made from that row alone by the same floating-point operations whatever the other
    candidates (no matrix product, no reduction across rows): equal rows score alike, bit for bit, after any history
    of calls (see :class:`~gpuscale.core.scoring.base.Scorer`)."""

    def __init__(self, coverage: float = 1.0, size_power: float = -1.0) -> None:
        self.coverage = coverage
        self.size_power = size_power
        self._waste: WasteModel | None = None
        self._cache = RowCache()

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Derive the request shapes (with memory) from ``workload`` (one whole GPU without one); reset caches."""
        self._waste = _WASTE_MODELS.get(
            lambda: self._waste_model(state, workload),
            (tuple(state.models), self.coverage, self.size_power),
            objects=(workload,),
        )
        self._cache.reset(state)

    def _waste_model(self, state: ClusterState, workload: Workload | None) -> WasteModel:
        shapes = typical_shapes(state, workload, self.coverage, with_memory=True)
        if not (shapes.count > 0).any():
            shapes = typical_shapes(state, None)
        return WasteModel(gpu_shapes(shapes, self.size_power))

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """Expected waste before minus after placement, per candidate (higher is better)."""
        if self._waste is None:
            self.prepare(state, None)
        waste = self._waste
        assert waste is not None
        cache = self._cache
        cache.sync(state)
        before, rows = cache.stale("before", candidates)
        if rows.size:
            before[rows] = waste(
                gpu_left(state, rows), state.cpu_free[rows], state.mem_free[rows], state.model_idx[rows]
            )
        after, rows = cache.stale((req.cpu_milli, req.memory_mib, req.gpus, req.gpu_milli), candidates)
        if rows.size:
            after[rows] = waste(
                gpu_left_after(state, req, rows),
                state.cpu_free[rows] - req.cpu_milli,
                state.mem_free[rows] - req.memory_mib,
                state.model_idx[rows],
            )
        return before[candidates] - after[candidates]
