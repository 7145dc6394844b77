"""Linode (Akamai) GPU plans from ``prices/linode_gpu_plans_compiled.csv``.

Linode sells GPU plans per region at one price and has no spot market and no zones: every plan gets one on-demand
offering whose zone is the region (default ``us-ord``). The file does not say in which regions GPU plans exist, so
any well-formed region slug is accepted.
"""

from __future__ import annotations

from pathlib import Path

from gpuscale.catalogs._util import (
    check_region,
    gpu_instance_type,
    parse_positive_int,
    parse_price,
    prices_dir,
    read_csv,
    skipped_unknown,
    sorted_catalog,
)
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering

PROVIDER = "linode"
DEFAULT_REGION = "us-ord"
FILE_NAME = "linode_gpu_plans_compiled.csv"
_COLUMNS = ("instance_type", "gpu_model", "gpu_count", "gpu_memory_gb_per_gpu", "vcpus", "memory_mb", "hourly_usd")


def family_of(plan: str) -> str:
    """Instance family of a Linode plan id: its generation prefix, ``g2-gpu-rtx4000a1-s`` -> ``g2-gpu``."""
    parts = plan.split("-")
    return "-".join(parts[:2]) if len(parts) > 2 else plan


def regions(data_dir: Path | None = None) -> None:
    """None: the Linode price file does not say in which regions GPU plans exist (any region slug is accepted)."""
    return None


def load(region: str | None = None, data_dir: Path | None = None) -> Catalog:
    """The Linode GPU catalog for ``region`` (default ``us-ord``)."""
    region = check_region(PROVIDER, region or DEFAULT_REGION)
    path = prices_dir(data_dir) / FILE_NAME
    types: list[InstanceType] = []
    warnings: list[str] = []
    for line, row in read_csv(path, _COLUMNS):
        name = row["instance_type"]
        price = parse_price(row["hourly_usd"])
        vcpus = parse_positive_int(row["vcpus"])
        memory_mb = parse_positive_int(row["memory_mb"])
        gpus = parse_positive_int(row["gpu_count"])
        gpu_mem = parse_positive_int(row["gpu_memory_gb_per_gpu"])
        if price is None or vcpus is None or memory_mb is None or gpus is None or not row["gpu_model"]:
            fields = {"hourly_usd": price, "vcpus": vcpus, "memory_mb": memory_mb, "gpu_count": gpus}
            warnings.append(
                skipped_unknown(PROVIDER, name, path, line, {**fields, "gpu_model": row["gpu_model"] or None})
            )
            continue
        types.append(
            gpu_instance_type(
                name,
                PROVIDER,
                region,
                vcpus=vcpus,
                memory_mib=memory_mb,
                gpu_count=gpus,
                gpu_model=row["gpu_model"],
                gpu_memory_gb=gpu_mem,
                family=family_of(name),
                offerings=(Offering(zone=region, capacity_type=CapacityType.ON_DEMAND, hourly_price=price),),
            )
        )
    return sorted_catalog(f"{PROVIDER}:{region}", types, warnings)
