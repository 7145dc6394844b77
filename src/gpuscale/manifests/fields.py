"""Typed field readers shared by the Pod, Node and GPUNodePool readers.

Scalar readers raise :class:`FieldError`; the structure readers (requirements, taints, tolerations) report every
problem of the structure to the :class:`Doc` and return None when it is unusable.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from gpuscale.core.model import Requirement, SelectorOperator, Taint, TaintEffect, Toleration
from gpuscale.manifests.problems import Doc, FieldError, did_you_mean

MAX_INT = 2**53
"""Largest magnitude of any integer field (exact in a float, far beyond any real value)."""
OPERATORS = tuple(str(o) for o in SelectorOperator)
EFFECTS = tuple(str(e) for e in TaintEffect)


def as_mapping(value: object, path: str) -> dict[str, Any]:
    """A mapping (``None`` or absent -> empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(path, f"must be a mapping, not {_type(value)}", value)
    return value


def as_list(value: object, path: str) -> list[Any]:
    """A list (``None`` or absent -> empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(path, f"must be a list, not {_type(value)}", value, fix="write it as a YAML list (- item)")
    return value


def as_str(value: object, path: str, *, required: bool = False) -> str:
    """A string; numbers and booleans are rejected (Kubernetes would reject them too)."""
    if value is None:
        if required:
            raise FieldError(path, "is required", fix="set it to a non-empty string")
        return ""
    if not isinstance(value, str):
        raise FieldError(path, f"must be a string, not {_type(value)}", value, fix=f'quote it: "{_plain(value)}"')
    if required and not value:
        raise FieldError(path, "must not be empty", value)
    return value


def as_int(value: object, path: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer within [minimum, maximum] (and always within +-2**53)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(path, f"must be an integer, not {_type(value)}", value)
    if abs(value) > MAX_INT:
        raise FieldError(path, "is too large", value, fix=f"use a number of at most {MAX_INT:,} in magnitude")
    if minimum is not None and value < minimum:
        raise FieldError(path, f"must be >= {minimum}", value)
    if maximum is not None and value > maximum:
        raise FieldError(path, f"must be <= {maximum}", value)
    return value


def as_float(value: object, path: str, *, minimum: float, maximum: float) -> float:
    """A number within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(path, f"must be a number, not {_type(value)}", value)
    if not minimum <= value <= maximum:
        raise FieldError(path, f"must be between {minimum} and {maximum}", value)
    return float(value)


def as_bool(value: object, path: str) -> bool:
    """A boolean (``true``/``false``)."""
    if not isinstance(value, bool):
        raise FieldError(path, f"must be true or false, not {_type(value)}", value)
    return value


def str_map(value: object, path: str) -> dict[str, str]:
    """A mapping of strings to strings (labels, annotations, nodeSelector)."""
    out: dict[str, str] = {}
    for k, v in as_mapping(value, path).items():
        key = as_str(k, f"{path} key", required=True)
        out[key] = as_str(v, f"{path}.{key}")
    return out


def str_list(value: object, path: str) -> tuple[str, ...]:
    """A list of non-empty strings."""
    return tuple(as_str(v, f"{path}[{i}]", required=True) for i, v in enumerate(as_list(value, path)))


def check_fields(doc: Doc, obj: Mapping[str, Any], path: str, allowed: Collection[str]) -> None:
    """Report every key of ``obj`` that is not in ``allowed`` (with close matches as the fix)."""
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            doc.error(where, "unknown field", key, fix=did_you_mean(str(key), allowed))


def fields_of(doc: Doc, value: object, path: str, allowed: Collection[str]) -> dict[str, Any] | None:
    """The mapping at ``path`` with its unknown keys reported (:func:`check_fields`); None, reported, if not one."""
    try:
        m = as_mapping(value, path)
    except FieldError as err:
        doc.report(err)
        return None
    check_fields(doc, m, path, allowed)
    return m


def metadata_and_spec(
    doc: Doc, obj: Mapping[str, Any], allowed: Collection[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A document's top-level keys checked against ``allowed``, then its ``metadata`` and ``spec`` mappings (each
    empty, reported, when not a mapping)."""
    check_fields(doc, obj, "", allowed)
    meta: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    with doc.field():
        meta = as_mapping(obj.get("metadata"), "metadata")
    with doc.field():
        spec = as_mapping(obj.get("spec"), "spec")
    return meta, spec


def choice(value: object, path: str, options: Collection[str]) -> str:
    """A string that must be one of ``options``."""
    text = as_str(value, path, required=True)
    if text not in options:
        raise FieldError(path, "is not a valid value", text, fix=did_you_mean(text, options))
    return text


REQUIREMENT_FIELDS = ("key", "operator", "values")


def requirement(
    doc: Doc, obj: object, path: str, *, allowed_keys: Collection[str] | None = None, extra_fields: Collection[str] = ()
) -> Requirement | None:
    """A node selector requirement ``{key, operator, values}`` with kube-apiserver validation of values.

    In/NotIn need at least one value, Exists/DoesNotExist none, Gt/Lt exactly one integer.
    """
    before = len(doc.problems)
    m = fields_of(doc, obj, path, (*REQUIREMENT_FIELDS, *extra_fields))
    if m is None:
        return None
    key = op = ""
    values: tuple[str, ...] = ()
    with doc.field():
        key = as_str(m.get("key"), f"{path}.key", required=True)
        if allowed_keys is not None and key not in allowed_keys:
            raise FieldError(
                f"{path}.key", "is not a label known before a node exists", key, did_you_mean(key, allowed_keys)
            )
    with doc.field():
        op = choice(m.get("operator"), f"{path}.operator", OPERATORS)
    with doc.field():
        values = str_list(m.get("values"), f"{path}.values")
    if op:
        with doc.field():
            _check_values(SelectorOperator(op), values, f"{path}.values")
    if len(doc.problems) > before:
        return None
    return Requirement(key, SelectorOperator(op), values)


def _check_values(op: SelectorOperator, values: tuple[str, ...], path: str) -> None:
    if op in (SelectorOperator.IN, SelectorOperator.NOT_IN) and not values:
        raise FieldError(path, f"operator {op} needs at least one value", fix="list the values, or use Exists")
    if op in (SelectorOperator.EXISTS, SelectorOperator.DOES_NOT_EXIST) and values:
        raise FieldError(path, f"operator {op} takes no values", list(values), fix="remove values")
    if op in (SelectorOperator.GT, SelectorOperator.LT):
        if len(values) != 1:
            raise FieldError(path, f"operator {op} needs exactly one value", list(values))
        if not re.fullmatch(r"-?[0-9]{1,18}", values[0]):
            raise FieldError(
                path, f"operator {op} compares integers", values[0], fix='write an integer, e.g. "2"'
            ) from None


TAINT_FIELDS = ("key", "value", "effect", "timeAdded")


def taint(doc: Doc, obj: object, path: str, *, allowed: Collection[str] = TAINT_FIELDS) -> Taint | None:
    """A taint ``{key, value, effect}``; the effect is required."""
    before = len(doc.problems)
    m = fields_of(doc, obj, path, allowed)
    if m is None:
        return None
    key = value = effect = ""
    with doc.field():
        key = as_str(m.get("key"), f"{path}.key", required=True)
    with doc.field():
        value = as_str(m.get("value"), f"{path}.value")
    with doc.field():
        effect = choice(m.get("effect"), f"{path}.effect", EFFECTS)
    if len(doc.problems) > before:
        return None
    return Taint(key=key, effect=TaintEffect(effect), value=value)


TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")


def toleration(doc: Doc, obj: object, path: str) -> Toleration | None:
    """A toleration: operator Equal (default) or Exists; an empty key needs Exists; Exists takes no value."""
    before = len(doc.problems)
    m = fields_of(doc, obj, path, TOLERATION_FIELDS)
    if m is None:
        return None
    key = value = ""
    op = "Equal"
    effect: TaintEffect | None = None
    with doc.field():
        key = as_str(m.get("key"), f"{path}.key")
    with doc.field():
        if m.get("operator") is not None:
            op = choice(m.get("operator"), f"{path}.operator", ("Equal", "Exists"))
    with doc.field():
        value = as_str(m.get("value"), f"{path}.value")
    with doc.field():
        if m.get("effect") not in (None, ""):
            effect = TaintEffect(choice(m.get("effect"), f"{path}.effect", EFFECTS))
    with doc.field():
        if m.get("tolerationSeconds") is not None:
            as_int(m.get("tolerationSeconds"), f"{path}.tolerationSeconds")
    if not key and op != "Exists" and len(doc.problems) == before:
        doc.error(f"{path}.operator", "an empty key needs operator Exists", op, fix="add operator: Exists or set key")
    if op == "Exists" and value:
        doc.error(f"{path}.value", "must be empty with operator Exists", value, fix="remove value or use Equal")
    if len(doc.problems) > before:
        return None
    return Toleration(key=key, operator=op, value=value, effect=effect)


def _type(value: object) -> str:
    """The YAML type of ``value`` with its article (``"an integer"``, ``"a mapping"``, ``"null"``)."""
    if value is None:
        return "null"
    names = {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }
    return names.get(type(value), f"a {type(value).__name__}")


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else "..."
