"""Shortcuts of a disruption pass's fixed work (:mod:`gpuscale.core.disruption.passmemo`): the rows of the same
destination nodes looked up list to list, budget verdicts kept per pool and node counts, and the candidates found
among the named ones only. Each answer equals the one computed without the shortcut."""

from __future__ import annotations

import random
from dataclasses import replace

from gpuscale.core.disruption import plan_disruption
from gpuscale.core.disruption.budgets import allowed_disruptions
from gpuscale.core.disruption.candidates import classify, classify_node, find_candidates, is_live, workload_pods
from gpuscale.core.disruption.passmemo import Judged, PassMemo, Row, rows_of
from gpuscale.core.disruption.values import BudgetVerdict, Candidate, DisruptionReason, KeepReason, Kept
from gpuscale.core.model import ConsolidationPolicy, Disruption, DisruptionBudget, Node, NodePool, Pod
from test_disruption_passmemo import CATALOG, T0, _node, _pod, _pool


def _by_node(pods: list[Pod]) -> dict[str, list[Pod]]:
    out: dict[str, list[Pod]] = {}
    for p in pods:
        if p.node_name is not None:
            out.setdefault(p.node_name, []).append(p)
    return out


def _same_rows(memo: PassMemo, dest: list[Node], by_node: dict[str, list[Pod]]) -> tuple[dict[str, Row], set[str]]:
    """rows_of with the memo (kept as a pass keeps them), checked against rows_of without it."""
    rows, changed, total = rows_of(dest, by_node, memo)
    fresh, _, fresh_total = rows_of(dest, by_node, None)
    assert list(rows) == list(fresh) and total == fresh_total
    for name, r in fresh.items():
        got = rows[name]
        assert (got.node, list(got.pods), got.cpu, got.mem, got.gpu, got.slots, got.g_row, got.pos) == (
            r.node,
            list(r.pods),
            r.cpu,
            r.mem,
            r.gpu,
            r.slots,
            r.g_row,
            r.pos,
        )
    memo.remember(T0, (), rows, total, {}, {}, {})
    return rows, changed


def test_rows_of_the_same_destinations_rebuild_only_the_rows_whose_pods_changed() -> None:
    pool = _pool()
    dest = [_node(f"n{i}", ("g1", "g2", "g4", "c4")[i % 4], pool) for i in range(6)]
    pods = [_pod("a", "n0", gpus=1), _pod("b", "n1", milli=500), _pod("c", "n1"), _pod("d", "n3", cpu=2000)]
    memo = PassMemo()
    first, changed = _same_rows(memo, dest, _by_node(pods))
    assert changed == set(first)
    again, changed = _same_rows(memo, list(dest), _by_node(pods))  # equal pods, other lists: every row kept
    assert changed == set() and all(again[k] is first[k] for k in first)
    moved = [pods[0], replace(pods[1], node_name="n4"), pods[2], pods[3], _pod("e", "n5", gpus=1)]
    third, changed = _same_rows(memo, dest, _by_node(moved))
    assert changed == {"n1", "n4", "n5"}
    assert all(third[k] is again[k] for k in ("n0", "n2", "n3"))
    fourth, changed = _same_rows(memo, dest, _by_node([]))  # every pod gone
    assert changed == {"n0", "n1", "n3", "n4", "n5"} and fourth["n2"] is third["n2"]


def test_rows_of_a_pass_that_did_not_keep_them_are_not_reused_by_the_shortcut() -> None:
    pool = _pool()
    dest = [_node(f"n{i}", "g2", pool) for i in range(3)]
    pods = [_pod("a", "n0", gpus=1)]
    memo = PassMemo()
    kept, _ = _same_rows(memo, dest, _by_node(pods))
    other = [_pod("b", "n2", gpus=2)]
    rows_of(dest, _by_node(other), memo)  # made, but not kept (no remember): the memo's rows are still ``kept``
    again, changed = _same_rows(memo, dest, _by_node(other))
    assert changed == {"n0", "n2"} and again["n2"].gpu == 0 and again["n0"].gpu == 2000 and again["n1"] is kept["n1"]
    replaced = [dest[0], replace(dest[1]), dest[2]]  # an equal node object in the middle: built again
    third, changed = _same_rows(memo, replaced, _by_node(other))
    assert changed == {"n1"} and third["n1"].node is replaced[1]


def test_kept_budget_verdicts_equal_allowed_disruptions() -> None:
    pools = [
        NodePool("pct", disruption=Disruption(budgets=(DisruptionBudget("20%"), DisruptionBudget("3")))),
        NodePool("only", disruption=Disruption(budgets=(DisruptionBudget("0", reasons=("Empty",)),))),
        NodePool("none", disruption=Disruption(budgets=())),
    ]
    memo = PassMemo()
    for _ in range(2):  # the second time from the memo
        for pool in pools:
            for reason in DisruptionReason:
                for total in (0, 1, 7, 30):
                    for busy in (0, 1, 5):
                        want = allowed_disruptions(pool, reason, total, busy, T0)
                        assert memo.verdict(pool, reason, total, busy, T0) == want
    assert len(memo.verdicts) == 3 * len(DisruptionReason) * 4 * 3
    # the same name and counts in another pool object (other budgets): not the kept verdict
    strict = NodePool("pct", disruption=Disruption(budgets=(DisruptionBudget("0"),)))
    assert memo.verdict(strict, DisruptionReason.EMPTY, 30, 0, T0).allowed == 0


def test_a_pool_with_scheduled_budgets_is_judged_at_every_time() -> None:
    window = DisruptionBudget("0", schedule="0 9 * * *", duration_s=3600.0)
    pool = NodePool("w", disruption=Disruption(budgets=(window,)))
    memo = PassMemo()
    nine = 1_700_038_800.0  # 2023-11-15 09:00 UTC
    inside = memo.verdict(pool, DisruptionReason.EMPTY, 4, 0, nine + 60)
    outside = memo.verdict(pool, DisruptionReason.EMPTY, 4, 0, nine + 7200)
    assert inside.allowed == 0 and outside.allowed is None and memo.verdicts == {}


def test_candidates_found_among_the_named_ones_are_those_of_every_destination() -> None:
    pool = _pool()
    pools = {pool.name: pool}
    nodes = [_node(f"n{i}", ("g1", "g2", "g4", "c4")[i % 4], pool) for i in range(8)]
    pods = [_pod("a", "n1", milli=250), _pod("b", "n2", gpus=2), _pod("c", "n5", cpu=250)]
    by_node = _by_node(pods)
    since = {"n3": T0 - 50.0, "n5": T0 - 10.0}
    only = {"n5", "n3", "n1", "n2", "gone"}
    named = [n for n in reversed(nodes) if n.name in only]  # another order than the nodes'
    every = find_candidates(nodes, pools, by_node, CATALOG, T0, since, only, {})
    some = find_candidates(named, pools, by_node, CATALOG, T0, since, only, {})
    assert some == every and list(some[1]) == [c.node.name for c in some[0]]
    plan_all = plan_disruption(nodes, pods, [pool], CATALOG, T0, since=since, candidates=only)
    plan_memo = plan_disruption(nodes, pods, [pool], CATALOG, T0, since=since, candidates=only, memo=PassMemo())
    assert plan_memo == plan_all


def test_judged_candidates_see_the_rows_order_of_the_pass_as_without_the_shortcut() -> None:
    """A pass given the very rows the last pass kept reads their order from the memo (the same dict, never changed);
    other rows, even of the same Row objects, are ordered afresh: a tie between two rows its pod may take, broken the
    other way, no longer keeps the judged candidate (and does again once a pass kept that order)."""
    pool = _pool()
    nodes = [_node("n0", "g1", pool), _node("n1", "g2", pool), _node("n2", "g2", pool)]
    pod = _pod("a", "n0", gpus=1)
    by_node = _by_node([pod])
    memo = PassMemo()
    rows, _, total = rows_of(nodes, by_node, memo)
    cand = Candidate(nodes[0], pool, DisruptionReason.UNDERUTILIZED, "low", [pod], 0.5, 1.0)
    kept = Kept("n0", pool.name, KeepReason.NO_REPLACEMENT, "kept", DisruptionReason.UNDERUTILIZED)
    judged = {"n0": Judged(cand, T0, False, kept, None, None)}
    key = ("k",)

    def valid(rows: dict[str, Row]) -> set[str]:
        def verdict(c: Candidate) -> BudgetVerdict:
            raise AssertionError("no verdict was kept")

        got = memo.valid(T0, key, rows, set(), total, [cand], {"n0": T0}, (), verdict, {}, {}, None)
        return set(got)

    memo.remember(T0, key, rows, total, judged, {}, {})
    assert valid(rows) == {"n0"}
    swapped = {name: rows[name] for name in ("n0", "n2", "n1")}  # the same rows, the tie broken the other way
    assert valid(swapped) == set()
    memo.remember(T0, key, swapped, total, judged, {}, {})
    assert memo.order == ["n0", "n2", "n1"] and valid(swapped) == {"n0"}
    assert valid(rows) == set()
    memo.remember(T0, key, swapped, total, judged, {}, {})  # the same rows kept again: the same order
    assert memo.order == list(swapped)


def test_a_reason_without_its_message_is_the_classified_one() -> None:
    """classify_node (the gate's reasons, every touched candidate) filters the live workload pods and formats no
    message: the same reason as classify over the live workload pods, over pools, policies, thresholds, measured
    utilisation, drift, daemonsets and finished pods."""
    rng = random.Random(7)
    base = _pool()
    seen: set[object] = set()
    for _ in range(400):
        d = Disruption(
            consolidation_policy=rng.choice(list(ConsolidationPolicy)),
            utilization_threshold=rng.choice([0.2, 0.5, 0.9]),
            use_measured_gpu_utilization=rng.random() < 0.5,
        )
        pool = replace(base, disruption=d, zones=("nowhere",) if rng.random() < 0.1 else base.zones)
        node = _node("n0", rng.choice(["g1", "g2", "g4", "c4"]), base)
        pods = [
            replace(
                _pod(f"p{i}", "n0", **rng.choice([{}, {}, {"gpus": 1}, {"milli": 250}]), cpu=rng.choice([100, 3000])),
                phase=rng.choice(["Running", "Running", "Pending", "", "Succeeded", "Failed"]),
                is_daemonset=rng.random() < 0.2,
            )
            for i in range(rng.randint(0, 3))
        ]
        util = {"n0": rng.random()} if rng.random() < 0.5 else {}
        live = workload_pods(p for p in pods if is_live(p))
        full = classify(node, pool, live, util)
        assert classify_node(node, pool, pods, util) == (full[0] if full is not None else None)
        seen.add(full[0] if full is not None else None)
    assert seen == {None, *DisruptionReason}  # every reason (and none) was met
