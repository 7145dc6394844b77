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
    Rows,
    gib_to_mib,
    gpu_instance_type,
    listed_regions,
    parse_positive_int,
    region_rows,
    skipped_unknown,
    sorted_catalog,
    zone_offerings,
)
from gpuscale.core.gpus import per_gpu_memory_gb
from gpuscale.core.model import CapacityType, Catalog, InstanceType

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
_PRICES = (("Price", CapacityType.ON_DEMAND), ("SpotPrice", CapacityType.SPOT))
_GPU_INFO_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*GB\s*$", re.IGNORECASE)


def _memory_gib(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def regions(data_dir: Path | None = None) -> list[str]:
    """The regions the Alibaba price file lists."""
    return listed_regions(FILE_NAME, _COLUMNS, "Region", data_dir)


def load(region: str | None = None, data_dir: Path | None = None) -> Catalog:
    """The Alibaba ECS GPU catalog for one ``region`` (default ``us-east-1``), with on-demand and spot offerings."""
    path, region, rows = region_rows(PROVIDER, FILE_NAME, _COLUMNS, "Region", region, DEFAULT_REGION, data_dir)
    by_type: dict[str, Rows] = defaultdict(list)
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
            warnings.append(
                skipped_unknown(
                    PROVIDER, name, path, line, {**fields, "AcceleratorName": first["AcceleratorName"] or None}
                )
            )
            continue
        offerings = zone_offerings(group, _PRICES, "AvailabilityZone", region)
        if not offerings:
            warnings.append(f"{PROVIDER}: skipped {name} ({path.name}:{line}): unknown Price and SpotPrice")
            continue
        mem = _GPU_INFO_MEMORY.search(first["GpuInfo"])
        gpu_mem_gb = per_gpu_memory_gb(float(mem.group(1)), count, first["AcceleratorName"]) if mem else None
        types.append(
            gpu_instance_type(
                name,
                PROVIDER,
                region,
                vcpus=vcpus,
                memory_mib=gib_to_mib(memory_gib),
                gpu_count=count,
                gpu_model=first["AcceleratorName"],
                gpu_memory_gb=gpu_mem_gb,
                family=first["Generation"] or name.split("-", 1)[0],
                offerings=offerings,
                arch=arch,
            )
        )
    return sorted_catalog(f"{PROVIDER}:{region}", types, warnings)
