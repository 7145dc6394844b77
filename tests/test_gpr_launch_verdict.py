"""The pure verdict on a failed GPR launch (core.reconcile.judge_gpr_launch_error), table-tested over every class of
the ProviderError tree, and the one policy reading (read_policy) it shares with the pod launch verdict."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest

from builders import ONE_CLOUD, ONE_CLOUD_FAST
from gpuscale import errors
from gpuscale.core.model import CapacityType, OfferingKey
from gpuscale.core.nodeclaim import new_claim
from gpuscale.core.reconcile import (
    BackOff,
    BlockProvider,
    FailAttempt,
    LaunchRules,
    MarkUnavailable,
    Meaning,
    Outcome,
    Retarget,
    RetryAt,
    RetryLaunch,
    judge_gpr_launch_error,
    judge_launch_error,
    next_try_in,
    read_policy,
)
from gpuscale.errors import ProviderError
from gpuscale.sim.cloud import CapacityRule, SimCloud
from test_engine_gprs import SPEC, _Rig

RULES = LaunchRules(unavailable_ttl_s=300.0, max_backoff_s=600.0)
OFFER = OfferingKey("g1-gpu-rtx6000-1", "us-ord", CapacityType.ON_DEMAND)
NOW = 1000.0
RID = "gpr-abc-a0"

ERRORS: dict[type[ProviderError], ProviderError] = {
    errors.ProviderError: errors.ProviderError("boom", provider="fake"),
    errors.CapacityError: errors.CapacityError("sold out", provider="fake"),
    errors.InsufficientCapacity: errors.InsufficientCapacity("none left", provider="fake"),
    errors.QuotaExceeded: errors.QuotaExceeded("quota", provider="fake"),
    errors.RateLimited: errors.RateLimited("429", provider="fake", retry_after=30.0),
    errors.TransientProviderError: errors.TransientProviderError("503", provider="fake"),
    errors.InvalidProviderRequest: errors.InvalidProviderRequest("bad label", provider="fake", field="labels"),
    errors.AuthenticationError: errors.AuthenticationError("LINODE_TOKEN is not set", provider="fake"),
    errors.NotFound: errors.NotFound("no such type", provider="fake"),
}

# class -> (attempts failed before, expected meaning, expected actions)
TABLE: list[tuple[type[ProviderError], int, Meaning, tuple[object, ...]]] = [
    (errors.ProviderError, 0, Meaning.RETRY, (RetryLaunch(RID, NOW + 2.0, 1, "ProviderError"),)),
    (errors.ProviderError, 3, Meaning.RETRY, (RetryLaunch(RID, NOW + 16.0, 4, "ProviderError"),)),
    (errors.ProviderError, 4, Meaning.EXHAUSTED, (FailAttempt("boom (gave up after 5 attempts)", True),)),
    (
        errors.CapacityError,
        0,
        Meaning.OFFERING_OUT,
        (MarkUnavailable(OFFER, NOW + 300.0, "GPR launch: insufficient capacity"), Retarget("sold out")),
    ),
    (
        errors.InsufficientCapacity,
        2,
        Meaning.OFFERING_OUT,
        (MarkUnavailable(OFFER, NOW + 300.0, "GPR launch: insufficient capacity"), Retarget("none left")),
    ),
    (errors.QuotaExceeded, 0, Meaning.LIMIT, (RetryLaunch(RID, NOW + 60.0, 1, "QuotaExceeded"),)),
    (errors.QuotaExceeded, 2, Meaning.LIMIT, (RetryLaunch(RID, NOW + 240.0, 3, "QuotaExceeded"),)),
    (errors.QuotaExceeded, 20, Meaning.LIMIT, (RetryLaunch(RID, NOW + 600.0, 21, "QuotaExceeded"),)),  # capped
    (errors.RateLimited, 0, Meaning.WAIT, (RetryLaunch(RID, NOW + 30.0, 1, "RateLimited"),)),
    (errors.RateLimited, 5, Meaning.WAIT, (RetryLaunch(RID, NOW + 30.0, 6, "RateLimited"),)),  # never doubled
    (errors.TransientProviderError, 0, Meaning.RETRY, (RetryLaunch(RID, NOW + 1.0, 1, "TransientProviderError"),)),
    (errors.TransientProviderError, 1, Meaning.RETRY, (RetryLaunch(RID, NOW + 2.0, 2, "TransientProviderError"),)),
    (errors.TransientProviderError, 4, Meaning.EXHAUSTED, (FailAttempt("503 (gave up after 5 attempts)", True),)),
    (errors.InvalidProviderRequest, 0, Meaning.REFUSED, (FailAttempt("labels: bad label"),)),
    (errors.AuthenticationError, 0, Meaning.REFUSED, (BlockProvider("LINODE_TOKEN is not set"),)),
    (errors.NotFound, 0, Meaning.REFUSED, (FailAttempt("no such type (gave up after 1 attempts)", True),)),
]


def _tree() -> set[type[ProviderError]]:
    return {c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, ProviderError)}


def test_the_table_covers_every_class_of_the_provider_error_tree() -> None:
    assert {row[0] for row in TABLE} == _tree() == set(ERRORS)


@pytest.mark.parametrize(("cls", "attempts", "meaning", "actions"), TABLE, ids=lambda v: getattr(v, "__name__", None))
def test_gpr_launch_verdict(cls: type[ProviderError], attempts: int, meaning: Meaning, actions: tuple[object]) -> None:
    verdict = judge_gpr_launch_error(
        ERRORS[cls], request_id=RID, offering=OFFER, attempts=attempts, rules=RULES, now=NOW
    )
    assert verdict.meaning is meaning
    assert verdict.actions == actions


def test_configured_bases_override_the_policys_delay() -> None:
    rules = LaunchRules(quota_backoff_s=10.0, retry_base_s=3.0, max_backoff_s=100.0)
    quota = judge_gpr_launch_error(
        ERRORS[errors.QuotaExceeded], request_id=RID, offering=OFFER, attempts=1, rules=rules, now=0.0
    )
    assert quota.actions == (RetryLaunch(RID, 20.0, 2, "QuotaExceeded"),)
    flaky = ERRORS[errors.TransientProviderError]
    assert judge_gpr_launch_error(flaky, request_id=RID, offering=OFFER, attempts=3, rules=rules, now=0.0).actions == (
        RetryLaunch(RID, 24.0, 4, "TransientProviderError"),
    )


def test_a_used_request_id_fails_a_gpr_attempt_like_any_invalid_request() -> None:
    used = errors.InvalidProviderRequest("already used", field="request_id")
    verdict = judge_gpr_launch_error(used, request_id=RID, offering=OFFER, attempts=0, rules=RULES, now=NOW)
    assert verdict.actions == (FailAttempt("request_id: already used"),)


ERROR_CLASSES = sorted(ERRORS, key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("attempts", [0, 1, 3, 4, 9])
def test_both_verdicts_read_the_policy_alike(cls: type[ProviderError], attempts: int) -> None:
    """The pod claim's verdict and the GPR's agree on what the error means: retry (and when), or not."""
    exc = ERRORS[cls]
    reading = read_policy(exc, attempts + 1, RULES)
    claim = new_claim("c1", "pool-a", OFFER.instance_type, OFFER.zone, OFFER.capacity_type, NOW)
    pod = judge_launch_error(
        "c1", claim, exc, attempts=attempts, pool=None, fallback_active=False, rules=RULES, now=NOW
    )
    gpr = judge_gpr_launch_error(exc, request_id=RID, offering=OFFER, attempts=attempts, rules=RULES, now=NOW)
    expected = {
        Meaning.OFFERING_OUT: Outcome.CAPACITY,
        Meaning.WAIT: Outcome.RETRY,
        Meaning.RETRY: Outcome.RETRY,
        Meaning.EXHAUSTED: Outcome.FAILED,
        Meaning.LIMIT: Outcome.QUOTA,
        Meaning.REFUSED: Outcome.FAILED,
    }[reading.meaning]
    if isinstance(exc, errors.InvalidProviderRequest) and exc.field == "request_id":
        expected = Outcome.BURNT
    assert pod.outcome is expected and gpr.meaning is reading.meaning
    pod_retry = [a for a in pod.actions if isinstance(a, RetryAt)]
    gpr_retry = [a for a in gpr.actions if isinstance(a, RetryLaunch)]
    if reading.meaning in (Meaning.WAIT, Meaning.RETRY):
        assert pod_retry[0].at == gpr_retry[0].at == NOW + reading.delay_s
    if reading.meaning is Meaning.LIMIT:  # the pod's pool backs off from the same base the GPR's retry doubles
        assert [a.base_s for a in pod.actions if isinstance(a, BackOff)] == [reading.delay_s]
        assert gpr_retry[0].at == NOW + min(RULES.max_backoff_s, reading.delay_s * 2**attempts)
    delay = next_try_in(exc, attempts + 1, RULES)
    assert (delay is None) == (not gpr_retry)
    if delay is not None:
        assert gpr_retry[0].at == NOW + delay


def test_in_engine_mode_a_capacity_verdict_marks_the_controllers_availability(tmp_path: Path) -> None:
    """The manager carries the verdict out through the availability record it shares with the node controller: the
    offering refused for a GPR is avoided by the controller's own launches too."""
    rig = _Rig(tmp_path)
    refuse = CapacityRule(max_nodes=0, instance_type="g2-rtx4000a1-s", end=1e9)
    rig.cloud = SimCloud(rig.engine, ONE_CLOUD, replace(ONE_CLOUD_FAST, capacity=(refuse,)), seed=1,
                         listener=rig.cluster)  # fmt: skip
    rig.restart()
    gid = rig.manager.create({**SPEC, "numberOfGPUNodes": 1}).gpr_id
    rig.run(4.0)
    marked = rig.ctrl.availability.unavailable_at(rig.engine.now())
    assert OfferingKey("g2-rtx4000a1-s", "us-ord", CapacityType.ON_DEMAND) in marked
    assert rig.manager.availability is rig.ctrl.availability
    d = rig.manager.get(gid).status.node_pool_details  # retargeted at once, under the same request id
    assert (d.instance_type, d.request_id, len(d.node_ids)) == ("g2-rtx4000a4-s", f"{gid}-a0", 1)
