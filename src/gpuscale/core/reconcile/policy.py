"""What an error's :class:`~gpuscale.errors.RetryPolicy` means after a given number of failed attempts: the one
place that reads a policy, shared by the verdicts on failed launches of pods' claims
(:func:`~gpuscale.core.reconcile.launching.judge_launch_error`) and of GPRs
(:func:`~gpuscale.core.reconcile.gprlaunch.judge_gpr_launch_error`).

==================  ==========================  =======================================================================
policy              :class:`Meaning`            ``delay_s``
==================  ==========================  =======================================================================
``next-offering``   ``OFFERING_OUT``            0: the offering cannot be had now; another may
``after``           ``WAIT``                    the policy's delay (a ``Retry-After``), never doubled
``backoff``, n <    ``RETRY``                   base x 2^(n-1), at most ``max_backoff_s``; base: ``retry_base_s`` or
``max_attempts``                                the policy's delay
``backoff``, n >=   ``EXHAUSTED``               0: the request will not succeed
``max_attempts``
``backoff``,        ``LIMIT``                   the base of a doubling back-off: ``quota_backoff_s`` or the policy's
``max_attempts`` 0                              delay (a pool-wide limit such as a quota; retried without limit)
``never``           ``REFUSED``                 0: retrying the same request cannot help
==================  ==========================  =======================================================================

``n`` counts the failed attempts including the one that raised the error.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpuscale.errors import ProviderError, RetryKind


class Meaning(StrEnum):
    """What a failed provider call means for the request (see the module docstring)."""

    OFFERING_OUT = "offering-out"
    WAIT = "wait"
    RETRY = "retry"
    EXHAUSTED = "exhausted"
    LIMIT = "limit"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class LaunchRules:
    """The launcher's settings (``None``: the error's own :class:`~gpuscale.errors.RetryPolicy` delay)."""

    unavailable_ttl_s: float = 180.0
    quota_backoff_s: float | None = None
    max_backoff_s: float = 600.0
    retry_base_s: float | None = None


@dataclass(frozen=True, slots=True)
class PolicyReading:
    """:func:`read_policy`'s answer: the meaning, the delay it implies and the failed attempts counted."""

    meaning: Meaning
    delay_s: float
    attempts: int


def read_policy(exc: ProviderError, attempts: int, rules: LaunchRules) -> PolicyReading:
    """What ``exc``'s retry policy means after ``attempts`` failed attempts, the last with ``exc`` (see the module
    docstring; ``attempts`` below 1 counts as 1)."""
    policy = exc.retry
    n = max(1, attempts)
    if policy.kind is RetryKind.NEXT_OFFERING:
        return PolicyReading(Meaning.OFFERING_OUT, 0.0, n)
    if policy.kind is RetryKind.AFTER:
        return PolicyReading(Meaning.WAIT, policy.delay_s, n)
    if policy.kind is not RetryKind.BACKOFF:
        return PolicyReading(Meaning.REFUSED, 0.0, n)
    if policy.max_attempts <= 0:
        base = rules.quota_backoff_s if rules.quota_backoff_s is not None else policy.delay_s
        return PolicyReading(Meaning.LIMIT, base, n)
    if n >= policy.max_attempts:
        return PolicyReading(Meaning.EXHAUSTED, 0.0, n)
    base = rules.retry_base_s if rules.retry_base_s is not None else policy.delay_s
    return PolicyReading(Meaning.RETRY, min(rules.max_backoff_s, base * 2.0 ** (n - 1)), n)


def doubled(base_s: float, attempts: int, rules: LaunchRules) -> float:
    """``base_s`` doubled per failed attempt after the first, at most ``max_backoff_s``."""
    return min(rules.max_backoff_s, base_s * 2.0 ** (max(1, attempts) - 1))
