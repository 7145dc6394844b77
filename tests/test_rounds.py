"""The controller's round state objects (gpuscale.controller.rounds): the scale-up state and its check mode, the
observation cache, replacements and reports; the scale-up's re-plan bound through the shell; the property that a
skipped plan would have launched nothing new."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuscale.controller.availability import Availability
from gpuscale.controller.batching import PendingBatch
from gpuscale.controller.consolidation import Mismatch
from gpuscale.controller.loop import Controller, ControllerConfig
from gpuscale.controller.rounds import Observation, Replacements, Reports, ScaleUpState
from gpuscale.core.disruption import ActionKind, DisruptionAction, DisruptionReason
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    Disruption,
    DisruptionBudget,
    InstanceType,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
    Snapshot,
)
from gpuscale.core.plan import PlannerConfig, ScaleUpPlan
from gpuscale.core.planner import plan
from gpuscale.core.reconcile.scaleup import Gate, LaunchOrder, PlanningMemo, ScaleUpDecision
from gpuscale.core.resources import Request
from gpuscale.sim.cloud import CapacityRule, CloudBehaviour, SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Dist, Engine

OD = CapacityType.ON_DEMAND


def _it(name: str, gpus: int, price: float) -> InstanceType:
    offers = (Offering("z1", OD, price), Offering("z2", OD, price * 1.05))
    return InstanceType(name, "t", 8 * gpus, 32 * gpus * 1024, gpus, "A10", 24576, offerings=offers)


CATALOG = Catalog("rounds", (_it("g1", 1, 1.0), _it("g2", 2, 1.9), _it("g4", 4, 3.6)))
POOL = NodePool(
    "gpu",
    instance_types=("g1", "g2", "g4"),
    capacity_types=(OD,),
    disruption=Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),)),
)
FAST = CloudBehaviour(
    launch_latency=Dist.const(5.0),
    registration_latency=Dist.const(10.0),
    device_plugin_delay=Dist.const(20.0),
    deletion_latency=Dist.const(5.0),
)
CONFIG = ControllerConfig(planner=PlannerConfig(exact_solver=False))


def gpod(name: str, gpus: int) -> Pod:
    return Pod(name, request=Request(cpu_milli=1000, memory_mib=2048, gpus=gpus))


def order(seed: str) -> LaunchOrder:
    return LaunchOrder((seed,), "gpu", "g1", "z1", OD, (), "ScaleUp", 0)


# ------------------------------------------------------------------------------------------------ ScaleUpState
def test_scale_up_state_forcing_memo_and_wake_times() -> None:
    st_ = ScaleUpState(plan, PendingBatch(1.0, 10.0))
    assert not st_.force and st_.planned_on_node == {}
    st_.request_plan()
    assert st_.force
    st_.keep(PlanningMemo(static_blocked=frozenset({"p"})))
    assert st_.force  # keeping the gate's memo does not end a forced plan
    st_.planned(PlanningMemo(planned_on_node={"p": "n"}))
    assert not st_.force and st_.planned_on_node == {"p": "n"}
    av = Availability()
    av.mark_unavailable(OfferingKey("g1", "z1", OD), 50.0)
    assert st_.wake_times(av) == []  # no batch open, nothing pending: no wake-up
    st_.batch.update(["p"], 3.0)
    assert st_.wake_times(av) == [4.0, 50.0]
    st_.batch.update([], 3.5)  # the pod was bound: the batch stays open with nothing pending, no expiry counts
    assert st_.wake_times(av) == [4.0]


def test_check_mode_records_only_launches_the_last_plan_did_not_decide() -> None:
    st_ = ScaleUpState(plan, PendingBatch(1.0, 10.0), check=True)
    st_.planned(PlanningMemo(last_plan_at=0.0, planned_on_node={"p": "n1"}, seeds=frozenset({("a",)})))
    same = ScaleUpDecision((order("a"),), {}, (), 0, False)
    st_.compare(1.0, Gate.UNCHANGED, same, 30.0)
    st_.compare(1.0, Gate.COVERED, ScaleUpDecision((), {}, (), 0, False), 30.0)
    assert st_.mismatches == [] and st_.checked == {Gate.UNCHANGED: 1, Gate.COVERED: 1}
    st_.compare(2.0, Gate.COVERED, ScaleUpDecision((order("a"), order("b")), {}, (), 0, False), 30.0)
    (m,) = st_.mismatches
    assert (m.at, m.what, m.reference) == (2.0, "skipped plan (covered)", (("b",),))
    # the exception: a pod the last plan put on an existing node, less than replanInterval ago
    for_p = replace(order("c"), pods=("p",))
    st_.compare(3.0, Gate.COVERED, ScaleUpDecision((for_p,), {}, (), 0, False), 30.0)
    assert len(st_.mismatches) == 1 and st_.excused == 1
    st_.compare(31.0, Gate.COVERED, ScaleUpDecision((for_p,), {}, (), 0, False), 30.0)
    assert len(st_.mismatches) == 2 and st_.excused == 1
    # p (the exception's) moves to a node in flight and q, launched for there, needs a node: with the plan without
    # p (given by replan) the launch for q is the exception's; a launch that plan still wants is not
    for_q, for_r = replace(order("q"), pods=("q",)), replace(order("r"), pods=("r",))
    moves_p = ScaleUpDecision((for_q, for_r), {"p": "in-flight"}, (), 0, False)
    asked: list[frozenset[str]] = []

    def replan(moved: frozenset[str]) -> ScaleUpDecision:
        asked.append(moved)
        return ScaleUpDecision((for_r,), {}, (), 0, False)

    st_.compare(4.0, Gate.COVERED, moves_p, 30.0, pending={"p", "q", "r"}, replan=replan)
    assert asked == [frozenset({"p"})] and st_.excused == 2
    assert st_.mismatches[-1] == Mismatch(4.0, "skipped plan (covered)", (), (("r",),))
    # p still placed where the last plan put it: the exception played no part, nothing is re-planned
    st_.compare(5.0, Gate.COVERED, replace(moves_p, placed={"p": "n1"}), 30.0, pending={"p", "q"}, replan=replan)
    assert len(asked) == 1 and st_.mismatches[-1].reference == (("q",), ("r",))


# ------------------------------------------------------------------------------------------------- Observation
def test_observation_recognises_only_the_same_immutable_lists() -> None:
    obs = Observation(None)
    listed = tuple(["n1"])
    assert not obs.same_nodes(listed)
    obs.keep_nodes(listed, {})
    assert obs.same_nodes(listed) and not obs.same_nodes(tuple(["n1"]))  # an equal list, not the same one
    obs.keep_nodes(["n1"], {})  # a list may change in place: never recognised
    assert not obs.same_nodes(None) and obs.nodes_list is None
    cloud = ()
    obs.keep_cloud(cloud, [])
    assert obs.sync_needed(3)
    obs.synced_with({"k"}, settled=True, claims_version=3)
    assert obs.unlisted == {"k"} and not obs.sync_needed(3)
    assert obs.sync_needed(4) and obs.synced is None  # the claims changed: sync, and forget the shortcut
    obs.synced_with(set(), settled=False, claims_version=4)
    assert obs.sync_needed(4)
    obs.keep_cloud([], [])  # a list from the provider: the sync is never skipped
    obs.synced_with(set(), settled=True, claims_version=4)
    assert obs.sync_needed(4)


# ------------------------------------------------------------------------------------------ Replacements, Reports
def test_replacements_and_reports() -> None:
    reps = Replacements()
    action = DisruptionAction(ActionKind.REPLACE, "old", "gpu", DisruptionReason.UNDERUTILIZED, "m")
    reps.start("old", ("r1", "r2"), action)
    assert reps.progress() == {"old": (("r1", "r2"), str(DisruptionReason.UNDERUTILIZED))}
    reps.drop("old")
    reps.drop("old")
    assert reps.progress() == {}
    reps.involuntary.add("k")
    reps.finished("k")
    assert reps.involuntary == set()
    rep = Reports()
    assert rep.changed("pod/a", "TooLarge") and not rep.changed("pod/a", "TooLarge")
    assert rep.changed("pod/a", "NoOffering") and rep.changed("node/n", "Kept")
    rep.forget("node/n")
    assert rep.changed("node/n", "Kept")
    rep.changed("pod/b", "X")
    rep.prune_pods(["b"])
    assert set(rep.last) == {"node/n", "pod/b"}
    rep.changed("pod/c", "Y")
    rep.prune_pods(["c"])  # b is no longer pending: forgotten, reported again
    assert set(rep.last) == {"node/n", "pod/c"} and rep.changed("pod/b", "X")
    rep.forget("pod/c")
    rep.prune_pods([])
    assert set(rep.last) == {"node/n"} and rep.changed("pod/c", "Y") and not rep.changed("node/n", "Kept")


# --------------------------------------------------------------------------------------- through the controller
def _controller(
    behaviour: CloudBehaviour, config: ControllerConfig, planner: object = plan, *, check: bool = False
) -> tuple[Engine, SimCluster, Controller]:
    engine = Engine()
    cluster = SimCluster(engine, CATALOG, [POOL], seed=1)
    cloud = SimCloud(engine, CATALOG, behaviour, seed=1, listener=cluster)
    ctrl = Controller(cluster, cloud, [POOL], CATALOG, engine.clock, config, planner=planner, check_plan=check)  # type: ignore[arg-type]
    return engine, cluster, ctrl


def test_capacity_errors_replan_at_once_at_most_max_replans_times_a_round() -> None:
    out = replace(FAST, capacity=(CapacityRule(0),))  # no offering has capacity
    calls: list[float] = []

    def counting(s: Snapshot, c: PlannerConfig, now: float) -> ScaleUpPlan:
        calls.append(now)
        return plan(s, c, now)

    for bound, plans in ((1, [1, 1]), (3, [3, 3]), (6, [6, 1])):
        engine, cluster, ctrl = _controller(out, replace(CONFIG, max_replans=bound, batch_idle_s=0.0), counting)
        cluster.add_pod(gpod("a", 1), 600.0)
        rounds = []
        for t in (1.0, 2.0):
            engine.run_until(t)
            before = len(calls)
            ctrl.reconcile()
            rounds.append(len(calls) - before)
        # 6 offerings: each plan's launch fails, marks its offering and re-plans, until the bound or none is left
        assert rounds == plans, (bound, rounds)
        assert len(ctrl.availability.offerings) == min(6, sum(rounds))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.floats(0, 200), st.floats(20, 400), st.sampled_from([1, 1, 2, 3, 4])),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from([0.0, 2.0]),
)
@example([(0.0, 20.0, 3), (0.0, 22.0, 1), (22.0, 20.0, 3), (22.0, 20.0, 1), (56.0, 20.0, 4)], 0.0)
@example([(0.0, 20.0, 1)] * 4 + [(2.0, 20.0, 2), (2.0, 20.0, 3)], 0.0)  # the exception's pod moves another pod
def test_a_skipped_plan_would_have_launched_nothing_new(pods: list[tuple[float, float, int]], idle: float) -> None:
    engine, cluster, ctrl = _controller(FAST, replace(CONFIG, batch_idle_s=idle), check=True)
    for i, (at, duration, gpus) in enumerate(pods):
        engine.at(at, cluster.add_pod, gpod(f"p{i}", gpus), duration)
    t = 0.0
    while t < 600.0:
        t += 1.0
        engine.run_until(t)
        ctrl.reconcile()
    assert ctrl.scaleup.mismatches == []


def test_the_skip_check_sees_skips_of_both_kinds() -> None:
    """The property above is not vacuous: with pods arriving while nodes come up, plans are skipped as covered and
    as unchanged, and each skip is compared."""
    engine, cluster, ctrl = _controller(FAST, replace(CONFIG, batch_idle_s=0.0), check=True)
    for i in range(6):
        engine.at(2.0 * i, cluster.add_pod, gpod(f"p{i}", 1 + i % 3), 300.0)
    engine.at(3.0, cluster.add_pod, gpod("huge", 16), 300.0)
    t = 0.0
    while t < 120.0:
        t += 1.0
        engine.run_until(t)
        ctrl.reconcile()
    assert ctrl.scaleup.mismatches == []
    assert ctrl.scaleup.checked.get(Gate.COVERED, 0) > 0 and ctrl.scaleup.checked.get(Gate.UNCHANGED, 0) > 0


def test_the_exception_is_real() -> None:
    """A g4 in flight for p2 and p3 is planned for p4 (p3 gets a new node); the scheduler binds p3 there first. p4
    stays covered by its fresh placement until replanInterval ends: the check counts it as the exception allows."""
    engine, cluster, ctrl = _controller(FAST, replace(CONFIG, batch_idle_s=0.0), check=True)
    pods = [(0.0, 20.0, 3), (0.0, 22.0, 1), (22.0, 20.0, 3), (22.0, 20.0, 1), (56.0, 20.0, 4)]
    for i, (at, duration, gpus) in enumerate(pods):
        engine.at(at, cluster.add_pod, gpod(f"p{i}", gpus), duration)
    t = 0.0
    while t < 200.0:
        t += 1.0
        engine.run_until(t)
        ctrl.reconcile()
    assert ctrl.scaleup.mismatches == [] and ctrl.scaleup.excused > 0
    assert [p.key for p in cluster.list_pods() if p.phase == "Pending"] == []  # p4 was planned again and ran
