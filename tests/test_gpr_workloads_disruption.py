"""The GPR workload rule in consolidation: the simulation of where a candidate node's pods could go never counts a
node of an active GPR as room for a pod outside its workloadSelector."""

from __future__ import annotations

from dataclasses import replace

from builders import OD, node, pool
from gpuscale.core.disruption import plan_disruption
from gpuscale.core.model import Disruption, DisruptionBudget, Toleration
from test_gpr_workloads_planner import CAT, GPR_NODE, WORKLOADS, _pod


def test_consolidation_does_not_move_an_outsider_onto_a_gpr_node() -> None:
    """An empty-enough pod node whose only pod tolerates everything: with the GPR rule its pod has nowhere to go, so
    the node is kept; without it, consolidation would delete it and count on the GPR node."""
    disruption = Disruption(consolidate_after_s=0.0, budgets=(DisruptionBudget("100%"),))
    pods_pool = pool("gpu", instance_types=("g1",), capacity_types=(OD,), disruption=disruption)
    pod_node = node("pod-node", 8000, 32768, 1, "RTX", pool="gpu")
    gpr_node = replace(GPR_NODE, pool=None)
    runner = replace(_pod("runner", {"team": "infer"}, (Toleration(operator="Exists"),)), node_name="pod-node",
                     phase="Running")  # fmt: skip
    args = ([pod_node, gpr_node], [runner], [pods_pool], CAT, 100.0)
    free = plan_disruption(*args, since={"pod-node": 0.0}, allow_replace=False)
    assert [a.node for a in free.actions] == ["pod-node"]
    held = plan_disruption(*args, since={"pod-node": 0.0}, allow_replace=False, workloads=WORKLOADS)
    assert held.actions == ()
    member = replace(runner, labels={"team": "train"})
    moved = plan_disruption([pod_node, gpr_node], [member], [pods_pool], CAT, 100.0, since={"pod-node": 0.0},
                            allow_replace=False, workloads=WORKLOADS)  # fmt: skip
    assert [a.node for a in moved.actions] == ["pod-node"]
