"""Error collection for the manifest readers: every problem of a file is gathered, then raised as one InputError.

A reader works on one document at a time (:class:`Doc`). Field helpers raise :class:`FieldError`; wrapping each
field in ``with doc.field():`` records the error and lets the reader continue with the next field, so a user sees
all the problems of a file at once. Informational notes (ignored kinds, unmodelled resources) are aggregated in
:class:`Notes`.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuscale.errors import InputError, shorten

_NO_VALUE = object()
MAX_SHOWN = 10
"""A report of many problems shows the first ones and a count of the rest."""


class FieldError(Exception):
    """A problem with one field: its path, what is wrong, the offending value and how to fix it."""

    def __init__(self, path: str, message: str, value: object = _NO_VALUE, fix: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.value = value
        self.fix = fix


class ManifestError(InputError):
    """One or more problems in a snapshot file. ``problems`` holds one :class:`InputError` per problem."""

    def __init__(self, source: str, problems: Iterable[InputError]) -> None:
        self.problems = tuple(problems)
        n = len(self.problems)
        if n == 1:
            only = self.problems[0]
            super().__init__(str(only))
            self.where, self.value, self.fix = only.where, only.value, only.fix
            return
        shown = self.problems[:MAX_SHOWN]
        lines = "\n".join(f"  - {p}" for p in shown)
        more = f"\n  ... and {n - len(shown):,} more" if n > len(shown) else ""
        super().__init__(f"{n:,} problems in {source}:", fix="")
        self.args = (f"{n:,} problems in {shorten(source, 300)}:\n{lines}{more}",)


@dataclass
class Doc:
    """One document (or one item of a ``List``) being read, and the problem list it reports to."""

    source: str
    index: int
    """1-based document number in the file."""
    line: int | None
    """1-based line where the document (or item) starts, if known."""
    problems: list[InputError]
    item: int | None = None
    """0-based index within a ``List`` document."""
    kind: str = ""
    name: str = ""
    failed: bool = False
    locate: Callable[[str], int | None] | None = None
    """Maps a field path to its 1-based line in the file (None if unknown)."""

    def describe(self, path: str = "") -> str:
        """``snapshot.yaml:12 (document 2, items[3], Pod default/train-0)``; the line is the field's when known."""
        line = (self.locate(path) if self.locate and path else None) or self.line
        loc = f"{self.source}:{line}" if line else self.source
        bits = [f"document {self.index}"]
        if self.item is not None:
            bits.append(f"items[{self.item}]")
        if self.kind or self.name:
            bits.append(" ".join(x for x in (self.kind, self.name) if x))
        return f"{loc} ({', '.join(bits)})"

    def report(self, err: FieldError) -> None:
        """Record a field problem against this document."""
        self.failed = True
        value = None if err.value is _NO_VALUE else err.value
        where = f"{self.describe(err.path)} {err.path}" if err.path else self.describe()
        if err.value is not _NO_VALUE and err.value is None:
            value = "null"
        self.problems.append(InputError(err.message, where=where, value=value, fix=err.fix))

    def error(self, path: str, message: str, value: object = _NO_VALUE, fix: str = "") -> None:
        """Record a problem without raising."""
        self.report(FieldError(path, message, value, fix))

    @contextmanager
    def field(self) -> Iterator[None]:
        """Run a block; a FieldError inside it is recorded and suppressed."""
        try:
            yield
        except FieldError as err:
            self.report(err)


@dataclass
class Notes:
    """Aggregated informational notes: things read but deliberately not modelled."""

    counts: Counter[str] = field(default_factory=Counter)
    order: list[str] = field(default_factory=list)

    def add(self, note: str) -> None:
        """Count one occurrence of ``note``."""
        if note not in self.counts:
            self.order.append(note)
        self.counts[note] += 1

    def render(self) -> list[str]:
        """One line per distinct note, with its count when it occurred more than once."""
        return [f"{n} (x{self.counts[n]})" if self.counts[n] > 1 else n for n in self.order]


def close_matches(word: str, options: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` options that look like ``word`` (case-insensitive), best first."""
    opts = list(options)
    lower = {o.lower(): o for o in opts}
    hits = difflib.get_close_matches(word.lower(), list(lower), n=n, cutoff=0.5)
    return [lower[h] for h in hits]


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """``"did you mean X?"`` / ``"use one of: ..."`` text for a fix."""
    opts = sorted(options)
    hits = close_matches(word, opts)
    if hits:
        return f"did you mean {' or '.join(hits)}?"
    shown = ", ".join(opts[:12]) + (", ..." if len(opts) > 12 else "")
    return f"use one of: {shown}"
