"""Provider capabilities shape the options: a catalog fitted to a provider has no spot offerings when it has no spot
and only its zones when it lists them; the simulated cloud's own capabilities leave its catalog untouched."""

from __future__ import annotations

from gpuscale.catalogs import load_catalog
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering
from gpuscale.providers.base import ProviderCapabilities
from gpuscale.providers.capabilities import fit_catalog, serves
from gpuscale.sim.cloud import CloudBehaviour, SimCloud
from gpuscale.sim.engine import Engine

OD, SPOT = CapacityType.ON_DEMAND, CapacityType.SPOT
CATALOG = Catalog(
    "test",
    (
        InstanceType("g1", "x", 8, 32768, 1, "T4", 16384, offerings=(Offering("a", OD, 1.0), Offering("a", SPOT, 0.3))),
        InstanceType("g2", "x", 8, 32768, 1, "T4", 16384, offerings=(Offering("b", SPOT, 0.2),)),
        InstanceType("g3", "x", 8, 32768, 1, "T4", 16384, offerings=(Offering("b", OD, 0.9),)),
    ),
)


def offerings(c: Catalog) -> set[tuple[str, str, CapacityType]]:
    return {(it.name, o.zone, o.capacity_type) for it in c.instance_types for o in it.offerings}


def test_a_provider_without_spot_is_never_offered_spot() -> None:
    fitted = fit_catalog(CATALOG, ProviderCapabilities(spot=False))
    assert offerings(fitted) == {("g1", "a", OD), ("g3", "b", OD)}
    assert [it.name for it in fitted.instance_types] == ["g1", "g3"]
    assert any("cannot serve" in w for w in fitted.warnings)


def test_a_regional_provider_keeps_its_zones() -> None:
    fitted = fit_catalog(CATALOG, ProviderCapabilities(spot=True, zones=("b",)))
    assert offerings(fitted) == {("g2", "b", SPOT), ("g3", "b", OD)}
    assert not serves(ProviderCapabilities(spot=True, zones=("b",)), Offering("a", OD, 1.0))


def test_nothing_to_remove_keeps_the_same_catalog() -> None:
    assert fit_catalog(CATALOG, ProviderCapabilities(spot=True)) is CATALOG
    assert fit_catalog(CATALOG, ProviderCapabilities(spot=True, zones=("a", "b"))) is CATALOG


def test_the_simulated_cloud_serves_its_whole_catalog() -> None:
    catalog = load_catalog("alibaba")
    cloud = SimCloud(Engine(start=0.0), catalog, CloudBehaviour(), seed=1)
    assert fit_catalog(catalog, cloud.capabilities) is catalog


def test_linode_capabilities_leave_on_demand_offerings_of_its_region() -> None:
    catalog = load_catalog("linode")
    caps = ProviderCapabilities(spot=False, zones=("us-ord",))
    fitted = fit_catalog(catalog, caps)
    assert fitted.instance_types
    assert all(o.capacity_type is OD and o.zone == "us-ord" for it in fitted.instance_types for o in it.offerings)
