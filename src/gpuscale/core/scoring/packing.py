"""GPU-packing scorer, the FGD paper's "GpuPacking" baseline.

Preference tiers, best first: (1) a fractional request that fits on an already shared GPU (the fuller that GPU, the
better); (2) a node that already has GPUs in use but must give whole free GPUs (fewer free GPUs consumed is better);
(3) a node whose GPUs are all free (nodes with fewer GPUs first). CPU-only requests score the same everywhere.
"""

from __future__ import annotations

import numpy as np

from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.scoring.features import gpu_left
from gpuscale.core.state import ClusterState, FloatArray, IntArray


class GpuPacking:
    """Tiered packing score: shared GPU > used node > idle node."""

    name = "gpu-packing"
    rowwise = True
    """Each row's score is made from that row alone by the same floating-point operations whatever the other
    candidates (no matrix product, no reduction across rows): equal rows score alike, bit for bit, after any history
    of calls (see :class:`~gpuscale.core.scoring.base.Scorer`)."""

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Nothing to precompute."""

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """Tier score per candidate (higher is better)."""
        if not req.wants_gpu:
            return np.zeros(candidates.size)
        left = gpu_left(state, candidates)
        ngpu = state.gpu_cap[candidates]
        full = state.full_free[candidates]
        idle_node = full == ngpu
        score = 2.0 - full / 100.0  # tier 3: idle node; fewer GPUs is better
        used = ~idle_node
        if req.gpu_milli:
            shared_fit = np.where((left >= req.gpu_milli) & (left < MILLI_PER_GPU), left, MILLI_PER_GPU + 1)
            best = shared_fit.min(axis=1)
            on_shared = best <= MILLI_PER_GPU
            score = np.where(used, 4.0 - 1.0 / 100.0, score)  # tier 2: takes one free GPU of a used node
            score = np.where(on_shared, 6.0 - best / MILLI_PER_GPU, score)  # tier 1: fuller shared GPU first
        else:
            score = np.where(used, 4.0 - req.gpus / 100.0, score)
        return score.astype(np.float64)
