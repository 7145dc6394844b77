"""Google Cloud (GCE / GKE) GPU machine types from ``prices/gcp_gpu_skypilot-catalog.csv``.

One region per catalog (default ``us-central1``); the file has one row per machine type, GPU and zone, with on-demand
and spot prices for the whole machine (VM plus GPUs). Each row becomes an on-demand and a spot offering in its zone
(a missing price gives no offering of that capacity type).

Accelerator-optimized families (``a2``, ``a3``, ``g2``) have their GPUs built in, so the instance type is the machine
type. N1 machines take GPUs attached at creation, and the file prices several attachments of one machine type; each
becomes its own instance type named ``<machine type>-<gpu>x<count>`` (``n1-standard-8-t4x2``). :func:`machine_spec`
turns an instance type back into the machine type and the GKE accelerator type and count a node pool needs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpuscale.catalogs._util import (
    Rows,
    gib_to_mib,
    gpu_instance_type,
    listed_regions,
    parse_positive_int,
    parse_price,
    prices_dir,
    read_csv,
    region_rows,
    sorted_catalog,
    zone_offerings,
)
from gpuscale.core.model import CapacityType, Catalog, InstanceType

PROVIDER = "gcp"
DEFAULT_REGION = "us-central1"
FILE_NAME = "gcp_gpu_skypilot-catalog.csv"
_COLUMNS = (
    "instance_type",
    "gpu_model",
    "gpu_count",
    "gpu_memory_gib",
    "vcpus",
    "memory_gib",
    "region",
    "zone",
    "price_on_demand_usd_per_hour",
    "price_spot_usd_per_hour",
)
_PRICES = (
    ("price_on_demand_usd_per_hour", CapacityType.ON_DEMAND),
    ("price_spot_usd_per_hour", CapacityType.SPOT),
)
ATTACHED_GPU_FAMILIES = ("n1",)
"""Machine families whose GPUs are attached (and named in the instance type) rather than built in."""

ACCELERATOR_TYPES = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "A100-40GB": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100-80GB": "nvidia-h100-80gb",
    "H100-MEGA-80GB": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
    "L4": "nvidia-l4",
}
"""The price file's GPU names -> GKE / Compute Engine accelerator types."""

_MEGA_MACHINES = {"a3-megagpu-8g": "H100-MEGA-80GB"}
"""Machine types whose accelerator type differs from what their GPU model alone says."""


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """What a GKE node pool needs to run an instance type: machine type and accelerator type and count."""

    machine_type: str
    accelerator_type: str
    accelerator_count: int


def instance_type_name(machine_type: str, gpu_model: str, gpu_count: int) -> str:
    """The catalog's name of a machine type with its GPUs: the machine type, or ``<machine>-<gpu>x<n>`` for N1."""
    if machine_type.split("-", 1)[0] in ATTACHED_GPU_FAMILIES:
        return f"{machine_type}-{gpu_model.lower()}x{gpu_count}"
    return machine_type


def _accelerator(machine_type: str, gpu_model: str) -> str | None:
    return ACCELERATOR_TYPES.get(_MEGA_MACHINES.get(machine_type, gpu_model))


def regions(data_dir: Path | None = None) -> list[str]:
    """The regions the GCP price file lists."""
    return listed_regions(FILE_NAME, _COLUMNS, "region", data_dir)


def machine_specs(data_dir: Path | None = None) -> dict[str, MachineSpec]:
    """Instance type name -> machine type and accelerator, for every row of the price file (all regions)."""
    out: dict[str, MachineSpec] = {}
    for _, row in read_csv(prices_dir(data_dir) / FILE_NAME, _COLUMNS):
        count = parse_positive_int(row["gpu_count"])
        accel = _accelerator(row["instance_type"], row["gpu_model"])
        if count is None or accel is None:
            continue
        name = instance_type_name(row["instance_type"], row["gpu_model"], count)
        out[name] = MachineSpec(row["instance_type"], accel, count)
    return out


def load(region: str | None = None, data_dir: Path | None = None) -> Catalog:
    """The GCP GPU catalog for one ``region`` (default ``us-central1``), with on-demand and spot offerings per zone."""
    path, region, rows = region_rows(PROVIDER, FILE_NAME, _COLUMNS, "region", region, DEFAULT_REGION, data_dir)
    by_type: dict[str, Rows] = defaultdict(list)
    warnings: list[str] = []
    for line, row in rows:
        if row["region"] != region:
            continue
        count = parse_positive_int(row["gpu_count"])
        if count is None:
            warnings.append(f"{PROVIDER}: skipped {row['instance_type']} ({path.name}:{line}): unknown gpu_count")
            continue
        by_type[instance_type_name(row["instance_type"], row["gpu_model"], count)].append((line, row))
    types: list[InstanceType] = []
    for name, group in sorted(by_type.items()):
        line, first = group[0]
        count = parse_positive_int(first["gpu_count"]) or 0
        vcpus = parse_positive_int(first["vcpus"])
        memory_gib = parse_price(first["memory_gib"])
        gpu_mem = parse_price(first["gpu_memory_gib"])
        if vcpus is None or memory_gib is None or _accelerator(first["instance_type"], first["gpu_model"]) is None:
            warnings.append(f"{PROVIDER}: skipped {name} ({path.name}:{line}): unknown vcpus, memory or GPU")
            continue
        offerings = zone_offerings(group, _PRICES, "zone", region)
        if not offerings:
            warnings.append(f"{PROVIDER}: skipped {name} ({path.name}:{line}): no price")
            continue
        types.append(
            gpu_instance_type(
                name,
                PROVIDER,
                region,
                vcpus=vcpus,
                memory_mib=gib_to_mib(memory_gib),
                gpu_count=count,
                gpu_model=first["gpu_model"],
                gpu_memory_gb=gpu_mem,
                family=first["instance_type"].split("-", 1)[0],
                offerings=offerings,
            )
        )
    return sorted_catalog(f"{PROVIDER}:{region}", types, warnings)
