"""AWS EC2 GPU instance types from ``prices/aws_gpu_instances_vantage_2026-01-21.csv``.

One region per catalog (default ``us-east-1``); the file has one row per instance type and region. Quirks handled:

* Availability zones are not in the data, so each instance type gets one on-demand offering whose zone is the region
  name (``us-east-1``). Local Zones and Wavelength Zones appear as their own "regions" (``us-east-1-atl-1``) and are
  loaded the same way. There are no spot prices, so no spot offerings.
* ``gpu_memory`` is per GPU for most types and the total for some (``p4d.24xlarge``: "320 GB" for 8 A100s); see
  :func:`gpuscale.core.gpus.per_gpu_memory_gb`. "Unknown" is filled from the product's only memory size when it
  has exactly one (K520, M60, L4), else left 0 (unknown).
* Only NVIDIA GPUs become ``gpu_count``. Instance types with other accelerators (AWS Inferentia/Trainium, Qualcomm,
  AMD Radeon, ARM Mali) and fractional-GPU types (``g6f``: 1/8 of an L40) are excluded with a warning.
* ``memory`` is a string such as "192 GB" or "1152 GiB" (both read as GiB). Graviton types (``g5g``) are ``arm64``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from gpuscale.catalogs._util import (
    gib_to_mib,
    gpu_instance_type,
    listed_regions,
    parse_positive_int,
    parse_price,
    region_rows,
    skipped_unknown,
    sorted_catalog,
)
from gpuscale.core.gpus import known_memory_gb, normalize_gpu_model, per_gpu_memory_gb
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering

PROVIDER = "aws"
DEFAULT_REGION = "us-east-1"
FILE_NAME = "aws_gpu_instances_vantage_2026-01-21.csv"
_COLUMNS = ("instance_type", "gpu_model", "gpu_count", "gpu_memory", "vcpus", "memory", "region", "on_demand_usd_hr")
_GIB = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:GB|GiB)\b", re.IGNORECASE)
_GRAVITON = re.compile(r"^[a-z]+\d+[a-z]*g[a-z]*$")
"""Family names whose attribute letters (after the generation digit) contain ``g``: Graviton (arm64)."""


def family_of(instance_type: str) -> str:
    """Instance family: the part before the dot (``g4dn.xlarge`` -> ``g4dn``, ``p6-b200.48xlarge`` -> ``p6-b200``)."""
    return instance_type.split(".", 1)[0]


def arch_of(instance_type: str) -> str:
    """``arm64`` for Graviton families (``g5g``), else ``amd64``."""
    return "arm64" if _GRAVITON.match(family_of(instance_type)) else "amd64"


def _gib(text: str) -> float | None:
    m = _GIB.match(text)
    return float(m.group(1)) if m else None


def regions(data_dir: Path | None = None) -> list[str]:
    """The regions (and Local/Wavelength Zones) the AWS price file lists."""
    return listed_regions(FILE_NAME, _COLUMNS, "region", data_dir)


def load(region: str | None = None, data_dir: Path | None = None) -> Catalog:
    """The AWS GPU catalog for one ``region`` (default ``us-east-1``)."""
    path, region, rows = region_rows(PROVIDER, FILE_NAME, _COLUMNS, "region", region, DEFAULT_REGION, data_dir)
    types: list[InstanceType] = []
    warnings: list[str] = []
    excluded: dict[str, list[str]] = defaultdict(list)
    for line, row in rows:
        if row["region"] != region:
            continue
        name, raw_model = row["instance_type"], row["gpu_model"]
        if not raw_model.upper().startswith("NVIDIA"):
            excluded[raw_model or "unknown accelerator"].append(name)
            continue
        count = parse_positive_int(row["gpu_count"])
        if count is None:
            warnings.append(
                f"{PROVIDER}: skipped {name}: fractional or unknown GPU count {row['gpu_count']!r} of {raw_model} "
                "(GPU partitions are not modelled)"
            )
            continue
        price = parse_price(row["on_demand_usd_hr"])
        vcpus = parse_positive_int(row["vcpus"])
        memory_gib = _gib(row["memory"])
        if price is None or vcpus is None or memory_gib is None:
            fields = {"on_demand_usd_hr": price, "vcpus": vcpus, "memory": memory_gib}
            warnings.append(skipped_unknown(PROVIDER, name, path, line, fields))
            continue
        listed = _gib(row["gpu_memory"])
        if listed is not None:
            gpu_mem_gb: float | None = per_gpu_memory_gb(listed, count, raw_model)
        else:
            sizes = known_memory_gb(normalize_gpu_model(raw_model))
            gpu_mem_gb = float(sizes[0]) if len(sizes) == 1 else None
        types.append(
            gpu_instance_type(
                name,
                PROVIDER,
                region,
                vcpus=vcpus,
                memory_mib=gib_to_mib(memory_gib),
                gpu_count=count,
                gpu_model=raw_model,
                gpu_memory_gb=gpu_mem_gb,
                family=family_of(name),
                offerings=(Offering(zone=region, capacity_type=CapacityType.ON_DEMAND, hourly_price=price),),
                arch=arch_of(name),
            )
        )
    for accel, names in sorted(excluded.items()):
        warnings.append(
            f"{PROVIDER}: excluded {len(names)} instance type(s) with non-NVIDIA accelerator {accel!r} "
            f"({', '.join(sorted(names))}): they cannot serve nvidia.com/gpu"
        )
    return sorted_catalog(f"{PROVIDER}:{region}", types, warnings)
