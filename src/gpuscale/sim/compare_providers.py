"""``gpuscale compare --providers``: one scenario's workload under gpuscale on several provider profiles.

Each provider runs :func:`gpuscale.sim.scenario.load_scenario` with its profile (:mod:`gpuscale.sim.profiles`): the
scenario's own provider keeps the file as written; any other gets its own catalog and region, its profile's cloud
behaviour, and the pools without instance type and zone names. The arrivals are the same for every provider.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuscale.errors import InputError
from gpuscale.sim.profiles import PROFILES, CloudProfile
from gpuscale.sim.runner import SimResult
from gpuscale.sim.scenario import Scenario, load_scenario

PROVIDER_KEYS = (
    "provider",
    "catalog",
    "costUsd",
    "pendingP50s",
    "pendingP95s",
    "pendingMaxS",
    "capacityErrors",
    "quotaErrors",
    "rateLimited",
    "nodesLaunched",
    "duplicateLaunches",
    "failedLaunches",
    "spotInterruptions",
    "podsArrived",
    "podsCompleted",
    "podsRunning",
    "podsPending",
)
_COLUMNS = (
    ("provider", "provider", ""),
    ("cost $", "costUsd", ",.2f"),
    ("p50 wait", "pendingP50s", ".0f"),
    ("p95 wait", "pendingP95s", ".0f"),
    ("cap err", "capacityErrors", "d"),
    ("429", "rateLimited", "d"),
    ("nodes", "nodesLaunched", "d"),
    ("dup", "duplicateLaunches", "d"),
    ("pods done", "podsDone", ""),
)

Simulate = Callable[[Scenario], SimResult]


def parse_providers(text: str) -> list[CloudProfile]:
    """``lke,eks,gke,ack`` as profiles (unique, in order); an :class:`InputError` naming ``--providers``."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [n for n in names if n not in PROFILES]
    if bad or not names:
        raise InputError(
            "unknown provider profile", where="--providers", value=(bad[0] if bad else text)[:60],
            fix=f"use a comma-separated list of {', '.join(PROFILES)}",
        )  # fmt: skip
    if len(set(names)) != len(names):
        raise InputError("a provider is named twice", where="--providers", value=text[:60], fix="name each once")
    return [PROFILES[n] for n in names]


def provider_rows(
    path: str | Path, providers: Sequence[CloudProfile], simulate: Simulate, seed: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, Scenario]]:
    """Run the scenario at ``path`` on each provider with ``simulate``; rows in the ``--json`` shape."""
    rows: list[dict[str, Any]] = []
    scenarios: dict[str, Scenario] = {}
    for profile in providers:
        scen = load_scenario(path, provider=profile)
        if seed is not None:
            scen = dataclasses.replace(scen, seed=seed)
        scenarios[profile.name] = scen
        rep = simulate(scen).report
        cloud = rep["cloud"]
        values = {
            "provider": profile.name,
            "catalog": scen.catalog.name,
            "capacityErrors": cloud["insufficient_capacity"],
            "quotaErrors": cloud["quota_exceeded"],
            "rateLimited": cloud["rate_limited"],
        }
        rows.append({k: values[k] if k in values else rep[k] for k in PROVIDER_KEYS})
    return rows, scenarios


def format_providers(rows: Sequence[Mapping[str, Any]], title: str, width: int = 80) -> str:
    """The provider table as plain text (at most ``width`` columns when it fits, else one block per provider),
    then which catalog each provider ran on."""
    headers = [h for h, _, _ in _COLUMNS]
    cells = [
        [
            f"{r['podsCompleted']}/{r['podsArrived']}" if key == "podsDone" else format(r[key], fmt)
            for _, key, fmt in _COLUMNS
        ]
        for r in rows
    ]
    widths = [max(len(c) for c in col) for col in zip(headers, *cells, strict=True)]
    lines = [f"{title}: the same workload under gpuscale on each provider", "(cost in USD, waits in seconds)", ""]
    table = [
        "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in (headers, *cells)
    ]
    if max(len(t) for t in table) <= width:
        lines.extend(t.rstrip() for t in table)
    else:
        pad = max(len(h) for h in headers)
        for row in cells:
            lines.append(row[0])
            lines.extend(f"  {h:<{pad}}  {c}" for h, c in zip(headers[1:], row[1:], strict=True))
    lines.append("")
    lines.extend(f"{r['provider']}: catalog {r['catalog']}" for r in rows)
    return "\n".join(lines)


def providers_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """``compare --providers --csv``: the ``--json`` keys as a header, one row per provider."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=PROVIDER_KEYS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
