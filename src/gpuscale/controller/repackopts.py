"""Reading the optional consolidation settings ``evictMaxPodAge``, ``repack`` and ``spotToSpot`` (all off unless
given) from a scenario's ``policy`` mapping (see :meth:`gpuscale.controller.config.ControllerConfig.from_policy`,
:mod:`gpuscale.core.disruption.repack` and :mod:`gpuscale.core.disruption.spotswap`).

* ``evictMaxPodAge: 6h``: Underutilized consolidations never evict a pod bound longer (``null``/``false``: off).
* ``repack: {maxPodAge: 30m}`` (or ``true`` for 30 minutes; ``false``/``null``: off): nodes in flight take the young
  pods of underutilised nodes.
* ``spotToSpot: true`` (or ``{maxPodAge: 1h}``: only nodes whose pods are all that young; ``false``/``null``: off):
  a kept spot node may be replaced by a cheaper spot node.
* ``rightsize: {minPodAge: 5m, maxPodAge: 1h, minSaving: 0.2, horizon: 1h, coldStart: 200s, maxSet: 1}`` (every
  key optional; ``true``: all defaults; ``false``/``null``: off): a node whose pods are all young is replaced by the
  cheapest node of its pool and capacity type that takes them (:mod:`gpuscale.core.disruption.rightsize`); with
  ``maxSet`` 2-8, sets of up to that many such nodes are also replaced together by fewer or cheaper nodes
  (:mod:`gpuscale.core.disruption.rightsize_multi`); with ``keepOne: true`` a set whose cheapest new node is of the
  type of one of its own nodes keeps that node and moves the others' pods onto it instead.
"""

from __future__ import annotations

from typing import Any

from gpuscale.controller.settingsread import known_keys, positive_duration, switched_rule
from gpuscale.core.disruption.repack import PodAgeRule, RepackRule
from gpuscale.core.disruption.rightsize import RightsizeRule
from gpuscale.core.disruption.spotswap import SpotSwapRule
from gpuscale.errors import InputError


def evict_max_pod_age(value: object, where: str) -> PodAgeRule | None:
    """``evictMaxPodAge``: None (off), or the rule."""
    if value is None or value is False:
        return None
    return PodAgeRule(positive_duration(value, where))


def repack(value: object, where: str) -> RepackRule | None:
    """``repack``: None (off), or the rule."""
    return switched_rule(
        value,
        where,
        name="repack",
        key="maxPodAge",
        example="e.g. {maxPodAge: 30m}",
        default=RepackRule,
        make=RepackRule,
    )


def spot_to_spot(value: object, where: str) -> SpotSwapRule | None:
    """``spotToSpot``: None (off), or the rule."""
    return switched_rule(
        value,
        where,
        name="spotToSpot",
        key="maxPodAge",
        example="e.g. {maxPodAge: 1h}",
        default=SpotSwapRule,
        make=SpotSwapRule,
    )


RIGHTSIZE_KEYS = ("minPodAge", "maxPodAge", "minSaving", "horizon", "coldStart", "maxSet", "keepOne")
MAX_SET = 8
"""The largest ``rightsize.maxSet`` accepted (the set search grows sets node by node)."""


def rightsize(value: object, where: str) -> RightsizeRule | None:
    """``rightsize``: None (off), or the rule (``true``: all defaults)."""
    if value is None or value is False:
        return None
    if value is True:
        return RightsizeRule()
    value = known_keys(
        value,
        where,
        name="rightsize",
        keys=RIGHTSIZE_KEYS,
        expected="must be true, false or a mapping",
        example="e.g. {maxPodAge: 1h, minSaving: 0.2}",
    )
    kw: dict[str, Any] = {}
    for key, attr in (
        ("minPodAge", "min_pod_age_s"),
        ("maxPodAge", "max_pod_age_s"),
        ("horizon", "horizon_s"),
        ("coldStart", "cold_start_s"),
    ):
        if key in value:
            kw[attr] = positive_duration(value[key], f"{where}.{key}")
    if "minSaving" in value:
        v = value["minSaving"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
            raise InputError("must be a number from 0 to below 1", where=f"{where}.minSaving", value=v, fix="e.g. 0.2")
        kw["min_saving"] = float(v)
    if "maxSet" in value:
        v = value["maxSet"]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_SET:
            raise InputError(
                f"must be an integer from 1 to {MAX_SET}", where=f"{where}.maxSet", value=v, fix="e.g. 4 (1: one node)"
            )
        kw["max_set"] = v
    if "keepOne" in value:
        v = value["keepOne"]
        if not isinstance(v, bool):
            raise InputError("must be true or false", where=f"{where}.keepOne", value=v, fix="write true or false")
        kw["keep_one"] = v
    rule = RightsizeRule(**kw)
    if rule.min_pod_age_s > rule.max_pod_age_s:
        lo, hi = f"{rule.min_pod_age_s:g}s", f"{rule.max_pod_age_s:g}s"
        raise InputError(
            f"minPodAge ({lo}{'' if 'minPodAge' in value else ', the default'}) must be at most maxPodAge ({hi})",
            where=f"{where}.minPodAge",
            fix=f"set minPodAge to at most {hi} or maxPodAge to at least {lo}",
        )
    return rule
