"""Best-fit scorer, as the FGD paper (Weng et al., ATC'23) defines its BestFit baseline.

A node's score is minus the weighted sum of what would be left free after placement, CPU and GPU weighted 0.5 each,
each dimension normalised by the largest node's capacity in the cluster (not the node's own capacity: a big node
half empty is a worse fit than a small node half empty). The tightest node wins.
"""

from __future__ import annotations

import numpy as np

from gpuscale.core.resources import Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.scoring.features import gpu_left, max_specs
from gpuscale.core.state import ClusterState, FloatArray, IntArray


class BestFit:
    """Minus the weighted, cluster-normalised CPU + GPU leftover after placing the request."""

    name = "best-fit"
    rowwise = True
    """Each row's score is made from that row alone by the same floating-point operations whatever the other
    candidates (no matrix product, no reduction across rows): equal rows score alike, bit for bit, after any history
    of calls (see :class:`~gpuscale.core.scoring.base.Scorer`)."""

    def __init__(self, cpu_weight: float = 0.5, gpu_weight: float = 0.5) -> None:
        self.cpu_weight = cpu_weight
        self.gpu_weight = gpu_weight
        self._spec: tuple[float, float, float] | None = None

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Record the cluster's largest node capacities for normalisation."""
        self._spec = max_specs(state)

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """Minus the normalised leftover per candidate."""
        cpu_max, _, gpu_max = self._spec or max_specs(state)
        cpu = (state.cpu_free[candidates] - req.cpu_milli) / cpu_max
        gpu = (np.add.reduce(gpu_left(state, candidates), axis=1) - req.gpu_demand_milli) / gpu_max  # == .sum(axis=1)
        out: FloatArray = -(self.cpu_weight * cpu + self.gpu_weight * gpu).astype(np.float64)
        return out
