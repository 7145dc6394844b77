"""The consolidation pass's input caches give what computing afresh gives: the destinations and node counts a
:class:`~gpuscale.core.disruption.passmemo.PassMemo` keeps (:func:`~gpuscale.core.disruption.plan.destinations`), a
pass given the caller's pods by node (``by_node``), and the controller's pass inputs (pods by node with planned pods,
nodes in flight and planned pods kept as the same objects between passes) on simulated clusters."""

from __future__ import annotations

import operator
import random
from dataclasses import replace
from typing import Any

import pytest

from gpuscale.controller.loop import Controller
from gpuscale.controller.scaledown import ScaleDownSteps
from gpuscale.controller.shell import DisruptionInputs, World
from gpuscale.core.disruption import plan_disruption
from gpuscale.core.disruption.passmemo import PassMemo
from gpuscale.core.disruption.plan import destinations
from gpuscale.core.model import Node, NodePool, Pod
from gpuscale.sim.cloud import CloudBehaviour, SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Dist, Engine
from test_consolidation_gate import CATALOG, CONFIG, FAST, _pod, _pool
from test_disruption_passmemo import _Walk


def _random_nodes(rng: random.Random, known: dict[str, Node]) -> list[Node]:
    """Nodes of two pools (some launching, cordoned or poolless), mostly the same objects as the last call."""
    for name in list(known):
        if rng.random() < 0.15:
            del known[name]
        elif rng.random() < 0.1:
            known[name] = replace(known[name], unschedulable=not known[name].unschedulable)
    while len(known) < 6 or rng.random() < 0.2:
        name = f"n{rng.randrange(1000)}"
        pool = rng.choice(["a", "b", None])
        known[name] = Node(name, CATALOG.by_name()["g1"].capacity, pool=pool, launching=rng.random() < 0.2)
    nodes = list(known.values())
    if rng.random() < 0.1:
        rng.shuffle(nodes)
    return nodes


@pytest.mark.parametrize("seed", range(5))
def test_destinations_kept_by_the_memo_equal_recomputed_ones(seed: int) -> None:
    rng = random.Random(seed)
    memo = PassMemo()
    known: dict[str, Node] = {}
    hits = 0
    for _ in range(200):
        nodes = _random_nodes(rng, known) if rng.random() < 0.5 or not memo.destinations else list(known.values())
        names = [n.name for n in nodes]
        disrupting = set(rng.sample(names, rng.randint(0, 2))) if rng.random() < 0.3 else set()
        before = memo.destinations
        got = destinations(nodes, disrupting, memo)
        hits += memo.destinations is before
        assert got == destinations(nodes, disrupting, None)
        got[1].clear()  # a pass changes its counts: the memo's stay as they were
        got[3].clear()
    assert hits > 20  # the memo was used


@pytest.mark.parametrize("seed", range(8))
def test_a_pass_given_the_pods_by_node_decides_as_one_grouping_them(seed: int) -> None:
    walk = _Walk(seed)
    with_memo, without = PassMemo(), PassMemo()
    for _ in range(60):
        grouped: dict[str, list[Pod]] = {}
        for p in walk.pods:
            if p.node_name is not None:
                grouped.setdefault(p.node_name, []).append(p)
        cands = None if walk.candidates is None else walk.candidates & set(walk.nodes)
        kw: dict[str, Any] = {
            "since": dict(walk.since),
            "candidates": cands,
            "disrupting": walk.disrupting & set(walk.nodes),
            "protected": walk.protected & set(walk.nodes),
        }
        args = (list(walk.nodes.values()), walk.pods, [walk.pool], CATALOG, walk.now)
        given_by_node = plan_disruption(*args, **kw, memo=with_memo, by_node=grouped)
        assert given_by_node == plan_disruption(*args, **kw, memo=without)
        assert given_by_node == plan_disruption(*args, **kw)
        walk.step()


def _grouped(pods: list[Pod]) -> dict[str, list[Pod]]:
    out: dict[str, list[Pod]] = {}
    for p in pods:
        if p.node_name is not None:
            out.setdefault(p.node_name, []).append(p)
    return out


def _world(pool: NodePool, seed: int, behaviour: CloudBehaviour) -> tuple[Engine, SimCluster, Controller]:
    """A controller over a simulated cluster and cloud with ``pool``."""
    engine = Engine()
    cluster = SimCluster(engine, CATALOG, [pool], seed=seed)
    cloud = SimCloud(engine, CATALOG, behaviour, seed=seed, listener=cluster)
    return engine, cluster, Controller(cluster, cloud, [pool], CATALOG, engine.clock, CONFIG)


def _run(
    engine: Engine,
    cluster: SimCluster,
    ctrl: Controller,
    seed: int,
    pods: int,
    gpus: list[int],
    cpus: list[int],
    arrive_s: float,
    longest_s: float,
    end_s: float,
) -> None:
    """``pods`` random pods arriving over ``arrive_s`` and running 10 s to ``longest_s``; a round every 2 s."""
    rng = random.Random(seed)
    for i in range(pods):
        pod = _pod(f"p{i}", rng.choice(gpus), rng.choice(cpus), {})
        engine.at(rng.uniform(0.0, arrive_s), cluster.add_pod, pod, rng.uniform(10.0, longest_s))
    t = 0.0
    while t < end_s:
        t += 2.0
        engine.run_until(t)
        ctrl.reconcile()


def test_the_controllers_pass_inputs_equal_fresh_ones() -> None:
    """Every pass of a simulated cluster with launches in flight and pods planned onto nodes: the pass's pods by node
    are its pods grouped afresh, its nodes in flight and planned pods equal new ones, and are the same objects as the
    last pass's while their claim (or pod and node) are the same (asked again at once, and across passes)."""
    seen = {"passes": 0, "flying": 0, "planned": 0, "same_flying": 0, "same_planned": 0}
    last: dict[str, Any] = {}
    inputs_of = ScaleDownSteps._disruption_inputs

    def checked(self: Controller, w: World, planned: dict[str, str]) -> DisruptionInputs:
        inputs = inputs_of(self, w, planned)
        seen["passes"] += 1
        assert inputs.by_node == _grouped(inputs.pods)
        again = inputs_of(self, w, planned)  # nothing changed: the very same planned pods and nodes in flight
        assert all(map(operator.is_, again.pods, inputs.pods)) and all(map(operator.is_, again.nodes, inputs.nodes))
        for p, q in zip(w.pods, inputs.pods, strict=True):
            assert (p is not q) == (p.pending and p.key in planned)  # every planned pending pod, and only those
            if p is not q:
                seen["planned"] += 1
                assert q == replace(p, node_name=planned[p.key])
                if last.get(p.key, (None, None, None))[:2] == (p, planned[p.key]):
                    assert last[p.key][2] is q
                    seen["same_planned"] += 1
                last[p.key] = (p, planned[p.key], q)
        by_name = {n.name: n for n in inputs.nodes if n.launching}
        for key, c in self.claims.items():
            node = by_name.get(c.node_name or f"nodeclaim-{key}")
            if node is None:
                continue
            seen["flying"] += 1
            assert node == self._launching_node(key, c)
            if last.get(key, (None, None))[0] is c:
                assert last[key][1] is node
                seen["same_flying"] += 1
            last[key] = (c, node)
        return inputs

    pool = _pool("100%", 20.0)
    slow = replace(FAST, launch_latency=Dist.const(60.0), device_plugin_delay=Dist.const(40.0))
    engine, cluster, ctrl = _world(pool, 3, slow)
    ctrl._disruption_inputs = checked.__get__(ctrl)  # type: ignore[method-assign]
    _run(engine, cluster, ctrl, 3, 400, [0, 1, 1, 2], [500, 2000, 6000], 1500.0, 120.0, 1800.0)
    assert seen["passes"] > 20 and seen["flying"] > 0 and seen["planned"] > 0, seen
    assert seen["same_flying"] > 0, seen


def test_the_consolidation_steps_kept_inputs_equal_fresh_ones() -> None:
    """Every round of a simulated cluster (launches, drains, replacements, planned pods): the candidates, nodes being
    disrupted, planned pods and claims in flight the step keeps between rounds equal those made afresh."""
    rounds = {"all": 0, "kept": 0}
    step_inputs = ScaleDownSteps._step_inputs

    def checked(self: Controller, w: World) -> tuple[set[str], set[str], dict[str, str], frozenset[str]]:
        before = self.__dict__.get("_step_inputs_memo")
        got = step_inputs(self, w)
        rounds["all"] += 1
        rounds["kept"] += self.__dict__.get("_step_inputs_memo") is before
        assert got == self._fresh_step_inputs(w)
        return got

    pool = _pool("2", 20.0)
    slow = replace(FAST, launch_latency=Dist.const(30.0), device_plugin_delay=Dist.const(20.0))
    engine, cluster, ctrl = _world(pool, 5, slow)
    ctrl._step_inputs = checked.__get__(ctrl)  # type: ignore[method-assign]
    _run(engine, cluster, ctrl, 5, 300, [0, 1, 1, 2], [500, 2000, 6000], 1200.0, 200.0, 1500.0)
    assert rounds["all"] > 500 and 0 < rounds["kept"] < rounds["all"], rounds
    assert any(e.kind == "Consolidate" for e in cluster.events)


def test_rounds_with_only_deletions_not_due_drain_nothing() -> None:
    """The drain step skips drain_step when every leaving claim is Deleting with its repeat not due: on every such
    round of a simulated cluster, drain_step would indeed decide nothing."""
    from gpuscale.controller.shell import LEAVING
    from gpuscale.core.nodeclaim import ClaimPhase
    from gpuscale.core.reconcile import drain_step

    skipped = {"rounds": 0}
    drain_and_delete = ScaleDownSteps._drain_and_delete

    def checked(self: Controller, w: World, result: Any) -> None:
        leaving = self.claims.in_phases(LEAVING)
        due = self.deletions.retry_at
        if leaving and all(c.phase is ClaimPhase.DELETING and due.get(k, -1e18) > w.now for k, c in leaving):
            skipped["rounds"] += 1
            d = drain_step(leaving, w.by_node(), w.nodes, w.pods, w.pdbs, self.replacements.involuntary, due, w.now,
                           evicting_since=self.deletions.evicting_since)  # fmt: skip
            assert d.actions == [] and not d.replan
        drain_and_delete(self, w, result)

    pool = _pool("2", 20.0)
    slow = replace(FAST, deletion_latency=Dist.const(60.0))
    engine, cluster, ctrl = _world(pool, 7, slow)
    ctrl._drain_and_delete = checked.__get__(ctrl)  # type: ignore[method-assign]
    _run(engine, cluster, ctrl, 7, 150, [0, 1, 2], [500, 6000], 900.0, 200.0, 1200.0)
    assert skipped["rounds"] > 10, skipped
