""":func:`~gpuscale.core.disruption.plan.destinations` patches its memo where a few node objects were replaced under
the same names or other nodes started or stopped being disrupted: the patched answer equals a fresh count, over
random sequences of such changes (pool, launching, cordon, a name in or out of the disrupted set). And the
consolidation step's candidate node set, made by a set comprehension when nothing is being replaced or held, is the
set built claim by claim, in the same iteration order."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpuscale.controller.loop import Controller
from gpuscale.controller.scaledown import ScaleDownSteps
from gpuscale.controller.shell import World
from gpuscale.core.disruption.passmemo import PassMemo
from gpuscale.core.disruption.plan import destinations
from gpuscale.core.model import Node
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.sim.engine import Dist
from test_consolidation_gate import CATALOG, FAST, _pool
from test_pass_inputs_cache import _run, _world


def _node(rng: random.Random, name: str) -> Node:
    return Node(
        name,
        CATALOG.by_name()["g1"].capacity,
        pool=rng.choice(["a", "b", "c", None]),
        launching=rng.random() < 0.15,
        unschedulable=rng.random() < 0.15,
    )


def _changed(rng: random.Random, n: Node) -> Node:
    """The node remade under its name: another pool, launching or cordon flipped, or an equal copy."""
    what = rng.randrange(4)
    if what == 0:
        return replace(n, pool=rng.choice(["a", "b", "c", None]))
    if what == 1:
        return replace(n, launching=not n.launching)
    if what == 2:
        return replace(n, unschedulable=not n.unschedulable)
    return replace(n)


@pytest.mark.parametrize("seed", range(6))
def test_patched_destinations_equal_a_fresh_count(seed: int) -> None:
    rng = random.Random(seed)
    memo = PassMemo()
    nodes = [_node(rng, f"n{i}") for i in range(rng.randint(8, 24))]
    disrupting: set[str] = set()
    patched = 0
    for _ in range(300):
        step = rng.random()
        if step < 0.5:  # one to three nodes remade in place
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(nodes))
                nodes[i] = _changed(rng, nodes[i])
        if step > 0.3 or rng.random() < 0.3:  # a node (or a name not among them) starts or stops being disrupted
            name = rng.choice([n.name for n in nodes] + ["gone"])
            disrupting ^= {name}
        if rng.random() < 0.03:  # another number of nodes: counted afresh
            nodes.append(_node(rng, f"m{rng.randrange(10**6)}"))
        before = memo.destinations
        got = destinations(list(nodes), set(disrupting), memo)
        made = memo.destinations
        assert made is not None
        patched += made is not before and before is not None and len(before[0]) == len(nodes)
        assert got == destinations(nodes, disrupting, None)
        assert made[6] == [not n.launching and n.name not in disrupting and not n.unschedulable for n in nodes]
        got[1].clear()  # a pass changes its counts: the memo's stay as they were
        got[3].clear()
    assert patched > 100


def test_the_steps_candidate_nodes_equal_the_claim_by_claim_set() -> None:
    """Every round of a simulated cluster with replacements: the candidate node set the consolidation step makes (a
    set comprehension when no node is being replaced or held) equals, element by element and in iteration order, the
    set built claim by claim (the Initialized claims' nodes, less nodes being replaced, their replacements and held
    claims)."""
    seen = {"rounds": 0, "replacing": 0}
    fresh = ScaleDownSteps._fresh_step_inputs

    def checked(self: Controller, w: World) -> tuple[set[str], set[str], dict[str, str], frozenset[str]]:
        got = fresh(self, w)
        replacing = self.replacements.by_old
        held = self.gpr.keys(self.claims)
        want: set[str] = set()
        for key, c in self.claims.in_phases((ClaimPhase.INITIALIZED,)):
            name = c.node_name
            if name and name not in replacing and c.replaces not in replacing and key not in held:
                want.add(name)
        assert got[0] == want and list(got[0]) == list(want)
        seen["rounds"] += 1
        seen["replacing"] += bool(replacing)
        return got

    pool = _pool("2", 20.0)
    slow = replace(FAST, launch_latency=Dist.const(30.0), device_plugin_delay=Dist.const(20.0))
    engine, cluster, ctrl = _world(pool, 5, slow)
    ctrl._fresh_step_inputs = checked.__get__(ctrl)  # type: ignore[method-assign]
    _run(engine, cluster, ctrl, 5, 300, [0, 1, 1, 2], [500, 2000, 6000], 1200.0, 200.0, 1500.0)
    assert seen["rounds"] > 100, seen
