"""What a failed GPR launch means: :func:`judge_gpr_launch_error`, the GPR manager's counterpart of
:func:`~gpuscale.core.reconcile.launching.judge_launch_error`, reading the error's policy in the same one place
(:func:`~gpuscale.core.reconcile.policy.read_policy`). A GPR launch is retried as a whole under its request id (the
manager keeps the due time and the attempt count in the shared availability record); the manager only carries the
verdict out. By the policy's meaning:

================  =====================================================================================================
``OFFERING_OUT``  mark the (type, zone) on-demand offering unavailable for ``unavailable_ttl_s`` and retarget the
                  launch, under the same request id (a refused launch created nothing), to the GPR's next candidate
                  offering; with none left the attempt fails with the error's message
``WAIT``          retry the same request id after the policy's delay
``RETRY``         retry the same request id after the doubled delay
``LIMIT``         (a quota) retry the same request id after the limit's base doubled per failed attempt, without limit
``EXHAUSTED``     the attempt fails: "<error> (gave up after n attempts)"
``REFUSED``       an invalid request fails the attempt with the error's message; rejected credentials block the
                  provider (never called again; the GPR waits with the message); anything else (a resource not
                  found) fails the attempt as given up after n attempts
================  =====================================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscale.core.model import OfferingKey
from gpuscale.core.reconcile.policy import LaunchRules, Meaning, doubled, read_policy
from gpuscale.core.reconcile.records import MarkUnavailable
from gpuscale.errors import AuthenticationError, InvalidProviderRequest, ProviderError

GPR_CAPACITY_WHY = "GPR launch: insufficient capacity"
"""The reason recorded with the offering marks of a GPR launch refused for capacity."""


@dataclass(frozen=True, slots=True)
class RetryLaunch:
    """Try the launch ``request_id`` again at ``at``; ``attempts`` failed so far (``why``: the error class)."""

    request_id: str
    at: float
    attempts: int
    why: str


@dataclass(frozen=True, slots=True)
class Retarget:
    """Move the launch to the GPR's next candidate offering not marked unavailable; if there is none, fail the
    attempt with ``reason``."""

    reason: str


@dataclass(frozen=True, slots=True)
class FailAttempt:
    """The GPR's provisioning attempt fails with ``reason`` (its pending retry, if any, is dropped when
    ``clear_retry``)."""

    reason: str
    clear_retry: bool = False


@dataclass(frozen=True, slots=True)
class BlockProvider:
    """The provider cannot authenticate: never call it again; ``reason`` is reported to waiting GPRs."""

    reason: str


GprLaunchAction = MarkUnavailable | RetryLaunch | Retarget | FailAttempt | BlockProvider


@dataclass(frozen=True, slots=True)
class GprLaunchVerdict:
    """The meaning of the error's policy and the actions to carry out, in order."""

    meaning: Meaning
    actions: tuple[GprLaunchAction, ...]


def judge_gpr_launch_error(
    exc: ProviderError,
    *,
    request_id: str,
    offering: OfferingKey,
    attempts: int,
    rules: LaunchRules,
    now: float,
) -> GprLaunchVerdict:
    """The verdict on ``exc`` raised by the launch ``request_id`` of a GPR on ``offering`` (see the module
    docstring); ``attempts`` is how many earlier attempts of this request failed with a retryable error."""
    reading = read_policy(exc, attempts + 1, rules)
    n = reading.attempts
    why = str(exc)
    meaning = reading.meaning
    acts: tuple[GprLaunchAction, ...]
    if meaning is Meaning.OFFERING_OUT:
        acts = (MarkUnavailable(offering, now + rules.unavailable_ttl_s, GPR_CAPACITY_WHY), Retarget(why))
    elif meaning in (Meaning.WAIT, Meaning.RETRY):
        acts = (RetryLaunch(request_id, now + reading.delay_s, n, type(exc).__name__),)
    elif meaning is Meaning.LIMIT:
        acts = (RetryLaunch(request_id, now + doubled(reading.delay_s, n, rules), n, type(exc).__name__),)
    elif isinstance(exc, InvalidProviderRequest):
        acts = (FailAttempt(why),)
    elif isinstance(exc, AuthenticationError):
        acts = (BlockProvider(why),)
    else:  # EXHAUSTED, or refused for another reason (a resource not found)
        acts = (FailAttempt(f"{why} (gave up after {n} attempts)", clear_retry=True),)
    return GprLaunchVerdict(meaning, acts)
