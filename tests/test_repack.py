"""``evictMaxPodAge`` and ``repack`` (gpuscale.core.disruption.repack): old pods held, young nodes found, nodes in
flight offered as destinations with the room their own pods take, and the settings' validation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from builders import catalog, itype, node, pod
from gpuscale.controller.config import ControllerConfig
from gpuscale.core.disruption import (
    ActionKind,
    DisruptionAction,
    DisruptionPlan,
    DisruptionReason,
    KeepReason,
    Kept,
    plan_disruption,
)
from gpuscale.core.disruption.repack import (
    InFlight,
    PodAgeRule,
    RepackRule,
    empty_nodes,
    hold_old_pods,
    oldest,
    repack_deletions,
    repack_inputs,
    without_destinations,
    young_nodes,
)
from gpuscale.core.disruption.spotswap import SpotSwapRule, spot_replacement, swap_spot
from gpuscale.core.model import CapacityType, Catalog, ConsolidationPolicy, Disruption, Node, NodePool, OfferingKey
from gpuscale.core.resources import Resources
from gpuscale.core.templates import template_labels
from gpuscale.errors import InputError
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import parse_scenario

H = 3600.0


def _act(
    node_name: str, reason: DisruptionReason, pods: tuple[str, ...], kind: ActionKind = ActionKind.DELETE
) -> DisruptionAction:
    return DisruptionAction(kind, node_name, "gpu", reason, "m", pods, (), 1.0)


# ------------------------------------------------------------------------------------------------ old pods
def test_oldest_is_the_longest_bound_pod_with_a_known_age() -> None:
    started = {"a": 100.0, "b": 50.0}
    assert oldest(("a", "b", "c"), started, 1000.0) == ("b", 950.0)
    assert oldest(("c",), started, 1000.0) is None
    assert oldest((), started, 1000.0) is None


@pytest.mark.parametrize(
    ("reason", "ages_h", "held"),
    [
        (DisruptionReason.UNDERUTILIZED, (0.5, 7.0), True),  # one pod older than 6 h: held
        (DisruptionReason.UNDERUTILIZED, (0.5, 5.9), False),  # all younger: goes ahead
        (DisruptionReason.UNDERUTILIZED, (6.0,), False),  # exactly the limit: goes ahead
        (DisruptionReason.UNDERUTILIZED, (None,), False),  # age unknown: counted young
        (DisruptionReason.DRIFTED, (30.0,), False),  # drift must go whatever the age
        (DisruptionReason.EMPTY, (), False),
    ],
)
def test_hold_old_pods_keeps_underutilized_nodes_running_an_old_pod(
    reason: DisruptionReason, ages_h: tuple[float | None, ...], held: bool
) -> None:
    now = 100 * H
    keys = tuple(f"ns/p{i}" for i in range(len(ages_h)))
    started = {k: now - a * H for k, a in zip(keys, ages_h, strict=True) if a is not None}
    other = _act("n2", DisruptionReason.UNDERUTILIZED, ("ns/young",))
    plan = DisruptionPlan((_act("n1", reason, keys), other), (), {"n1": 0.0})
    out = hold_old_pods(plan, {**started, "ns/young": now - 60}, PodAgeRule(6 * H), now)
    if not held:
        assert out is plan
        return
    assert out.actions == (other,) and out.since == plan.since
    (k,) = out.kept
    assert k.node == "n1" and k.reason is KeepReason.WORK_LOST and k.candidate is reason
    assert "ns/p1" in k.message and "7.00 h" in k.message


# ------------------------------------------------------------------------------------------------ young nodes
def test_young_nodes_need_every_workload_pod_bound_recently() -> None:
    now = 10 * H
    by_node = {
        "young": [pod("a", gpus=1, node="young"), pod("b", gpus=1, node="young")],
        "mixed": [pod("c", gpus=1, node="mixed"), pod("d", gpus=1, node="mixed")],
        "unknown": [pod("e", gpus=1, node="unknown")],
        "empty": [],
    }
    started = {"default/a": now - 60, "default/b": now - 1700, "default/c": now - 60, "default/d": now - 2 * H}
    got = young_nodes(("young", "mixed", "unknown", "empty", "absent"), by_node, started, RepackRule(1800.0), now)
    assert got == {"young"}
    assert young_nodes(("young",), by_node, started, RepackRule(600.0), now) == set()


# ------------------------------------------------------------------------------------------------ in-flight room
def test_repack_inputs_make_nodes_in_flight_destinations_holding_their_own_pods() -> None:
    ready = node("ready", 8000, 32768, 1, "T4")
    flying = node("flying", 8000, 32768, 4, "T4", launching=True)
    registered = replace(node("registered", 8000, 32768, 0, "T4"))  # GPUs not allocatable yet
    other = node("other", 8000, 32768, 4, "T4", launching=True)  # a replacement: not offered
    waiting = pod("w", gpus=2)  # pending, launched for on "flying"
    bound_elsewhere = pod("x", gpus=1, node="ready")  # was launched for on "flying", then bound to "ready"
    flight = {
        "flying": InFlight(Resources(8000, 32768, 4), ("default/w", "default/x")),
        "registered": InFlight(Resources(8000, 32768, 2), ()),
    }
    nodes, pods = repack_inputs([ready, flying, registered, other], [waiting, bound_elsewhere], flight)
    by = {n.name: n for n in nodes}
    assert not by["flying"].launching and by["flying"].allocatable.gpus == 4
    assert by["registered"].allocatable.gpus == 2 and by["other"].launching and by["ready"] is ready
    got = {p.key: p.node_name for p in pods}
    assert got == {"default/w": "flying", "default/x": "ready"}
    assert repack_inputs([ready], [waiting], {}) == ([ready], [waiting])


def _pool() -> NodePool:
    d = Disruption(consolidation_policy=ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED, consolidate_after_s=0.0)
    return NodePool(name="gpu", disruption=d)


def test_a_young_underutilized_node_goes_onto_the_room_a_node_in_flight_has_left() -> None:
    # "frag": a 4-GPU node running one young 1-GPU pod (25 %), nowhere else to go but the node in flight, which
    # was launched for a pending 2-GPU pod and has 2 GPUs left.
    frag = replace(node("frag", 16000, 65536, 4, "T4", pool="gpu"), hourly_cost=4.0)
    flying = replace(node("flying", 16000, 65536, 4, "T4", pool="gpu", launching=True), hourly_cost=4.0)
    moved = pod("m", gpus=1, node="frag")
    waiting = pod("w", gpus=2)
    pools, cat = [_pool()], Catalog("none", ())
    args: dict[str, Any] = {"since": {"frag": 0.0}, "candidates": {"frag"}}
    plain = plan_disruption([frag, flying], [moved, waiting], pools, cat, 100.0, **args)
    assert plain.actions == ()  # without repack the node in flight is no destination
    flight = {"flying": InFlight(Resources(16000, 65536, 4), ("default/w",))}
    nodes, pods = repack_inputs([frag, flying], [moved, waiting], flight)
    second = plan_disruption(nodes, pods, pools, cat, 100.0, allow_replace=False, **args)
    assert [(a.node, a.kind) for a in second.actions] == [("frag", ActionKind.DELETE)]
    assert repack_deletions(second, {"frag"}) == second.actions
    assert repack_deletions(second, set()) == ()  # only the young nodes' deletions are carried out
    # a pending pod that takes the whole node in flight leaves no room: nothing moves
    big = pod("w", gpus=4)
    nodes, pods = repack_inputs([frag, flying], [moved, big], flight)
    assert plan_disruption(nodes, pods, pools, cat, 100.0, allow_replace=False, **args).actions == ()


def test_repack_deletions_are_underutilized_deletes_only() -> None:
    plan = DisruptionPlan(
        (
            _act("a", DisruptionReason.UNDERUTILIZED, ("p",)),
            _act("b", DisruptionReason.EMPTY, ()),
            _act("c", DisruptionReason.UNDERUTILIZED, ("q",), ActionKind.REPLACE),
        ),
        (Kept("d", "gpu", KeepReason.BUDGET, "m", DisruptionReason.UNDERUTILIZED),),
        {},
    )
    assert [a.node for a in repack_deletions(plan, {"a", "b", "c"})] == ["a"]


# ------------------------------------------------------------------------------------------------ settings
def test_settings_parse_and_default_off() -> None:
    cfg = ControllerConfig.from_policy({})
    assert cfg.evict_max_pod_age is None and cfg.repack is None
    cfg = ControllerConfig.from_policy({"evictMaxPodAge": "6h", "repack": {"maxPodAge": "10m"}})
    assert cfg.evict_max_pod_age == PodAgeRule(6 * H) and cfg.repack == RepackRule(600.0)
    assert ControllerConfig.from_policy({"repack": True}).repack == RepackRule(1800.0)
    assert ControllerConfig.from_policy({"repack": {}}).repack == RepackRule()
    off = ControllerConfig.from_policy({"repack": False, "evictMaxPodAge": None})
    assert off.repack is None and off.evict_max_pod_age is None


@pytest.mark.parametrize(
    ("policy", "where", "words"),
    [
        ({"evictMaxPodAge": "soon"}, "policy.evictMaxPodAge", "not a duration"),
        ({"evictMaxPodAge": 0}, "policy.evictMaxPodAge", "positive"),
        ({"evictMaxPodAge": True}, "policy.evictMaxPodAge", "duration"),
        ({"repack": "yes"}, "policy.repack", "true, false or a mapping"),
        ({"repack": {"age": "1h"}}, "policy.repack.age", "unknown repack setting"),
        ({"repack": {"maxPodAge": "0s"}}, "policy.repack.maxPodAge", "positive"),
    ],
)
def test_bad_settings_are_one_line_errors(policy: dict[str, object], where: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        ControllerConfig.from_policy(policy)
    assert where in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------ simulator
SIM_CAT = catalog(itype("gpu-1", 8, 32, 1, "T4", price=0.6), itype("gpu-4", 32, 128, 4, "T4", price=1.6))
SIM = """
name: repack
seed: 1
duration: 6h
catalog: x
pools:
  - name: gpu
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 1m}}
cloud:
  launchLatency: 60s
  registrationLatency: 60s
  devicePluginDelay: 120s
workload:
  - source: burst
    prefix: small
    count: 1
    at: 0s
    runtime: 5h
    shape: {{cpu: 2, memory: 4Gi, gpuMilli: 400}}
  - source: burst
    prefix: big
    count: 3
    at: 20m
    runtime: 5h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
policy: {{name: gpuscale{extra}}}
"""


def _sim(extra: str) -> tuple[float, float, float]:
    """(cost, when the small pod's node was consolidated, when the 4-GPU node's GPUs were ready)."""
    sc = parse_scenario(SIM.format(extra=extra), source="r.yaml", catalog=SIM_CAT)
    res = simulate_policy(sc, "gpuscale")
    events = res.cluster.events
    gone = [e.at for e in events if e.kind == "Consolidate" and e.reason == "Underutilized"]
    ready = [e.at for e in events if e.kind == "GpusReady" and e.object == "node/gpu-00002"]
    assert res.report["duplicateLaunches"] == 0 and len(ready) == 1
    return res.report["costUsd"], gone[0] if gone else float("inf"), ready[0]


def test_repack_lets_a_young_fragment_go_while_the_new_node_is_still_launching() -> None:
    # A 0.4-GPU pod runs alone on a 1-GPU node (40 %: underutilised, but it fits nowhere else). 20 minutes later
    # three 1-GPU pods launch a 4-GPU node with a GPU to spare. By default the small node goes once that node is up;
    # with repack it goes while the node is in flight, and the run is cheaper.
    cost, gone, ready = _sim("")
    assert gone >= ready
    r_cost, r_gone, r_ready = _sim(", repack: {maxPodAge: 1h}")
    assert r_gone < r_ready and r_cost < cost
    # the small pod has run 20 minutes: older than maxPodAge, it waits for the node to be up as by default
    assert _sim(", repack: {maxPodAge: 10m}")[1] >= ready


def test_evict_max_pod_age_keeps_the_node_of_an_old_pod() -> None:
    _, gone, _ = _sim(", evictMaxPodAge: 10m")  # the small pod is 20 minutes old when the room appears
    assert gone == float("inf")
    assert _sim(", evictMaxPodAge: 1h")[1] < float("inf")


# ------------------------------------------------------------------------------------------------ spot to spot
SPOT_CAT = catalog(
    itype("big", 28, 112, 1, "P100", price=3.0, spot=0.26),
    itype("small", 8, 60, 1, "P100", price=1.8, spot=0.17),
    itype("tiny", 4, 30, 1, "P100", price=1.5, spot=0.14),
)
SPOT_POOL = _pool()


def _spot_node(name: str = "n1", itype_name: str = "big", ct: str = "spot") -> Node:
    it = SPOT_CAT.by_name()[itype_name]
    off = next(o for o in it.offerings if str(o.capacity_type) == ct)
    n = node(name, it.vcpus * 1000, it.memory_mib, 1, "P100", labels=template_labels(SPOT_POOL, it, off))
    return replace(n, pool="gpu")


def _kept(name: str = "n1", why: KeepReason = KeepReason.NO_REPLACEMENT) -> DisruptionPlan:
    return DisruptionPlan((), (Kept(name, "gpu", why, "m", DisruptionReason.UNDERUTILIZED),), {"n1": 0.0})


@pytest.mark.parametrize(
    ("cpu", "milli", "want"),
    [
        (6000, 300, "small"),  # 30 % of the GPU: the cheapest spot node taking it ($0.17 <= 0.7 x $0.26)
        (3000, 300, "tiny"),
        (6000, 400, None),  # 40 %: $0.17 > 0.6 x $0.26 = $0.156, the saving does not cover the work at risk
        (20000, 300, None),  # needs the big node's CPUs
    ],
)
def test_spot_replacement_is_the_cheapest_spot_node_within_the_share_bound(cpu: int, milli: int, want: str) -> None:
    n = _spot_node()
    p = pod("p", cpu=cpu, milli=milli, node="n1")
    r = spot_replacement(n, SPOT_POOL, [p], SPOT_CAT, 0.0, {})
    assert (r.instance_type if r else None) == want
    cpu_only = pod("c", cpu=cpu, node="n1")  # a GPU node running only CPU pods: share 0, but never the same price
    assert spot_replacement(_spot_node(itype_name="tiny"), SPOT_POOL, [cpu_only], SPOT_CAT, 0.0, {}) is None
    if r is not None:
        assert str(r.capacity_type) == "spot" and r.pods == ("default/p",)


def test_swap_spot_replaces_one_kept_spot_node_and_leaves_the_rest() -> None:
    n = _spot_node()
    p = pod("p", cpu=3000, milli=200, node="n1")
    pools = {"gpu": SPOT_POOL}
    out = swap_spot(_kept(), [n], [p], pools, SPOT_CAT, 100.0, {}, SpotSwapRule(), {})
    (a,) = out.actions
    assert a.kind is ActionKind.REPLACE and a.node == "n1" and a.replacements[0].instance_type == "tiny"
    assert a.savings_per_hour == pytest.approx(0.26 - 0.14) and out.kept == ()
    # not on: an on-demand node, another keep reason, a plan that acts, old pods, an offering marked unavailable
    od = _spot_node(ct="on-demand")
    assert swap_spot(_kept(), [od], [p], pools, SPOT_CAT, 100.0, {}, SpotSwapRule(), {}).actions == ()
    budget = _kept(why=KeepReason.BUDGET)
    assert swap_spot(budget, [n], [p], pools, SPOT_CAT, 100.0, {}, SpotSwapRule(), {}) is budget
    acting = DisruptionPlan((_act("n2", DisruptionReason.EMPTY, ()),), _kept().kept, {})
    assert swap_spot(acting, [n], [p], pools, SPOT_CAT, 100.0, {}, SpotSwapRule(), {}) is acting
    young = SpotSwapRule(max_pod_age_s=600.0)
    assert swap_spot(_kept(), [n], [p], pools, SPOT_CAT, 1000.0, {}, young, {"default/p": 0.0}).actions == ()
    assert swap_spot(_kept(), [n], [p], pools, SPOT_CAT, 1000.0, {}, young, {"default/p": 900.0}).actions
    gone = {OfferingKey(t, "z1", CapacityType.SPOT): 1e9 for t in ("tiny", "small")}
    assert swap_spot(_kept(), [n], [p], pools, SPOT_CAT, 100.0, gone, SpotSwapRule(), {}).actions == ()


def test_spot_to_spot_setting() -> None:
    assert ControllerConfig.from_policy({}).spot_to_spot is None
    assert ControllerConfig.from_policy({"spotToSpot": True}).spot_to_spot == SpotSwapRule()
    got = ControllerConfig.from_policy({"spotToSpot": {"maxPodAge": "1h"}}).spot_to_spot
    assert got == SpotSwapRule(3600.0)
    for bad, where in (("x", "policy.spotToSpot"), ({"age": 1}, "policy.spotToSpot.age")):
        with pytest.raises(InputError) as err:
            ControllerConfig.from_policy({"spotToSpot": bad})
        assert where in str(err.value) and "\n" not in str(err.value)


def test_swap_spot_acts_on_one_node_and_leaves_the_other_swappable_ones_unkept() -> None:
    a, b, c = _spot_node("a"), _spot_node("b"), _spot_node("c", itype_name="tiny")
    pods = [pod("p", cpu=3000, milli=200, node="a"), pod("q", cpu=3000, milli=200, node="b")]
    pods.append(pod("r", cpu=3000, milli=200, node="c"))  # already the cheapest: stays kept
    kept = tuple(Kept(n, "gpu", KeepReason.NO_REPLACEMENT, "m", DisruptionReason.UNDERUTILIZED) for n in "abc")
    out = swap_spot(
        DisruptionPlan((), kept, {}), [a, b, c], pods, {"gpu": SPOT_POOL}, SPOT_CAT, 0.0, {}, SpotSwapRule(), {}
    )
    assert [x.node for x in out.actions] == ["a"] and [k.node for k in out.kept] == ["c"]


# ------------------------------------------------------------------------------------------------ not onto empty nodes
def test_empty_nodes_are_ready_pool_nodes_without_workload_pods() -> None:
    busy, idle = node("busy", 8000, 32768, 1, "T4", pool="gpu"), node("idle", 8000, 32768, 1, "T4", pool="gpu")
    planned = node("planned", 8000, 32768, 1, "T4", pool="gpu")
    flying = node("flying", 8000, 32768, 1, "T4", pool="gpu", launching=True)
    cordoned = node("cordoned", 8000, 32768, 1, "T4", pool="gpu", unschedulable=True)
    leaving, loose = node("leaving", 8000, 32768, 1, "T4", pool="gpu"), node("loose", 8000, 32768, 1, "T4")
    pods = [pod("a", gpus=1, node="busy"), pod("b", gpus=1, node="planned")]
    nodes = [busy, idle, planned, flying, cordoned, leaving, loose]
    assert empty_nodes(nodes, pods, {"leaving"}) == {"idle"}
    out = without_destinations(nodes, {"idle"})
    assert [n.name for n in out if n.unschedulable] == ["idle", "cordoned"] and out[0] is busy


def test_cordoned_empty_nodes_take_no_underutilized_pod() -> None:
    # "half": a 1-GPU pod on a 4-GPU node (25 %); "idle": an empty 4-GPU node. By default the pod moves onto "idle"
    # and "half" goes (which only swaps which node is empty); with the empty node cordoned nothing moves.
    half = replace(node("half", 16000, 65536, 4, "T4", pool="gpu"), hourly_cost=4.0)
    idle = replace(node("idle", 16000, 65536, 4, "T4", pool="gpu"), hourly_cost=4.0)
    p = pod("p", gpus=1, node="half")
    pools, cat = [_pool()], Catalog("none", ())
    args: dict[str, Any] = {"since": {"half": 0.0}, "candidates": {"half"}, "allow_replace": False}
    plain = plan_disruption([half, idle], [p], pools, cat, 100.0, **args)
    assert [(a.node, a.kind) for a in plain.actions] == [("half", ActionKind.DELETE)]
    empties = empty_nodes([half, idle], [p], ())
    assert plan_disruption(without_destinations([half, idle], empties), [p], pools, cat, 100.0, **args).actions == ()


def test_pack_onto_empty_setting() -> None:
    assert ControllerConfig.from_policy({}).pack_onto_empty is True
    assert ControllerConfig.from_policy({"packOntoEmpty": False}).pack_onto_empty is False
    with pytest.raises(InputError) as err:
        ControllerConfig.from_policy({"packOntoEmpty": "no"})
    assert "policy.packOntoEmpty" in str(err.value) and "true or false" in str(err.value)


SPOT_SIM = """
name: spot
seed: 1
duration: 6h
catalog: x
pools:
  - name: gpu
    capacityTypes: [spot]
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 5m, consolidateEmptyAfter: 30m}}
cloud:
  launchLatency: 30s
  registrationLatency: 30s
  devicePluginDelay: 60s
workload:
  - source: burst
    prefix: wide
    count: 1
    at: 0s
    runtime: 10m
    shape: {{cpu: 24, memory: 8Gi, gpus: 1}}
  - source: burst
    prefix: small
    count: 1
    at: 20m
    runtime: 5h
    shape: {{cpu: 2, memory: 4Gi, gpuMilli: 300}}
policy: {{name: gpuscale{extra}}}
"""


def test_spot_to_spot_moves_a_small_pod_off_a_big_warm_spot_node() -> None:
    # The wide pod buys the big spot node and leaves; the small pod lands on it while it is kept warm. No on-demand
    # node is cheaper than a spot node, so by default the small pod keeps the big node for 5 h; with spotToSpot it
    # moves to the tiny spot node.
    runs = {}
    for extra in ("", ", spotToSpot: true"):
        sc = parse_scenario(SPOT_SIM.format(extra=extra), source="s.yaml", catalog=SPOT_CAT)
        runs[extra] = simulate_policy(sc, "gpuscale")
    plain, swap = runs[""], runs[", spotToSpot: true"]
    assert not [e for e in plain.cluster.events if e.kind == "Consolidate" and "spot to spot" in e.message]
    (e,) = [e for e in swap.cluster.events if e.kind == "Consolidate" and "spot to spot" in e.message]
    assert "replace by tiny spot" in e.message
    assert swap.report["costUsd"] < plain.report["costUsd"] and swap.report["duplicateLaunches"] == 0


LATERAL = """
name: lateral
seed: 1
duration: 3h
catalog: x
pools:
  - name: gpu
    instanceTypes: [gpu-4]
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 1m, consolidateEmptyAfter: 30m}}
cloud:
  launchLatency: 30s
  registrationLatency: 30s
  devicePluginDelay: 60s
workload:
  - source: burst
    prefix: short
    count: 7
    at: 0s
    runtime: 10m
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
  - source: burst
    prefix: long
    count: 1
    at: 0s
    runtime: 2h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
policy: {{name: gpuscale{extra}}}
"""


def test_pack_onto_empty_false_leaves_a_lone_pod_where_it_is() -> None:
    # Eight 1-GPU pods fill two 4-GPU nodes; ten minutes later only the long pod is left, on one of them, and the
    # other is empty (kept warm for 30 minutes). By default the long pod is moved onto the empty node, which only
    # swaps which node is empty; with packOntoEmpty: false it stays and the empty node goes after its 30 minutes:
    # no eviction, but the warm node is paid for its whole wait (what the option costs on the openb replay too).
    runs = {}
    for extra in ("", ", packOntoEmpty: false"):
        sc = parse_scenario(LATERAL.format(extra=extra), source="l.yaml", catalog=SIM_CAT)
        runs[extra] = simulate_policy(sc, "gpuscale").report
    plain, kept = runs[""], runs[", packOntoEmpty: false"]
    assert plain["nodesLaunched"] == kept["nodesLaunched"] == 2
    assert plain["disruptions"] >= 1 and kept["disruptions"] == 0
    assert plain["costUsd"] < kept["costUsd"] < plain["costUsd"] + 0.6 and kept["duplicateLaunches"] == 0
