"""``rightsize`` end to end in the simulator: a small pod that lands on a large warm node is moved, a few minutes
after it started, onto the cheapest node that holds it; the run is cheaper, nothing is launched twice."""

from __future__ import annotations

from typing import Any

from builders import catalog, itype
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import parse_scenario

CAT = catalog(itype("big", 28, 112, 1, "P100", price=0.26), itype("tiny", 4, 30, 1, "P100", price=0.14))
SCENARIO = """
name: rightsize
seed: 1
duration: 8h
catalog: x
pools:
  - name: gpu
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 5m, consolidateEmptyAfter: 30m}}
cloud:
  launchLatency: 40s
  registrationLatency: 50s
  devicePluginDelay: 90s
workload:
  - source: burst
    prefix: wide
    count: 1
    at: 0s
    runtime: 5m
    shape: {{cpu: 20, memory: 8Gi, gpus: 1}}
  - source: burst
    prefix: narrow
    count: 1
    at: 15m
    runtime: 5h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
{late}policy: {{name: gpuscale{extra}}}
"""
LATE = """  - source: burst
    prefix: late
    count: 1
    at: 21m
    runtime: 1h
    shape: {cpu: 2, memory: 2Gi}
"""


def _run(extra: str, late: str = "") -> tuple[dict[str, Any], list[Any]]:
    text = SCENARIO.format(extra=extra, late=late)
    res = simulate_policy(parse_scenario(text, source="r.yaml", catalog=CAT), "gpuscale")
    return res.report, [e for e in res.cluster.events if e.kind == "Consolidate" and "rightsize" in e.message]


def test_a_small_pod_on_a_large_warm_node_moves_to_the_cheapest_node_that_holds_it() -> None:
    plain, none = _run("")
    report, moves = _run(", rightsize: {minPodAge: 5m}")
    assert none == [] and len(moves) == 1
    (move,) = moves
    # the narrow pod landed on the warm 28-vCPU node at 15 min and is moved once it has run 5 minutes
    assert 20 * 60 <= move.at < 25 * 60 and "tiny" in move.message
    assert report["costUsd"] < plain["costUsd"] - 0.4  # about 5 h x $0.12/h saved
    assert report["duplicateLaunches"] == plain["duplicateLaunches"] == 0
    assert report["nodesLaunched"] == plain["nodesLaunched"] + 1
    # the pod is evicted once its new node is ready, binds there at once and runs to the end
    assert report["cluster"]["binds"] == 3 and report["cluster"]["pods_completed"] == 2
    assert report["pendingP99s"] <= plain["pendingP99s"]
    # woken when the pod reaches minPodAge; a saving under minSaving (here 46 %) is not taken
    assert [e.at for e in _run(", rightsize: {minPodAge: 1m}")[1]] == [16 * 60]
    assert _run(", rightsize: {minSaving: 0.5}")[1] == []


def test_the_node_being_right_sized_takes_no_new_pod() -> None:
    # a CPU pod arrives a minute after the decision: the old node (26 vCPUs free) is cordoned, so the pod does not
    # land there only to be evicted when the node drains
    report, moves = _run(", rightsize: {minPodAge: 5m}", LATE)
    assert len(moves) == 1
    assert report["cluster"]["evictions"] == 1 and report["duplicateLaunches"] == 0
