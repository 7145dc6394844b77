"""``spotToSpot``: the node being replaced is cordoned at the decision, so that no pod lands on it while its
replacement (room for its own pods only) boots (table test of :func:`is_spot_swap`, one simulated run)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from builders import pod
from gpuscale.core.disruption import ActionKind, DisruptionAction, DisruptionReason
from gpuscale.core.disruption.spotswap import SpotSwapRule, is_spot_swap, swap_spot
from gpuscale.core.model import CapacityType
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import parse_scenario
from test_repack import SPOT_CAT, SPOT_POOL, SPOT_SIM, _kept, _spot_node


def test_is_spot_swap_tells_spot_to_spot_replacements_only() -> None:
    n = _spot_node()
    p = pod("p", cpu=3000, milli=200, node="n1")
    (action,) = swap_spot(_kept(), [n], [p], {"gpu": SPOT_POOL}, SPOT_CAT, 100.0, {}, SpotSwapRule(), {}).actions
    assert is_spot_swap(action, n)
    (r,) = action.replacements
    on_demand = replace(action, replacements=(replace(r, capacity_type=CapacityType.ON_DEMAND),))
    delete = DisruptionAction(ActionKind.DELETE, "n1", "gpu", DisruptionReason.EMPTY, "m", (), (), 1.0)
    assert not is_spot_swap(on_demand, n)  # a pass's replacement of a spot node (never by spot)
    assert not is_spot_swap(action, _spot_node(ct="on-demand"))  # a spot-fallback node replaced by spot
    assert not is_spot_swap(delete, n) and not is_spot_swap(action, _spot_node("n2"))


LATE = """  - source: burst
    prefix: late
    count: 1
    at: 1230s
    runtime: 1h
    shape: {{cpu: 2, memory: 2Gi}}
"""


def test_the_node_being_swapped_takes_no_new_pod() -> None:
    # the swap is decided at 20 min and its tiny replacement is ready at 22 min; a CPU pod arriving at 20.5 min
    # does not land on the big node (cordoned) only to be evicted at the drain: it waits for the tiny node
    text = SPOT_SIM.replace("policy:", LATE + "policy:").format(extra=", spotToSpot: true")
    res = simulate_policy(parse_scenario(text, source="s.yaml", catalog=SPOT_CAT), "gpuscale")
    report: dict[str, Any] = res.report
    (swap,) = [e for e in res.cluster.events if e.kind == "Consolidate" and "spot to spot" in e.message]
    assert swap.at < 1230 and "replace by tiny spot" in swap.message
    assert report["cluster"]["evictions"] == 1  # the small pod only (2 with the late pod landing on the big node)
    assert report["cluster"]["binds"] == 4 and report["cluster"]["pods_completed"] == 3
    assert report["duplicateLaunches"] == 0 and report["nodesLaunched"] == 2
