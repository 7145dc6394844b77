"""The demand-anticipating scale-up's pure decisions (:mod:`gpuscale.core.anticipate`) and its setting's reader."""

from __future__ import annotations

import pytest

from builders import OD, catalog, itype, pod, pool
from gpuscale.controller.config import ControllerConfig
from gpuscale.core.anticipate import (
    LOWEST_PRIORITY,
    AnticipateSpec,
    anticipated,
    expected_pods,
    is_anticipated,
    weigh,
    without_anticipated,
)
from gpuscale.core.model import Snapshot
from gpuscale.core.plan import Blocked, BlockReason, PlannerConfig
from gpuscale.core.planner import plan
from gpuscale.core.reconcile.scaleup import LaunchOrder, ScaleUpDecision, decide_scale_up
from gpuscale.errors import InputError

CAT = catalog(itype("g1", 8, 32, 1, "T4", price=0.6), itype("g4", 32, 128, 4, "T4", price=2.0))
SPEC = AnticipateSpec(lead_s=600.0, recent_windows=6, max_extra_gpus=8)


def _order(it: str, *pods: str, group: int = 0) -> LaunchOrder:
    return LaunchOrder(("up", "gpu", it, "z1", "on-demand", *pods), "gpu", it, "z1", OD, tuple(pods), "ScaleUp", group)


def _decision(*orders: LaunchOrder, placed: dict[str, str] | None = None) -> ScaleUpDecision:
    return ScaleUpDecision(orders, placed or {}, (), 0, True)


def _arrivals(*spec: tuple[float, int]) -> tuple[list[float], list]:
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
    ("plain", "more", "expected", "spec", "take", "why"),
    [
        # the planner put the expected pod in room the plain plan's node had anyway: same cost, plain kept
        (_decision(_order("g4", "p")), _decision(_order("g4", "p", X)), [X], SPEC, False, "no room bought"),
        # a 4-GPU node instead of a 1-GPU one for 3 expected GPUs: +$1.40/h over 10 min ($0.23) against
        # 3 x 200 s x ($4 + $0.50) = $0.75 of cold starts
        (_decision(_order("g1", "p")), _decision(_order("g4", "p", X, Y, Z)), [X, Y, Z], SPEC, True, "taken"),
        # one more 1-GPU node for one expected pod: $0.10 against 200 s x ($4 + $0.60) = $0.26
        (_decision(_order("g1", "p")), _decision(_order("g1", "p"), _order("g1", X)), [X], SPEC, True, "taken"),
        # the same when waiting costs nothing and the room must wait an hour: $0.60 against $0.03
        (
            _decision(_order("g1", "p")),
            _decision(_order("g1", "p"), _order("g1", X)),
            [X],
            AnticipateSpec(lead_s=3600.0, wait_cost_per_gpu_hour=0.0),
            False,
            "does not pay",
        ),
        # more GPUs than maxExtraGpus
        (
            _decision(_order("g1", "p")),
            _decision(_order("g4", "p", X, Y, Z)),
            [X, Y, Z],
            AnticipateSpec(max_extra_gpus=2),
            False,
            "maxExtraGpus=2",
        ),
        # a real pod the plain plan places is not placed with the expected pods (e.g. a pool limit): plain kept
        (
            _decision(_order("g1", "p"), _order("g1", "q")),
            _decision(_order("g4", "p", X, Y, Z)),
            [X, Y, Z],
            SPEC,
            False,
            "1 pending pod(s)",
        ),
        # a real pod placed on an existing node by one plan and on a new node by the other is still placed
        (
            _decision(_order("g1", "p"), placed={"q": "n1"}),
            _decision(_order("g4", "p", "q", X, Y), placed={}),
            [X, Y],
            SPEC,
            True,
            "taken",
        ),
    ],
)
def test_weigh(
    plain: ScaleUpDecision, more: ScaleUpDecision, expected: list[str], spec: AnticipateSpec, take: bool, why: str
) -> None:
    pods = [anticipated(pod(k.rsplit("/", 1)[1], gpus=1)) for k in expected]
    v = weigh(plain, more, pods, CAT, spec)
    assert v.take is take
    assert why in v.reason


def test_weigh_figures() -> None:
    pods = [anticipated(pod(n, gpus=1)) for n in "xyz"]
    v = weigh(_decision(_order("g1", "p")), _decision(_order("g4", "p", X, Y, Z)), pods, CAT, SPEC)
    assert v.extra_gpus == 3 and v.extra_hourly == pytest.approx(1.4)
    assert v.spent == pytest.approx(1.4 / 6)
    assert v.saved == pytest.approx(3 * 200 / 3600 * (4 + 0.5))


# ------------------------------------------------------------------------------------------------ strip
def test_without_anticipated_strips_expected_pods_and_launches_real_pods_first() -> None:
    d = ScaleUpDecision(
        (_order("g1", X, group=0), _order("g4", "p", X, Y, group=1), _order("g1", "q", group=2)),
        {X: "n1", "r": "n2"},
        (Blocked(Z, BlockReason.TOO_LARGE, "no"), Blocked("s", BlockReason.TOO_LARGE, "no")),
        0,
        True,
    )
    out = without_anticipated(d, [anticipated(pod(n, gpus=1)) for n in "xyz"])
    assert [(o.instance_type, o.pods, o.group) for o in out.launches] == [
        ("g1", ("q",), 2),
        ("g4", ("p",), 1),
        ("g1", (), 0),
    ]
    assert out.launches[2].seed == d.launches[0].seed  # the seed keeps the expected pod: same request id next time
    assert out.placed == {"r": "n2"}
    assert [b.pod for b in out.blocked] == ["s"]
    assert without_anticipated(d, []) is d


def test_the_planner_buys_a_bigger_node_for_expected_pods() -> None:
    """One pending 1-GPU pod and three expected: the plan with them buys one 4-GPU node ($2.00/h) instead of a 1-GPU
    one ($0.60/h): four 1-GPU nodes would cost $2.40/h."""
    snap = Snapshot(pods=(pod("p", gpus=1),), nodes=(), pools=(pool("gpu"),), catalog=CAT)
    plain = decide_scale_up(snap, plan, PlannerConfig(), 0.0)
    assert [(o.instance_type, o.pods) for o in plain.launches] == [("g1", ("default/p",))]
    expected = tuple(anticipated(pod(n, gpus=1)) for n in "xyz")
    more = decide_scale_up(Snapshot(snap.pods + expected, (), snap.pools, CAT), plan, PlannerConfig(), 0.0)
    v = weigh(plain, more, expected, CAT, SPEC)
    assert v.take and v.extra_gpus == 3
    out = without_anticipated(more, expected)
    assert [(o.instance_type, o.pods) for o in out.launches] == [("g4", ("default/p",))]


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
