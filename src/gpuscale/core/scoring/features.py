"""Vectorised per-candidate helpers shared by the scorers (pure numpy over ``ClusterState`` rows)."""

from __future__ import annotations

import numpy as np

from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.core.state import ClusterState, IntArray


def gpu_left(state: ClusterState, rows: IntArray) -> IntArray:
    """Free milli-GPU of every physical GPU of ``rows`` (row numbers, not a mask; absent GPU slots count as 0), shape
    (rows, max_gpus)."""
    # the same values as np.where(g > 0, g, 0), cheaper; rows taken rather than fancy-indexed (a quarter of the time)
    out: IntArray = np.maximum(state.gpu_free.take(rows, axis=0), 0)
    return out


def gpu_left_after(state: ClusterState, req: Request, rows: IntArray) -> IntArray:
    """Per-GPU free milli-GPU of ``rows`` after placing ``req`` the way :meth:`ClusterState.place` would.

    Whole GPUs take the lowest-indexed entirely free GPUs; a fraction takes the fitting GPU with the least free
    milli-GPU. ``rows`` must be rows where ``req`` fits.
    """
    left = gpu_left(state, rows)
    if req.gpus:
        full = left == MILLI_PER_GPU
        take = full & (np.cumsum(full, axis=1) <= req.gpus)
        return np.where(take, 0, left)
    if req.gpu_milli:
        cand = np.where(left >= req.gpu_milli, left, MILLI_PER_GPU + 1)
        j = np.argmin(cand, axis=1)
        out = left.copy()
        out[np.arange(len(rows)), j] -= req.gpu_milli
        return out
    return left


def max_specs(state: ClusterState) -> tuple[float, float, float]:
    """The largest node's CPU (milli), memory (MiB) and GPU (milli) capacity, at least 1 each."""
    cpu = float(max(int(state.cpu_cap.max(initial=0)), 1))
    mem = float(max(int(state.mem_cap.max(initial=0)), 1))
    gpu = float(max(int(state.gpu_cap.max(initial=0)) * MILLI_PER_GPU, 1))
    return cpu, mem, gpu
