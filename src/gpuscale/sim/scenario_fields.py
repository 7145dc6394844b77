"""Typed field readers for scenario files: every value is checked where it is read, and every problem is an
:class:`~gpuscale.errors.InputError` naming the file, the line and the field path, with the fix."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from gpuscale.core.durations import DAYS_HELP, DURATION_HELP, MAX_DURATION_S, parse_days_duration
from gpuscale.errors import InputError
from gpuscale.inputs import load_yaml_text
from gpuscale.manifests.problems import did_you_mean
from gpuscale.manifests.quantity import QUANTITY_HELP
from gpuscale.sim.engine import Dist

DIST_KINDS = {
    "constant": ("value",),
    "uniform": ("min", "max"),
    "normal": ("mean", "stddev"),
    "lognormal": ("median", "sigma"),
    "exponential": ("mean",),
}
MAX_COUNT = 1_000_000
"""Default upper bound of integer fields (counts, nodes, sizes, limits)."""
MAX_NUMBER = 1e9
"""Default upper bound of number fields (rates, weights, sigmas, scales)."""


_TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}


def _type(value: object) -> str:
    return "null" if value is None else _TYPE_NAMES.get(type(value), type(value).__name__)


# ------------------------------------------------------------------------------------------------ YAML + lines
def _line_map(root: yaml.Node | None, out: dict[str, int]) -> None:
    todo: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while todo:  # iterative: a deep document must not hit Python's recursion limit
        node, path = todo.pop()
        out.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            todo.extend((v, f"{path}.{k.value}" if path else str(k.value)) for k, v in node.value
                        if isinstance(k, yaml.ScalarNode))  # fmt: skip
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(node.value))


def load_yaml_lines(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """YAML ``text`` read by :mod:`gpuscale.inputs` (size, depth and alias limits, duplicate keys rejected) and the
    line of every field path (``a.b[0].c``); every problem is an :class:`InputError` naming ``source`` and the line."""
    data, node = load_yaml_text(text, source=source)
    lines: dict[str, int] = {}
    _line_map(node, lines)
    return data, lines


class FieldReader:
    """Typed field readers that raise InputError naming file, line and field."""

    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source = source
        self.lines = lines

    def where(self, path: str) -> str:
        p = path
        while p and p not in self.lines:
            shorter = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", p)
            p = shorter if shorter != p else ""
        line = self.lines.get(p)
        loc = f"{self.source}:{line}" if line else self.source
        return f"{loc} {path}" if path else loc

    def fail(self, path: str, message: str, value: object = None, fix: str = "") -> InputError:
        return InputError(message, where=self.where(path), value=value, fix=fix)

    def mapping(self, value: object, path: str, allowed: Sequence[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, not {type(value).__name__}", value)
        for k in value:
            if k not in allowed:
                raise self.fail(f"{path}.{k}" if path else str(k), "unknown field", k, did_you_mean(str(k), allowed))
        return value

    def listing(self, value: object, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(path, f"must be a list, not {type(value).__name__}", value, "write it as a YAML list")
        return value

    def string(self, value: object, path: str, *, required: bool = False, max_len: int = 253) -> str:
        if value is None and not required:
            return ""
        if not isinstance(value, str) or (required and not value):
            raise self.fail(path, f"must be a non-empty string, not {_type(value)}", value)
        if len(value) > max_len:
            raise self.fail(path, f"must be at most {max_len} characters", value)
        return value

    def integer(self, value: object, path: str, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, not {_type(value)}", value)
        if value < minimum:
            raise self.fail(path, f"must be >= {minimum}", value)
        if value > maximum:
            raise self.fail(path, f"must be <= {maximum:,}", value)
        return value

    def number(self, value: object, path: str, *, minimum: float = 0.0, maximum: float = MAX_NUMBER) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, f"must be a number, not {_type(value)}", value)
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise self.fail(path, f"must be between {minimum:g} and {maximum:g}", value)
        return float(value)

    def probability(self, value: object, path: str) -> float:
        return self.number(value, path, minimum=0.0, maximum=1.0)

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, "must be true or false", value)
        return value

    def duration(self, value: object, path: str) -> float:
        if isinstance(value, bool):
            raise self.fail(path, "must be a duration", value, DURATION_HELP)
        if isinstance(value, int | float):
            if not math.isfinite(value) or not 0 <= value <= MAX_DURATION_S:
                raise self.fail(path, "must be a number of seconds from 0 to 10 years", value)
            return float(value)
        if isinstance(value, str):
            try:
                return parse_days_duration(value)
            except ValueError as exc:
                raise self.fail(path, str(exc), value, DAYS_HELP) from None
        raise self.fail(path, "must be a duration", value, DURATION_HELP)

    def dist(self, value: object, path: str) -> Dist:
        if not isinstance(value, dict):
            return Dist.const(self.duration(value, path))
        kind = value.get("distribution")
        if not isinstance(kind, str) or kind not in DIST_KINDS:
            raise self.fail(
                f"{path}.distribution", "unknown or missing distribution", kind, did_you_mean(str(kind), DIST_KINDS)
            )
        params = DIST_KINDS[kind]
        self.mapping(value, path, ("distribution", *params))
        for p in params:
            if p not in value:
                raise self.fail(f"{path}.{p}", f"is required for a {kind} distribution")
        if kind == "lognormal":
            return Dist(
                kind, self.duration(value["median"], f"{path}.median"), self.number(value["sigma"], f"{path}.sigma")
            )
        args = [self.duration(value[p], f"{path}.{p}") for p in params]
        try:
            return Dist(kind, *args)
        except InputError as exc:
            raise self.fail(path, str(exc), value) from None

    def quantity(self, value: object, path: str, reader: Callable[[object], int]) -> int:
        try:
            return reader(value)
        except ValueError as exc:
            raise self.fail(path, str(exc), value, QUANTITY_HELP) from None
