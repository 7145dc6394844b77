"""Disruption budgets (cron windows, node counts and percentages) and PodDisruptionBudget allowances.

Budget schedules are 5-field cron expressions evaluated in UTC on the caller's clock (seconds since the Unix epoch):
a budget with ``schedule`` and ``duration_s`` is active during ``[hit, hit + duration)`` for every schedule hit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

from gpuscale.core.disruption.values import BudgetVerdict, DisruptionReason, PodDisruptionBudget
from gpuscale.core.model import (
    DisruptionBudget,
    NodePool,
    Pod,
)
from gpuscale.errors import InputError

# ---------------------------------------------------------------------------------------------------------------------
# Cron (5 fields: minute hour day-of-month month day-of-week), UTC
# ---------------------------------------------------------------------------------------------------------------------

_MONTHS = {
    m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))
}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS: tuple[tuple[str, int, int, Mapping[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed 5-field cron expression. Day-of-week 0 and 7 are Sunday.

    As in cron, when both day-of-month and day-of-week are restricted, a day matches if either matches.
    """

    expr: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    def day_matches(self, d: date) -> bool:
        """True if the schedule fires on calendar day ``d``."""
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return dow
        if self.any_weekday:
            return dom
        return dom or dow

    def matches(self, t: float) -> bool:
        """True if the schedule fires at the minute containing Unix time ``t`` (UTC)."""
        dt = datetime.fromtimestamp(t, tz=UTC)
        return self.day_matches(dt.date()) and dt.hour in self.hours and dt.minute in self.minutes

    def last_fire(self, t: float, horizon_s: float) -> float | None:
        """The latest fire time in ``(t - horizon_s, t]``, or None."""
        limit = t - horizon_s
        dt = datetime.fromtimestamp(t, tz=UTC)
        day = dt.date()
        while True:
            start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
            if start + 86400.0 <= limit:
                return None
            if self.day_matches(day):
                for h in reversed(self.hours):
                    for m in reversed(self.minutes):
                        ts = start + h * 3600.0 + m * 60.0
                        if ts <= t:
                            return ts if ts > limit else None
            if day == date.min:
                return None
            day -= timedelta(days=1)


def _parse_atom(atom: str, lo: int, hi: int, names: Mapping[str, int], where: str, expr: str) -> int:
    key = atom.lower()
    if key in names:
        return names[key]
    try:
        v = int(atom)
    except ValueError:
        raise InputError(
            f"cron {where} value is not a number", where=where, value=expr, fix=f"use {lo}-{hi} (or a name)"
        ) from None
    if not lo <= v <= hi:
        raise InputError(f"cron {where} value {v} out of range", where=where, value=expr, fix=f"use {lo}-{hi}")
    return v


def _parse_field(text: str, lo: int, hi: int, names: Mapping[str, int], where: str, expr: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise InputError(f"empty cron {where} list item", where=where, value=expr, fix="remove the extra comma")
        base, _, step_s = part.partition("/")
        step = 1
        if step_s:
            try:
                step = int(step_s)
            except ValueError:
                step = 0
            if step <= 0:
                raise InputError(f"bad cron {where} step", where=where, value=expr, fix="use a positive step")
        if base == "*":
            first, last = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            first = _parse_atom(a, lo, hi, names, where, expr)
            last = _parse_atom(b, lo, hi, names, where, expr)
            if first > last:
                raise InputError(f"cron {where} range is reversed", where=where, value=expr, fix="write low-high")
        else:
            first = _parse_atom(base, lo, hi, names, where, expr)
            last = hi if step_s else first
        out.update(range(first, last + 1, step))
    return out


@lru_cache(maxsize=256)
def parse_cron(expr: str, where: str = "schedule") -> CronSchedule:
    """Parse a 5-field cron expression (``*``, lists, ranges, steps, month/day names, ``@daily``-style macros).

    Raises :class:`~gpuscale.errors.InputError` naming ``where`` and the fix for a malformed expression.
    """
    text = _MACROS.get(expr.strip().lower(), expr.strip())
    fields = text.split()
    if len(fields) != 5:
        raise InputError(
            f"cron expression needs 5 fields, got {len(fields)}",
            where=where,
            value=expr,
            fix='write "minute hour day-of-month month day-of-week", e.g. "0 9 * * 1-5"',
        )
    parsed = [
        _parse_field(f, lo, hi, names, f"{where} ({name})", expr)
        for f, (name, lo, hi, names) in zip(fields, _FIELDS, strict=True)
    ]
    weekdays = frozenset(d % 7 for d in parsed[4])
    return CronSchedule(
        expr=expr,
        minutes=tuple(sorted(parsed[0])),
        hours=tuple(sorted(parsed[1])),
        days=frozenset(parsed[2]),
        months=frozenset(parsed[3]),
        weekdays=weekdays,
        any_day=fields[2] == "*",
        any_weekday=fields[4] == "*",
    )


def budget_limit(budget: DisruptionBudget, total_nodes: int, where: str = "budget.nodes") -> int:
    """How many of ``total_nodes`` the budget lets be disrupted at once (a percentage rounds up)."""
    text = str(budget.nodes).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return math.ceil(total_nodes * pct / 100.0 - 1e-9)
        n = int(text)
        if n < 0:
            raise ValueError
        return n
    except ValueError:
        raise InputError(
            "disruption budget nodes must be a non-negative integer or a percentage 0-100%",
            where=where,
            value=budget.nodes,
            fix='write e.g. nodes: "2" or nodes: "10%"',
        ) from None


def budget_active(budget: DisruptionBudget, now: float, where: str = "budget") -> bool:
    """True if the budget applies at ``now``: always without a schedule, else within ``duration_s`` of a hit."""
    if budget.schedule is None:
        return True
    if budget.duration_s is None or budget.duration_s <= 0:
        raise InputError(
            "a disruption budget with a schedule needs a positive duration",
            where=f"{where}.duration",
            value=budget.duration_s,
            fix='add e.g. duration: "8h"',
        )
    cron = parse_cron(budget.schedule, f"{where}.schedule")
    return cron.last_fire(now, budget.duration_s) is not None


def allowed_disruptions(
    pool: NodePool, reason: DisruptionReason, total_nodes: int, disrupting: int, now: float
) -> BudgetVerdict:
    """The most restrictive active budget of ``pool`` for ``reason`` minus nodes already being disrupted."""
    best: BudgetVerdict = BudgetVerdict(None)
    for i, b in enumerate(pool.disruption.budgets):
        where = f"pool {pool.name}: disruption.budgets[{i}]"
        if b.reasons and str(reason) not in b.reasons:
            continue
        if not budget_active(b, now, where):
            continue
        left = max(0, budget_limit(b, total_nodes, f"{where}.nodes") - disrupting)
        if best.allowed is None or left < best.allowed:
            best = BudgetVerdict(left, b)
    return best


def pdb_allowances(pdbs: Iterable[PodDisruptionBudget], pods: Iterable[Pod]) -> dict[str, int]:
    """Evictions each PDB (``namespace/name``) still allows: ``max_unavailable`` minus its pods not running now."""
    pods = tuple(pods)
    out: dict[str, int] = {}
    for pdb in pdbs:
        down = sum(1 for p in pods if pdb.matches(p) and p.node_name is None and p.phase == "Pending")
        out[f"{pdb.namespace}/{pdb.name}"] = max(0, pdb.max_unavailable - down)
    return out
