"""The scale-up steps of a round, carried out from pure decisions (:mod:`gpuscale.core.reconcile.scaleup`): launch
retries that are due, the gate (batch window, covered pods, unchanged inputs), the plan's launch orders over a
snapshot in which in-flight claims are launching nodes, re-planning at once after a capacity or quota error (at most
``maxReplans`` plans a round), and ``minNodes``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from operator import attrgetter

from gpuscale.controller.rounds import ScaleUpState
from gpuscale.controller.shell import LEAVING, ReconcileResult, ShellBase, World
from gpuscale.core.model import Node, NodePool, Pod, Snapshot
from gpuscale.core.nodeclaim import IN_FLIGHT, REQUEST_ID_LABEL, ClaimPhase, NodeClaim
from gpuscale.core.plan import ScaleUpPlan
from gpuscale.core.reconcile import EventKind, Outcome
from gpuscale.core.reconcile.scaleup import (
    STATIC_BLOCKS,
    Gate,
    LaunchOrder,
    PlanFn,
    PlanningMemo,
    ScaleUpDecision,
    Step,
    after_launch,
    all_covered,
    decide_scale_up,
    effective_pools,
    gate_scale_up,
    launch_orders,
    min_node_orders,
    plan_signature,
)

__all__ = ["PlanFn", "ScaleUpSteps"]

_PHASE = attrgetter("phase")
_MAY_ADD_NODE = (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED, ClaimPhase.DRAINING, ClaimPhase.DELETING, ClaimPhase.FAILED)
"""Claim phases whose claim :meth:`ScaleUpSteps._snapshot` may show as a node when its Node is not listed (a GPR's
claim may be in any phase)."""
_COMING_UP = (ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED)
"""Claim phases whose listed Node is up with its GPUs to come."""
# Enum members read every round as module constants: a class attribute of an Enum costs ~4 times a global lookup in
# Python 3.11 (EnumType defines __getattr__).
_REQUESTED = ClaimPhase.REQUESTED
_IDLE, _EMPTY, _COVERED, _UNCHANGED, _PLAN = Gate.IDLE, Gate.EMPTY, Gate.COVERED, Gate.UNCHANGED, Gate.PLAN


def _shown_node(n: Node, c: NodeClaim | None) -> Node:
    """Listed Node ``n`` as the planner sees it, given its claim ``c``: cordoned while the claim is leaving, at the
    claim's expected allocatable while the node comes up (GPUs to come), in the claim's pool if it has none."""
    if c is None:
        return n
    if c.phase in LEAVING:
        return replace(n, unschedulable=True, pool=n.pool or c.pool)
    if c.phase in _COMING_UP:  # Node up, GPUs to come
        alloc = c.expected if c.expected.gpus > n.allocatable.gpus else n.allocatable
        return replace(n, allocatable=alloc, launching=True, pool=n.pool or c.pool)
    if n.pool is None:
        return replace(n, pool=c.pool)
    return n


class ScaleUpSteps(ShellBase):
    """Scale-up and ``minNodes`` (part of :class:`~gpuscale.controller.loop.Controller`)."""

    scaleup: ScaleUpState
    shortcuts = True
    """Take the round shortcuts below (off only in tests that compare runs with and without them)."""
    _steady: tuple[tuple[str, ...], PlanningMemo, tuple[Pod, ...] | None] | None = None
    """(pending pods, memo, pods to plan for or None) of the last round, when its gate answered what a later round
    with the same pending pods and memo object, no pod of a leaving node to move and no plan forced answers again
    unless said otherwise, so that such a round returns at once:

    * ``EMPTY`` (only statically blocked pods pending; None): the batch window was closed and nothing else the gate
      reads before ``EMPTY`` changed.
    * ``IDLE`` (nothing pending; None): it left no batch and a memo without placements. The round still forgets the
      reasons reported for pods, as the ``IDLE`` gate does (another step may have reported one since).
    * ``COVERED`` (the pods to plan for): the batch window was closed and stays so while no new pod is pending, so
      the gate answers ``COVERED`` again if those pods are still all covered (:func:`all_covered`, asked again).
    """
    _in_flight_kept: tuple[object, tuple[set[str], set[str]]] | None = None
    """(the claim table's answer for the phases in flight, :meth:`_in_flight`'s answer)."""
    _leaving_kept: tuple[int, object, frozenset[str]] | None = None
    """(the claim table's version, its answer for the leaving phases, :meth:`_leaving`'s answer)."""
    _shown: dict[str, tuple[Node, NodeClaim | None, Node]] | None = None
    """Node name -> (listed Node, its claim, the Node the planner is shown) of the last snapshot: the shown Node
    depends on these two alone (both immutable), so it is the same object while they are (the planner's rows of a
    node are kept while its Node is the same object). Replaced by every snapshot (so it holds only listed nodes)."""
    _shown_off: dict[str, tuple[NodeClaim, bool, Node]] | None = None
    """Claim key -> (claim, whether a GPR holds it, the Node the planner is shown for it) of the claims without a
    listed Node in the last snapshot (the same reasoning; pools and the catalog, which the Node's labels come from,
    never change)."""

    def _retry_requested(self, w: World, result: ReconcileResult) -> None:
        if not self.claims.count(_REQUESTED):
            return  # (most rounds: no claim waits for its launch)
        for key, c in self.claims.in_phases((_REQUESTED,)):
            if self.launcher.due(key, w.now):
                if self.availability.backed_off(c.pool, w.now):
                    continue
                outcome = self._call_launch(key, w)
                if outcome is Outcome.OK:
                    result.launched += 1
                elif outcome is not Outcome.RETRY:
                    self.scaleup.request_plan()

    _real_kept: tuple[list[Pod], list[Pod], tuple[str, ...]] | None = None
    """(the unbound pods of a round, its real pending pods, their keys): the same answer while the observation's
    unbound list is the same object (worlds of the very same pod list share it; pods and that list never change)."""

    def _pending(self, w: World) -> tuple[list[Pod], list[Pod]]:
        """(real pending pods, pods of draining nodes shown to the planner as pending)."""
        unbound = w.unbound()
        kept = self._real_kept
        if kept is not None and kept[0] is unbound:
            real = kept[1]
        else:
            real = [p for p in unbound if p.phase == "Pending" and not p.is_daemonset]
            self._real_kept = (unbound, real, tuple([p.key for p in real]))
        leaving = self._leaving()
        if not leaving:
            return real, []
        by_node = w.by_node()
        virtual = [
            replace(p, node_name=None, phase="Pending")
            for name in sorted(leaving)
            for p in by_node.get(name, ())
            if not p.is_daemonset
        ]
        return real, virtual

    def _leaving(self) -> frozenset[str]:
        """The node names of the claims whose node is leaving; kept while the claim table answers the very same tuple
        for the leaving phases (those claims are unchanged)."""
        claims = self.claims
        kept = self._leaving_kept
        if kept is not None and kept[0] == claims.version:  # (asked every round: the table unchanged, the answer too)
            return kept[2]
        leaving = claims.in_phases(LEAVING)
        if kept is not None and kept[1] is leaving:
            names = kept[2]
        else:
            names = frozenset([c.node_name for _, c in leaving if c.node_name])
        self._leaving_kept = (claims.version, leaving, names)
        return names

    def _in_flight(self) -> tuple[set[str], set[str]]:
        """(pods the claims in flight were launched for, node names of claims in flight); kept while the claim table
        answers the very same tuple for the phases in flight (those claims are unchanged): do not change the sets."""
        flying = self.claims.in_phases(IN_FLIGHT)
        kept = self._in_flight_kept
        if kept is not None and kept[0] is flying:
            return kept[1]
        pods: set[str] = set()
        coming_up: set[str] = set()
        for _, c in flying:
            pods.update(c.pods)
            if c.node_name:
                coming_up.add(c.node_name)
        self._in_flight_kept = (flying, (pods, coming_up))
        return pods, coming_up

    def _covered(self, todo: Sequence[Pod], w: World) -> bool:
        """True if the gate would find every pod of ``todo`` covered now (:func:`all_covered`)."""
        memo = self.scaleup.memo
        pods, coming_up = self._in_flight()
        fresh = w.now - memo.last_plan_at < self.config.replan_interval_s
        return all_covered(todo, memo, pods, coming_up, w.nodes, fresh)

    def _scale_up(self, w: World, result: ReconcileResult) -> None:
        """Gate, plan and launch (see :mod:`gpuscale.core.reconcile.scaleup` for the re-plan loop's bound)."""
        now = w.now
        st = self.scaleup
        real, virtual = self._pending(w)
        kept = self._real_kept
        keys = kept[2] if kept is not None and kept[1] is real else tuple([p.key for p in real])
        steady = self._steady
        if (
            steady is not None
            and not virtual
            and not st.force
            and steady[1] is st.memo
            and steady[0] == keys
            and (steady[2] is None or self._covered(steady[2], w))
        ):
            if not keys:
                self._prune_reports(())
            return
        self._steady = None
        closed = st.batch.update(keys, now)
        if not closed and not st.force and (keys or virtual) and self.shortcuts:
            return  # the gate's WAIT: the batch window is open (the gate reads nothing else first, changes nothing)
        in_flight: tuple[set[str], set[str]] | None = None
        static = st.memo.static_blocked
        if (virtual or any(p.key not in static for p in real)) and (closed or st.force):
            in_flight = self._in_flight()  # read only by the cover check (not when only static blocks are pending)
        verdict = gate_scale_up(
            real,
            virtual,
            st.memo,
            batch_closed=closed,
            force=st.force,
            in_flight_pods=in_flight[0] if in_flight else (),
            coming_up=in_flight[1] if in_flight else (),
            nodes=w.nodes,
            signature=lambda todo: self._signature(todo, virtual, w),
            now=now,
            replan_interval_s=self.config.replan_interval_s,
        )
        gate = verdict.gate
        st.keep(verdict.memo)
        if gate is _IDLE:
            st.batch.close()
            self._prune_reports(set())
            if self.shortcuts:
                self._steady = ((), st.memo, None)
            return
        if gate is _EMPTY:
            st.batch.close()
            if self.shortcuts:
                self._steady = (keys, st.memo, None)
            return
        if gate is _COVERED or gate is _UNCHANGED:
            if gate is _COVERED and not st.check and self.shortcuts:
                self._steady = (keys, st.memo, verdict.real)
            if st.check:
                snapshot = self._snapshot(w, verdict.real, virtual)
                ref = self._reference(snapshot, decide_scale_up(snapshot, st.planner, self.config.planner, now))

                def replan(moved: frozenset[str]) -> ScaleUpDecision:
                    kept = replace(snapshot, pods=tuple(p for p in snapshot.pods if p.key not in moved))
                    return self._reference(kept, decide_scale_up(kept, st.planner, self.config.planner, now))

                st.compare(now, gate, ref, self.config.replan_interval_s, pending=verdict.pending, replan=replan)
            return
        if gate is not _PLAN:
            return
        st.batch.close()
        result.planned = True
        real_todo = verdict.real
        seeds: set[tuple[str, ...]] = set()
        decision = None
        for attempt in range(max(1, self.config.max_replans)):
            snapshot = self._snapshot(w, real_todo, virtual)
            decision = decide_scale_up(
                snapshot,
                st.planner,
                self.config.planner,
                now,
                attempt=attempt,
                max_replans=self.config.max_replans,
            )
            held = self._held_in_flight(snapshot, decision.launches) if virtual else None
            if held is not None:  # a pod of a draining node took the room a node in flight was launched for
                decision = decide_scale_up(
                    held,
                    st.planner,
                    self.config.planner,
                    now,
                    attempt=attempt,
                    max_replans=self.config.max_replans,
                )
            decision = self._anticipate(snapshot if held is None else held, decision, w)
            seeds.update(o.seed for o in decision.launches)
            if not self._carry_out(decision.launches, w, result) or not decision.may_replan:
                break
        assert decision is not None
        memo = st.memo
        st.planned(
            PlanningMemo(
                last_plan_at=now,
                signature=self._signature(real_todo, virtual, w),
                planned_on_node={k: v for k, v in decision.placed.items() if v in w.nodes},
                static_blocked=memo.static_blocked | {b.pod for b in decision.blocked if b.reason in STATIC_BLOCKS},
                seeds=frozenset(seeds),
            )
        )
        for b in decision.blocked:
            self._report(f"pod/{b.pod}", str(b.reason), EventKind.BLOCKED, now, b.message)
        self._prune_reports(verdict.pending)

    def _anticipate(self, snapshot: Snapshot, decision: ScaleUpDecision, w: World) -> ScaleUpDecision:
        """The plan to carry out (the ``anticipate`` option may buy room for expected pods: OptionsController)."""
        return decision

    def _reference(self, snapshot: Snapshot, decision: ScaleUpDecision) -> ScaleUpDecision:
        """Check mode: the plan a skipped plan is compared with (``anticipate`` corrects it as it would the plan
        carried out: OptionsController)."""
        return decision

    _phases_kept: tuple[int, frozenset[tuple[str, object]]] | None = None
    """(the claim table's version, its (key, phase) pairs) for :meth:`_signature`: the same while the version is."""

    def _signature(self, real: Sequence[Pod], virtual: Sequence[Pod], w: World) -> object:
        now = w.now
        av = self.availability
        claims = self.claims
        phases = self._phases_kept
        if phases is None or phases[0] != claims.version:
            phases = self._phases_kept = (
                claims.version,
                frozenset(zip(claims.keys(), map(_PHASE, claims.values()), strict=True)),
            )
        return plan_signature(
            frozenset([p.key for p in real]),
            frozenset([p.key for p in virtual]),
            phases[1],
            [k for k, t in av.offerings.items() if t > now],
            w.nodes,
            [p for p in av.backoffs if av.backed_off(p, now)],
            [p for p, t in av.fallbacks.items() if t > now],
        )

    def _effective_pools(self, nodes: Sequence[Node], now: float) -> list[NodePool]:
        av = self.availability
        fallback = {p for p in self.pools if av.fallback_active(p, now)}
        backed_off = {p for p in self.pools if av.backed_off(p, now)}
        return effective_pools(list(self.pools.values()), nodes, fallback, backed_off)

    def _snapshot(self, w: World, real: Sequence[Pod], virtual: Sequence[Pod]) -> Snapshot:
        claims = self.claims
        by_name = {c.node_name: c for c in claims.values() if c.node_name}
        last = self._shown or {}
        shown: dict[str, tuple[Node, NodeClaim | None, Node]] = {}
        nodes: list[Node] = []
        for name, n in w.nodes.items():
            c = by_name.get(n.name)
            kept = last.get(name)
            node = kept[2] if kept is not None and kept[0] is n and kept[1] is c else _shown_node(n, c)
            shown[name] = (n, c, node)
            nodes.append(node)
        self._shown = shown
        gpr_keys = self.gpr.keys(claims)
        # the claims that may add a node (those in other phases, whose node is not listed, add none)
        off_node = dict(claims.in_phases(_MAY_ADD_NODE))
        off_node.update((k, claims[k]) for k in gpr_keys)
        last_off = self._shown_off or {}
        shown_off: dict[str, tuple[NodeClaim, bool, Node]] = {}
        for key, c in sorted(off_node.items()):
            if c.node_name in w.nodes:
                continue
            held = key in gpr_keys
            got = last_off.get(key)
            if got is not None and got[0] is c and got[1] is held:
                nodes.append(got[2])
                shown_off[key] = got
                continue
            if held:  # a GPR's node in flight counts against its pool's limits but is no room for pods
                if not c.alive:
                    continue
                node = replace(self._launching_node(key, c), launching=False, unschedulable=True)
            elif c.phase in (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED):
                node = self._launching_node(key, c)
            elif c.phase in (ClaimPhase.DRAINING, ClaimPhase.DELETING) or (c.phase is ClaimPhase.FAILED and c.node_id):
                # still billed and counted against maxNodes/limits, but takes no pods
                node = replace(self._launching_node(key, c), launching=False, unschedulable=True)
            else:
                continue
            nodes.append(node)
            shown_off[key] = (c, held, node)
        self._shown_off = shown_off
        skip = {p.key for p in virtual} | self.scaleup.memo.static_blocked
        pods = [p for p in w.pods if p.key not in skip] + list(virtual) if skip else [*w.pods, *virtual]
        return Snapshot(
            pods=tuple(pods),
            nodes=tuple(nodes),
            pools=tuple(self._effective_pools(nodes, w.now)),
            catalog=self.catalog,
            unavailable=self.availability.unavailable_at(w.now),
            workloads=self.gpr.workloads,
        )

    def _held_in_flight(self, snapshot: Snapshot, launches: Sequence[LaunchOrder]) -> Snapshot | None:
        """When a plan launches a node for a pending pod that a claim in flight was launched for (the planner gave
        that claim's room to a pod of a draining node, shown as pending), the snapshot with each such claim's pending
        pods shown on its launching node, so that the plan launches for the draining node's pods instead; else None.
        """
        launching = {n.name for n in snapshot.nodes if n.launching}
        hold: dict[str, str] = {}
        for key, c in self.claims.in_phases(IN_FLIGHT):
            name = c.node_name or f"nodeclaim-{key}"
            if c.replaces or name not in launching:
                continue
            for k in c.pods:
                hold.setdefault(k, name)
        if not any(k in hold for o in launches for k in o.pods):
            return None
        pods = tuple(replace(p, node_name=hold[p.key]) if p.pending and p.key in hold else p for p in snapshot.pods)
        return replace(snapshot, pods=pods)

    def _execute_plan(self, plan: ScaleUpPlan, w: World, result: ReconcileResult) -> bool:
        """Launch the nodes of a plan made elsewhere; True if a capacity or quota error calls for a re-plan."""
        return self._carry_out(launch_orders(plan)[0], w, result)

    def _carry_out(self, orders: Sequence[LaunchOrder], w: World, result: ReconcileResult) -> bool:
        """Launch the orders in turn as :func:`~gpuscale.core.reconcile.scaleup.after_launch` says; True if an
        outcome calls for a re-plan (the orders after it are not launched)."""
        skipped: int | None = None
        for order in orders:
            if order.group == skipped:
                continue
            outcome = self._launch_new(
                order.seed,
                order.pool,
                order.instance_type,
                order.zone,
                order.capacity_type,
                w,
                pods=order.pods,
                reason=order.reason,
            )
            if outcome is Outcome.OK:
                result.launched += 1
            step = after_launch(order, outcome)
            if step is Step.REPLAN:
                return True
            if step is Step.SKIP_GROUP:
                skipped = order.group
        return False

    _min_pools: tuple[object, bool] | None = None
    """(the pools, whether one has ``minNodes``): asked every round, kept until the pools are replaced by another
    object (as the fleet is)."""

    def _ensure_min_nodes(self, w: World, result: ReconcileResult) -> None:
        kept = self._min_pools
        if kept is None or kept[0] is not self.pools:
            kept = self._min_pools = (self.pools, any(p.min_nodes > 0 for p in self.pools.values()))
        if not kept[1]:
            return
        now = w.now
        av = self.availability
        backed_off = {p for p in self.pools if av.backed_off(p, now)}
        have = {
            name: self._alive_in_pool(name, w)
            for name, p in self.pools.items()
            if p.min_nodes > 0 and name not in backed_off
        }
        fallback = {p for p in self.pools if av.fallback_active(p, now)}
        mins = min_node_orders(list(self.pools.values()), have, self.catalog, av.offerings, fallback, backed_off, now)
        for name in mins.blocked:
            self._report(f"pool/{name}", "MinNodes", EventKind.BLOCKED, now, "no offering for minNodes")
        self._carry_out(mins.launches, w, result)

    def _alive_in_pool(self, pool: str, w: World) -> int:
        gpr_keys = self.gpr.keys(self.claims)  # a GPR's node does not count towards minNodes: pods cannot use it
        n = sum(1 for k, c in self.claims.items() if c.pool == pool and c.alive and k not in gpr_keys)
        n += sum(
            1
            for node in w.nodes.values()
            if node.pool == pool and not self.claims.names_node(node.name) and REQUEST_ID_LABEL not in node.labels
        )
        return n
