"""The request ledger in labels that the LKE and EKS node-group providers share (gpuscale/providers/_ledger.py)."""

from __future__ import annotations

from gpuscale.providers._ledger import (
    LEDGER_LABEL_PREFIX,
    attribute,
    ledger_labels,
    next_seq,
    split_ledger,
    tag_key,
)


def test_labels_split_into_ledger_and_the_rest_and_back() -> None:
    labels = {
        "team": "ml",
        LEDGER_LABEL_PREFIX + "r1": "1.2",
        LEDGER_LABEL_PREFIX + "r2": "3.1",
        LEDGER_LABEL_PREFIX + "odd": "not-a-count",  # not <seq>.<count>: an ordinary label
    }
    ledger, rest = split_ledger(labels)
    assert ledger == {"r1": (1, 2), "r2": (3, 1)}
    assert rest == {"team": "ml", LEDGER_LABEL_PREFIX + "odd": "not-a-count"}
    assert {**rest, **ledger_labels(ledger)} == labels
    assert next_seq(ledger) == 4 and next_seq({}) == 1


def test_nodes_oldest_first_go_to_entries_in_seq_order_and_the_rest_to_none() -> None:
    ledger = {"late": (2, 1), "early": (1, 2), "tie-b": (3, 1), "tie-a": (3, 1)}
    owners = attribute(ledger, ["n1", "n2", "n3", "n4", "n5", "n6"])
    assert owners == {"n1": "early", "n2": "early", "n3": "late", "n4": "tie-a", "n5": "tie-b", "n6": ""}
    assert attribute(ledger, ["n1"]) == {"n1": "early"}  # fewer nodes than the ledger counts: the first ones
    assert attribute({}, ["n1"]) == {"n1": ""}


def test_keys_are_the_id_when_a_short_label_name_else_a_digest() -> None:
    uuid = "0b6e3c1e-52a4-4e4b-9a3e-6f0d0c9a1b2c"
    assert tag_key(uuid) == uuid and tag_key("r1") == "r1"
    for bad in ("x" * 37, "ns/name", "-lead", "trail-", ""):
        key = tag_key(bad)
        assert key.startswith("h-") and len(key) == 32 and key == tag_key(bad)
