"""The consolidation gate's rests and a destination's labels or taints: a node relabelled (another zone) or untainted
with the same allocatable can take pods it could not take before, so a resting node may become movable. The gate must
end the rests then, both when it patches its room (a few nodes remade) and when it makes it afresh."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.core import labels as L
from gpuscale.core.disruption import ActionKind, plan_disruption
from gpuscale.core.model import Node, Pod, Taint, TaintEffect
from test_gate_rest_binds import BEFORE, CATALOG, NODES, POOL, T0, _resting_gate

# r rests at T0: its pod a (5 CPUs) best-fits d (z1, 6 free), after which b (2 CPUs, zone z1) fits nowhere; z (z2)
# has 3 CPUs free. Relabelled into z1, z takes b: r is deleted.
RELABELLED = {**NODES, "z": replace(NODES["z"], labels={**NODES["z"].labels, L.ZONE: "z1"})}
NOISE = Taint("example.com/noise", TaintEffect.NO_SCHEDULE, "x")


def _actions(nodes: Mapping[str, Node], by_node: Mapping[str, Sequence[Pod]]) -> list[tuple[str, ActionKind]]:
    pods = [p for ps in by_node.values() for p in ps]
    plan = plan_disruption(list(nodes.values()), pods, [POOL], CATALOG, T0 + 10, since={"r": 0.0}, candidates={"r"})
    return [(a.node, a.kind) for a in plan.actions]


def _select(gate: ConsolidationGate, nodes: Mapping[str, Node], now: float) -> list[str]:
    return gate.select({"r"}, set(), nodes, BEFORE, [], False, {}, frozenset(), now, lambda _: POOL)


@pytest.mark.parametrize("afresh", [False, True], ids=["patched", "afresh"])
def test_a_destination_relabelled_so_the_resting_pods_fit_ends_the_rest(afresh: bool) -> None:
    assert _actions(NODES, BEFORE) == []
    assert _actions(RELABELLED, BEFORE) == [("r", ActionKind.DELETE)]  # the uncached pass acts
    gate = _resting_gate()
    # every Node remade (the gate makes its room afresh) or z alone (it patches its room)
    nodes = {k: replace(v) for k, v in RELABELLED.items()} if afresh else RELABELLED
    assert _select(gate, nodes, T0 + 10) == ["r"]


def test_a_taint_removed_from_a_destination_ends_the_rest() -> None:
    tainted = {**RELABELLED, "z": replace(RELABELLED["z"], taints=(NOISE,))}
    assert _actions(tainted, BEFORE) == []  # b tolerates nothing: z is no destination while tainted
    gate = ConsolidationGate({POOL.name: POOL}, _resting_gate().config)
    assert _select(gate, tainted, T0) == ["r"]
    gate.rest("r", frozenset(p.key for p in BEFORE["r"]), T0, lambda _: POOL)
    assert _select(gate, tainted, T0 + 2) == []  # resting while nothing changes
    untainted = {**tainted, "z": replace(tainted["z"], taints=())}
    assert _actions(untainted, BEFORE) == [("r", ActionKind.DELETE)]
    assert _select(gate, untainted, T0 + 10) == ["r"]


def test_a_node_remade_with_the_same_labels_and_taints_keeps_the_rest() -> None:
    gate = _resting_gate()
    same = {**NODES, "z": replace(NODES["z"], labels=dict(NODES["z"].labels))}  # equal values, new objects
    assert _select(gate, same, T0 + 10) == []
