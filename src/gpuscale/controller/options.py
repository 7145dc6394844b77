"""The controller with the optional policies on (all off by default): eviction-cost awareness
(``evictionCost``, :mod:`gpuscale.core.disruption.workcost`), predictive warm headroom (``headroom`` per pool,
:mod:`gpuscale.core.headroom`), the per-node empty wait (``emptyWait``, :mod:`gpuscale.core.emptywait` through
:mod:`gpuscale.controller.emptykeep`: the gate reads a kept empty node's wait from :meth:`_pool_of_node`) and the
consolidation rules ``spotToSpot``, ``packOntoEmpty``, ``evictMaxPodAge`` and ``repack``
(:mod:`gpuscale.controller.repacking`), the right-sizing of young nodes (``rightsize``,
:mod:`gpuscale.controller.rightsizing`, after the consolidation step), and the demand-anticipating scale-up
(``anticipate``, :mod:`gpuscale.controller.anticipating`: each plan that launches nodes may be swapped for one with
room for the pods expected next, :meth:`OptionsController._anticipate`).

:class:`OptionsController` is the :class:`~gpuscale.controller.loop.Controller` with two hooks, both at the start of
the consolidation step of a round:

* it remembers when each pod was first seen bound to its node (the start of the work an eviction would lose) and
  weighs every consolidation pass's Underutilized actions against that lost work;
* it records the GPU demand of the pods it sees arrive, forecasts the demand of the next minutes per headroom pool,
  keeps that many empty nodes warm (they are not consolidation candidates while the forecast holds) and launches
  warm nodes for the rest, within ``maxNodes`` and ``maxHourlyCost``.

What it remembers (first-bound times, arrivals) is rebuilt from observation after a restart: ages restart at the
restart (fewer consolidations are held back) and the forecast starts again from an empty history.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscale.controller import repacking
from gpuscale.controller.anticipating import PLAN_REASON, Anticipation
from gpuscale.controller.emptykeep import EmptyWaits
from gpuscale.controller.loop import Controller, ControllerConfig
from gpuscale.controller.rightsizing import Rightsizing
from gpuscale.controller.shell import DisruptionInputs, ReconcileResult, World
from gpuscale.core.disruption import DisruptionPlan, pool_offerings
from gpuscale.core.disruption.workcost import weigh_actions
from gpuscale.core.headroom import (
    Forecast,
    HeadroomSpec,
    WarmNode,
    forecast,
    keep_warm,
    pick_offer,
    size_headroom,
)
from gpuscale.core.model import CapacityType, InstanceType, NodePool, Snapshot
from gpuscale.core.nodeclaim import IN_FLIGHT, ClaimPhase
from gpuscale.core.reconcile import EventKind, Outcome
from gpuscale.core.reconcile.scaleup import ScaleUpDecision, decide_scale_up
from gpuscale.core.resources import MILLI_PER_GPU

HEADROOM_REASON = "Headroom"
"""The launch reason (and claim reason) of a warm node."""
EMPTY_WAIT_REASON = "KeptEmpty"
"""The reason of the event saying an empty node is kept by ``emptyWait``."""


@dataclass
class HeadroomStats:
    """What the headroom cost and did, for reports."""

    launched: int = 0
    warm_node_seconds: float = 0.0
    warm_usd: float = 0.0
    last_at: float | None = None
    last_rate: float = 0.0
    """$/h of the warm nodes (kept empty nodes and warm nodes in flight) since ``last_at``."""
    forecasts: dict[str, Forecast] = field(default_factory=dict)
    _nodes: int = 0

    def advance(self, now: float, rate: float, nodes: int) -> None:
        """Account the warm nodes up to ``now``, then switch to ``rate`` $/h for ``nodes`` nodes."""
        if self.last_at is not None and now > self.last_at:
            self.warm_usd += self.last_rate * (now - self.last_at) / 3600.0
            self.warm_node_seconds += self._nodes * (now - self.last_at)
        self.last_at, self.last_rate, self._nodes = now, rate, nodes


class OptionsController(Controller):
    """The controller with ``evictionCost``, ``headroom`` and ``emptyWait`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bound_since: dict[str, tuple[str, float]] = {}
        """Pod key -> (node, when first seen bound there)."""
        self._ages_from: float | None = None
        """When :attr:`bound_since` was first filled: a pod bound then may have run for any time before."""
        self.arrivals: list[tuple[float, int]] = []
        """(time first seen, milli-GPU) of the GPU pods seen arriving, oldest first."""
        self._seen: set[str] | None = None
        self._first_seen = self.clock.now()
        self.warm: frozenset[str] = frozenset()
        """Empty nodes kept warm this round (not consolidation candidates)."""
        self.headroom_stats = HeadroomStats()
        self._warm_in_flight = 0
        self._last_headroom_at = self.clock.now()
        self._released_at = -math.inf
        spec = self.config.empty_wait
        self.empty_waits = EmptyWaits(spec, self.clock.now()) if spec is not None else None
        """Per-node empty waits (``emptyWait``; None: off)."""
        spec_a = self.config.anticipate
        self.anticipation = Anticipation(spec_a, self.clock.now()) if spec_a is not None else None
        """Arrivals and plan choices of the demand-anticipating scale-up (``anticipate``; None: off)."""
        self.rightsizing = Rightsizing(self.config.rightsize) if self.config.rightsize is not None else None
        """Replacement of young nodes by cheaper ones (``rightsize``; None: off)."""

    # ------------------------------------------------------------------------------------------------ hooks
    def next_wakeup(self) -> float | None:
        """The controller's timers and, while warm nodes wait, a look every half forecast window (the forecast
        drops with time alone, and then the warm nodes become consolidation candidates); after nodes stop being kept
        warm, a look once the consolidation gate re-evaluates unchanged inputs (``consolidationRefresh``)."""
        t = super().next_wakeup()
        ew = self.empty_waits
        if ew is not None and ew.look_at > self.clock.now():
            t = ew.look_at if t is None else min(t, ew.look_at)
        rs = self.rightsizing
        if rs is not None and rs.look_at is not None and rs.look_at > self.clock.now():
            t = rs.look_at if t is None else min(t, rs.look_at)
        if not self.config.headroom:
            return t
        now = self.clock.now()
        looks = [self._released_at + self.config.consolidation_refresh_s + 1e-3]
        if self.warm or self._warm_in_flight:
            looks.append(self._last_headroom_at + min(s.lead_s for s in self.config.headroom.values()) / 2)
        for look in looks:
            if look > now:
                t = look if t is None else min(t, look)
        return t

    def _consolidate(self, w: World, result: ReconcileResult) -> None:
        if self.config.eviction_cost is not None or repacking.uses_ages(self):
            self._observe_ages(w)
        if self.config.headroom:
            self._keep_headroom(w, result)
        if self.empty_waits is not None:
            self._decide_empty_waits(w)
        if self.anticipation is not None:
            self.anticipation.observe(w)
            if self.anticipation.spec.learn_use:
                used = {p.node_name for p in w.pods if p.node_name is not None and not p.is_daemonset}
                self.anticipation.settle((c for _, c in self.claims.items()), used, w.now)
        disrupted = result.disrupted
        super()._consolidate(w, result)
        if self.config.spot_to_spot is not None:
            repacking.cordon_spot_swaps(self, w)
        if self.rightsizing is not None and self.config.consolidation and result.disrupted == disrupted:
            self.rightsizing.step(self, w, result, self._known_ages())

    def _anticipate(self, snapshot: Snapshot, decision: ScaleUpDecision, w: World) -> ScaleUpDecision:
        a = self.anticipation
        if a is None or not decision.launches:
            return decision
        a.observe(w)
        st, cfg, now = self.scaleup, self.config, w.now

        def replan(s: Snapshot) -> ScaleUpDecision:
            return decide_scale_up(
                s, st.planner, cfg.planner, now, attempt=decision.attempt, max_replans=cfg.max_replans
            )

        return a.choose(snapshot, decision, replan, self.catalog, now)

    def _launch_with_id(
        self,
        rid: str,
        pool: NodePool,
        it: InstanceType,
        zone: str,
        ct: CapacityType,
        w: World,
        pods: tuple[str, ...],
        replaces: str,
        reason: str,
    ) -> Outcome:
        out = super()._launch_with_id(rid, pool, it, zone, ct, w, pods, replaces, reason)
        a = self.anticipation
        if a is not None and out is Outcome.OK and not pods and not replaces and reason == PLAN_REASON:
            a.note_launch(rid, pool.name, it.name, w.now)  # an extra node (``anticipate``): plain ones name pods
        return out

    def _reference(self, snapshot: Snapshot, decision: ScaleUpDecision) -> ScaleUpDecision:
        a = self.anticipation
        if a is None:
            return decision
        st, cfg, now = self.scaleup, self.config, self.clock.now()

        def replan(s: Snapshot) -> ScaleUpDecision:
            return decide_scale_up(s, st.planner, cfg.planner, now)

        return a.corrected(snapshot, decision, replan, self.catalog)

    def _pool_of_node(self, name: str) -> NodePool | None:
        pool = super()._pool_of_node(name)
        return self.empty_waits.pool_for(name, pool) if self.empty_waits is not None else pool

    def _node_pools(self) -> Callable[[str], NodePool | None]:
        return self._pool_of_node if self.empty_waits is not None else super()._node_pools()

    def _decide_empty_waits(self, w: World) -> None:
        ew = self.empty_waits
        assert ew is not None
        ew.observe(w)
        ew.decide(w, self.claims)
        for name, d in ew.kept():
            self._report(f"node/{name}", EMPTY_WAIT_REASON, EventKind.DISRUPTION_BLOCKED, w.now, d.reason)

    def _disruption_pass(
        self,
        inputs: DisruptionInputs,
        candidates: set[str],
        disrupting: set[str],
        since: Mapping[str, float],
        w: World,
        *memo: Any,
    ) -> DisruptionPlan:
        if self.warm:
            candidates = candidates - self.warm
        dp = super()._disruption_pass(inputs, candidates, disrupting, since, w, *memo)
        rule = self.config.eviction_cost
        if rule is not None and dp.actions:
            started = {k: t for k, (_, t) in self.bound_since.items()}
            dp = weigh_actions(dp, inputs.nodes, inputs.pods, started, self.catalog, rule, w.now)
        if repacking.uses_ages(self):
            started = {k: t for k, (_, t) in self.bound_since.items()}
            known = self._known_ages()
            dp = repacking.apply_rules(self, dp, inputs, candidates, disrupting, since, w, started, known)
        return dp

    # ------------------------------------------------------------------------------------------------ ages
    def _known_ages(self) -> dict[str, float]:
        """First-bound times of the pods seen bind since the first observation (``rightsize``, and ``repack``'s and
        ``spotToSpot``'s ``maxPodAge``): a pod already bound then (after a restart, say) may be older than
        ``maxPodAge``, so its age is unknown and its node is left."""
        first = self._ages_from
        return {k: t for k, (_, t) in self.bound_since.items() if first is not None and t > first}

    def _observe_ages(self, w: World) -> None:
        if self._ages_from is None:
            self._ages_from = w.now
        old = self.bound_since
        new: dict[str, tuple[str, float]] = {}
        for p in w.pods:
            if p.node_name is None:
                continue
            prev = old.get(p.key)
            new[p.key] = prev if prev is not None and prev[0] == p.node_name else (p.node_name, w.now)
        self.bound_since = new

    # ------------------------------------------------------------------------------------------------ headroom
    def _observe_arrivals(self, w: World, specs: Sequence[HeadroomSpec]) -> None:
        keys = {p.key for p in w.pods}
        if self._seen is not None:
            for p in w.pods:
                if p.key not in self._seen and not p.is_daemonset and p.request.gpu_demand_milli > 0:
                    self.arrivals.append((w.now, p.request.gpu_demand_milli))
        self._seen = keys
        keep_from = w.now - max(s.history_s for s in specs)
        cut = bisect.bisect_left(self.arrivals, (keep_from, -1))
        if cut:
            del self.arrivals[:cut]

    def _keep_headroom(self, w: World, result: ReconcileResult) -> None:
        specs = {name: s for name, s in self.config.headroom.items() if name in self.pools}
        if not specs:
            return
        self._observe_arrivals(w, list(specs.values()))
        now = w.now
        by_node = w.by_node()
        pending = sum(p.request.gpu_demand_milli for p in w.unbound() if p.pending and not p.is_daemonset)
        warm: list[str] = []
        rate = 0.0
        count = 0
        for name, spec in specs.items():
            fc = forecast(self.arrivals, self._first_seen, now, spec)
            self.headroom_stats.forecasts[name] = fc
            free = -pending if len(specs) == 1 else 0
            empty: list[WarmNode] = []
            hr_flight: list[float] = []
            hr_flight_gpus = 0
            for _, c in self.claims.items():
                if c.pool != name:
                    continue
                gpus = c.expected.gpus
                if c.phase in IN_FLIGHT:
                    if c.reason == HEADROOM_REASON and not c.pods:
                        hr_flight.append(c.hourly_price)
                        hr_flight_gpus += gpus
                    else:
                        free += gpus * MILLI_PER_GPU
                    continue
                node = w.nodes.get(c.node_name) if c.phase is ClaimPhase.INITIALIZED and c.node_name else None
                if node is None or node.unschedulable or gpus <= 0:
                    continue
                pods = [p for p in by_node.get(node.name, ()) if not p.is_daemonset]
                if pods:
                    free += node.allocatable.gpus * MILLI_PER_GPU - sum(p.request.gpu_demand_milli for p in pods)
                else:
                    empty.append(WarmNode(node.name, node.allocatable.gpus, c.hourly_price))
            kept = keep_warm(empty, fc, free, spec)
            prices = {n.name: n.hourly_price for n in empty}
            kept_gpus = sum(n.gpus for n in empty if n.name in kept)
            kept_cost = sum(prices[n] for n in kept) + sum(hr_flight)
            warm.extend(kept)
            rate += kept_cost
            count += len(kept) + len(hr_flight)
            left = replace(
                spec,
                max_nodes=max(0, spec.max_nodes - len(kept) - len(hr_flight)),
                max_hourly_cost=max(0.0, spec.max_hourly_cost - kept_cost),
            )
            if not spec.launch or left.max_nodes <= 0 or self.availability.backed_off(name, now):
                continue
            offers = [
                o
                for o in pool_offerings(self.pools[name], self.catalog, now, self.availability.offerings)
                if o.instance_type.gpu_count > 0 and (spec.instance_type in (None, o.instance_type.name))
            ]
            pick = pick_offer([(o.instance_type.gpu_count, o.price) for o in offers], left.max_hourly_cost)
            if pick is None:
                continue
            po = offers[pick]
            covered = free + (kept_gpus + hr_flight_gpus) * MILLI_PER_GPU
            sizing = size_headroom(fc, covered, po.instance_type.gpu_count, po.price, left)
            bucket = str(int(now // spec.lead_s))
            for k in range(sizing.nodes):
                seed = (
                    HEADROOM_REASON.lower(),
                    name,
                    po.instance_type.name,
                    po.offering.zone,
                    str(po.offering.capacity_type),
                )
                outcome = self._launch_new(
                    (*seed, bucket, str(k)),
                    name,
                    po.instance_type.name,
                    po.offering.zone,
                    po.offering.capacity_type,
                    w,
                    reason=HEADROOM_REASON,
                )
                if outcome is Outcome.OK:
                    result.launched += 1
                    self.headroom_stats.launched += 1
                    rate += po.price
                    count += 1
                    self._record(now, EventKind.SCALE_UP, f"pool/{name}", HEADROOM_REASON, sizing.reason)
                elif outcome is not Outcome.RETRY:
                    break
        if self.warm - set(warm):
            self._released_at = now
        self.warm = frozenset(warm)
        self._warm_in_flight = count - len(warm)
        self._last_headroom_at = now
        self.headroom_stats.advance(now, rate, count)


def options_controller(*, config: ControllerConfig | Mapping[str, Any] | None = None, **kw: Any) -> Controller:
    """A controller factory (the simulator's signature): :class:`OptionsController` when ``evictionCost``,
    ``headroom``, ``emptyWait``, ``evictMaxPodAge``, ``repack``, ``spotToSpot`` or ``packOntoEmpty: false`` is set,
    else the plain :class:`~gpuscale.controller.loop.Controller`, exactly as
    :func:`~gpuscale.controller.loop.make_controller` builds it."""
    cfg = config if isinstance(config, ControllerConfig) else ControllerConfig.from_policy(config)
    if (
        cfg.eviction_cost is None
        and not cfg.headroom
        and cfg.empty_wait is None
        and cfg.anticipate is None
        and not repacking.uses_config(cfg)
    ):
        from gpuscale.controller.loop import make_controller

        return make_controller(config=cfg, **kw)
    return OptionsController(
        kw.pop("backend"), kw.pop("provider"), kw.pop("pools"), kw.pop("catalog"), kw.pop("clock"), cfg, **kw
    )
