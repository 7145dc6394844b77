"""The consolidation gate looks only at what changed: it classifies only the candidates whose inputs changed (their
pods or their Node: ``touched``) or that have no kept reason, so that after any sequence of rounds its reasons equal
a classification of every candidate afresh (:func:`~gpuscale.core.disruption.classify_node`); and it compares a
resting node's pods with its rest only when they changed since a round that matched them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node, pod, pool
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.core.disruption import DisruptionReason, classify_node
from gpuscale.core.model import Disruption, Node, Pod

NAMES = [f"n{i}" for i in range(6)]
POOLS = {"gpu": pool("gpu", disruption=Disruption(consolidate_after_s=60.0))}


def _afresh(candidates: set[str], nodes: dict[str, Node], by_node: dict[str, list[Pod]]) -> dict[str, DisruptionReason]:
    out: dict[str, DisruptionReason] = {}
    for name in candidates:
        n = nodes.get(name)
        if n is None or n.pool not in POOLS or n.unschedulable or n.launching:
            continue
        why = classify_node(n, POOLS[n.pool], by_node.get(name, []), {})
        if why is not None:
            out[name] = why
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_kept_reasons_equal_a_classification_afresh(data: st.DataObject) -> None:
    gate = ConsolidationGate(POOLS, ControllerConfig())
    nodes: dict[str, Node] = {}
    by_node: dict[str, list[Pod]] = {}
    candidates: set[str] = set()
    for step in range(data.draw(st.integers(1, 12))):
        touched: set[str] = set()
        for name in data.draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True)):  # these Nodes change
            if data.draw(st.booleans()):
                gpus, in_pool = data.draw(st.integers(0, 2)), data.draw(st.sampled_from(["gpu", "other"]))
                cordoned, launching = data.draw(st.booleans()), data.draw(st.booleans())
                nodes[name] = node(name, 8000, 32768, gpus, pool=in_pool, unschedulable=cordoned, launching=launching)
            else:
                nodes.pop(name, None)
            touched.add(name)
        for name in data.draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True)):  # these nodes' pods change
            count = data.draw(st.integers(0, 3))
            by_node[name] = [pod(f"{name}-{step}-{i}", cpu=100 * (1 + i), gpus=i % 2, node=name) for i in range(count)]
            touched.add(name)
        if data.draw(st.booleans()):  # (a new candidate set now and then; the same object otherwise)
            candidates = set(data.draw(st.lists(st.sampled_from(NAMES), unique=True)))
            if data.draw(st.booleans()):  # made as the step makes its own (never changed) candidate set
                gate.candidate_nodes = (None, candidates)
        got = gate._classify(candidates, nodes, touched, by_node, {})
        assert got == _afresh(candidates, nodes, by_node)
        assert {n: w for n, w in gate.classes.items() if w is not None} == got and gate.classes.keys() <= candidates


def test_a_rest_ends_when_its_node_gains_a_pod_after_rounds_that_matched_it() -> None:
    gate = ConsolidationGate(POOLS, ControllerConfig())
    nodes = {name: node(name, 8000, 32768, 1, pool="gpu") for name in ("n1", "n2")}
    candidates = set(nodes)
    first = pod("a", cpu=100, node="n1")

    def select(by_node: dict[str, list[Pod]], now: float) -> None:
        gate.select(candidates, set(), nodes, by_node, [], False, {}, frozenset(), now, lambda _: POOLS["gpu"])

    select({"n1": [first]}, 0.0)
    gate.rest("n1", frozenset({first.key}), 0.0)
    select({"n1": [first]}, 1.0)  # its pods match its rest
    select({"n1": [first]}, 2.0)  # (a new dict of the same pods: matched at the last round, unchanged since)
    assert "n1" in gate.futile
    select({"n1": [first, pod("b", cpu=100, node="n1")]}, 3.0)  # a pod joins it; nothing leaves, no node joins
    assert "n1" not in gate.futile
    on_n2 = {"n1": [first, pod("b", cpu=100, node="n1")], "n2": [pod("c", cpu=100, node="n2")]}
    gate.rest("n2", frozenset({"default/c"}), 3.0)
    select(on_n2, 4.0)
    assert "n2" in gate.futile  # matched
    gate.rest("n2", frozenset({"default/other"}), 4.0)  # rested again while resting, with other pods: compared afresh
    select(on_n2, 5.0)
    assert "n2" not in gate.futile


def test_a_candidate_set_changed_in_place_is_compared_again() -> None:
    """Only the step's own candidate set (never changed once made) is recognised by identity: a caller's set
    changed in place between two looks is compared, and its new candidate classified."""
    gate = ConsolidationGate(POOLS, ControllerConfig())
    nodes = {name: node(name, 8000, 32768, 1, pool="gpu") for name in ("n1", "n2")}
    candidates = {"n1"}
    assert gate._classify(candidates, nodes, set(), {}, {}) == {"n1": DisruptionReason.EMPTY}
    candidates.discard("n1")  # (as many candidates as before: only a comparison tells)
    candidates.add("n2")
    assert gate._classify(candidates, nodes, set(), {}, {}) == {"n2": DisruptionReason.EMPTY}
    own = {"n1"}
    gate.candidate_nodes = (None, own)
    assert gate._classify(own, nodes, set(), {}, {}) == {"n1": DisruptionReason.EMPTY}
    assert gate._classify(own, nodes, set(), {}, {}) == {"n1": DisruptionReason.EMPTY}  # (recognised)
