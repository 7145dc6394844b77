"""Where right-sizing gets usage history: a :class:`UsageSource` returns containers' CPU and memory samples and
workloads' GPU memory samples. Two sources: a USAGE.yaml file (:class:`FileUsage`) and any
:class:`~gpuscale.metrics.prometheus.MetricSource` (:class:`PrometheusUsage`, range queries over cAdvisor and DCGM
exporter metrics; it lives in :mod:`gpuscale.metrics.usage`, re-exported here).

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

from pathlib import Path

from gpuscale.core.autoscale.rightsize import ContainerUsage, GpuUsage, Limits
from gpuscale.errors import InputError
from gpuscale.inputs import load_yaml_text, read_text
from gpuscale.manifests import _locator
from gpuscale.manifests.fields import as_float, as_int, as_list, as_mapping, as_str, check_fields, fields_of
from gpuscale.manifests.problems import Doc, FieldError, ManifestError
from gpuscale.manifests.quantity import QUANTITY_HELP, cpu_milli, memory_mib
from gpuscale.metrics.usage import PrometheusUsage, Usage, UsageSource, workload_of

__all__ = ["FileUsage", "PrometheusUsage", "Usage", "UsageSource", "workload_of"]

TOP_FIELDS = ("workloads",)
WORKLOAD_FIELDS = ("name", "namespace", "gpusPerPod", "gpuMemoryMiB", "gpuMemory", "containers")
CONTAINER_FIELDS = ("name", "requests", "minAllowed", "maxAllowed", "samples")
RESOURCE_FIELDS = ("cpu", "memory")
MAX_SAMPLES = 2_000_000
MAX_T = 86_400.0 * 3660
MAX_VALUE = 1e12


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
    m = fields_of(doc, raw, path, CONTAINER_FIELDS)
    if m is None:
        return None
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
