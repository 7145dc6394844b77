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

from gpuscale.controller.settingsread import positive_duration, switched_rule
from gpuscale.core.disruption.repack import PodAgeRule, RepackRule
from gpuscale.core.disruption.spotswap import SpotSwapRule


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
