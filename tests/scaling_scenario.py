"""The scaling scenario of the end-to-end test: a stepped load curve played by ``gpuscale agent --simulate``, an HPA
and a KEDA scaler polling it through Prometheus, and the replicas computed by hand for each poll.

The live run is :func:`play` (used by ``test_metrics_prometheus.py``, whose Prometheus scrapes the agent); the tables
are also checked against the pure computations in ``test_metrics_scaling_e2e.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuscale.core.autoscale.hpa import (
    Behavior,
    HpaSpec,
    HpaState,
    MetricKind,
    MetricTarget,
    PodCounts,
    PolicyType,
    Sample,
    ScalingPolicy,
    ScalingRules,
    decide,
)
from gpuscale.core.autoscale.keda import EMPTY, ScalerSpec, ScalerState, Trigger, step
from gpuscale.errors import MetricsError, NoData
from gpuscale.metrics.prometheus import MetricSource, PrometheusClient
from prom_harness import agent, wait_for

WARMUP_S = 1.5
"""Before the first plateau (the first scrapes come meanwhile)."""
PLATEAU_S = 2.0
"""Real seconds per plateau, one poll in the middle of each; the scalers' clock (t below) counts 2 s per plateau too."""
UTIL = (25, 100, 100, 100, 30, 30, 10, 10)
"""Per-GPU utilisation (%) of the agent's two GPUs on each plateau; the query sums them."""
HOSTNAME = "e2e"
QUERY = f'sum(DCGM_FI_DEV_GPU_UTIL{{Hostname="{HOSTNAME}"}})'
TARGET = 50.0
"""AverageValue target: 50 utilisation points per replica (KEDA's default metric type)."""
SPEC = HpaSpec(
    min_replicas=1,
    max_replicas=10,
    metrics=(MetricTarget("gpu", MetricKind.AVERAGE_VALUE, TARGET),),
    behavior=Behavior(
        scale_up=ScalingRules(0, (ScalingPolicy(PolicyType.PODS, 2, 4),)),
        scale_down=ScalingRules(3, (ScalingPolicy(PolicyType.PODS, 1, 2),)),
    ),
)
EXPECTED = [
    # (t, total, replicas after the poll, HPA condition)
    (1, 50, 1, "DesiredWithinRange"),  # 50 / (50 x 1) = 1.0: within tolerance
    (3, 200, 3, "ScaleUpLimit"),  # ceil(200 / 50) = 4, but +2 pods per 4 s from 1 caps at 3
    (5, 200, 3, "ScaleUpLimit"),  # 4 again; the +2 at t=3 is inside the 4 s period: still capped at 1 + 2 = 3
    (7, 200, 4, "DesiredWithinRange"),  # the t=3 event has left the period: 3 + 2 = 5 >= 4
    (9, 60, 4, "ScaleDownStabilized"),  # ceil(60 / 50) = 2, but the 3 s window still holds t=7's 4
    (11, 60, 3, "ScaleDownLimit"),  # window holds only t=9's 2; -1 pod per 2 s floors it at 3
    (13, 20, 2, "ScaleDownStabilized"),  # ceil(20 / 50) = 1; the window holds t=11's 2
    (15, 20, 1, "DesiredWithinRange"),  # the window holds t=13's 1; -1 pod per 2 s from 2 allows 1
]
KEDA = ScalerSpec(
    triggers=(Trigger("gpu", MetricTarget("gpu", MetricKind.AVERAGE_VALUE, TARGET), activation=55),),
    min_replicas=0,
    max_replicas=10,
    polling_interval_s=2,
    cooldown_s=3,
    behavior=SPEC.behavior,
)
KEDA_EXPECTED = [
    # (t, replicas after the poll): from zero, activation at > 55, the same HPA behaviour, cooldown 3 s to zero
    (1, 0),  # 50 is not > 55: idle at 0
    (3, 1),  # 200 > 55: activated, 0 -> 1
    (5, 3),  # ceil(200 / 50) = 4; +2 pods per 4 s from 1 caps at 3
    (7, 3),  # the t=5 event is still inside the 4 s period: capped at 3
    (9, 3),  # 60 > 55 still active; ceil(60 / 50) = 2 but the 3 s window holds t=7's 4: stays 3
    (11, 2),  # the window holds t=9's 2; -1 pod per 2 s from 3 allows 2
    (13, 2),  # 20: inactive, last active at t=11, cooldown until 14; the window holds t=11's 2
    (15, 0),  # inactive past the cooldown: to zero
]


@dataclass
class SimDeployment:
    """A deployment whose pods are all ready at once; records every scale."""

    replicas: int
    history: list[tuple[float, int]] = field(default_factory=list)

    def scale(self, t: float, replicas: int) -> None:
        if replicas != self.replicas:
            self.history.append((t, replicas))
        self.replicas = replicas


def curve() -> str:
    points = [f"0:{UTIL[0]}"]
    for i, u in enumerate(UTIL):
        points += [f"{WARMUP_S + i * PLATEAU_S + 0.01:g}:{u}", f"{WARMUP_S + (i + 1) * PLATEAU_S:g}:{u}"]
    return ",".join(points)


def _sample(source: MetricSource, query: str) -> Sample:
    try:
        return Sample(source.value(query))
    except MetricsError as exc:  # a failed metric: the HPA keeps the current count and the loop tries next poll
        return Sample(None, note=str(exc))


def _reading(source: MetricSource, query: str) -> float | None:
    """A KEDA trigger's reading: the value, EMPTY for no sample (ignoreNullValues decides), None for a failure."""
    try:
        return source.value(query)
    except NoData:
        return EMPTY
    except MetricsError:
        return None


@dataclass
class Played:
    """What each scaler saw and did at each poll."""

    hpa: list[tuple[int, float | None, int, str]]
    """(t, value read, replicas after the poll, HPA condition)"""
    keda: list[tuple[int, int]]
    """(t, replicas after the poll)"""
    hpa_deployment: SimDeployment
    keda_deployment: SimDeployment


def play(client: PrometheusClient, tmp_path: Path, port: int) -> Played:
    """Start the agent on ``port`` (a target the Prometheus behind ``client`` already scrapes), then poll in the
    middle of each plateau: the HPA scales one simulated deployment (from 1), the KEDA scaler another (from 0)."""
    args = [
        "--simulate",
        "--gpus",
        "2",
        "--model",
        "l4",
        "--curve",
        curve(),
        "--hostname",
        HOSTNAME,
        "--port",
        str(port),
    ]
    with agent(tmp_path, args) as a:
        wait_for(lambda: client.query(QUERY), timeout=WARMUP_S)
        hpa_deployment, keda_deployment = SimDeployment(replicas=1), SimDeployment(replicas=0)
        hpa_state, keda_state = HpaState(), ScalerState()
        seen: list[tuple[int, float | None, int, str]] = []
        keda_seen: list[tuple[int, int]] = []
        for i, (t, *_) in enumerate(EXPECTED):
            delay = a.started + WARMUP_S + (i + 0.5) * PLATEAU_S - time.time()
            assert delay > 0.2, f"fell behind the curve by {-delay:.2f}s"
            time.sleep(delay)
            sample = _sample(client, QUERY)
            n = hpa_deployment.replicas
            decision = decide(SPEC, n, {"gpu": sample}, PodCounts(n), hpa_state, float(t))
            hpa_state = decision.state
            hpa_deployment.scale(t, decision.desired)
            seen.append((t, sample.value, hpa_deployment.replicas, decision.condition))
            n = keda_deployment.replicas
            k = step(KEDA, keda_state, n, {"gpu": _reading(client, QUERY)}, PodCounts(n), float(t))
            keda_state = k.state
            keda_deployment.scale(t, k.desired)
            keda_seen.append((t, keda_deployment.replicas))
    return Played(seen, keda_seen, hpa_deployment, keda_deployment)
