"""A restarted controller's claims from its recorded ones (GPUNodeClaims) and the provider's node list
(:func:`gpuscale.core.reconcile.claims.restore_claims`, pure: table tests), and the claim table's change feed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuscale.controller.claims import ClaimTable
from gpuscale.core.nodeclaim import DEFAULT_DEADLINES, ClaimPhase, NodeClaim
from gpuscale.core.reconcile.claims import restore_claim, restore_claims
from gpuscale.core.resources import Resources
from gpuscale.providers.base import CloudNodeState
from test_reconcile_core import FLEET, RULES, T4, claim, cloud, k8s

NOW = 1_000.0
P = ClaimPhase


def record(key: str, phase: ClaimPhase, *, since: float = 900.0, node_id: str = "", name: str = "") -> NodeClaim:
    """A claim as its GPUNodeClaim records it: no expected capacity or deadlines, the reason and pods it had."""
    c = claim(key, phase, since=since, node_id=node_id, name=name)
    return replace(c, expected=Resources(), deadlines=DEFAULT_DEADLINES, hourly_price=0.0, reason="ScaleUp",
                   pods=("ml/a",), created_at=800.0)  # fmt: skip


RESTORE_TABLE = [
    # (recorded phase, recorded node id, provider lists it, Node registered) -> (restored phase or None: stale)
    (P.REQUESTED, "", False, False, P.REQUESTED),  # relaunched under the same id
    (P.REQUESTED, "", True, False, P.LAUNCHED),  # the launch went through before the crash
    (P.REQUESTED, "", True, True, P.INITIALIZED),
    (P.LAUNCHED, "n1", True, False, P.LAUNCHED),
    (P.LAUNCHED, "n1", True, True, P.INITIALIZED),
    (P.LAUNCHED, "n1", False, True, P.LAUNCHED),  # launched long ago, not listed, but its Node joined: the list lags
    (P.INITIALIZED, "n1", True, True, P.INITIALIZED),
    (P.DRAINING, "n1", True, True, P.DRAINING),
    (P.FAILED, "n1", True, False, P.FAILED),  # its node is still to be deleted
    (P.INITIALIZED, "n1", False, True, None),  # the provider does not list it: gone
    (P.DRAINING, "n1", False, False, None),
    (P.DELETING, "n1", False, False, None),
    (P.FAILED, "", False, False, None),
]


@pytest.mark.parametrize(("phase", "node_id", "listed", "registered", "want"), RESTORE_TABLE)
def test_restore_table(
    phase: ClaimPhase, node_id: str, listed: bool, registered: bool, want: ClaimPhase | None
) -> None:
    rec = record("r1", phase, node_id=node_id, name="node-1" if node_id else "")
    provider = [cloud("r1", "n1", "node-1", at=850.0)] if listed else []
    nodes = {"node-1": k8s("node-1", rid="r1")} if registered else {}
    out = restore_claims({"r1": rec}, provider, nodes, FLEET, RULES, NOW)
    if want is None:
        assert out.stale == ["r1"] and not out.claims
        assert [n.reason for n in out.notes] == ["Deleted" if phase in (P.DELETING, P.FAILED) else "NodeLost"]
        return
    assert out.stale == []
    got = out.claims["r1"]
    assert got.phase is want
    assert got.pods == ("ml/a",) and got.pool == "gpu" and got.created_at == 800.0, "what the record kept"
    assert got.expected == T4.capacity and got.hourly_price == 0.6 and got.deadlines == RULES.deadlines
    if listed:
        assert (got.node_id, got.node_name) == ("n1", "node-1")
    if want is P.REQUESTED:
        assert got.since == NOW, "a fresh launch deadline"
    if phase is P.INITIALIZED:
        assert got.since == 900.0 and got.reason == "ScaleUp", "nothing happened: the record as it was"


def test_a_launched_record_within_the_lost_grace_is_kept_and_foreign_records_are_left_alone() -> None:
    recent = record("r1", P.LAUNCHED, since=NOW - 10, node_id="n1")
    old = record("r2", P.LAUNCHED, since=NOW - 100, node_id="n2")
    gpr = record("gpr-x-a1", P.INITIALIZED, node_id="n3")
    out = restore_claims(
        {"r1": recent, "r2": old, "gpr-x-a1": gpr}, [], {}, FLEET, RULES, NOW, foreign=lambda k: k.startswith("gpr-")
    )
    assert list(out.claims) == ["r1"] and out.stale == ["r2"]


def test_records_are_restored_oldest_first_and_matched_by_node_id() -> None:
    a = replace(record("ra", P.INITIALIZED, node_id="na", name="old-name"), created_at=700.0)
    b = replace(record("rb", P.REQUESTED), created_at=600.0)
    listed = [cloud("other", "na", "new-name", CloudNodeState.RUNNING)]
    out = restore_claims({"ra": a, "rb": b}, listed, {}, FLEET, RULES, NOW)
    assert list(out.claims) == ["rb", "ra"]
    assert out.claims["ra"].node_name == "new-name"


def test_a_record_of_an_unknown_pool_keeps_what_it_says() -> None:
    rec = replace(record("r1", P.INITIALIZED, node_id="n1"), pool="gone-pool", hourly_price=1.5)
    got = restore_claim(rec, FLEET, RULES)
    assert got.expected == Resources() and got.hourly_price == 1.5 and got.pool == "gone-pool"


def test_the_claim_table_tells_its_listener_of_every_change() -> None:
    seen: list[tuple[str, str | None]] = []
    table = ClaimTable()
    table.listener = lambda key, c: seen.append((key, None if c is None else str(c.phase)))
    c = claim("r1", P.REQUESTED)
    table["r1"] = c
    table["r1"] = c  # the same object: no change
    table["r1"] = replace(c, phase=P.LAUNCHED)
    table["r2"] = claim("r2", P.REQUESTED)
    table.pop("r1")
    table.clear()
    assert seen == [("r1", "Requested"), ("r1", "Launched"), ("r2", "Requested"), ("r1", None), ("r2", None)]
