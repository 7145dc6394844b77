"""The demand-anticipating scale-up's pure decisions (:mod:`gpuscale.core.anticipate`) and its setting's reader."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builders import OD, catalog, itype, node, pod, pool
from gpuscale.controller.config import ControllerConfig
from gpuscale.core import anticipate as anticipate_mod
from gpuscale.core.anticipate import (
    ANTICIPATED_NAMESPACE,
    LOWEST_PRIORITY,
    AnticipateSpec,
    after_plan,
    anticipated,
    expected_pods,
    is_anticipated,
    real_first,
    repack_in_flight,
    weigh,
    with_extra,
)
from gpuscale.core.model import Pod, Snapshot, Taint, TaintEffect
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner import plan
from gpuscale.core.reconcile.scaleup import LaunchOrder, ScaleUpDecision, decide_scale_up
from gpuscale.errors import InputError
from gpuscale.kube.policy import live_config, load_policy

CAT = catalog(itype("g1", 8, 32, 1, "T4", price=0.6), itype("g4", 32, 128, 4, "T4", price=2.0))
SPEC = AnticipateSpec(lead_s=600.0, recent_windows=6, max_extra_gpus=8)


def _order(it: str, *pods: str, group: int = 0) -> LaunchOrder:
    return LaunchOrder(("up", "gpu", it, "z1", "on-demand", *pods), "gpu", it, "z1", OD, tuple(pods), "ScaleUp", group)


def _decision(*orders: LaunchOrder, placed: dict[str, str] | None = None) -> ScaleUpDecision:
    return ScaleUpDecision(orders, placed or {}, (), 0, True)


def _arrivals(*spec: tuple[float, int]) -> tuple[list[float], list[Pod]]:
    """(times, pods) of pods named a0, a1, ... arriving at the given times with the given GPUs."""
    times = [t for t, _ in spec]
    pods = [pod(f"a{i}", gpus=g) for i, (_, g) in enumerate(spec)]
    return times, pods


X = anticipated(pod("x", gpus=1)).key
Y = anticipated(pod("y", gpus=1)).key
Z = anticipated(pod("z", gpus=1)).key


# ------------------------------------------------------------------------------------------------ expected pods
@pytest.mark.parametrize(
    ("arrivals", "now", "spec", "names"),
    [
        # no history: nothing expected
        ((), 3600.0, SPEC, []),
        # one 1-GPU pod in each of the last six 10-minute windows: 1 GPU expected, the newest pod copied
        (tuple((600.0 * k + 1, 1) for k in range(6)), 3600.0, SPEC, ["a5"]),
        # three per window: 3 GPUs, the three newest (newest first)
        (tuple((600.0 * k + j, 1) for k in range(6) for j in (1, 2, 3)), 3600.0, SPEC, ["a17", "a16", "a15"]),
        # capped by maxExtraGpus
        (
            tuple((600.0 * k + j, 1) for k in range(6) for j in (1, 2, 3)),
            3600.0,
            AnticipateSpec(max_extra_gpus=2),
            ["a17", "a16"],
        ),
        # a pod larger than what is left of the forecast is skipped, an older smaller one taken
        (
            ((100.0, 1), (700.0, 1), (1300.0, 1), (1900.0, 1), (2500.0, 1), (3000.0, 1), (3100.0, 4)),
            3600.0,
            SPEC,
            ["a5"],
        ),
        # the forecast is the median window: two quiet windows of six do not matter, four do
        (tuple((600.0 * k + 1, 2) for k in range(6) if k not in (0, 1)), 3600.0, SPEC, ["a3"]),
        (tuple((600.0 * k + 1, 2) for k in range(6) if k in (4, 5)), 3600.0, SPEC, []),
    ],
)
def test_expected_pods_are_copies_of_the_newest_arrivals_within_the_forecast(
    arrivals: tuple[tuple[float, int], ...], now: float, spec: AnticipateSpec, names: list[str]
) -> None:
    times, pods = _arrivals(*arrivals)
    out = expected_pods(times, pods, 0.0, now, spec)
    assert [p.key.rsplit("/", 1)[1] for p in out] == names
    for p in out:
        assert is_anticipated(p.key) and p.pending and p.priority == LOWEST_PRIORITY and p.gang is None


def test_gang_members_and_cpu_pods_are_never_expected() -> None:
    times = [600.0 * k + 1 for k in range(6)]
    pods = [pod(f"g{k}", gpus=1, gang="g", gang_size=2) for k in range(5)] + [pod("cpu", cpu=1000)]
    assert expected_pods(times, pods, 0.0, 3600.0, SPEC) == ()


def test_an_expected_pod_keeps_its_shape_and_selectors() -> None:
    real = pod("r", cpu=3000, mem=2048, gpus=2, selector={"zone": "a"}, node="n1", priority=7)
    a = anticipated(real)
    assert a.request == real.request and a.node_selector == real.node_selector
    assert a.node_name is None and a.priority == LOWEST_PRIORITY and not is_anticipated(real.key)


# ------------------------------------------------------------------------------------------------ weigh
@pytest.mark.parametrize(
    ("extra", "expected", "spec", "take", "why"),
    [
        # the expected pods fit in room there is: nothing to launch
        (_decision(), [X], SPEC, False, "fit in room"),
        # one 1-GPU node for one expected pod: $0.60/h over 10 min ($0.10) against 200 s x ($4 + $0.60) = $0.26
        (_decision(_order("g1", X)), [X], SPEC, True, "taken"),
        # a 4-GPU node for three: $2.00/h over 10 min ($0.33) against 3 x 200 s x ($4 + $0.50) = $0.75
        (_decision(_order("g4", X, Y, Z)), [X, Y, Z], SPEC, True, "taken"),
        # a 4-GPU node for one: $0.33 against 200 s x ($4 + $0.50) = $0.25
        (_decision(_order("g4", X)), [X], SPEC, False, "does not pay"),
        # waiting costs nothing and the room may wait an hour: $0.60 against $0.03
        (_decision(_order("g1", X)), [X], AnticipateSpec(lead_s=3600.0, wait_cost_per_gpu_hour=0.0), False, "not pay"),
        # more GPUs than maxExtraGpus
        (_decision(_order("g4", X, Y, Z)), [X, Y, Z], AnticipateSpec(max_extra_gpus=2), False, "maxExtraGpus=2"),
        # a real pod would get a node (the plain plan left it out): never
        (_decision(_order("g4", "q", X, Y)), [X, Y], SPEC, False, "leaves out"),
    ],
)
def test_weigh(extra: ScaleUpDecision, expected: list[str], spec: AnticipateSpec, take: bool, why: str) -> None:
    pods = [anticipated(pod(k.rsplit("/", 1)[1], gpus=1)) for k in expected]
    v = weigh(extra, pods, CAT, spec)
    assert v.take is take
    assert why in v.reason


def test_weigh_figures() -> None:
    pods = [anticipated(pod(n, gpus=1)) for n in "xyz"]
    v = weigh(_decision(_order("g4", X, Y, Z)), pods, CAT, SPEC)
    assert v.extra_gpus == 4 and v.extra_hourly == pytest.approx(2.0)
    assert v.spent == pytest.approx(2.0 / 6)
    assert v.saved == pytest.approx(3 * 200 / 3600 * (4 + 0.5))


# ------------------------------------------------------------------------------------------------ plans
def _plan(snap: Snapshot) -> ScaleUpDecision:
    return decide_scale_up(snap, plan, PlannerConfig(), 0.0)


def test_expected_pods_take_the_plain_plans_spare_room_first_then_one_more_node() -> None:
    """Two pending half-GPU pods: the plain plan buys one 1-GPU node for both. One expected 1-GPU pod gets a node of
    its own; with a half-GPU expected pod, it takes the spare room of a 1-GPU node bought for one pending half-GPU
    pod and nothing more is launched."""
    real = (pod("p", milli=500), pod("q", milli=500))
    snap = Snapshot(pods=real, nodes=(), pools=(pool("gpu"),), catalog=CAT)
    plain = _plan(snap)
    assert [(o.instance_type, o.pods) for o in plain.launches] == [("g1", ("default/p", "default/q"))]
    expected = (anticipated(pod("x", gpus=1)),)
    after = after_plan(snap, plain, expected)
    assert [p.node_name for p in after.pods[:2]] == [f"{ANTICIPATED_NAMESPACE}/planned-0"] * 2
    assert [n.launching for n in after.nodes] == [True]
    extra = _plan(after)
    assert [(o.instance_type, o.pods) for o in extra.launches] == [("g1", (expected[0].key,))]
    v = weigh(extra, expected, CAT, SPEC)
    assert v.take and v.extra_gpus == 1
    out = with_extra(plain, extra)
    assert [(o.instance_type, o.pods, o.group) for o in out.launches] == [
        ("g1", ("default/p", "default/q"), 0),
        ("g1", (), 1),
    ]
    assert out.launches[1].seed == extra.launches[0].seed  # names the expected pod: the same id in a later round
    # one pending half-GPU pod: its node has half a GPU to spare, an expected half-GPU pod needs no node
    one = Snapshot(pods=real[:1], nodes=(), pools=(pool("gpu"),), catalog=CAT)
    plain1 = _plan(one)
    half = (anticipated(pod("y", milli=500)),)
    extra1 = _plan(after_plan(one, plain1, half))
    assert extra1.launches == () and extra1.placed == {half[0].key: f"{ANTICIPATED_NAMESPACE}/planned-0"}
    assert not weigh(extra1, half, CAT, SPEC).take


def test_pods_the_plain_plan_blocks_are_left_out() -> None:
    snap = Snapshot(pods=(pod("huge", gpus=16), pod("p", gpus=1)), nodes=(), pools=(pool("gpu"),), catalog=CAT)
    plain = _plan(snap)
    assert [b.pod for b in plain.blocked] == ["default/huge"]
    after = after_plan(snap, plain, ())
    assert [p.key for p in after.pods] == ["default/p"]


# ------------------------------------------------------------------------------------------------ setting
def test_setting() -> None:
    assert ControllerConfig.from_policy({}).anticipate is None
    assert ControllerConfig.from_policy({"anticipate": False}).anticipate is None
    assert ControllerConfig.from_policy({"anticipate": True}).anticipate == AnticipateSpec()
    got = ControllerConfig.from_policy(
        {"anticipate": {"lead": "20m", "waitCostPerGpuHour": 2, "maxExtraGpus": 4, "quantile": 0.75, "days": 7}}
    ).anticipate
    assert got == AnticipateSpec(lead_s=1200.0, wait_cost_per_gpu_hour=2.0, max_extra_gpus=4, quantile=0.75, days=7)


@pytest.mark.parametrize(
    ("value", "where", "message"),
    [
        ({"lead": "soon"}, "policy.anticipate.lead", "not a duration"),
        ({"lead": 0}, "policy.anticipate.lead", "positive"),
        ({"maxExtraGpus": 0}, "policy.anticipate.maxExtraGpus", "integer from 1"),
        ({"maxExtraGpus": 1.5}, "policy.anticipate.maxExtraGpus", "integer from 1"),
        ({"quantile": 2}, "policy.anticipate.quantile", "number from 0 to 1"),
        ({"waitCostPerGpuHour": "lots"}, "policy.anticipate.waitCostPerGpuHour", "number"),
        ({"leed": "10m"}, "policy.anticipate.leed", "unknown anticipate setting"),
        ("yes", "policy.anticipate", "must be true, false or a mapping"),
    ],
)
def test_bad_setting_is_one_line_naming_the_field(value: object, where: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        ControllerConfig.from_policy({"anticipate": value})
    text = str(exc.value)
    assert where in text and message in text and "\n" not in text


def test_policy_file_for_the_cluster_controller(tmp_path: Path) -> None:
    """``gpuscale controller --policy-file`` reads the same setting, with the same one-line errors."""
    f = tmp_path / "policy.yaml"
    f.write_text("anticipate: {lead: 10m, maxExtraGpus: 2}\n")
    cfg = live_config(load_policy(str(f)), None)
    assert cfg.anticipate == AnticipateSpec(lead_s=600.0, max_extra_gpus=2)
    f.write_text("anticipate: {maxExtraGpus: -1}\n")
    with pytest.raises(InputError, match=r"anticipate\.maxExtraGpus"):
        load_policy(str(f))


# ------------------------------------------------------------------------------------------------ nodes in flight
def _flight_case() -> Snapshot:
    """Traced on the openb replay (seed 4, ``maxExtraGpus: 8``): two nodes in flight, a 1-GPU and a 2-GPU one, and
    three pending pods. Pod by pod, the 1-GPU pod takes the 1-GPU node and the 0.65-GPU pod the 2-GPU node, whose
    CPU is then too short for the 0.23-GPU pod; with the 1-GPU pod on the 2-GPU node all three fit."""
    nodes = (
        node("n1", 28000, 114688, 1, "T4", pool="gpu", launching=True),
        node("n2", 16000, 122880, 2, "T4", pool="gpu", launching=True),
    )
    pods = (
        pod("p1", cpu=11908, mem=47104, gpus=1),
        pod("p2", cpu=11908, mem=47104, milli=650),
        pod("p3", cpu=8000, mem=30517, milli=230),
    )
    return Snapshot(pods=pods, nodes=nodes, pools=(pool("gpu"),), catalog=CAT)


def _fits_all(snap: Snapshot, placed: dict[str, str]) -> bool:
    """Every pod of ``placed`` fits its node with the others (CPU, memory, GPU milli per node: whole GPUs counted
    as 1000; enough for these cases)."""
    for n in snap.nodes:
        on = [p.request for p in snap.pods if placed.get(p.key) == n.name or p.node_name == n.name]
        cpu = sum(r.cpu_milli for r in on)
        mem = sum(r.memory_mib for r in on)
        gpu = sum(r.gpu_demand_milli for r in on)
        if cpu > n.allocatable.cpu_milli or mem > n.allocatable.memory_mib or gpu > 1000 * n.allocatable.gpus:
            return False
    return True


def test_pods_that_all_fit_on_the_nodes_in_flight_launch_no_node() -> None:
    snap = _flight_case()
    # the plan the replay's planner made (its placement depends on its scorer and the rest of the cluster)
    plain = _decision(_order("g1", "default/p3"), placed={"default/p1": "n1", "default/p2": "n2"})
    out = repack_in_flight(snap, plain)
    assert out.launches == ()
    assert set(out.placed) == {"default/p1", "default/p2", "default/p3"}
    assert out.placed["default/p1"] == "n2" and _fits_all(snap, dict(out.placed))
    assert out.blocked == plain.blocked and out.attempt == plain.attempt
    assert repack_in_flight(snap, out) is out  # nothing launched: nothing to do


@pytest.mark.parametrize(
    ("change", "why"),
    [
        # the third pod needs more CPU than any assignment leaves
        (lambda s: replace(s, pods=(*s.pods[:2], pod("p3", cpu=16500, mem=30517, milli=230))), "does not fit"),
        # no node in flight
        (lambda s: replace(s, nodes=tuple(replace(n, launching=False) for n in s.nodes)), "registered nodes"),
        # a gang member is left to the planner
        (
            lambda s: replace(s, pods=(*s.pods[:2], pod("p3", cpu=8000, mem=30517, milli=230, gang="g", gang_size=1))),
            "gang",
        ),
        # the 2-GPU node is tainted: the 1-GPU pod may not go there
        (
            lambda s: replace(
                s, nodes=(s.nodes[0], replace(s.nodes[1], taints=(Taint("only", TaintEffect.NO_SCHEDULE, "x"),)))
            ),
            "taint",
        ),
    ],
)
def test_repack_keeps_the_plain_plan_when_no_assignment_fits(change: Any, why: str) -> None:
    snap = change(_flight_case())
    plain = _decision(_order("g1", "default/p3"), placed={"default/p1": "n1", "default/p2": "n2"})
    assert repack_in_flight(snap, plain) is plain, why


def test_repack_keeps_launches_naming_no_pod_and_counts_pods_bound_in_flight() -> None:
    snap = _flight_case()
    extra = LaunchOrder(("x",), "gpu", "g4", "z1", OD, (), "ScaleUp", 1)
    plain = _decision(_order("g1", "default/p3"), extra, placed={"default/p1": "n1", "default/p2": "n2"})
    assert repack_in_flight(snap, plain).launches == (extra,)
    # a pod already bound to the 2-GPU node takes its room: the three no longer fit
    busy = replace(snap, pods=(*snap.pods, pod("b", cpu=8000, mem=1024, node="n2")))
    assert repack_in_flight(busy, plain) is plain


def test_repack_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _flight_case()
    plain = _decision(_order("g1", "default/p3"), placed={"default/p1": "n1", "default/p2": "n2"})
    monkeypatch.setattr(anticipate_mod, "REPACK_MAX_STEPS", 2)  # p1 on n1, p2 on n2, then out of steps
    assert repack_in_flight(snap, plain) is plain
    monkeypatch.setattr(anticipate_mod, "REPACK_MAX_STEPS", 4096)
    monkeypatch.setattr(anticipate_mod, "REPACK_MAX_PODS", 2)
    assert repack_in_flight(snap, plain) is plain


def _leaving_case(x_gpus: int = 1, v_gpus: int = 1) -> tuple[Snapshot, ScaleUpDecision]:
    """An extra node in flight (launched for no pod), a pending 1-GPU pod ``r`` and a pod ``v`` of a draining node
    shown pending: the planner put ``v`` on the extra node and launched a node for ``r`` (as traced on openb)."""
    snap = Snapshot(
        pods=(pod("r", cpu=4000, gpus=1), pod("v", cpu=4000, gpus=v_gpus)),
        nodes=(node("x", 8000 * x_gpus, 32768 * x_gpus, x_gpus, "T4", pool="gpu", launching=True),),
        pools=(pool("gpu"),),
        catalog=CAT,
    )
    return snap, _decision(_order("g1", "default/r"), placed={"default/v": "x"})


def test_pending_pods_take_the_room_in_flight_before_pods_of_draining_nodes() -> None:
    snap, plain = _leaving_case()
    out = real_first(snap, plain, {"default/v"}, _plan, CAT)
    # r waits: it gets the node in flight; v, still running on its draining node, the node launched
    assert out.placed == {"default/r": "x"}
    assert [(o.instance_type, o.pods) for o in out.launches] == [("g1", ("default/v",))]
    assert out.attempt == plain.attempt and out.may_replan == plain.may_replan


def test_real_first_keeps_the_plain_plan() -> None:
    snap, plain = _leaving_case()
    cases = [
        (snap, plain, set(), "no pod of a draining node"),
        (snap, _decision(_order("g1", "default/v"), placed={"default/r": "x"}), {"default/v"}, "launches for v"),
        (snap, _decision(_order("g1", "default/r")), {"default/v"}, "v not on a node in flight"),
    ]
    for s, d, leaving, why in cases:
        assert real_first(s, d, leaving, _plan, CAT) is d, why
    # made again, v (4 GPUs) needs a 4-GPU node: dearer per hour than the 1-GPU node for r, so the plain plan stays
    big, plain4 = _leaving_case(x_gpus=4, v_gpus=4)
    assert real_first(big, plain4, {"default/v"}, _plan, CAT) is plain4


def test_real_first_never_leaves_a_pod_without_room_to_save_money() -> None:
    """Made again, ``v`` (4 GPUs, of a draining node) needs a 4-GPU node the catalog no longer offers: the plan of
    ``r`` first launches nothing and blocks ``v``, cheaper per hour than the plain plan, which places both; the plain
    plan stays."""
    big, plain4 = _leaving_case(x_gpus=4, v_gpus=4)
    only_g1 = replace(big, catalog=catalog(itype("g1", 8, 32, 1, "T4", price=0.6)))
    without = replace(only_g1, pods=tuple(p for p in only_g1.pods if p.key != "default/v"))
    moved = [p for p in only_g1.pods if p.key == "default/v"]
    then = _plan(after_plan(without, _plan(without), moved))
    assert [b.pod for b in then.blocked] == ["default/v"] and not then.launches  # the case the guard is for
    assert real_first(only_g1, plain4, {"default/v"}, _plan, CAT) is plain4


# ------------------------------------------------------------------------------------------------ pending first
def test_launches_for_pods_of_draining_nodes_go_after_those_for_pods_that_wait() -> None:
    leave = _order("g1", "d", group=0)
    wait = _order("g1", "p", group=1)
    extra = LaunchOrder(("up", "gpu", "g1", "z1", "on-demand", "0"), "gpu", "g1", "z1", OD, (), "ScaleUp", 2)
    plain = _decision(leave, wait, extra)
    out = anticipate_mod.pending_first(plain, {"d"})
    assert out.launches == (wait, extra, leave)  # orders and their groups unchanged, only their order
    assert out.placed == plain.placed
    # nothing to move: the same object
    assert anticipate_mod.pending_first(plain, set()) is plain
    tail = _decision(wait, leave)
    assert anticipate_mod.pending_first(tail, {"d"}) is tail  # already last
    both = _decision(_order("g4", "d", "p", group=0), wait)
    assert anticipate_mod.pending_first(both, {"d"}) is both  # an order with a pod that waits stays where it is
    # within one group (one plan launch of two nodes) too
    leave0, wait0 = _order("g1", "d", group=0), _order("g1", "p", group=0)
    assert anticipate_mod.pending_first(_decision(leave0, wait0), {"d"}).launches == (wait0, leave0)
