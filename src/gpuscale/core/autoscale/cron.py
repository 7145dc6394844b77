"""Five-field cron expressions (UTC), pure: parse once, then ask whether a time window defined by a start and an end
expression is open at a given moment (the window opens at each start match and closes at the next end match)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}  # fmt: skip
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()), ("month", 1, 12, _MONTHS),
           ("day of week", 0, 7, _DAYS))  # fmt: skip
SEARCH_DAYS = 366 * 4 + 1
"""How far ahead a match is looked for (covers 29 February)."""


class CronError(ValueError):
    """An expression that is not valid cron; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 = Sunday (7 is folded into 0)."""
    any_day: bool
    any_weekday: bool

    def day_matches(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # one unrestricted: the other decides
            return dom and dow
        return dom or dow  # both restricted: either matches (as cron does)

    def next_after(self, t: float) -> float | None:
        """The first matching minute strictly after epoch second ``t`` (None if none within :data:`SEARCH_DAYS`)."""
        start = dt.datetime.fromtimestamp(t, dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        day = start.date()
        for i in range(SEARCH_DAYS):
            d = day + dt.timedelta(days=i)
            if not self.day_matches(d):
                continue
            for h in sorted(self.hours):
                for m in sorted(self.minutes):
                    when = dt.datetime(d.year, d.month, d.day, h, m, tzinfo=dt.UTC)
                    if when >= start:
                        return when.timestamp()
        return None


def parse(expr: str) -> Cron:
    """A :class:`Cron` from a 5-field expression or a macro (``@daily``); :class:`CronError` if invalid."""
    text = MACROS.get(expr.strip(), expr.strip())
    parts = text.split()
    if len(parts) != len(_FIELDS):
        raise CronError(f"a cron schedule has 5 fields, this has {len(parts)}")
    sets = [_field(value, *spec) for value, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in sets[4])
    return Cron(sets[0], sets[1], sets[2], sets[3], weekdays, parts[2] == "*", parts[4] == "*")


def _field(value: str, label: str, lo: int, hi: int, names: tuple[str, ...]) -> frozenset[int]:
    out: set[int] = set()
    for part in value.split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or len(step_text) > 4 or int(step_text) == 0:
                raise CronError(f"invalid step in {label} field {value!r}")
            step = int(step_text)
        if body == "*":
            first, last = lo, hi
        else:
            a, _, b = body.partition("-")
            first = _number(a, label, lo, hi, names)
            last = _number(b, label, lo, hi, names) if b else (hi if step_text else first)
            if last < first:
                raise CronError(f"range {body!r} runs backwards in {label} field")
        out.update(range(first, last + 1, step))
    return frozenset(out)


def _number(token: str, label: str, lo: int, hi: int, names: tuple[str, ...]) -> int:
    if token.upper() in names:
        return names.index(token.upper()) + (1 if label == "month" else 0)
    if not (token.isascii() and token.isdigit() and len(token) <= 4) or not lo <= int(token) <= hi:
        raise CronError(f"{label} must be {lo}..{hi}, got {token!r}")
    return int(token)


def window_open(start: Cron, end: Cron, now: float) -> bool:
    """Whether ``now`` lies in a window opened by ``start`` and closed by ``end``: after ``now``, the next end comes
    before the next start. A window is open from its start minute to just before its end minute; a minute matching
    both counts as closed."""
    nxt_end = end.next_after(now)
    nxt_start = start.next_after(now)
    if nxt_end is None:
        return False
    if nxt_start is None:
        return True
    return nxt_end < nxt_start
