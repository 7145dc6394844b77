"""Dot-product scorer (Tetris-style alignment), as the FGD paper's "DotProd" baseline configures it.

The node's free (CPU, total GPU) vector and the request's (CPU, GPU) vector are normalised by the largest node's
capacity; the node with the *smallest* dot product wins, i.e. the request goes where little of what it uses is left.
"""

from __future__ import annotations

import numpy as np

from gpuscale.core.resources import Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.scoring.features import gpu_left, max_specs
from gpuscale.core.state import ClusterState, FloatArray, IntArray


class DotProduct:
    """Minus the normalised dot product of free capacity and request."""

    name = "dot-product"
    rowwise = True
    """Each row's score is made from that row alone by the same floating-point operations whatever the other
    candidates (no matrix product, no reduction across rows): equal rows score alike, bit for bit, after any history
    of calls (see :class:`~gpuscale.core.scoring.base.Scorer`)."""

    def __init__(self) -> None:
        self._spec: tuple[float, float, float] | None = None

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Record the cluster's largest node capacities for normalisation."""
        self._spec = max_specs(state)

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """Minus the dot product per candidate."""
        cpu_max, _, gpu_max = self._spec or max_specs(state)
        cpu = state.cpu_free[candidates] / cpu_max * (req.cpu_milli / cpu_max)
        gpu = gpu_left(state, candidates).sum(axis=1) / gpu_max * (req.gpu_demand_milli / gpu_max)
        out: FloatArray = -(cpu + gpu).astype(np.float64)
        return out
