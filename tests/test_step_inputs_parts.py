"""The consolidation step's inputs are kept part by part (nodes being disrupted, planned pods, claims in flight),
each while the claims of the phases it reads and the round's node names are the same: a claim entering a phase a
part reads, or a node appearing, makes that part again (each fails with its key's phase version or node names
dropped)."""

from __future__ import annotations

from dataclasses import replace

from gpuscale.controller.shell import World
from gpuscale.core.nodeclaim import ClaimPhase
from test_controller import Harness, gpod, gpu_pool


def _harness() -> Harness:
    h = Harness([gpu_pool(instance_types=("g1",))])
    h.add(gpod("a"))
    h.add(gpod("b"))
    h.run(200.0)
    return h


def test_a_claim_that_failed_is_a_node_being_disrupted() -> None:
    h = _harness()
    ctrl = h.ctrl
    nodes = dict(ctrl.observed.nodes)
    w = World(h.engine.now(), [], nodes, [], [], [], {})
    assert ctrl._step_inputs(w)[1] == set()
    key, claim = next(iter(ctrl.claims.items()))
    assert claim.phase is not ClaimPhase.FAILED and claim.node_name in nodes
    ctrl.claims[key] = replace(claim, phase=ClaimPhase.FAILED)
    assert ctrl._step_inputs(w) == ctrl._fresh_step_inputs(w)
    assert ctrl._step_inputs(w)[1] == {claim.node_name}


def test_a_launched_claim_is_in_flight_until_its_node_is_listed() -> None:
    h = _harness()
    ctrl = h.ctrl
    nodes = dict(ctrl.observed.nodes)
    key, claim = next(iter(ctrl.claims.items()))
    ctrl.claims[key] = replace(claim, phase=ClaimPhase.LAUNCHED)
    listed = World(h.engine.now(), [], nodes, [], [], [], {})
    assert ctrl._step_inputs(listed)[3] == frozenset()
    unlisted = World(h.engine.now(), [], {k: n for k, n in nodes.items() if k != claim.node_name}, [], [], [], {})
    assert ctrl._step_inputs(unlisted)[3] == frozenset({key}) == ctrl._fresh_step_inputs(unlisted)[3]
    assert ctrl._step_inputs(listed)[3] == frozenset()
