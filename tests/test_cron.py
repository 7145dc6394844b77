"""Cron schedules: our grammar validates, croniter evaluates; checked against a minute-by-minute oracle."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.cron import CronSchedule, parse_cron, window_open
from gpuscale.errors import InputError

T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


def fires_at(c: CronSchedule, minute_start: float) -> bool:
    """The oracle: cron's rule read straight off the parsed value sets."""
    dt = datetime.fromtimestamp(minute_start, UTC)
    if dt.month not in c.months or dt.hour not in c.hours or dt.minute not in c.minutes:
        return False
    dom, dow = dt.day in c.days, (dt.isoweekday() % 7) in c.weekdays
    if c.any_day and c.any_weekday:
        return True
    if c.any_day:
        return dow
    if c.any_weekday:
        return dom
    return dom or dow


def oracle_last_fire(c: CronSchedule, t: float, horizon_s: float) -> float | None:
    m = math.floor(t / 60.0) * 60.0
    while m > t - horizon_s:
        if fires_at(c, m):
            return m
        m -= 60.0
    return None


def field(lo: int, hi: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    value = st.integers(lo, hi).map(str)
    if names:
        value = value | st.sampled_from(names)
    rng = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda ab: f"{min(ab)}-{max(ab)}")
    step = st.tuples(st.sampled_from(["*", f"{lo}-{hi}"]), st.integers(1, 7)).map(lambda bs: f"{bs[0]}/{bs[1]}")
    atom = value | rng | step
    return st.just("*") | st.lists(atom, min_size=1, max_size=3).map(",".join)


EXPRESSIONS = st.tuples(
    field(0, 59),
    field(0, 23),
    field(1, 31),
    field(1, 12, ("jan", "FEB", "jul", "dec")),
    field(0, 7, ("mon", "fri", "SUN")),
).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(
    expr=EXPRESSIONS,
    offset=st.floats(0, 2 * 365 * 86400, allow_nan=False),
    horizon=st.sampled_from([60.0, 3600.0, 86400.0]),
)
def test_last_fire_and_window_agree_with_the_oracle(expr: str, offset: float, horizon: float) -> None:
    c = parse_cron(expr)
    t = T0 + offset
    expected = oracle_last_fire(c, t, horizon)
    assert c.last_fire(t, horizon) == expected
    assert window_open(c, horizon, t) is (expected is not None)
    assert c.matches(t) is fires_at(c, math.floor(t / 60.0) * 60.0)


def test_window_answers_hold_forwards_and_backwards() -> None:
    c = parse_cron("0 9 * * mon-fri")
    times = [T0 + k * 1337.0 for k in range(600)]
    for t in [*times, *reversed(times)]:
        assert window_open(c, 8 * 3600, t) is (c.last_fire(t, 8 * 3600) is not None)


def test_window_edges() -> None:
    c = parse_cron("0 22 * * *")
    assert window_open(c, 4 * 3600, ts(2026, 3, 4, 21, 59)) is False
    assert window_open(c, 4 * 3600, ts(2026, 3, 4, 22, 0)) is True
    assert window_open(c, 4 * 3600, ts(2026, 3, 5, 1, 59)) is True
    assert window_open(c, 4 * 3600, ts(2026, 3, 5, 2, 0)) is False


def test_a_single_value_range_is_that_value() -> None:
    # croniter alone reads "5-5" as every minute; the validated schedule keeps it to minute 5
    c = parse_cron("5-5 0 * * *")
    assert c.minutes == (5,)
    assert c.matches(ts(2026, 3, 4, 0, 5)) and not c.matches(ts(2026, 3, 4, 0, 6))


def test_a_full_weekday_range_still_ors_with_the_day_of_month() -> None:
    c = parse_cron("0 0 13 * 0-7")
    assert c.matches(ts(2026, 4, 14, 0))


def test_a_schedule_that_never_fires() -> None:
    c = parse_cron("0 0 30 feb *")
    assert c.last_fire(T0, 10 * 365 * 86400) is None and c.next_fire(T0) is None
    assert window_open(c, 3600, T0) is False


@pytest.mark.parametrize("expr", ["0 0 L * *", "0 0 * * mon#2", "0 0 ? * *", "H * * * *", "* * * * * *"])
def test_croniter_only_syntax_is_refused(expr: str) -> None:
    with pytest.raises(InputError, match="schedule"):
        parse_cron(expr)
