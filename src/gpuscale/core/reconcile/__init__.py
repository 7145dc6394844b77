"""The node reconcile's decisions, as pure functions of one round's observation.

The controller (``controller/loop.py``) observes the cluster and the provider, calls these functions with what it
saw, the claim table, the offering availability, its settings and ``now``, and carries out the action record each
returns (:class:`~gpuscale.core.reconcile.records.Decisions`): claims set or finished, offerings marked
unavailable, nodes cordoned, drains started, pods evicted or held, nodes deleted, orphaned Node objects removed,
notes. Launch errors come back as data: :func:`judge_launch_error` decides from the error's retry policy alone what
happens next (the one retry layer). Nothing here does I/O or reads a clock.
"""

from gpuscale.core.reconcile.claims import (
    ADVANCING,
    adopt_claim,
    advance_claim,
    expire_deadlines,
    on_provider_events,
    progress_replacements,
    start_drain,
    sync_claims,
)
from gpuscale.core.reconcile.drain import OrphanScan, drain_step, orphan_step
from gpuscale.core.reconcile.launching import (
    AllowFallback,
    BackOff,
    BurnId,
    LaunchRules,
    LaunchVerdict,
    Outcome,
    RetryAt,
    judge_launch_error,
    next_try_in,
    retry_delay,
)
from gpuscale.core.reconcile.records import (
    Action,
    ClearRetry,
    CloudNodeView,
    Cordon,
    Decisions,
    DeleteNode,
    DrainStarted,
    DropReplacement,
    EventKind,
    Evict,
    EvictBlocked,
    FinishClaim,
    Fleet,
    MarkUnavailable,
    Note,
    ProviderEventView,
    RemoveOrphan,
    Rules,
    SetClaim,
    find_node,
)

__all__ = [
    "ADVANCING",
    "Action",
    "AllowFallback",
    "BackOff",
    "BurnId",
    "ClearRetry",
    "CloudNodeView",
    "Cordon",
    "Decisions",
    "DeleteNode",
    "DrainStarted",
    "DropReplacement",
    "EventKind",
    "Evict",
    "EvictBlocked",
    "FinishClaim",
    "Fleet",
    "LaunchRules",
    "LaunchVerdict",
    "MarkUnavailable",
    "Note",
    "OrphanScan",
    "Outcome",
    "ProviderEventView",
    "RemoveOrphan",
    "RetryAt",
    "Rules",
    "SetClaim",
    "adopt_claim",
    "advance_claim",
    "drain_step",
    "expire_deadlines",
    "find_node",
    "judge_launch_error",
    "next_try_in",
    "on_provider_events",
    "orphan_step",
    "progress_replacements",
    "retry_delay",
    "start_drain",
    "sync_claims",
]
