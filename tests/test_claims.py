"""ClaimTable: a dict of claims whose phase and node-name indexes always agree with a scan of the table."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.controller.claims import ClaimTable
from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim

PHASES = list(ClaimPhase)
LEAVING = [ClaimPhase.DRAINING, ClaimPhase.FAILED, ClaimPhase.DELETING]


def claim(key: str, phase: ClaimPhase, node: str) -> NodeClaim:
    return NodeClaim(key, "gpu", "g1", "z1", CapacityType.ON_DEMAND, phase=phase, node_name=node)


ops = st.lists(
    st.tuples(
        st.sampled_from(["set", "del", "pop", "clear"]),
        st.sampled_from([f"k{i}" for i in range(6)]),
        st.sampled_from(PHASES),
        st.sampled_from(["", "n0", "n1", "n2"]),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_indexes_match_a_scan_after_any_changes(steps: list[tuple[str, str, ClaimPhase, str]]) -> None:
    table = ClaimTable()
    plain: dict[str, NodeClaim] = {}
    names = table.watch_names()
    changed_keys = table.watch_keys()
    groups = ([PHASES[0]], (PHASES[0],), LEAVING, frozenset(LEAVING), tuple(LEAVING), PHASES, frozenset(PHASES))
    for op, key, phase, node in steps:
        kept_answers = {id(g): (g, table.in_phases(g)) for g in groups}
        keys_before, keys_version = set(plain), table.keys_version
        answers_before = {name: table.by_node_name(name) for name in ("n0", "n1", "n2")}
        in_phase_before = {p: [(k, id(c)) for k, c in plain.items() if c.phase is p] for p in PHASES}
        phase_versions = {p: table.phase_version(p) for p in PHASES}
        plain_before = dict(plain)
        if op == "set":
            table[key] = plain[key] = claim(key, phase, node)
        elif op == "del" and key in plain:
            del table[key], plain[key]
        elif op == "pop":
            assert table.pop(key, None) == plain.pop(key, None)
        elif op == "clear" and len(plain) > 4:
            table.clear()
            plain.clear()
        assert dict(table) == plain and list(table) == list(plain)
        assert (table.keys_version != keys_version) == (set(plain) != keys_before)  # moves with the keys only
        for p in PHASES:  # a phase's claims changed (entered, left, another object, another order): its version moved
            if [(k, id(c)) for k, c in plain.items() if c.phase is p] != in_phase_before[p]:
                assert table.phase_version(p) != phase_versions[p]
        for group in ([phase], (phase,), LEAVING, frozenset(LEAVING), tuple(LEAVING), PHASES, frozenset(PHASES)):
            scan = [(k, c) for k, c in plain.items() if c.phase in group]
            answer = table.in_phases(group)  # frozensets and tuples are answered from a memo
            assert list(answer) == scan
            if isinstance(answer, list):
                answer.clear()  # each caller's own list
            assert list(table.in_phases(group)) == scan
        for group, earlier in kept_answers.values():  # a kept answer is the very same object only while it is right
            again = table.in_phases(group)
            if again is earlier:
                assert isinstance(group, tuple | frozenset) and list(again) == [
                    (k, c) for k, c in plain.items() if c.phase in group
                ]
        for p in PHASES:
            assert table.count(p) == sum(1 for c in plain.values() if c.phase is p)
        for name in ("n0", "n1", "n2", ""):
            first = next(((k, c) for k, c in plain.items() if c.node_name == name), None)
            assert table.by_node_name(name) == (first if name else None)
            assert table.names_node(name) == (first is not None and bool(name))
        for name, before in answers_before.items():  # a node's claim changed: its name is reported
            after = table.by_node_name(name)
            if (after is None) != (before is None) or (after and before and after[1] is not before[1]):
                assert name in names
        assert "" not in names
        names.clear()
        before_claims = {k: id(c) for k, c in plain_before.items()}
        after_claims = {k: id(c) for k, c in plain.items()}
        # the key watcher names exactly the keys whose claim was added, replaced by another object or removed
        assert changed_keys == {
            k for k in before_claims.keys() | after_claims.keys() if before_claims.get(k) != after_claims.get(k)
        }
        changed_keys.clear()


def test_changing_through_other_dict_methods_is_refused() -> None:
    table = ClaimTable()
    c = claim("a", ClaimPhase.REQUESTED, "")
    calls: list[Callable[[], object]] = [
        lambda: table.update(a=c),
        lambda: table.setdefault("a", c),
        lambda: table.popitem(),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="ClaimTable changes only"):
            call()
    with pytest.raises(KeyError):
        table.pop("missing")
    assert table == {}


def test_version_counts_real_changes_only() -> None:
    table = ClaimTable()
    a = claim("a", ClaimPhase.REQUESTED, "")
    table["a"] = a
    v = table.version
    table["a"] = a  # the same object again: nothing changed
    assert table.version == v
    table["a"] = claim("a", ClaimPhase.LAUNCHED, "n1")
    table.pop("a")
    table.clear()
    assert table.version == v + 3
