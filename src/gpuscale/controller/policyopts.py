"""Reading the optional policy settings ``evictionCost`` and ``headroom`` (both off unless given) from a scenario's
``policy`` mapping (see :meth:`gpuscale.controller.config.ControllerConfig.from_policy`).

* ``evictionCost: {horizon: 1h}`` (or ``true`` for a 1 h horizon; ``false``/``null``: off):
  :mod:`gpuscale.core.disruption.workcost`.
* ``headroom: {POOL: {policy: Predictive, maxNodes: 2, maxHourlyCost: 3.5, ...}}``: :mod:`gpuscale.core.headroom`;
  optional ``lead``, ``quantile``, ``days``, ``minDays``, ``recentWindows``, ``instanceType``,
  ``waitCostPerGpuHour``, ``coldStart``, ``launch`` (false: only keep empty nodes warm).
* ``emptyWait: {maxWait: 30m, window: 1h, coldStart: 200s, waitCostPerGpuHour: 1, days: 0, margin: 1,
  shareArrivals: true, learn: false, learnReleased: false}`` (every key optional; ``true``: all defaults;
  ``false``/``null``: off): :mod:`gpuscale.core.emptywait`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuscale.controller.settingsread import known_keys, positive_duration, switched_rule
from gpuscale.core.disruption.workcost import WorkCostRule
from gpuscale.core.emptywait import EmptyWaitSpec
from gpuscale.core.headroom import HEADROOM_KEYS, HEADROOM_REQUIRED, PREDICTIVE, HeadroomSpec
from gpuscale.errors import InputError


def _number(value: object, where: str, *, lo: float = 0.0, hi: float = 1e9, fix: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InputError(f"must be a number from {lo:g} to {hi:g}", where=where, value=value, fix=fix)
    return float(value)


def _count(value: object, where: str, *, lo: int = 0, hi: int = 10_000) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"must be an integer from {lo} to {hi}", where=where, value=value, fix=f"e.g. {max(lo, 2)}")
    return value


def eviction_cost(value: object, where: str) -> WorkCostRule | None:
    """``evictionCost``: None (off), or the rule."""
    return switched_rule(
        value,
        where,
        name="evictionCost",
        key="horizon",
        example="e.g. {horizon: 1h}",
        default=WorkCostRule,
        make=lambda s: WorkCostRule(horizon_s=s),
    )


def headroom_spec(value: object, where: str) -> HeadroomSpec:
    """One pool's ``headroom`` mapping."""
    value = known_keys(
        value,
        where,
        name="headroom",
        keys=HEADROOM_KEYS,
        expected="must be a mapping",
        example="e.g. {policy: Predictive, maxNodes: 2, maxHourlyCost: 5}",
    )
    policy = value.get("policy", PREDICTIVE)
    if policy != PREDICTIVE:
        raise InputError("unknown headroom policy", where=f"{where}.policy", value=policy, fix=f"use {PREDICTIVE}")
    for k in HEADROOM_REQUIRED:
        if k not in value:
            raise InputError(
                f"{k} is required", where=where, fix="bound the headroom: e.g. maxNodes: 2, maxHourlyCost: 5"
            )
    kw: dict[str, Any] = {
        "max_nodes": _count(value["maxNodes"], f"{where}.maxNodes", lo=1, hi=1000),
        "max_hourly_cost": _number(value["maxHourlyCost"], f"{where}.maxHourlyCost", fix="$/h, e.g. 5"),
    }
    if "lead" in value:
        kw["lead_s"] = positive_duration(value["lead"], f"{where}.lead")
    if "quantile" in value:
        kw["quantile"] = _number(value["quantile"], f"{where}.quantile", hi=1.0, fix="e.g. 0.5")
    if "days" in value:
        kw["days"] = _count(value["days"], f"{where}.days", hi=366)
    if "minDays" in value:
        kw["min_days"] = _count(value["minDays"], f"{where}.minDays", lo=1, hi=366)
    if "recentWindows" in value:
        kw["recent_windows"] = _count(value["recentWindows"], f"{where}.recentWindows", hi=10_000)
    if "instanceType" in value:
        it = value["instanceType"]
        if not isinstance(it, str) or not it:
            raise InputError("must be an instance type name", where=f"{where}.instanceType", value=it)
        kw["instance_type"] = it
    if "waitCostPerGpuHour" in value:
        kw["wait_cost_per_gpu_hour"] = _number(value["waitCostPerGpuHour"], f"{where}.waitCostPerGpuHour", fix="e.g. 4")
    if "launch" in value:
        if not isinstance(value["launch"], bool):
            raise InputError(
                "must be true or false", where=f"{where}.launch", value=value["launch"], fix="write true or false"
            )
        kw["launch"] = value["launch"]
    if "coldStart" in value:
        kw["cold_start_s"] = positive_duration(value["coldStart"], f"{where}.coldStart")
    return HeadroomSpec(**kw)


def headroom(value: object, where: str) -> dict[str, HeadroomSpec]:
    """``headroom``: pool name -> its spec."""
    if not isinstance(value, Mapping):
        raise InputError("must map pool names to headroom settings", where=where, value=value, fix="e.g. {gpu: {...}}")
    return {str(pool): headroom_spec(spec, f"{where}.{pool}") for pool, spec in value.items()}


EMPTY_WAIT_KEYS = (
    "maxWait",
    "window",
    "coldStart",
    "waitCostPerGpuHour",
    "days",
    "margin",
    "shareArrivals",
    "learn",
    "learnReleased",
)


def empty_wait(value: object, where: str) -> EmptyWaitSpec | None:
    """``emptyWait``: None (off), or the per-node empty wait rule."""
    if value is None or value is False:
        return None
    if value is True:
        return EmptyWaitSpec()
    value = known_keys(
        value,
        where,
        name="emptyWait",
        keys=EMPTY_WAIT_KEYS,
        expected="must be true, false or a mapping",
        example="e.g. {maxWait: 30m, waitCostPerGpuHour: 1}",
    )
    kw: dict[str, Any] = {}
    if "maxWait" in value:
        kw["max_wait_s"] = positive_duration(value["maxWait"], f"{where}.maxWait")
    if "window" in value:
        kw["window_s"] = positive_duration(value["window"], f"{where}.window")
    if "coldStart" in value:
        kw["cold_start_s"] = positive_duration(value["coldStart"], f"{where}.coldStart")
    if "waitCostPerGpuHour" in value:
        kw["wait_cost_per_gpu_hour"] = _number(value["waitCostPerGpuHour"], f"{where}.waitCostPerGpuHour", fix="e.g. 1")
    if "days" in value:
        kw["days"] = _count(value["days"], f"{where}.days", hi=366)
    if "margin" in value:
        kw["margin"] = _number(value["margin"], f"{where}.margin", lo=0.01, hi=1000.0, fix="e.g. 1")
    for key, attr in (("shareArrivals", "share_arrivals"), ("learn", "learn"), ("learnReleased", "learn_released")):
        if key in value:
            if not isinstance(value[key], bool):
                raise InputError(
                    "must be true or false", where=f"{where}.{key}", value=value[key], fix="write true or false"
                )
            kw[attr] = value[key]
    return EmptyWaitSpec(**kw)
