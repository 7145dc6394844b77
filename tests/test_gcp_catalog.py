"""The GCP catalog: machine x zone rows become instance types with on-demand and spot offerings per zone."""

from __future__ import annotations

import pytest

from gpuscale.catalogs import KNOWN_CATALOGS, catalog_info, gcp, load_catalog
from gpuscale.core.model import CapacityType
from gpuscale.errors import InputError


def test_gcp_is_a_shipped_catalog_with_two_regions() -> None:
    assert "gcp" in KNOWN_CATALOGS
    info = catalog_info("gcp")
    assert info.default_region == "us-central1"
    assert info.regions == ("europe-west4", "us-central1")
    assert info.instance_types == len(load_catalog("gcp").instance_types)


def test_built_in_and_attached_gpus() -> None:
    cat = load_catalog("gcp:us-central1")
    by_name = {t.name: t for t in cat.instance_types}
    a3 = by_name["a3-highgpu-8g"]
    assert (a3.gpu_count, a3.gpu_model, a3.vcpus, a3.gpu_memory_mib) == (8, "H100", 208, 80 * 1024)
    t4 = by_name["n1-standard-8-t4x2"]
    assert (t4.gpu_count, t4.gpu_model, t4.vcpus, t4.family) == (2, "T4", 8, "n1")
    zones = {o.zone for o in t4.offerings}
    assert zones <= {"us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"} and len(zones) >= 2
    caps = {(o.zone, o.capacity_type) for o in t4.offerings}
    assert all((z, CapacityType.SPOT) in caps and (z, CapacityType.ON_DEMAND) in caps for z in zones)
    spot = min(o.hourly_price for o in t4.offerings if o.capacity_type is CapacityType.SPOT)
    on_demand = min(o.hourly_price for o in t4.offerings if o.capacity_type is CapacityType.ON_DEMAND)
    assert 0 < spot < on_demand


def test_machine_spec_gives_the_node_pool_accelerator() -> None:
    specs = gcp.machine_specs()
    assert specs["n1-standard-8-t4x2"] == gcp.MachineSpec("n1-standard-8", "nvidia-tesla-t4", 2)
    assert specs["a3-megagpu-8g"] == gcp.MachineSpec("a3-megagpu-8g", "nvidia-h100-mega-80gb", 8)
    assert specs["g2-standard-24"] == gcp.MachineSpec("g2-standard-24", "nvidia-l4", 2)
    assert specs["a2-ultragpu-1g"].accelerator_type == "nvidia-a100-80gb"
    assert set(specs) >= {t.name for t in load_catalog("gcp:europe-west4").instance_types}


def test_unknown_region_is_an_input_error() -> None:
    with pytest.raises(InputError, match="region not in the gcp price data"):
        load_catalog("gcp:us-east9")
