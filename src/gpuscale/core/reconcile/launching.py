"""What a failed launch means, decided from the error's :class:`~gpuscale.errors.RetryPolicy` alone.

This is the one retry layer: providers raise mapped errors and never retry; :func:`judge_launch_error` turns an
error (data) into actions the launcher carries out, and a retry happens in a later round at its due time, never by
sleeping. The policy is read in one place, :func:`~gpuscale.core.reconcile.policy.read_policy` (shared with the GPR
launch verdict); by the policy's kind:

==================  ==================================================================================================
``next-offering``   fail the claim, avoid the offering asked for and every offering the error names for
                    ``unavailable_ttl_s`` and re-plan (a spot-only pool with ``allowSpotFallback`` may buy on-demand
                    meanwhile)
``after``           keep the claim Requested; retry the same request id after the policy's delay; hold the pool's
                    launches as long (not doubled)
``backoff``         with ``max_attempts`` > 0 (transient): retry the same id after base x 2^(n-1), at most
                    ``max_backoff_s``, where base is the configured ``retry_base_s`` or else the policy's delay;
                    after ``max_attempts`` failed attempts fail the claim and re-plan.
                    With ``max_attempts`` = 0 (a pool-wide limit such as a quota): fail the claim, back the pool off
                    exponentially from ``quota_backoff_s`` or else the policy's delay, avoid the offerings the error
                    names (e.g. a spot instance count limit names spot offerings), and re-plan
``never``           an id the provider says is used: drop the claim and launch under a new id at once; a resource not
                    found: fail the claim; anything else (invalid request, rejected credentials): fail the claim and
                    hold the pool's launches for ``max_backoff_s``
==================  ==================================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpuscale.core.model import CapacityType, NodePool, OfferingKey
from gpuscale.core.nodeclaim import ClaimEvent, NodeClaim, transition
from gpuscale.core.reconcile.policy import LaunchRules, Meaning, doubled, read_policy
from gpuscale.core.reconcile.records import EventKind, MarkUnavailable, Note, SetClaim
from gpuscale.errors import InvalidProviderRequest, NotFound, ProviderError, RetryKind


class Outcome(StrEnum):
    """How a launch attempt ended, for the caller's next step."""

    OK = "ok"
    RETRY = "retry"
    """The same request id is tried again later."""
    CAPACITY = "capacity"
    """The offering is out: re-plan now."""
    QUOTA = "quota"
    """The pool is held back: re-plan now (other pools)."""
    FAILED = "failed"
    GUARD = "guard"
    """Not attempted: a pool limit."""
    BURNT = "burnt"
    """The request id was used before: launch again under a new id."""


@dataclass(frozen=True, slots=True)
class BackOff:
    """Hold the pool's launches: ``base_s`` doubled per consecutive failure unless not ``exponential``."""

    pool: str
    base_s: float
    exponential: bool
    why: str


@dataclass(frozen=True, slots=True)
class AllowFallback:
    """Let the spot-only ``pool`` buy on-demand until ``until`` (``announce``: note it, it was not allowed)."""

    pool: str
    until: float
    announce: bool


@dataclass(frozen=True, slots=True)
class RetryAt:
    """Try the claim's launch again at ``at``; ``attempts`` failed so far (None: leave the count as it is)."""

    key: str
    at: float
    attempts: int | None = None


@dataclass(frozen=True, slots=True)
class BurnId:
    """The request id belongs to an earlier node: drop the claim; never use the id again."""

    key: str


LaunchAction = SetClaim | MarkUnavailable | BackOff | AllowFallback | RetryAt | BurnId | Note


@dataclass(frozen=True, slots=True)
class LaunchVerdict:
    """The outcome of a failed launch and the actions to carry out, in order."""

    outcome: Outcome
    actions: tuple[LaunchAction, ...] = field(default_factory=tuple)


def _fail(key: str, claim: NodeClaim, why: str, now: float) -> list[LaunchAction]:
    return [
        SetClaim(key, transition(claim, ClaimEvent.LAUNCH_FAILED, now, reason=why)),
        Note(EventKind.LAUNCH_FAILED, f"nodeclaim/{key}", "LaunchFailed", why, {"request_id": key}),
    ]


def _marks(offerings: tuple[OfferingKey, ...], until: float, why: str) -> list[LaunchAction]:
    """One mark per distinct offering, in order."""
    return [MarkUnavailable(o, until, why) for o in dict.fromkeys(offerings)]


def partial_launch_marks(named: tuple[OfferingKey, ...], rules: LaunchRules, now: float) -> tuple[MarkUnavailable, ...]:
    """The marks for the offerings a launch that succeeded elsewhere named as failed (an EC2 fleet that filled its
    count from other zones): each is avoided for ``unavailable_ttl_s``, like a capacity error's."""
    return tuple(MarkUnavailable(o, now + rules.unavailable_ttl_s, "capacity error") for o in dict.fromkeys(named))


def judge_launch_error(
    key: str,
    claim: NodeClaim,
    exc: ProviderError,
    *,
    attempts: int,
    pool: NodePool | None,
    fallback_active: bool,
    rules: LaunchRules,
    now: float,
    named: tuple[OfferingKey, ...] = (),
) -> LaunchVerdict:
    """The verdict on ``exc`` raised by the launch of the Requested ``claim`` (see the module docstring).

    ``attempts`` is how many earlier attempts of this claim failed with a retryable error; ``fallback_active``
    whether the claim's pool may already buy on-demand instead of spot; ``named`` the exact offerings the error
    names (an EC2 fleet's failed overrides: instance type, availability zone, capacity type), each marked
    unavailable.
    """
    reading = read_policy(exc, attempts + 1, rules)
    why = str(exc)
    obj = f"nodeclaim/{key}"
    if reading.meaning is Meaning.OFFERING_OUT:
        acts = _fail(key, claim, why, now)
        offering = OfferingKey(claim.instance_type, claim.zone, claim.capacity_type)
        acts.extend(_marks((offering, *named), now + rules.unavailable_ttl_s, "insufficient capacity"))
        if (
            claim.capacity_type is CapacityType.SPOT
            and pool is not None
            and pool.allow_spot_fallback
            and CapacityType.SPOT in pool.capacity_types
        ):
            acts.append(AllowFallback(claim.pool, now + rules.unavailable_ttl_s, announce=not fallback_active))
        return LaunchVerdict(Outcome.CAPACITY, tuple(acts))
    if reading.meaning is Meaning.WAIT:
        delay = reading.delay_s
        acts = [
            BackOff(claim.pool, delay, False, why),
            RetryAt(key, now + delay),
            Note(EventKind.LAUNCH_RETRY, obj, type(exc).__name__, why),
        ]
        return LaunchVerdict(Outcome.RETRY, tuple(acts))
    if reading.meaning is Meaning.REFUSED:
        if isinstance(exc, InvalidProviderRequest) and exc.field == "request_id":
            note = Note(EventKind.LAUNCH_RETRY, obj, "RequestIdUsed", f"{why}; using a new id")
            return LaunchVerdict(Outcome.BURNT, (BurnId(key), note))
        if isinstance(exc, NotFound):
            return LaunchVerdict(Outcome.FAILED, tuple(_fail(key, claim, why, now)))
        acts = _fail(key, claim, why, now)
        acts.append(BackOff(claim.pool, rules.max_backoff_s, True, why))
        return LaunchVerdict(Outcome.FAILED, tuple(acts))
    if reading.meaning is Meaning.LIMIT:  # a pool-wide limit (quota): this request fails, the pool waits
        acts = _fail(key, claim, why, now)
        acts.append(BackOff(claim.pool, reading.delay_s, True, why))
        acts.extend(_marks(named, now + rules.unavailable_ttl_s, "limit exceeded"))
        return LaunchVerdict(Outcome.QUOTA, tuple(acts))
    n = reading.attempts
    if reading.meaning is Meaning.EXHAUSTED:
        acts = _fail(key, claim, f"{why}; gave up after {n} attempts", now)
        return LaunchVerdict(Outcome.FAILED, tuple(acts))
    delay = reading.delay_s
    acts = [
        RetryAt(key, now + delay, n),
        Note(EventKind.LAUNCH_RETRY, obj, type(exc).__name__, f"{exc}; retry in {delay:.0f}s"),
    ]
    return LaunchVerdict(Outcome.RETRY, tuple(acts))


def capped_backoff_s(failures: int, base_s: float, max_s: float) -> float:
    """The delay after the ``failures``-th consecutive failure: ``base_s`` doubled for each failure after the first,
    at most ``max_s`` (the exponent is bounded, so a very long run of failures cannot overflow a float)."""
    return min(max_s, base_s * 2.0 ** min(max(1, failures) - 1, 1023))


def retry_delay(exc: ProviderError, attempts: int, rules: LaunchRules) -> float:
    """The delay before the next try of an operation (a delete) that failed ``attempts`` times, the last with
    ``exc``: the policy's delay for ``after``, else base x 2^(attempts-1) capped at ``max_backoff_s``."""
    policy = exc.retry
    if policy.kind is RetryKind.AFTER:
        return policy.delay_s
    base = rules.retry_base_s if rules.retry_base_s is not None else max(policy.delay_s, 1.0)
    return capped_backoff_s(attempts, base, rules.max_backoff_s)


def next_try_in(exc: ProviderError, attempts: int, rules: LaunchRules) -> float | None:
    """For a caller that retries one request as a whole (the GPR manager): the delay before trying again after its
    ``attempts``-th failed attempt, the last with ``exc``, or None when the policy says not to retry it
    (``never``, ``next-offering``, or a retryable error's ``max_attempts`` used up). A pool-wide ``backoff``
    (``max_attempts`` = 0, a quota) is retried without limit, from ``quota_backoff_s`` or the policy's delay."""
    reading = read_policy(exc, attempts, rules)
    if reading.meaning in (Meaning.WAIT, Meaning.RETRY):
        return reading.delay_s
    if reading.meaning is Meaning.LIMIT:
        return doubled(reading.delay_s, reading.attempts, rules)
    return None
