"""``pod_moves`` (the gate's per-round diff of bound pods by node) against its definition on random observations."""

from __future__ import annotations

import random

from builders import pod
from gpuscale.controller.consolidation import pod_moves
from gpuscale.core.model import Pod


def _definition(before: dict[str, list[Pod]], after: dict[str, list[Pod]]) -> tuple[set[str], set[str]]:
    left, moved = set(), set()
    for name in before.keys() | after.keys():
        old = {p.key for p in before.get(name, ())}
        new = {p.key for p in after.get(name, ())}
        if old != new:
            moved.add(name)
            if not old <= new:
                left.add(name)
    return left, moved


def test_pod_moves_matches_its_definition() -> None:
    rng = random.Random(3)
    pods = [pod(f"p{i}", node="x") for i in range(12)]
    for _ in range(400):
        obs = []
        for _ in range(2):
            by_node: dict[str, list[Pod]] = {}
            for n in rng.sample(["a", "b", "c", "d", "e"], rng.randrange(0, 6)):
                by_node[n] = rng.sample(pods, rng.randrange(0, 4))  # empty lists too, as a node with no pods
            obs.append(by_node)
        before, after = obs
        if rng.random() < 0.3:  # the same list objects, as unchanged nodes between two rounds
            after.update({k: v for k, v in before.items() if rng.random() < 0.5})
        assert pod_moves(before, after) == _definition(before, after)
