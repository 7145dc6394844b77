"""Request semantics of the Kubernetes API emulator: label and field selectors, JSON merge patch, ``Status`` errors.

Split from :mod:`gpuscale.fakes.kube_api` (which re-exports the public names).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

import kmock

__all__ = [
    "ApiError",
    "api_error",
    "field_matcher",
    "int_or_percent",
    "label_matcher",
    "merge_patch",
    "selector_matches",
]

Obj = dict[str, Any]


class ApiError(kmock.KubernetesError):
    """A Kubernetes ``Status`` failure (rendered by kmock's scaffold)."""


def api_error(code: int, reason: str, message: str, **details: Any) -> ApiError:
    return ApiError(status=code, reason=reason, message=message, details=details or {"causes": []})


_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over labels for a ``labelSelector`` string; raises ApiError 400 on bad syntax."""
    tests: list[tuple[str, str, frozenset[str]]] = []  # (op, key, values)
    for part in _split_selector(selector):
        m = _SET_RE.match(part)
        if m:
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            tests.append((m.group(2), m.group(1), values))
        elif "!=" in part:
            key, value = (x.strip() for x in part.split("!=", 1))
            tests.append(("notin", key, frozenset({value})))
        elif "=" in part:
            key, value = (x.strip() for x in part.replace("==", "=").split("=", 1))
            tests.append(("in", key, frozenset({value})))
        elif part.startswith("!"):
            tests.append(("absent", part[1:].strip(), frozenset()))
        elif re.fullmatch(r"[\w./-]+", part):
            tests.append(("exists", part, frozenset()))
        else:
            raise api_error(400, "BadRequest", f"unable to parse requirement: {part!r}")

    def one(op: str, key: str, values: frozenset[str], labels: Mapping[str, str]) -> bool:
        if op == "in":
            return labels.get(key) in values
        if op == "notin":
            return labels.get(key) not in values
        return (key in labels) == (op == "exists")

    def match(labels: Mapping[str, str]) -> bool:
        return all(one(op, key, values, labels) for op, key, values in tests)

    return match


def _field(obj: Obj, path: str) -> str:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    if path == "metadata.name":
        return str(meta.get("name", ""))
    if path == "metadata.namespace":
        return str(meta.get("namespace", ""))
    if path == "spec.nodeName":
        return str(spec.get("nodeName") or "")
    if path == "status.phase":
        return str(status.get("phase") or "")
    return str(bool(spec.get("unschedulable"))).lower()


_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.unschedulable")


def field_matcher(selector: str) -> Callable[[Obj], bool]:
    """A predicate over objects for a ``fieldSelector`` string (the fields above); 400 on an unknown field."""
    tests: list[tuple[str, str, bool]] = []  # (field, value, negated)
    for part in _split_selector(selector):
        neg = "!=" in part
        key, value = (x.strip() for x in part.replace("==", "=").split("!=" if neg else "=", 1))
        if key not in _FIELDS:
            raise api_error(400, "BadRequest", f'field label not supported: "{key}"')
        tests.append((key, value, neg))
    return lambda obj: all((_field(obj, k) != v) if n else (_field(obj, k) == v) for k, v, n in tests)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A ``metav1.LabelSelector`` (matchLabels, matchExpressions) against labels; an empty selector matches all."""
    sel = selector or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in sel.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = int(value[:-1])
        return -(-total * pct // 100) if round_up else total * pct // 100
    return int(value)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out
