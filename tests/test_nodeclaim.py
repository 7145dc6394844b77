"""Node-claim lifecycle: every allowed and every forbidden edge of the transition table, deadlines."""

from __future__ import annotations

import itertools
from dataclasses import fields, replace

import pytest

from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import (
    TRANSITIONS,
    ClaimEvent,
    ClaimPhase,
    Deadlines,
    ForbiddenTransition,
    NodeClaim,
    Transition,
    can_transition,
    deadline,
    expired,
    new_claim,
    timeout_event,
    transition,
)
from gpuscale.core.resources import Resources

P, E = ClaimPhase, ClaimEvent

EXPECTED_EDGES = {
    (P.REQUESTED, E.LAUNCHED): P.LAUNCHED,
    (P.REQUESTED, E.LAUNCH_FAILED): P.FAILED,
    (P.REQUESTED, E.LAUNCH_TIMEOUT): P.FAILED,
    (P.LAUNCHED, E.REGISTERED): P.REGISTERED,
    (P.LAUNCHED, E.LAUNCH_FAILED): P.FAILED,
    (P.LAUNCHED, E.REGISTRATION_TIMEOUT): P.FAILED,
    (P.LAUNCHED, E.DISRUPT): P.DRAINING,
    (P.LAUNCHED, E.LOST): P.GONE,
    (P.REGISTERED, E.INITIALIZED): P.INITIALIZED,
    (P.REGISTERED, E.GPU_INIT_TIMEOUT): P.FAILED,
    (P.REGISTERED, E.DISRUPT): P.DRAINING,
    (P.REGISTERED, E.LOST): P.GONE,
    (P.INITIALIZED, E.DISRUPT): P.DRAINING,
    (P.INITIALIZED, E.LOST): P.GONE,
    (P.DRAINING, E.DRAINED): P.DELETING,
    (P.DRAINING, E.LOST): P.GONE,
    (P.FAILED, E.DELETE): P.DELETING,
    (P.FAILED, E.LOST): P.GONE,
    (P.DELETING, E.DELETED): P.GONE,
}


def claim(phase: ClaimPhase = P.REQUESTED, since: float = 100.0, deadlines: Deadlines | None = None) -> NodeClaim:
    c = new_claim(
        "gs-abc",
        "gpu",
        "g1",
        "z1",
        CapacityType.ON_DEMAND,
        since,
        expected=Resources(8000, 32768, 1),
        deadlines=deadlines or Deadlines(),
    )
    return replace(c, phase=phase)


def test_table_is_exactly_the_documented_edges() -> None:
    assert dict(TRANSITIONS) == EXPECTED_EDGES


@pytest.mark.parametrize(("edge", "target"), sorted(EXPECTED_EDGES.items()))
def test_every_allowed_edge(edge: tuple[ClaimPhase, ClaimEvent], target: ClaimPhase) -> None:
    phase, event = edge
    before = claim(phase)
    after = transition(before, event, 250.0, reason="because", node_id="n-1", node_name="node-1")
    assert after.phase is target
    assert after.since == 250.0
    assert after.node_id == "n-1" and after.node_name == "node-1"
    assert after.reason == "because"
    assert after.history[-1].source is phase and after.history[-1].target is target
    assert after.history[-1].event is event
    # transition spells the step's fields out too: equal to the dataclass made through its own __init__
    assert after.history[-1] == Transition(at=250.0, event=event, source=phase, target=target, reason="because")
    assert before.phase is phase  # immutable


FORBIDDEN = [(p, e) for p, e in itertools.product(ClaimPhase, ClaimEvent) if (p, e) not in EXPECTED_EDGES]


@pytest.mark.parametrize(("phase", "event"), FORBIDDEN)
def test_every_forbidden_edge_is_rejected(phase: ClaimPhase, event: ClaimEvent) -> None:
    assert not can_transition(phase, event)
    with pytest.raises(ForbiddenTransition) as info:
        transition(claim(phase), event, 1.0)
    msg = str(info.value)
    assert str(event) in msg and str(phase) in msg and "gs-abc" in msg


def test_gone_is_terminal_and_message_says_so() -> None:
    with pytest.raises(ForbiddenTransition, match="terminal"):
        transition(claim(P.GONE), E.DELETE, 1.0)


def test_full_happy_path_and_history() -> None:
    c = claim()
    for ev in (E.LAUNCHED, E.REGISTERED, E.INITIALIZED, E.DISRUPT, E.DRAINED, E.DELETED):
        c = transition(c, ev, c.since + 1)
    assert c.phase is P.GONE
    assert [t.target for t in c.history] == [
        P.LAUNCHED,
        P.REGISTERED,
        P.INITIALIZED,
        P.DRAINING,
        P.DELETING,
        P.GONE,
    ]
    assert not c.alive and not c.in_flight


def test_a_transition_keeps_every_other_field() -> None:
    """transition spells out every field of NodeClaim: one added later must be carried over too."""
    c = replace(
        claim(),
        created_at=7.0,
        hourly_price=1.5,
        pods=("default/p",),
        replaces="old-node",
        deadlines=Deadlines(1, 2, 3),
    )
    after = transition(c, E.LAUNCHED, 200.0, node_id="i-1", node_name="n1")
    changed = {"phase", "since", "reason", "node_id", "node_name", "history"}
    assert after == replace(c, **{f.name: getattr(after, f.name) for f in fields(NodeClaim) if f.name in changed})
    copied = {"request_id", "pool", "instance_type", "zone", "capacity_type", "created_at", "expected"}
    copied |= {"hourly_price", "pods", "replaces", "deadlines"}
    assert {f.name for f in fields(NodeClaim)} == changed | copied, "a new NodeClaim field: copy it in transition()"
    assert (after.phase, after.since, after.reason, after.node_id) == (P.LAUNCHED, 200.0, "Launched", "i-1")


def test_keeps_node_identity_when_not_given() -> None:
    c = transition(claim(), E.LAUNCHED, 1.0, node_id="i-1", node_name="n1")
    c = transition(c, E.REGISTERED, 2.0)
    assert (c.node_id, c.node_name) == ("i-1", "n1")


@pytest.mark.parametrize(
    ("phase", "limit", "event"),
    [
        (P.REQUESTED, 300.0, E.LAUNCH_TIMEOUT),
        (P.LAUNCHED, 900.0, E.REGISTRATION_TIMEOUT),
        (P.REGISTERED, 600.0, E.GPU_INIT_TIMEOUT),
    ],
)
def test_default_deadlines(phase: ClaimPhase, limit: float, event: ClaimEvent) -> None:
    c = claim(phase, since=1000.0)
    assert deadline(c) == 1000.0 + limit
    assert not expired(c, 1000.0 + limit)
    assert expired(c, 1000.0 + limit + 0.001)
    assert timeout_event(c) is event
    assert transition(c, event, 2000.0).phase is P.FAILED


def test_per_pool_deadlines() -> None:
    d = Deadlines(launch_s=10, registration_s=20, gpu_init_s=30)
    assert deadline(claim(P.REQUESTED, 0.0, d)) == 10
    assert deadline(claim(P.LAUNCHED, 0.0, d)) == 20
    assert deadline(claim(P.REGISTERED, 0.0, d)) == 30
    assert expired(claim(P.REGISTERED, 0.0, d), 30.5)


@pytest.mark.parametrize("phase", [P.INITIALIZED, P.DRAINING, P.DELETING, P.GONE, P.FAILED])
def test_phases_without_deadline_never_expire(phase: ClaimPhase) -> None:
    c = claim(phase, since=0.0)
    assert deadline(c) is None
    assert not expired(c, 1e12)
    assert timeout_event(c) is None


def test_deadline_restarts_with_each_phase() -> None:
    c = claim(P.REQUESTED, since=0.0)
    c = transition(c, E.LAUNCHED, 299.0)
    assert not expired(c, 299.0 + 900.0)
    assert expired(c, 299.0 + 900.1)


def test_in_flight_and_alive() -> None:
    assert {p for p in ClaimPhase if claim(p).in_flight} == {P.REQUESTED, P.LAUNCHED, P.REGISTERED}
    assert {p for p in ClaimPhase if claim(p).alive} == {P.REQUESTED, P.LAUNCHED, P.REGISTERED, P.INITIALIZED}
