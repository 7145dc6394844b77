"""Shared helpers of the catalog loaders: reading CSV files, parsing numbers, sorting (the price files are found by
:func:`gpuscale.resources.prices_dir`)."""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from gpuscale.core.model import Catalog, InstanceType
from gpuscale.errors import InputError
from gpuscale.resources import DATA_DIR_ENV as DATA_DIR_ENV  # re-exported for the loaders
from gpuscale.resources import prices_dir as prices_dir

MIB_PER_GIB = 1024

_REGION = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def read_csv(path: Path, required: Iterable[str]) -> list[tuple[int, dict[str, str]]]:
    """Rows of a CSV file with a header, each with its 1-based line number. Checks the required columns exist."""
    if not path.is_file():
        raise InputError("catalog data file not found", where=str(path), fix=f"check {DATA_DIR_ENV}")
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = sorted(set(required) - set(reader.fieldnames or ()))
        if missing:
            raise InputError(
                "catalog data file lacks columns",
                where=f"{path}:1",
                value=missing,
                fix="use the unmodified file from the shared data directory",
            )
        return [(reader.line_num, {k: (v or "").strip() for k, v in row.items() if k}) for row in reader]


def parse_price(text: str) -> float | None:
    """A $/h price, or None when it is empty, not a number, not finite, or not positive (an unknown price)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def parse_positive_int(text: str) -> int | None:
    """A positive integer (``"8"`` or ``"8.0"``), or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value > 0 and value == int(value) else None


def gib_to_mib(gib: float) -> int:
    """GiB (or GB as cloud listings use it) to whole MiB."""
    return round(gib * MIB_PER_GIB)


def check_region(provider: str, region: str, available: Iterable[str] | None = None) -> str:
    """Validate a region name; with ``available``, it must be one of them."""
    if not _REGION.match(region):
        raise InputError(
            f"invalid {provider} region name",
            where=f"catalog {provider}",
            value=region,
            fix=f"use a region slug such as {provider}:us-east-1 (lower-case letters, digits and '-')",
        )
    if available is not None:
        rows = Counter(available)
        if region not in rows:
            raise InputError(
                f"region not in the {provider} price data",
                where=f"catalog {provider}",
                value=region,
                fix=_region_choices(region, rows),
            )
    return region


def _region_choices(region: str, rows: Counter[str]) -> str:
    """All regions if they fit a short line; else the closest names and the regions with the most rows first."""
    regions = sorted(rows)
    if len(", ".join(regions)) <= 160:
        return f"use one of: {', '.join(regions)}"
    close = difflib.get_close_matches(region, regions, n=3, cutoff=0.6)
    common = [r for r, _ in sorted(rows.items(), key=lambda kv: (-kv[1], kv[0])) if r not in close]
    shown = (close + common)[:8]
    return f"use one of the {len(regions)} regions, e.g. {', '.join(shown)}"


def sorted_catalog(name: str, types: Iterable[InstanceType], warnings: Iterable[str]) -> Catalog:
    """A catalog with instance types sorted by (provider, region, name) and offerings by (zone, capacity type)."""
    out = [
        replace(it, offerings=tuple(sorted(it.offerings, key=lambda o: (o.zone, str(o.capacity_type))))) for it in types
    ]
    out.sort(key=lambda it: (it.provider, it.region, it.name))
    return Catalog(name=name, instance_types=tuple(out), warnings=tuple(warnings))
