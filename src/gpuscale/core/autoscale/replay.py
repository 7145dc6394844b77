"""Replay a metric history through one scaler with no cluster: each step is one sync, and the target takes the
desired replicas at once (what a user tunes behaviours against before touching a cluster)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuscale.core.autoscale.hpa import PodCounts
from gpuscale.core.autoscale.keda import ScalerSpec, ScalerState, step


@dataclass(frozen=True, slots=True)
class HistoryStep:
    t: float
    """Seconds from the start of the history."""
    metrics: Mapping[str, float]
    """Trigger name -> value (:data:`~gpuscale.core.autoscale.keda.EMPTY` for an empty result); a trigger absent
    here failed at this step."""
    ready: int | None = None
    """Ready pods reporting the metrics (default: the current replicas less the two counts below)."""
    unready: int = 0
    missing: int = 0


@dataclass(frozen=True, slots=True)
class ReplayRow:
    t: float
    current: int
    desired: int
    reason: str
    active: bool

    def as_dict(self) -> dict[str, object]:
        t: float | int = int(self.t) if self.t.is_integer() else self.t
        return {"t": t, "currentReplicas": self.current, "desiredReplicas": self.desired, "reason": self.reason}


def replay(spec: ScalerSpec, steps: Sequence[HistoryStep], *, start: float = 0.0,
           initial: int | None = None) -> list[ReplayRow]:  # fmt: skip
    """The decision at every step. ``start`` is the epoch second of ``t = 0`` (for cron schedules); ``initial`` the
    replicas before the first step (default: minReplicaCount)."""
    current = spec.min_replicas if initial is None else initial
    state = ScalerState()
    rows: list[ReplayRow] = []
    for s in steps:
        ready = s.ready if s.ready is not None else max(current - s.unready - s.missing, 0)
        d = step(spec, state, current, s.metrics, PodCounts(ready, s.unready, s.missing), start + s.t)
        rows.append(ReplayRow(s.t, current, d.desired, d.reason, d.active))
        state, current = d.state, d.desired
    return rows
