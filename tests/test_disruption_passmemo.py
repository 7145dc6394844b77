"""The disruption pass's memo (:mod:`gpuscale.core.disruption.passmemo`): a pass given the memo decides exactly as one
without it, over random sequences of cluster changes (pods arriving, leaving and moving, planned pods, nodes joining,
leaving and being cordoned, candidates, protected and disrupting nodes, budgets, time); it does reuse the last
all-kept pass when nothing a candidate could use changed, and not when room appears where its pods fit."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from gpuscale.core.disruption import DisruptionPlan, plan_disruption
from gpuscale.core.disruption.passmemo import PassMemo, rows_of
from gpuscale.core.disruption.values import KeepReason
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    Disruption,
    DisruptionBudget,
    InstanceType,
    Node,
    NodePool,
    Offering,
    Pod,
)
from gpuscale.core.resources import Request
from gpuscale.core.templates import template_allocatable, template_labels

OD = CapacityType.ON_DEMAND


def _it(name: str, vcpus: int, mem_gib: int, gpus: int, price: float) -> InstanceType:
    offers = (Offering("z1", OD, price),)
    return InstanceType(name, "test", vcpus, mem_gib * 1024, gpus, "A10" if gpus else None, offerings=offers)


CATALOG = Catalog(
    "t",
    (
        _it("c4", 4, 16, 0, 0.2),
        _it("g1", 8, 32, 1, 1.0),
        _it("g2", 16, 64, 2, 1.9),
        _it("g4", 32, 128, 4, 3.6),
        _it("c32", 32, 128, 0, 0.9),
    ),
)
TYPES = CATALOG.by_name()
T0 = 1_000_000.0


def _pool(budget: str = "100%") -> NodePool:
    return NodePool("gpu", disruption=Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget(budget),)))


def _node(name: str, itype: str, p: NodePool) -> Node:
    t = TYPES[itype]
    off = t.offerings[0]
    return Node(
        name,
        template_allocatable(p, t),
        template_labels(p, t, off),
        p.taints,
        pool=p.name,
        hourly_cost=off.hourly_price,
    )


def _pod(name: str, on: str | None, gpus: int = 0, milli: int = 0, cpu: int = 500) -> Pod:
    return Pod(
        name,
        request=Request(cpu_milli=cpu, memory_mib=512, gpus=gpus, gpu_milli=milli),
        node_name=on,
        phase="Running" if on else "Pending",
    )


class _Walk:
    """A small cluster changed at random, one step at a time (unchanged nodes and pods keep their objects)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.pool = _pool()
        self.nodes: dict[str, Node] = {}
        self.pods: list[Pod] = []
        self.now = T0
        self.n = 0
        self.protected: set[str] = set()
        self.disrupting: set[str] = set()
        self.candidates: set[str] | None = None
        self.since: dict[str, float] = {}
        for _ in range(5):
            self._add_node()
        for _ in range(6):
            self._add_pod()

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def _add_node(self) -> None:
        name = self._name("n")
        self.nodes[name] = _node(name, self.rng.choice(["g1", "g2", "g4", "c4"]), self.pool)
        self.since[name] = self.now - self.rng.choice([0.0, 100.0, 1000.0])

    def _add_pod(self, pending: bool = False) -> None:
        r = self.rng
        on = None if pending or not self.nodes else r.choice(sorted(self.nodes))
        kind = r.random()
        gpus, milli = (1, 0) if kind < 0.4 else (0, r.choice([250, 500])) if kind < 0.7 else (0, 0)
        self.pods.append(_pod(self._name("p"), on, gpus=gpus, milli=milli, cpu=r.choice([250, 500, 2000])))

    def step(self) -> None:
        r = self.rng
        move = r.random()
        names = sorted(self.nodes)
        if move < 0.2:
            self._add_pod(pending=r.random() < 0.3)
        elif move < 0.4 and self.pods:
            self.pods.pop(r.randrange(len(self.pods)))
        elif move < 0.5 and self.pods and names:  # a pending pod planned onto a node, or a pod moved
            i = r.randrange(len(self.pods))
            self.pods[i] = replace(self.pods[i], node_name=r.choice(names))
        elif move < 0.55:
            self._add_node()
        elif move < 0.6 and len(names) > 2:
            gone = r.choice(names)
            del self.nodes[gone]
            self.pods = [p for p in self.pods if p.node_name != gone]
        elif move < 0.63 and names:
            n = r.choice(names)
            self.nodes[n] = replace(self.nodes[n], unschedulable=not self.nodes[n].unschedulable)
        elif move < 0.7 and names:
            self.protected = set(r.sample(names, r.randint(0, min(2, len(names)))))
        elif move < 0.75 and names:
            self.disrupting = set(r.sample(names, r.randint(0, 1)))
        elif move < 0.85 and names:
            self.candidates = None if r.random() < 0.3 else set(r.sample(names, r.randint(1, len(names))))
        elif move < 0.9:
            self.pool = _pool(r.choice(["100%", "1", "0"]))
            self.nodes = {k: replace(n) for k, n in self.nodes.items()}  # new objects, same values
        self.now += r.choice([0.0, 1.0, 10.0, 60.0])

    def plan(self, memo: PassMemo | None) -> DisruptionPlan:
        cands = None if self.candidates is None else self.candidates & set(self.nodes)
        return plan_disruption(
            list(self.nodes.values()),
            self.pods,
            [self.pool],
            CATALOG,
            self.now,
            since=dict(self.since),
            candidates=cands,
            disrupting=self.disrupting & set(self.nodes),
            protected=self.protected & set(self.nodes),
            memo=memo,
        )


@pytest.mark.parametrize("seed", range(40))
def test_memo_decides_exactly_as_a_pass_without_it(seed: int) -> None:
    walk = _Walk(seed)
    memo = PassMemo()
    for _ in range(80):
        assert walk.plan(memo) == walk.plan(None)
        live: dict[str, list[Pod]] = {}
        for p in walk.pods:
            if p.node_name is not None:
                live.setdefault(p.node_name, []).append(p)
        dest = [n for n in walk.nodes.values() if not n.unschedulable and n.name not in walk.disrupting]
        rows, _, total = rows_of(dest, live, None)
        assert memo.total == total and memo.rows.keys() == rows.keys()  # the incremental total is the recomputed one
        walk.step()


def test_memo_is_used_over_random_walks() -> None:
    hits = passes = 0
    for seed in range(40):
        walk = _Walk(seed)
        memo = PassMemo()
        for _ in range(80):
            walk.plan(memo)
            passes += 1
            walk.step()
        hits += memo.hits
    assert hits > passes // 10  # a memo that never answers would pass the test above


def _plan(nodes: list[Node], pods: list[Pod], memo: PassMemo | None, now: float = T0) -> DisruptionPlan:
    return plan_disruption(
        nodes, pods, [POOL], CATALOG, now, since={n.name: 0.0 for n in nodes}, candidates={"a1"}, memo=memo
    )


POOL = _pool()


def _twice(nodes: list[Node], before: list[Pod], after: list[Pod]) -> tuple[DisruptionPlan, PassMemo]:
    """The plan for ``after`` with a memo that saw ``before`` (checked against a pass without it), and the memo."""
    memo = PassMemo()
    first = _plan(nodes, before, memo)
    assert not first.actions and [k.node for k in first.kept] == ["a1"]
    again = _plan(nodes, after, memo, T0 + 10)
    assert again == _plan(nodes, after, None, T0 + 10)
    return again, memo


def test_room_no_candidate_pod_can_use_reuses_the_last_pass() -> None:
    """a1 (g4) is underused by a 1-GPU pod too large for a cheaper g1 that fits nowhere else (a2's GPUs are taken,
    c is a CPU node): it is kept, and kept again without a pass when c's pod leaves."""
    nodes = [_node("a1", "g4", POOL), _node("a2", "g4", POOL), _node("c", "c4", POOL)]
    pods = [_pod("w1", "a1", gpus=1, cpu=20000), _pod("w2", "a2", gpus=4, cpu=1000), _pod("x", "c", cpu=500)]
    again, memo = _twice(nodes, pods, pods[:2])
    assert memo.hits == 1 and not again.actions


def test_room_a_candidate_pod_can_use_runs_the_pass() -> None:
    """As above, with a3 holding enough free GPUs (but too little CPU) for the total-room filter to pass: a2's GPUs
    freed, a1's pod moves there."""
    nodes = [_node("a1", "g4", POOL), _node("a2", "g4", POOL), _node("a3", "g4", POOL)]
    pods = [_pod("w1", "a1", gpus=1, cpu=20000), _pod("w2", "a2", gpus=4, cpu=1000), _pod("y", "a3", cpu=30000)]
    again, memo = _twice(nodes, pods, [pods[0], pods[2]])
    assert memo.hits == 0 and [(a.node, str(a.kind)) for a in again.actions] == [("a1", "Delete")]


def test_room_that_lets_the_total_room_filter_pass_runs_the_pass() -> None:
    """Room on a CPU node takes no GPU pod, but it can lift the pass's total-room filter: a1's small pod then moves
    to a2 and only the large one is left (the kept message counts 1 pod instead of 2)."""
    nodes = [_node("a1", "g4", POOL), _node("a2", "g1", POOL), _node("a3", "g1", POOL), _node("c", "c32", POOL)]
    pods = [
        _pod("big", "a1", gpus=1, cpu=20000),
        _pod("small", "a1", milli=500, cpu=1000),
        _pod("y", "a3", cpu=7800),
        _pod("x", "c", cpu=30000),
    ]
    before = _plan(nodes, pods, None)
    assert "2 pod(s)" in before.kept[0].message
    again, memo = _twice(nodes, pods, pods[:3])
    assert memo.hits == 0 and "1 pod(s)" in again.kept[0].message


def test_pass_inputs_are_equal_only_when_every_part_is() -> None:
    """The consolidation step's unchanged-inputs key: equal when the small inputs, the nodes (name, cordon,
    allocatable, launching) and the bound pods (key, node) are; pending pods and the lists' order do not count."""
    from gpuscale.controller.consolidation import PassInputs

    nodes = [_node("a", "g1", POOL), _node("b", "g4", POOL)]
    pods = [_pod("x", "a", gpus=1), _pod("y", None)]
    small: tuple[object, ...] = (frozenset({"a"}), frozenset(), frozenset(), frozenset(), None)
    same = PassInputs(small, nodes, pods)
    assert same == PassInputs(small, list(reversed(nodes)), [pods[1], replace(pods[0])])
    assert same == PassInputs(small, nodes, [pods[0]])  # a pending pod is not part of it
    assert same != PassInputs((frozenset({"b"}), *small[1:]), nodes, pods)
    assert same != PassInputs(small, [nodes[0], replace(nodes[1], unschedulable=True)], pods)
    assert same != PassInputs(small, nodes, [replace(pods[0], node_name="b"), pods[1]])
    assert same != None  # noqa: E711 (the gate's key before the first pass)


def test_room_a_candidate_pod_could_use_before_the_change_runs_the_pass() -> None:
    """The reverse of the total-room case: a2 (g1, empty) takes a1's small pod, so only the large one is left (1
    pod). A CPU-heavy pod then fills a2's CPU: a2 as it is now takes none of a1's pods and the total-room filter
    (the c32's CPU, a3's GPU) still passes, but a2 as it was took the small pod, so the pass runs again and both pods
    are left (2 pods)."""
    nodes = [_node("a1", "g4", POOL), _node("a2", "g1", POOL), _node("a3", "g1", POOL), _node("c", "c32", POOL)]
    pods = [
        _pod("big", "a1", gpus=1, cpu=20000),
        _pod("small", "a1", milli=500, cpu=1000),
        _pod("y", "a3", cpu=7800),
    ]
    before = _plan(nodes, pods, None)
    assert "1 pod(s)" in before.kept[0].message
    again, memo = _twice(nodes, pods, [*pods, _pod("z", "a2", cpu=7800)])
    assert memo.hits == 0 and "2 pod(s)" in again.kept[0].message


def _pass(
    nodes: list[Node],
    pods: list[Pod],
    memo: PassMemo | None,
    now: float = T0,
    since: float = 0.0,
    pool: NodePool = POOL,
    catalog: Catalog = CATALOG,
    utilization: dict[str, float] | None = None,
) -> DisruptionPlan:
    return plan_disruption(
        nodes,
        pods,
        [pool],
        catalog,
        now,
        since={n.name: since for n in nodes},
        candidates={"a1"},
        utilization=utilization,
        memo=memo,
    )


def _kept_then(first: dict[str, Any], then: dict[str, Any], nodes: list[Node], pods: list[Pod]) -> DisruptionPlan:
    """A pass with ``first``'s arguments keeps a1 (a1 alone) and records it in a memo; the pass with ``then``'s
    arguments given that memo decides as one without it, never reusing the first pass's verdict."""
    memo = PassMemo()
    kept = _pass(nodes, pods, memo, **first)
    assert not kept.actions and [k.node for k in kept.kept] == ["a1"]
    again = _pass(nodes, pods, memo, **then)
    assert again == _pass(nodes, pods, None, **then)
    assert memo.hits == 0
    return again


BIG_ON_G4 = (
    [_node("a1", "g4", POOL), _node("a2", "g4", POOL), _node("c", "c4", POOL)],
    [_pod("w1", "a1", gpus=1, cpu=20000), _pod("w2", "a2", gpus=4, cpu=1000), _pod("x", "c", cpu=500)],
)
"""a1 (g4) kept: its 1-GPU pod is too large for a cheaper g1 and fits nowhere else."""


def test_a_candidate_that_became_one_again_later_is_judged_again() -> None:
    """The candidate's time (since) moves to now: it waits out consolidateAfter instead of being kept as before."""
    again = _kept_then({}, {"now": T0 + 10, "since": T0 + 10}, *BIG_ON_G4)
    assert [str(k.reason) for k in again.kept] == [str(KeepReason.WAITING)]


def test_a_pass_earlier_than_the_last_one_is_judged_again() -> None:
    """The clock goes back to before a1's consolidateAfter ran out: a1 waits again (its time is the same)."""
    again = _kept_then({"now": T0 + 100, "since": T0}, {"now": T0 + 10, "since": T0}, *BIG_ON_G4)
    assert [str(k.reason) for k in again.kept] == [str(KeepReason.WAITING)]


def test_another_catalog_is_judged_again() -> None:
    """A catalog with a cheaper 1-GPU type large enough for the pod: a1 is replaced."""
    roomy = Catalog("t2", (*CATALOG.instance_types, _it("g1x", 24, 64, 1, 1.5)))
    again = _kept_then({}, {"now": T0 + 10, "catalog": roomy}, *BIG_ON_G4)
    assert [(a.node, str(a.kind)) for a in again.actions] == [("a1", "Replace")]


def test_a_pool_grown_past_min_nodes_is_judged_again() -> None:
    """minNodes 2 keeps a1 (its pod fits on a2, the pool has 2 nodes); a cordoned node joins the pool (no row: only
    the pool's count changes) and a1 is deleted."""
    pool = replace(POOL, min_nodes=2)
    nodes = [_node("a1", "g1", pool), _node("a2", "g1", pool)]
    pods = [_pod("w", "a1", milli=250, cpu=500)]
    memo = PassMemo()
    kept = _pass(nodes, pods, memo, pool=pool)
    assert [str(k.reason) for k in kept.kept] == [str(KeepReason.MIN_NODES)]
    grown = [*nodes, replace(_node("a3", "g1", pool), unschedulable=True)]
    again = _pass(grown, pods, memo, now=T0 + 10, pool=pool)
    assert again == _pass(grown, pods, None, now=T0 + 10, pool=pool)
    assert memo.hits == 0 and [(a.node, str(a.kind)) for a in again.actions] == [("a1", "Delete")]


def test_a_scheduled_budget_is_judged_again_as_time_passes() -> None:
    """A budget of 0 for the first 10 minutes of each hour: a1 is kept at T0 (46:40 past the hour), and 15 minutes
    later (the pool's node counts unchanged) the budget blocks it."""
    window = DisruptionBudget("0", schedule="0 * * * *", duration_s=600.0)
    pool = NodePool("gpu", disruption=Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"), window)))
    again = _kept_then({"pool": pool}, {"now": T0 + 900, "pool": pool}, *BIG_ON_G4)
    assert [str(k.reason) for k in again.kept] == [str(KeepReason.BUDGET)]


def test_a_candidate_with_another_message_is_judged_again() -> None:
    """The measured GPU utilisation of a1 changes (its node, pods and row do not): the candidate's message, and so
    its kept message, is the new one."""
    measured = replace(POOL.disruption, use_measured_gpu_utilization=True)
    pool = replace(POOL, disruption=measured)
    again = _kept_then(
        {"pool": pool, "utilization": {"a1": 0.1}},
        {"now": T0 + 10, "pool": pool, "utilization": {"a1": 0.2}},
        *BIG_ON_G4,
    )
    assert "measured GPU utilisation 20%" in again.kept[0].message
