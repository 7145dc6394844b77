"""``rightsize`` (gpuscale.core.disruption.rightsize): a node whose pods are all young is replaced by the cheapest
node of its pool and capacity type that holds them, when the saving pays for the lost work and the boot; blockers;
the setting's validation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from builders import catalog, itype, node, pod
from gpuscale.controller.config import ControllerConfig
from gpuscale.core import labels as L
from gpuscale.core.disruption import ActionKind, DisruptionAction, DisruptionReason, PodDisruptionBudget
from gpuscale.core.disruption.rightsize import RightsizeRule, cheapest_fit, next_look, pays, pod_ages, rightsize
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
    itype("small", 8, 60, 1, "P100", price=1.8, spot=0.17),
    itype("tiny", 4, 30, 1, "P100", price=1.5, spot=0.14),
)
POOL = NodePool(name="gpu", disruption=Disruption(consolidation_policy=ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED))
NOW = 10_000.0
RULE = RightsizeRule()


def _node(name: str = "n1", itype_name: str = "big", ct: str = "spot") -> Node:
    it = CAT.by_name()[itype_name]
    off = next(o for o in it.offerings if str(o.capacity_type) == ct)
    n = node(name, it.vcpus * 1000, it.memory_mib, 1, "P100", labels=template_labels(POOL, it, off))
    return replace(n, pool="gpu")


def _run(nodes: list[Node], pods: list[Pod], started: dict[str, float], **kw: object) -> DisruptionAction | None:
    args: dict[str, object] = {
        "eligible": {n.name for n in nodes},
        "pools": {"gpu": POOL},
        "catalog": CAT,
        "now": NOW,
        "unavailable": {},
        "rule": RULE,
        "started": started,
        "disrupting": set(),
    }
    args.update(kw)
    return rightsize(nodes, pods, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("itype_name", "ct", "cpu", "want"),
    [
        ("big", "spot", 3000, "tiny"),  # a whole GPU and 3 vCPUs: the 4-vCPU node
        ("big", "spot", 6000, "small"),
        ("big", "spot", 20000, "big"),  # needs the big node's vCPUs: itself (the price test rejects it)
        ("big", "on-demand", 3000, "tiny"),  # the node's capacity type
        ("tiny", "spot", 3000, "tiny"),
        ("big", "spot", 40000, None),  # fits no node of the pool
    ],
)
def test_cheapest_fit_is_the_cheapest_node_of_the_capacity_type_holding_all_pods(
    itype_name: str, ct: str, cpu: int, want: str | None
) -> None:
    n = _node(itype_name=itype_name, ct=ct)
    r = cheapest_fit(n, POOL, [pod("p", cpu=cpu, gpus=1, node="n1")], CAT, NOW, {})
    assert (r.instance_type if r is not None else None) == want
    if r is not None:
        assert str(r.capacity_type) == ct and r.pods == ("default/p",)


@pytest.mark.parametrize(
    ("price", "new", "share", "age_min", "ok"),
    [
        (0.26, 0.14, 1.0, 6, True),  # saves 0.12/h over 1 h; lost 0.026 + boot 0.008
        (0.26, 0.22, 1.0, 6, False),  # saves 15 %, under minSaving 20 %
        (0.26, 0.14, 1.0, 30, False),  # lost 0.13 + boot 0.008 > 0.12
        (0.26, 0.14, 0.5, 30, True),  # half the node: lost 0.065
        (3.0, 1.5, 1.0, 0, True),
    ],
)
def test_pays_weighs_saving_over_the_horizon_against_lost_work_and_boot(
    price: float, new: float, share: float, age_min: float, ok: bool
) -> None:
    assert pays(price, new, share, [age_min * 60.0], RULE) is ok


def test_pod_ages_unknown_start_is_none() -> None:
    ps = [pod("a", node="n1"), pod("b", node="n1")]
    assert pod_ages(ps, {"default/a": 100.0, "default/b": 400.0}, 1000.0) == [900.0, 600.0]
    assert pod_ages(ps, {"default/a": 100.0}, 1000.0) is None


def test_rightsize_replaces_the_node_that_saves_most() -> None:
    a, b = _node("a"), _node("b", itype_name="small")
    pods = [pod("p", cpu=3000, gpus=1, node="a"), pod("q", cpu=3000, gpus=1, node="b")]
    started = {"default/p": NOW - 600, "default/q": NOW - 600}
    act = _run([b, a], pods, started)
    assert act is not None and act.node == "a" and act.kind is ActionKind.REPLACE
    assert act.reason is DisruptionReason.UNDERUTILIZED and act.pods == ("default/p",)
    (r,) = act.replacements
    assert r.instance_type == "tiny" and r.capacity_type is CapacityType.SPOT
    assert act.savings_per_hour == pytest.approx(0.26 - 0.14) and "rightsize" in act.message


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("ok", True),
        ("too young", False),  # under minPodAge: most pods end within minutes
        ("too old", False),  # over maxPodAge
        ("age unknown", False),
        ("one old pod", False),
        ("not eligible", False),
        ("disrupting", False),
        ("do not disrupt", False),
        ("pdb", False),
        ("budget spent", False),
        ("budget for another reason", True),
        ("limits", False),
        ("max nodes", False),
        ("offering unavailable", True),  # falls back to the next cheapest that fits (small)
        ("daemon only", False),
        ("unschedulable", False),
    ],
)
def test_rightsize_blockers(case: str, expect: bool) -> None:
    n = _node()
    p = pod("p", cpu=3000, gpus=1, node="n1")
    pods = [p]
    started = {"default/p": NOW - 600}
    kw: dict[str, object] = {}
    pool = POOL
    if case == "too young":
        started = {"default/p": NOW - 60}
    elif case == "too old":
        started = {"default/p": NOW - 7200}
    elif case == "age unknown":
        started = {}
    elif case == "one old pod":
        pods.append(pod("o", cpu=500, node="n1"))
        started["default/o"] = NOW - 7200
    elif case == "not eligible":
        kw["eligible"] = set()
    elif case == "disrupting":
        kw["disrupting"] = {"n1"}
    elif case == "do not disrupt":
        pods[0] = replace(p, annotations={L.DO_NOT_DISRUPT_ANNOTATION: "true"})
    elif case == "pdb":
        pods[0] = replace(p, labels={"app": "x"})
        kw["pdbs"] = [PodDisruptionBudget("b", "default", {"app": "x"}, 1)]
    elif case in ("budget spent", "budget for another reason"):
        reasons = ("Underutilized",) if case == "budget spent" else ("Empty",)
        pool = replace(POOL, disruption=replace(POOL.disruption, budgets=(DisruptionBudget("0", reasons=reasons),)))
    elif case == "limits":
        pool = replace(POOL, limits=PoolLimits(gpus=10))
    elif case == "max nodes":
        pool = replace(POOL, max_nodes=1)
    elif case == "offering unavailable":
        kw["unavailable"] = {OfferingKey("tiny", "z1", CapacityType.SPOT): NOW + 60}
    elif case == "daemon only":
        pods[0] = replace(p, is_daemonset=True)
    elif case == "unschedulable":
        n = replace(n, unschedulable=True)
    act = _run([n], pods, started, pools={"gpu": pool}, **kw)
    assert (act is not None) is expect
    if case == "offering unavailable":
        assert act is not None and act.replacements[0].instance_type == "small"


def test_next_look_is_when_a_pod_on_an_eligible_node_reaches_min_age() -> None:
    pods = [pod("a", node="n1"), pod("b", node="n2"), pod("c", node="n1")]
    started = {"default/a": NOW - 100, "default/b": NOW - 250, "default/c": NOW - 400}
    assert next_look(pods, {"n1"}, started, NOW, RULE) == NOW + 200  # a; c is past it, b's node not eligible
    assert next_look(pods, {"n2"}, started, NOW, RULE) == NOW + 50
    assert next_look(pods, set(), started, NOW, RULE) is None


def test_rightsize_setting() -> None:
    assert ControllerConfig.from_policy({}).rightsize is None
    assert ControllerConfig.from_policy({"rightsize": False}).rightsize is None
    assert ControllerConfig.from_policy({"rightsize": True}).rightsize == RightsizeRule()
    got = ControllerConfig.from_policy(
        {"rightsize": {"minPodAge": "2m", "maxPodAge": "30m", "minSaving": 0.3, "horizon": "2h", "coldStart": 100}}
    ).rightsize
    assert got == RightsizeRule(120.0, 1800.0, 0.3, 7200.0, 100.0)
    for bad, where in (
        ("x", "policy.rightsize"),
        ({"age": 1}, "policy.rightsize.age"),
        ({"minSaving": 1}, "policy.rightsize.minSaving"),
        ({"minSaving": True}, "policy.rightsize.minSaving"),
        ({"maxPodAge": "0s"}, "policy.rightsize.maxPodAge"),
        ({"minPodAge": "2h"}, "policy.rightsize.minPodAge"),
    ):
        with pytest.raises(InputError) as err:
            ControllerConfig.from_policy({"rightsize": bad})
        assert where in str(err.value) and "\n" not in str(err.value)
    # maxPodAge alone below the default minPodAge: the error says which minPodAge and how to fix it
    with pytest.raises(InputError) as err:
        ControllerConfig.from_policy({"rightsize": {"maxPodAge": "1m"}})
    assert "minPodAge (300s, the default) must be at most maxPodAge (60s)" in str(err.value)
    assert "set minPodAge to at most 60s or maxPodAge to at least 300s" in str(err.value)
