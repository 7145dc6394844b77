"""Gangs on few new nodes.

A gang runs only once every member is bound, so a gang spread over k new nodes waits for the slowest of k cold
starts (launch, kubelet registration, device plugin): the more nodes, the longer the expected wait and the longer
its tail. When the planner buys new nodes for a gang's members it therefore prefers the options that hold the most
members per node, among those whose price per member is within ``tolerance`` of the cheapest: a gang of four
one-GPU pods takes two two-GPU nodes at 1 % more per GPU rather than four one-GPU nodes, but not a four-GPU node at
40 % more. ``tolerance`` None keeps the cheapest options only (the plain packer); the default is
:data:`gpuscale.core.plan.DEFAULT_GANG_TOLERANCE` (``PlannerConfig.gang_tolerance``, policy ``gangPacking``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

C = TypeVar("C")


def members_per_node(offers: Sequence[tuple[float, int]], members: int, tolerance: float) -> int:
    """How many of ``members`` gang pods one new node should hold: the largest ``min(fit, members)`` over the
    ``(price, pods that fit on an empty node)`` offers whose price per member is at most the cheapest one's times
    ``1 + tolerance``; 0 when no offer fits a member."""
    usable = [(price / min(fit, members), min(fit, members)) for price, fit in offers if fit > 0 and members > 0]
    if not usable:
        return 0
    cheapest = min(per for per, _ in usable)
    limit = cheapest * (1.0 + tolerance) + 1e-12
    return max(n for per, n in usable if per <= limit)


def fewest_nodes(
    candidates: Sequence[C], offers: Sequence[tuple[float, int]], members: int, tolerance: float
) -> list[C]:
    """The ``candidates`` (parallel to ``offers``) that hold at least :func:`members_per_node` members per node."""
    want = members_per_node(offers, members, tolerance)
    return [c for c, (_, fit) in zip(candidates, offers, strict=True) if fit > 0 and min(fit, members) >= want]
