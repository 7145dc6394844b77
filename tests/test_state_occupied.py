"""``ClusterState.occupied`` is ``ClusterState.of`` followed by ``occupy_all``: the same columns, values and dtypes,
overcommitted nodes, nodes without GPUs and models included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.resources import Request, Resources
from gpuscale.core.state import ClusterState

_REQ = st.one_of(
    st.builds(Request, st.integers(0, 9000), st.integers(0, 9000)),
    st.builds(Request, st.integers(0, 9000), st.integers(0, 9000), st.integers(1, 5)),
    st.builds(Request, st.integers(0, 9000), st.integers(0, 9000), st.just(0), st.integers(1, 999)),
)
_ROW = st.tuples(
    st.builds(Resources, st.integers(0, 16000), st.integers(0, 16000), st.integers(0, 8), st.integers(0, 6)),
    st.sampled_from([None, "T4", "V100"]),
    st.lists(_REQ, max_size=6),
)


def _assert_same(a: ClusterState, b: ClusterState) -> None:
    assert a.__dict__.keys() == b.__dict__.keys()
    for key, va in a.__dict__.items():
        vb = b.__dict__[key]
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and va.shape == vb.shape, key
            assert (va == vb).all(), key
            assert vb.flags.c_contiguous, key
        else:
            assert va == vb, key


@settings(max_examples=300, deadline=None)
@given(st.lists(_ROW, max_size=12))
def test_occupied_equals_of_then_occupy_all(rows: list[tuple[Resources, str | None, list[Request]]]) -> None:
    names = [f"n{i}" for i in range(len(rows))]
    caps = [r[0] for r in rows]
    models = [r[1] for r in rows]
    bound = [r[2] for r in rows]
    expected = ClusterState.of(names, caps, models)
    expected.occupy_all(bound)
    got = ClusterState.occupied(names, caps, models, bound)
    _assert_same(expected, got)
    for i in range(len(rows)):  # and it keeps working as a state
        req = Request(100, 100, 0, 100)
        assert got.fits_one(req, i) == expected.fits_one(req, i)
