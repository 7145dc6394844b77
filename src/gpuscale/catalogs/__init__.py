"""Instance catalogs: the machine shapes and prices the planner chooses from.

``load_catalog("linode")``, ``load_catalog("aws:eu-west-1")``, ``load_catalog("alibaba", region="cn-wulanchabu")``
or ``load_catalog("my-catalog.yaml")``. Shipped catalogs read the price CSVs inside the package
(``gpuscale/data/prices``), or ``$GPUSCALE_DATA_DIR/prices`` when that exists. See ``docs/catalogs.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gpuscale.catalogs import alibaba, aws, custom, gcp, linode
from gpuscale.catalogs._util import DATA_DIR_ENV
from gpuscale.core.gpus import KNOWN_GPU_MODELS, gpu_model_variants, normalize_gpu_model
from gpuscale.core.model import Catalog
from gpuscale.errors import InputError

__all__ = [
    "DATA_DIR_ENV",
    "KNOWN_CATALOGS",
    "KNOWN_GPU_MODELS",
    "CatalogInfo",
    "catalog_info",
    "gpu_model_variants",
    "load_catalog",
    "normalize_gpu_model",
]

_LOADERS: dict[str, Callable[[str | None], Catalog]] = {
    "alibaba": lambda region: alibaba.load(region),
    "aws": lambda region: aws.load(region),
    "gcp": lambda region: gcp.load(region),
    "linode": lambda region: linode.load(region),
}

KNOWN_CATALOGS: Mapping[str, str] = MappingProxyType(
    {
        "alibaba": f"Alibaba ECS GPU types, on-demand and spot per zone (default region {alibaba.DEFAULT_REGION})",
        "aws": f"AWS EC2 GPU types, on-demand, zone = region (default region {aws.DEFAULT_REGION})",
        "gcp": f"Google Cloud GPU machine types, on-demand and spot per zone (default region {gcp.DEFAULT_REGION})",
        "linode": f"Linode GPU plans, on-demand, zone = region (default region {linode.DEFAULT_REGION})",
    }
)
"""Shipped catalog names and a one-line description of each. Append ``:REGION`` to pick a region."""


_DEFAULT_REGIONS = {
    "alibaba": alibaba.DEFAULT_REGION,
    "aws": aws.DEFAULT_REGION,
    "gcp": gcp.DEFAULT_REGION,
    "linode": linode.DEFAULT_REGION,
}
_REGIONS: dict[str, Callable[[], list[str] | None]] = {
    "alibaba": alibaba.regions,
    "aws": aws.regions,
    "gcp": gcp.regions,
    "linode": linode.regions,
}


@dataclass(frozen=True, slots=True)
class CatalogInfo:
    """One shipped catalog as ``gpuscale catalog list`` shows it. ``regions`` is None when any region is accepted."""

    name: str
    description: str
    default_region: str
    regions: tuple[str, ...] | None
    instance_types: int
    """Instance types in the default region."""


def catalog_info(name: str) -> CatalogInfo:
    """Facts about the shipped catalog ``name`` (reads its price file)."""
    key = name.lower()
    if key not in _LOADERS:
        raise InputError(
            "unknown catalog", where="catalog", value=name[:60], fix=f"use one of {', '.join(KNOWN_CATALOGS)}"
        )
    regions = _REGIONS[key]()
    types = len(_LOADERS[key](None).instance_types)
    return CatalogInfo(
        key, KNOWN_CATALOGS[key], _DEFAULT_REGIONS[key], None if regions is None else tuple(regions), types
    )


def _is_path(text: str) -> bool:
    return text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text


def load_catalog(name_or_path: str, *, region: str | None = None) -> Catalog:
    """Load a shipped catalog by name (``NAME`` or ``NAME:REGION``) or a custom YAML catalog by path.

    ``region`` is the same as the ``:REGION`` suffix (giving both with different values is an error); for a custom
    catalog it keeps only the instance types of that region. Raises :class:`InputError` for an unknown name, an
    unknown region, missing price data, or an invalid custom file.
    """
    text = name_or_path.strip()
    if not text:
        raise InputError(
            "empty catalog name", where="--catalog", fix=f"use one of {', '.join(KNOWN_CATALOGS)} or a path"
        )
    name, sep, suffix = text.partition(":")
    if name.lower() not in _LOADERS and (_is_path(text) or Path(text).is_file()):
        return custom.load(Path(text), region=region)
    loader = _LOADERS.get(name.lower())
    if loader is None:
        raise InputError(
            "unknown catalog",
            where="--catalog",
            value=name_or_path,
            fix=f"use one of {', '.join(KNOWN_CATALOGS)} (optionally NAME:REGION) or a path to a .yaml catalog",
        )
    if sep:
        if not suffix:
            raise InputError(
                "empty region after ':'", where="--catalog", value=name_or_path, fix=f"write {name}:REGION"
            )
        if region is not None and region != suffix:
            raise InputError(
                "two different regions given",
                where="--catalog",
                value=f"{name_or_path} and region={region}",
                fix="give the region once",
            )
        region = suffix
    return loader(region)
