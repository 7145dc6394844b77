"""The controller round's shortcuts (a claim sync skipped when its inputs did not change, the pods and their grouping
reused when the cluster returns the same list): each must give exactly what the work it skips would have given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.controller.loop import make_controller
from gpuscale.controller.rounds import Observation
from gpuscale.controller.shell import ShellBase, World
from gpuscale.core.model import NodePool, Pod
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.core.reconcile import sync_claims
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.runner import build_world
from gpuscale.sim.scenario import load_scenario
from test_reconcile_core import FLEET, RULES, apply, claim, cloud, k8s, observations

Obs = tuple[dict[str, Any], list[Any], dict[str, Any], float]


# ------------------------------------------------------------------------------------------------ the claim sync
@settings(max_examples=400, deadline=None)
@given(observations(), st.integers(0, 5000))
def test_a_fixpoint_sync_is_one_at_any_time(obs: Obs, later: int) -> None:
    claims, listing, nodes, now = obs
    d = sync_claims(claims, listing, nodes, FLEET, RULES, now)
    assert not d.settled or (d.fixpoint and d.actions == [])  # settled is the stronger promise
    if not d.fixpoint:
        return
    # what the shell skips: a sync of the claims left, with the same listing and Nodes, at any later time
    table = apply(claims, d)
    again = sync_claims(table, listing, nodes, FLEET, RULES, now + later)
    assert again.actions == [] and again.fixpoint


def test_a_claim_waiting_for_its_gpus_is_a_fixpoint_but_not_settled() -> None:
    c = claim("r1", ClaimPhase.REGISTERED, node_id="n1", name="node-1")
    listing = [cloud("r1", "n1", "node-1")]
    d = sync_claims({"r1": c}, listing, {"node-1": k8s("node-1", gpus=0)}, FLEET, RULES, 10.0)
    assert d.actions == [] and d.fixpoint and not d.settled  # the next step depends on the Node
    d = sync_claims({"r1": c}, listing, {"node-1": k8s("node-1", gpus=1)}, FLEET, RULES, 10.0)
    assert d.fixpoint and apply({"r1": c}, d)["r1"].phase is ClaimPhase.INITIALIZED


def test_a_claim_in_its_listing_grace_period_is_no_fixpoint() -> None:
    c = claim("r1", ClaimPhase.LAUNCHED, since=0.0, node_id="n1", name="node-1")
    d = sync_claims({"r1": c}, [], {}, FLEET, RULES, 10.0)
    assert d.unlisted == {"r1"} and not d.fixpoint  # lost 30 s after its launch: the time matters
    d = sync_claims({"r1": c}, [], {}, FLEET, RULES, 40.0)
    assert d.fixpoint and "r1" not in apply({"r1": c}, d)


def test_a_fixpoint_sync_is_skipped_only_with_the_same_node_list() -> None:
    obs = Observation(None)
    cloud_list: tuple[object, ...] = ()
    obs.keep_cloud(cloud_list, [])
    nodes_a: tuple[object, ...] = tuple(["a"])
    obs.keep_nodes(nodes_a, {})
    obs.synced_with(set(), settled=False, claims_version=2, fixpoint=True)
    assert not obs.sync_needed(2)
    obs.keep_nodes(tuple(["a"]), {})  # an equal list, not the same one: sync
    assert obs.sync_needed(2) and obs.synced is None
    obs.synced_with(set(), settled=False, claims_version=2, fixpoint=True)
    obs.keep_nodes(["a"], {})  # a list that may change in place: never skipped
    obs.synced_with(set(), settled=False, claims_version=2, fixpoint=True)
    assert obs.sync_needed(2)
    obs.synced_with(set(), settled=True, claims_version=2)  # settled: the nodes do not matter
    obs.keep_nodes(tuple(["b"]), {})
    assert not obs.sync_needed(2)


# ------------------------------------------------------------------------------------------------ the pods
def test_the_same_pod_list_gives_the_same_pods_and_grouping() -> None:
    obs = Observation(None)
    pods = (Pod("a", node_name="n1", phase="Running"), Pod("b"), Pod("c", phase="Succeeded"))

    live = ("Pending", "Running")
    first, last = obs.live_pods(pods, live)
    assert [p.name for p in first] == ["a", "b"] and last is None
    w1 = World(0.0, first, {}, [], [], [], {})
    obs.pods_world = w1
    again, last = obs.live_pods(pods, live)
    assert again is first and last is w1
    w2 = World(1.0, again, {}, [], [], [], {})
    w2.share_grouping(w1)
    assert w2.by_node() is w1.by_node() and w2.by_node() == {"n1": [pods[0]]} and w2.unbound() == [pods[1]]
    _, last = obs.live_pods(tuple(pods), live)  # tuple(t) is t: still the same list
    assert last is w1
    again, last = obs.live_pods(tuple(list(pods)), live)  # a new tuple of the same pods, in the same order
    assert again is first and last is w1
    _, last = obs.live_pods((pods[1], pods[0], pods[2]), live)  # another order: grouped again
    assert last is None
    obs.live_pods(pods, live)
    other = (pods[0], Pod("b"), pods[2])  # an equal pod, another object: not recognised
    changed, last = obs.live_pods(other, live)
    assert changed is not first and changed == first and last is None
    changed, last = obs.live_pods(pods[:2], live)
    assert changed is not first and changed == first and last is None
    obs.live_pods(list(pods), live)
    _, last = obs.live_pods(list(pods), live)
    assert last is None  # a list is never recognised again


# ------------------------------------------------------------------------------------------------ whole runs
@pytest.fixture
def no_shortcuts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Turns the round's shortcuts off (every sync runs, the pods are filtered and grouped every round, a node's
    pool is looked up every time)."""

    def pool_of_node(self: ShellBase, name: str) -> NodePool | None:
        found = self.claims.by_node_name(name)
        return self.pools.get(found[1].pool) if found is not None else None

    def off() -> None:
        monkeypatch.setattr(Observation, "sync_needed", lambda self, version: True)
        monkeypatch.setattr(ShellBase, "_pool_of_node", pool_of_node)
        monkeypatch.setattr(Observation, "live_pods", lambda self, pods, ok: ([p for p in pods if p.phase in ok], None))

    yield off


def _run(path: str) -> tuple[Any, ...]:
    res = simulate_policy(load_scenario(path), "gpuscale")
    events = [(e.at, e.kind, e.object, e.reason, e.message) for e in res.cluster.events]
    report = {k: v for k, v in res.report.items() if k != "wallSeconds"}
    return events, [repr(n) for n in res.cloud.launched()], res.reconcile_times, report


@pytest.mark.parametrize("path", ["examples/demo.yaml", "benchmarks/scenarios/ack-spot.yaml"])
def test_runs_with_and_without_the_shortcuts_are_identical(path: str, no_shortcuts: Callable[[], None]) -> None:
    with_shortcuts = _run(path)
    no_shortcuts()
    assert Observation(None).sync_needed(0)  # the class the controller builds its Observation from
    assert _run(path) == with_shortcuts


def test_the_pool_of_a_node_follows_the_claims() -> None:
    scenario = load_scenario("examples/demo.yaml")
    engine, cloud_, cluster = build_world(scenario)
    pools = (*scenario.pools, NodePool("other"))
    ctrl = make_controller(
        backend=cluster, provider=cloud_, pools=pools, catalog=scenario.catalog, clock=engine.clock, config={}
    )
    c = claim("r1", ClaimPhase.INITIALIZED, node_id="n1", name="node-1")
    assert ctrl._pool_of_node("node-1") is None
    assert ctrl._pool_of_node("node-1") is None  # answered again from the memo (None is an answer too)
    ctrl.claims["r1"] = c
    assert ctrl._pool_of_node("node-1") is ctrl.pools["gpu"]
    assert ctrl._pool_of_node("node-1") is ctrl.pools["gpu"]
    ctrl.claims["r1"] = replace(c, pool="other")
    assert ctrl._pool_of_node("node-1") is ctrl.pools["other"]
    ctrl.claims["r1"] = replace(c, node_name="node-2")
    assert ctrl._pool_of_node("node-1") is None and ctrl._pool_of_node("node-2") is ctrl.pools["gpu"]
    del ctrl.claims["r1"]
    assert ctrl._pool_of_node("node-2") is None
