"""The planner's initial state reuses node rows between plans (``existing._ROWS``): over a run of plans in which
nodes and pods come, go, get bound and are replaced by new objects, every plan's state equals the one built afresh
(``ClusterState.occupied`` of the nodes in (launching, name) order with their bound pods in key order)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core import labels as L
from gpuscale.core.model import Node, Pod, Snapshot
from gpuscale.core.planner import existing
from gpuscale.core.planner.existing import ExistingNodes
from gpuscale.core.resources import Request, Resources
from gpuscale.core.state import ClusterState, RowArena, occupied_row

_REQ = st.one_of(
    st.builds(Request, st.integers(0, 9000), st.integers(0, 9000)),
    st.builds(Request, st.integers(0, 9000), st.integers(0, 9000), st.integers(1, 4)),
    st.builds(Request, st.integers(0, 9000), st.integers(0, 9000), st.just(0), st.integers(1, 999)),
)
_NODE = st.builds(
    lambda i, cpu, gpus, model, launching: Node(
        f"n{i}",
        Resources(cpu, 16000, gpus, 8),
        labels={L.GPU_PRODUCT: model} if model else {},
        launching=launching,
    ),
    st.integers(0, 5),
    st.integers(0, 16000),
    st.integers(0, 8),
    st.sampled_from([None, "T4", "V100"]),
    st.booleans(),
)
_POD = st.builds(
    lambda i, req, node, phase: Pod(f"p{i}", request=req, node_name=node, phase=phase),
    st.integers(0, 20),
    _REQ,
    st.sampled_from([None, "n0", "n1", "n2", "n3", "n4", "n5", "gone"]),
    st.sampled_from(["Pending", "Running", "Succeeded"]),
)
# one step of a run: keep the last plan's nodes and pods (same objects) except for a few changes
_STEP = st.tuples(st.lists(_NODE, max_size=3), st.lists(_POD, max_size=4), st.integers(0, 3), st.integers(0, 3))


def _fresh(snapshot: Snapshot) -> ClusterState:
    nodes = sorted(snapshot.nodes, key=lambda n: (n.launching, n.name))
    index = {n.name: i for i, n in enumerate(nodes)}
    bound: list[list[Request]] = [[] for _ in nodes]
    for p in sorted(snapshot.pods, key=lambda p: p.key):
        if p.node_name in index and p.phase in ("Pending", "Running"):
            bound[index[p.node_name]].append(p.request)
    return ClusterState.occupied(
        [n.name for n in nodes], [n.allocatable for n in nodes], [n.gpu_model for n in nodes], bound
    )


def _assert_same(a: ClusterState, b: ClusterState) -> None:
    assert a.__dict__.keys() == b.__dict__.keys()
    for key, va in a.__dict__.items():
        vb = b.__dict__[key]
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and va.shape == vb.shape and (va == vb).all(), key
            assert va.flags.c_contiguous and vb.flags.c_contiguous, key
        else:
            assert va == vb, key


@settings(max_examples=150, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=8), st.sampled_from([3, 8192]))
def test_reused_rows_give_the_state_built_afresh(
    steps: list[tuple[list[Node], list[Pod], int, int]], size: int
) -> None:
    existing._ROWS.clear()
    existing._ROWS_SIZE = size  # 3: the rows are forgotten again and again
    try:
        _run(steps)
    finally:
        existing._ROWS_SIZE = 8192


def _run(steps: list[tuple[list[Node], list[Pod], int, int]]) -> None:
    nodes: dict[str, Node] = {}
    pods: dict[str, Pod] = {}
    for new_nodes, new_pods, drop_nodes, drop_pods in steps:
        for name in sorted(nodes)[:drop_nodes]:
            del nodes[name]
        for key in sorted(pods)[:drop_pods]:
            del pods[key]
        nodes.update((n.name, n) for n in new_nodes)  # a new object under a known name replaces the old one
        pods.update((p.key, p) for p in new_pods)  # a pod bound since, finished, or moved
        snapshot = Snapshot(pods=tuple(pods.values()), nodes=tuple(nodes.values()))
        state = ExistingNodes(snapshot, "best-fit").initial_state()
        _assert_same(_fresh(snapshot), state)
        if len(state):
            state.occupy(Request(100, 100, 1), 0)  # the arrays are the state's own: the rows kept do not change
        _assert_same(_fresh(snapshot), ExistingNodes(snapshot, "best-fit").initial_state())


def test_the_arena_grows_and_gathers_any_rows_in_any_order() -> None:
    arena = RowArena(2, capacity=1)
    rows = [
        occupied_row(Resources(1000 * i, 500, g, 8), 2, [Request(100, 100, 0, 300)] * i)
        for i, g in enumerate((0, 1, 2))
    ]
    slots = [arena.add(v, gpus, "T4" if v[2] else None) for v, gpus in rows]
    for order in ([2, 0, 1], [1, 1], []):
        got = arena.state([f"n{i}" for i in order], [slots[i] for i in order])
        want = ClusterState.from_rows(
            [f"n{i}" for i in order],
            ["T4" if rows[i][0][2] else None for i in order],
            [rows[i][0] for i in order],
            [rows[i][1] for i in order],
            2,
        )
        _assert_same(want, got)
        again = arena.state([f"n{i}" for i in order], [slots[i] for i in order])
        _assert_same(want, again)  # the models' columns kept for these models: the same values
        assert again.models is not got.models and not again.model_idx.flags.writeable


def test_a_row_is_rebuilt_when_the_gpu_columns_widen() -> None:
    existing._ROWS.clear()
    pod = Pod("a", request=Request(0, 0, 1), node_name="small", phase="Running")
    small = Node("small", Resources(1000, 1000, 1, 8))
    one = Snapshot(pods=(pod,), nodes=(small,))
    two = Snapshot(pods=(pod,), nodes=(small, Node("wide", Resources(1000, 1000, 8, 8))))
    for snap in (one, two, one):
        state = ExistingNodes(snap, "best-fit").initial_state()
        _assert_same(_fresh(snap), state)
        assert state.gpu_free.shape[1] == max(n.allocatable.gpus for n in snap.nodes)


def test_an_unknown_scorer_is_still_refused_at_once() -> None:
    with pytest.raises(KeyError, match="known:"):
        ExistingNodes(Snapshot(), "no-such-scorer")  # the scorer itself is made on first use
