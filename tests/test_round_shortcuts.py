"""The controller round's shortcuts (a claim sync skipped when its inputs did not change, the pods and their grouping
reused when the cluster returns the same list): each must give exactly what the work it skips would have given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.loop import make_controller
from gpuscale.controller.rounds import Observation, SettledNodes, live_pods
from gpuscale.controller.shell import ShellBase, World
from gpuscale.core.model import NodePool, Pod
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.core.reconcile import FinishClaim, SetClaim, sync_claims
from gpuscale.providers.base import CloudNode, CloudNodeState
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


def _same_decisions(a: Any, b: Any) -> bool:
    return (a.actions, a.replan, a.unlisted, a.settled, a.fixpoint) == (
        b.actions,
        b.replan,
        b.unlisted,
        b.settled,
        b.fixpoint,
    )


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_sync_leaving_out_the_settled_nodes_decides_what_a_whole_sync_does(data: st.DataObject) -> None:
    """Random rounds of listing changes (node objects made again, nodes gone or added, reordered, listed twice),
    claim changes and Node changes: the sync of the nodes SettledNodes leaves in, with its known keys, gives the
    decisions of a sync of the whole listing, every round."""
    table = ClaimTable()
    settled = SettledNodes()
    slots = 6
    made: dict[int, CloudNode] = {}  # slot -> its node object as last made (kept while the node is unchanged)
    listed: set[int] = set()
    nodes: dict[str, Any] = {}
    now = 0.0
    phases = [p for p in ClaimPhase if p is not ClaimPhase.GONE]
    for _ in range(data.draw(st.integers(1, 12))):
        for i in range(slots):
            if data.draw(st.integers(0, 4)) == 0:  # the provider's view of slot i changes
                if i in listed and data.draw(st.booleans()):
                    listed.discard(i)
                else:
                    name = data.draw(st.sampled_from(["", f"node-{i}", f"other-{i}"]))
                    rid = data.draw(st.sampled_from([f"r{i}", f"r{i}", "r0"]))  # sometimes a request's second node
                    made[i] = cloud(rid, f"n{i}", name, data.draw(st.sampled_from(list(CloudNodeState))))
                    listed.add(i)
            if data.draw(st.integers(0, 5)) == 0:  # the claim of slot i changes (or goes, or comes)
                key = f"r{i}"
                if key in table and data.draw(st.booleans()):
                    del table[key]
                else:
                    phase = data.draw(st.sampled_from(phases))
                    has_node = phase is not ClaimPhase.REQUESTED
                    name = f"node-{i}" if has_node and data.draw(st.booleans()) else ""
                    table[key] = claim(key, phase, since=now, node_id=f"n{i}" if has_node else "", name=name)
            if data.draw(st.integers(0, 5)) == 0:  # its Node joins or leaves, with or without its GPUs
                if f"node-{i}" in nodes:
                    del nodes[f"node-{i}"]
                else:
                    nodes[f"node-{i}"] = k8s(f"node-{i}", data.draw(st.integers(0, 1)), rid=f"r{i}")
        order = sorted(listed)
        if data.draw(st.integers(0, 5)) == 0:
            order = data.draw(st.permutations(order))
        listing = [made[i] for i in order]
        if listing and data.draw(st.integers(0, 8)) == 0:
            listing.append(listing[0])  # the same node listed twice
        now += data.draw(st.sampled_from([0.0, 1.0, 40.0, 1000.0]))
        pos, todo, known = settled.todo(table, listing)
        assert [listing[i] for i in pos] == todo and len(known) + len(todo) <= len(listing)
        whole = sync_claims(table, listing, nodes, FLEET, RULES, now)
        part = sync_claims(table, todo, nodes, FLEET, RULES, now, known=known)
        assert _same_decisions(part, whole)
        for a in whole.actions:  # the shell's changes, through the table (its change feed follows them)
            if isinstance(a, SetClaim):
                table[a.key] = a.claim
            elif isinstance(a, FinishClaim):
                del table[a.key]
        settled.found(pos, listing, part.matched)


def test_a_settled_node_is_left_out_until_it_or_its_claim_changes() -> None:
    table = ClaimTable()
    for i in (1, 2, 3):
        table[f"r{i}"] = claim(f"r{i}", ClaimPhase.INITIALIZED, node_id=f"n{i}", name=f"node-{i}")
    listing = [cloud(f"r{i}", f"n{i}", f"node-{i}") for i in (1, 2, 3)]
    settled = SettledNodes()
    pos, todo, known = settled.todo(table, listing)
    assert todo == listing and not known  # nothing known yet: every node is judged
    d = sync_claims(table, todo, {}, FLEET, RULES, 1.0, known=known)
    assert d.settled and d.matched == [(0, "r1"), (1, "r2"), (2, "r3")]
    settled.found(pos, listing, d.matched)
    assert settled.todo(table, listing) == ([], [], {"r1": 0, "r2": 1, "r3": 2})
    fresh = [listing[0], cloud("r2", "n2", "node-2"), listing[2]]  # an equal node, another object: judged again
    assert settled.todo(table, fresh)[:2] == ([1], [fresh[1]])
    table["r3"] = replace(table["r3"], phase=ClaimPhase.DRAINING)  # its claim changed: judged again
    pos, todo, known = settled.todo(table, fresh)
    assert pos == [1, 2] and set(known) == {"r1"}
    settled.found(pos, fresh, sync_claims(table, todo, {}, FLEET, RULES, 2.0, known=known).matched)
    assert settled.todo(table, fresh)[0] == []
    assert settled.todo(table, fresh[:2])[2] == {"r1": 0, "r2": 1}  # the last node is gone from the listing
    assert settled.todo(table, [fresh[1], fresh[0]])[0] == [0, 1]  # another order: every node judged again
    other = ClaimTable()  # another table: nothing known
    assert settled.todo(other, fresh)[0] == [0, 1, 2]


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

    live = frozenset({"Pending", "Running"})
    first = obs.live_pods(pods, live)
    assert [p.name for p in first[0]] == ["a", "b"] and first[1] == {"n1": [pods[0]]} and first[2] == [pods[1]]
    assert obs.live_pods(pods, live) is first
    assert obs.live_pods(tuple(pods), live) is first  # tuple(t) is t: still the same list
    assert obs.live_pods(tuple(list(pods)), live) is first  # a new tuple of the same pods, in the same order
    again = obs.live_pods((pods[1], pods[0], pods[2]), live)  # another order: filtered and grouped again
    assert again is not first and again[1] == first[1] and again[2] == first[2]
    obs.live_pods(pods, live)
    other = (pods[0], Pod("b"), pods[2])  # an equal pod, another object: not recognised
    changed = obs.live_pods(other, live)
    assert changed is not first and changed == first
    changed = obs.live_pods(pods[:2], live)
    assert changed is not first and changed == first
    as_list = obs.live_pods(list(pods), live)
    assert obs.live_pods(list(pods), live) is not as_list  # a list is never recognised again


def _normalised(n: Any) -> Any:
    return replace(n, pool=n.labels.get("pool", "p")) if n.pool is None else n


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_node_list_patched_where_it_changed_equals_it_read_whole(data: st.DataObject) -> None:
    """Random node lists, each a tuple made again with some objects replaced (renamed, without a pool, another
    length, a name twice): the patched dict equals the one read from the whole list, in the same order."""
    obs = Observation(None)
    names = ["a", "b", "c", "d"]
    nodes: list[Any] = []
    for _ in range(data.draw(st.integers(1, 10))):
        if not nodes or data.draw(st.integers(0, 4)) == 0:  # another length, maybe names twice
            size = data.draw(st.integers(0, 4))
            nodes = [k8s(data.draw(st.sampled_from(names))) for _ in range(size)]
        for i in range(len(nodes)):
            if data.draw(st.integers(0, 2)) == 0:
                nodes[i] = replace(nodes[i], name=data.draw(st.sampled_from([nodes[i].name, *names])))
                nodes[i] = replace(nodes[i], pool=data.draw(st.sampled_from([None, "gpu"])))
        listed = tuple(nodes)
        whole = {n.name: _normalised(n) for n in listed}
        patched = obs.patched_nodes(listed, _normalised)
        assert patched is None or (patched == whole and list(patched) == list(whole))
        obs.keep_nodes(listed, whole)


def test_a_node_list_patched_only_where_objects_changed() -> None:
    obs = Observation(None)
    a, b = k8s("a"), k8s("b")
    assert obs.patched_nodes((a, b), _normalised) is None  # nothing kept yet
    obs.keep_nodes((a, b), {"a": a, "b": b})
    b2 = replace(b, unschedulable=True)
    assert obs.patched_nodes((a, b2), _normalised) == {"a": a, "b": b2}
    assert obs.patched_nodes((a, replace(b, name="c")), _normalised) is None  # renamed: read whole
    assert obs.patched_nodes((a,), _normalised) is None  # another length
    assert obs.patched_nodes([a, b2], _normalised) is None  # a list that may change in place


def _grouped_by_world(pods: list[Pod]) -> tuple[dict[str, list[Pod]], list[Pod]]:
    world = World(0.0, pods, {}, [], [], [], {})  # no grouping given: the world groups its pods itself
    return world.by_node(), world.unbound()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["n1", "n2", "n3", None]), st.sampled_from(["Pending", "Running", "Succeeded", ""])),
        max_size=12,
    )
)
def test_live_pods_filters_and_groups_in_one_pass_as_separately(spec: list[tuple[str | None, str]]) -> None:
    listed = tuple(Pod(f"p{i}", node_name=node, phase=phase) for i, (node, phase) in enumerate(spec))
    phases = frozenset({"Pending", "Running", ""})
    pods, by_node, unbound = live_pods(listed, phases)
    assert pods == [p for p in listed if p.phase in phases]
    assert (by_node, unbound) == _grouped_by_world(pods)
    assert list(by_node) == list(dict.fromkeys(p.node_name for p in pods if p.node_name is not None))


# ------------------------------------------------------------------------------------------------ whole runs
@pytest.fixture
def no_shortcuts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Turns the round's shortcuts off (every sync runs on every listed node, the pods are filtered and grouped every
    round, a node's pool is looked up every time)."""

    def pool_of_node(self: ShellBase, name: str) -> NodePool | None:
        found = self.claims.by_node_name(name)
        return self.pools.get(found[1].pool) if found is not None else None

    def off() -> None:
        monkeypatch.setattr(Observation, "sync_needed", lambda self, version: True)
        monkeypatch.setattr(SettledNodes, "todo", lambda self, table, cloud: (list(range(len(cloud))), list(cloud), {}))
        monkeypatch.setattr(SettledNodes, "found", lambda self, pos, cloud, matched: None)
        monkeypatch.setattr(Observation, "patched_nodes", lambda self, listed, normalise: None)
        monkeypatch.setattr(ShellBase, "_pool_of_node", pool_of_node)
        monkeypatch.setattr(ShellBase, "_node_pools", lambda self: self._pool_of_node)
        monkeypatch.setattr(Observation, "live_pods", lambda self, pods, ok: live_pods(pods, ok))

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
    # the lookup handed to a reader: the same answers; a claim change is seen by the next lookup asked for
    pool_of = ctrl._node_pools()
    assert pool_of("node-1") is None and pool_of("node-2") is None
    ctrl.claims["r1"] = c
    pool_of = ctrl._node_pools()
    assert pool_of("node-1") is ctrl.pools["gpu"] and pool_of("node-2") is None
    ctrl.claims["r1"] = replace(c, node_name="node-2")
    pool_of = ctrl._node_pools()
    assert pool_of("node-1") is None and pool_of("node-2") is ctrl.pools["gpu"] is ctrl._pool_of_node("node-2")
