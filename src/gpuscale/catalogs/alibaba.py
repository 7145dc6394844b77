"""Alibaba Cloud ECS GPU instance types from ``prices/alibaba_ecs_gpu_subset_skypilot-catalog-fork.csv``.

One region per catalog (default ``us-east-1``, the region with the most instance types in the file). The file has one
row per instance type and availability zone with an on-demand ``Price`` and a ``SpotPrice``; each row becomes an
on-demand and a spot offering in that zone (a missing or zero price gives no offering of that capacity type; a type
with no priced offering at all is skipped with a warning). All ECS ``gn*`` GPU families carry NVIDIA GPUs, so every
accelerator counts as ``nvidia.com/gpu``; undisclosed names ("H", "G49E") keep their name from the file.
``GpuInfo`` ("A100 80G 80GB") gives the per-GPU memory.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from gpuscale.catalogs._util import (
    check_region,
    gib_to_mib,
    parse_positive_int,
    parse_price,
    prices_dir,
    read_csv,
    sorted_catalog,
)
from gpuscale.catalogs.regions import require_region
from gpuscale.core.gpus import normalize_gpu_model, per_gpu_memory_gb
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering

PROVIDER = "alibaba"
DEFAULT_REGION = "us-east-1"
FILE_NAME = "alibaba_ecs_gpu_subset_skypilot-catalog-fork.csv"
_COLUMNS = (
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "GpuInfo",
    "Price",
    "SpotPrice",
    "Region",
    "AvailabilityZone",
    "Generation",
    "Arch",
)
_ARCH = {"X86": "amd64", "X86_64": "amd64", "AMD64": "amd64", "ARM": "arm64", "ARM64": "arm64"}
_GPU_INFO_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*GB\s*$", re.IGNORECASE)


def _memory_gib(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def regions(data_dir: Path | None = None) -> list[str]:
    """The regions the Alibaba price file lists."""
    return sorted({row["Region"] for _, row in read_csv(prices_dir(data_dir) / FILE_NAME, _COLUMNS)})


def load(region: str | None = None, data_dir: Path | None = None) -> Catalog:
    """The Alibaba ECS GPU catalog for one ``region`` (default ``us-east-1``), with on-demand and spot offerings."""
    path = prices_dir(data_dir) / FILE_NAME
    rows = read_csv(path, _COLUMNS)
    region = check_region(PROVIDER, region or DEFAULT_REGION)
    require_region(PROVIDER, region, (r["Region"] for _, r in rows), DEFAULT_REGION)
    by_type: dict[str, list[tuple[int, dict[str, str]]]] = defaultdict(list)
    for line, row in rows:
        if row["Region"] == region:
            by_type[row["InstanceType"]].append((line, row))
    types: list[InstanceType] = []
    warnings: list[str] = []
    for name, group in sorted(by_type.items()):
        line, first = group[0]
        count = parse_positive_int(first["AcceleratorCount"])
        vcpus = parse_positive_int(first["vCPUs"])
        memory_gib = _memory_gib(first["MemoryGiB"])
        arch = _ARCH.get(first["Arch"].upper())
        if count is None or vcpus is None or memory_gib is None or arch is None or not first["AcceleratorName"]:
            fields = {"AcceleratorCount": count, "vCPUs": vcpus, "MemoryGiB": memory_gib, "Arch": arch}
            unknown = [col for col, val in fields.items() if val is None]
            unknown += [] if first["AcceleratorName"] else ["AcceleratorName"]
            warnings.append(f"{PROVIDER}: skipped {name} ({path.name}:{line}): unknown {', '.join(unknown)}")
            continue
        offerings: list[Offering] = []
        for _, row in group:
            for col, cap in (("Price", CapacityType.ON_DEMAND), ("SpotPrice", CapacityType.SPOT)):
                price = parse_price(row[col])
                if price is not None:
                    offerings.append(
                        Offering(zone=row["AvailabilityZone"] or region, capacity_type=cap, hourly_price=price)
                    )
        if not offerings:
            warnings.append(f"{PROVIDER}: skipped {name} ({path.name}:{line}): unknown Price and SpotPrice")
            continue
        mem = _GPU_INFO_MEMORY.search(first["GpuInfo"])
        gpu_mem_gb = per_gpu_memory_gb(float(mem.group(1)), count, first["AcceleratorName"]) if mem else None
        family = first["Generation"] or name.split("-", 1)[0]
        types.append(
            InstanceType(
                name=name,
                provider=PROVIDER,
                vcpus=vcpus,
                memory_mib=gib_to_mib(memory_gib),
                gpu_count=count,
                gpu_model=normalize_gpu_model(first["AcceleratorName"], memory_gb=gpu_mem_gb),
                gpu_memory_mib=gib_to_mib(gpu_mem_gb) if gpu_mem_gb else 0,
                arch=arch,
                family=family,
                region=region,
                offerings=tuple(offerings),
            )
        )
    return sorted_catalog(f"{PROVIDER}:{region}", types, warnings)
