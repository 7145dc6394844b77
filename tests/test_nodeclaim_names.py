"""GPUNodeClaim names from claim keys: valid lowercase RFC 1123 names of at most 253 characters, deterministic,
collision-free, and read back to the same key (second nodes of a request and odd provider node ids included)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import ClaimPhase, new_claim
from gpuscale.kube.nodeclaims import recordable
from gpuscale.manifests.nodeclaims import MAX_NAME, NAME_PATTERN, claim_object, object_name, read_record
from gpuscale.manifests.problems import Doc

SUBDOMAIN = re.compile(NAME_PATTERN)
LABEL = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
NODE_ID = st.one_of(LABEL, st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=80))
KEYS = st.one_of(LABEL, st.builds(lambda r, n: f"{r}#{n}", LABEL, NODE_ID))


def _valid(name: str) -> bool:
    return len(name) <= MAX_NAME and SUBDOMAIN.match(name) is not None and all(len(p) <= 63 for p in name.split("."))


def test_names_of_the_three_forms() -> None:
    assert object_name("gs-3f9a1c0de2b47a55") == "gs-3f9a1c0de2b47a55", "a request id is its own name"
    assert object_name("gpr-5dbf9af532c7-a0#kwok-ab12") == "gpr-5dbf9af532c7-a0.kwok-ab12"
    assert object_name("gpr-5dbf9af532c7-a0#51234567") == "gpr-5dbf9af532c7-a0.51234567", "a Linode id"
    odd = object_name("gs-1#i-0ABC_def")
    assert odd.startswith("x.gs-1-i-0abc-def.") and len(odd.split(".")[2]) == 32 and _valid(odd)
    assert object_name("gs-1#i-0abc-DEF") != object_name("gs-1#i-0ABC-def"), "case is kept apart by the hash"
    long_key = "gpr-" + "a" * 59 + "#" + "n" * 180
    assert _valid(object_name(long_key)) and object_name(long_key).startswith("x.")


@given(st.lists(KEYS, min_size=2, max_size=30, unique=True))
def test_names_are_valid_deterministic_and_collision_free(keys: list[str]) -> None:
    names = [object_name(k) for k in keys]
    assert all(_valid(n) for n in names), names
    assert len(set(names)) == len(keys), "two keys, one name"
    assert names == [object_name(k) for k in keys]


@given(KEYS)
def test_a_record_reads_back_to_its_key(key: str) -> None:
    claim = new_claim(key, "ada", "g2-gpu-rtx4000a1-s", "us-ord", CapacityType.ON_DEMAND, 1_000_000.0)
    obj = claim_object(claim, 2, key)
    assert recordable(key) and obj["metadata"]["name"] == object_name(key) and obj["spec"]["requestId"] == key
    got = read_record(Doc("x", 1, None, []), obj)
    assert got is not None
    back, attempts = got
    assert back.request_id == key and back.phase is ClaimPhase.REQUESTED and attempts == 2


def test_gpr_records_carry_the_gpr_label_and_a_renamed_record_is_refused() -> None:
    claim = new_claim("gpr-5dbf9af532c7-a0#kwok-ab12", "ada", "t", "us-ord", CapacityType.ON_DEMAND, 1.0)
    obj = claim_object(claim)
    assert obj["metadata"]["labels"] == {"gpuscale.io/pool": "ada", "gpuscale.io/gpr": "gpr-5dbf9af532c7"}
    obj["metadata"]["name"] = "gpr-5dbf9af532c7-a0"  # the first node's name: not this key's record
    doc = Doc("x", 1, None, [])
    assert read_record(doc, obj) is None and "differs from metadata.name" in str(doc.problems[0])
    assert (
        not recordable("GS_1")
        and not recordable("gs-1#with space")
        and not recordable("gs-1#n\u00e9")
        and not recordable("gs-1#" + "n" * 300)
    )
