"""The consolidation gate's room (schedulable nodes' allocatable, in node order) is patched when a few nodes are
remade under the same names in the same order, and made afresh otherwise. A gate that is shown the same cluster as
copies of every Node each round (always made afresh) must select, rest and classify exactly as one that patches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node, pod, pool
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.core.model import Disruption, Node, NodePool, Pod

POOLS = {"gpu": pool("gpu", disruption=Disruption(consolidate_after_s=30.0))}
NAMES = [f"n{i}" for i in range(10)]


def _pool_of(nodes: dict[str, Node]) -> Callable[[str], NodePool | None]:
    def pool_of(name: str) -> NodePool | None:
        n = nodes.get(name)
        return POOLS.get(n.pool or "") if n is not None else None

    return pool_of


def _state(gate: ConsolidationGate) -> tuple[object, ...]:
    return (
        list(gate._room[1].items()),
        gate._node_names,
        dict(gate.futile),
        dict(gate.classes),
        dict(gate.since),
    )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_patched_room_selects_as_a_room_made_afresh(data: st.DataObject) -> None:
    patching = ConsolidationGate(POOLS, ControllerConfig())
    afresh = ConsolidationGate(POOLS, ControllerConfig())
    nodes: dict[str, Node] = {
        name: node(name, 8000, 32768, 1, pool="gpu") for name in NAMES[: data.draw(st.integers(4, 8))]
    }
    by_node: dict[str, list[Pod]] = {}
    now = 0.0
    for step in range(data.draw(st.integers(2, 14))):
        now += data.draw(st.sampled_from([1.0, 10.0, 40.0]))
        for name in data.draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True)):
            what = data.draw(st.sampled_from(["remake", "remake", "grow", "cordon", "uncordon", "drop"]))
            old = nodes.get(name)
            if old is None:  # joins (at the end of the order)
                nodes[name] = node(name, 8000, 32768, data.draw(st.integers(0, 2)), pool="gpu")
            elif what == "remake":  # the same values, another object (its place in the order kept)
                nodes[name] = replace(old)
            elif what == "grow":
                nodes[name] = replace(old, allocatable=replace(old.allocatable, gpus=old.allocatable.gpus + 1))
            elif what in ("cordon", "uncordon"):
                nodes[name] = replace(old, unschedulable=what == "cordon")
            else:
                del nodes[name]
        for name in data.draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True)):
            count = data.draw(st.integers(0, 2))
            by_node = {**by_node, name: [pod(f"{name}-{step}-{i}", cpu=300, node=name) for i in range(count)]}
        by_node = {k: v for k, v in by_node.items() if v}
        candidates = {n for n in nodes if data.draw(st.booleans())} if data.draw(st.booleans()) else set(nodes)
        copies = {name: replace(n) for name, n in nodes.items()}  # every Node remade: the room is made afresh
        due = patching.select(candidates, set(), nodes, by_node, [], False, {}, frozenset(), now, _pool_of(nodes))
        due_afresh = afresh.select(
            candidates, set(), copies, by_node, [], False, {}, frozenset(), now, _pool_of(copies)
        )
        assert due == due_afresh
        assert list(patching._room[1].items()) == [
            (n.name, n.allocatable) for n in nodes.values() if not n.unschedulable
        ]
        assert patching._node_names == frozenset(nodes)
        for name in due:
            if data.draw(st.booleans()):  # the pass kept it: it rests (in both gates)
                keys = frozenset(p.key for p in by_node.get(name, ()))
                patching.rest(name, keys, now)
                afresh.rest(name, keys, now)
        assert _state(patching) == _state(afresh)


def test_a_node_uncordoned_takes_its_place_in_the_order() -> None:
    """A node no longer cordoned is not patched in at the end of the room: the room is made afresh, in node order."""
    gate = ConsolidationGate(POOLS, ControllerConfig())
    nodes = {name: node(name, 8000, 32768, 1, pool="gpu") for name in NAMES[:5]}

    def select(now: float) -> None:
        gate.select(set(nodes), set(), nodes, {}, [], False, {}, frozenset(), now, _pool_of(nodes))
        assert list(gate._room[1]) == [n.name for n in nodes.values() if not n.unschedulable]

    select(1.0)
    nodes["n1"] = replace(nodes["n1"], unschedulable=True)
    select(2.0)
    nodes["n1"] = replace(nodes["n1"], unschedulable=False)
    select(3.0)
