"""The controller's settings (:class:`ControllerConfig`), read from a scenario's ``policy`` mapping or built in code."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscale.controller import policyopts, repackopts
from gpuscale.controller.anticipating import anticipate_setting
from gpuscale.core.anticipate import AnticipateSpec
from gpuscale.core.disruption.repack import PodAgeRule, RepackRule
from gpuscale.core.disruption.rightsize import RightsizeRule
from gpuscale.core.disruption.spotswap import SpotSwapRule
from gpuscale.core.disruption.workcost import WorkCostRule
from gpuscale.core.emptywait import EmptyWaitSpec
from gpuscale.core.headroom import HeadroomSpec
from gpuscale.core.nodeclaim import DEFAULT_DEADLINES, Deadlines
from gpuscale.core.plan import DEFAULT_GANG_TOLERANCE as GANG_TOLERANCE
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.reconcile import LaunchRules, Rules
from gpuscale.core.scoring import SCORERS
from gpuscale.errors import InputError
from gpuscale.manifests.quantity import DURATION_HELP, parse_duration


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Knobs of the reconcile loop (times in seconds)."""

    batch_idle_s: float = 1.0
    """A batch of pending pods closes this long after the last new pending pod..."""
    batch_max_s: float = 10.0
    """...or this long after it opened."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    deadlines: Deadlines = DEFAULT_DEADLINES
    pool_deadlines: Mapping[str, Deadlines] = field(default_factory=dict)
    """Per-pool overrides of ``deadlines``."""
    unavailable_ttl_s: float = 180.0
    """How long an offering stays unavailable after insufficient capacity, a registration timeout, or a spot
    interruption."""
    gpu_init_unavailable_ttl_s: float = 1800.0
    """How long an (instance type, zone) stays unavailable after a node whose GPUs never appeared."""
    quota_backoff_s: float | None = None
    """First back-off of a pool after a quota error; doubles per consecutive error up to ``max_backoff_s``. None:
    the error's :class:`~gpuscale.errors.RetryPolicy` delay (60 s for ``QuotaExceeded``)."""
    max_backoff_s: float = 600.0
    retry_base_s: float | None = None
    """First retry delay of a launch or delete after a transient error (doubles per attempt). None: the error's
    :class:`~gpuscale.errors.RetryPolicy` delay (1 s for ``TransientProviderError``, 2 s for other provider
    errors)."""
    delete_recheck_s: float = 120.0
    """After the provider accepted a delete, look again this long later and repeat the delete if the node is still
    listed and not deleting (a lost request); once it shows as deleting, look again every ``max_backoff_s``."""
    replan_interval_s: float = 30.0
    """Re-plan unchanged pending pods at least this often."""
    max_replans: int = 6
    """Re-plans within one reconcile after capacity errors."""
    disruption_interval_s: float = 10.0
    consolidation_refresh_s: float = 300.0
    """Re-evaluate consolidation at least this often even when nothing changed (cron budget windows)."""
    consolidation_retry_s: float = 300.0
    """A node kept for a reason only a cluster change can lift (its pods fit nowhere cheaper, a budget, a PDB) is
    re-simulated after this long, or sooner when room appears, a disruption ends, offerings or its pods change."""
    consolidation: bool = True
    replace_nodes: bool = True
    """Consolidation may replace a node by a cheaper one (False: only delete nodes whose pods fit elsewhere)."""
    lost_grace_s: float = 30.0
    """A just-launched node missing from the provider's list is only considered lost after this long."""
    orphan_grace_s: float = 30.0
    """A node labelled with a request id the provider does not list is deleted after this long."""
    request_id_prefix: str = "gs"
    eviction_cost: WorkCostRule | None = None
    """Keep underutilised nodes whose eviction loses more work than it saves (``evictionCost``; None: off)."""
    headroom: Mapping[str, HeadroomSpec] = field(default_factory=dict)
    """Predictive warm headroom per pool (``headroom``; empty: off)."""
    evict_max_pod_age: PodAgeRule | None = None
    """Underutilized consolidations never evict a pod bound longer (``evictMaxPodAge``; None: off)."""
    repack: RepackRule | None = None
    """Nodes in flight take the young pods of underutilised nodes (``repack``; None: off)."""
    spot_to_spot: SpotSwapRule | None = None
    """A kept spot node may be replaced by a cheaper spot node (``spotToSpot``; None: off)."""
    pack_onto_empty: bool = True
    """Underutilized consolidations may move pods onto empty nodes (``packOntoEmpty``; False: never)."""
    cpu_pods_onto_empty: bool = True
    """A GPU node running only CPU-only pods may be emptied onto empty nodes (``cpuPodsOntoEmpty``; False: only onto
    nodes running pods, :mod:`gpuscale.core.disruption.cpuonly`)."""
    empty_wait: EmptyWaitSpec | None = None
    """Per-node empty wait from price and fitting arrivals (``emptyWait``; None: off)."""
    anticipate: AnticipateSpec | None = None
    """Scale-ups may buy room for the pods expected in the next minutes (``anticipate``; None: off)."""
    rightsize: RightsizeRule | None = None
    """A node whose pods are all young may be replaced by a cheaper node taking them (``rightsize``; None: off)."""

    def deadlines_for(self, pool: str) -> Deadlines:
        """The deadlines of ``pool``."""
        return self.pool_deadlines.get(pool, self.deadlines)

    def rules(self) -> Rules:
        """The settings of the pure claim decisions (:mod:`gpuscale.core.reconcile`)."""
        return Rules(
            deadlines=self.deadlines,
            pool_deadlines=self.pool_deadlines,
            unavailable_ttl_s=self.unavailable_ttl_s,
            gpu_init_unavailable_ttl_s=self.gpu_init_unavailable_ttl_s,
            lost_grace_s=self.lost_grace_s,
        )

    def launch_rules(self) -> LaunchRules:
        """The launcher's settings."""
        return LaunchRules(
            unavailable_ttl_s=self.unavailable_ttl_s,
            quota_backoff_s=self.quota_backoff_s,
            max_backoff_s=self.max_backoff_s,
            retry_base_s=self.retry_base_s,
        )

    @staticmethod
    def from_policy(policy: Mapping[str, Any] | None, where: str = "policy") -> ControllerConfig:
        """Build from a scenario's ``policy`` mapping (camelCase keys, durations as seconds or ``"5m"``).

        Durations (``quotaBackoff`` and ``retryBase`` may be ``null``, their default: the error's own retry
        policy decides): ``batchIdle``, ``batchMax``, ``unavailableTtl``, ``gpuInitUnavailableTtl``, ``quotaBackoff``,
        ``maxBackoff``, ``retryBase``, ``replanInterval``, ``disruptionInterval``, ``consolidationRefresh``,
        ``consolidationRetry``, ``lostGrace``, ``orphanGrace``, ``solverTimeLimit``. Others: ``maxReplans``,
        ``consolidation``, ``replaceNodes``, ``requestIdPrefix``, ``scorer``, ``exactSolver``, ``gangPacking``,
        ``deadlines`` (``launch``, ``registration``, ``gpuInit``) and ``poolDeadlines`` (pool name -> deadlines). The
        optional policies (off by default): ``evictionCost``, ``headroom``, ``emptyWait``
        (:mod:`~gpuscale.controller.policyopts`), ``anticipate`` (:mod:`~gpuscale.controller.anticipating`),
        ``evictMaxPodAge``, ``repack``, ``spotToSpot``, ``rightsize``
        (:mod:`~gpuscale.controller.repackopts`), ``packOntoEmpty`` and ``cpuPodsOntoEmpty``. ``name``,
        ``reconcileInterval`` and ``settle`` belong to the simulator and are ignored. Anything else raises
        :class:`~gpuscale.errors.InputError`.
        """
        policy = dict(policy or {})
        kw: dict[str, Any] = {}
        planner: dict[str, Any] = {}
        for key, value in policy.items():
            path = f"{where}.{key}"
            if key in _SIMULATOR_KEYS:
                continue
            if key in _POLICY_DELAY_KEYS and value is None:
                kw[_DURATION_KEYS[key]] = None  # the error's own RetryPolicy delay
            elif key in _DURATION_KEYS:
                kw[_DURATION_KEYS[key]] = _duration(value, path)
            elif key in _PLANNER_KEYS:
                name, read = _PLANNER_KEYS[key]
                planner[name] = read(value, path)
            elif key in _KEYS:
                name, read = _KEYS[key]
                kw[name] = read(value, path)
            else:
                known = [*sorted([*_DURATION_KEYS, *_BASIC_KEYS]), *_PLANNER_KEYS, *_OPTION_KEYS, *_SIMULATOR_KEYS]
                raise InputError("unknown policy setting", where=path, value=key, fix=f"use one of {', '.join(known)}")
        if planner:
            kw["planner"] = replace(PlannerConfig(), **planner)
        return ControllerConfig(**kw)


_DURATION_KEYS = {
    "batchIdle": "batch_idle_s",
    "batchMax": "batch_max_s",
    "unavailableTtl": "unavailable_ttl_s",
    "gpuInitUnavailableTtl": "gpu_init_unavailable_ttl_s",
    "quotaBackoff": "quota_backoff_s",
    "maxBackoff": "max_backoff_s",
    "retryBase": "retry_base_s",
    "deleteRecheck": "delete_recheck_s",
    "replanInterval": "replan_interval_s",
    "disruptionInterval": "disruption_interval_s",
    "consolidationRefresh": "consolidation_refresh_s",
    "consolidationRetry": "consolidation_retry_s",
    "lostGrace": "lost_grace_s",
    "orphanGrace": "orphan_grace_s",
}


_POLICY_DELAY_KEYS = frozenset({"quotaBackoff", "retryBase"})
"""Durations whose ``null`` (the default) means: the delay of the error's own RetryPolicy."""


def _duration(value: object, where: str) -> float:
    if isinstance(value, bool):
        raise InputError("must be a duration", where=where, value=value, fix=DURATION_HELP)
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise InputError("must be a non-negative number of seconds", where=where, value=value, fix=DURATION_HELP)
        return float(value)
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise InputError(f"not a duration ({exc})", where=where, value=value, fix=DURATION_HELP) from None


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError("must be a positive integer", where=where, value=value, fix="e.g. 6")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError("must be true or false", where=where, value=value, fix="write true or false")
    return value


def _gang_packing(value: object, where: str) -> float | None:
    """``gangPacking``: ``true`` (the default: 5 %), ``false`` (cheapest nodes only) or ``{maxExtraCost: F}``, the
    fraction of the cheapest price per member a gang may pay more to sit on fewer new nodes (0 to 1)."""
    fix = "write true, false or {maxExtraCost: 0.05} (a fraction from 0 to 1)"
    if isinstance(value, bool):
        return GANG_TOLERANCE if value else None
    if not isinstance(value, Mapping):
        raise InputError("must be true, false or a mapping", where=where, value=value, fix=fix)
    for k in value:
        if k != "maxExtraCost":
            raise InputError("unknown key", where=f"{where}.{k}", value=k, fix="the only key is maxExtraCost")
    raw = value.get("maxExtraCost", GANG_TOLERANCE)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or not 0 <= raw <= 1:
        raise InputError("must be a number from 0 to 1", where=f"{where}.maxExtraCost", value=raw, fix=fix)
    return float(raw)


def _deadlines(value: object, where: str) -> Deadlines:
    if not isinstance(value, Mapping):
        raise InputError("must be a mapping", where=where, value=value, fix="e.g. {launch: 5m, gpuInit: 10m}")
    names = {"launch": "launch_s", "registration": "registration_s", "gpuInit": "gpu_init_s"}
    kw: dict[str, float] = {}
    for k, v in value.items():
        if k not in names:
            raise InputError("unknown deadline", where=f"{where}.{k}", value=k, fix="use launch, registration, gpuInit")
        kw[names[k]] = _duration(v, f"{where}.{k}")
    return Deadlines(**kw)


def _request_id_prefix(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError("must be a non-empty string", where=where, value=value, fix='e.g. "gs"')
    return value


def _scorer(value: object, where: str) -> str:
    if value not in SCORERS:
        raise InputError("unknown scorer", where=where, value=value, fix=f"use one of {', '.join(SCORERS)}")
    return str(value)


def _pool_deadlines(value: object, where: str) -> dict[str, Deadlines]:
    if not isinstance(value, Mapping):
        raise InputError("must map pool names to deadlines", where=where, value=value)
    return {str(k): _deadlines(v, f"{where}.{k}") for k, v in value.items()}


Reader = tuple[str, Callable[[Any, str], Any]]
"""The field a policy key sets and the reader of its value (value, path -> field value or InputError)."""

_BASIC_KEYS: dict[str, Reader] = {
    "maxReplans": ("max_replans", _int),
    "consolidation": ("consolidation", _bool),
    "replaceNodes": ("replace_nodes", _bool),
    "requestIdPrefix": ("request_id_prefix", _request_id_prefix),
}
_PLANNER_KEYS: dict[str, Reader] = {
    "scorer": ("scorer", _scorer),
    "exactSolver": ("exact_solver", _bool),
    "gangPacking": ("gang_tolerance", _gang_packing),
    "solverTimeLimit": ("solver_time_limit_s", _duration),
}
"""Keys of :class:`~gpuscale.core.plan.PlannerConfig` fields."""
_OPTION_KEYS: dict[str, Reader] = {
    "deadlines": ("deadlines", _deadlines),
    "poolDeadlines": ("pool_deadlines", _pool_deadlines),
    "evictionCost": ("eviction_cost", policyopts.eviction_cost),
    "headroom": ("headroom", policyopts.headroom),
    "emptyWait": ("empty_wait", policyopts.empty_wait),
    "anticipate": ("anticipate", anticipate_setting),
    "evictMaxPodAge": ("evict_max_pod_age", repackopts.evict_max_pod_age),
    "repack": ("repack", repackopts.repack),
    "spotToSpot": ("spot_to_spot", repackopts.spot_to_spot),
    "rightsize": ("rightsize", repackopts.rightsize),
    "packOntoEmpty": ("pack_onto_empty", _bool),
    "cpuPodsOntoEmpty": ("cpu_pods_onto_empty", _bool),
}
_KEYS = {**_BASIC_KEYS, **_OPTION_KEYS}
"""Keys of :class:`ControllerConfig` fields other than durations."""
_SIMULATOR_KEYS = ("name", "settle", "reconcileInterval")
"""Keys of a scenario's policy that belong to the simulator (ignored here)."""
