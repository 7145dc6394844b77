"""Leader election decisions over a ``coordination.k8s.io/v1`` Lease (pure: the adapter reads and writes it).

Several replicas of the controller share one Lease; only its holder acts. Every ``retry_period_s`` a replica reads the
Lease and asks :func:`next_step` what to do:

* no Lease yet -> ``Create`` it holding it;
* it holds the Lease -> ``Renew`` (write a fresh ``renewTime``);
* another holder whose record has not changed for ``leaseDurationSeconds`` (or no holder) -> ``TakeOver``
  (``leaseTransitions`` + 1, new ``acquireTime``);
* otherwise -> ``Wait`` as a standby.

Expiry is judged on the replica's own clock, from when *it* last saw the record change (holder, renew time or
transitions), never by comparing another machine's ``renewTime`` with its own clock, so clock skew between nodes
cannot make two replicas lead. Writes carry the ``resourceVersion`` read, so of two replicas writing at once one gets
a conflict and stays standby.

:func:`should_act` decides whether to act: only while the last successful renewal is younger than
``renew_deadline_s``, which is shorter than the lease duration, so a leader cut off from the API server stops acting
before any standby may take over.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class LeaseStep(StrEnum):
    """What a replica does with the Lease this round."""

    CREATE = "Create"
    RENEW = "Renew"
    TAKE_OVER = "TakeOver"
    WAIT = "Wait"


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """Timing (seconds), as Kubernetes' own controllers use it: duration > renew deadline > retry period."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def problem(self) -> str | None:
        """None if the timing is consistent, else what is wrong."""
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s > 0:
            return (
                f"need lease duration ({self.lease_duration_s:g}s) > renew deadline ({self.renew_deadline_s:g}s)"
                f" > retry period ({self.retry_period_s:g}s) > 0"
            )
        return None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The Lease's ``spec`` (times in epoch seconds; None when unset)."""

    holder: str = ""
    duration_s: float = 15.0
    acquired_at: float | None = None
    renewed_at: float | None = None
    transitions: int = 0


@dataclass(frozen=True, slots=True)
class Observation:
    """A replica's memory of the Lease: the record last read and when (its own clock) that record last changed."""

    record: LeaseRecord
    changed_at: float


def observe(previous: Observation | None, record: LeaseRecord | None, now: float) -> Observation | None:
    """The observation after reading ``record`` at ``now``: ``changed_at`` moves only when the record changed."""
    if record is None:
        return None
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def expired(obs: Observation, now: float) -> bool:
    """True if the record has not changed for its lease duration (or has no holder)."""
    return not obs.record.holder or now >= obs.changed_at + obs.record.duration_s


def next_step(obs: Observation | None, me: str, now: float) -> LeaseStep:
    """What replica ``me`` does this round, given its observation of the Lease (None: there is no Lease)."""
    if obs is None:
        return LeaseStep.CREATE
    if obs.record.holder == me:
        return LeaseStep.RENEW
    if expired(obs, now):
        return LeaseStep.TAKE_OVER
    return LeaseStep.WAIT


def desired(obs: Observation | None, step: LeaseStep, me: str, now: float, cfg: ElectionConfig) -> LeaseRecord | None:
    """The record to write for ``step`` (None for ``Wait``)."""
    if step is LeaseStep.WAIT:
        return None
    if step is LeaseStep.CREATE or obs is None:
        return LeaseRecord(me, cfg.lease_duration_s, now, now, 0)
    if step is LeaseStep.RENEW:
        return replace(obs.record, duration_s=cfg.lease_duration_s, renewed_at=now)
    return LeaseRecord(me, cfg.lease_duration_s, now, now, obs.record.transitions + 1)


def released(record: LeaseRecord, me: str) -> LeaseRecord | None:
    """The record that gives the Lease up on shutdown (no holder), or None if ``me`` does not hold it."""
    if record.holder != me:
        return None
    return replace(record, holder="", duration_s=1.0)


def should_act(last_renewed: float | None, now: float, cfg: ElectionConfig) -> bool:
    """True while this replica leads: its last successful acquire or renew is younger than the renew deadline."""
    return last_renewed is not None and now - last_renewed < cfg.renew_deadline_s
