"""The scale-down steps of a round: consolidation (through the
:class:`~gpuscale.controller.consolidation.ConsolidationGate` and the pure
:func:`gpuscale.core.disruption.plan_disruption`), draining (evictions within PDBs and do-not-disrupt), deletion
with retries at due times, and the removal of orphaned Node objects."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import compress, count
from operator import attrgetter
from typing import cast

from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.consolidation import PassInputs
from gpuscale.controller.shell import LEAVING, DisruptionInputs, ReconcileResult, ShellBase, World
from gpuscale.core.disruption import (
    ActionKind,
    DisruptionAction,
    DisruptionPlan,
    KeepReason,
    plan_disruption,
)
from gpuscale.core.disruption.passmemo import PassMemo
from gpuscale.core.model import Node, OfferingKey, Pod
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL, ClaimPhase, NodeClaim
from gpuscale.core.reconcile import (
    DeleteNode,
    EventKind,
    Evict,
    EvictBlocked,
    Outcome,
    drain_grace_s,
    drain_step,
    find_node,
    orphan_step,
    retry_delay,
)
from gpuscale.errors import NotFound, ProviderError
from gpuscale.providers.base import CloudNodeState

_FLYING = (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED)
"""Claim phases whose node may be in flight (a pass counts it as a launching node)."""
_NONE: frozenset[OfferingKey] = frozenset()
"""The unavailable offerings of a round when there are none (one shared object)."""
_DELETING = ClaimPhase.DELETING
_NO_KEYS: frozenset[str] = frozenset()
"""The GPR-held claim keys while GPRs are off (what ``GprNodes.keys`` answers then, without the call)."""
_INITIALIZED = (ClaimPhase.INITIALIZED,)
"""The claim phase of candidate nodes."""
_PLANNING = (ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED)
"""Claim phases whose pods are planned onto the claim's node once it is listed."""
_NODE_NAME = attrgetter("node_name")
_WAITING, _BUDGET = KeepReason.WAITING, KeepReason.BUDGET
"""Keep reasons read per kept node of every pass (module constants: Enum class attributes are slow reads)."""


class ScaleDownSteps(ShellBase):
    """Consolidation, draining, deletion and orphans (part of :class:`~gpuscale.controller.loop.Controller`)."""

    def _consolidate(self, w: World, result: ReconcileResult) -> None:
        now = w.now
        if not self.config.consolidation:
            return
        gate = self.gate
        candidates, disrupting, planned, flying = self._step_inputs(w)
        by_node = w.by_node()
        offerings = self.availability.offerings
        unavailable_now = frozenset([k for k, t in offerings.items() if t > now]) if offerings else _NONE
        last_pass = gate.last_pass_at
        # the node pools as a plain lookup: nothing from here to the end of the kept loop changes a claim (the passes
        # and the gate only read them; the actions, which drain and launch, come after)
        pool_of = self._node_pools()

        def probe(resting: set[str]) -> bool:
            """Whether a pass over these resting nodes alone would act now (room was taken where their pods fit)."""
            inputs = self._disruption_inputs(w, planned)
            return bool(self._disruption_pass(inputs, resting, disrupting, dict(gate.since), w).actions)

        due = gate.select(
            candidates,
            disrupting,
            w.nodes,
            by_node,
            w.unbound(),
            bool(w.pdbs),
            w.utilization,
            unavailable_now,
            now,
            pool_of,
            planned,
            flying,
            probe,
        )
        reference = None
        if gate.check and now - last_pass >= self.config.disruption_interval_s:
            ref_due = gate.reference_due(candidates, w.nodes, by_node, w.utilization, now, self._pool_of_node)
            if ref_due:
                ref_in = self._disruption_inputs(w, planned)
                ref = self._disruption_pass(ref_in, set(ref_due), disrupting, dict(gate.since), w)
                reference = {(a.node, str(a.kind), str(a.reason)) for a in ref.actions}
        dp = None
        protected: frozenset[str] = frozenset()
        if gate.open_pass(due, now):
            candidates = set(due)  # nodes still waiting out consolidateAfter cannot be acted on this round
            inputs = self._disruption_inputs(w, planned)
            protected = inputs.protected
            signature = PassInputs(
                (
                    frozenset(candidates),
                    frozenset(disrupting),
                    protected,
                    frozenset(inputs.unavailable),
                    frozenset((k, round(v, 1)) for k, v in w.utilization.items()) if gate.measured else None,
                ),
                inputs.nodes,
                inputs.pods,
            )
            if gate.inputs_changed(signature, now, self._pool_of_node):
                dp = self._disruption_pass(inputs, candidates, disrupting, gate.since, w, gate.memo)
        if gate.check and (reference is not None or dp is not None):
            cached = {(a.node, str(a.kind), str(a.reason)) for a in dp.actions} if dp is not None else set()
            gate.compare(now, cached, reference or set())
        if dp is None:
            return
        gate.since.update(dp.since)
        if dp.actions:
            gate.started({a.node for a in dp.actions})
        for kept in dp.kept:
            if (why := kept.reason) is _WAITING:
                continue
            if kept.node not in protected:
                keys = frozenset([p.key for p in by_node.get(kept.node, ())])
                gate.rest(kept.node, keys, now, pool_of, timed=why is _BUDGET)
            self._report(f"node/{kept.node}", str(why), EventKind.DISRUPTION_BLOCKED, now, kept.message)
        for action in dp.actions:
            if action.kind is ActionKind.DELETE:
                self._drain_for_deletion(action, w, result)
                continue
            if self._claim_by_node_name(action.node) is None:
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
                self.replacements.start(action.node, rids, action)
                result.disrupted += 1
                self._record_disruption(action, now, ActionKind.REPLACE)
            elif rids:  # a split replacement only partly launched: the old node stays; the new ones are spare
                self._record(
                    now,
                    EventKind.REPLACE_ABORTED,
                    f"node/{action.node}",
                    "ReplacementFailed",
                    f"only {len(rids)} of {len(action.replacements)} replacement nodes launched; node kept",
                )

    def _drain_for_deletion(self, action: DisruptionAction, w: World, result: ReconcileResult) -> None:
        """Start draining the node a disruption deletes (nothing if no claim of ours has it), counted and recorded."""
        found = self._claim_by_node_name(action.node)
        if found is None:
            return
        key, c = found
        self._start_drain(key, c, w, str(action.reason), involuntary=False)
        result.disrupted += 1
        self._record_disruption(action, w.now, ActionKind.DELETE)

    def _record_disruption(self, action: DisruptionAction, now: float, kind: ActionKind) -> None:
        """The Consolidate event of a disruption started: what was done to the node, its pool and the saving."""
        self._record(
            now,
            EventKind.CONSOLIDATE,
            f"node/{action.node}",
            str(action.reason),
            action.message,
            action=str(kind),
            pool=action.pool,
            savingsPerHour=round(action.savings_per_hour, 6),
        )

    def _step_inputs(self, w: World) -> tuple[set[str], set[str], dict[str, str], frozenset[str]]:
        """The round's candidate nodes, nodes being disrupted, planned pods (:meth:`_planned`) and claims of nodes in
        flight, as :meth:`_fresh_step_inputs` makes them. They depend on the claim table, the nodes being replaced, the
        GPR-held claims, the names of the round's Nodes and the last plan's pods on existing nodes only: kept while
        all of those are the same (the sets are the caller's copies; the rest are never changed)."""
        claims = self.claims
        gpr = self.gpr
        key = (claims, claims.version, tuple(self.replacements.by_old), gpr.keys(claims) if gpr.enabled else _NO_KEYS)
        last = self.__dict__.get("_step_inputs_memo")
        if (
            last is not None
            and last[0] == key
            and last[1] == self.scaleup.planned_on_node
            and w.nodes.keys() == last[2]
        ):
            candidates, disrupting, planned, flying = last[3]
            return candidates, set(disrupting), planned, flying
        made = self._fresh_step_inputs(w)
        self.__dict__["_step_inputs_memo"] = (
            key,
            dict(self.scaleup.planned_on_node),
            frozenset(w.nodes),
            (made[0], frozenset(made[1]), made[2], made[3]),
        )
        return made

    def _fresh_step_inputs(self, w: World) -> tuple[set[str], set[str], dict[str, str], frozenset[str]]:
        """:meth:`_step_inputs` computed afresh (the candidate node set itself is kept by the gate)."""
        gate = self.gate
        replacing = self.replacements.by_old
        disrupting: set[str] = set(replacing)
        gpr = self.gpr  # a GPR's nodes are never consolidated while it holds them
        held = gpr.keys(self.claims) if gpr.enabled else _NO_KEYS
        # the candidate nodes depend on the Initialized claims, the nodes being replaced and the held claims only: kept
        # while the table's Initialized claims (their phase version) and those two are the same (nothing changes the
        # set once made; the claims of other phases are skipped, in table order as before)
        key_of_candidates = (
            self.claims,
            self.claims.phase_version(ClaimPhase.INITIALIZED),
            frozenset(replacing),
            held,
        )
        if gate.candidate_nodes[0] == key_of_candidates:
            candidates = gate.candidate_nodes[1]
        elif not replacing and not held:  # every Initialized claim's node: the same names added in the same order
            candidates = {name for _, c in self.claims.in_phases(_INITIALIZED) if (name := c.node_name)}
            gate.candidate_nodes = (key_of_candidates, candidates)
        else:
            candidates = set()
            for key, c in self.claims.in_phases(_INITIALIZED):  # (in table order: the same set, built in that order)
                name = c.node_name
                # neither a node being replaced nor one of its (already ready) replacements is a candidate
                if name and name not in replacing and c.replaces not in replacing and key not in held:
                    candidates.add(name)
            gate.candidate_nodes = (key_of_candidates, candidates)
        disrupting.update([name for _, c in self.claims.in_phases(LEAVING) if (name := c.node_name)])
        planned = self._planned(w)
        nodes = w.nodes
        flying = frozenset([k for k, c in self.claims.in_phases(_FLYING) if c.node_name not in nodes])
        return candidates, disrupting, planned, flying

    def _planned(self, w: World) -> dict[str, str]:
        """Pending pods already planned onto existing nodes (pod key -> node name)."""
        nodes = w.nodes
        planned = {k: v for k, v in self.scaleup.planned_on_node.items() if v in nodes}
        for _, c in self.claims.in_phases(_PLANNING):
            if (name := c.node_name) in nodes:
                for k in c.pods:
                    if k not in planned:
                        planned[k] = name
        return planned

    def _disruption_inputs(self, w: World, planned: Mapping[str, str]) -> DisruptionInputs:
        """Pods (pending ones already planned onto existing nodes hold their room there and protect those nodes),
        nodes (with nodes in flight), and the unavailable offerings, as a pass sees them. ``planned``: the round's
        :meth:`_planned` (computed once per round; nothing in the consolidation step changes it)."""
        pods: list[Pod] = w.pods  # (copied before a planned pod replaces one: World.pods is never changed)
        protected: frozenset[str] = frozenset()
        by_node: Mapping[str, Sequence[Pod]] = w.by_node()  # (World.pods are the live pods the pass groups)
        if planned:
            protected = frozenset(planned.values())
            # a planned pod is the pending pod bound to its node; the same object as last pass while the pod and its
            # node are the same (kept for the pods planned now only)
            made = self.__dict__.get("_planned_pods", {})
            kept: dict[str, tuple[Pod, str, Pod]] = {}
            for p in w.unbound():  # (a pending pod has no node: the unbound pods, in pods' order, hold them all)
                if p.pending and (on := planned.get(p.key)) is not None:
                    last = made.get(p.key)
                    if last is None or last[0] is not p or last[1] != on:
                        last = (p, on, replace(p, node_name=on))
                    kept[p.key] = last
            self.__dict__["_planned_pods"] = kept
            if kept:  # each planned pod replaces its pending pod, found by identity (C-level) in pods' order
                pods = list(pods)
                by_id = {id(last[0]): last[2] for last in kept.values()}
                for i in compress(count(), map(by_id.__contains__, map(id, pods))):
                    pods[i] = by_id[id(pods[i])]
                # the planned nodes' lists gain the planned pods, in pods' order
                gained: dict[str, list[Pod]] = {}
                for p in compress(pods, map(protected.__contains__, map(_NODE_NAME, pods))):
                    on = cast(str, p.node_name)  # (a protected node's name: never None)
                    if (lst := gained.get(on)) is None:
                        gained[on] = [p]
                    else:
                        lst.append(p)
                by_node = {**by_node, **gained}
        nodes = list(w.nodes.values())
        gpr = self.gpr
        gpr_keys = gpr.keys(self.claims) if gpr.enabled else _NO_KEYS
        if gpr_keys:  # a GPR's nodes are outside the pools' accounting here (minNodes, budgets): never disrupted
            held = {c.node_name for k in gpr_keys if (c := self.claims[k]).node_name}
            nodes = [replace(n, pool=None) if n.name in held else n for n in nodes]
        cache = self.__dict__.get("_launching_nodes")
        made_nodes = cache[2] if cache is not None and cache[0] is self.pools and cache[1] is self.catalog else {}
        launching: dict[str, tuple[NodeClaim, Node]] = {}
        for key, c in self.claims.in_phases(_FLYING):
            if c.node_name not in w.nodes:
                if key in gpr_keys:
                    continue
                # the node in flight of a claim: the same object as last pass while the claim, the pools and the
                # catalog are (its template reads them)
                last_node = made_nodes.get(key)
                if last_node is None or last_node[0] is not c:
                    last_node = (c, self._launching_node(key, c))
                launching[key] = last_node
                nodes.append(last_node[1])
        self.__dict__["_launching_nodes"] = (self.pools, self.catalog, launching)
        return DisruptionInputs(pods, nodes, protected, self.availability.unavailable_at(w.now), by_node)

    def _disruption_pass(
        self,
        inputs: DisruptionInputs,
        candidates: set[str],
        disrupting: set[str],
        since: Mapping[str, float],
        w: World,
        memo: PassMemo | None = None,
    ) -> DisruptionPlan:
        """One disruption pass; ``memo``: the gate's :class:`~gpuscale.core.disruption.passmemo.PassMemo` (None for
        check mode's uncached reference)."""
        return self._plan_pass(inputs, candidates, disrupting, since, w, memo=memo)

    def _plan_pass(
        self,
        inputs: DisruptionInputs,
        candidates: set[str],
        disrupting: set[str],
        since: Mapping[str, float],
        w: World,
        *,
        nodes: Sequence[Node] | None = None,
        allow_replace: bool | None = None,
        memo: PassMemo | None = None,
    ) -> DisruptionPlan:
        """:func:`plan_disruption` over ``inputs`` (``nodes`` instead of its nodes when given) with this controller's
        pools, catalog, GPR workloads and ``replaceNodes`` (unless ``allow_replace``); the optional rules' extra
        passes (:mod:`gpuscale.controller.repacking`) call it too."""
        return plan_disruption(
            inputs.nodes if nodes is None else nodes,
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
            allow_replace=self.config.replace_nodes if allow_replace is None else allow_replace,
            workloads=self.gpr.workloads or None,
            memo=memo,
            by_node=inputs.by_node,
        )

    def _drain_and_delete(self, w: World, result: ReconcileResult) -> None:
        """Carry out :func:`gpuscale.core.reconcile.drain_step` for the claims on their way out."""
        leaving = self.claims.in_phases(LEAVING)
        if not leaving:
            return
        now = w.now
        due = self.deletions.retry_at
        if all(c.phase is _DELETING and due.get(k, -math.inf) > now for k, c in leaving):
            return  # only deletions whose repeat is not due: drain_step decides nothing for them
        graces = {name: p.disruption.termination_grace_period_s for name, p in self.pools.items()}
        d = drain_step(
            leaving,
            w.by_node(),
            w.nodes,
            w.pods,
            w.pdbs,
            self.replacements.involuntary,
            self.deletions.retry_at,
            now,
            evicting_since=self.deletions.evicting_since,
            pool_grace_s=graces,
        )
        for a in d.actions:
            if isinstance(a, Evict):
                if self.backend.evict(a.pod):
                    c = self.claims[a.key]
                    grace = drain_grace_s(graces.get(c.pool), a.key in self.replacements.involuntary)
                    self.deletions.evicted(a.key, now, grace)
                    result.evicted += 1
                    self._record(now, EventKind.EVICT, f"pod/{a.pod}", a.reason, f"evicted from {a.node}")
            elif isinstance(a, EvictBlocked):
                self._report(f"pod/{a.pod}", a.reason, EventKind.EVICT_BLOCKED, now, a.message)
            elif isinstance(a, DeleteNode):
                self._delete(a.key, w, result)
            else:
                self._apply_action(a, w)

    def _delete(self, key: str, w: World, result: ReconcileResult) -> None:
        """Delete the claim's node at the provider, then its Node object (both idempotent)."""
        now = w.now
        c = self.claims[key]
        cloud = None
        for cn in w.cloud:  # (the first cloud node of the claim's node id: a loop, not next() over a generator)
            if cn.node_id == c.node_id:
                cloud = cn
                break
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
                self.deletions.retry(key, now + delay)
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
        self.deletions.retry(key, now + recheck)
        node = find_node(c, w.nodes)
        if node is not None:
            self.backend.delete_node(node.name)
            del w.nodes[node.name]

    def _collect_orphans(self, w: World) -> None:
        """Remove Node objects labelled with a request id the provider no longer lists (after a grace period)."""
        claims = self.claims
        # "no orphan" holds while the node listing (an immutable tuple, recognised again by the observation) and the
        # claim table's keys are the same: the round's Nodes are that listing's, less the deleted ones, with the same
        # labels (cordoning replaces only ``unschedulable``). A new listing or a claim removed invalidates it (claims
        # only added keep every labelled Node claimed: _only_added).
        listing = self.observed.nodes_list
        known = self.__dict__.get("_orphan_free")
        if (
            listing is not None
            and known is not None
            and known[0] is listing
            and known[1] is claims
            and _only_added(claims, known[2], known[3])
        ):
            self.deletions.orphans({})
            if known[2] != claims.keys_version:
                self.__dict__["_orphan_free"] = (listing, claims, claims.keys_version, len(claims))
            return
        for n in w.nodes.values():
            rid = n.labels.get(REQUEST_ID_LABEL)
            if rid is not None and rid not in claims:
                break
        else:  # every labelled Node has its claim: no orphan (the common case, checked without building anything)
            self.deletions.orphans({})
            self.__dict__["_orphan_free"] = (listing, claims, claims.keys_version, len(claims))
            return
        scan = orphan_step(
            list(w.nodes.values()),
            claims,
            claims.names_node,
            {cn.request_id for cn in w.cloud},
            self.deletions.orphan_since,
            self.config.orphan_grace_s,
            w.now,
        )
        for r in scan.remove:
            self.backend.delete_node(r.name)
            del w.nodes[r.name]
            self._record(
                w.now, EventKind.ORPHAN, f"node/{r.name}", "Orphan", f"request {r.request_id} has no cloud node"
            )
        self.deletions.orphans(scan.since)


def _only_added(claims: ClaimTable, version: int, size: int) -> bool:
    """Whether the table's keys, ``size`` of them at keys ``version``, have only been added to since (none removed).
    Each change of its keys adds one to the version: adding a key also adds one key, removing one takes one away and
    clearing takes one or more; so the keys grew by as many as the version did only if every change was an addition."""
    return claims.keys_version - version == len(claims) - size
