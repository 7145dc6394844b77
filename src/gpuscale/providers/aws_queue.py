"""The interruption queue: EC2 events from EventBridge read off SQS and turned into provider events.

Each :meth:`InterruptionQueue.drain` receives without waiting (``WaitTimeSeconds=0``: a reconcile never blocks), at
most ``max_batches`` x 10 messages, and deletes what it read, including messages it drops (other sources, instances
that are not gpuscale's, malformed bodies). A spot warning becomes ``spot-interruption`` with the reclaim deadline, a
rebalance recommendation ``rebalance-recommendation``, a state change to a lost state ``node-failed`` unless gpuscale
deleted the instance itself. A queue name that does not exist is a configuration error
(:class:`~gpuscale.errors.InputError` naming ``GPUSCALE_AWS_INTERRUPTION_QUEUE``).
"""

from __future__ import annotations

from collections.abc import Callable, Container

from gpuscale.clock import Clock
from gpuscale.errors import InputError, InvalidProviderRequest, NotFound
from gpuscale.providers.aws_errors import AwsClients
from gpuscale.providers.aws_events import LOST_STATES, Ec2EventKind, parse_message
from gpuscale.providers.base import ProviderEvent, ProviderEventKind

__all__ = ["InterruptionQueue"]


class InterruptionQueue:
    """One SQS queue fed by the EventBridge rules of ``docs/providers/aws.md``."""

    def __init__(self, aws: AwsClients, name: str, region: str, clock: Clock) -> None:
        self.aws = aws
        self.name = name
        self.region = region
        self.clock = clock
        self._url: str | None = name if name.startswith(("https://", "http://")) else None

    def url(self) -> str:
        """The queue's URL (looked up once)."""
        if self._url is None:
            name = self.name
            try:
                raw = self.aws.call(f"find SQS queue {name}", lambda: self.aws("sqs").get_queue_url(QueueName=name))
            except (NotFound, InvalidProviderRequest) as exc:
                raise InputError(
                    f"SQS queue {name!r} does not exist in {self.region}",
                    where="GPUSCALE_AWS_INTERRUPTION_QUEUE",
                    fix="create it and its EventBridge rules (docs/providers/aws.md), or unset it",
                ) from exc
            self._url = str(raw["QueueUrl"])
        return self._url

    def drain(
        self, owner: Callable[[str], str | None], deleted: Container[str], *, max_batches: int = 10
    ) -> list[ProviderEvent]:
        """Events for gpuscale's instances; ``owner(instance_id)`` is the request id, None for other instances."""
        url = self.url()
        sqs = self.aws("sqs")
        now = self.clock.now()
        out: list[ProviderEvent] = []
        for _ in range(max_batches):
            answer = self.aws.call(
                "receive interruption events",
                lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0),
            )
            messages = answer.get("Messages") or []
            if not messages:
                break
            for m in messages:
                ev = self._event(str(m.get("Body", "")), now, owner, deleted)
                if ev is not None:
                    out.append(ev)
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            self.aws.call(
                "delete interruption events",
                lambda e=entries: sqs.delete_message_batch(QueueUrl=url, Entries=e),  # type: ignore[misc]
            )
        return out

    @staticmethod
    def _event(
        body: str, now: float, owner: Callable[[str], str | None], deleted: Container[str]
    ) -> ProviderEvent | None:
        ev = parse_message(body, now=now)
        if ev is None:
            return None
        if ev.kind is Ec2EventKind.SPOT_WARNING:
            kind, message = ProviderEventKind.SPOT_INTERRUPTION, "EC2 spot interruption warning"
        elif ev.kind is Ec2EventKind.REBALANCE:
            kind, message = ProviderEventKind.REBALANCE_RECOMMENDATION, "EC2 rebalance recommendation"
        elif ev.state in LOST_STATES and ev.instance_id not in deleted:
            kind, message = ProviderEventKind.NODE_FAILED, f"instance is {ev.state}"
        else:
            return None
        request_id = owner(ev.instance_id)
        if request_id is None:
            return None  # not one of gpuscale's instances
        return ProviderEvent(
            kind, node_id=ev.instance_id, request_id=request_id, message=message, at=ev.at, deadline=ev.deadline
        )
