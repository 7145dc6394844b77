"""Pods of a draining node are shown to the planner as pending; they must not take the room of a node in flight
that was launched for another pending pod, or that pod gets a second node while the first comes up for it (the
simulator counts it as a duplicate launch)."""

from __future__ import annotations

from gpuscale.core.nodeclaim import IN_FLIGHT
from test_controller import SPOT, Harness, gpod, gpu_pool


def _run(big_first: bool) -> Harness:
    h = Harness([gpu_pool(instance_types=("g1",), capacity_types=(SPOT,))])
    h.add(gpod("old", cpu=6000 if big_first else 3000), duration=10_000.0)
    h.run(100.0)
    (n1,) = h.alive()
    h.add(gpod("a", cpu=4000), duration=10_000.0)
    h.run(111.0)
    flying = [c for c in h.ctrl.claims.values() if c.phase in IN_FLIGHT]
    assert [c.pods for c in flying] == [("default/a",)]  # a g1 is coming up for "a"
    h.cloud.interrupt(n1.node_id)  # "old" is evicted: shown as pending, it needs a node of its own
    h.run(112.0)
    return h


def test_a_draining_nodes_pod_does_not_take_the_room_in_flight_for_a_pending_pod() -> None:
    h = _run(big_first=True)  # "old" is larger: the planner places it first, on the room coming up for "a"
    assert h.cloud.counters.redundant_launches == 0
    launched = [c.pods for c in h.ctrl.claims.values() if c.phase in IN_FLIGHT]
    assert sorted(launched) == [("default/a",), ("default/old",)]
    h.run(600.0)
    assert h.cluster.running_count() == 2 and len(h.alive()) == 2


def test_the_smaller_draining_pod_is_planned_as_before() -> None:
    h = _run(big_first=False)
    assert h.cloud.counters.redundant_launches == 0
    launched = [c.pods for c in h.ctrl.claims.values() if c.phase in IN_FLIGHT]
    assert sorted(launched) == [("default/a",), ("default/old",)]
