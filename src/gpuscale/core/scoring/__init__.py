"""Placement scorers, by name. ``SCORERS`` maps a scorer name to a zero-argument factory."""

from __future__ import annotations

from collections.abc import Callable

from gpuscale.core.scoring.base import Scorer, Workload, WorkloadClass, select
from gpuscale.core.scoring.bestfit import BestFit
from gpuscale.core.scoring.dotproduct import DotProduct
from gpuscale.core.scoring.fgd import FGD
from gpuscale.core.scoring.fillfrag import FillFrag
from gpuscale.core.scoring.fillpair import FillPair
from gpuscale.core.scoring.fillreserve import FillReserve
from gpuscale.core.scoring.packing import GpuPacking
from gpuscale.core.scoring.randomized import RandomScorer

SCORERS: dict[str, Callable[[], Scorer]] = {
    "best-fit": BestFit,
    "random": RandomScorer,
    "dot-product": DotProduct,
    "gpu-packing": GpuPacking,
    "fgd": FGD,
    "fill-frag": FillFrag,
    "fill-reserve": FillReserve,
    "fill-pair": FillPair,
}

DEFAULT_SCORER = "best-fit"


def make_scorer(name: str) -> Scorer:
    """A fresh scorer by name; raises KeyError naming the known scorers."""
    try:
        return SCORERS[name]()
    except KeyError:
        raise KeyError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}") from None


__all__ = ["DEFAULT_SCORER", "SCORERS", "Scorer", "Workload", "WorkloadClass", "make_scorer", "select"]
