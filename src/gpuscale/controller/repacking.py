"""The controller side of ``evictMaxPodAge``, ``repack`` (:mod:`gpuscale.core.disruption.repack`) and
``spotToSpot`` (:mod:`gpuscale.core.disruption.spotswap`): applied by
:class:`~gpuscale.controller.options.OptionsController` to each consolidation pass's plan.

* ``evictMaxPodAge``: the pass's Underutilized actions that would evict a pod bound for longer are dropped.
* ``repack``: when the ordinary pass decided nothing and nodes are being launched for pending pods (not as
  replacements), a second pass over the young underutilised candidates (every pod bound at most ``maxPodAge``)
  counts the room those nodes will have left after the pods they were launched for; its deletions are carried out.
* ``packOntoEmpty: false``: Underutilized moves never land on empty nodes (moving a pod from one node onto an
  empty one only swaps which node is empty, and the pod is evicted again once its new node is underutilised): the
  pass's deletions of empty nodes stand, and the other candidates are passed again with the empty nodes cordoned.
* ``cpuPodsOntoEmpty: false``: an Empty deletion of a GPU node running only CPU-only pods stands only if those pods
  fit on nodes running pods (:mod:`gpuscale.core.disruption.cpuonly`): moving them onto an empty node only swaps
  which node is empty and throws their work away, so the empty node they would have gone to is deleted instead.
* ``spotToSpot``: when the pass (and repack) decided nothing, one spot node kept for want of a cheaper replacement
  is replaced by a cheaper spot node that takes all its pods. The node is cordoned in the round that starts its
  replacement (:func:`cordon_spot_swaps`), so that no pod lands on it while the replacement, with room for its own
  pods only, boots (a pod landing there would be evicted at the drain and a node launched for it again).

Pod ages are the controller's first-bound times (``OptionsController.bound_since``); ``repack`` and ``spotToSpot``
read only those of the pods seen bind since its first observation (``OptionsController._known_ages``): after a
restart a pod already bound may be older than ``maxPodAge``, so it is not young.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.shell import DisruptionInputs, World
from gpuscale.core.disruption import DisruptionPlan, KeepReason
from gpuscale.core.disruption.cpuonly import keep_cpu_pods
from gpuscale.core.disruption.repack import (
    InFlight,
    RepackRule,
    empty_nodes,
    hold_old_pods,
    repack_deletions,
    repack_inputs,
    without_destinations,
    young_nodes,
)
from gpuscale.core.disruption.spotswap import is_spot_swap, swap_spot
from gpuscale.core.model import Node
from gpuscale.core.nodeclaim import IN_FLIGHT

if TYPE_CHECKING:
    from gpuscale.controller.loop import Controller


def uses_config(cfg: ControllerConfig) -> bool:
    """True if ``evictMaxPodAge``, ``repack``, ``spotToSpot`` or ``rightsize`` is on or ``packOntoEmpty`` or
    ``cpuPodsOntoEmpty`` is off."""
    return (
        cfg.evict_max_pod_age is not None
        or cfg.repack is not None
        or cfg.spot_to_spot is not None
        or cfg.rightsize is not None
        or not cfg.pack_onto_empty
        or not cfg.cpu_pods_onto_empty
    )


def uses_ages(ctrl: Controller) -> bool:
    """True if one of these rules needs the pods' first-bound times."""
    return uses_config(ctrl.config)


def apply_rules(
    ctrl: Controller,
    dp: DisruptionPlan,
    inputs: DisruptionInputs,
    candidates: set[str],
    disrupting: set[str],
    since: Mapping[str, float],
    w: World,
    started: Mapping[str, float],
    known: Mapping[str, float] | None = None,
) -> DisruptionPlan:
    """``dp`` after ``packOntoEmpty``, ``cpuPodsOntoEmpty``, ``evictMaxPodAge``, ``repack`` and ``spotToSpot`` (each
    a no-op when off).
    ``started``: first-bound times; ``known``: those of the pods seen bind since the first observation (default
    ``started``), read by ``repack``'s and ``spotToSpot``'s ``maxPodAge`` (a pod without one is not young)."""
    cfg = ctrl.config
    young_ages = started if known is None else known
    unkeep: set[str] = set()
    if not cfg.pack_onto_empty:
        dp, unkeep = _not_onto_empty(ctrl, dp, inputs, candidates, disrupting, w)
    if not cfg.cpu_pods_onto_empty and dp.actions:
        dp = _keep_cpu_pods(ctrl, dp, inputs, candidates, disrupting, since, w)
    if cfg.evict_max_pod_age is not None and dp.actions:
        dp = hold_old_pods(dp, started, cfg.evict_max_pod_age, w.now)
    if cfg.repack is not None and not dp.actions:
        dp = _repack(ctrl, cfg.repack, dp, inputs, candidates, disrupting, since, w, young_ages)
    if cfg.spot_to_spot is not None and not dp.actions and dp.kept:
        dp = swap_spot(
            dp,
            inputs.nodes,
            inputs.pods,
            ctrl.pools,
            ctrl.catalog,
            w.now,
            inputs.unavailable,
            cfg.spot_to_spot,
            young_ages,
        )
    if unkeep:
        dp = DisruptionPlan(dp.actions, tuple(k for k in dp.kept if k.node not in unkeep), dp.since)
    return dp


def cordon_spot_swaps(ctrl: Controller, w: World) -> None:
    """``spotToSpot``: cordon each node whose spot-to-spot replacement is under way and that is not cordoned yet (run
    after the consolidation step, so in the round that decided it). Idempotent; a controller restarted before the
    replacement is ready resumes the cordoned node as draining; one whose replacement fails is uncordoned."""
    for old, (_, action) in ctrl.replacements.by_old.items():
        node = w.nodes.get(old)
        if node is not None and is_spot_swap(action, node):
            ctrl._cordon_replaced(old, w)


def _keep_cpu_pods(
    ctrl: Controller,
    dp: DisruptionPlan,
    inputs: DisruptionInputs,
    candidates: set[str],
    disrupting: set[str],
    since: Mapping[str, float],
    w: World,
) -> DisruptionPlan:
    """``cpuPodsOntoEmpty: false``: :func:`~gpuscale.core.disruption.cpuonly.keep_cpu_pods`, the empty nodes that may
    go instead being every consolidatable node (not only those due: an empty node kept warm is still waiting) not
    being disrupted and not held for planned pods. The pass judged the candidates after a dropped deletion as if its
    pods had taken room (and its budget), so when one is dropped the pass is made again without the dropped nodes,
    with the empty nodes released in their place as candidates due now (the pass itself then deletes them, within
    budgets), until it plans no such deletion: the plan is one the pass makes, which the consolidation gate's rests
    and its uncached reference agree on."""
    releasable = ctrl._step_inputs(w)[0] - disrupting - inputs.protected
    out, dropped = keep_cpu_pods(dp, inputs.nodes, inputs.pods, disrupting, releasable, ctrl.catalog)
    if not dropped:
        return dp
    before = {a.node for a in dp.actions}
    released = {a.node for a in out.actions if a.node not in before}
    excluded = set(dropped)
    due = {**since, **dict.fromkeys(released, -math.inf)}
    while True:
        again = ctrl._plan_pass(inputs, (candidates | released) - excluded, disrupting, due, w)
        _, more = keep_cpu_pods(again, inputs.nodes, inputs.pods, disrupting, swap=False)
        if not more:
            break
        excluded.update(more)
    kept_since = {k: v for k, v in again.since.items() if k not in released}
    kept_since.update((k, since[k]) for k in released if k in since)
    return DisruptionPlan(again.actions, again.kept, kept_since)


def in_flight(ctrl: Controller) -> dict[str, InFlight]:
    """Nodes launched for pending pods and not yet ready, by the node name a pass gives them."""
    out: dict[str, InFlight] = {}
    for key, c in ctrl.claims.items():
        if c.phase in IN_FLIGHT and not c.replaces and c.expected.gpus > 0:
            out[c.node_name or f"nodeclaim-{key}"] = InFlight(c.expected, tuple(c.pods))
    return out


def _repack(
    ctrl: Controller,
    rule: RepackRule,
    dp: DisruptionPlan,
    inputs: DisruptionInputs,
    candidates: set[str],
    disrupting: set[str],
    since: Mapping[str, float],
    w: World,
    started: Mapping[str, float],
) -> DisruptionPlan:
    flight = in_flight(ctrl)
    if not flight or not candidates:
        return dp
    young = young_nodes(candidates, w.by_node(), started, rule, w.now)
    if not young:
        return dp
    nodes, pods = repack_inputs(inputs.nodes, inputs.pods, flight)
    with_flight = DisruptionInputs(pods, nodes, inputs.protected, inputs.unavailable)
    second = ctrl._plan_pass(with_flight, young, disrupting, since, w, allow_replace=False)
    deletions = repack_deletions(second, young)
    if not deletions:
        return dp
    gone = {a.node for a in deletions}
    return DisruptionPlan(deletions, tuple(k for k in dp.kept if k.node not in gone), dp.since)


def _not_onto_empty(
    ctrl: Controller,
    dp: DisruptionPlan,
    inputs: DisruptionInputs,
    candidates: set[str],
    disrupting: set[str],
    w: World,
) -> tuple[DisruptionPlan, set[str]]:
    """``packOntoEmpty: false``: a pass over the empty candidates, then one over the others with the empty nodes
    cordoned and the first pass's actions counted as disruptions under way (budgets). Also returns the nodes that
    pass kept because their pods fit nowhere: the caller does not report them as kept (a pod binding to an empty
    node makes it a destination, which does not end a consolidation rest)."""
    empties = empty_nodes(inputs.nodes, inputs.pods, disrupting)
    if not empties or not candidates - empties:
        return dp, set()

    def run(nodes: list[Node], only: set[str], busy: set[str]) -> DisruptionPlan:
        return ctrl._plan_pass(inputs, only, disrupting | busy, dp.since, w, nodes=nodes)

    first = run(list(inputs.nodes), candidates & empties, set())
    second = run(without_destinations(inputs.nodes, empties), candidates - empties, {a.node for a in first.actions})
    unfit = {k.node for k in second.kept if k.reason in (KeepReason.NO_REPLACEMENT, KeepReason.PODS_DO_NOT_FIT)}
    return DisruptionPlan(first.actions + second.actions, first.kept + second.kept, dp.since), unfit
