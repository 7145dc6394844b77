"""Usage history for right-sizing, read from Prometheus through any :class:`MetricSource`.

CPU and memory come from the kubelet's cAdvisor metrics (``container_cpu_usage_seconds_total`` as a rate,
``container_memory_working_set_bytes``, the series the VPA recommender reads), GPU memory from the DCGM fields the
agent (or NVIDIA's exporter) writes. Samples of every pod matching the selector are pooled, as the VPA pools a
workload's containers: the result is ``(t, value)`` pairs in time order.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscale.errors import InputError
from gpuscale.metrics.prometheus import MetricSource, Series

CPU_SECONDS = "container_cpu_usage_seconds_total"
MEMORY_BYTES = "container_memory_working_set_bytes"
MIB = 1024.0 * 1024.0


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(frozen=True, slots=True)
class Workload:
    """The pods of one workload: ``namespace``, a ``pods`` regular expression (PromQL ``=~``, anchored) and
    optionally one ``container``."""

    namespace: str
    pods: str
    container: str = ""

    def __post_init__(self) -> None:
        if not self.namespace or not self.pods:
            raise InputError("a workload needs a namespace and a pod pattern", value=(self.namespace, self.pods))

    def selector(self, *, container: bool = True) -> str:
        """The PromQL label matchers."""
        parts = [f"namespace={_quote(self.namespace)}", f"pod=~{_quote(self.pods)}"]
        if container and self.container:
            parts.append(f"container={_quote(self.container)}")
        return "{" + ",".join(parts) + "}"


def _pooled(series: list[Series], scale: float = 1.0) -> list[tuple[float, float]]:
    return sorted((t, v * scale) for s in series for t, v in s.points)


def cpu_cores(
    source: MetricSource, w: Workload, start: float, end: float, step: float, rate_window: str = "5m"
) -> list[tuple[float, float]]:
    """CPU use in cores of every matching container, every ``step`` seconds."""
    query = f"rate({CPU_SECONDS}{w.selector()}[{rate_window}])"
    return _pooled(source.usage(query, start, end, step))


def memory_mib(source: MetricSource, w: Workload, start: float, end: float, step: float) -> list[tuple[float, float]]:
    """Working-set memory in MiB of every matching container, every ``step`` seconds."""
    return _pooled(source.usage(f"{MEMORY_BYTES}{w.selector()}", start, end, step), 1 / MIB)


def gpu_memory(
    source: MetricSource, w: Workload, start: float, end: float, step: float
) -> tuple[list[tuple[float, float]], float | None]:
    """GPU memory used (MiB per GPU) by the workload's pods, and the GPU's memory (the largest ``FB_USED + FB_FREE``
    seen; None without samples). DCGM labels pods but not always containers, so the container is not matched."""
    sel = w.selector(container=False)
    used = _pooled(source.usage(f"DCGM_FI_DEV_FB_USED{sel}", start, end, step))
    totals = _pooled(source.usage(f"DCGM_FI_DEV_FB_USED{sel} + DCGM_FI_DEV_FB_FREE{sel}", start, end, step))
    return used, max((v for _, v in totals), default=None)
