"""EC2 events delivered to an SQS queue by EventBridge rules (the pattern Karpenter uses), parsed.

Three rules with source ``aws.ec2`` feed the queue (``docs/providers/aws.md`` has them): ``EC2 Spot Instance
Interruption Warning`` (the instance is reclaimed two minutes after the event's ``time``), ``EC2 Instance Rebalance
Recommendation`` (elevated interruption risk) and ``EC2 Instance State-change Notification`` (``detail.state``).
:func:`parse_message` turns one message body into an :class:`Ec2Event`, or None for anything else (other sources,
other detail types, malformed JSON): a queue shared with other consumers never breaks gpuscale.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
SPOT_NOTICE_S = 120.0
"""A spot instance is reclaimed two minutes after its interruption warning."""
LOST_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
"""Instance states after which a node is gone or going."""

EVENT_RULES: dict[str, dict[str, object]] = {
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": [SPOT_WARNING]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": [REBALANCE]},
    "state-change": {"source": ["aws.ec2"], "detail-type": [STATE_CHANGE]},
}
"""The EventBridge rule patterns whose target is the interruption queue."""


class Ec2EventKind(StrEnum):
    """What an EventBridge message says about an instance."""

    SPOT_WARNING = "spot-warning"
    REBALANCE = "rebalance"
    STATE_CHANGE = "state-change"


@dataclass(frozen=True, slots=True)
class Ec2Event:
    """One parsed message. ``at`` is the event's time (epoch seconds); ``state`` is set for state changes."""

    kind: Ec2EventKind
    instance_id: str
    at: float
    state: str = ""

    @property
    def deadline(self) -> float | None:
        """When a spot-warned instance is reclaimed."""
        return self.at + SPOT_NOTICE_S if self.kind is Ec2EventKind.SPOT_WARNING else None


def _epoch(text: object, default: float) -> float:
    if not isinstance(text, str):
        return default
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def parse_message(body: str, *, now: float) -> Ec2Event | None:
    """The event in an SQS message ``body``, or None when it is not one gpuscale handles."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("source") != "aws.ec2":
        return None
    detail = doc.get("detail")
    if not isinstance(detail, dict):
        return None
    instance_id = detail.get("instance-id")
    if not isinstance(instance_id, str) or not instance_id.startswith("i-"):
        return None
    at = _epoch(doc.get("time"), now)
    kind = doc.get("detail-type")
    if kind == SPOT_WARNING:
        return Ec2Event(Ec2EventKind.SPOT_WARNING, instance_id, at)
    if kind == REBALANCE:
        return Ec2Event(Ec2EventKind.REBALANCE, instance_id, at)
    if kind == STATE_CHANGE and isinstance(detail.get("state"), str):
        return Ec2Event(Ec2EventKind.STATE_CHANGE, instance_id, at, state=str(detail["state"]))
    return None
