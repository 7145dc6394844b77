"""Where right-sizing gets usage history: a :class:`UsageSource` returns containers' CPU and memory samples and
workloads' GPU memory samples. Two sources: a USAGE.yaml file (:class:`FileUsage`) and any
:class:`~gpuscale.metrics.prometheus.MetricSource` (:class:`PrometheusUsage`, range queries over cAdvisor and DCGM
exporter metrics).

USAGE.yaml::

    workloads:
      - name: llama-70b             # the Deployment (or StatefulSet)
        namespace: inference
        gpusPerPod: 1
        gpuMemoryMiB: 81920          # memory of one GPU
        gpuMemory: [[0, 61000], [3600, 64000]]   # [t, MiB used per GPU]
        containers:
          - name: server
            requests: {cpu: "4", memory: 16Gi}
            minAllowed: {cpu: 500m}
            maxAllowed: {memory: 64Gi}
            samples: [[0, 1.5, 12000], [60, 1.7, 12100]]   # [t seconds, CPU cores, memory MiB]
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuscale.core.autoscale.rightsize import ContainerUsage, GpuUsage, Limits
from gpuscale.errors import InputError
from gpuscale.inputs import load_yaml_text, read_text
from gpuscale.manifests import _locator
from gpuscale.manifests.fields import as_float, as_int, as_list, as_mapping, as_str, check_fields
from gpuscale.manifests.problems import Doc, FieldError, ManifestError
from gpuscale.manifests.quantity import QUANTITY_HELP, cpu_milli, memory_mib

if TYPE_CHECKING:  # the client needs httpx; reading a usage file does not
    from gpuscale.metrics.prometheus import MetricSource, Series

TOP_FIELDS = ("workloads",)
WORKLOAD_FIELDS = ("name", "namespace", "gpusPerPod", "gpuMemoryMiB", "gpuMemory", "containers")
CONTAINER_FIELDS = ("name", "requests", "minAllowed", "maxAllowed", "samples")
RESOURCE_FIELDS = ("cpu", "memory")
MAX_SAMPLES = 2_000_000
MAX_T = 86_400.0 * 3660
MAX_VALUE = 1e12


@dataclass(frozen=True, slots=True)
class Usage:
    containers: tuple[ContainerUsage, ...]
    gpus: tuple[GpuUsage, ...]


class UsageSource(Protocol):
    """Anything that yields usage history for right-sizing."""

    def usage(self) -> Usage: ...


# --------------------------------------------------------------------------------------------------------- file
class FileUsage:
    """A USAGE.yaml file (see the module docstring), read through the guarded loader."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def usage(self) -> Usage:
        source = str(self.path)
        data, node = load_yaml_text(read_text(self.path, what="usage file"), source=source)
        problems: list[InputError] = []
        doc = Doc(source, 1, 1, problems, locate=_locator(node) if node is not None else None)
        containers: list[ContainerUsage] = []
        gpus: list[GpuUsage] = []
        try:
            top = as_mapping(data, "")
            if data is None:
                raise FieldError("workloads", "is required", fix="list the workloads: workloads: [{name: ...}]")
            check_fields(doc, top, "", TOP_FIELDS)
            items = as_list(top.get("workloads"), "workloads")
            if not items:
                raise FieldError("workloads", "must list at least one workload")
            for i, raw in enumerate(items):
                with doc.field():
                    _workload(doc, raw, f"workloads[{i}]", containers, gpus)
                if len(problems) > 50:
                    break
        except FieldError as err:
            doc.report(err)
        if problems:
            raise ManifestError(source, problems)
        return Usage(tuple(containers), tuple(gpus))


def _workload(doc: Doc, raw: object, path: str, containers: list[ContainerUsage], gpus: list[GpuUsage]) -> None:
    before = len(doc.problems)
    m = as_mapping(raw, path)
    check_fields(doc, m, path, WORKLOAD_FIELDS)
    name = namespace = ""
    gpus_per_pod, total = 0, 0.0
    with doc.field():
        name = as_str(m.get("name"), f"{path}.name", required=True)
    with doc.field():
        namespace = as_str(m.get("namespace"), f"{path}.namespace") or "default"
    with doc.field():
        if m.get("gpusPerPod") is not None:
            gpus_per_pod = as_int(m["gpusPerPod"], f"{path}.gpusPerPod", minimum=0, maximum=64)
    with doc.field():
        if m.get("gpuMemoryMiB") is not None:
            total = as_float(m["gpuMemoryMiB"], f"{path}.gpuMemoryMiB", minimum=1.0, maximum=MAX_VALUE)
    gpu_samples = _samples(doc, m.get("gpuMemory"), f"{path}.gpuMemory", 2)
    if gpu_samples and not total:
        doc.error(f"{path}.gpuMemoryMiB", "is required with gpuMemory samples", fix="give one GPU's memory in MiB")
    key = f"{namespace}/{name}"
    rows: list[tuple[str, Limits, Limits, Limits, list[tuple[float, ...]]]] = []
    with doc.field():
        items = as_list(m.get("containers"), f"{path}.containers")
        if not items:
            raise FieldError(f"{path}.containers", "must list at least one container")
        for j, c in enumerate(items):
            got = _container(doc, c, f"{path}.containers[{j}]")
            if got is not None:
                rows.append(got)
    if len(doc.problems) > before:
        return
    for cname, req, lo, hi, samples in rows:
        cpu = [(s[0], s[1]) for s in samples]
        mem = [(s[0], s[2]) for s in samples]
        containers.append(ContainerUsage(key, cname, cpu, mem, len(rows), req, lo, hi))
    if gpu_samples:
        gpus.append(GpuUsage(key, [(s[0], s[1]) for s in gpu_samples], total, max(gpus_per_pod, 1)))


def _container(doc: Doc, raw: object, path: str) -> tuple[str, Limits, Limits, Limits, list[tuple[float, ...]]] | None:
    before = len(doc.problems)
    try:
        m = as_mapping(raw, path)
    except FieldError as err:
        doc.report(err)
        return None
    check_fields(doc, m, path, CONTAINER_FIELDS)
    name = ""
    with doc.field():
        name = as_str(m.get("name"), f"{path}.name", required=True)
    limits = [_resources(doc, m.get(k), f"{path}.{k}") for k in ("requests", "minAllowed", "maxAllowed")]
    lo, hi = limits[1], limits[2]
    for res in ("cpu_milli", "memory_mib"):
        a, b = getattr(lo, res), getattr(hi, res)
        if a is not None and b is not None and a > b:
            doc.error(f"{path}.maxAllowed", f"is below minAllowed ({res.split('_')[0]})", fix="swap or widen them")
    samples = _samples(doc, m.get("samples"), f"{path}.samples", 3)
    if not samples and len(doc.problems) == before:
        doc.error(f"{path}.samples", "is required", fix="list [t seconds, CPU cores, memory MiB] rows")
    if len(doc.problems) > before:
        return None
    return name, limits[0], lo, hi, samples


def _resources(doc: Doc, raw: object, path: str) -> Limits:
    try:
        m = as_mapping(raw, path)
    except FieldError as err:
        doc.report(err)
        return Limits()
    check_fields(doc, m, path, RESOURCE_FIELDS)
    got: dict[str, float] = {}
    for key, reader in (("cpu", cpu_milli), ("memory", memory_mib)):
        if m.get(key) is None:
            continue
        with doc.field():
            try:
                got[key] = float(reader(m[key]))
            except ValueError as exc:
                raise FieldError(f"{path}.{key}", str(exc), m[key], fix=QUANTITY_HELP) from None
    return Limits(got.get("cpu"), got.get("memory"))


def _samples(doc: Doc, raw: object, path: str, width: int) -> list[tuple[float, ...]]:
    out: list[tuple[float, ...]] = []
    try:
        rows = as_list(raw, path)
    except FieldError as err:
        doc.report(err)
        return out
    if len(rows) > MAX_SAMPLES:
        doc.error(path, f"has more than {MAX_SAMPLES:,} samples", fix="sample less often")
        return out
    for i, row in enumerate(rows):
        where = f"{path}[{i}]"
        if not isinstance(row, list) or len(row) != width:
            doc.error(where, f"must be a list of {width} numbers", row,
                      fix="[t, CPU cores, memory MiB]" if width == 3 else "[t, GPU memory MiB]")  # fmt: skip
            return out
        try:
            t = as_float(row[0], f"{where}[0]", minimum=0.0, maximum=MAX_T)
            values = [as_float(v, f"{where}[{k + 1}]", minimum=0.0, maximum=MAX_VALUE) for k, v in enumerate(row[1:])]
        except FieldError as err:
            doc.report(err)
            return out
        out.append((t, *values))
    return out


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
