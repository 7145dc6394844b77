"""The scale-up steps of a round: launch retries that are due, batching of pending pods, planning (the pure
:func:`gpuscale.core.planner.plan` over a snapshot in which in-flight claims are launching nodes), re-planning
after capacity or quota errors, and ``minNodes``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuscale.controller.batching import PendingBatch
from gpuscale.controller.shell import LEAVING, STATIC_BLOCKS, ReconcileResult, ShellBase, World
from gpuscale.core.disruption import pool_offerings
from gpuscale.core.model import CapacityType, Node, NodePool, Pod, Snapshot
from gpuscale.core.nodeclaim import IN_FLIGHT, REQUEST_ID_LABEL, ClaimPhase
from gpuscale.core.plan import PlannerConfig, ScaleUpPlan
from gpuscale.core.reconcile import EventKind, Outcome

PlanFn = Callable[[Snapshot, PlannerConfig, float], ScaleUpPlan]
"""The planner's signature (:func:`gpuscale.core.planner.plan`)."""


class ScaleUpSteps(ShellBase):
    """Scale-up and ``minNodes`` (part of :class:`~gpuscale.controller.loop.Controller`)."""

    _plan_fn: PlanFn
    batch: PendingBatch
    _last_plan_at: float
    _last_signature: object
    _static_blocked: set[str]

    def _retry_requested(self, w: World, result: ReconcileResult) -> None:
        for key, c in self.claims.in_phases((ClaimPhase.REQUESTED,)):
            if self.launcher.due(key, w.now):
                if self.availability.backed_off(c.pool, w.now):
                    continue
                outcome = self._call_launch(key, w)
                if outcome is Outcome.OK:
                    result.launched += 1
                elif outcome is not Outcome.RETRY:
                    self._force_plan = True

    def _pending(self, w: World) -> tuple[list[Pod], list[Pod]]:
        """(real pending pods, pods of draining nodes shown to the planner as pending)."""
        real = [p for p in w.unbound() if p.phase == "Pending" and not p.is_daemonset]
        leaving = {c.node_name for _, c in self.claims.in_phases(LEAVING) if c.node_name}
        by_node = w.by_node()
        virtual = [
            replace(p, node_name=None, phase="Pending")
            for name in sorted(leaving)
            for p in by_node.get(name, ())
            if not p.is_daemonset
        ]
        return real, virtual

    def _scale_up(self, w: World, result: ReconcileResult) -> None:
        now = w.now
        real, virtual = self._pending(w)
        closed = self.batch.update((p.key for p in real), now)
        if not real and not virtual:
            self.batch.close()
            self._planned_on_node = {}
            self._prune_reports(set())
            return
        if not closed and not self._force_plan:
            return
        # pods no cluster change can help (too large, no matching pool) keep their reason and are not re-planned
        pending_keys = {p.key for p in real} | {p.key for p in virtual}
        self._static_blocked &= pending_keys
        real = [p for p in real if p.key not in self._static_blocked]
        if not real and not virtual:
            self.batch.close()
            return
        if not virtual and not self._force_plan and self._all_covered(real, w):
            return  # every pending pod already has room on a node in flight: re-planning cannot launch less
        signature = self._signature(real, virtual, w)
        if (
            not self._force_plan
            and signature == self._last_signature
            and now - self._last_plan_at < self.config.replan_interval_s
        ):
            return
        self._force_plan = False
        self.batch.close()
        result.planned = True
        plan: ScaleUpPlan | None = None
        for _ in range(max(1, self.config.max_replans)):
            snapshot = self._snapshot(w, real, virtual)
            plan = self._plan_fn(snapshot, self.config.planner, now)
            if not self._execute_plan(plan, w, result):
                break
        assert plan is not None
        self._last_plan_at = now
        self._planned_on_node = {k: v for k, v in plan.placements.items() if v in w.nodes}
        self._last_signature = self._signature(real, virtual, w)
        self._static_blocked |= {b.pod for b in plan.blocked if b.reason in STATIC_BLOCKS}
        for b in plan.blocked:
            self._report(f"pod/{b.pod}", str(b.reason), EventKind.BLOCKED, now, b.message)
        self._prune_reports(pending_keys)

    def _all_covered(self, real: Sequence[Pod], w: World) -> bool:
        """True if every pending pod is one a live in-flight claim was launched for, or was planned onto a node
        that is still coming up (or, within ``replan_interval_s``, onto any schedulable node)."""
        in_flight: set[str] = set()
        coming_up: set[str] = set()
        for _, c in self.claims.in_phases(IN_FLIGHT):
            in_flight.update(c.pods)
            if c.node_name:
                coming_up.add(c.node_name)
        fresh = w.now - self._last_plan_at < self.config.replan_interval_s
        for p in real:
            if p.key in in_flight:
                continue
            target = self._planned_on_node.get(p.key)
            node = w.nodes.get(target) if target is not None else None
            if node is not None and not node.unschedulable and (target in coming_up or fresh):
                continue
            return False
        return True

    def _signature(self, real: Sequence[Pod], virtual: Sequence[Pod], w: World) -> object:
        now = w.now
        return (
            frozenset(p.key for p in real),
            frozenset(p.key for p in virtual),
            frozenset((k, c.phase) for k, c in self.claims.items()),
            frozenset(k for k, t in self.availability.offerings.items() if t > now),
            frozenset(w.nodes),
            frozenset(p for p in self.availability.backoffs if self.availability.backed_off(p, now)),
            frozenset(p for p, t in self.availability.fallbacks.items() if t > now),
        )

    def _effective_pools(self, nodes: Sequence[Node], now: float) -> list[NodePool]:
        counts: dict[str, int] = {}
        for n in nodes:
            if n.pool is not None:
                counts[n.pool] = counts.get(n.pool, 0) + 1
        out: list[NodePool] = []
        for p in self.pools.values():
            q = p
            if self._spot_fallback(p, now) and CapacityType.ON_DEMAND not in p.capacity_types:
                q = replace(q, capacity_types=(*p.capacity_types, CapacityType.ON_DEMAND))
            if self.availability.backed_off(p.name, now):
                q = replace(q, max_nodes=counts.get(p.name, 0))
            out.append(q)
        return out

    def _snapshot(self, w: World, real: Sequence[Pod], virtual: Sequence[Pod]) -> Snapshot:
        by_name = {c.node_name: c for c in self.claims.values() if c.node_name}
        nodes: list[Node] = []
        for n in w.nodes.values():
            c = by_name.get(n.name)
            if c is not None and c.phase in LEAVING:
                nodes.append(replace(n, unschedulable=True, pool=n.pool or c.pool))
            elif c is not None and c.phase is ClaimPhase.REGISTERED:
                alloc = c.expected if c.expected.gpus > n.allocatable.gpus else n.allocatable
                nodes.append(replace(n, allocatable=alloc, launching=True, pool=n.pool or c.pool))
            elif c is not None and n.pool is None:
                nodes.append(replace(n, pool=c.pool))
            else:
                nodes.append(n)
        gpr_keys = self.gpr.keys(self.claims)
        for key, c in sorted(self.claims.items()):
            if c.node_name in w.nodes:
                continue
            if key in gpr_keys:  # a GPR's node in flight counts against its pool's limits but is no room for pods
                if c.alive:
                    nodes.append(replace(self._launching_node(key, c), launching=False, unschedulable=True))
                continue
            if c.phase in (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED):
                nodes.append(self._launching_node(key, c))
            elif c.phase in (ClaimPhase.DRAINING, ClaimPhase.DELETING) or (c.phase is ClaimPhase.FAILED and c.node_id):
                # still billed and counted against maxNodes/limits, but takes no pods
                nodes.append(replace(self._launching_node(key, c), launching=False, unschedulable=True))
        virtual_keys = {p.key for p in virtual}
        pods = [p for p in w.pods if p.key not in virtual_keys and p.key not in self._static_blocked] + list(virtual)
        return Snapshot(
            pods=tuple(pods),
            nodes=tuple(nodes),
            pools=tuple(self._effective_pools(nodes, w.now)),
            catalog=self.catalog,
            unavailable=self.availability.unavailable_at(w.now),
        )

    def _execute_plan(self, plan: ScaleUpPlan, w: World, result: ReconcileResult) -> bool:
        """Launch the plan's nodes; True if a capacity or quota error calls for a re-plan."""
        per_node: dict[str, list[str]] = {}
        for pod, target in plan.placements.items():
            per_node.setdefault(target, []).append(pod)
        replan = False
        for launch in plan.launches:
            for i in range(launch.count):
                pods = tuple(sorted(per_node.get(f"{launch.id}/{i}", ())))
                seed = ("up", launch.pool, launch.instance_type, launch.zone, str(launch.capacity_type), *pods)
                if not pods:
                    seed = (*seed, str(i))
                outcome = self._launch_new(
                    seed,
                    launch.pool,
                    launch.instance_type,
                    launch.zone,
                    launch.capacity_type,
                    w,
                    pods=pods,
                    reason="ScaleUp",
                )
                if outcome is Outcome.OK:
                    result.launched += 1
                if outcome in (Outcome.CAPACITY, Outcome.QUOTA):
                    replan = True
                    break
                if outcome in (Outcome.FAILED, Outcome.GUARD):
                    break
        return replan

    def _ensure_min_nodes(self, w: World, result: ReconcileResult) -> None:
        now = w.now
        for pool in self.pools.values():
            if pool.min_nodes <= 0 or self.availability.backed_off(pool.name, now):
                continue
            have = self._alive_in_pool(pool.name, w)
            for k in range(have, pool.min_nodes):
                eff = next(p for p in self._effective_pools([], now) if p.name == pool.name)
                offers = pool_offerings(eff, self.catalog, now, self.availability.offerings)
                if not offers:
                    self._report(f"pool/{pool.name}", "MinNodes", EventKind.BLOCKED, now, "no offering for minNodes")
                    break
                po = offers[0]
                seed = (
                    "min",
                    pool.name,
                    po.instance_type.name,
                    po.offering.zone,
                    str(po.offering.capacity_type),
                    str(k),
                )
                outcome = self._launch_new(
                    seed,
                    pool.name,
                    po.instance_type.name,
                    po.offering.zone,
                    po.offering.capacity_type,
                    w,
                    reason="MinNodes",
                )
                if outcome is Outcome.OK:
                    result.launched += 1
                elif outcome is not Outcome.RETRY:
                    break

    def _alive_in_pool(self, pool: str, w: World) -> int:
        gpr_keys = self.gpr.keys(self.claims)  # a GPR's node does not count towards minNodes: pods cannot use it
        n = sum(1 for k, c in self.claims.items() if c.pool == pool and c.alive and k not in gpr_keys)
        n += sum(
            1
            for node in w.nodes.values()
            if node.pool == pool and not self.claims.names_node(node.name) and REQUEST_ID_LABEL not in node.labels
        )
        return n
