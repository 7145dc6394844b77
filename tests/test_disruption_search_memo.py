"""The pass memo's replacement searches (:attr:`~gpuscale.core.disruption.passmemo.PassMemo.searched`): a candidate
judged again with the same pods left over, under the same market, reuses its last search (and decides as a pass
without the memo); another market (an offering unavailable now) searches again; a search made after the pass bought
a replacement is not kept."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuscale.core.disruption import DisruptionPlan, plan_disruption
from gpuscale.core.disruption import plan as plan_module
from gpuscale.core.disruption import replacement as replacement_module
from gpuscale.core.disruption.passmemo import PassMemo
from gpuscale.core.disruption.values import ActionKind, KeepReason
from gpuscale.core.model import Node, OfferingKey, Pod, Taint, TaintEffect, Toleration
from test_disruption_passmemo import CATALOG, OD, T0, _node, _pod, _pool

POOL = _pool()


def _cluster() -> tuple[list[Node], list[Pod]]:
    """n1 (g1, $1/h) runs a quarter of a GPU that no other node can take and no cheaper node can run: kept."""
    nodes = [_node("n1", "g1", POOL), _node("f1", "g1", POOL)]
    pods = [_pod("p1", "n1", milli=250), _pod("q1", "f1", gpus=1)]
    return nodes, pods


def _plan(nodes: list[Node], pods: list[Pod], now: float, memo: PassMemo | None, **kw: Any) -> DisruptionPlan:
    since = {n.name: T0 - 1000.0 for n in nodes}
    return plan_disruption(nodes, pods, [POOL], CATALOG, now, since=since, memo=memo, **kw)


def _decisions(plan: DisruptionPlan) -> tuple[object, object]:
    return plan.actions, plan.kept


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes whose replacement the pass searched (find_replacement counted)."""
    seen: list[str] = []
    search = replacement_module.find_replacement

    def counted(node: Node, *args: Any) -> Any:
        seen.append(node.name)
        return search(node, *args)

    monkeypatch.setattr(plan_module, "find_replacement", counted)
    return seen


def test_a_candidate_judged_again_with_the_same_pods_left_reuses_its_search(searches: list[str]) -> None:
    nodes, pods = _cluster()
    memo = PassMemo()
    first = _plan(nodes, pods, T0, memo)
    assert [k.reason for k in first.kept] == [KeepReason.NO_REPLACEMENT] and searches == ["n1"]
    memo.judged = {}  # (its verdict no longer stands: judged again)
    again = _plan(nodes, pods, T0 + 10.0, memo)
    assert searches == ["n1"]  # not searched again
    assert _decisions(again) == _decisions(_plan(nodes, pods, T0 + 10.0, None))


def test_an_offering_unavailable_now_searches_again(searches: list[str]) -> None:
    nodes, pods = _cluster()
    gone = {OfferingKey("g1", "z1", OD): T0 + 100.0}
    reference = _decisions(_plan(nodes, pods, T0 + 10.0, None, unavailable=gone))
    memo = PassMemo()
    searches.clear()
    _plan(nodes, pods, T0, memo)
    memo.judged = {}
    again = _plan(nodes, pods, T0 + 10.0, memo, unavailable=gone)
    assert searches == ["n1", "n1"]
    assert _decisions(again) == reference
    memo.judged = {}
    _plan(nodes, pods, T0 + 200.0, memo, unavailable=gone)  # (no longer unavailable then: the first market again)
    assert searches == ["n1", "n1", "n1"]


def test_a_search_after_a_replacement_was_bought_is_not_kept(searches: list[str]) -> None:
    """r1 and r2 (g4, $3.6/h, one GPU used, each pod tolerating only its own node's taint) are each replaced by a
    g1: r2's search came after r1's replacement was bought."""
    own = {"r1": Taint("only", TaintEffect.NO_SCHEDULE, "r1"), "r2": Taint("only", TaintEffect.NO_SCHEDULE, "r2")}
    nodes = [replace(_node(name, "g4", POOL), taints=(t,)) for name, t in own.items()]
    pods = [replace(_pod(f"p-{name}", name, gpus=1), tolerations=(Toleration("only", "Equal", name),)) for name in own]
    reference = _decisions(_plan(nodes, pods, T0, None))
    searches.clear()
    memo = PassMemo()
    plan = _plan(nodes, pods, T0, memo)
    assert [(a.node, a.kind) for a in plan.actions] == [("r1", ActionKind.REPLACE), ("r2", ActionKind.REPLACE)]
    assert searches == ["r1", "r2"] and set(memo.searched) == {"r1"}
    assert _decisions(plan) == reference


def test_pools_replaced_by_others_are_read_afresh() -> None:
    """The memo keeps the pools by name for the same pool objects only: a pool replaced by one with maxNodes (the
    pass may no longer add a node) is read from the new object (fails if the kept pools are reused)."""
    nodes = [_node("r1", "g4", POOL), _node("f1", "g1", POOL)]
    pods = [_pod("a", "r1", gpus=1), _pod("q", "f1", gpus=1)]
    since = {n.name: T0 - 1000.0 for n in nodes}
    memo = PassMemo()
    first = plan_disruption(nodes, pods, [POOL], CATALOG, T0, since=since, memo=memo)
    assert [(a.node, a.kind) for a in first.actions] == [("r1", ActionKind.REPLACE)]
    capped = replace(POOL, max_nodes=2)
    again = plan_disruption(nodes, pods, [capped], CATALOG, T0 + 10.0, since=since, memo=memo)
    assert _decisions(again) == _decisions(plan_disruption(nodes, pods, [capped], CATALOG, T0 + 10.0, since=since))
    assert not again.actions and memo.pools is not None and memo.pools[1] == {"gpu": capped} and memo.pools[2]
