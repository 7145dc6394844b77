"""What a provider can do, applied to what the planners may choose from.

:func:`fit_catalog` narrows a catalog to the offerings a provider can serve: no spot offerings on a provider without
spot, and only its zones when it lists them. The planners (pods' scale-up, consolidation's replacements, GPR
admission) take their options from the catalog, so a spot-less provider is never asked for a spot node and a
regional one never for another zone. When nothing is removed the same catalog object is returned, so the planners'
per-catalog memos still hold. The simulator (:mod:`gpuscale.sim.runner`, :mod:`gpuscale.sim.gpr`) fits the catalog
to its cloud; an embedding controller does the same with its provider.
"""

from __future__ import annotations

from dataclasses import replace

from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering
from gpuscale.providers.base import ProviderCapabilities


def serves(caps: ProviderCapabilities, offering: Offering) -> bool:
    """True if a provider with ``caps`` can launch ``offering``."""
    if offering.capacity_type is CapacityType.SPOT and not caps.spot:
        return False
    return not caps.zones or offering.zone in caps.zones


def fit_catalog(catalog: Catalog, caps: ProviderCapabilities) -> Catalog:
    """``catalog`` without the offerings a provider with ``caps`` cannot serve (instance types left with none are
    dropped); the same object when every offering is served."""
    if all(serves(caps, o) for it in catalog.instance_types for o in it.offerings):
        return catalog
    types: list[InstanceType] = []
    for it in catalog.instance_types:
        kept = tuple(o for o in it.offerings if serves(caps, o))
        if kept:
            types.append(replace(it, offerings=kept))
    dropped = len(catalog.instance_types) - len(types)
    note = f"{dropped} instance types the provider cannot serve were left out" if dropped else ""
    return replace(catalog, instance_types=tuple(types), warnings=(*catalog.warnings, *([note] if note else [])))
