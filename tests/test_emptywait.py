"""The per-node empty wait (``emptyWait``): which arriving pods fit an empty node, what each saves, when a node is
kept (cheap shapes many pods fit) or let go (expensive shapes few pods fit), when the decision changes with time
alone, the time-of-day forecast, and the validation of the setting."""

from __future__ import annotations

import math

import pytest

from builders import node, pod, taint
from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.emptykeep import EmptyWaits
from gpuscale.controller.shell import World
from gpuscale.core import labels as L
from gpuscale.core.emptywait import (
    DAY_S,
    EVIDENCE_PRIOR_H,
    LEARN_MEMORY_S,
    NEEDY_S,
    EmptyWait,
    EmptyWaitSpec,
    Outcomes,
    Released,
    Shape,
    empty_wait,
    evidence_rate,
    fits,
    landing_rate,
    pod_saving,
    settle_released,
)
from gpuscale.core.model import CapacityType, Disruption, NodePool, Pod
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.core.resources import Resources
from gpuscale.errors import InputError
from gpuscale.sim.policies import _config

ONE = Shape(Resources(8000, 32768, 1), 0.6, {L.GPU_PRODUCT: "T4"}, (), "T4")
EIGHT = Shape(Resources(96000, 786432, 8), 20.0, {L.GPU_PRODUCT: "V100"}, (), "V100")
SPEC = EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, wait_cost_per_gpu_hour=0.0)
"""Each 1-GPU pod saves 380 s of the $0.60/h node: $0.0633; ten in an hour pay for it, nine do not."""


def arrivals(*items: tuple[float, Pod]) -> tuple[list[float], list[Pod]]:
    return [t for t, _ in items], [p for _, p in items]


@pytest.mark.parametrize(
    ("p", "shape", "ok"),
    [
        (pod("a", 2000, 4096, gpus=1), ONE, True),
        (pod("b", 2000, 4096, gpus=2), ONE, False),  # more GPUs than the node has
        (pod("c", 9000, 4096, gpus=1), ONE, False),  # more CPU
        (pod("d", 2000, 40000, gpus=1), ONE, False),  # more memory
        (pod("e", 2000, 4096, milli=500), ONE, True),  # a fraction of one GPU
        (pod("f", 2000, 4096, gpus=1, models=frozenset({"V100"})), ONE, False),  # GPU model
        (pod("g", 2000, 4096, gpus=1, models=frozenset({"T4", "V100"})), ONE, True),
        (pod("h", 2000, 4096, gpus=1, selector={"zone": "b"}), ONE, False),  # node selector
        (pod("i", 2000, 4096), Shape(Resources(8000, 32768, 1), 0.6, {}, (taint("gpu"),)), False),  # taint
        (pod("j", 2000, 4096, milli=300), Shape(Resources(8000, 32768, 0), 0.1), False),  # GPU pod, CPU node
    ],
)
def test_fits_checks_requests_gpu_model_selectors_and_taints(p: Pod, shape: Shape, ok: bool) -> None:
    assert fits(p, shape) is ok


def test_a_pod_saves_its_share_of_the_node_over_a_cold_start_and_its_waiting() -> None:
    spec = EmptyWaitSpec(cold_start_s=360.0, wait_cost_per_gpu_hour=2.0)
    # 0.1 h x ($0.60 x 1/1 + $2 x 1 GPU)
    assert pod_saving(pod("a", gpus=1), ONE, spec) == pytest.approx(0.26)
    # 0.1 h x ($20 x 2/8 + $2 x 2 GPUs)
    assert pod_saving(pod("b", gpus=2), EIGHT, spec) == pytest.approx(0.9)
    # half a GPU: 0.1 h x ($0.60 x 0.5 + $2 x 0.5)
    assert pod_saving(pod("c", milli=500), ONE, spec) == pytest.approx(0.13)


def test_a_cheap_popular_shape_is_kept_and_an_expensive_rarely_fitting_one_is_not() -> None:
    # six 1-GPU pods in the last hour
    ps = [(3600.0 + 500 * k, pod(f"p{k}", 2000, 4096, gpus=1)) for k in range(6)]
    times, pods = arrivals(*ps)
    now = 7000.0
    spec = EmptyWaitSpec(window_s=3600.0, cold_start_s=360.0, wait_cost_per_gpu_hour=0.5)
    one = empty_wait(times, pods, 0.0, now, ONE, spec)
    # saving: 6 pods x 0.1 h x ($0.60 + $0.50) = $0.66 in the hour >= $0.60/h
    assert one.saving_per_hour == pytest.approx(0.66)
    assert one.wait_s == spec.max_wait_s and "kept" in one.reason
    eight = empty_wait(times, pods, 0.0, now, EIGHT, spec)
    # on the 8-GPU node each saves 0.1 h x ($20/8 + $0.50) = $0.30: $1.80/h against $20/h
    assert eight.saving_per_hour == pytest.approx(1.8)
    assert eight.wait_s is None and "not kept" in eight.reason


def test_without_a_wait_cost_only_many_arrivals_pay_for_a_kept_node() -> None:
    now = 3600.0
    few = arrivals(*[(100.0 * k + 50, pod(f"p{k}", gpus=1)) for k in range(9)])
    many = arrivals(*[(100.0 * k + 50, pod(f"p{k}", gpus=1)) for k in range(10)])
    # $0.0633 a pod: ten pods in an hour pay for the $0.60/h node, nine do not
    assert empty_wait(*few, 0.0, now, ONE, SPEC).wait_s is None
    assert empty_wait(*many, 0.0, now, ONE, SPEC).wait_s == SPEC.max_wait_s


def test_pods_that_do_not_fit_do_not_count() -> None:
    now = 3600.0
    times, pods = arrivals(*[(100.0 * k, pod(f"p{k}", gpus=2)) for k in range(30)])
    d = empty_wait(times, pods, 0.0, now, ONE, SPEC)
    assert d.saving_per_hour == 0.0 and d.wait_s is None and d.until == math.inf


def test_a_kept_node_is_looked_at_again_when_its_oldest_arrivals_leave_the_window() -> None:
    # eleven pods at 0, 100, ..., 1000 s ($0.70/h at 3000 s): the first leaving the window (t=0, at 3600 s) leaves
    # ten (still kept), the second (t=100, at 3700 s) nine: looked at again then, and let go
    times, pods = arrivals(*[(100.0 * k, pod(f"p{k}", gpus=1)) for k in range(11)])
    d = empty_wait(times, pods, 0.0, 3000.0, ONE, SPEC)
    assert d.wait_s == SPEC.max_wait_s
    assert d.until == pytest.approx(3700.0)
    assert empty_wait(times, pods, 0.0, 3650.0, ONE, SPEC).wait_s == SPEC.max_wait_s
    assert empty_wait(times, pods, 0.0, 3700.0, ONE, SPEC).wait_s is None


def test_time_of_day_counts_the_coming_window_of_past_days() -> None:
    spec = EmptyWaitSpec(window_s=3600.0, cold_start_s=360.0, days=2)
    now = 2 * DAY_S + 10 * 3600.0
    # on each of the two past days, twelve 1-GPU pods arrived between 10:00 and 11:00; none in the last hour
    items = [(d * DAY_S + 10 * 3600.0 + 300.0 * k + 60, pod(f"d{d}p{k}", gpus=1)) for d in (0, 1) for k in range(12)]
    times, pods = arrivals(*items)
    d = empty_wait(times, pods, 0.0, now, ONE, spec)
    assert d.saving_per_hour == pytest.approx(12 * 0.06)
    assert d.wait_s == spec.max_wait_s and "2 day(s)" in d.reason
    assert d.until == now + 900.0  # the seasonal forecast moves with the clock: a look a quarter window on
    # before the history covers a past day, that day does not count
    assert empty_wait(times, pods, now - 1.5 * DAY_S, now, ONE, spec).saving_per_hour == pytest.approx(12 * 0.06)
    assert empty_wait(times, pods, now - 0.5 * DAY_S, now, ONE, spec).wait_s is None
    # without days only the recent hour counts
    assert empty_wait(times, pods, 0.0, now, ONE, EmptyWaitSpec(cold_start_s=360.0)).wait_s is None


def test_empty_nodes_of_one_shape_share_its_arrivals() -> None:
    # twenty pods in the hour: $1.27/h of saving pays for two $0.60/h nodes of the shape, not for a third
    times, pods = arrivals(*[(100.0 * k + 50, pod(f"p{k}", gpus=1)) for k in range(20)])
    assert empty_wait(times, pods, 0.0, 3600.0, ONE, SPEC, rank=2).wait_s == SPEC.max_wait_s
    third = empty_wait(times, pods, 0.0, 3600.0, ONE, SPEC, rank=3)
    assert third.wait_s is None and "x 3 (empty node 3 of its shape)" in third.reason


def test_margin_asks_for_more_saving_than_the_price() -> None:
    times, pods = arrivals(*[(100.0 * k + 50, pod(f"p{k}", gpus=1)) for k in range(10)])
    assert empty_wait(times, pods, 0.0, 3600.0, ONE, SPEC).wait_s == SPEC.max_wait_s
    spec = EmptyWaitSpec(cold_start_s=380.0, margin=1.5)
    assert empty_wait(times, pods, 0.0, 3600.0, ONE, spec).wait_s is None


# ------------------------------------------------------------------------------------------------ learning
@pytest.mark.parametrize(
    ("prior", "outcomes", "rate"),
    [
        (10.0, Outcomes(), 10.0),  # nothing seen: the arrivals' rate
        (10.0, Outcomes(kept_h=1.0, landings=2.0), 4.0 / 1.2),  # (2 + 2) / (2/10 + 1)
        (10.0, Outcomes(kept_h=100.0, landings=300.0), 302.0 / 100.2),  # much seen: the landings per hour kept
        (2.0, Outcomes(kept_h=10.0, landings=60.0), 62.0 / 11.0),  # more landings than arrivals said: raised too
        (0.0, Outcomes(kept_h=10.0, landings=60.0), 0.0),  # nothing that fits arrives
    ],
)
def test_the_landing_rate_moves_from_the_arrivals_to_what_keeping_did(
    prior: float, outcomes: Outcomes, rate: float
) -> None:
    assert landing_rate(prior, outcomes) == pytest.approx(rate)


def test_outcomes_add_up_and_fade() -> None:
    o = Outcomes().add(1800.0, False).add(1800.0, True)
    assert o == Outcomes(kept_h=1.0, landings=1.0)
    assert o.decayed(0.0) is o
    assert o.decayed(LEARN_MEMORY_S) == pytest.approx(Outcomes(kept_h=math.exp(-1), landings=math.exp(-1)))


def test_a_shape_whose_kept_nodes_wait_long_for_a_pod_is_no_longer_kept() -> None:
    # twenty 1-GPU pods in the hour ($0.0633 each: $1.27/h against $0.60/h): kept on the arrivals alone
    times, pods = arrivals(*[(100.0 * k + 50, pod(f"p{k}", gpus=1)) for k in range(20)])
    spec = EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, learn=True)
    assert empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 1, Outcomes()).wait_s == 1800.0
    # kept nodes of the shape were landed on 4 times in 10 hours: (2 + 4) / (2/20 + 10) = 0.59 pods/h, $0.04/h
    slow = empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 1, Outcomes(kept_h=10.0, landings=4.0))
    assert slow.wait_s is None and slow.saving_per_hour == pytest.approx(6 / 10.1 * 380 / 3600 * 0.6)
    assert "learned: 0.59 pod(s)/h" in slow.reason and "not kept" in slow.reason
    # the learned saving moves either way as arrivals leave: looked at again when the first one does
    assert slow.until == pytest.approx(3650.0)
    # ... 150 times in 10 hours: kept, looked at again when the first arrival leaves the window
    fast = empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 1, Outcomes(kept_h=10.0, landings=150.0))
    assert fast.wait_s == 1800.0 and fast.until == pytest.approx(3650.0)
    # without learn the outcomes are not read
    off = EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0)
    assert empty_wait(times, pods, 0.0, 3600.0, ONE, off, 1, Outcomes(kept_h=10.0, landings=4.0)).wait_s == 1800.0


def test_learning_reads_the_landings_per_node_so_the_rank_is_in_the_prior_only() -> None:
    times, pods = arrivals(*[(100.0 * k + 50, pod(f"p{k}", gpus=1)) for k in range(20)])
    spec = EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, learn=True)
    # the third empty node: $1.27/h does not pay three times $0.60/h, and with nothing seen the rule says the same
    assert empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 3, Outcomes()).wait_s is None
    # but kept nodes of the shape were landed on 12 times an hour: each pays its own price
    busy = Outcomes(kept_h=10.0, landings=120.0)
    assert empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 3, busy).wait_s == 1800.0


def test_the_controller_counts_hours_kept_and_landings_per_shape() -> None:
    ew = EmptyWaits(EmptyWaitSpec(learn=True), 0.0)
    kept = EmptyWait(1800.0, 1.0, math.inf, "kept")

    def world(now: float, nodes: dict[str, list[Pod]]) -> World:
        pods = [p for ps in nodes.values() for p in ps]
        return World(now, pods, {n: node(n, 8000, 32768, 1) for n in nodes}, [], [], [], {})

    w = world(0.0, {})
    ew._learn(w, w.by_node())  # the first step: nothing to add
    ew.decisions = {"a": kept, "b": kept, "c": EmptyWait(None, 0.0, math.inf, "no")}
    ew._kinds = {"a": ("gpu", "g1"), "b": ("gpu", "g1"), "c": ("gpu", "g1")}
    # 30 minutes on: a pod is on a, b is still empty, c was not kept (and is gone)
    w = world(1800.0, {"a": [pod("x", gpus=1, node="a")], "b": []})
    ew._learn(w, w.by_node())
    o = ew.outcomes[("gpu", "g1")]
    assert o.kept_h == pytest.approx(1.0) and o.landings == 1.0 and ew.stats.landed == 1
    # b deleted 30 minutes later: half an hour more, no landing; the older outcomes fade
    ew.decisions = {"b": kept}
    w = world(3600.0, {})
    ew._learn(w, w.by_node())
    f = math.exp(-1800.0 / LEARN_MEMORY_S)
    assert ew.outcomes[("gpu", "g1")] == pytest.approx(Outcomes(kept_h=f + 0.5, landings=f))


# ------------------------------------------------------------------------------------------------ learnReleased
G1 = ("gpu", "g1")
G8 = ("gpu", "g8")


def released(node: str, start: float, shape: Shape = ONE, kind: tuple[str, str] = G1) -> Released:
    return Released(node, kind, start, shape)


@pytest.mark.parametrize(
    ("episodes", "needy", "now", "closed", "still"),
    [
        # a needy 1-GPU pod 10 minutes after the node was let go: a landing after 600 s
        ([released("a", 0.0)], [(600.0, pod("p", gpus=1))], 700.0, [(G1, 600.0, True)], []),
        # none came: open until max wait + settle (1800 + 60 s), then closed after the max wait without a landing
        ([released("a", 0.0)], [], 1860.0, [], ["a"]),
        ([released("a", 0.0)], [], 1861.0, [(G1, 1800.0, False)], []),
        # a pod needy before the node was let go, or after the max wait, lands on nothing
        ([released("a", 100.0)], [(50.0, pod("p", gpus=1)), (1950.0, pod("q", gpus=1))], 1955.0, [], ["a"]),
        # one pod closes one episode, the oldest it fits (the 8-GPU node's); the 4-GPU pod then fits none left
        (
            [released("b", 200.0), released("a", 100.0), released("c", 50.0, EIGHT, G8)],
            [(300.0, pod("p", gpus=1)), (400.0, pod("q", gpus=4))],
            500.0,
            [(G8, 250.0, True)],
            ["a", "b"],
        ),
        ([released("a", 0.0)], [(60.0, pod("big", gpus=2))], 100.0, [], ["a"]),
    ],
)
def test_released_nodes_are_settled_against_the_pods_that_had_to_wait_for_a_node(
    episodes: list[Released],
    needy: list[tuple[float, Pod]],
    now: float,
    closed: list[tuple[tuple[str, str], float, bool]],
    still: list[str],
) -> None:
    left, got = settle_released(episodes, needy, now, 1800.0, 2 * NEEDY_S)
    assert got == closed and [e.node for e in left] == still


@pytest.mark.parametrize(
    ("outcomes", "rate"),
    [
        (Outcomes(), 0.0),  # no evidence: nothing lands
        (Outcomes(kept_h=1.5, landings=6.0), 6.0 / (1.5 + EVIDENCE_PRIOR_H)),
        (Outcomes(kept_h=100.0, landings=300.0), 300.0 / (100.0 + EVIDENCE_PRIOR_H)),
    ],
)
def test_the_evidence_rate_is_the_landings_over_the_hours_kept_and_a_prior_of_nothing(
    outcomes: Outcomes, rate: float
) -> None:
    assert evidence_rate(outcomes) == pytest.approx(rate)


def test_with_learn_released_only_evidence_keeps_a_node() -> None:
    # twenty 1-GPU pods in the hour: kept by the arrivals alone ($1.27/h against $0.60/h), but not without evidence
    times, pods = arrivals(*[(100.0 * k + 50, pod(f"p{k}", gpus=1)) for k in range(20)])
    spec = EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, learn_released=True)
    assert spec.learns
    none = empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 1, Outcomes())
    assert none.wait_s is None and "evidence: 0.00 pod(s)/h" in none.reason and none.until == pytest.approx(3650.0)
    # 9.5 landings per hour kept or let go: 9.5 x $0.0633 = $0.60/h pays the $0.60/h node; 9 do not
    per_pod = 380 / 3600 * 0.6
    paying = empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 3, Outcomes(kept_h=10.0, landings=9.5 * 10.5))
    assert paying.wait_s == 1800.0 and paying.saving_per_hour == pytest.approx(9.5 * per_pod)  # the rank is in it
    short = empty_wait(times, pods, 0.0, 3600.0, ONE, spec, 1, Outcomes(kept_h=10.0, landings=9.0 * 10.5))
    assert short.wait_s is None
    # no fitting arrival in the window: nothing to save, whatever the evidence
    assert empty_wait([], [], 0.0, 3600.0, ONE, spec, 1, Outcomes(kept_h=1.0, landings=100.0)).wait_s is None


def test_the_controller_learns_from_released_nodes_and_pods_that_waited_for_a_node() -> None:
    """Released empty nodes open would-be episodes; a pod still pending ``NEEDY_S`` after first seen closes the oldest
    it fits as a landing; a pod bound before then (it found room) closes none."""
    spec = EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, learn_released=True)
    ew = EmptyWaits(spec, 0.0)
    claims = ClaimTable()
    claims["r1"] = NodeClaim(
        "r1", "gpu", "g1", "z1", CapacityType.ON_DEMAND, ClaimPhase.INITIALIZED, hourly_price=0.6, node_name="e"
    )
    e = node("e", 8000, 32768, 1, "T4")

    def step(now: float, pods: list[Pod], nodes: dict[str, object]) -> None:
        w = World(now, pods, nodes, [], [], [], {})  # type: ignore[arg-type]
        ew.observe(w)
        ew.decide(w, claims)

    step(0.0, [], {"e": e})
    assert ew.decisions["e"].wait_s is None and set(ew.released) == {"e"}  # no evidence: let go, episode open
    step(10.0, [], {})  # the node is gone; its episode stays open
    fast, slow = pod("fast", gpus=1), pod("slow", gpus=1)
    step(100.0, [fast, slow], {})
    step(120.0, [pod("fast", gpus=1, node="n2"), slow], {})  # fast found room
    assert ew.outcomes == {}
    step(140.0, [slow], {})  # slow still pending 40 s after first seen: needy, lands on e's episode after 100 s
    assert ew.outcomes[G1] == pytest.approx(Outcomes(kept_h=100.0 / 3600.0, landings=1.0))
    assert ew.released == {} and ew.needy == [] and ew.stats.landed == 1


def test_a_restarted_controller_with_learn_released_keeps_nothing_until_it_has_evidence() -> None:
    claims = ClaimTable()
    claims["r1"] = NodeClaim(
        "r1", "gpu", "g1", "z1", CapacityType.ON_DEMAND, ClaimPhase.INITIALIZED, hourly_price=0.6, node_name="e"
    )
    ew = EmptyWaits(EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, learn_released=True), 0.0)
    arrived = [pod(f"p{k}", gpus=1) for k in range(20)]
    ew.times, ew.pods = [100.0 * k + 50 for k in range(20)], arrived
    got = ew.decide(World(3600.0, list(arrived), {"e": node("e", 8000, 32768, 1, "T4")}, [], [], [], {}), claims)
    assert got["e"].wait_s is None


# ------------------------------------------------------------------------------------------------ settings
def test_empty_wait_parses_and_is_off_by_default() -> None:
    assert ControllerConfig.from_policy({}).empty_wait is None
    assert ControllerConfig.from_policy({"emptyWait": False}).empty_wait is None
    assert ControllerConfig.from_policy({"emptyWait": True}).empty_wait == EmptyWaitSpec()
    cfg = ControllerConfig.from_policy(
        {"emptyWait": {"maxWait": "20m", "window": "2h", "coldStart": 180, "waitCostPerGpuHour": 1.5, "days": 7}}
    )
    assert cfg.empty_wait == EmptyWaitSpec(1200.0, 7200.0, 180.0, 1.5, 7)
    assert ControllerConfig.from_policy({"emptyWait": {"learn": True}}).empty_wait == EmptyWaitSpec(learn=True)
    released_spec = ControllerConfig.from_policy({"emptyWait": {"learnReleased": True}}).empty_wait
    assert released_spec == EmptyWaitSpec(learn_released=True)
    assert _config({"emptyWait": True}).empty_wait is None  # the baselines ignore it


@pytest.mark.parametrize(
    ("value", "where", "words"),
    [
        ("soon", "policy.emptyWait", "true, false or a mapping"),
        ({"wait": "5m"}, "policy.emptyWait.wait", "unknown emptyWait setting"),
        ({"maxWait": "never"}, "policy.emptyWait.maxWait", "not a duration"),
        ({"window": 0}, "policy.emptyWait.window", "positive"),
        ({"waitCostPerGpuHour": -1}, "policy.emptyWait.waitCostPerGpuHour", "number"),
        ({"days": 1.5}, "policy.emptyWait.days", "integer"),
        ({"margin": 0}, "policy.emptyWait.margin", "number"),
        ({"learn": "yes"}, "policy.emptyWait.learn", "true or false"),
        ({"learn": 1}, "policy.emptyWait.learn", "true or false"),
        ({"learnReleased": "on"}, "policy.emptyWait.learnReleased", "true or false"),
        # a number of seconds is bounded as a duration string is ("99999999h": longer than 10 years)
        ({"window": 1.0e308}, "policy.emptyWait.window", "longer than 10 years"),
        ({"maxWait": 10**30}, "policy.emptyWait.maxWait", "longer than 10 years"),
    ],
)
def test_bad_empty_wait_settings_are_one_line_errors(value: object, where: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        ControllerConfig.from_policy({"emptyWait": value})
    assert where in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------ controller side
def test_the_gate_sees_a_kept_node_with_its_wait_never_shorter_than_the_pools() -> None:
    ew = EmptyWaits(EmptyWaitSpec(max_wait_s=1200.0), 0.0)
    short = NodePool("gpu", disruption=Disruption(consolidate_after_s=300.0, consolidate_empty_after_s=0.0))
    long = NodePool("gpu", disruption=Disruption(consolidate_after_s=300.0, consolidate_empty_after_s=3600.0))
    ew.decisions = {"kept": EmptyWait(1200.0, 1.0, math.inf, "kept"), "gone": EmptyWait(None, 0.0, math.inf, "no")}
    kept = ew.pool_for("kept", short)
    assert kept is not None and kept.disruption.wait_s(True) == 1200.0 and kept.disruption.wait_s(False) == 300.0
    assert ew.pool_for("kept", short) is kept  # one copy per (pool, wait)
    assert ew.pool_for("gone", short) is short and ew.pool_for("other", short) is short
    longer = ew.pool_for("kept", long)
    assert longer is not None and longer.disruption.wait_s(True) == 3600.0
    assert ew.pool_for("kept", None) is None


def test_decisions_read_the_outcomes_of_the_last_tick_and_wake_at_the_next() -> None:
    """With ``learn``, decisions read the outcomes as they were at the last tick (every quarter window) and look
    again at the next: a decision changes only with new inputs or at a time the consolidation gate is told of."""
    spec = EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, learn=True)
    ew = EmptyWaits(spec, 0.0)
    claims = ClaimTable()
    claims["r1"] = NodeClaim(
        "r1", "gpu", "g1", "z1", CapacityType.ON_DEMAND, ClaimPhase.INITIALIZED, hourly_price=0.6, node_name="e"
    )
    arrived = [pod(f"p{k}", gpus=1) for k in range(20)]
    ew.times, ew.pods = [100.0 * k + 50 for k in range(20)], arrived

    def step(now: float) -> EmptyWait:
        w = World(now, list(arrived), {"e": node("e", 8000, 32768, 1, "T4")}, [], [], [], {})
        return ew.decide(w, claims)["e"]

    first = step(3600.0)
    assert first.wait_s == 1800.0 and first.until == pytest.approx(3650.0)  # the first arrival leaves then
    # outcomes learned since (kept 10 hours, 4 landings) are read only from the next tick, at 3600 + 900 s
    ew.outcomes[("gpu", "g1")] = Outcomes(kept_h=10.0, landings=4.0)
    assert step(3640.0).wait_s == 1800.0
    ticked = step(4500.0)
    assert ticked.wait_s is None and "learned" in ticked.reason
    assert ticked.until <= 4500.0 + 900.0


def test_a_restarted_controller_learning_decides_as_without_learn_until_it_has_seen_outcomes() -> None:
    """The outcomes live in memory: a controller restarted with ``learn`` has none, and its decisions are those of
    the rule without ``learn`` (the arrivals' rate is the prior), for the cheapest empty node and the ones after it."""
    claims = ClaimTable()
    nodes = {}
    for k in range(3):
        name = f"e{k}"
        claims[f"r{k}"] = NodeClaim(
            f"r{k}", "gpu", "g1", "z1", CapacityType.ON_DEMAND, ClaimPhase.INITIALIZED, hourly_price=0.6, node_name=name
        )
        nodes[name] = node(name, 8000, 32768, 1, "T4")
    arrived = [pod(f"p{k}", gpus=1) for k in range(20)]
    decided = []
    for learn in (False, True):
        ew = EmptyWaits(EmptyWaitSpec(max_wait_s=1800.0, window_s=3600.0, cold_start_s=380.0, learn=learn), 0.0)
        ew.times, ew.pods = [100.0 * k + 50 for k in range(20)], arrived
        got = ew.decide(World(3600.0, list(arrived), dict(nodes), [], [], [], {}), claims)
        decided.append({n: d.wait_s for n, d in got.items()})
    assert decided[0] == decided[1] and sorted(decided[0].values(), key=str) == [1800.0, 1800.0, None]
