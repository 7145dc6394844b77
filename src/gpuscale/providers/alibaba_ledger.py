"""The request ledger of an ACK node pool, kept in its scaling group's tags (see ``providers/alibaba.py``).

Entries are ``<request id, percent-encoded>/<slot>``, with ``~<instance id>`` once the slot's node is being removed,
joined by commas into tag values of at most :data:`TAG_VALUE_MAX` characters under keys ``gpuscale.ledger.<i>``.
Pure: no SDK, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

__all__ = ["LEDGER_PREFIX", "TAGS_MAX", "TAG_VALUE_MAX", "Entry", "bind", "decode_ledger", "encode_ledger"]

LEDGER_PREFIX = "gpuscale.ledger."
TAG_VALUE_MAX = 128
"""Characters of one tag value (ECS and Auto Scaling tag values allow 128)."""
TAGS_MAX = 20
"""Tags on one scaling group (Auto Scaling allows 20)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One slot of a pool's ledger: a request's slot, live (``gone is None``) or with its node ``gone`` (an instance
    id) being removed."""

    request_id: str
    slot: int
    gone: str | None = None

    def encode(self) -> str:
        tail = "" if self.gone is None else "~" + self.gone
        return f"{quote(self.request_id, safe='').replace('~', '%7E')}/{self.slot}{tail}"

    @classmethod
    def decode(cls, text: str) -> Entry:
        head, sep, gone = text.partition("~")
        rid, _, slot = head.rpartition("/")
        return cls(unquote(rid), int(slot), gone if sep else None)


def encode_ledger(entries: Sequence[Entry]) -> dict[str, str]:
    """The ledger as scaling-group tags ``gpuscale.ledger.<i>`` of at most :data:`TAG_VALUE_MAX` characters each."""
    tags: list[str] = []
    for text in (e.encode() for e in entries):
        if tags and len(tags[-1]) + 1 + len(text) <= TAG_VALUE_MAX:
            tags[-1] += "," + text
        else:
            tags.append(text)
    return {f"{LEDGER_PREFIX}{i}": v for i, v in enumerate(tags)}


def decode_ledger(tags: Mapping[str, str]) -> list[Entry]:
    """Inverse of :func:`encode_ledger` (other tags are ignored)."""
    parts = sorted(
        (int(k[len(LEDGER_PREFIX) :]), v)
        for k, v in tags.items()
        if k.startswith(LEDGER_PREFIX) and k[len(LEDGER_PREFIX) :].isdigit()
    )
    return [Entry.decode(t) for _, v in parts for t in v.split(",") if t]


def bind(entries: Sequence[Entry], instance_ids: Sequence[str]) -> tuple[dict[str, Entry], list[Entry]]:
    """Which ledger entry each node serves, and the entries still waiting for a node.

    Nodes (in creation order) and entries (in ask order) pair up once the nodes named by removal tombstones are
    set aside from both: one task at a time per pool makes ACK create nodes in the order they were asked for.
    """
    tomb = {e.gone for e in entries if e.gone}
    live = [e for e in entries if not e.gone]
    nodes = [i for i in instance_ids if i not in tomb]
    return dict(zip(nodes, live, strict=False)), live[len(nodes) :]
