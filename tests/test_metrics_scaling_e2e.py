"""The end-to-end scaling scenario's hand-computed tables (``scaling_scenario.py``) against the pure HPA and KEDA
computations fed the plateau values directly, so a difference in the live run (``test_metrics_prometheus.py``:
a real Prometheus scraping ``gpuscale agent --simulate``) is a difference in what came through Prometheus."""

from __future__ import annotations

import pytest

from gpuscale.core.autoscale.hpa import HpaState, PodCounts, Sample, decide
from gpuscale.core.autoscale.keda import ScalerState, step
from gpuscale.metrics.gpus import LoadCurve
from scaling_scenario import EXPECTED, KEDA, KEDA_EXPECTED, PLATEAU_S, SPEC, UTIL, WARMUP_S, curve


def test_the_expected_steps_are_the_computation_on_the_same_values() -> None:
    replicas, state = 1, HpaState()
    keda_replicas, keda_state = 0, ScalerState()
    for (t, total, want, condition), (_, keda_want) in zip(EXPECTED, KEDA_EXPECTED, strict=True):
        assert total == 2 * UTIL[t // 2]
        d = decide(SPEC, replicas, {"gpu": Sample(float(total))}, PodCounts(replicas), state, float(t))
        replicas, state = d.desired, d.state
        assert (replicas, d.condition) == (want, condition), (t, d.reason)
        k = step(KEDA, keda_state, keda_replicas, {"gpu": float(total)}, PodCounts(keda_replicas), float(t))
        keda_replicas, keda_state = k.desired, k.state
        assert keda_replicas == keda_want, (t, k.reason)


@pytest.mark.parametrize("plateau", range(len(UTIL)))
def test_the_curve_string_holds_each_plateau(plateau: int) -> None:
    load = LoadCurve.parse(curve())
    for offset in (0.05, PLATEAU_S / 2, PLATEAU_S - 0.05):
        assert load.at(WARMUP_S + plateau * PLATEAU_S + offset) == UTIL[plateau]
