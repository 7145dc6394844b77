"""``cpuPodsOntoEmpty: false`` (gpuscale.core.disruption.cpuonly): an Empty deletion of a GPU node running only
CPU-only pods stands when its pods fit on nodes running pods; otherwise it is dropped and the empty node its pods would
have gone to is deleted instead. Table tests of the pure rule, the setting, and a simulated cluster showing the
effect (and a controller restarted right after the decision)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from builders import catalog, crashing_options_factory, itype, node, pod, taint
from gpuscale.controller.config import ControllerConfig
from gpuscale.core.disruption import ActionKind, DisruptionAction, DisruptionPlan, DisruptionReason, KeepReason, Kept
from gpuscale.core.disruption.cpuonly import keep_cpu_pods
from gpuscale.core.model import Node, Pod
from gpuscale.errors import InputError
from gpuscale.sim.runner import run_simulation
from gpuscale.sim.scenario import parse_scenario

E, U, DEL = DisruptionReason.EMPTY, DisruptionReason.UNDERUTILIZED, ActionKind.DELETE


def _n(name: str, cpu: int = 16, pool: str = "gpu", **kw: object) -> Node:
    return replace(node(name, cpu * 1000, 64 * 1024, 1, "T4", **kw), pool=pool)  # type: ignore[arg-type]


def _cpu(key: str, on: str, cpu: int = 12) -> Pod:
    return replace(pod(key.split("/")[1], cpu * 1000, 8 * 1024, node=on), namespace=key.split("/")[0])


def _gpu(key: str, on: str, cpu: int = 2) -> Pod:
    return replace(pod(key.split("/")[1], cpu * 1000, 4 * 1024, gpus=1, node=on), namespace=key.split("/")[0])


def _del(n: str, pods: tuple[str, ...], reason: DisruptionReason = E) -> DisruptionAction:
    return DisruptionAction(DEL, n, "gpu", reason, "m", pods, (), 1.0)


def _run(
    actions: tuple[DisruptionAction, ...],
    nodes: list[Node],
    pods: list[Pod],
    releasable: set[str] | None = None,
    kept: tuple[Kept, ...] = (),
    *,
    swap: bool = True,
) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
    plan = DisruptionPlan(actions, kept, {})
    rel = {n.name for n in nodes} if releasable is None else releasable
    out, dropped = keep_cpu_pods(plan, nodes, pods, set(), rel, swap=swap)
    if not dropped:
        assert out is plan
    return [(a.node, a.message[:5]) for a in out.actions], dropped


# a: the CPU-only node; busy: runs a GPU pod (16 - 2 CPUs free); e1, e2: empty
A = _n("a")
BUSY = _n("busy")
E1, E2 = _n("e1"), _n("e2", cpu=32)
C = _cpu("default/c", "a")


@pytest.mark.parametrize(
    ("nodes", "pods", "releasable", "swap", "want", "dropped"),
    [
        # the CPU pod fits in the spare CPU of a node running a GPU pod: the deletion stands
        ([A, BUSY, E1], [C, _gpu("default/g", "busy")], None, True, [("a", "m")], ()),
        # only empty nodes have room: dropped, the best-fitting empty node (first by price, then name) goes instead
        ([A, BUSY, E1, E2], [C, _gpu("default/g", "busy", cpu=6)], None, True, [("e1", "empty")], ("a",)),
        # ... without the swap: only dropped
        ([A, BUSY, E1], [C, _gpu("default/g", "busy", cpu=6)], None, False, [], ("a",)),
        # ... an empty node that may not go (waiting on nothing the caller allows, held for planned pods): not it
        (
            [A, BUSY, E1, E2],
            [C, _gpu("default/g", "busy", cpu=6)],
            {"a", "busy", "e2"},
            True,
            [("e2", "empty")],
            ("a",),
        ),
        ([A, E1], [C], {"a"}, True, [], ("a",)),
        # ... an empty node of another pool: not it
        ([A, _n("e1", pool="other")], [C], None, True, [], ("a",)),
        # ... an empty node too small for the pods: not it
        ([A, _n("e1", cpu=8)], [C], None, True, [], ("a",)),
        # a busy node tainted against the pod, or cordoned, or leaving, takes nothing
        ([A, _n("busy", taints=(taint("x"),))], [C, _gpu("default/g", "busy")], set(), True, [], ("a",)),
        ([A, _n("busy", unschedulable=True)], [C, _gpu("default/g", "busy")], set(), True, [], ("a",)),
        # a pending pod planned onto an otherwise empty node makes it busy (and never released)
        ([A, E1], [C, replace(_gpu("default/p", "e1"), phase="Pending")], None, True, [("a", "m")], ()),
    ],
)
def test_an_empty_delete_of_cpu_pods_stands_only_onto_busy_nodes(
    nodes: list[Node],
    pods: list[Pod],
    releasable: set[str] | None,
    swap: bool,
    want: list[tuple[str, str]],
    dropped: tuple[str, ...],
) -> None:
    assert _run((_del("a", ("default/c",)),), nodes, pods, releasable, swap=swap) == (want, dropped)


def test_room_taken_by_an_earlier_deletion_counts() -> None:
    # two CPU-only nodes; the busy node has room for one 12-CPU pod: the first deletion stands, the second is dropped
    # (and no empty node is released while the plan moves pods: the first one's pods might be planned onto it)
    b = _n("b")
    pods = [C, _cpu("default/d", "b"), _gpu("default/g", "busy", cpu=2)]
    acts = (_del("a", ("default/c",)), _del("b", ("default/d",)))
    assert _run(acts, [A, b, BUSY, E1], pods) == ([("a", "m")], ("b",))


def test_other_actions_are_left_alone_and_block_the_swap() -> None:
    under = _del("u", ("default/x",), U)  # moves a pod: no empty node is released
    empty = _del("z", ())  # an empty node's deletion: not a target
    nodes = [A, _n("u"), _n("z"), E1]
    pods = [C, _gpu("default/x", "u")]
    assert _run((under, empty, _del("a", ("default/c",))), nodes, pods) == ([("u", "m"), ("z", "m")], ("a",))
    assert _run((under, empty), nodes, pods) == ([("u", "m"), ("z", "m")], ())
    # the pass's own deletions are no destinations: z goes, so the pod fits nowhere and a stays (e1 goes instead)
    assert _run((empty, _del("a", ("default/c",))), [A, _n("z"), E1], [C]) == ([("z", "m"), ("e1", "empty")], ("a",))


def test_a_released_node_is_no_longer_reported_kept() -> None:
    kept = (Kept("e1", "gpu", KeepReason.WAITING, "m", E),)
    plan = DisruptionPlan((_del("a", ("default/c",)),), kept, {})
    out, dropped = keep_cpu_pods(plan, [A, E1], [C], set(), {"a", "e1"}, catalog(itype("t", 16, 64, 1, "T4")))
    assert dropped == ("a",) and [a.node for a in out.actions] == ["e1"] and out.kept == ()
    assert "instead of moving the CPU-only pods of a" in out.actions[0].message


def test_setting() -> None:
    assert ControllerConfig.from_policy({}).cpu_pods_onto_empty is True
    assert ControllerConfig.from_policy({"cpuPodsOntoEmpty": False}).cpu_pods_onto_empty is False
    with pytest.raises(InputError) as err:
        ControllerConfig.from_policy({"cpuPodsOntoEmpty": "no"})
    assert "policy.cpuPodsOntoEmpty" in str(err.value) and "true or false" in str(err.value)


CAT = catalog(itype("big", 16, 64, 1, "T4", price=0.3))
SCENARIO = """
name: cpu-hop
seed: 1
duration: 4h
catalog: x
pools:
  - name: gpu
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 5m, consolidateEmptyAfter: 5m}}
cloud:
  launchLatency: 30s
  registrationLatency: 30s
  devicePluginDelay: 60s
workload:
  - source: burst
    prefix: cpu
    count: 1
    at: 0s
    runtime: 3h
    shape: {{cpu: 12, memory: 8Gi}}
  - source: burst
    prefix: gpu
    count: 1
    at: 1m
    runtime: 30m
    shape: {{cpu: 6, memory: 8Gi, gpus: 1}}
policy: {{name: gpuscale{extra}}}
"""


def _sim(extra: str, crash_at: float | None = None) -> tuple[dict[str, float], list[str]]:
    factory, built = crashing_options_factory(crash_at)
    res = run_simulation(parse_scenario(SCENARIO.format(extra=extra), source="c.yaml", catalog=CAT), factory)
    assert len(built) == (1 if crash_at is None else 2)
    msgs = [e.message for e in res.cluster.events if e.kind == "Consolidate"]
    return res.report, msgs


def test_a_cpu_pod_no_longer_hops_onto_the_node_a_gpu_pod_left() -> None:
    # The CPU pod's node is an Empty candidate (a GPU node running only CPU-only pods) that no other node can take
    # while the GPU pod runs. Once the GPU pod ends, its node is empty and the CPU pod fits there: by default the CPU
    # pod is moved onto it (its node deleted, 31 minutes of work lost); with cpuPodsOntoEmpty: false the empty node
    # is deleted instead, and the pod ends 31 minutes sooner: fewer node-hours, no eviction, the same node count.
    plain, moves = _sim(", spotToSpot: false")
    kept, swaps = _sim(", cpuPodsOntoEmpty: false")
    assert plain["disruptions"] == 1 and any("GPU node runs only CPU-only pods" in m for m in moves)
    # (the pass made again without the CPU pod's node deletes the empty node itself, as any empty node)
    assert kept["disruptions"] == 0 and swaps == ["empty (no workload pods); nothing to move"] * 2
    assert kept["nodesLaunched"] == plain["nodesLaunched"] == 2
    assert kept["costUsd"] < plain["costUsd"] - 0.1
    assert kept["duplicateLaunches"] == plain["duplicateLaunches"] == 0


def test_a_controller_restarted_at_or_after_the_swap_leaves_the_cpu_pod_where_it_is() -> None:
    # crashed at the round that decides the swap (the next controller decides it), right after it (the deletion
    # under way is resumed) and once the node is going: the CPU pod is never evicted, no node is launched again
    factory, _ = crashing_options_factory(None)
    res = run_simulation(
        parse_scenario(SCENARIO.format(extra=", cpuPodsOntoEmpty: false"), source="c.yaml", catalog=CAT), factory
    )
    at = next(e.at for e in res.cluster.events if e.kind == "Consolidate" and e.object == "node/gpu-00002")
    for crash_at in (at, at + 1.0, at + 30.0):
        after, _ = _sim(", cpuPodsOntoEmpty: false", crash_at)
        assert after["disruptions"] == 0 and after["duplicateLaunches"] == 0 and after["nodesLaunched"] == 2
        # (a restarted controller starts its empty-wait clocks again: one node kept about 5 minutes longer at most)
        assert res.report["costUsd"] - 1e-6 <= after["costUsd"] <= res.report["costUsd"] + 0.3 * 6 / 60
