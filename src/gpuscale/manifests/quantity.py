"""Kubernetes resource quantities and durations, parsed exactly (``fractions.Fraction``) then rounded once.

Quantities follow the Kubernetes grammar: a signed decimal number followed by a binary suffix (``Ki Mi Gi Ti Pi
Ei``), a decimal suffix (``n u m k M G T P E``) or a decimal exponent (``e3``, ``E-2``). A YAML number (``cpu: 2``,
``cpu: 0.5``) is read as written. Rounding: requests round **up** to the next millicore / MiB (a pod never gets less
than it asked for), capacities (``allocatable``, pool limits) round **down**.

Durations follow Go's ``time.ParseDuration`` (``"30s"``, ``"10m"``, ``"1h30m"``, ``"1.5h"``, ``"500ms"``): the grammar
is :func:`gpuscale.core.durations.parse_go_duration`, re-exported here as :func:`parse_duration`.

Only ASCII digits are digits (``"٣"`` is not 3), and values are bounded before they are converted:
:data:`MAX_NUMBER_CHARS` characters of number, :data:`MAX_QUANTITY` (``1Ei``) for any quantity,
:data:`MAX_CPU_CORES`, :data:`MAX_COUNT` for GPUs and pods, and :data:`MAX_DURATION_S` (10 years) for durations.

Every parse error is a :class:`ValueError` whose message says what is wrong; the manifest readers turn it into an
:class:`~gpuscale.errors.InputError` naming the document and field, with ``QUANTITY_HELP`` / ``DURATION_HELP`` as
the fix.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from gpuscale.core.durations import DURATION_HELP as DURATION_HELP
from gpuscale.core.durations import MAX_DURATION_CHARS, parse_go_duration
from gpuscale.core.durations import MAX_DURATION_S as MAX_DURATION_S

parse_duration = parse_go_duration
"""Seconds in a Go-style duration string (:func:`gpuscale.core.durations.parse_go_duration`)."""

MIB = 1 << 20

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
MAX_NUMBER_CHARS = MAX_DURATION_CHARS
"""Longest quantity or duration string read (a longer one is refused before it is converted)."""
MAX_QUANTITY = Fraction(1 << 60)
"""Largest quantity of any kind (1Ei): memory in bytes, CPU in cores, counts."""
MAX_CPU_CORES = 10**9
MAX_COUNT = 10**9
"""Largest GPU count, milli-GPU amount or pod count."""
_MAX_EXPONENT = 30
QUANTITY_HELP = "write a Kubernetes quantity such as 500m, 2, 0.5, 512Mi, 16Gi, 1G or 1e9"


def parse_quantity(value: object) -> Fraction:
    """The exact value of a Kubernetes quantity (a string or a YAML number). Raises ValueError if it is not one."""
    if isinstance(value, bool) or value is None:
        raise ValueError("not a quantity")
    if isinstance(value, int):
        return _bounded(Fraction(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not a finite quantity")
        return _bounded(Fraction(repr(value)))
    if not isinstance(value, str):
        raise ValueError("not a quantity")
    text = value.strip()
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"longer than {MAX_NUMBER_CHARS} characters")
    m = _QUANTITY.match(text)
    if m is None:
        raise ValueError("not a valid quantity")
    number = Fraction(m["num"])
    if m["exp"]:
        exponent = int(m["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"exponent out of range (|e| <= {_MAX_EXPONENT})")
        return _bounded(number * Fraction(10) ** exponent)
    suffix = m["suffix"] or ""
    return _bounded(number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]))


def _bounded(q: Fraction) -> Fraction:
    if abs(q) > MAX_QUANTITY:
        raise ValueError("too large (at most 1Ei)")
    return q


def _non_negative(value: object) -> Fraction:
    q = parse_quantity(value)
    if q < 0:
        raise ValueError("must not be negative")
    return q


def cpu_milli(value: object, *, round_up: bool = True) -> int:
    """CPU quantity in millicores (``"500m"`` -> 500, ``"2"`` -> 2000, ``0.25`` -> 250)."""
    q = _non_negative(value)
    if q > MAX_CPU_CORES:
        raise ValueError(f"more than {MAX_CPU_CORES:,} cores")
    return math.ceil(q * 1000) if round_up else math.floor(q * 1000)


def memory_mib(value: object, *, round_up: bool = True) -> int:
    """Memory quantity in MiB (``"1Gi"`` -> 1024, ``"1G"`` -> 954 rounded up, ``"128974848"`` -> 123)."""
    q = _non_negative(value) / MIB
    return math.ceil(q) if round_up else math.floor(q)


def whole_count(value: object) -> int:
    """A quantity that must be a whole, non-negative number (GPUs, milli-GPU, pod slots)."""
    q = _non_negative(value)
    if q.denominator != 1:
        raise ValueError("must be a whole number")
    if q > MAX_COUNT:
        raise ValueError(f"more than {MAX_COUNT:,}")
    return int(q)


def to_cpu_milli(q: Fraction, *, round_up: bool = True) -> int:
    """An exact CPU amount (cores) in millicores."""
    return math.ceil(q * 1000) if round_up else math.floor(q * 1000)


def to_memory_mib(q: Fraction, *, round_up: bool = True) -> int:
    """An exact memory amount (bytes) in MiB."""
    return math.ceil(q / MIB) if round_up else math.floor(q / MIB)
