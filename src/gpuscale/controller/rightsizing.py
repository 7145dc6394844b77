"""The controller side of ``rightsize`` (:mod:`gpuscale.core.disruption.rightsize`): once per round, after the
consolidation step and only when that step started nothing, the consolidatable node whose pods are all young and
that a cheaper node of its pool and capacity type would hold is replaced (one node per round, launched like a
consolidation's replacement: the old node drains once the new one is ready). The old node is cordoned at once, so
that no pod lands on it meanwhile (the replacement has room for its pods only), and uncordoned if the replacement
fails and the node is kept (:attr:`~gpuscale.controller.rounds.Replacements.cordoned`); a controller restarted before
the replacement is ready resumes it as draining. With ``maxSet`` 2 or more, a round in which no single node is
replaced may replace a set of nodes together (:mod:`gpuscale.core.disruption.rightsize_multi`): the new nodes are
launched, then every old node is cordoned; each drains once all the new nodes are ready
(:meth:`Rightsizing._start_set`); with ``keepOne``, a set that keeps one of its own nodes deletes the others (their
pods drain onto it, as an Underutilized deletion's do) and launches nothing (:meth:`Rightsizing._merge_set`).

Pod ages are the controller's first-bound times (``OptionsController.bound_since``), of the pods seen bind since
its first observation only (``OptionsController._known_ages``): after a restart, a pod already bound may have run
for longer than ``maxPodAge``, so its node is not right-sized (until its pods are all ones seen bind since).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscale.controller.shell import ReconcileResult, World
from gpuscale.core.disruption.rightsize import RightsizeRule, movable_nodes, next_look, rightsize
from gpuscale.core.disruption.rightsize_multi import SetReplacement, replace_set
from gpuscale.core.disruption.values import ActionKind, DisruptionAction
from gpuscale.core.reconcile import EventKind, Outcome

if TYPE_CHECKING:
    from gpuscale.controller.loop import Controller

REASON = "ReplaceRightsize"
"""The launch reason of a right-sizing replacement."""
SET_REASON = "ReplaceRightsizeSet"
"""The launch reason of the new nodes of a set replacement (``maxSet``)."""


@dataclass
class RightsizeStats:
    """What the rule did, for reports."""

    replaced: int = 0
    saving_per_hour: float = 0.0
    """$/h saved at the time of each replacement, summed."""
    sets: int = 0
    """Set replacements started (``maxSet``; their nodes are counted in ``replaced``)."""


class Rightsizing:
    """Runs :func:`~gpuscale.core.disruption.rightsize.rightsize` each round (see the module docstring)."""

    def __init__(self, rule: RightsizeRule) -> None:
        self.rule = rule
        self.look_at: float | None = None
        """When a pod on a consolidatable node next reaches ``minPodAge`` (the controller wakes then)."""
        self.stats = RightsizeStats()

    def step(self, ctrl: Controller, w: World, result: ReconcileResult, started: Mapping[str, float]) -> None:
        """Replace at most one node (none while a consolidation is being started this round)."""
        candidates, disrupting, planned, _ = ctrl._step_inputs(w)
        eligible = candidates - disrupting
        self.look_at = next_look(w.pods, eligible, started, w.now, self.rule)
        if not eligible:
            return
        inputs = ctrl._disruption_inputs(w, planned)
        eligible -= inputs.protected
        nodes, pods, pools, catalog, now = inputs.nodes, inputs.pods, ctrl.pools, ctrl.catalog, w.now
        movable = movable_nodes(nodes, pods, eligible, pools, catalog, now, self.rule, started, disrupting, w.pdbs)
        args = (nodes, pods, eligible, pools, catalog, now, inputs.unavailable, self.rule, started, disrupting, w.pdbs)
        action = rightsize(*args, found=movable)
        if action is None:
            if self.rule.max_set >= 2:
                found_set = replace_set(*args, found=movable)
                if found_set is not None:
                    self._start_set(ctrl, w, result, found_set)
            return
        found = ctrl._claim_by_node_name(action.node)
        if found is None:
            return
        (r,) = action.replacements
        seed = ("rightsize", action.node, r.pool, r.instance_type, r.zone, str(r.capacity_type))
        before = {k for k, c in ctrl.claims.items() if c.replaces == action.node}
        outcome = ctrl._launch_new(
            seed, r.pool, r.instance_type, r.zone, r.capacity_type, w, pods=r.pods, replaces=action.node, reason=REASON
        )
        if outcome not in (Outcome.OK, Outcome.RETRY):
            return
        rids = tuple(k for k, c in ctrl.claims.items() if c.replaces == action.node and k not in before and c.alive)
        _begin(ctrl, w, result, action, rids)
        result.launched += 1 if outcome is Outcome.OK else 0
        self.stats.replaced += 1
        self.stats.saving_per_hour += action.savings_per_hour

    def _start_set(self, ctrl: Controller, w: World, result: ReconcileResult, s: SetReplacement) -> None:
        """Launch the new nodes of a set replacement (request ids derived from the set and each new node, so a
        restarted controller asking again gets the same nodes), then cordon the old nodes; each old node drains once
        all the new nodes are ready, and is kept and uncordoned if one of them fails. If a launch is refused, the old
        nodes are left as they are (new nodes already launched are spare, and go as empty nodes)."""
        if any(ctrl._claim_by_node_name(n) is None for n in s.nodes):
            return
        if s.kept is not None:
            self._merge_set(ctrl, w, result, s)
            return
        anchor = s.nodes[0]
        before = {k for k, c in ctrl.claims.items() if c.replaces == anchor}
        outcomes = []
        for i, r in enumerate(s.replacements):
            seed = ("rightsize-set", *s.nodes, r.pool, r.instance_type, r.zone, str(r.capacity_type), str(i))
            outcome = ctrl._launch_new(
                seed,
                r.pool,
                r.instance_type,
                r.zone,
                r.capacity_type,
                w,
                pods=r.pods,
                replaces=anchor,
                reason=SET_REASON,
            )
            outcomes.append(outcome)
            if outcome not in (Outcome.OK, Outcome.RETRY):
                break
        rids = tuple(k for k, c in ctrl.claims.items() if c.replaces == anchor and k not in before and c.alive)
        result.launched += sum(1 for o in outcomes if o is Outcome.OK)
        if len(outcomes) < len(s.replacements) or any(o not in (Outcome.OK, Outcome.RETRY) for o in outcomes):
            if rids:
                ctrl._record(
                    w.now,
                    EventKind.REPLACE_ABORTED,
                    f"node/{anchor}",
                    "ReplacementFailed",
                    f"only {len(rids)} of {len(s.replacements)} nodes of a rightsize set launched; nodes kept",
                )
            return
        for action in s.actions:
            _begin(ctrl, w, result, action, rids)
        self.stats.replaced += len(s.nodes)
        self.stats.sets += 1
        self.stats.saving_per_hour += s.saving_per_hour

    def _merge_set(self, ctrl: Controller, w: World, result: ReconcileResult, s: SetReplacement) -> None:
        """``keepOne``: drain and delete every node of the set but the kept one (their pods go back to pending and
        bind to its room), as the consolidation deletes a node whose pods fit elsewhere: a restarted controller
        resumes the drains."""
        for action in s.actions:
            ctrl._drain_for_deletion(action, w, result)
        self.stats.replaced += len(s.actions)
        self.stats.sets += 1
        self.stats.saving_per_hour += s.saving_per_hour


def _begin(
    ctrl: Controller, w: World, result: ReconcileResult, action: DisruptionAction, rids: tuple[str, ...]
) -> None:
    """Start replacing ``action.node`` by the claims ``rids``: recorded, cordoned, counted and reported."""
    ctrl.replacements.start(action.node, rids, action)
    ctrl._cordon_replaced(action.node, w)
    result.disrupted += 1
    ctrl._record_disruption(action, w.now, ActionKind.REPLACE)
