"""Autoscaling policies the simulator can compare, all built on the same simulated cluster and cloud.

* ``gpuscale``: the gpuscale controller with the scenario's pools and policy
  (:func:`gpuscale.controller.options.options_controller`: the plain controller unless ``evictionCost`` or a
  pool's ``headroom`` is set).
* ``cluster-autoscaler``: cluster-autoscaler-like. One instance type per node group (each pool is split into one
  group per instance type), the *least-waste* expander (the group that leaves the least idle GPU, then CPU, after
  scale-up), and scale-down of nodes below 50 % GPU requests for 10 minutes whose pods fit elsewhere (no replacement
  by a cheaper node).
* ``karpenter``: Karpenter-like. The cheapest instance type that fits each new node's pods (no look-ahead over
  several types, no integer program), ``WhenEmptyOrUnderutilized`` with ``consolidateAfter: 0``.
* ``static-peak``: enough nodes for the workload's peak, bought at the start and never removed.

Every policy is a controller factory with the simulator runner's signature. The offline lower bound on cost
(:func:`lower_bound`) comes from :mod:`gpuscale.core.bounds`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuscale.clock import Clock
from gpuscale.controller.backend import ClusterBackend
from gpuscale.controller.loop import Controller, ControllerConfig
from gpuscale.controller.options import options_controller
from gpuscale.core.bounds import Interval, cost_lower_bound
from gpuscale.core.model import Catalog, ConsolidationPolicy, Disruption, NodePool, Pod, Snapshot
from gpuscale.core.plan import BlockReason, Launch, PlannerConfig, ScaleUpPlan
from gpuscale.core.planner import plan
from gpuscale.core.resources import MILLI_PER_GPU
from gpuscale.providers.base import Provider
from gpuscale.sim.workloads import Arrival

POLICIES = ("gpuscale", "cluster-autoscaler", "karpenter", "static-peak")

Factory = Callable[..., Any]


def _config(config: Mapping[str, Any] | None) -> ControllerConfig:
    """The scenario's policy for a baseline: gpuscale's optional policies (``evictionCost``, ``headroom``,
    ``emptyWait``) are gpuscale's own and left out."""
    return dataclasses.replace(ControllerConfig.from_policy(config), eviction_cost=None, headroom={}, empty_wait=None)


# ------------------------------------------------------------------------------------------------ cluster-autoscaler
def node_groups(pools: Sequence[NodePool], catalog: Catalog) -> tuple[NodePool, ...]:
    """One node group per (pool, instance type), with cluster-autoscaler's scale-down rule."""
    names = sorted(catalog.by_name())
    out: list[NodePool] = []
    for p in pools:
        disruption = Disruption(
            consolidation_policy=ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED,
            consolidate_after_s=600.0,
            budgets=p.disruption.budgets,
            utilization_threshold=0.5,
        )
        for t in p.instance_types or tuple(names):
            if t in catalog.by_name():
                out.append(dataclasses.replace(p, name=f"{p.name}-{t}", instance_types=(t,), disruption=disruption))
    return tuple(out)


def _waste(launches: Sequence[Launch], snapshot: Snapshot) -> tuple[float, float]:
    """(idle GPU fraction, idle CPU fraction) of new nodes after scale-up."""
    types = snapshot.catalog.by_name()
    pods = {p.key: p for p in snapshot.pods}
    gpu_cap = cpu_cap = gpu_used = cpu_used = 0.0
    for launch in launches:
        it = types[launch.instance_type]
        gpu_cap += it.gpu_count * MILLI_PER_GPU * launch.count
        cpu_cap += it.vcpus * 1000 * launch.count
        for k in launch.pods:
            gpu_used += pods[k].request.gpu_demand_milli
            cpu_used += pods[k].request.cpu_milli
    return (1 - gpu_used / gpu_cap if gpu_cap else 0.0, 1 - cpu_used / cpu_cap if cpu_cap else 0.0)


def least_waste_plan(snapshot: Snapshot, config: PlannerConfig, now: float) -> ScaleUpPlan:
    """Cluster-autoscaler's least-waste expander over single-type node groups, one group per expansion step."""
    base = plan(dataclasses.replace(snapshot, pools=()), config, now)
    placements = dict(base.placements)
    bound = dict(placements)
    waiting = {b.pod for b in base.blocked if b.reason is BlockReason.NO_POOLS}
    other_blocked = [b for b in base.blocked if b.reason is not BlockReason.NO_POOLS]
    launches: list[Launch] = []
    groups = list(snapshot.pools)
    step = 0
    while waiting:
        pods = tuple(
            dataclasses.replace(p, node_name=bound[p.key], phase="Running") if p.key in bound else p
            for p in snapshot.pods
            if p.key in waiting or p.key in bound or not p.pending
        )
        best: tuple[tuple[float, float, int, str], ScaleUpPlan] | None = None
        for g in groups:
            used = [x for x in launches if x.pool == g.name]
            sub = dataclasses.replace(snapshot, pods=pods, pools=(_shrink(g, sum(x.count for x in used)),))
            r = plan(sub, dataclasses.replace(config, exact_solver=False, launch_id_prefix=f"ca{step}"), now)
            if not r.launches:
                continue
            gw, cw = _waste(r.launches, sub)
            key = (round(gw, 9), round(cw, 9), -len([k for k in r.placements if k in waiting]), g.name)
            if best is None or key < best[0]:
                best = (key, r)
        if best is None:
            break
        r = best[1]
        launches.extend(r.launches)
        for launch in r.launches:
            for k in launch.pods:
                placements[k] = r.placements[k]
                waiting.discard(k)
        step += 1
    final_blocked = list(other_blocked)
    if waiting:
        rest = plan(snapshot, dataclasses.replace(config, exact_solver=False), now)
        final_blocked += [b for b in rest.blocked if b.pod in waiting]
        explained = {b.pod for b in final_blocked}
        for k in sorted(waiting - explained):
            final_blocked.append(dataclasses.replace(rest.blocked[0], pod=k) if rest.blocked else _no_group(k))
    return ScaleUpPlan(tuple(launches), placements, tuple(sorted(final_blocked, key=lambda b: b.pod)), "least-waste")


def _no_group(pod: str) -> Any:
    from gpuscale.core.plan import Blocked

    return Blocked(pod, BlockReason.POOL_AT_MAX_NODES, "no node group can take the pod")


def _shrink(pool: NodePool, launched: int) -> NodePool:
    """The pool with ``launched`` fewer nodes allowed (already planned in this round)."""
    if pool.max_nodes is None or not launched:
        return pool
    return dataclasses.replace(pool, max_nodes=max(0, pool.max_nodes - launched))


def cluster_autoscaler_factory(
    *,
    backend: ClusterBackend,
    provider: Provider,
    pools: Sequence[NodePool],
    catalog: Catalog,
    clock: Clock,
    config: Mapping[str, Any] | None = None,
) -> Controller:
    """A cluster-autoscaler-like controller (see the module docstring)."""
    cfg = _config(config)
    planner_cfg = dataclasses.replace(cfg.planner, exact_solver=False, gang_tolerance=None)
    cfg = dataclasses.replace(cfg, planner=planner_cfg, replace_nodes=False)
    return Controller(backend, provider, node_groups(pools, catalog), catalog, clock, cfg, planner=least_waste_plan)


# ------------------------------------------------------------------------------------------------------- karpenter
def karpenter_pools(pools: Sequence[NodePool]) -> tuple[NodePool, ...]:
    """The pools with Karpenter's default-like disruption: WhenEmptyOrUnderutilized, consolidateAfter 0."""
    return tuple(
        dataclasses.replace(
            p,
            disruption=dataclasses.replace(
                p.disruption,
                consolidation_policy=ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED,
                consolidate_after_s=0.0,
                consolidate_empty_after_s=None,
            ),
        )
        for p in pools
    )


def karpenter_factory(
    *,
    backend: ClusterBackend,
    provider: Provider,
    pools: Sequence[NodePool],
    catalog: Catalog,
    clock: Clock,
    config: Mapping[str, Any] | None = None,
) -> Controller:
    """A Karpenter-like controller (see the module docstring)."""
    cfg = _config(config)
    planner_cfg = dataclasses.replace(
        cfg.planner, exact_solver=False, candidate_types=1, scorer="best-fit", gang_tolerance=None
    )
    cfg = dataclasses.replace(cfg, planner=planner_cfg)
    return Controller(backend, provider, karpenter_pools(pools), catalog, clock, cfg)


# ----------------------------------------------------------------------------------------------------- static peak
def peak_snapshot(arrivals: Sequence[Arrival], pools: Sequence[NodePool], catalog: Catalog) -> Snapshot:
    """The pods running at the moment of peak GPU (then CPU) demand, as a snapshot of pending pods."""
    events: list[tuple[float, int, Arrival]] = []
    for a in arrivals:
        events.append((a.at, 1, a))
        events.append((a.at + a.duration, -1, a))
    events.sort(key=lambda e: (e[0], e[1]))
    active: dict[str, Pod] = {}
    best: tuple[int, int] = (-1, -1)
    best_set: list[Pod] = []
    for _, sign, a in events:
        if sign > 0:
            active[a.pod.key] = a.pod
            demand = (
                sum(p.request.gpu_demand_milli for p in active.values()),
                sum(p.request.cpu_milli for p in active.values()),
            )
            if demand > best:
                best, best_set = demand, list(active.values())
        else:
            active.pop(a.pod.key, None)
    pending = tuple(dataclasses.replace(p, node_name=None, phase="Pending") for p in best_set)
    return Snapshot(pending, (), tuple(pools), catalog)


class StaticPeak:
    """Buys the nodes for the workload's peak at the first reconcile, then behaves as a controller that never
    scales down (it still scales up if the peak plan misses a pod shape)."""

    def __init__(self, inner: Controller, arrivals: Sequence[Arrival]) -> None:
        self.inner = inner
        self.arrivals = arrivals
        self.started = False

    def reconcile(self) -> Any:
        """Launch the peak plan once (idempotently by request id), then reconcile as usual."""
        if not self.started:
            self.started = True
            snap = peak_snapshot(self.arrivals, tuple(self.inner.pools.values()), self.inner.catalog)
            peak = plan(snap, self.inner.config.planner, self.inner.clock.now())
            self.inner.prelaunch(peak)
        return self.inner.reconcile()

    def next_wakeup(self) -> float | None:
        """The inner controller's next timer."""
        return self.inner.next_wakeup()


def static_peak_factory(arrivals: Sequence[Arrival]) -> Factory:
    """A factory for :class:`StaticPeak` given the workload."""

    def factory(
        *,
        backend: ClusterBackend,
        provider: Provider,
        pools: Sequence[NodePool],
        catalog: Catalog,
        clock: Clock,
        config: Mapping[str, Any] | None = None,
    ) -> StaticPeak:
        cfg = dataclasses.replace(_config(config), consolidation=False)
        return StaticPeak(Controller(backend, provider, pools, catalog, clock, cfg), arrivals)

    return factory


def factory_for(name: str, arrivals: Sequence[Arrival]) -> Factory:
    """The controller factory of a policy by name."""
    if name == "gpuscale":
        return options_controller
    if name == "cluster-autoscaler":
        return cluster_autoscaler_factory
    if name == "karpenter":
        return karpenter_factory
    if name == "static-peak":
        return static_peak_factory(arrivals)
    raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


def lower_bound(arrivals: Sequence[Arrival], pools: Sequence[NodePool], catalog: Catalog) -> float:
    """Offline lower bound on the cost (USD) of running every arrival for its duration at its arrival time."""
    snap = Snapshot((), (), tuple(pools), catalog)
    return cost_lower_bound((Interval(a.pod, a.at, a.at + a.duration) for a in arrivals), snap)
