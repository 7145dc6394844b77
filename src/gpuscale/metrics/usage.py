"""Usage history for right-sizing from Prometheus: :class:`PrometheusUsage` reads containers' CPU and memory and
workloads' GPU memory through any :class:`~gpuscale.metrics.prometheus.MetricSource` (range queries over cAdvisor and
DCGM exporter metrics). Here (not in ``gpuscale.scaling``) so the in-cluster controller can use it too; the USAGE.yaml
reader is ``gpuscale.scaling.usage.FileUsage``, which re-exports these names.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuscale.core.autoscale.rightsize import ContainerUsage, GpuUsage

if TYPE_CHECKING:  # the client needs httpx; the types do not
    from gpuscale.metrics.prometheus import MetricSource, Series

__all__ = ["PrometheusUsage", "Usage", "UsageSource", "workload_of"]


@dataclass(frozen=True, slots=True)
class Usage:
    containers: tuple[ContainerUsage, ...]
    gpus: tuple[GpuUsage, ...]


class UsageSource(Protocol):
    """Anything that yields usage history for right-sizing."""

    def usage(self) -> Usage: ...


# --------------------------------------------------------------------------------------------------- prometheus
_POD = re.compile(r"^(?P<name>.+?)(?:-[a-z0-9]{6,10}-[a-z0-9]{5}|-[0-9]+)$")


def workload_of(pod: str) -> str:
    """The Deployment (``name-<hash>-<id>``) or StatefulSet (``name-<n>``) a pod belongs to; the pod otherwise."""
    m = _POD.match(pod)
    return m["name"] if m else pod


class PrometheusUsage:
    """Usage over ``[end - window, end]`` from any :class:`MetricSource`: cAdvisor's container CPU and working-set
    memory, and the DCGM exporter's framebuffer memory, by pod; pods are grouped into their workloads."""

    CPU = 'sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{{{sel},container!="",container!="POD"}}[5m]))'  # noqa: E501
    MEMORY = 'sum by (namespace, pod, container) (container_memory_working_set_bytes{{{sel},container!="",container!="POD"}})'  # noqa: E501
    GPU_USED = "max by (namespace, pod) (DCGM_FI_DEV_FB_USED{{{sel}}})"
    GPU_TOTAL = "max by (namespace, pod) (DCGM_FI_DEV_FB_USED{{{sel}}} + DCGM_FI_DEV_FB_FREE{{{sel}}})"
    GPU_COUNT = "count by (namespace, pod) (DCGM_FI_DEV_FB_USED{{{sel}}})"

    def __init__(self, source: MetricSource, *, namespace: str | None, end: float, window_s: float,
                 step_s: float = 60.0) -> None:  # fmt: skip
        self.source = source
        self.selector = f"namespace={_quote(namespace)}" if namespace else 'namespace!=""'
        self.start, self.end, self.step = end - window_s, end, step_s

    def _range(self, template: str) -> list[Series]:
        return self.source.usage(template.format(sel=self.selector), self.start, self.end, self.step)

    def usage(self) -> Usage:
        cpu: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        mem: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        names: dict[str, set[str]] = defaultdict(set)
        for series, into, scale in ((self._range(self.CPU), cpu, 1.0), (self._range(self.MEMORY), mem, 1 / 2**20)):
            for s in series:
                key = _key(s.labels)
                container = s.labels.get("container", "")
                names[key].add(container)
                into[(key, container)].extend((t, v * scale) for t, v in s.points if math.isfinite(v))
        containers = tuple(
            ContainerUsage(key, c, sorted(cpu.get((key, c), [])), sorted(mem.get((key, c), [])), len(names[key]))
            for key in sorted(names)
            for c in sorted(names[key])
        )
        used: dict[str, list[tuple[float, float]]] = defaultdict(list)
        total: dict[str, float] = {}
        count: dict[str, int] = {}
        for s in self._range(self.GPU_USED):
            used[_key(s.labels)].extend((t, v) for t, v in s.points if math.isfinite(v))
        for s in self._range(self.GPU_TOTAL):
            values = [v for _, v in s.points if math.isfinite(v)]
            if values:
                total[_key(s.labels)] = max(total.get(_key(s.labels), 0.0), max(values))
        for s in self._range(self.GPU_COUNT):
            values = [v for _, v in s.points if math.isfinite(v)]
            if values:
                count[_key(s.labels)] = max(count.get(_key(s.labels), 0), int(max(values)))
        gpus = tuple(
            GpuUsage(k, sorted(used[k]), total[k], count.get(k, 1)) for k in sorted(used) if total.get(k, 0) > 0
        )
        return Usage(containers, gpus)


def _quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _key(labels: Mapping[str, Any]) -> str:
    return f"{labels.get('namespace', '')}/{workload_of(str(labels.get('pod', '')))}"
