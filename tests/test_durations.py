"""The duration grammars of gpuscale.core.durations: one per format, each bounded, and the readers use them."""

from __future__ import annotations

import pytest

from gpuscale.core import durations as D
from gpuscale.errors import InputError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("30s", 30.0), ("10m", 600.0), ("1h30m", 5400.0), ("1.5h", 5400.0), ("250ms", 0.25), ("+2m", 120.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert D.parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("-1s", "negative"),
        ("1d", "not a valid duration"),
        ("10", "not a valid duration"),
        ("87841h", "10 years"),
        ("9" * 41, "longer than 40"),
        (5, "not a duration string"),
    ],
)
def test_go_durations_refused(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        D.parse_go_duration(text)


def test_go_duration_bound_is_ten_years_inclusive() -> None:
    assert D.parse_go_duration(f"{D.MAX_DURATION_S}s") == D.MAX_DURATION_S
    with pytest.raises(ValueError, match="10 years"):
        D.parse_go_duration(f"{D.MAX_DURATION_S + 1}s")


@pytest.mark.parametrize(("text", "seconds"), [("2d", 172800.0), ("1d12h", 129600.0), ("0.5d", 43200.0), ("90s", 90.0)])
def test_days_durations(text: str, seconds: float) -> None:
    assert D.parse_days_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "message"), [("3661d", "10 years"), ("9999999d", "not a valid"), ("1dx", "not a")])
def test_days_durations_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        D.parse_days_duration(text)


@pytest.mark.parametrize(("text", "seconds"), [("0d8h0m", 28800), ("8H", 28800), ("1d12h", 129600), ("90s", 90)])
def test_egs_durations_round_trip(text: str, seconds: int) -> None:
    assert D.parse_egs_duration(text) == seconds
    assert D.parse_egs_duration(D.format_egs_duration(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "8", "1m1h", "1.5h", "1" * 13 + "d", "x" * 33, "-1h"])
def test_egs_durations_refused_with_the_field_named(text: str) -> None:
    with pytest.raises(InputError, match="exitDuration"):
        D.parse_egs_duration(text, where="exitDuration")


def test_egs_units_are_bounded_to_twelve_digits() -> None:
    assert D.parse_egs_duration("9" * 12 + "d") == int("9" * 12) * 86400


def test_readers_share_the_grammars() -> None:
    from gpuscale.core import gpr
    from gpuscale.manifests import quantity

    assert quantity.parse_duration is D.parse_go_duration
    assert quantity.MAX_DURATION_S == D.MAX_DURATION_S
    assert gpr.format_duration is D.format_egs_duration
    assert not hasattr(gpr, "parse_duration")
