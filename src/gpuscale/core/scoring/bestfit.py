"""Best-fit scorer: prefer the node left with the least free capacity after placement."""

from __future__ import annotations

import numpy as np

from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.state import ClusterState, FloatArray, IntArray


class BestFit:
    """Scores a node by minus its normalised leftover (CPU, memory, GPU) after placing the request.

    Leftover on each dimension is divided by the node's capacity on that dimension; dimensions a node does not have
    (no GPUs) count as zero. The tightest fit wins.
    """

    name = "best-fit"

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Nothing to precompute."""

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """Minus the sum of normalised leftovers per candidate."""
        cpu = (state.cpu_free[candidates] - req.cpu_milli) / np.maximum(state.cpu_cap[candidates], 1)
        mem = (state.mem_free[candidates] - req.memory_mib) / np.maximum(state.mem_cap[candidates], 1)
        gcap = state.gpu_cap[candidates] * MILLI_PER_GPU
        gpu = (state.gpu_free_milli[candidates] - req.gpu_demand_milli) / np.maximum(gcap, 1)
        return -(cpu + mem + gpu).astype(np.float64)
