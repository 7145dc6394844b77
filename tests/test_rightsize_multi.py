"""``rightsize: {maxSet: N}`` (gpuscale.core.disruption.rightsize_multi): a set of young nodes of one pool and
capacity type is replaced by the cheapest new nodes holding all their pods when that pays; the greedy, bounded
search; blockers; the setting's validation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from builders import catalog, itype, node, pod
from gpuscale.controller.config import ControllerConfig
from gpuscale.core import labels as L
from gpuscale.core.disruption import ActionKind, PodDisruptionBudget
from gpuscale.core.disruption.rightsize import RightsizeRule, rightsize
from gpuscale.core.disruption.rightsize_multi import SetReplacement, cheapest_mix, fill, replace_set
from gpuscale.core.model import (
    CapacityType,
    ConsolidationPolicy,
    Disruption,
    DisruptionBudget,
    Node,
    NodePool,
    OfferingKey,
    Pod,
    PoolLimits,
)
from gpuscale.core.templates import template_labels
from gpuscale.errors import InputError

CAT = catalog(
    itype("big", 28, 112, 1, "P100", price=3.0, spot=0.26),
    itype("tiny", 4, 30, 1, "P100", price=1.5, spot=0.14),
    itype("duo", 8, 60, 2, "P100", price=2.0, spot=0.20),
)
POOL = NodePool(
    name="gpu",
    disruption=Disruption(
        consolidation_policy=ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED, budgets=(DisruptionBudget("100%"),)
    ),
)
"""A pool whose budget lets every node go at once (the default, 10 %, lets one of a few nodes go)."""
NOW = 10_000.0
RULE = RightsizeRule(max_set=4)


def _node(name: str, itype_name: str = "tiny", ct: str = "spot") -> Node:
    it = CAT.by_name()[itype_name]
    off = next(o for o in it.offerings if str(o.capacity_type) == ct)
    n = node(name, it.vcpus * 1000, it.memory_mib, it.gpu_count, "P100", labels=template_labels(POOL, it, off))
    return replace(n, pool="gpu")


def _run(
    nodes: list[Node], pods: list[Pod], started: dict[str, float] | None = None, **kw: object
) -> SetReplacement | None:
    args: dict[str, object] = {
        "eligible": {n.name for n in nodes},
        "pools": {"gpu": POOL},
        "catalog": CAT,
        "now": NOW,
        "unavailable": {},
        "rule": RULE,
        "started": started if started is not None else {p.key: NOW - 600 for p in pods},
        "disrupting": set(),
    }
    args.update(kw)
    return replace_set(nodes, pods, **args)  # type: ignore[arg-type]


def _two_tiny() -> tuple[list[Node], list[Pod]]:
    """Two one-GPU spot nodes, each the cheapest node for its one-GPU pod: one two-GPU node holds both."""
    return [_node("a"), _node("b")], [pod("p", cpu=2000, gpus=1, node="a"), pod("q", cpu=2000, gpus=1, node="b")]


def test_two_nodes_each_right_sized_already_go_to_one_node_holding_both() -> None:
    nodes, pods = _two_tiny()
    started = {p.key: NOW - 600 for p in pods}
    # one node at a time finds nothing: tiny is the cheapest node for each pod
    assert rightsize(nodes, pods, {"a", "b"}, {"gpu": POOL}, CAT, NOW, {}, RULE, started, set()) is None
    got = _run(nodes, pods)
    assert got is not None
    assert sorted(got.nodes) == ["a", "b"] and got.pool == "gpu"
    (r,) = got.replacements
    assert r.instance_type == "duo" and r.capacity_type is CapacityType.SPOT
    assert sorted(r.pods) == ["default/p", "default/q"]
    assert got.saving_per_hour == pytest.approx(0.28 - 0.20)
    # saving 0.08 over 1 h against lost work 2 x 0.14 x 10 min and the boot 0.20 x 200 s
    assert got.value == pytest.approx(0.08 - 2 * 0.14 / 6 - 0.2 * 200 / 3600)
    assert [a.node for a in got.actions] == list(got.nodes)
    assert all(a.kind is ActionKind.REPLACE and a.replacements == got.replacements for a in got.actions)
    assert [a.pods for a in got.actions] == [("default/p",), ("default/q",)] or [a.pods for a in got.actions] == [
        ("default/q",),
        ("default/p",),
    ]
    assert sum(a.savings_per_hour for a in got.actions) == pytest.approx(got.saving_per_hour)
    assert "rightsize set: 2 nodes" in got.actions[0].message


def test_cpu_heavy_pods_on_gpu_nodes_merge_while_the_set_gains() -> None:
    # a 10-vCPU pod fits only the big node. Two share one big node (saves 0.26 $/h); a third needs a second big node
    # (3 -> 2 also saves 0.26 $/h but boots two nodes): the set stops at two
    nodes = [_node(n, "big") for n in ("a", "b", "c")]
    pods = [pod(f"p{n}", cpu=10000, node=n) for n in ("a", "b", "c")]
    got = _run(nodes, pods)
    assert got is not None and len(got.nodes) == 2
    assert [r.instance_type for r in got.replacements] == ["big"] and got.new_price == pytest.approx(0.26)
    # 20-vCPU pods: no two share a node, no set saves anything
    assert _run(nodes, [pod(f"p{n}", cpu=20000, node=n) for n in ("a", "b", "c")]) is None


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("ok", 2),
        ("max set 1", None),  # the option is off
        ("too young", None),
        ("too old", None),
        ("age unknown", None),
        ("one not eligible", None),
        ("one disrupting", None),
        ("do not disrupt", None),
        ("pdb", None),
        ("budget of one", None),  # the budget must allow the whole set
        ("budget for another reason", 2),
        ("limits", None),
        ("max nodes full", None),
        ("max nodes room for one", 2),  # one new node beside the two old ones
        ("other capacity type", None),  # sets are of one capacity type
        ("saving under minSaving", None),
        ("long horizon pays old pods", 2),
        ("old pods do not pay", None),
        ("duo unavailable", None),
    ],
)
def test_set_blockers(case: str, expect: int | None) -> None:
    nodes, pods = _two_tiny()
    started = {p.key: NOW - 600 for p in pods}
    kw: dict[str, object] = {}
    pool = POOL
    rule = RULE
    if case == "max set 1":
        rule = RightsizeRule()
    elif case == "too young":
        started["default/q"] = NOW - 60
    elif case == "too old":
        started["default/q"] = NOW - 7200
    elif case == "age unknown":
        del started["default/q"]
    elif case == "one not eligible":
        kw["eligible"] = {"a"}
    elif case == "one disrupting":
        kw["disrupting"] = {"b"}
    elif case == "do not disrupt":
        pods[1] = replace(pods[1], annotations={L.DO_NOT_DISRUPT_ANNOTATION: "true"})
    elif case == "pdb":
        pods[1] = replace(pods[1], labels={"app": "x"})
        kw["pdbs"] = [PodDisruptionBudget("b", "default", {"app": "x"}, 1)]
    elif case in ("budget of one", "budget for another reason"):
        reasons = ("Underutilized",) if case == "budget of one" else ("Empty",)
        pool = replace(POOL, disruption=replace(POOL.disruption, budgets=(DisruptionBudget("1", reasons=reasons),)))
    elif case == "limits":
        pool = replace(POOL, limits=PoolLimits(gpus=10))
    elif case == "max nodes full":
        pool = replace(POOL, max_nodes=2)
    elif case == "max nodes room for one":
        pool = replace(POOL, max_nodes=3)
    elif case == "other capacity type":
        nodes[1] = _node("b", ct="on-demand")
    elif case == "saving under minSaving":
        rule = replace(RULE, min_saving=0.3)  # 0.20 against 0.28 saves 29 %
    elif case in ("long horizon pays old pods", "old pods do not pay"):
        # pods 50 min old: lost 2 x 0.14 x 50/60 = 0.23 against 0.08 x horizon
        rule = replace(RULE, max_pod_age_s=7200.0, horizon_s=4 * 3600.0 if case.startswith("long") else 3600.0)
        started = {p.key: NOW - 3000 for p in pods}
    elif case == "duo unavailable":
        kw["unavailable"] = {OfferingKey("duo", "z1", CapacityType.SPOT): NOW + 60}
    got = _run(nodes, pods, started, pools={"gpu": pool}, rule=rule, **kw)
    assert (None if got is None else len(got.nodes)) == expect


def test_the_search_grows_the_set_from_the_emptiest_nodes_greedily() -> None:
    # four one-GPU pods on four tiny nodes: a pair goes to one duo node (value 0.022 $); a third node would need a
    # duo and a tiny (value < 0), so the set stops at two although all four on two duo nodes would be worth 0.045 $
    # (greedy, not exhaustive)
    nodes = [_node(n) for n in ("a", "b", "c", "d")]
    pods = [pod(f"p{n}", cpu=2000, gpus=1, node=n) for n in ("a", "b", "c", "d")]
    got = _run(nodes, pods)
    assert got is not None and got.nodes == ("a", "b")
    assert [r.instance_type for r in got.replacements] == ["duo"]
    # the emptiest nodes seed the sets: a node whose GPU is half used goes first
    half = [*pods[:3], pod("pd", cpu=1000, milli=500, node="d")]
    got = _run(nodes, half)
    assert got is not None and got.nodes[0] == "d"


@pytest.mark.parametrize(
    ("cpu", "mem", "gpus", "milli", "want"),
    [
        (2000, 1024, 0, 0, 0.5),  # CPU binds on the 4-vCPU node
        (1000, 15360, 0, 0, 0.5),  # memory
        (1000, 1024, 1, 0, 1.0),  # the GPU
        (1000, 1024, 0, 250, 0.25),
    ],
)
def test_fill_is_the_largest_share(cpu: int, mem: int, gpus: int, milli: int, want: float) -> None:
    assert fill(_node("a"), [pod("p", cpu=cpu, mem=mem, gpus=gpus, milli=milli, node="a")]) == pytest.approx(want)


def test_cheapest_mix_one_node_or_the_planners_packing() -> None:
    one = [pod("p", cpu=2000, gpus=1), pod("q", cpu=2000, gpus=1)]
    assert [r.instance_type for r in cheapest_mix(one, POOL, CapacityType.SPOT, CAT, NOW, {})] == ["duo"]
    three = [pod(f"p{i}", cpu=12000) for i in range(3)]
    mix = cheapest_mix(three, POOL, CapacityType.ON_DEMAND, CAT, NOW, {})
    assert [(r.instance_type, r.capacity_type) for r in mix] == [("big", CapacityType.ON_DEMAND)] * 2
    assert cheapest_mix([pod("x", cpu=40000)], POOL, CapacityType.SPOT, CAT, NOW, {}) == ()


def test_max_set_setting() -> None:
    assert ControllerConfig.from_policy({"rightsize": True}).rightsize == RightsizeRule(max_set=1)
    got = ControllerConfig.from_policy({"rightsize": {"maxSet": 4}}).rightsize
    assert got == RightsizeRule(max_set=4)
    for bad in (0, 9, True, "4", 2.5):
        with pytest.raises(InputError) as err:
            ControllerConfig.from_policy({"rightsize": {"maxSet": bad}})
        assert "policy.rightsize.maxSet" in str(err.value) and "\n" not in str(err.value)


def _cpu_and_gpu_node(daemon_cpu: int = 0) -> tuple[list[Node], list[Pod]]:
    """A big node running a 10-vCPU CPU-only pod (its GPU free) and a tiny node running a one-GPU pod: one big node
    holds both."""
    pods = [pod("c", cpu=10000, node="a"), pod("g", cpu=2000, gpus=1, node="b")]
    if daemon_cpu:
        pods.append(replace(pod("ds", cpu=daemon_cpu, node="a"), is_daemonset=True))
    return [_node("a", "big"), _node("b")], pods


def test_keep_one_moves_the_others_pods_onto_a_node_of_the_set() -> None:
    nodes, pods = _cpu_and_gpu_node()
    started = {p.key: NOW - 600 for p in pods}
    plain = _run(nodes, pods, started)
    assert plain is not None and plain.kept is None and [r.instance_type for r in plain.replacements] == ["big"]
    got = _run(nodes, pods, started, rule=replace(RULE, keep_one=True))
    assert got is not None and got.kept == "a" and got.replacements == ()
    assert sorted(got.nodes) == ["a", "b"] and got.new_price == pytest.approx(0.26)
    (action,) = got.actions  # the kept node is neither deleted nor evicted
    assert action.kind is ActionKind.DELETE and action.node == "b" and action.pods == ("default/g",)
    assert action.savings_per_hour == pytest.approx(0.14) and "onto a, which stays" in action.message
    # the tiny node's price over the hour, less its pod's work (its whole GPU x 0.14 $/h x 10 min); no boot
    assert got.value == pytest.approx(0.14 - 0.14 / 6)
    assert got.value > plain.value


def test_keep_one_needs_the_kept_node_to_hold_every_pod() -> None:
    # a daemonset pod takes 17 of the big node's 28 vCPUs: the two pods no longer fit beside it, so the set is
    # replaced by a new big node as without keepOne (a new node runs no daemonset pod in this model)
    nodes, pods = _cpu_and_gpu_node(daemon_cpu=17000)
    started = {p.key: NOW - 600 for p in pods}
    got = _run(nodes, pods, started, rule=replace(RULE, keep_one=True))
    assert got is not None and got.kept is None and [r.instance_type for r in got.replacements] == ["big"]
    # a set whose cheapest node is of no member's type is replaced as before
    two, pods2 = _two_tiny()
    same = _run(two, pods2, rule=replace(RULE, keep_one=True))
    assert same is not None and same.kept is None and [r.instance_type for r in same.replacements] == ["duo"]


def test_keep_one_setting() -> None:
    assert ControllerConfig.from_policy({"rightsize": {"maxSet": 4}}).rightsize == RightsizeRule(max_set=4)
    rule = ControllerConfig.from_policy({"rightsize": {"maxSet": 4, "keepOne": True}}).rightsize
    assert rule == RightsizeRule(max_set=4, keep_one=True)
    with pytest.raises(InputError) as err:
        ControllerConfig.from_policy({"rightsize": {"keepOne": "yes"}})
    assert "policy.rightsize.keepOne" in str(err.value) and "true or false" in str(err.value)
