"""``rightsize: {maxSet: N}`` end to end in the simulator: two one-GPU pods that came minutes apart, each on the
cheapest node for it alone, are moved together onto one two-GPU node; the run is cheaper and nothing is launched
twice, also when the controller dies in the middle of the replacement."""

from __future__ import annotations

from typing import Any

from builders import catalog, crashing_options_factory, itype
from gpuscale.controller.options import options_controller
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.runner import ControllerCrash, SimResult, run_simulation
from gpuscale.sim.scenario import parse_scenario

CAT = catalog(itype("tiny", 4, 30, 1, "P100", price=0.14), itype("duo", 8, 60, 2, "P100", price=0.20))
SCENARIO = """
name: rightsize-set
seed: 1
duration: 8h
catalog: x
pools:
  - name: gpu
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 5m, consolidateEmptyAfter: 30m,
      budgets: [{{nodes: "100%"}}]}}
cloud:
  launchLatency: 40s
  registrationLatency: 50s
  devicePluginDelay: 90s
workload:
  - source: burst
    prefix: first
    count: 1
    at: 0s
    runtime: 5h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
  - source: burst
    prefix: second
    count: 1
    at: 10m
    runtime: 5h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
policy: {{name: gpuscale{extra}}}
"""
SET = ", rightsize: {minPodAge: 5m, maxSet: 2}"


def _moves(res: SimResult) -> list[Any]:
    return [e for e in res.cluster.events if e.kind == "Consolidate" and "rightsize" in e.message]


def _run(extra: str) -> SimResult:
    return simulate_policy(parse_scenario(SCENARIO.format(extra=extra), source="r.yaml", catalog=CAT), "gpuscale")


def test_two_nodes_each_the_cheapest_for_its_pod_go_to_one_node_holding_both() -> None:
    plain = _run("")
    single = _run(", rightsize: {minPodAge: 5m}")
    assert _moves(plain) == [] and _moves(single) == []  # one node at a time: tiny is the cheapest for each pod
    res = _run(SET)
    moves = _moves(res)
    # the second pod lands on a second tiny node at about 13 min and reaches minPodAge 5 minutes later: both nodes
    # are replaced by one duo node (0.20 $/h instead of 0.28) in the same round
    assert len(moves) == 2 and moves[0].at == moves[1].at and 15 * 60 <= moves[0].at < 20 * 60
    assert {m.object for m in moves} == {"node/gpu-00001", "node/gpu-00002"}
    assert all("rightsize set: 2 nodes" in m.message and "duo" in m.message for m in moves)
    r, p = res.report, plain.report
    assert r["costUsd"] < p["costUsd"] - 0.3  # about 4.7 h x 0.08 $/h
    assert r["duplicateLaunches"] == p["duplicateLaunches"] == 0
    assert r["nodesLaunched"] == p["nodesLaunched"] + 1 == 3 and r["nodesAliveAtEnd"] == 0
    # each pod is evicted once the duo node is ready, binds there and runs to the end
    assert r["cluster"]["evictions"] == 2 and r["cluster"]["binds"] == 4 and r["cluster"]["pods_completed"] == 2
    assert r["pendingP99s"] <= p["pendingP99s"]


def _crashing_at_launch(n: int) -> tuple[Any, list[Any]]:
    """An options controller factory whose first controller dies right after its ``n``-th launch took effect."""
    built: list[Any] = []
    seen = {"launches": 0}

    def factory(**kw: Any) -> Any:
        c = options_controller(**kw)
        if not built:
            cloud = kw["provider"]

            def hook(point: str) -> None:
                if point == "launch:after" and len(built) == 1:
                    seen["launches"] += 1
                    if seen["launches"] == n:
                        raise ControllerCrash(point)

            cloud.hook = hook
        built.append(c)
        return c

    return factory, built


def _crashed(factory: Any, built: list[Any]) -> SimResult:
    res = run_simulation(parse_scenario(SCENARIO.format(extra=SET), source="r.yaml", catalog=CAT), factory)
    assert len(built) == 2 and res.restarts == 1
    return res


def test_a_controller_restarted_mid_replacement_leaks_and_doubles_nothing() -> None:
    plain = _run("").report
    done = _run(SET)
    (at,) = {m.at for m in _moves(done)}
    # dies while the duo node boots (the old nodes cordoned, waiting for it): the new controller resumes the cordoned
    # nodes as draining; their pods wait for the duo node, which it adopts
    booting = _crashed(*crashing_options_factory(at + 60.0))
    # dies right after the duo node's launch took effect, before the old nodes are cordoned: the new controller has
    # no age for the pods (bound before it first looked), keeps the old nodes, and the duo node goes as empty
    launched = _crashed(*_crashing_at_launch(3))
    for res in (booting, launched):
        r = res.report
        assert r["duplicateLaunches"] == 0 and r["cloud"]["duplicate_nodes"] == 0
        assert r["nodesLaunched"] == 3  # the two tiny nodes and the one duo node: nothing launched twice
        assert r["nodesAliveAtEnd"] == 0 and r["cluster"]["pods_completed"] == 2
    assert booting.report["costUsd"] < plain["costUsd"] - 0.3  # the replacement went through
    assert _moves(launched) == []  # no Consolidate recorded: the decision died before the cordon
    assert launched.report["costUsd"] < plain["costUsd"] + 0.2  # at most the empty duo node's 30 minutes


KEEP_CAT = catalog(itype("big", 28, 112, 1, "P100", price=0.26), itype("tiny", 4, 30, 1, "P100", price=0.14))
KEEP = """
name: rightsize-keep-one
seed: 1
duration: 6h
catalog: x
pools:
  - name: gpu
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 5m, consolidateEmptyAfter: 30m,
      budgets: [{{nodes: "100%"}}]}}
cloud:
  launchLatency: 40s
  registrationLatency: 50s
  devicePluginDelay: 90s
workload:
  - source: burst
    prefix: gpu
    count: 1
    at: 0s
    runtime: 5h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
  - source: burst
    prefix: cpu
    count: 1
    at: 1m
    runtime: 5h
    shape: {{cpu: 10, memory: 8Gi}}
policy: {{name: gpuscale, rightsize: {{minPodAge: 5m, maxSet: 2{extra}}}}}
"""


def _keep(extra: str, crash_at: float | None = None) -> SimResult:
    factory, built = crashing_options_factory(crash_at)
    res = run_simulation(parse_scenario(KEEP.format(extra=extra), source="k.yaml", catalog=KEEP_CAT), factory)
    assert len(built) == (1 if crash_at is None else 2)
    return res


def test_keep_one_moves_a_gpu_pod_onto_the_free_gpu_of_a_node_running_a_cpu_pod() -> None:
    # The GPU pod gets a tiny node, the 10-vCPU CPU-only pod a big one (its GPU free). Once both are past minPodAge,
    # the set is replaced by one new big node holding both (both pods evicted, one more node booted); with keepOne
    # the tiny node is deleted and its pod moves onto the big node's free GPU: one eviction, nothing launched.
    replaced, kept = _keep(""), _keep(", keepOne: true")
    assert [m.message[:24] for m in _moves(replaced)] == ["rightsize set: 2 nodes ("] * 2
    (m,) = _moves(kept)
    assert m.object == "node/gpu-00001" and "onto gpu-00002, which stays" in m.message
    r, k = replaced.report, kept.report
    assert r["nodesLaunched"] == 3 and k["nodesLaunched"] == 2
    assert r["cluster"]["evictions"] == 2 and k["cluster"]["evictions"] == 1
    assert k["costUsd"] < r["costUsd"] - 0.02 and k["duplicateLaunches"] == r["duplicateLaunches"] == 0
    assert k["nodesAliveAtEnd"] == 0 and k["cluster"]["pods_completed"] == 2


def test_keep_one_restarted_after_the_decision_finishes_the_move() -> None:
    done = _keep(", keepOne: true")
    (m,) = _moves(done)
    for crash_at in (m.at + 1.0, m.at + 20.0):
        res = _keep(", keepOne: true", crash_at)
        r = res.report
        assert r["nodesLaunched"] == 2 and r["duplicateLaunches"] == 0 and r["cloud"]["duplicate_nodes"] == 0
        assert r["cluster"]["evictions"] == 1 and r["nodesAliveAtEnd"] == 0 and r["cluster"]["pods_completed"] == 2
        assert abs(r["costUsd"] - done.report["costUsd"]) < 0.01
