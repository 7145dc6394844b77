"""Catalog rows skipped for known reasons, summarised in one line (details on request).

The loaders report every row they cannot use as a warning string. Reasons the price files are known to have (a row
without specs or price, a fractional-GPU type, a non-NVIDIA accelerator) are routine: :func:`summarise` counts them
per reason; anything else stays a warning.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

_KNOWN: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^[\w-]+: skipped \S+ \([^)]*\): unknown Price and SpotPrice$"), "without a price"),
    (re.compile(r"^[\w-]+: skipped \S+ \([^)]*\): unknown [\w, ]+$"), "with incomplete specs or price"),
    (re.compile(r"^[\w-]+: skipped \S+: fractional or unknown GPU count "), "with a fractional GPU"),
    (re.compile(r"^[\w-]+: excluded (?P<n>\d+) instance type\(s\) with non-NVIDIA accelerator "), "non-NVIDIA"),
)


@dataclass(frozen=True, slots=True)
class SkipSummary:
    """Known skips counted per reason, their detail lines, and the warnings that are not known skips."""

    catalog: str
    counts: dict[str, int]
    details: tuple[str, ...]
    others: tuple[str, ...]

    @property
    def total(self) -> int:
        """Rows skipped for known reasons."""
        return sum(self.counts.values())

    def line(self) -> str | None:
        """One ``note`` line, or None when nothing was skipped for a known reason."""
        if not self.total:
            return None
        reasons = ", ".join(f"{n} {reason}" for reason, n in self.counts.items())
        rows = "row" if self.total == 1 else "rows"
        return f"{self.catalog}: {self.total} catalog {rows} skipped ({reasons}); -v for details"


def summarise(catalog: str, warnings: Iterable[str]) -> SkipSummary:
    """Split a catalog's warnings into known skips (counted per reason) and other warnings."""
    counts: Counter[str] = Counter()
    details: list[str] = []
    others: list[str] = []
    for warning in warnings:
        for pattern, reason in _KNOWN:
            m = pattern.match(warning)
            if m:
                counts[reason] += int(m.group("n")) if "n" in pattern.groupindex else 1
                details.append(warning)
                break
        else:
            others.append(warning)
    return SkipSummary(catalog, dict(counts), tuple(details), tuple(others))
