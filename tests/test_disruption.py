"""Scale-down and consolidation decisions: delete vs replace vs keep, minNodes, budgets (cron windows, reasons),
do-not-disrupt, PDBs, measured GPU utilisation, CPU-only pods on GPU nodes, spot-fallback drift."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuscale.core import labels as L
from gpuscale.core.disruption import (
    SPOT_FALLBACK_LABEL,
    ActionKind,
    DisruptionPlan,
    DisruptionReason,
    KeepReason,
    PodDisruptionBudget,
    allowed_disruptions,
    budget_active,
    budget_limit,
    parse_cron,
    plan_disruption,
    pool_offerings,
)
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    ConsolidationPolicy,
    Disruption,
    DisruptionBudget,
    InstanceType,
    Node,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
    PoolLimits,
)
from gpuscale.core.resources import Request, Resources
from gpuscale.core.templates import template_allocatable, template_labels
from gpuscale.errors import InputError

OD, SPOT = CapacityType.ON_DEMAND, CapacityType.SPOT


def it(name: str, vcpus: int, mem_gib: int, gpus: int, price: float, spot: float | None = None) -> InstanceType:
    offers = [Offering("z1", OD, price)]
    if spot is not None:
        offers.append(Offering("z1", SPOT, spot))
    return InstanceType(name, "test", vcpus, mem_gib * 1024, gpus, "A10" if gpus else None, offerings=tuple(offers))


CATALOG = Catalog(
    "t",
    (
        it("c4", 4, 16, 0, 0.2),
        it("g1", 8, 32, 1, 1.0, spot=0.4),
        it("g4", 32, 128, 4, 3.6, spot=1.5),
    ),
)
TYPES = CATALOG.by_name()
NOW = 1_000_000.0


def pool(name: str = "gpu", **kw: Any) -> NodePool:
    disruption = kw.pop("disruption", Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),)))
    return NodePool(name, disruption=disruption, **kw)


def node(name: str, itype: str, p: NodePool, ct: CapacityType = OD, **labels: str) -> Node:
    t = TYPES[itype]
    off = next(o for o in t.offerings if o.capacity_type is ct)
    lab = template_labels(p, t, off)
    lab.update(labels)
    return Node(name, template_allocatable(p, t), lab, p.taints, pool=p.name, hourly_cost=off.hourly_price)


def pod(name: str, on: str | None, gpus: int = 0, cpu: int = 500, milli: int = 0, **kw: Any) -> Pod:
    return Pod(
        name,
        request=Request(cpu_milli=cpu, memory_mib=512, gpus=gpus, gpu_milli=milli),
        node_name=on,
        phase="Running" if on else "Pending",
        **kw,
    )


def decide(
    nodes: Sequence[Node], pods: Sequence[Pod], pools: Sequence[NodePool], since_all: float | None = 0.0, **kw: Any
) -> DisruptionPlan:
    since = {n.name: since_all for n in nodes} if since_all is not None else {}
    return plan_disruption(nodes, pods, pools, CATALOG, NOW, since=since, **kw)


def actions(plan: DisruptionPlan) -> dict[str, tuple[ActionKind, DisruptionReason]]:
    return {a.node: (a.kind, a.reason) for a in plan.actions}


def kept(plan: DisruptionPlan) -> dict[str, KeepReason]:
    return {k.node: k.reason for k in plan.kept}


# ------------------------------------------------------------------------------------------ delete / replace / keep
def test_empty_node_deleted_after_consolidate_after() -> None:
    p = pool()
    nodes = [node("a", "g1", p), node("b", "g1", p)]
    pods = [pod("x", "b", gpus=1)]
    early = plan_disruption(nodes, pods, [p], CATALOG, NOW, since={})
    assert early.actions == ()
    assert kept(early) == {"a": KeepReason.WAITING}
    assert early.since == {"a": NOW}
    later = plan_disruption(nodes, pods, [p], CATALOG, NOW + 30, since=early.since)
    assert actions(later) == {"a": (ActionKind.DELETE, DisruptionReason.EMPTY)}
    assert later.actions[0].savings_per_hour == pytest.approx(1.0)
    assert "no workload pods" in later.actions[0].message


def test_candidate_timer_resets_when_node_gets_busy() -> None:
    p = pool()
    nodes = [node("a", "g1", p)]
    plan = plan_disruption(nodes, [pod("x", "a", gpus=1)], [p], CATALOG, NOW, since={"a": 0.0})
    assert "a" not in plan.since


def test_underutilized_node_deleted_when_pods_fit_elsewhere() -> None:
    p = pool()
    nodes = [node("big1", "g4", p), node("big2", "g4", p)]
    pods = [pod("a1", "big1", gpus=1), pod("a2", "big1", gpus=1), pod("b1", "big2", gpus=1)]
    plan = decide(nodes, pods, [p])
    assert actions(plan) == {"big2": (ActionKind.DELETE, DisruptionReason.UNDERUTILIZED)}
    assert plan.actions[0].pods == ("default/b1",)
    # big1 (50 %) would be next, but b1 now occupies it; nothing left to move big1's pods to
    assert "big1" not in actions(plan)


def test_underutilized_node_replaced_by_cheaper_node() -> None:
    p = pool()
    plan = decide([node("big", "g4", p)], [pod("a", "big", gpus=1)], [p])
    (a,) = plan.actions
    assert (a.kind, a.reason) == (ActionKind.REPLACE, DisruptionReason.UNDERUTILIZED)
    assert a.replacement is not None
    # the pool allows any capacity type: the cheapest fitting offering is g1 spot
    assert (a.replacement.instance_type, a.replacement.capacity_type) == ("g1", SPOT)
    assert a.savings_per_hour == pytest.approx(3.2)
    od_only = pool(capacity_types=(OD,))
    (b,) = decide([node("big", "g4", od_only)], [pod("a", "big", gpus=1)], [od_only]).actions
    assert b.replacement is not None and (b.replacement.instance_type, b.replacement.capacity_type) == ("g1", OD)
    assert b.savings_per_hour == pytest.approx(2.6)
    assert "replace by g1" in a.message


def test_spot_node_is_not_replaced_by_spot_and_pool_capacity_types_respected() -> None:
    p = pool(capacity_types=(SPOT, OD))
    plan = decide([node("big", "g4", p, SPOT)], [pod("a", "big", gpus=1)], [p])
    # g1 spot (0.4) is cheaper but spot->spot is not done; g1 on-demand (1.0) is cheaper than g4 spot (1.5)
    (a,) = plan.actions
    assert a.replacement is not None and (a.replacement.instance_type, a.replacement.capacity_type) == ("g1", OD)


def test_keep_when_nothing_cheaper_fits() -> None:
    p = pool(capacity_types=(OD,))
    plan = decide([node("big", "g4", p)], [pod("a", "big", gpus=1, cpu=16000)], [p])
    assert plan.actions == ()
    assert kept(plan) == {"big": KeepReason.NO_REPLACEMENT}


def test_empty_nodes_may_wait_longer_than_underutilised_ones() -> None:
    d = Disruption(consolidate_after_s=30.0, consolidate_empty_after_s=600.0, budgets=(DisruptionBudget("100%"),))
    p = pool(disruption=d, capacity_types=(OD,))
    nodes = [node("empty", "g1", p), node("big", "g4", p)]
    pods = [pod("a", "big", gpus=1)]
    early = decide(nodes, pods, [p], since_all=NOW - 60)
    # the underutilised g4 is consolidated after 30 s (its pod moves to the waiting empty node)
    assert actions(early) == {"big": (ActionKind.DELETE, DisruptionReason.UNDERUTILIZED)}
    assert kept(early) == {"empty": KeepReason.WAITING}
    assert "consolidateEmptyAfter in 540s" in early.kept[0].message
    assert early.kept[0].message.startswith("empty (")  # (the reason's value in lower case)
    later = decide(nodes, pods, [p], since_all=NOW - 600)
    assert actions(later)["empty"] == (ActionKind.DELETE, DisruptionReason.EMPTY)


def test_split_replacement_when_no_single_cheaper_node_fits() -> None:
    p = pool(capacity_types=(OD,))
    # 1 GPU + 12 vCPU in all: no g1 (8 vCPU) holds both, but one g1 each ($2) beats the g4 ($3.6)
    pods = [pod("gpu", "big", gpus=1, cpu=6000), pod("cpu", "big", cpu=6000)]
    plan = decide([node("big", "g4", p)], pods, [p])
    (a,) = plan.actions
    assert (a.kind, a.reason) == (ActionKind.REPLACE, DisruptionReason.UNDERUTILIZED)
    assert [(r.instance_type, r.capacity_type) for r in a.replacements] == [("g1", OD), ("g1", OD)]
    assert sorted(pk for r in a.replacements for pk in r.pods) == ["default/cpu", "default/gpu"]
    assert all(len(r.pods) == 1 for r in a.replacements)
    assert a.savings_per_hour == pytest.approx(1.6)
    assert a.replacement == a.replacements[0]
    assert "replace by 2 nodes (g1, g1) ($2/h instead of $3.6/h)" in a.message


def test_split_replacement_respects_max_nodes_and_spot_rules() -> None:
    pods = [pod("gpu", "big", gpus=1, cpu=6000), pod("cpu", "big", cpu=6000)]
    tight = pool(capacity_types=(OD,), max_nodes=2)  # the old node counts until it is gone: room for one more
    assert kept(decide([node("big", "g4", tight)], pods, [tight])) == {"big": KeepReason.NO_REPLACEMENT}
    mixed = pool(capacity_types=(SPOT, OD))
    # a spot g4 ($1.5): two spot g1 ($0.8) would be cheaper, but spot is not replaced by spot; two on-demand g1
    # ($2) are dearer, so the node stays
    assert kept(decide([node("big", "g4", mixed, SPOT)], pods, [mixed])) == {"big": KeepReason.NO_REPLACEMENT}
    # an on-demand g4 in the same pool is replaced by two spot g1
    (a,) = decide([node("big", "g4", mixed)], pods, [mixed]).actions
    assert [(r.instance_type, r.capacity_type) for r in a.replacements] == [("g1", SPOT), ("g1", SPOT)]


@pytest.mark.parametrize(("cpu_limit", "split"), [(48_000, True), (47_000, False)])
def test_split_replacement_counts_pool_limits_in_raw_capacity(cpu_limit: int, split: bool) -> None:
    # 1 vCPU of daemonset overhead: the g4 has 32 vCPU of capacity (31 allocatable), each g1 8 (7); the planner and
    # the controller count limits in capacity, so two g1 need 32 + 16 = 48 vCPU of limit
    p = pool(
        capacity_types=(OD,),
        limits=PoolLimits(cpu_milli=cpu_limit),
        daemonset_overhead=Resources(cpu_milli=1000, pods=0),
    )
    pods = [pod("gpu", "big", gpus=1, cpu=6000), pod("cpu", "big", cpu=6000)]
    plan = decide([node("big", "g4", p)], pods, [p])
    if split:
        assert [r.instance_type for r in plan.actions[0].replacements] == ["g1", "g1"]
    else:
        assert kept(plan) == {"big": KeepReason.NO_REPLACEMENT}


def test_split_is_not_used_when_one_cheaper_node_is_cheapest() -> None:
    p = pool(capacity_types=(OD,))
    (a,) = decide([node("big", "g4", p)], [pod("x", "big", gpus=1), pod("y", "big", cpu=1000)], [p]).actions
    assert [r.instance_type for r in a.replacements] == ["g1"]


def test_well_utilised_node_is_not_a_candidate() -> None:
    p = pool()
    plan = decide([node("a", "g1", p)], [pod("x", "a", gpus=1)], [p])
    assert plan.actions == () and plan.kept == () and plan.since == {}


def test_when_empty_policy_ignores_underutilised_nodes() -> None:
    p = pool(disruption=Disruption(ConsolidationPolicy.WHEN_EMPTY, 0.0, (DisruptionBudget("100%"),)))
    nodes = [node("big1", "g4", p), node("big2", "g4", p), node("empty", "g4", p)]
    pods = [pod("a1", "big1", gpus=1), pod("b1", "big2", gpus=1)]
    plan = decide(nodes, pods, [p])
    assert actions(plan) == {"empty": (ActionKind.DELETE, DisruptionReason.EMPTY)}


def test_daemonset_pods_do_not_keep_a_node() -> None:
    p = pool()
    plan = decide([node("a", "g1", p)], [pod("ds", "a", is_daemonset=True)], [p])
    assert actions(plan) == {"a": (ActionKind.DELETE, DisruptionReason.EMPTY)}
    assert plan.actions[0].pods == ()


def test_unmanaged_launching_cordoned_and_non_candidate_nodes_untouched() -> None:
    p = pool()
    other = NodePool("static")
    nodes = [
        node("static", "g1", other),
        Node("launch", template_allocatable(p, TYPES["g1"]), pool="gpu", launching=True),
        Node("cordoned", template_allocatable(p, TYPES["g1"]), pool="gpu", unschedulable=True),
        node("excluded", "g1", p),
        node("ok", "g1", p),
    ]
    plan = decide(nodes, [], [p], candidates={"ok", "static", "launch", "cordoned"})
    assert actions(plan) == {"ok": (ActionKind.DELETE, DisruptionReason.EMPTY)}


def test_protected_nodes_are_kept() -> None:
    p = pool()
    plan = decide([node("a", "g1", p)], [], [p], protected={"a"})
    assert plan.actions == () and kept(plan) == {"a": KeepReason.PODS_DO_NOT_FIT}


def test_pods_respect_selectors_and_taints_when_moving() -> None:
    p = pool()
    nodes = [node("a", "g4", p), node("b", "g4", p, team="x")]
    pods = [pod("pinned", "a", gpus=1, node_selector={"team": "y"}), pod("other", "b", gpus=3)]
    plan = decide(nodes, pods, [p])
    # "pinned" cannot go to b (label), so a is replaced by a cheaper node that... also lacks team=y: keep
    assert plan.actions == ()
    assert kept(plan)["a"] is KeepReason.NO_REPLACEMENT


def test_fractional_gpu_pods_are_packed_per_gpu() -> None:
    p = pool()
    nodes = [node("a", "g1", p), node("b", "g1", p)]
    pods = [pod("x", "a", milli=600), pod("y", "b", milli=300)]
    plan = decide(nodes, pods, [p])
    assert actions(plan) == {"b": (ActionKind.DELETE, DisruptionReason.UNDERUTILIZED)}
    # 600 + 600 would not fit one GPU
    plan2 = decide(nodes, [pod("x", "a", milli=600), pod("y", "b", milli=600)], [p])
    assert plan2.actions == () or all(a.kind is ActionKind.REPLACE for a in plan2.actions)
    assert all(a.kind is not ActionKind.DELETE for a in plan2.actions)


# ---------------------------------------------------------------------------------------------------------- minNodes
def test_never_below_min_nodes() -> None:
    p = pool(min_nodes=2)
    two = [node("a", "g1", p), node("b", "g1", p)]
    plan = decide(two, [], [p])
    assert plan.actions == ()
    assert set(kept(plan).values()) == {KeepReason.MIN_NODES}
    three = [*two, node("c", "g1", p)]
    plan = decide(three, [], [p])
    assert len(plan.actions) == 1
    assert kept(plan) == {n: KeepReason.MIN_NODES for n in {"a", "b", "c"} - set(actions(plan))}


def test_min_nodes_counts_nodes_already_disrupting() -> None:
    p = pool(min_nodes=1)
    plan = decide([node("a", "g1", p), node("b", "g1", p)], [], [p], disrupting={"a"})
    assert plan.actions == () and kept(plan) == {"b": KeepReason.MIN_NODES}


def test_replacement_keeps_node_count() -> None:
    p = pool(min_nodes=1)
    plan = decide([node("big", "g4", p)], [pod("a", "big", gpus=1)], [p])
    assert [a.kind for a in plan.actions] == [ActionKind.REPLACE]


# ----------------------------------------------------------------------------------------------------------- budgets
@pytest.mark.parametrize(("nodes_", "total", "limit"), [("1", 10, 1), ("0", 5, 0), ("10%", 3, 1), ("50%", 5, 3)])
def test_budget_limit(nodes_: str, total: int, limit: int) -> None:
    assert budget_limit(DisruptionBudget(nodes_), total) == limit


@pytest.mark.parametrize("bad", ["-1", "abc", "150%", "x%", ""])
def test_bad_budget_is_input_error(bad: str) -> None:
    with pytest.raises(InputError, match="budget") as info:
        budget_limit(DisruptionBudget(bad), 3, "pool gpu: disruption.budgets[0].nodes")
    assert "pool gpu" in str(info.value) and "10%" in str(info.value)


def test_count_budget_limits_deletions() -> None:
    p = pool(disruption=Disruption(consolidate_after_s=0, budgets=(DisruptionBudget("1"),)))
    plan = decide([node(n, "g1", p) for n in "abc"], [], [p])
    assert len(plan.actions) == 1
    assert sorted(kept(plan).values()) == [KeepReason.BUDGET, KeepReason.BUDGET]
    assert "budget nodes=1" in plan.kept[0].message


def test_percentage_budget_and_already_disrupting() -> None:
    p = pool(disruption=Disruption(consolidate_after_s=0, budgets=(DisruptionBudget("50%"),)))
    nodes = [node(n, "g1", p) for n in "abcd"]
    assert len(decide(nodes, [], [p]).actions) == 2
    assert len(decide(nodes, [], [p], disrupting={"a"}).actions) == 1


def test_most_restrictive_active_budget_wins_and_reasons_filter() -> None:
    budgets = (DisruptionBudget("100%"), DisruptionBudget("0", reasons=("Underutilized",)))
    p = pool(disruption=Disruption(consolidate_after_s=0, budgets=budgets))
    nodes = [node("empty", "g1", p), node("big1", "g4", p), node("big2", "g4", p)]
    pods = [pod("a", "big1", gpus=1), pod("b", "big2", gpus=1)]
    plan = decide(nodes, pods, [p])
    assert actions(plan) == {"empty": (ActionKind.DELETE, DisruptionReason.EMPTY)}
    assert kept(plan) == {"big1": KeepReason.BUDGET, "big2": KeepReason.BUDGET}
    v = allowed_disruptions(p, DisruptionReason.UNDERUTILIZED, 3, 0, NOW)
    assert v.allowed == 0 and v.budget == budgets[1]
    assert allowed_disruptions(p, DisruptionReason.EMPTY, 3, 1, NOW).allowed == 2


def test_no_applicable_budget_means_unlimited() -> None:
    p = pool(disruption=Disruption(budgets=(DisruptionBudget("0", reasons=("Drifted",)),)))
    assert allowed_disruptions(p, DisruptionReason.EMPTY, 5, 0, NOW).allowed is None


def ts(y: int, mo: int, d: int, h: int, mi: int = 0) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp()


def test_cron_window_budget_blocks_business_hours_only() -> None:
    # no disruption at all from 09:00 for 8 h on weekdays
    freeze = DisruptionBudget("0", schedule="0 9 * * mon-fri", duration_s=8 * 3600)
    p = pool(disruption=Disruption(consolidate_after_s=0, budgets=(DisruptionBudget("100%"), freeze)))
    nodes = [node("a", "g1", p)]
    monday_10 = ts(2026, 11, 23, 10)  # 2026-11-23 is a Monday
    for t, blocked in [
        (monday_10, True),
        (ts(2026, 11, 23, 8, 59), False),
        (ts(2026, 11, 23, 16, 59), True),
        (ts(2026, 11, 23, 17, 0), False),
        (ts(2026, 11, 28, 10), False),  # Saturday
    ]:
        plan = plan_disruption(nodes, [], [p], CATALOG, t, since={"a": 0.0})
        assert (plan.actions == ()) is blocked, datetime.fromtimestamp(t, UTC)
        if blocked:
            assert kept(plan) == {"a": KeepReason.BUDGET} and "schedule" in plan.kept[0].message


def test_cron_window_spanning_midnight() -> None:
    b = DisruptionBudget("0", schedule="0 22 * * *", duration_s=4 * 3600)
    assert budget_active(b, ts(2026, 1, 1, 23))
    assert budget_active(b, ts(2026, 1, 2, 1, 59))
    assert not budget_active(b, ts(2026, 1, 2, 2, 0))
    assert not budget_active(b, ts(2026, 1, 2, 21, 59))


def test_scheduled_budget_needs_duration() -> None:
    with pytest.raises(InputError, match="duration"):
        budget_active(DisruptionBudget("0", schedule="@daily"), 0.0)


# -------------------------------------------------------------------------------------------------------------- cron
def test_cron_fields_names_steps_macros() -> None:
    c = parse_cron("*/15 9-17/4 * JAN,jul 1-5")
    assert c.minutes == (0, 15, 30, 45) and c.hours == (9, 13, 17)
    assert c.months == frozenset({1, 7}) and c.weekdays == frozenset({1, 2, 3, 4, 5})
    assert parse_cron("@hourly").minutes == (0,) and len(parse_cron("@hourly").hours) == 24
    assert parse_cron("0 0 * * 7").weekdays == frozenset({0})  # 7 is Sunday
    assert parse_cron("5 0 * * *").matches(ts(2026, 3, 4, 0, 5))
    assert not parse_cron("5 0 * * *").matches(ts(2026, 3, 4, 0, 6))


def test_cron_day_of_month_or_day_of_week() -> None:
    c = parse_cron("0 0 13 * fri")  # the 13th, or any Friday
    assert c.matches(ts(2026, 2, 13, 0))  # Friday the 13th
    assert c.matches(ts(2026, 3, 13, 0))  # a Friday too? 2026-03-13 is a Friday
    assert c.matches(ts(2026, 4, 13, 0))  # Monday the 13th
    assert c.matches(ts(2026, 4, 17, 0))  # a Friday
    assert not c.matches(ts(2026, 4, 14, 0))


def test_cron_last_fire() -> None:
    c = parse_cron("30 2 1 * *")
    assert c.last_fire(ts(2026, 5, 20, 0), 40 * 86400) == ts(2026, 5, 1, 2, 30)
    assert c.last_fire(ts(2026, 5, 20, 0), 10 * 86400) is None
    assert c.last_fire(ts(2026, 5, 1, 2, 30), 60) == ts(2026, 5, 1, 2, 30)


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ("* * * *", "5 fields"),
        ("60 * * * *", "minute"),
        ("* 24 * * *", "hour"),
        ("* * 0 * *", "day-of-month"),
        ("* * * 13 *", "month"),
        ("* * * * 8", "day-of-week"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "reversed"),
        ("a * * * *", "minute"),
        ("1,,2 * * * *", "comma"),
    ],
)
def test_bad_cron_is_input_error(expr: str, field: str) -> None:
    with pytest.raises(InputError, match=field) as info:
        parse_cron(expr, "pool gpu: disruption.budgets[1].schedule")
    assert "budgets[1]" in str(info.value) and expr in str(info.value)


# ---------------------------------------------------------------------------------------------- do-not-disrupt, PDB
def test_do_not_disrupt_blocks() -> None:
    p = pool()
    nodes = [node("a", "g4", p), node("b", "g4", p)]
    pods = [pod("x", "a", gpus=1, annotations={L.DO_NOT_DISRUPT_ANNOTATION: "true"}), pod("y", "b", gpus=1)]
    plan = decide(nodes, pods, [p])
    assert "a" not in actions(plan)
    assert kept(plan)["a"] is KeepReason.DO_NOT_DISRUPT and "default/x" in plan.kept[0].message
    assert actions(plan)["b"][0] is ActionKind.DELETE


def test_pdb_blocks_and_allows() -> None:
    p = pool()
    web = {"app": "web"}
    nodes = [node("a", "g4", p), node("b", "g4", p), node("c", "g4", p)]
    pods = [pod("w1", "a", gpus=1, labels=web), pod("w2", "b", gpus=1, labels=web)]
    strict = PodDisruptionBudget("web", "default", web, max_unavailable=0)
    plan = decide(nodes, pods, [p], pdbs=[strict])
    # c is empty: deleted; a and b's pods could move to c, but the PDB allows no eviction
    assert actions(plan) == {"c": (ActionKind.DELETE, DisruptionReason.EMPTY)}
    assert kept(plan) == {"a": KeepReason.PDB, "b": KeepReason.PDB}
    assert "allows 0 eviction" in plan.kept[0].message
    # one eviction allowed: a single web node goes, the next is blocked
    loose = PodDisruptionBudget("web", "default", web, max_unavailable=1)
    nodes2 = [node(n, "g4", p) for n in "abc"]
    pods2 = [pod(f"w{n}", n, gpus=1, labels=web) for n in "abc"]
    plan = decide(nodes2, pods2, [p], pdbs=[loose])
    assert [a.pods for a in plan.actions] == [("default/wa",)]
    assert KeepReason.PDB in kept(plan).values()


def test_pdb_counts_pods_already_down() -> None:
    p = pool()
    pdb = PodDisruptionBudget("web", "default", {"app": "web"}, max_unavailable=1)
    nodes = [node("a", "g4", p), node("b", "g4", p)]
    pods = [pod("w1", "a", gpus=1, labels={"app": "web"}), pod("w0", None, gpus=1, labels={"app": "web"})]
    plan = decide(nodes, pods, [p], pdbs=[pdb])
    assert "a" not in actions(plan) and kept(plan)["a"] is KeepReason.PDB


def test_pdb_in_other_namespace_does_not_apply() -> None:
    p = pool()
    pdb = PodDisruptionBudget("web", "prod", {"app": "web"}, max_unavailable=0)
    nodes = [node("a", "g4", p), node("b", "g4", p)]
    plan = decide(nodes, [pod("w1", "a", gpus=1, labels={"app": "web"})], [p], pdbs=[pdb])
    assert "a" in actions(plan) or "b" in actions(plan)
    assert KeepReason.PDB not in kept(plan).values()


# ------------------------------------------------------------------------------------------ measured GPU utilisation
def test_measured_gpu_utilisation_keeps_busy_nodes() -> None:
    d = Disruption(consolidate_after_s=0, budgets=(DisruptionBudget("100%"),), use_measured_gpu_utilization=True)
    p = pool(disruption=d)
    nodes = [node("a", "g4", p), node("b", "g4", p)]
    pods = [pod("x", "a", gpus=1), pod("y", "b", gpus=3)]
    busy = decide(nodes, pods, [p], utilization={"a": 0.95})
    assert busy.actions == () and busy.kept == ()
    idle = decide(nodes, pods, [p], utilization={"a": 0.1})
    assert actions(idle) == {"a": (ActionKind.DELETE, DisruptionReason.UNDERUTILIZED)}
    assert "measured GPU utilisation 10%" in idle.actions[0].message
    unknown = decide(nodes, pods, [p], utilization={})
    assert actions(unknown) == {"a": (ActionKind.DELETE, DisruptionReason.UNDERUTILIZED)}
    off = decide(nodes, pods, [pool()], utilization={"a": 0.95})
    assert "a" in actions(off)


# ------------------------------------------------------------------------------------------------ CPU-only pods
def test_cpu_only_pods_do_not_keep_gpu_node_alive() -> None:
    gp = pool("gpu", disruption=Disruption(ConsolidationPolicy.WHEN_EMPTY, 0.0, (DisruptionBudget("100%"),)))
    cp = pool("cpu", instance_types=("c4",))
    nodes = [node("g", "g4", gp), node("c", "c4", cp)]
    pods = [pod("web", "g", cpu=1000)]
    plan = decide(nodes, pods, [gp, cp])
    # the empty CPU node received the pod, so it is not deleted in the same round
    assert actions(plan) == {"g": (ActionKind.DELETE, DisruptionReason.EMPTY)}
    assert "CPU-only" in plan.actions[0].message


def test_cpu_only_gpu_node_replaced_by_cheap_cpu_node() -> None:
    gp = pool("gpu", instance_types=("g1", "g4"))
    cp = pool("cpu", instance_types=("c4",))
    plan = decide([node("g", "g4", gp)], [pod("web", "g", cpu=3000)], [gp, cp])
    (a,) = plan.actions
    assert a.kind is ActionKind.REPLACE and a.replacement is not None
    assert (a.replacement.pool, a.replacement.instance_type) == ("cpu", "c4")


def test_cpu_pods_that_fit_nowhere_cheaper_keep_the_gpu_node() -> None:
    gp = pool("gpu", capacity_types=(OD,))
    plan = decide([node("g", "g1", gp)], [pod("web", "g", cpu=7000)], [gp])
    # c4 has 4 vCPUs: too small; g1 is the node itself
    assert plan.actions == () and kept(plan) == {"g": KeepReason.NO_REPLACEMENT}


# --------------------------------------------------------------------------------------------- drift / spot return
def test_spot_fallback_node_drifts_back_to_spot() -> None:
    p = pool(capacity_types=(SPOT,))
    fallback = node("od", "g1", p, OD, **{SPOT_FALLBACK_LABEL: "true"})
    pods = [pod("x", "od", gpus=1)]
    plan = plan_disruption([fallback], pods, [p], CATALOG, NOW, since={})  # no consolidateAfter wait for drift
    (a,) = plan.actions
    assert (a.kind, a.reason) == (ActionKind.REPLACE, DisruptionReason.DRIFTED)
    assert a.replacement is not None and a.replacement.capacity_type is SPOT
    # while spot is unavailable, keep it
    unavailable = {OfferingKey("g1", "z1", SPOT): NOW + 60, OfferingKey("g4", "z1", SPOT): NOW + 60}
    plan = plan_disruption([fallback], pods, [p], CATALOG, NOW, since={}, unavailable=unavailable)
    assert plan.actions == () and kept(plan) == {"od": KeepReason.PODS_DO_NOT_FIT}
    assert "no conforming offering" in plan.kept[0].message


def test_fallback_label_in_mixed_pool_replaced_only_by_spot() -> None:
    p = pool(capacity_types=(SPOT, OD))
    fallback = node("od", "g1", p, OD, **{SPOT_FALLBACK_LABEL: "true"})
    plan = plan_disruption([fallback], [pod("x", "od", gpus=1)], [p], CATALOG, NOW, since={})
    assert plan.actions[0].replacement is not None and plan.actions[0].replacement.capacity_type is SPOT
    # an ordinary on-demand node in a mixed pool is not drifted
    normal = node("od2", "g1", p, OD)
    assert plan_disruption([normal], [pod("x", "od2", gpus=1)], [p], CATALOG, NOW, since={}).actions == ()


def test_pool_offerings_filters() -> None:
    p = NodePool("p", instance_types=("g1", "g4"), capacity_types=(SPOT,))
    offers = pool_offerings(p, CATALOG, NOW)
    assert [(o.instance_type.name, o.offering.capacity_type) for o in offers] == [("g1", SPOT), ("g4", SPOT)]
    offers = pool_offerings(p, CATALOG, NOW, {OfferingKey("g1", "z1", SPOT): NOW + 1})
    assert [o.instance_type.name for o in offers] == ["g4"]
    offers = pool_offerings(p, CATALOG, NOW, {OfferingKey("g1", "z1", SPOT): NOW})  # expired
    assert [o.instance_type.name for o in offers] == ["g1", "g4"]
