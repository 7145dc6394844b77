"""The scale-down steps of a round: consolidation (through the
:class:`~gpuscale.controller.consolidation.ConsolidationGate` and the pure
:func:`gpuscale.core.disruption.plan_disruption`), draining (evictions within PDBs and do-not-disrupt), deletion
with retries at due times, and the removal of orphaned Node objects."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from gpuscale.controller.shell import LEAVING, DisruptionInputs, ReconcileResult, ShellBase, World
from gpuscale.core.disruption import (
    ActionKind,
    DisruptionPlan,
    KeepReason,
    do_not_disrupt,
    pdb_allowances,
    plan_disruption,
)
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL, ClaimEvent, ClaimPhase, transition
from gpuscale.core.reconcile import EventKind, Outcome, find_node, retry_delay
from gpuscale.errors import NotFound, ProviderError
from gpuscale.providers.base import CloudNodeState


class ScaleDownSteps(ShellBase):
    """Consolidation, draining, deletion and orphans (part of :class:`~gpuscale.controller.loop.Controller`)."""

    _measured: bool
    _orphan_since: dict[str, float]

    def _consolidate(self, w: World, result: ReconcileResult) -> None:
        now = w.now
        if not self.config.consolidation:
            return
        gate = self.gate
        candidates: set[str] = set()
        disrupting: set[str] = set(self._replacements)
        replacing = self._replacements
        for c in self.claims.values():
            name = c.node_name
            # neither a node being replaced nor one of its (already ready) replacements is a candidate
            if name and c.phase is ClaimPhase.INITIALIZED and name not in replacing and c.replaces not in replacing:
                candidates.add(name)
        disrupting.update(c.node_name for _, c in self.claims.in_phases(LEAVING) if c.node_name)
        by_node = w.by_node()
        unavailable_now = frozenset(k for k, t in self.availability.offerings.items() if t > now)
        last_pass = gate.last_pass_at
        due = gate.select(
            candidates,
            disrupting,
            w.nodes,
            by_node,
            w.pods,
            bool(w.pdbs),
            w.utilization,
            unavailable_now,
            now,
            self._pool_of_node,
        )
        reference = None
        if gate.check and now - last_pass >= self.config.disruption_interval_s:
            ref_due = gate.reference_due(candidates, w.nodes, by_node, w.utilization, now, self._pool_of_node)
            if ref_due:
                ref = self._disruption_pass(self._disruption_inputs(w), set(ref_due), disrupting, dict(gate.since), w)
                reference = {(a.node, str(a.kind), str(a.reason)) for a in ref.actions}
        dp = None
        protected: frozenset[str] = frozenset()
        if gate.open_pass(due, now):
            candidates = set(due)  # nodes still waiting out consolidateAfter cannot be acted on this round
            inputs = self._disruption_inputs(w)
            protected = inputs.protected
            signature = (
                frozenset((n.name, n.unschedulable, n.allocatable, n.launching) for n in inputs.nodes),
                frozenset((p.key, p.node_name) for p in inputs.pods if p.node_name is not None),
                frozenset(candidates),
                frozenset(disrupting),
                protected,
                frozenset(inputs.unavailable),
                frozenset((k, round(v, 1)) for k, v in w.utilization.items()) if self._measured else None,
            )
            if gate.inputs_changed(signature, now, self._pool_of_node):
                dp = self._disruption_pass(inputs, candidates, disrupting, gate.since, w)
        if gate.check and (reference is not None or dp is not None):
            cached = {(a.node, str(a.kind), str(a.reason)) for a in dp.actions} if dp is not None else set()
            gate.compare(now, cached, reference or set())
        if dp is None:
            return
        gate.since.update(dp.since)
        for kept in dp.kept:
            if kept.reason is not KeepReason.WAITING and kept.node not in protected:
                gate.rest(kept.node, frozenset(p.key for p in by_node.get(kept.node, ())), now)
            if kept.reason is not KeepReason.WAITING:
                self._report(f"node/{kept.node}", str(kept.reason), EventKind.DISRUPTION_BLOCKED, now, kept.message)
        for action in dp.actions:
            found = self._claim_by_node_name(action.node)
            if found is None:
                continue
            key, c = found
            data = {
                "action": str(action.kind),
                "pool": action.pool,
                "savingsPerHour": round(action.savings_per_hour, 6),
            }
            if action.kind is ActionKind.DELETE:
                self._start_drain(key, c, w, str(action.reason), involuntary=False)
                result.disrupted += 1
                self._record(
                    now, EventKind.CONSOLIDATE, f"node/{action.node}", str(action.reason), action.message, **data
                )
                continue
            outcomes = []
            before = {k for k, cl in self.claims.items() if cl.replaces == action.node}
            for i, r in enumerate(action.replacements):
                seed = ("replace", action.node, r.pool, r.instance_type, r.zone, str(r.capacity_type))
                outcome = self._launch_new(
                    (*seed, str(i)) if i else seed,
                    r.pool,
                    r.instance_type,
                    r.zone,
                    r.capacity_type,
                    w,
                    pods=r.pods,
                    replaces=action.node,
                    reason=f"Replace{action.reason}",
                )
                outcomes.append(outcome)
                if outcome not in (Outcome.OK, Outcome.RETRY):
                    break
            rids = tuple(
                k for k, cl in self.claims.items() if cl.replaces == action.node and k not in before and cl.alive
            )
            result.launched += sum(1 for o in outcomes if o is Outcome.OK)
            if all(o in (Outcome.OK, Outcome.RETRY) for o in outcomes):
                self._replacements[action.node] = (rids, action)
                result.disrupted += 1
                self._record(
                    now, EventKind.CONSOLIDATE, f"node/{action.node}", str(action.reason), action.message, **data
                )
            elif rids:  # a split replacement only partly launched: the old node stays; the new ones are spare
                self._record(
                    now,
                    EventKind.REPLACE_ABORTED,
                    f"node/{action.node}",
                    "ReplacementFailed",
                    f"only {len(rids)} of {len(action.replacements)} replacement nodes launched; node kept",
                )

    def _disruption_inputs(self, w: World) -> DisruptionInputs:
        """Pods (pending ones already planned onto existing nodes hold their room there and protect those nodes),
        nodes (with nodes in flight), and the unavailable offerings, as a pass sees them."""
        pods = list(w.pods)
        protected: frozenset[str] = frozenset()
        planned = {k: v for k, v in self._planned_on_node.items() if v in w.nodes}
        for c in self.claims.values():
            if c.node_name in w.nodes and c.phase in (ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED):
                planned.update((k, c.node_name) for k in c.pods if k not in planned)
        if planned:
            protected = frozenset(planned.values())
            pods = [replace(p, node_name=planned[p.key]) if p.pending and p.key in planned else p for p in pods]
        nodes = list(w.nodes.values())
        for key, c in self.claims.items():
            if c.phase in (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED) and c.node_name not in w.nodes:
                nodes.append(self._launching_node(key, c))
        return DisruptionInputs(pods, nodes, protected, self.availability.unavailable_at(w.now))

    def _disruption_pass(
        self,
        inputs: DisruptionInputs,
        candidates: set[str],
        disrupting: set[str],
        since: Mapping[str, float],
        w: World,
    ) -> DisruptionPlan:
        return plan_disruption(
            inputs.nodes,
            inputs.pods,
            list(self.pools.values()),
            self.catalog,
            w.now,
            since=since,
            candidates=candidates,
            disrupting=disrupting,
            protected=set(inputs.protected),
            pdbs=w.pdbs,
            utilization=w.utilization,
            unavailable=inputs.unavailable,
            allow_replace=self.config.replace_nodes,
        )

    def _drain_and_delete(self, w: World, result: ReconcileResult) -> None:
        now = w.now
        allow: dict[str, int] | None = None
        for key, c in self.claims.in_phases(LEAVING):
            if c.phase is ClaimPhase.DRAINING:
                if allow is None:
                    allow = pdb_allowances(w.pdbs, w.pods)
                node = find_node(c, w.nodes)
                left = [p for p in w.by_node().get(node.name, ()) if not p.is_daemonset] if node is not None else []
                if not left:
                    self.claims[key] = transition(c, ClaimEvent.DRAINED, now, reason="no pods left")
                    self._delete(key, w, result)
                    continue
                voluntary = key not in self._involuntary
                for p in left:
                    if voluntary and do_not_disrupt(p):
                        self._report(
                            f"pod/{p.key}", "DoNotDisrupt", EventKind.EVICT_BLOCKED, now, "annotated do-not-disrupt"
                        )
                        continue
                    pdbs = [b for b in w.pdbs if b.matches(p)]
                    keys = [f"{b.namespace}/{b.name}" for b in pdbs]
                    if any(allow.get(k, 0) < 1 for k in keys):
                        self._report(
                            f"pod/{p.key}", "PodDisruptionBudget", EventKind.EVICT_BLOCKED, now, "PDB allows none now"
                        )
                        continue
                    if self.backend.evict(p.key):
                        for k in keys:
                            allow[k] -= 1
                        result.evicted += 1
                        self._record(
                            now, EventKind.EVICT, f"pod/{p.key}", c.reason, f"evicted from {node and node.name}"
                        )
            elif c.phase is ClaimPhase.FAILED:
                if c.node_id:
                    self.claims[key] = transition(c, ClaimEvent.DELETE, now, reason=c.reason)
                    self._delete(key, w, result)
                else:
                    self._finish(key, transition(c, ClaimEvent.LOST, now, reason="no node was created"))
            elif c.phase is ClaimPhase.DELETING and self._delete_retry_at.get(key, -math.inf) <= now:
                self._delete(key, w, result)

    def _delete(self, key: str, w: World, result: ReconcileResult) -> None:
        """Delete the claim's node at the provider, then its Node object (both idempotent)."""
        now = w.now
        c = self.claims[key]
        cloud = next((cn for cn in w.cloud if cn.node_id == c.node_id), None)
        recheck = self.config.max_backoff_s  # the provider is deleting it: only a stuck deletion needs another look
        if c.node_id and (cloud is None or cloud.state is not CloudNodeState.DELETING):
            recheck = self.config.delete_recheck_s
            try:
                self.provider.delete_node(c.node_id)
            except NotFound:
                pass
            except ProviderError as exc:
                n = self.launcher.attempts.get(key, 0) + 1
                self.launcher.attempts[key] = n
                delay = retry_delay(exc, n, self.launcher.rules)
                self._delete_retry_at[key] = now + delay
                self._record(now, EventKind.DELETE, f"node/{c.node_name or key}", "DeleteRetry", str(exc))
                return
            result.deleted += 1
            self._record(
                now,
                EventKind.DELETE,
                f"node/{c.node_name or key}",
                c.reason or "Delete",
                f"deleting {c.instance_type} {c.capacity_type} in {c.zone}",
                request_id=key,
            )
        self._delete_retry_at[key] = now + recheck
        node = find_node(c, w.nodes)
        if node is not None:
            self.backend.delete_node(node.name)
            del w.nodes[node.name]

    def _collect_orphans(self, w: World) -> None:
        """Delete Node objects labelled with a request id the provider no longer lists (after a grace period)."""
        now = w.now
        rids: set[str] | None = None
        current: set[str] = set()
        for n in list(w.nodes.values()):
            rid = n.labels.get(REQUEST_ID_LABEL)
            if rid is None or rid in self.claims:
                continue
            if rids is None:
                rids = {cn.request_id for cn in w.cloud}
            if self.claims.names_node(n.name) or rid in rids:
                continue
            current.add(n.name)
            first = self._orphan_since.setdefault(n.name, now)
            if now - first >= self.config.orphan_grace_s:
                self.backend.delete_node(n.name)
                del w.nodes[n.name]
                self._record(now, EventKind.ORPHAN, f"node/{n.name}", "Orphan", f"request {rid} has no cloud node")
        self._orphan_since = {k: v for k, v in self._orphan_since.items() if k in current}
