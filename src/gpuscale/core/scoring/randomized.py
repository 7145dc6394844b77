"""Random scorer: every feasible node is equally likely (seeded, deterministic for a given seed)."""

from __future__ import annotations

import numpy as np

from gpuscale.core.resources import Request
from gpuscale.core.scoring.base import Workload
from gpuscale.core.state import ClusterState, FloatArray, IntArray


class RandomScorer:
    """Uniform random scores from a generator seeded at construction (and again by :meth:`reseed`)."""

    name = "random"
    draws = True
    """Each :meth:`score` advances the random stream (a caller may not skip a call whose answer it knows)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        """Restart the random stream from ``seed``."""
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def prepare(self, state: ClusterState, workload: Workload | None) -> None:
        """Restart the random stream so that each run with the same seed is identical."""
        self._rng = np.random.default_rng(self.seed)

    def score(self, state: ClusterState, req: Request, candidates: IntArray) -> FloatArray:
        """One uniform draw per candidate."""
        return self._rng.random(candidates.size)
