"""Checks shared by the readers of a scenario's optional ``policy`` settings (:mod:`.policyopts`, :mod:`.repackopts`):
a positive duration, a mapping of known keys, and the ``true``/``false``/``{KEY: DURATION}`` switch of a rule."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from gpuscale.core.durations import DURATION_HELP, MAX_DURATION_S
from gpuscale.errors import InputError
from gpuscale.manifests.quantity import parse_duration

R = TypeVar("R")


def positive_duration(value: object, where: str) -> float:
    """A positive number of seconds or a duration string, in seconds."""
    if isinstance(value, bool):
        raise InputError("must be a duration", where=where, value=value, fix=DURATION_HELP)
    if isinstance(value, int | float):
        if value <= 0 or not math.isfinite(value):
            raise InputError("must be a positive number of seconds", where=where, value=value, fix=DURATION_HELP)
        if value > MAX_DURATION_S:
            raise InputError("longer than 10 years", where=where, value=value, fix=DURATION_HELP)
        return float(value)
    try:
        out = parse_duration(value)
    except ValueError as exc:
        raise InputError(f"not a duration ({exc})", where=where, value=value, fix=DURATION_HELP) from None
    if out <= 0:
        raise InputError("must be a positive duration", where=where, value=value, fix=DURATION_HELP)
    return out


def known_keys(
    value: object, where: str, *, name: str, keys: Sequence[str], expected: str, example: str
) -> Mapping[Any, Any]:
    """``value`` as a mapping whose keys are all in ``keys``; else the error naming the first unknown one."""
    if not isinstance(value, Mapping):
        raise InputError(expected, where=where, value=value, fix=example)
    for k in value:
        if k not in keys:
            raise InputError(f"unknown {name} setting", where=f"{where}.{k}", value=k, fix=f"use {', '.join(keys)}")
    return value


def switched_rule(
    value: object,
    where: str,
    *,
    name: str,
    key: str,
    example: str,
    default: Callable[[], R],
    make: Callable[[float], R],
) -> R | None:
    """``null``/``false``: None (off); ``true`` or ``{}``: ``default()``; ``{key: DURATION}``: ``make(seconds)``."""
    if value is None or value is False:
        return None
    if value is True:
        return default()
    spec = known_keys(
        value, where, name=name, keys=(key,), expected="must be true, false or a mapping", example=example
    )
    if key not in spec:
        return default()
    return make(positive_duration(spec[key], f"{where}.{key}"))
