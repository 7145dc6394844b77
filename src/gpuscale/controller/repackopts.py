"""Reading the optional consolidation settings ``evictMaxPodAge``, ``repack`` and ``spotToSpot`` (all off unless
given) from a scenario's ``policy`` mapping (see :meth:`gpuscale.controller.config.ControllerConfig.from_policy`,
:mod:`gpuscale.core.disruption.repack` and :mod:`gpuscale.core.disruption.spotswap`).

* ``evictMaxPodAge: 6h``: Underutilized consolidations never evict a pod bound longer (``null``/``false``: off).
* ``repack: {maxPodAge: 30m}`` (or ``true`` for 30 minutes; ``false``/``null``: off): nodes in flight take the young
  pods of underutilised nodes.
* ``spotToSpot: true`` (or ``{maxPodAge: 1h}``: only nodes whose pods are all that young; ``false``/``null``: off):
  a kept spot node may be replaced by a cheaper spot node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpuscale.core.disruption.repack import PodAgeRule, RepackRule
from gpuscale.core.disruption.spotswap import SpotSwapRule
from gpuscale.core.durations import DURATION_HELP
from gpuscale.errors import InputError
from gpuscale.manifests.quantity import parse_duration


def _positive_duration(value: object, where: str) -> float:
    if isinstance(value, bool):
        raise InputError("must be a duration", where=where, value=value, fix=DURATION_HELP)
    if isinstance(value, int | float):
        if value <= 0 or not math.isfinite(value):
            raise InputError("must be a positive number of seconds", where=where, value=value, fix=DURATION_HELP)
        return float(value)
    try:
        out = parse_duration(value)
    except ValueError as exc:
        raise InputError(f"not a duration ({exc})", where=where, value=value, fix=DURATION_HELP) from None
    if out <= 0:
        raise InputError("must be a positive duration", where=where, value=value, fix=DURATION_HELP)
    return out


def evict_max_pod_age(value: object, where: str) -> PodAgeRule | None:
    """``evictMaxPodAge``: None (off), or the rule."""
    if value is None or value is False:
        return None
    return PodAgeRule(_positive_duration(value, where))


def repack(value: object, where: str) -> RepackRule | None:
    """``repack``: None (off), or the rule."""
    if value is None or value is False:
        return None
    if value is True:
        return RepackRule()
    if not isinstance(value, Mapping):
        raise InputError("must be true, false or a mapping", where=where, value=value, fix="e.g. {maxPodAge: 30m}")
    unknown = [k for k in value if k != "maxPodAge"]
    if unknown:
        raise InputError("unknown repack setting", where=f"{where}.{unknown[0]}", value=unknown[0], fix="use maxPodAge")
    if "maxPodAge" not in value:
        return RepackRule()
    return RepackRule(_positive_duration(value["maxPodAge"], f"{where}.maxPodAge"))


def spot_to_spot(value: object, where: str) -> SpotSwapRule | None:
    """``spotToSpot``: None (off), or the rule."""
    if value is None or value is False:
        return None
    if value is True:
        return SpotSwapRule()
    if not isinstance(value, Mapping):
        raise InputError("must be true, false or a mapping", where=where, value=value, fix="e.g. {maxPodAge: 1h}")
    unknown = [k for k in value if k != "maxPodAge"]
    if unknown:
        raise InputError(
            "unknown spotToSpot setting", where=f"{where}.{unknown[0]}", value=unknown[0], fix="use maxPodAge"
        )
    if "maxPodAge" not in value:
        return SpotSwapRule()
    return SpotSwapRule(_positive_duration(value["maxPodAge"], f"{where}.maxPodAge"))
