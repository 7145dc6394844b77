"""Shared helpers of the catalog loaders: locating the data, reading CSV files, parsing numbers, sorting."""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from gpuscale.core.model import Catalog, InstanceType
from gpuscale.errors import InputError

DATA_DIR_ENV = "GPUSCALE_DATA_DIR"
"""Environment variable naming the shared data directory (the one holding ``prices/``)."""

MIB_PER_GIB = 1024

_REPO_ROOT = Path(__file__).resolve().parents[3]
_DEFAULT_DATA_DIR = _REPO_ROOT / ".." / "shared" / "data"
_REGION = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def prices_dir(data_dir: Path | None = None) -> Path:
    """The directory of the price CSV files: ``data_dir``, else ``$GPUSCALE_DATA_DIR``, else ``../shared/data``
    next to the repository; each with ``prices/`` appended. Raises :class:`InputError` if it does not exist."""
    source = "argument"
    if data_dir is None:
        env = os.environ.get(DATA_DIR_ENV)
        data_dir, source = (Path(env), DATA_DIR_ENV) if env else (_DEFAULT_DATA_DIR, "default location")
    path = (data_dir / "prices").resolve()
    if not path.is_dir():
        raise InputError(
            "catalog price data not found",
            where=str(path),
            value=str(data_dir),
            fix=f"the data directory ({source}) must contain prices/; set {DATA_DIR_ENV} to the shared data "
            "directory, or use a custom YAML catalog (--catalog my-catalog.yaml)",
        )
    return path


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
        regions = sorted(set(available))
        if region not in regions:
            raise InputError(
                f"region not in the {provider} price data",
                where=f"catalog {provider}",
                value=region,
                fix=f"use one of: {', '.join(regions)}",
            )
    return region


def sorted_catalog(name: str, types: Iterable[InstanceType], warnings: Iterable[str]) -> Catalog:
    """A catalog with instance types sorted by (provider, region, name) and offerings by (zone, capacity type)."""
    out = [
        replace(it, offerings=tuple(sorted(it.offerings, key=lambda o: (o.zone, str(o.capacity_type))))) for it in types
    ]
    out.sort(key=lambda it: (it.provider, it.region, it.name))
    return Catalog(name=name, instance_types=tuple(out), warnings=tuple(warnings))
