"""The HISTORY file of ``gpuscale scaler replay``: a YAML list of steps
``{t: seconds, metrics: {TRIGGER_NAME: value}, readyPods: n, unreadyPods: n, missingMetricPods: n}``.

``t`` counts from 0 and increases strictly; a trigger left out of ``metrics`` failed at that step, ``null`` is an
empty query result. Read through the guarded loader; every problem is reported with file:line and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from gpuscale.core.autoscale.keda import EMPTY
from gpuscale.core.autoscale.replay import HistoryStep
from gpuscale.errors import InputError
from gpuscale.inputs import load_yaml_text, read_text
from gpuscale.manifests import _locator
from gpuscale.manifests.fields import as_float, as_int, as_mapping, fields_of
from gpuscale.manifests.problems import Doc, FieldError, ManifestError, did_you_mean

STEP_FIELDS = ("t", "metrics", "readyPods", "unreadyPods", "missingMetricPods")
MAX_STEPS = 1_000_000
MAX_T = 86_400.0 * 3660
MAX_VALUE = 1e15
MAX_PODS = 100_000


def load_history(path: str | Path, triggers: Collection[str]) -> list[HistoryStep]:
    """The steps of a HISTORY file; ``triggers`` are the scaler's trigger names (the keys ``metrics`` may use)."""
    source = str(path)
    data, node = load_yaml_text(read_text(path, what="history file"), source=source)
    if not isinstance(data, list) or not data:
        raise InputError(
            "a history is a non-empty YAML list of steps", where=source, value=type(data).__name__ if data else data,
            fix="write - {t: 0, metrics: {NAME: value}} per step",
        )  # fmt: skip
    if len(data) > MAX_STEPS:
        raise InputError(f"has more than {MAX_STEPS:,} steps", where=source, fix="split the history")
    problems: list[InputError] = []
    doc = Doc(source, 1, 1, problems, locate=_locator(node) if node is not None else None)
    steps: list[HistoryStep] = []
    last = -math.inf
    for i, raw in enumerate(data):
        got = _step(doc, raw, f"[{i}]", triggers)
        if got is None:
            continue
        if got.t <= last:
            doc.error(f"[{i}].t", f"must be later than the step before (t={last:g})", got.t, fix="sort the steps by t")
        last = got.t
        steps.append(got)
        if len(problems) > 50:
            break
    if problems:
        raise ManifestError(source, problems)
    return steps


def _step(doc: Doc, raw: object, path: str, triggers: Collection[str]) -> HistoryStep | None:
    before = len(doc.problems)
    m = fields_of(doc, raw, path, STEP_FIELDS)
    if m is None:
        return None
    t = 0.0
    with doc.field():
        if m.get("t") is None:
            raise FieldError(f"{path}.t", "is required", fix="give the step's time in seconds from 0")
        t = as_float(m["t"], f"{path}.t", minimum=0.0, maximum=MAX_T)
    metrics: dict[str, float] = {}
    with doc.field():
        raw_metrics: dict[str, Any] = as_mapping(m.get("metrics"), f"{path}.metrics")
        for key, value in raw_metrics.items():
            where = f"{path}.metrics.{key}"
            if key not in triggers:
                doc.error(where, "is not a trigger of the scaler", key, fix=did_you_mean(str(key), triggers))
                continue
            if value is None:
                metrics[key] = EMPTY
                continue
            with doc.field():
                number = as_float(value, where, minimum=-MAX_VALUE, maximum=MAX_VALUE)
                if not math.isfinite(number):
                    raise FieldError(where, "must be a finite number", value)
                metrics[key] = number
    counts: dict[str, int | None] = {}
    for key in ("readyPods", "unreadyPods", "missingMetricPods"):
        with doc.field():
            value = m.get(key)
            counts[key] = None if value is None else as_int(value, f"{path}.{key}", minimum=0, maximum=MAX_PODS)
    if len(doc.problems) > before:
        return None
    return HistoryStep(t, metrics, counts["readyPods"], counts["unreadyPods"] or 0, counts["missingMetricPods"] or 0)
