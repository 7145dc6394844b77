"""ClusterState bulk loading agrees with pod-by-pod accounting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.resources import Request, Resources
from gpuscale.core.state import ClusterState, NodeShape, gpu_room

requests = st.builds(
    lambda cpu, mem, kind, gpus, milli: Request(cpu, mem, gpus if kind == 0 else 0, milli if kind == 1 else 0),
    st.sampled_from((0, 250, 1000, 4000)),
    st.sampled_from((0, 256, 4096)),
    st.integers(0, 2),
    st.integers(1, 4),
    st.sampled_from((100, 300, 500, 700, 999)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), requests), max_size=30))
def test_occupy_all_matches_occupy_when_nothing_is_overcommitted(bound: list[tuple[int, Request]]) -> None:
    shapes = [
        NodeShape(f"n{i}", Resources(16000, 65536, g, 110), "T4" if g else None) for i, g in enumerate((0, 1, 2, 4))
    ]
    one, bulk = ClusterState(shapes), ClusterState(shapes)
    per_row: list[list[Request]] = [[] for _ in shapes]
    for row, req in bound:
        if not one.fits_one(req, row):
            continue  # keep to pods that fit: overcommitted nodes are accounted "as far as possible" by both
        one.place(req, row)
        per_row[row].append(req)
    bulk.occupy_all(per_row)
    assert (one.cpu_free == bulk.cpu_free).all() and (one.mem_free == bulk.mem_free).all()
    assert (one.pods_free == bulk.pods_free).all()
    assert (one.full_free == bulk.full_free).all()
    # GPUs may be numbered differently, but every node keeps the same multiset of free milli-GPU per GPU
    for i in range(len(shapes)):
        assert sorted(one.gpu_free[i]) == sorted(bulk.gpu_free[i]), (i, one.gpu_free[i], bulk.gpu_free[i])


def test_occupy_all_never_goes_below_zero() -> None:
    st_ = ClusterState([NodeShape("n", Resources(1000, 1024, 1, 2), "T4")])
    st_.occupy_all([[Request(800, 800, 1, 0), Request(800, 800, 1, 0), Request(100, 100, 0, 500)]])
    assert st_.cpu_free[0] == 0 and st_.mem_free[0] == 0 and st_.pods_free[0] == 0
    assert st_.gpu_free[0, 0] == 0 and st_.full_free[0] == 0 and st_.max_free[0] == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(requests, max_size=6), st.lists(requests, max_size=3))
def test_remembered_rows_equal_computed_ones_and_only_for_untouched_nodes(
    reqs: list[Request], first: list[Request]
) -> None:
    from gpuscale.core import state as state_mod

    shape = [NodeShape("n", Resources(64000, 262144, 4, 110), "T4")]
    state_mod._FRESH_ROWS.clear()
    computed = ClusterState(shape)
    computed.occupy_all([reqs])
    remembered = ClusterState(shape)  # same requests on an untouched node: served from memory
    remembered.occupy_all([reqs])
    assert remembered.gpu_free.tolist() == computed.gpu_free.tolist()
    assert (remembered.full_free == computed.full_free).all() and (remembered.max_free == computed.max_free).all()
    # a node already holding pods is computed, never taken from memory: same result with or without one
    fresh = ClusterState(shape)
    fresh.occupy_all([reqs])  # remembers the fresh result for reqs
    with_memo, without = ClusterState(shape), ClusterState(shape)
    for st_ in (with_memo, without):
        st_.occupy_all([first])
    with_memo.occupy_all([reqs])
    state_mod._FRESH_ROWS.clear()
    without.occupy_all([reqs])
    assert with_memo.gpu_free.tolist() == without.gpu_free.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), requests), max_size=30))
def test_gpu_room_is_what_bulk_loading_leaves(bound: list[tuple[int, Request]]) -> None:
    """gpu_room (used to rule out moves without building a state) agrees with occupy_all, overcommitted or not."""
    sizes = (0, 1, 2, 8)
    st_ = ClusterState([NodeShape(f"n{i}", Resources(16000, 65536, g, 110), "T4" if g else None) for i, g in
                        enumerate(sizes)])  # fmt: skip
    per_row: list[list[Request]] = [[] for _ in sizes]
    for row, req in bound:
        per_row[row].append(req)
    st_.occupy_all(per_row)
    for i, g in enumerate(sizes):
        assert gpu_room(g, per_row[i]) == (int(st_.full_free[i]), int(st_.max_free[i]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), requests), max_size=30), requests)
def test_the_scalar_fit_agrees_with_the_vector_one(bound: list[tuple[int, Request]], asked: Request) -> None:
    """fits_one (Python ints read with .item) answers as fits does for every row, after any placements."""
    shapes = [
        NodeShape(f"n{i}", Resources(16000, 65536, g, 110), "T4" if g else None) for i, g in enumerate((0, 1, 2, 4))
    ]
    state = ClusterState(shapes)
    for row, req in bound:
        if state.fits_one(req, row):
            state.place(req, row)
    for req in (asked, *(r for _, r in bound)):
        assert [state.fits_one(req, i) for i in range(len(shapes))] == state.fits(req).tolist()
