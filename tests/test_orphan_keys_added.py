"""The orphan scan's "no orphan" answer is kept over a claim table whose keys were only added to
(:func:`~gpuscale.controller.scaledown._only_added`): over random sequences of claims added, replaced, removed
(``del``, ``pop``) and the table cleared, it says "only added" only when every key of before is still a key, and
it does say so after additions alone."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.scaledown import _only_added
from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import NodeClaim


def _claim(key: str) -> NodeClaim:
    return NodeClaim(key, "gpu", "g1", "z1", CapacityType.ON_DEMAND, node_name=f"n-{key}")


@pytest.mark.parametrize("seed", range(10))
def test_only_added_means_no_key_went(seed: int) -> None:
    rng = random.Random(seed)
    table = ClaimTable()
    said = {True: 0, False: 0}
    for _ in range(200):
        before, version, size = set(table), table.keys_version, len(table)
        only_adds = rng.random() < 0.4
        for _ in range(rng.randint(1, 4)):
            step = rng.random()
            key = f"k{rng.randrange(30)}"
            if only_adds or step < 0.5:
                table[key] = _claim(key)
            elif step < 0.65 and key in table:
                table[key] = replace(table[key], node_id="other")  # (the same key: its keys unchanged)
            elif step < 0.8 and table:
                del table[rng.choice(sorted(table))]
            elif step < 0.95 and table:
                table.pop(rng.choice(sorted(table)))
            elif step >= 0.95:
                table.clear()
        answer = _only_added(table, version, size)
        said[answer] += 1
        if answer:
            assert before <= set(table)
        if only_adds:
            assert answer
    assert said[True] > 50 and said[False] > 20, said
