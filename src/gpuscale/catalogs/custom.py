"""Custom instance catalogs in YAML (format documented in ``docs/catalogs.md``).

Validation is strict: unknown or duplicate fields, wrong types, missing required fields, bad quantities, negative
prices and duplicate names raise :class:`InputError` naming the file, line, field path, the value and the fix.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from gpuscale.catalogs._util import sorted_catalog
from gpuscale.core.gpus import known_memory_gb, normalize_gpu_model
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering
from gpuscale.errors import InputError
from gpuscale.inputs import GuardedLoader, load_yaml_text, read_text

API_VERSION = "gpuscale.io/v1alpha1"
KIND = "InstanceCatalog"
ARCHES = ("amd64", "arm64")
_QUANTITY = re.compile(r"^([0-9]{1,12}(?:\.[0-9]{1,12})?)(Mi|Gi|Ti)$")  # ASCII digits only
_MIB_PER_UNIT = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
MAX_COUNT = 1_000_000
"""Upper bound of vCPU and GPU counts."""
MAX_PRICE = 1_000_000.0
"""Upper bound of an hourly price (USD)."""
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


class _Map(dict[str, Any]):
    """A YAML mapping that remembers its line and the line of each value."""

    line: int = 0
    lines: dict[str, int]


class _Seq(list[Any]):
    """A YAML sequence that remembers its line and the line of each item."""

    line: int = 0
    lines: list[int]


class _Loader(GuardedLoader):
    """The guarded loader of :mod:`gpuscale.inputs`, recording line numbers and rejecting duplicate keys."""


class _KeyError(Exception):
    """A bad mapping key found while loading; turned into an InputError naming the file."""

    def __init__(self, line: int, message: str, key: object, fix: str) -> None:
        super().__init__(message)
        self.line, self.message, self.key, self.fix = line, message, key, fix


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.line, out.lines = node.start_mark.line + 1, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise _KeyError(line, "field name is not a string", key, "quote it")
        if key in out:
            raise _KeyError(line, "duplicate field", key, "give each field once")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = value_node.start_mark.line + 1
    return out


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> _Seq:
    out = _Seq(loader.construct_object(child, deep=True) for child in node.value)
    out.line, out.lines = node.start_mark.line + 1, [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_TYPE_FIXES = {
    str: "write text; quote values that look like numbers or booleans",
    int: "write a whole number such as 8",
    float: "write a number such as 1.25",
    bool: "write true or false",
}


class _Validator:
    """Reads one catalog document, raising InputError with ``file:line: path`` on the first problem."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, path: str, line: int, message: str, value: object = None, fix: str = "") -> InputError:
        return InputError(
            message, where=f"{self.file}:{line}: {path}" if path else f"{self.file}:{line}", value=value, fix=fix
        )

    def mapping(self, obj: object, path: str, line: int, required: tuple[str, ...], optional: tuple[str, ...]) -> _Map:
        if not isinstance(obj, _Map):
            raise self.fail(path, line, "must be a mapping", obj, f"give the fields {', '.join(required + optional)}")
        for key in obj:
            if key not in required + optional:
                raise self.fail(
                    f"{path}.{key}" if path else key,
                    obj.lines[key],
                    "unknown field",
                    key,
                    f"allowed fields here: {', '.join(required + optional)}",
                )
        for key in required:
            if key not in obj:
                raise self.fail(f"{path}.{key}" if path else key, obj.line, "missing required field", fix=f"add {key}")
        return obj

    def typed(self, m: _Map, key: str, path: str, kind: type, default: Any = None) -> Any:
        if key not in m:
            return default
        value = m[key]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok:
            raise self.fail(
                f"{path}.{key}" if path else key,
                m.lines[key],
                f"must be {_TYPE_NAMES[kind]}",
                value,
                _TYPE_FIXES[kind],
            )
        return float(value) if kind is float else value

    def positive_int(self, m: _Map, key: str, path: str) -> int:
        value: int = self.typed(m, key, path, int)
        if not 0 < value <= MAX_COUNT:
            raise self.fail(
                f"{path}.{key}", m.lines[key], f"must be a positive integer up to {MAX_COUNT:,}", value, "write e.g. 8"
            )
        return value

    def name(self, m: _Map, key: str, path: str, default: str | None = None) -> str:
        value: str | None = self.typed(m, key, path, str, default)
        if value is None or len(value) > 253 or not _NAME.match(value):
            raise self.fail(
                f"{path}.{key}" if path else key,
                m.lines.get(key, m.line),
                "invalid name",
                value,
                "use up to 253 letters, digits, '.', '_' and '-', starting and ending with a letter or digit",
            )
        return value

    def quantity_mib(self, m: _Map, key: str, path: str) -> int | None:
        if key not in m:
            return None
        value = m[key]
        match = _QUANTITY.match(value) if isinstance(value, str) else None
        mib = round(float(match.group(1)) * _MIB_PER_UNIT[match.group(2)]) if match else 0
        if mib <= 0:
            raise self.fail(
                f"{path}.{key}",
                m.lines[key],
                "must be a memory quantity with a binary unit",
                value,
                "write e.g. 64Gi, 512Mi or 1.5Ti",
            )
        return mib


def _offering(v: _Validator, obj: object, path: str, line: int) -> Offering:
    m = v.mapping(obj, path, line, ("zone", "price"), ("capacityType", "available"))
    zone = v.name(m, "zone", path)
    cap_text: str = v.typed(m, "capacityType", path, str, str(CapacityType.ON_DEMAND))
    try:
        cap = CapacityType(cap_text)
    except ValueError:
        raise v.fail(
            f"{path}.capacityType",
            m.lines["capacityType"],
            "unknown capacity type",
            cap_text,
            f"use one of: {', '.join(c.value for c in CapacityType)}",
        ) from None
    price: float = v.typed(m, "price", path, float)
    if not 0 <= price <= MAX_PRICE:
        problem = "negative price" if price < 0 else f"price above {MAX_PRICE:,.0f}"
        raise v.fail(f"{path}.price", m.lines["price"], problem, price, "give the $/hour price, 0 or more")
    available: bool = v.typed(m, "available", path, bool, True)
    return Offering(zone=zone, capacity_type=cap, hourly_price=price, available=available)


def _instance_type(v: _Validator, obj: object, path: str, line: int, provider: str, region: str) -> InstanceType:
    m = v.mapping(obj, path, line, ("name", "vcpus", "memory", "offerings"), ("gpu", "arch", "family", "region"))
    name = v.name(m, "name", path)
    vcpus = v.positive_int(m, "vcpus", path)
    memory_mib = v.quantity_mib(m, "memory", path) or 0
    arch: str = v.typed(m, "arch", path, str, "amd64")
    if arch not in ARCHES:
        raise v.fail(f"{path}.arch", m.lines["arch"], "unknown architecture", arch, f"use one of: {', '.join(ARCHES)}")
    family: str = v.typed(m, "family", path, str, "")
    type_region = v.name(m, "region", path, region) if ("region" in m or region) else ""
    gpu_count, gpu_model, gpu_mem_mib = 0, None, 0
    if "gpu" in m:
        gpath = f"{path}.gpu"
        g = v.mapping(m["gpu"], gpath, m.lines["gpu"], ("model", "count"), ("memory",))
        gpu_count = v.positive_int(g, "count", gpath)
        gpu_mem_mib = v.quantity_mib(g, "memory", gpath) or 0
        raw_model: str = v.typed(g, "model", gpath, str)
        try:
            gpu_model = normalize_gpu_model(raw_model, memory_gb=gpu_mem_mib / 1024 if gpu_mem_mib else None)
        except InputError as exc:
            raise v.fail(f"{gpath}.model", g.lines["model"], "invalid GPU model name", raw_model, exc.fix) from None
        if not gpu_mem_mib and len(sizes := known_memory_gb(gpu_model)) == 1:
            gpu_mem_mib = sizes[0] * 1024
    offers_path = f"{path}.offerings"
    offers = m["offerings"]
    if not isinstance(offers, _Seq) or not offers:
        raise v.fail(
            offers_path,
            m.lines["offerings"],
            "must be a non-empty list",
            offers,
            "list at least one offering with zone and price",
        )
    offerings: list[Offering] = []
    seen: set[tuple[str, CapacityType]] = set()
    for i, item in enumerate(offers):
        off = _offering(v, item, f"{offers_path}[{i}]", offers.lines[i])
        if (off.zone, off.capacity_type) in seen:
            raise v.fail(
                f"{offers_path}[{i}]",
                offers.lines[i],
                "duplicate offering",
                f"{off.zone}/{off.capacity_type}",
                "give each zone and capacity type once",
            )
        seen.add((off.zone, off.capacity_type))
        offerings.append(off)
    return InstanceType(
        name=name,
        provider=provider,
        vcpus=vcpus,
        memory_mib=memory_mib,
        gpu_count=gpu_count,
        gpu_model=gpu_model,
        gpu_memory_mib=gpu_mem_mib,
        arch=arch,
        family=family,
        region=type_region,
        offerings=tuple(offerings),
    )


def parse(text: str, file: str, *, region: str | None = None) -> Catalog:
    """A catalog from the YAML ``text`` of ``file`` (used in error messages), optionally kept to one ``region``."""
    v = _Validator(file)
    try:
        doc, _ = load_yaml_text(text, source=file, loader_cls=_Loader)  # size, depth and alias limits
    except _KeyError as exc:
        raise InputError(exc.message, where=f"{file}:{exc.line}", value=exc.key, fix=exc.fix) from None
    top = v.mapping(doc, "", 1, ("apiVersion", "kind", "name", "instanceTypes"), ("provider", "region"))
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        if top[key] != expected:
            raise v.fail(key, top.lines[key], f"must be {expected}", top[key], f"write {key}: {expected}")
    name = v.name(top, "name", "")
    provider = v.name(top, "provider", "", name)
    default_region = v.name(top, "region", "") if "region" in top else ""
    items = top["instanceTypes"]
    if not isinstance(items, _Seq) or not items:
        raise v.fail(
            "instanceTypes", top.lines["instanceTypes"], "must be a non-empty list", items, "list your instance types"
        )
    types: list[InstanceType] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(items):
        it = _instance_type(v, item, f"instanceTypes[{i}]", items.lines[i], provider, default_region)
        if (it.name, it.region) in seen:
            raise v.fail(
                f"instanceTypes[{i}].name",
                items.lines[i],
                "duplicate instance type name",
                it.name,
                f"rename it or remove instanceTypes[{seen[(it.name, it.region)]}]",
            )
        seen[(it.name, it.region)] = i
        types.append(it)
    if region is not None:
        regions = sorted({it.region for it in types})
        types = [it for it in types if it.region == region]
        if not types:
            raise InputError(
                "no instance type in this region", where=file, value=region, fix=f"use one of: {', '.join(regions)}"
            )
    return sorted_catalog(name, types, ())


def load(path: Path, *, region: str | None = None) -> Catalog:
    """A custom catalog from the YAML file at ``path``."""
    if not path.exists():
        raise InputError("catalog file not found", where=str(path), fix="check the path given to --catalog")
    text = read_text(path, what="catalog file")
    return parse(text, str(path), region=region)
