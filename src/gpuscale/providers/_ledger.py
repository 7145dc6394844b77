"""The request ledger kept in a node group's labels, as LKE pools and EKS managed node groups hold it.

One label ``requests.gpuscale.io/<request key>: "<seq>.<count>"`` per request the group serves: written in the same
call that raises the group's size, so a launch retried after a crash finds its entry and creates nothing. The
group's nodes, oldest first, are attributed to the entries in ``seq`` order (:func:`attribute`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpuscale.providers._support import digest_key

LEDGER_LABEL_PREFIX = "requests.gpuscale.io/"
Ledger = Mapping[str, tuple[int, int]]
"""request key -> (seq, node count)."""

_KEY_MAX = 36
_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE_RE = re.compile(r"^(\d+)\.(\d+)$")


def tag_key(value: str) -> str:
    """A request id (or pool name) as a key in labels and tags: itself when it is a valid Kubernetes label name of at
    most 36 characters (UUIDs qualify), else ``h-`` + 30 hex digits of its SHA-256."""
    if len(value) <= _KEY_MAX and _NAME_RE.match(value):
        return value
    return digest_key(value)


def split_ledger(labels: Mapping[str, str]) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """A group's labels as its ledger and the other labels (a ledger label whose value is not ``<seq>.<count>`` is
    another label)."""
    ledger: dict[str, tuple[int, int]] = {}
    rest: dict[str, str] = {}
    for k, v in labels.items():
        m = _VALUE_RE.match(v)
        if k.startswith(LEDGER_LABEL_PREFIX) and m:
            ledger[k[len(LEDGER_LABEL_PREFIX) :]] = (int(m.group(1)), int(m.group(2)))
        else:
            rest[k] = v
    return ledger, rest


def ledger_labels(ledger: Ledger) -> dict[str, str]:
    """The ledger as labels."""
    return {LEDGER_LABEL_PREFIX + k: f"{seq}.{n}" for k, (seq, n) in ledger.items()}


def next_seq(ledger: Ledger) -> int:
    """The ``seq`` of the next entry: one past the highest."""
    return max((s for s, _ in ledger.values()), default=0) + 1


def attribute(ledger: Ledger, node_ids: Iterable[str]) -> dict[str, str]:
    """node id -> the request key that owns it ('' for nodes beyond the ledger). ``node_ids``: oldest first."""
    nodes = list(node_ids)
    out: dict[str, str] = {}
    i = 0
    for key, (_, k) in sorted(ledger.items(), key=lambda kv: (kv[1][0], kv[0])):
        for node in nodes[i : i + k]:
            out[node] = key
        i += k
    for node in nodes[i:]:
        out[node] = ""
    return out
