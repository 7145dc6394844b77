"""The disruption pass's list-based destination rows (``plan._Rows`` / ``plan._Sim``) place pods exactly as the
vectorised :class:`~gpuscale.core.state.ClusterState` would: same room after ``occupy_all``, same best-fit row for
every pod (first on ties), same GPUs taken, same pods left over, over chains of candidates."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np

from builders import node, pod, taint
from gpuscale.core import labels as L
from gpuscale.core.disruption.candidates import sort_pods
from gpuscale.core.disruption.plan import _Rows, _Sim
from gpuscale.core.disruption.replacement import fits_one_node
from gpuscale.core.model import Node, Pod, Toleration
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import MILLI_PER_GPU, Resources
from gpuscale.core.state import ClusterState, NodeShape

MODELS = ("T4", "A100", None)


def _reference(nodes: list[Node], by_node: dict[str, list[Pod]]) -> ClusterState:
    st = ClusterState.of([n.name for n in nodes], [n.allocatable for n in nodes], [n.gpu_model for n in nodes])
    st.occupy_all([[p.request for p in by_node.get(n.name, ())] for n in nodes])
    return st


def _reference_fit(
    st: ClusterState, nodes: list[Node], usable: list[bool], pods: list[Pod], exclude: int
) -> tuple[ClusterState, list[str], set[int]]:
    """What the pass did with ClusterState: numpy fits, static predicates, best-fit score, place."""
    st = st.copy()
    mask = np.array(usable, dtype=bool)
    if exclude >= 0:
        mask[exclude] = False
    left, dests = [], set()
    for p in sort_pods(pods):
        rows = [
            r
            for r in np.flatnonzero(st.fits(p.request) & mask)
            if static_fit(p, nodes[r].labels, nodes[r].taints) is None
        ]
        if not rows:
            left.append(p.key)
            continue
        idx = np.array(rows, dtype=np.int64)
        req = p.request
        score = (
            (st.cpu_free[idx] - req.cpu_milli) / np.maximum(st.cpu_cap[idx], 1)
            + (st.mem_free[idx] - req.memory_mib) / np.maximum(st.mem_cap[idx], 1)
            + (st.gpu_free_milli[idx] - req.gpu_demand_milli) / np.maximum(st.gpu_cap[idx] * MILLI_PER_GPU, 1)
        )
        best = int(idx[int(np.argmin(score))])
        st.place(req, best)
        dests.add(best)
    return st, left, dests


def _same_room(rows: _Rows, st: ClusterState) -> None:
    assert rows.cpu == st.cpu_free.tolist()
    assert rows.mem == st.mem_free.tolist()
    assert rows.pods == st.pods_free.tolist()
    assert rows.full == st.full_free.tolist()
    assert rows.top == st.max_free.tolist()
    for i, g in enumerate(rows.gpu):
        ref = st.gpu_free[i].tolist()
        assert g == ref[: len(g)] and all(v == -1 for v in ref[len(g) :])


def _random_pod(rng: random.Random, name: str, on: str | None) -> Pod:
    kind = rng.random()
    gpus = rng.choice((1, 1, 2, 4)) if kind < 0.35 else 0
    milli = rng.choice((100, 250, 500, 700, 900)) if 0.35 <= kind < 0.75 else 0
    models = frozenset({rng.choice(("T4", "A100"))}) if (gpus or milli) and rng.random() < 0.3 else None
    tol = (Toleration("dedicated", "Equal", "x"),) if rng.random() < 0.5 else ()
    return pod(
        name, rng.randrange(100, 9000), rng.randrange(100, 40000), gpus, milli, node=on, models=models, tolerations=tol
    )


def test_rows_and_best_fit_match_cluster_state() -> None:
    rng = random.Random(7)
    for trial in range(150):
        nodes = []
        for i in range(rng.randrange(1, 14)):
            gpus = rng.choice((0, 1, 2, 4, 8))
            model = rng.choice(MODELS) if gpus else None
            taints = (taint("dedicated", "x"),) if rng.random() < 0.2 else ()
            nodes.append(
                node(
                    f"n{i}",
                    rng.choice((4000, 16000, 64000)),
                    rng.choice((16000, 64000, 256000)),
                    gpus,
                    model,
                    taints=taints,
                )
            )
        by_node: dict[str, list[Pod]] = {}
        for j in range(rng.randrange(0, 40)):  # bound pods, sometimes more than the node holds
            n = rng.choice(nodes)
            by_node.setdefault(n.name, []).append(_random_pod(rng, f"b{trial}-{j}", n.name))
        rows = _Rows.of(nodes, by_node)
        ref = _reference(nodes, by_node)
        _same_room(rows, ref)
        sim = _Sim(nodes, [n.gpu_model for n in nodes], rows, [True] * len(nodes))
        usable = [True] * len(nodes)
        for step in range(3):  # a chain of candidates, each committed as the pass commits them
            movers = [_random_pod(rng, f"m{trial}-{step}-{k}", None) for k in range(rng.randrange(1, 6))]
            exclude = rng.randrange(-1, len(nodes))
            new_rows, left, dests = sim.fit_elsewhere(movers, exclude)
            ref_state, ref_left, ref_dests = _reference_fit(ref, nodes, usable, movers, exclude)
            assert [p.key for p in left] == ref_left
            assert dests == ref_dests
            _same_room(new_rows, ref_state)
            _same_room(sim.state, ref)  # the pass's state is untouched until it commits
            sim.state, ref = new_rows, ref_state
            if exclude >= 0:
                sim.usable[exclude] = usable[exclude] = False


def _fits_one_node_reference(pods: list[Pod], model: str | None, alloc: Resources) -> bool:
    st = ClusterState([NodeShape("new", alloc, model)])
    for p in sort_pods(pods):
        if not st.fits_one(p.request, 0):
            return False
        st.place(p.request, 0)
    return True


def test_fits_one_node_binds_as_cluster_state() -> None:
    rng = random.Random(11)
    answers = set()
    for trial in range(600):
        gpus = rng.choice((0, 1, 2, 4, 8))
        model = rng.choice(("T4", "A100")) if gpus else None
        alloc = Resources(rng.choice((8000, 32000)), rng.choice((32000, 128000)), gpus, rng.choice((3, 110)))
        pods = [_random_pod(rng, f"r{trial}-{k}", None) for k in range(rng.randrange(1, 7))]
        pods = [replace(p, tolerations=()) for p in pods]
        labels = {L.GPU_PRODUCT: model} if model else {}
        got = fits_one_node(pods, labels, (), alloc)
        assert got == _fits_one_node_reference(pods, model, alloc)
        answers.add(got)
    assert answers == {True, False}
