"""Build the GKE and ACK providers from the environment, for ``--provider gcp`` / ``--provider alibaba``.

Each factory takes the provider registry's settings (``env``, ``clock``, ``catalog``; any object with those
attributes) and imports its SDK only when called, so choosing one provider needs only its extra.

GKE: ``GKE_PROJECT``, ``GKE_LOCATION`` (region or zone), ``GKE_CLUSTER``, optional ``GKE_ZONES`` (comma-separated;
by default the location when it is a zone, else the catalog's zones in that region) and ``GKE_GPU_DRIVER``
(``DEFAULT``, ``LATEST``, ``INSTALLATION_DISABLED``). Credentials: Application Default Credentials.

ACK: ``ACK_CLUSTER_ID``, ``ACK_REGION``, ``ACK_VSWITCHES`` (``zone=vsw-1,vsw-2;zone2=vsw-3``), optional
``ACK_ENDPOINT``; ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET``. The spot price limit of each
instance type is its lowest on-demand price in the catalog, so a spot node never costs more than an on-demand one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuscale.core.model import CapacityType, Catalog
from gpuscale.errors import AuthenticationError, InputError
from gpuscale.providers.base import Provider

__all__ = ["alibaba_provider", "catalog_zones", "gcp_provider", "on_demand_prices", "parse_vswitches"]


def catalog_zones(catalog: Catalog, region: str) -> tuple[str, ...]:
    """The catalog's offering zones in ``region`` (zones named ``<region>-<letter>``)."""
    zones = {o.zone for t in catalog.instance_types for o in t.offerings if o.zone.startswith(region + "-")}
    return tuple(sorted(zones))


def on_demand_prices(catalog: Catalog) -> dict[str, float]:
    """Instance type -> its lowest on-demand $/h in the catalog."""
    out: dict[str, float] = {}
    for t in catalog.instance_types:
        prices = [o.hourly_price for o in t.offerings if o.capacity_type is CapacityType.ON_DEMAND]
        if prices:
            out[t.name] = min(prices)
    return out


def parse_vswitches(text: str) -> dict[str, tuple[str, ...]]:
    """``zone=vsw-1,vsw-2;zone2=vsw-3`` -> ``{zone: (vsw-1, vsw-2), zone2: (vsw-3,)}``."""
    out: dict[str, tuple[str, ...]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        zone, sep, ids = part.partition("=")
        vsw = tuple(v.strip() for v in ids.split(",") if v.strip())
        if not sep or not zone.strip() or not vsw:
            raise InputError(
                "is not zone=vsw-id[,vsw-id...]",
                where="environment variable ACK_VSWITCHES",
                value=part,
                fix="write e.g. cn-hangzhou-h=vsw-abc;cn-hangzhou-i=vsw-def",
            )
        out[zone.strip()] = vsw
    return out


def gcp_provider(settings: Any) -> Provider:
    """The GKE provider from ``settings.env`` (see the module docstring); needs the ``gcp`` extra."""
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        from gpuscale.providers.gcp import GcpConfig, GcpProvider
    except ImportError:
        raise InputError(
            "needs the Google Cloud SDKs", where="--provider gcp", fix="pip install 'gpuscale[gcp]'"
        ) from None
    env: Mapping[str, str] = settings.env
    location = env.get("GKE_LOCATION", "")
    zones = tuple(z.strip() for z in env.get("GKE_ZONES", "").split(",") if z.strip())
    if not zones:
        zones = (location,) if location.count("-") == 2 else catalog_zones(settings.catalog, location)
    config = GcpConfig(
        env.get("GKE_PROJECT", ""),
        location,
        env.get("GKE_CLUSTER", ""),
        zones,
        gpu_driver_version=env.get("GKE_GPU_DRIVER", "DEFAULT"),
    )
    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        raise AuthenticationError(
            "no Google Application Default Credentials (use Workload Identity or GOOGLE_APPLICATION_CREDENTIALS)",
            provider="gcp",
        ) from None
    return GcpProvider(config, credentials=credentials, clock=settings.clock)


def alibaba_provider(settings: Any) -> Provider:
    """The ACK provider from ``settings.env`` (see the module docstring); needs the ``alibaba`` extra."""
    try:
        from gpuscale.providers.alibaba import KEY_ID_ENV, KEY_SECRET_ENV, AlibabaConfig, AlibabaProvider
    except ImportError:
        raise InputError(
            "needs the Alibaba Cloud SDK", where="--provider alibaba", fix="pip install 'gpuscale[alibaba]'"
        ) from None
    env: Mapping[str, str] = settings.env
    if not env.get(KEY_ID_ENV) or not env.get(KEY_SECRET_ENV):
        raise AuthenticationError(f"{KEY_ID_ENV} and {KEY_SECRET_ENV} must be set", provider="alibaba")
    config = AlibabaConfig(
        env.get("ACK_CLUSTER_ID", ""),
        env.get("ACK_REGION", ""),
        parse_vswitches(env.get("ACK_VSWITCHES", "")),
        endpoint=env.get("ACK_ENDPOINT", ""),
        spot_price_limits=on_demand_prices(settings.catalog),
    )
    return AlibabaProvider(config, env=env, clock=settings.clock)
