"""ClusterState.of (columns) builds the same state as ClusterState(shapes)."""

from __future__ import annotations

import numpy as np

from gpuscale.core.resources import Request, Resources
from gpuscale.core.state import ClusterState, NodeShape


def test_columns_and_shapes_give_the_same_state() -> None:
    shapes = [
        NodeShape("a", Resources(8000, 32768, 2, 110), "T4"),
        NodeShape("b", Resources(4000, 16384, 0, 110), None),
        NodeShape("c", Resources(16000, 65536, 8, 110), "A100"),
        NodeShape("d", Resources(8000, 32768, 1, 110), "T4"),
    ]
    for max_gpus in (None, 16):
        a = ClusterState(shapes, max_gpus=max_gpus)
        b = ClusterState.of(
            [s.name for s in shapes], [s.capacity for s in shapes], [s.gpu_model for s in shapes], max_gpus
        )
        assert vars(a).keys() == vars(b).keys()
        for k, v in vars(a).items():
            w = getattr(b, k)
            assert np.array_equal(v, w) if isinstance(v, np.ndarray) else v == w, k
        req = Request(cpu_milli=1000, memory_mib=1024, gpus=1)
        assert a.place(req, 2) == b.place(req, 2)
        assert np.array_equal(a.gpu_free, b.gpu_free)
