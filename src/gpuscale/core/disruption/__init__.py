"""Scale-down and consolidation decisions (pure): value types (:mod:`.values`), budgets and cron windows
(:mod:`.budgets`), candidates (:mod:`.candidates`), replacement search (:mod:`.replacement`) and the pass
(:mod:`.plan`).

For every node of a managed pool, :func:`plan_disruption` decides *delete*, *replace* or *keep*, with a reason:

* A node is a candidate when it is **Empty** (no workload pods; on a GPU node, only CPU-only pods also count as
  empty, because CPU work alone must not keep a GPU node alive), **Underutilized** (pool policy
  ``WhenEmptyOrUnderutilized`` and the node's request share is below the pool's ``utilization_threshold``; GPU nodes
  are judged by their GPU requests, CPU nodes by the larger of CPU and memory), or **Drifted** (its instance type,
  zone or capacity type no longer conforms to its pool, e.g. an on-demand node launched as a spot fallback in a
  spot-only pool). With ``use_measured_gpu_utilization`` a GPU node is underutilised only if its *measured* GPU
  utilisation is below the threshold as well (busy GPUs are kept even when requests look small); nodes without a
  measurement are judged by requests alone.
* Empty and Underutilized candidates must stay candidates for ``consolidate_after_s`` first (Empty ones for
  ``consolidate_empty_after_s`` when set; the caller keeps the ``since`` map and gets the updated one back); Drifted
  nodes need no wait.
* A candidate whose workload pods all fit on the other nodes (kube-scheduler predicates and per-GPU accounting of
  :class:`~gpuscale.core.state.ClusterState`) is **deleted**. Otherwise the pods that do not fit must fit on one new
  node: cheaper than the candidate for Empty/Underutilized (a spot node is not replaced by another spot node), or
  conforming to the pool for Drifted; the candidate is then **replaced**. An Underutilized candidate with two or more
  pods left may instead be replaced by several new nodes (the scale-up planner's greedy packing into the pools'
  remaining room) when they cost less in all than the best single node, or than the candidate if there is none.
* Blockers, in order: a pod annotated ``gpuscale.io/do-not-disrupt: "true"``; a PodDisruptionBudget with no
  disruption left; the pool's ``min_nodes``; the pool's disruption budgets for that reason (the most restrictive
  active budget wins; percentages round up; nodes already being disrupted count against it).

Budget schedules are 5-field cron expressions (:mod:`gpuscale.core.cron`) evaluated in UTC on the caller's clock
(seconds since the Unix epoch): a budget with ``schedule`` and ``duration_s`` is active during
``[hit, hit + duration)`` for every schedule hit.
"""

from gpuscale.core.cron import CronSchedule, parse_cron
from gpuscale.core.disruption.budgets import (
    allowed_disruptions,
    budget_active,
    budget_limit,
    pdb_allowances,
)
from gpuscale.core.disruption.candidates import (
    DO_NOT_DISRUPT_VALUES,
    SPOT_FALLBACK_LABEL,
    classify_node,
    conforms,
    do_not_disrupt,
    find_candidates,
    free_room,
    is_spot_fallback,
    node_price,
    request_share,
)
from gpuscale.core.disruption.plan import (
    plan_disruption,
)
from gpuscale.core.disruption.replacement import (
    pool_offerings,
)
from gpuscale.core.disruption.values import (
    ActionKind,
    BudgetVerdict,
    Candidate,
    DisruptionAction,
    DisruptionPlan,
    DisruptionReason,
    FreeRoom,
    KeepReason,
    Kept,
    PodDisruptionBudget,
    PoolOffering,
    Replacement,
)

__all__ = [
    "DO_NOT_DISRUPT_VALUES",
    "SPOT_FALLBACK_LABEL",
    "ActionKind",
    "BudgetVerdict",
    "Candidate",
    "CronSchedule",
    "DisruptionAction",
    "DisruptionPlan",
    "DisruptionReason",
    "FreeRoom",
    "KeepReason",
    "Kept",
    "PodDisruptionBudget",
    "PoolOffering",
    "Replacement",
    "allowed_disruptions",
    "budget_active",
    "budget_limit",
    "classify_node",
    "conforms",
    "do_not_disrupt",
    "find_candidates",
    "free_room",
    "is_spot_fallback",
    "node_price",
    "parse_cron",
    "pdb_allowances",
    "plan_disruption",
    "pool_offerings",
    "request_share",
]
