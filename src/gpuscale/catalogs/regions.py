"""Checking a region against the regions a price file lists, with a short message when it is not one of them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from gpuscale.errors import InputError


def require_region(provider: str, region: str, available: Iterable[str], default: str) -> str:
    """``region`` if the price file lists it; else an :class:`InputError` suggesting close names (never the whole
    list, which runs to almost a hundred AWS regions and zones)."""
    regions = sorted(set(available))
    if region in regions:
        return region
    close = difflib.get_close_matches(region, regions, n=3, cutoff=0.6)
    if close:
        fix = f"did you mean {' or '.join(close)}?"
    elif len(regions) <= 10:
        fix = f"use one of: {', '.join(regions)}"
    else:
        fix = f"use one of its {len(regions)} regions, e.g. {default}; gpuscale catalog list --json names them"
    raise InputError(
        f"region not in the {provider} price data", where=f"catalog {provider}", value=region[:60], fix=fix
    )
