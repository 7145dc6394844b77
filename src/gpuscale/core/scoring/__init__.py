"""Placement scorers, by name. ``SCORERS`` maps a scorer name to a zero-argument factory."""

from __future__ import annotations

from collections.abc import Callable

from gpuscale.core.scoring.base import Scorer, Workload, WorkloadClass, select
from gpuscale.core.scoring.bestfit import BestFit

SCORERS: dict[str, Callable[[], Scorer]] = {
    "best-fit": BestFit,
}

DEFAULT_SCORER = "best-fit"


def make_scorer(name: str) -> Scorer:
    """A fresh scorer by name; raises KeyError naming the known scorers."""
    try:
        return SCORERS[name]()
    except KeyError:
        raise KeyError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}") from None


__all__ = ["SCORERS", "DEFAULT_SCORER", "Scorer", "Workload", "WorkloadClass", "make_scorer", "select"]
