"""The report's percentiles (pendingP50s/P95s/P99s) are np.percentile's, bit for bit, computed in Python floats."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.sim.report import _pct

_waits = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(_waits, st.sampled_from((0.0, 1.5, 30.0, 120.25))), min_size=1, max_size=300),
    st.one_of(st.sampled_from((0, 50, 95, 99, 100, 0.95, 99.9)), st.floats(min_value=0.0, max_value=100.0)),
)
def test_percentile_is_numpys_linear_percentile(values: list[float], q: float) -> None:
    expected = float(np.percentile(np.asarray(values, dtype=float), q))
    got = _pct(values, q)
    assert got == expected or (got != got and expected != expected), (got, expected)
    assert np.float64(got).tobytes() == np.float64(expected).tobytes()


def test_no_value_gives_zero() -> None:
    assert _pct([], 95) == 0.0
    assert _pct([7.25], 95) == 7.25
    assert _pct([1.0, 2.0], 50) == 1.5
