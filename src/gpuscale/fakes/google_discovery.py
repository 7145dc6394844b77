"""Google API discovery documents (the copies google-api-python-client ships): route an HTTP request to its method
and check query parameters and JSON values against the document's parameters and schemas. Used by
:mod:`gpuscale.fakes.gcp_api`."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DiscoveryDocument", "discovery_document"]

_SYSTEM_PARAMS = {"$alt", "$fields", "$prettyPrint"}
"""System parameters Google accepts besides the documents' own (the GAPIC REST transport sends ``$alt``)."""


@dataclass(frozen=True, slots=True)
class _Method:
    id: str
    http_method: str
    pattern: re.Pattern[str]
    desc: dict[str, Any]


class DiscoveryDocument:
    """One discovery document: routes requests to its methods and checks values against its schemas."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.name = f"{doc['name']}/{doc['version']}"
        self.schemas: dict[str, Any] = doc["schemas"]
        self.global_params = set(doc.get("parameters", {}))
        prefix = "/" + doc.get("servicePath", "")
        self.methods: dict[str, _Method] = {}
        for desc in self._walk(doc):
            flat = desc.get("flatPath") or desc["path"]
            regex = re.sub(r"\\\{[^}]+\\\}", "([^/:]+)", re.escape(prefix + flat))
            self.methods[desc["id"]] = _Method(desc["id"], desc["httpMethod"], re.compile(f"^{regex}$"), desc)

    @classmethod
    def _walk(cls, node: dict[str, Any]) -> Iterable[dict[str, Any]]:
        yield from node.get("methods", {}).values()
        for child in node.get("resources", {}).values():
            yield from cls._walk(child)

    def route(self, http_method: str, path: str) -> _Method | None:
        for m in self.methods.values():
            if m.http_method == http_method and m.pattern.match(path):
                return m
        return None

    def check_query(self, method: _Method, query: dict[str, list[str]]) -> list[str]:
        params = method.desc.get("parameters", {})
        errors: list[str] = []
        for name, values in query.items():
            if name in _SYSTEM_PARAMS or name in self.global_params:
                continue
            spec = params.get(name)
            if spec is None or spec.get("location") != "query":
                errors.append(f"query parameter {name!r} is not a parameter of {method.id}")
                continue
            if not spec.get("repeated") and len(values) > 1:
                errors.append(f"query parameter {name!r} given {len(values)} times")
            for v in values:
                errors += self._check_scalar(v, spec, f"query {name}", from_query=True, int_enums=False)
        for name, spec in params.items():
            if spec.get("required") and spec.get("location") == "query" and name not in query:
                errors.append(f"required query parameter {name!r} missing")
        return errors

    def check(self, value: Any, schema: dict[str, Any], where: str, *, int_enums: bool = False) -> list[str]:
        """Errors of ``value`` against ``schema`` (a discovery schema or ``{"$ref": ...}``)."""
        if "$ref" in schema:
            return self.check(value, self.schemas[schema["$ref"]], where, int_enums=int_enums)
        kind = schema.get("type")
        if kind == "object":
            if not isinstance(value, dict):
                return [f"{where}: expected an object, got {type(value).__name__}"]
            errors: list[str] = []
            props = schema.get("properties", {})
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                if key in props:
                    errors += self.check(item, props[key], f"{where}.{key}", int_enums=int_enums)
                elif extra is not None:
                    errors += self.check(item, extra, f"{where}[{key!r}]", int_enums=int_enums)
                else:
                    errors.append(f"{where}: unknown field {key!r}")
            return errors
        if kind == "array":
            if not isinstance(value, list):
                return [f"{where}: expected an array, got {type(value).__name__}"]
            return [
                e
                for i, v in enumerate(value)
                for e in self.check(v, schema["items"], f"{where}[{i}]", int_enums=int_enums)
            ]
        return self._check_scalar(value, schema, where, from_query=False, int_enums=int_enums)

    def enum_names(self, value: Any, schema: dict[str, Any]) -> Any:
        """``value`` (already checked) with enum numbers replaced by their names, as Google stores and returns them."""
        if "$ref" in schema:
            return self.enum_names(value, self.schemas[schema["$ref"]])
        if isinstance(value, dict):
            props, extra = schema.get("properties", {}), schema.get("additionalProperties")
            return {k: self.enum_names(v, props.get(k) or extra or {}) for k, v in value.items()}
        if isinstance(value, list):
            return [self.enum_names(v, schema.get("items", {})) for v in value]
        enum = schema.get("enum")
        if enum is not None and isinstance(value, int) and not isinstance(value, bool):
            return enum[value]
        return value

    @staticmethod
    def _check_scalar(
        value: Any, schema: dict[str, Any], where: str, *, from_query: bool, int_enums: bool
    ) -> list[str]:
        kind, fmt = schema.get("type"), schema.get("format", "")
        enum = schema.get("enum")
        if enum is not None:
            if int_enums and isinstance(value, int) and not isinstance(value, bool):
                return [] if 0 <= value < len(enum) else [f"{where}: enum number {value} out of range"]
            return [] if value in enum else [f"{where}: {value!r} is not one of {enum}"]
        if kind == "string":
            if not isinstance(value, str):
                return [f"{where}: expected a string, got {type(value).__name__}"]
            if fmt in ("int64", "uint64") and not re.fullmatch(r"-?\d+", value):
                return [f"{where}: {value!r} is not a decimal {fmt}"]
            return []
        if kind == "integer":
            if from_query:
                return [] if re.fullmatch(r"-?\d+", str(value)) else [f"{where}: {value!r} is not an integer"]
            ok = isinstance(value, int) and not isinstance(value, bool)
            return [] if ok else [f"{where}: expected an integer, got {value!r}"]
        if kind == "boolean":
            ok = value in ("true", "false") if from_query else isinstance(value, bool)
            return [] if ok else [f"{where}: expected a boolean, got {value!r}"]
        if kind == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return [] if ok else [f"{where}: expected a number, got {value!r}"]
        if kind == "any":
            return []
        return [f"{where}: schema type {kind!r} not understood by the fake"]


_DOCS: dict[str, DiscoveryDocument] = {}
_DOCS_LOCK = threading.Lock()


def discovery_document(name: str) -> DiscoveryDocument:
    """``container.v1`` or ``compute.v1`` from google-api-python-client's static discovery documents (cached)."""
    with _DOCS_LOCK:
        if name not in _DOCS:
            spec = importlib.util.find_spec("googleapiclient")
            if spec is None or not spec.submodule_search_locations:
                raise RuntimeError("google-api-python-client is not installed (it ships the discovery documents)")
            base = Path(next(iter(spec.submodule_search_locations))) / "discovery_cache" / "documents"
            _DOCS[name] = DiscoveryDocument(json.loads((base / f"{name}.json").read_text()))
        return _DOCS[name]
