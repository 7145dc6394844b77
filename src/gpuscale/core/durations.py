"""Every duration grammar gpuscale reads, one function per format, each bounded before it converts anything.

* **Go** (Kubernetes manifests, controller settings): ``"30s"``, ``"10m"``, ``"1h30m"``, ``"1.5h"``, ``"250ms"``;
  :func:`parse_go_duration`, at most :data:`MAX_DURATION_CHARS` characters and :data:`MAX_DURATION_S`.
* **Go with days** (simulator scenarios): a Go duration, optionally led by days, ``"2d"``, ``"1d12h"``, ``"0.5d"``;
  :func:`parse_days_duration`, at most :data:`MAX_DURATION_S`.
* **EGS** (GPU provisioning requests): ``"0d8h0m"``, ``"8h"``, ``"30m"``, ``"1d12h"``, ``"90s"``, whole units in
  d-h-m-s order; :func:`parse_egs_duration` (at most 12 digits per unit; callers cap the value) and its inverse
  :func:`format_egs_duration`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from fractions import Fraction

from gpuscale.errors import InputError

MAX_DURATION_S = 10 * 366 * 86400
"""Longest Go or days duration (10 years)."""
MAX_DURATION_CHARS = 40
"""Longest Go duration string read (a longer one is refused before it is converted)."""
DURATION_HELP = 'write a duration such as "30s", "10m", "1h30m" or "1.5h"'
"""The fix to print for a malformed Go duration."""

# ------------------------------------------------------------------------------------------------------------- Go
_GO_UNITS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),
    "μs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(value: object) -> float:
    """Seconds in a Go-style duration string (``"1h30m"`` -> 5400.0); raises ValueError for a negative, empty,
    malformed, too long or longer-than-10-years value. ``"0"`` alone needs no unit."""
    if not isinstance(value, str):
        raise ValueError("not a duration string")
    text = value.strip()
    if len(text) > MAX_DURATION_CHARS:
        raise ValueError(f"longer than {MAX_DURATION_CHARS} characters")
    if text == "0":
        return 0.0
    if text.startswith("-"):
        raise ValueError("must not be negative")
    text = text.removeprefix("+")
    pos, total = 0, Fraction(0)
    while pos < len(text):
        m = _GO_PART.match(text, pos)
        if m is None:
            raise ValueError("not a valid duration")
        total += Fraction(m[1]) * _GO_UNITS[m[2]]
        pos = m.end()
    if not text:
        raise ValueError("empty duration")
    if total > MAX_DURATION_S:
        raise ValueError("longer than 10 years")
    return float(total)


# -------------------------------------------------------------------------------------------------- Go with days
_DAYS = re.compile(r"^([0-9]{1,6}(?:\.[0-9]{0,9})?)d(.*)$")
DAYS_HELP = 'days are allowed too, e.g. "2d" or "1d12h"'


def parse_days_duration(text: str) -> float:
    """Seconds in a Go duration optionally led by days (``"2d"``, ``"1d12h"``); raises ValueError as
    :func:`parse_go_duration` does (at most 6 digits of days, 10 years in all)."""
    m = _DAYS.match(text.strip())
    if m is None:
        return parse_go_duration(text)
    seconds = float(m[1]) * 86400 + (parse_go_duration(m[2]) if m[2] else 0.0)
    if seconds > MAX_DURATION_S:
        raise ValueError("longer than 10 years")
    return seconds


# ------------------------------------------------------------------------------------------------------------ EGS
_EGS = re.compile(r"(?:([0-9]{1,12})d)?(?:([0-9]{1,12})h)?(?:([0-9]{1,12})m)?(?:([0-9]{1,12})s)?")
MAX_EGS_DURATION_TEXT = 32
"""Longest EGS duration string accepted (longer ones are refused before parsing)."""
EGS_HELP = "write e.g. 0d8h0m, 8h or 30m"


def parse_egs_duration(text: str, *, where: str = "duration") -> int:
    """Seconds in an EGS duration: ``0d8h0m``, ``8h``, ``30m``, ``1d12h``, ``90s`` (each unit optional, in order,
    case-insensitive). Raises :class:`InputError` naming ``where`` for a negative, empty or malformed value."""
    if not isinstance(text, str):
        raise InputError("must be a duration string", where=where, value=text, fix=EGS_HELP)
    if len(text) > MAX_EGS_DURATION_TEXT:
        raise InputError(f"is too long ({len(text)} characters)", where=where, value=text[:20], fix=EGS_HELP)
    s = text.strip().lower()
    if s.startswith("-"):
        raise InputError("must not be negative", where=where, value=text, fix="write a positive duration such as 8h")
    m = _EGS.fullmatch(s)
    if not s or m is None or not any(m.groups()):
        raise InputError(
            "is not a duration", where=where, value=text, fix="use days/hours/minutes/seconds in order: 0d8h0m, 8h, 30m"
        )
    d, h, mi, sec = (int(g) if g else 0 for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + sec


def format_egs_duration(seconds: float) -> str:
    """EGS form of a duration: ``0d8h0m`` (``s`` appended only when there are leftover seconds)."""
    total = max(0, round(seconds))
    d, rem = divmod(total, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}d{h}h{m}m" + (f"{s}s" if s else "")
