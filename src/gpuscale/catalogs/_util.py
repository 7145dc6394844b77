"""Shared helpers of the catalog loaders: reading CSV files and a region's rows, parsing numbers, building offerings,
instance types and skip warnings, sorting (the price files are found by :func:`gpuscale.resources.prices_dir`)."""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from gpuscale.catalogs.regions import require_region
from gpuscale.core.gpus import normalize_gpu_model
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering
from gpuscale.errors import InputError
from gpuscale.resources import DATA_DIR_ENV as DATA_DIR_ENV  # re-exported for the loaders
from gpuscale.resources import prices_dir as prices_dir

MIB_PER_GIB = 1024

_REGION = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

Rows = list[tuple[int, dict[str, str]]]
"""A CSV file's rows, each with its 1-based line number."""


def read_csv(path: Path, required: Iterable[str]) -> Rows:
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


def listed_regions(file_name: str, columns: Iterable[str], region_column: str, data_dir: Path | None) -> list[str]:
    """The regions a price file lists (in its column ``region_column``), sorted."""
    return sorted({row[region_column] for _, row in read_csv(prices_dir(data_dir) / file_name, columns)})


def region_rows(
    provider: str,
    file_name: str,
    columns: Iterable[str],
    region_column: str,
    region: str | None,
    default: str,
    data_dir: Path | None,
) -> tuple[Path, str, Rows]:
    """The price file's path, the region asked for (``default`` when None; checked: well formed and listed by the
    file) and all the file's rows."""
    path = prices_dir(data_dir) / file_name
    rows = read_csv(path, columns)
    region = check_region(provider, region or default)
    require_region(provider, region, (r[region_column] for _, r in rows), default)
    return path, region, rows


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


def zone_offerings(
    rows: Iterable[tuple[int, dict[str, str]]],
    prices: Iterable[tuple[str, CapacityType]],
    zone_column: str,
    region: str,
) -> list[Offering]:
    """One offering per row and priced capacity type (``prices``: price column, capacity type; a row with no usable
    price in a column has no offering of that type), in the row's zone, else the region."""
    prices = tuple(prices)
    out: list[Offering] = []
    for _, row in rows:
        for col, cap in prices:
            price = parse_price(row[col])
            if price is not None:
                out.append(Offering(zone=row[zone_column] or region, capacity_type=cap, hourly_price=price))
    return out


def gpu_instance_type(
    name: str,
    provider: str,
    region: str,
    *,
    vcpus: int,
    memory_mib: int,
    gpu_count: int,
    gpu_model: str,
    gpu_memory_gb: float | None,
    family: str,
    offerings: Iterable[Offering],
    arch: str = "amd64",
) -> InstanceType:
    """An instance type from a price file's row: the GPU model as listed (normalized, with its per-GPU memory in GB
    where known, else 0 MiB)."""
    return InstanceType(
        name=name,
        provider=provider,
        vcpus=vcpus,
        memory_mib=memory_mib,
        gpu_count=gpu_count,
        gpu_model=normalize_gpu_model(gpu_model, memory_gb=gpu_memory_gb),
        gpu_memory_mib=gib_to_mib(gpu_memory_gb) if gpu_memory_gb else 0,
        arch=arch,
        family=family,
        region=region,
        offerings=tuple(offerings),
    )


def skipped_unknown(provider: str, name: str, path: Path, line: int, fields: Mapping[str, object]) -> str:
    """The warning for a row skipped for the fields whose value is None (unparsable or missing)."""
    unknown = ", ".join(col for col, val in fields.items() if val is None)
    return f"{provider}: skipped {name} ({path.name}:{line}): unknown {unknown}"
