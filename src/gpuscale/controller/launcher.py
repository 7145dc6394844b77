"""The launcher: the one place a node is asked for, and the one retry layer.

A :class:`Launcher` derives request ids (deterministic per seed, so a restarted controller asks again under the
same id and the provider's idempotency returns the node it already made; an id the provider reports as used is
never used again), calls ``Provider.launch`` once per due claim, and carries out the pure verdict of
:func:`gpuscale.core.reconcile.judge_launch_error` on a failure: claim transitions, offering marks, pool back-offs
and spot fallbacks in the :class:`~gpuscale.controller.availability.Availability` record, and the due time of the
next try. It never sleeps: a claim waiting for its retry is simply not due until then (:meth:`due`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, MutableMapping

from gpuscale.controller.availability import Availability
from gpuscale.core.model import NodePool, OfferingKey
from gpuscale.core.nodeclaim import ClaimEvent, NodeClaim, transition
from gpuscale.core.reconcile import (
    AllowFallback,
    BackOff,
    BurnId,
    EventKind,
    LaunchRules,
    MarkUnavailable,
    Note,
    Outcome,
    RetryAt,
    SetClaim,
    judge_launch_error,
    partial_launch_marks,
)
from gpuscale.errors import ProviderError
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, Provider

_LEAVING_STATES = (CloudNodeState.DELETING, CloudNodeState.GONE)
"""Provider states of a node that is no launch's answer (read per launch: an Enum member read as a class attribute
is a slow lookup in Python 3.11)."""

Record = Callable[[Note], None]
"""Where the launcher's notes go (the controller stamps them with the time and records them)."""


def named_offerings(exc: ProviderError) -> tuple[OfferingKey, ...]:
    """The offerings a provider error names as failed: its ``offerings`` attribute (set by the AWS provider from a
    fleet's error items), each an :class:`OfferingKey` or an object with an ``offering`` one; () when it names none."""
    return _offering_keys(getattr(exc, "offerings", None) or ())


def reported_offerings(provider: object) -> tuple[OfferingKey, ...]:
    """The offerings a provider reports as failed since the last call, by its optional ``availability_updates()``
    (the AWS provider: a fleet's failed overrides, also when it launched elsewhere); () for other providers."""
    poll = getattr(provider, "availability_updates", None)
    return _offering_keys(poll()) if callable(poll) else ()


def _offering_keys(items: Iterable[object]) -> tuple[OfferingKey, ...]:
    out: list[OfferingKey] = []
    for item in items:
        key = item if isinstance(item, OfferingKey) else getattr(item, "offering", None)
        if isinstance(key, OfferingKey):
            out.append(key)
    return tuple(out)


def apply_mark(availability: Availability, mark: MarkUnavailable, now: float, record: Record) -> None:
    """Carry out a :class:`MarkUnavailable`, noting it only when it extends the mark."""
    if availability.mark_unavailable(mark.offering, mark.until, mark.why):
        o = mark.offering
        record(
            Note(
                EventKind.OFFERING_UNAVAILABLE,
                f"offering/{o.instance_type}/{o.zone}/{o.capacity_type}",
                "Unavailable",
                f"{mark.why}: not used for {mark.until - now:.0f}s",
            )
        )


class Launcher:
    """Request ids, launches and their retries (see the module docstring). ``claims`` is the controller's table."""

    def __init__(
        self,
        provider: Provider,
        availability: Availability,
        rules: LaunchRules,
        record: Record,
        *,
        prefix: str = "gs",
    ) -> None:
        self.provider = provider
        self.availability = availability
        self.rules = rules
        self.record = record
        self.prefix = prefix
        self.retry_at: dict[str, float] = {}
        """Claim key -> when its launch is tried again."""
        self.attempts: dict[str, int] = {}
        """Claim key -> failed attempts so far (retryable errors)."""
        self.burnt: set[str] = set()
        """Request ids never to use again (their claim finished, or the provider says they are used)."""

    # ------------------------------------------------------------------------------------------------ ids
    def request_id(self, seed: Iterable[str], claims: MutableMapping[str, NodeClaim]) -> str:
        """A request id derived from ``seed``, skipping ids in use or burnt."""
        digest = hashlib.sha256("\x1f".join(seed).encode()).hexdigest()[:16]
        base = f"{self.prefix}-{digest}"
        rid, n = base, 0
        while rid in claims or rid in self.burnt:
            n += 1
            rid = f"{base}-{n}"
        return rid

    # ------------------------------------------------------------------------------------------------ timing
    def due(self, key: str, now: float) -> bool:
        """True if the claim's launch may be tried at ``now``."""
        return self.retry_at.get(key, -float("inf")) <= now

    def hold(self, key: str, until: float) -> None:
        """Do not try the claim's launch before ``until`` (its pool is backed off)."""
        self.retry_at[key] = until

    def listed(self, key: str) -> None:
        """The claim's node was listed: no retry is pending any more."""
        self.retry_at.pop(key, None)

    def forget(self, key: str) -> None:
        """The claim finished: its id is burnt and its retry state dropped."""
        self.burnt.add(key)
        self.retry_at.pop(key, None)
        self.attempts.pop(key, None)

    def wake_times(self) -> Iterable[float]:
        """When some waiting launch becomes due."""
        return self.retry_at.values()

    # ------------------------------------------------------------------------------------------------ launching
    def call(self, request: LaunchRequest) -> list[CloudNode]:
        """Ask the provider once for the nodes of another engine's demand (a GPR's); errors propagate to the caller,
        which judges them by their retry policy (no retry here)."""
        return list(self.provider.launch(request))

    def launch(
        self,
        key: str,
        request: LaunchRequest,
        claims: MutableMapping[str, NodeClaim],
        pool: NodePool | None,
        now: float,
    ) -> Outcome:
        """Ask the provider for the node of the Requested claim ``key`` once, and carry out the outcome."""
        c = claims[key]
        try:
            nodes = list(self.provider.launch(request))
        except ProviderError as exc:
            reported_offerings(self.provider)  # the same offerings the error names: taken from the error
            verdict = judge_launch_error(
                key,
                c,
                exc,
                attempts=self.attempts.get(key, 0),
                pool=pool,
                fallback_active=self.availability.fallback_active(c.pool, now),
                rules=self.rules,
                now=now,
                named=named_offerings(exc),
            )
            for action in verdict.actions:
                self._apply(action, claims, now)
            return verdict.outcome
        for mark in partial_launch_marks(reported_offerings(self.provider), self.rules, now):
            self._apply(mark, claims, now)
        live = [n for n in nodes if n.state not in _LEAVING_STATES]
        if not live:
            self._apply(BurnId(key), claims, now)
            self.record(
                Note(
                    EventKind.LAUNCH_RETRY,
                    f"nodeclaim/{key}",
                    "RequestIdUsed",
                    "request id already used by a node that is gone; using a new id",
                )
            )
            return Outcome.BURNT
        cn = live[0]
        self.retry_at.pop(key, None)
        self.attempts.pop(key, None)
        claims[key] = transition(c, ClaimEvent.LAUNCHED, now, node_id=cn.node_id, node_name=cn.node_name)
        self.availability.clear_backoff(c.pool)
        what = f"{c.instance_type} {c.capacity_type} in {c.zone} (${c.hourly_price:.4g}/h)"
        why = f" for {len(c.pods)} pod(s)" if c.pods else ""
        if c.replaces:
            why += f" to replace {c.replaces}"
        self.record(
            Note(
                EventKind.SCALE_UP,
                f"node/{cn.node_name or cn.node_id}",
                c.reason or "ScaleUp",
                f"launched {what}{why}",
                {
                    "request_id": key,
                    "pool": c.pool,
                    "instanceType": c.instance_type,
                    "zone": c.zone,
                    "capacityType": str(c.capacity_type),
                    "pods": list(c.pods),
                },
            )
        )
        return Outcome.OK

    def back_off(self, pool: str, base_s: float, now: float, why: str, *, exponential: bool = True) -> None:
        """Back ``pool`` off and note it."""
        delay = self.availability.back_off(
            pool, now, base_s, self.rules.max_backoff_s, exponential=exponential, reason=why
        )
        self.record(Note(EventKind.BACKOFF, f"pool/{pool}", "Backoff", f"{why}; no launches for {delay:.0f}s"))

    def _apply(self, action: object, claims: MutableMapping[str, NodeClaim], now: float) -> None:
        if isinstance(action, SetClaim):
            claims[action.key] = action.claim
        elif isinstance(action, Note):
            self.record(action)
        elif isinstance(action, MarkUnavailable):
            apply_mark(self.availability, action, now, self.record)
        elif isinstance(action, BackOff):
            self.back_off(action.pool, action.base_s, now, action.why, exponential=action.exponential)
        elif isinstance(action, AllowFallback):
            if action.announce:
                self.record(
                    Note(
                        EventKind.SPOT_FALLBACK,
                        f"pool/{action.pool}",
                        "SpotUnavailable",
                        "spot capacity unavailable: on-demand allowed until spot returns",
                    )
                )
            self.availability.allow_fallback(action.pool, action.until, "spot capacity unavailable")
        elif isinstance(action, RetryAt):
            self.retry_at[action.key] = action.at
            if action.attempts is not None:
                self.attempts[action.key] = action.attempts
        elif isinstance(action, BurnId):
            claims.pop(action.key)
            self.forget(action.key)
        else:  # pragma: no cover - the verdict's action types are closed
            raise TypeError(f"unknown launch action {action!r}")
