"""``anticipate.learnUse``: the pure parts (:class:`gpuscale.core.anticipate.Use`, :func:`use_rate`,
:func:`settle_extra`, the forecast share of :func:`expected_pods`, the used share in :func:`weigh`), the controller's
bookkeeping (:class:`gpuscale.controller.anticipating.Anticipation`) and the setting's reader."""

from __future__ import annotations

import math

import pytest

from builders import OD, catalog, itype, pod
from gpuscale.controller.anticipating import Anticipation, anticipate_setting
from gpuscale.core.anticipate import (
    USE_PRIOR,
    AnticipateSpec,
    Extra,
    Use,
    anticipated,
    expected_pods,
    settle_extra,
    use_rate,
    weigh,
)
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.core.reconcile.scaleup import LaunchOrder, ScaleUpDecision
from gpuscale.errors import InputError

CAT = catalog(itype("g1", 8, 32, 1, "T4", price=0.6), itype("g4", 32, 128, 4, "T4", price=2.0))
SPEC = AnticipateSpec(lead_s=600.0, recent_windows=6, max_extra_gpus=8, learn_use=True)
KIND = ("gpu", "g1")


# ------------------------------------------------------------------------------------------------ use rate
@pytest.mark.parametrize(
    ("use", "rate"),
    [
        (Use(), 1.0),  # nothing settled: room is bought as without learnUse
        (Use(1.0, 1.0), 1.0),
        (Use(0.0, 1.0), USE_PRIOR / (1.0 + USE_PRIOR)),  # one unused: half
        (Use(9.0, 19.0), 0.5),  # 10 of 20 with the prior
        (Use(0.0, 99.0), 0.01),
    ],
)
def test_use_rate_is_the_share_used_after_one_used_of_one(use: Use, rate: float) -> None:
    assert use_rate(use) == pytest.approx(rate)


def test_use_fades_and_counts() -> None:
    u = Use().add(True).add(False).add(False)
    assert (u.used, u.total) == (1.0, 3.0)
    assert u.decayed(0.0, 3600.0) is u
    d = u.decayed(3600.0, 3600.0)
    assert d.used == pytest.approx(math.exp(-1.0)) and d.total == pytest.approx(3 * math.exp(-1.0))
    assert use_rate(u.decayed(1e9, 3600.0)) == pytest.approx(1.0)  # forgotten: back to the prior


# ------------------------------------------------------------------------------------------------ settling
def _extra(rid: str, at: float = 0.0) -> Extra:
    return Extra(rid, KIND, at)


@pytest.mark.parametrize(
    ("status", "now", "settled"),
    [
        ({"r": "used"}, 100.0, [(KIND, True)]),  # a pod runs on it
        ({"r": "gone"}, 100.0, [(KIND, False)]),  # went without one
        ({}, 100.0, [(KIND, False)]),  # its claim is gone
        ({"r": "empty"}, 100.0, []),  # booting or up, no pod yet: open
        ({"r": "empty"}, 800.0, []),  # at the end of its window: still open
        ({"r": "empty"}, 801.0, [(KIND, False)]),  # empty past lead + cold start: unused
        ({"r": "used"}, 5000.0, [(KIND, True)]),  # a pod, however late: used
    ],
)
def test_settle_extra(status: dict[str, str], now: float, settled: list[tuple[tuple[str, str], bool]]) -> None:
    still, closed = settle_extra([_extra("r")], status, now, 800.0)
    assert closed == settled
    assert [e.request_id for e in still] == ([] if settled else ["r"])


def _claim(rid: str, phase: ClaimPhase, node: str = "") -> NodeClaim:
    return NodeClaim(rid, "gpu", "g1", "z1", OD, phase=phase, node_name=node)


def test_the_controller_follows_its_extra_nodes_until_settled() -> None:
    a = Anticipation(AnticipateSpec(lead_s=600.0, cold_start_s=200.0, learn_use=True), 0.0)
    for rid in ("used", "deleted", "empty", "missing"):
        a.note_launch(rid, "gpu", "g1", 0.0)
    claims = [
        _claim("used", ClaimPhase.INITIALIZED, "n-used"),
        _claim("deleted", ClaimPhase.DELETING, "n-del"),
        _claim("empty", ClaimPhase.INITIALIZED, "n-empty"),
        _claim("other", ClaimPhase.INITIALIZED, "n-other"),
    ]
    a.settle(claims, {"n-used", "n-other"}, 60.0)
    assert set(a.extra) == {"empty"}
    assert (a.stats.used, a.stats.unused) == (1, 2)
    assert a.use[KIND] == Use(1.0, 3.0)
    share, per_kind = a.use_shares()
    assert share == pytest.approx(0.5) and per_kind == {KIND: pytest.approx(0.5)}
    a.settle(claims, {"n-used", "n-other"}, 60.0 + 801.0)  # the empty one is past lead + cold start
    assert not a.extra and a.stats.unused == 3
    assert a.use[KIND].total == pytest.approx(3 * math.exp(-801.0 / 3600.0) + 1)  # the three faded, one more


def test_without_learn_use_nothing_is_followed() -> None:
    a = Anticipation(AnticipateSpec(), 0.0)
    a.note_launch("r", "gpu", "g1", 0.0)
    a.settle([_claim("r", ClaimPhase.DELETING)], set(), 10.0)
    assert not a.extra and not a.use and a.use_shares()[0] == 1.0


# ------------------------------------------------------------------------------------------------ decisions
def test_the_forecast_share_shrinks_the_room_expected() -> None:
    # three 1-GPU pods in each of the last six 10-minute windows: 3 GPUs expected
    spec = AnticipateSpec(lead_s=600.0, recent_windows=6, max_extra_gpus=8)
    times = [600.0 * k + j for k in range(6) for j in (1, 2, 3)]
    pods = [pod(f"a{i}", gpus=1) for i in range(len(times))]

    def names(share: float) -> list[str]:
        return [p.key.rsplit("/", 1)[1] for p in expected_pods(times, pods, 0.0, 3600.0, spec, share)]

    assert names(1.0) == ["a17", "a16", "a15"]
    assert names(0.7) == ["a17", "a16"]  # 2.1 GPUs
    assert names(0.3) == []  # 0.9 GPU: no 1-GPU pod fits it


def _order(it: str, *pods: str) -> LaunchOrder:
    return LaunchOrder(("up", "gpu", it, "z1", "on-demand", *pods), "gpu", it, "z1", OD, tuple(pods), "ScaleUp", 0)


@pytest.mark.parametrize(
    ("use", "take"),
    [
        (None, True),  # 200 s x ($4 + $0.60) = $0.26 against $0.60/h over 10 min = $0.10
        ({KIND: 1.0}, True),
        ({KIND: 0.5}, True),  # $0.13
        ({KIND: 0.3}, False),  # $0.077
        ({("gpu", "g4"): 0.1}, True),  # another kind's share
    ],
)
def test_weigh_counts_the_share_of_extra_nodes_used(use: dict[tuple[str, str], float] | None, take: bool) -> None:
    x = anticipated(pod("x", gpus=1))
    v = weigh(ScaleUpDecision((_order("g1", x.key),), {}, (), 0, True), [x], CAT, SPEC, use)
    assert v.take is take
    assert v.saved == pytest.approx(200 / 3600 * 4.6 * (use or {}).get(KIND, 1.0))


# ------------------------------------------------------------------------------------------------ setting
def test_setting() -> None:
    spec = anticipate_setting({"learnUse": True, "useMemory": "30m"}, "policy.anticipate")
    assert spec is not None and spec.learn_use and spec.use_memory_s == 1800.0
    plain = anticipate_setting(True, "policy.anticipate")
    assert plain is not None and not plain.learn_use and plain.use_memory_s == 3600.0


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"learnUse": "yes"}, "policy.anticipate.learnUse"),
        ({"useMemory": "soon"}, "policy.anticipate.useMemory"),
        ({"useMemory": "0s"}, "policy.anticipate.useMemory"),
    ],
)
def test_bad_setting_is_one_line_naming_the_field(value: object, where: str) -> None:
    with pytest.raises(InputError) as e:
        anticipate_setting(value, "policy.anticipate")
    assert where in str(e.value) and "\n" not in str(e.value)
