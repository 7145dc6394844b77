"""``gpuscale.io/v1alpha1`` ``GPUNodePool`` -> :class:`gpuscale.core.model.NodePool` (strict: unknown fields are
errors). The schema is documented in ``docs/snapshot-format.md`` and published as ``deploy/crds/gpunodepool.yaml``;
the field tables below are the single list both are checked against.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gpuscale.core import labels as L
from gpuscale.core.model import (
    CapacityType,
    ConsolidationPolicy,
    Disruption,
    DisruptionBudget,
    InstanceType,
    NodePool,
    PoolLimits,
    Requirement,
    Taint,
)
from gpuscale.core.resources import GPU_RESOURCE, Resources
from gpuscale.manifests.fields import (
    as_bool,
    as_float,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_fields,
    choice,
    fields_of,
    metadata_and_spec,
    requirement,
    str_list,
    str_map,
    taint,
)
from gpuscale.manifests.problems import Doc, FieldError, close_matches, did_you_mean
from gpuscale.manifests.quantity import DURATION_HELP, QUANTITY_HELP, cpu_milli, memory_mib, parse_duration, whole_count

TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
SPEC_FIELDS = (
    "instanceTypes",
    "requirements",
    "labels",
    "taints",
    "minNodes",
    "maxNodes",
    "limits",
    "weight",
    "capacityTypes",
    "zones",
    "daemonsetOverhead",
    "allowSpotFallback",
    "disruption",
)
LIMIT_FIELDS = ("cpu", "memory", GPU_RESOURCE)
OVERHEAD_FIELDS = ("cpu", "memory", "pods")
POOL_TAINT_FIELDS = ("key", "value", "effect")
DISRUPTION_FIELDS = (
    "consolidationPolicy",
    "consolidateAfter",
    "consolidateEmptyAfter",
    "utilizationThreshold",
    "useMeasuredGpuUtilization",
    "budgets",
    "terminationGracePeriod",
)
BUDGET_FIELDS = ("nodes", "schedule", "duration", "reasons")
BUDGET_REASONS = ("Empty", "Underutilized", "Drifted")
MAX_WEIGHT = 100

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_BUDGET_NODES = re.compile(r"^((100|[0-9]{1,2})%|[0-9]+)$")


def read_pool(
    doc: Doc, obj: dict[str, Any], types: Mapping[str, InstanceType], zones: frozenset[str]
) -> NodePool | None:
    """The core NodePool of a GPUNodePool document; None if it has problems (reported to ``doc``).

    ``types`` is the catalog by name (instance type names are checked against it); ``zones`` the catalog's zones.
    """
    meta, spec = metadata_and_spec(doc, obj, TOP_FIELDS)
    name = ""
    with doc.field():
        name = as_str(meta.get("name"), "metadata.name", required=True)
        doc.name = name
        if len(name) > 63 or not _NAME.match(name):
            raise FieldError(
                "metadata.name",
                "must be a valid label value (it becomes the gpuscale.io/pool label)",
                name,
                fix="use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit",
            )
    check_fields(doc, spec, "spec", SPEC_FIELDS)

    instance_types: tuple[str, ...] = ()
    with doc.field():
        instance_types = str_list(spec.get("instanceTypes"), "spec.instanceTypes")
    for i, it in enumerate(instance_types):
        if it not in types:
            hits = close_matches(it, types, n=5)
            fix = f"close matches: {', '.join(hits)}" if hits else "list its types: gpuscale catalog show CATALOG"
            doc.error(f"spec.instanceTypes[{i}]", f"is not an instance type of the catalog in pool {name!r}", it, fix)

    requirements: list[Requirement] = []
    with doc.field():
        for i, raw in enumerate(as_list(spec.get("requirements"), "spec.requirements")):
            r = requirement(doc, raw, f"spec.requirements[{i}]", allowed_keys=L.TEMPLATE_KEYS)
            if r is not None:
                requirements.append(r)

    labels: dict[str, str] = {}
    with doc.field():
        labels = str_map(spec.get("labels"), "spec.labels")
    for key in labels:
        if key in L.TEMPLATE_KEYS:
            doc.error(
                f"spec.labels.{key}",
                "is set by gpuscale from the instance type and offering",
                key,
                fix="restrict it with spec.requirements instead",
            )

    taints: list[Taint] = []
    with doc.field():
        for i, raw in enumerate(as_list(spec.get("taints"), "spec.taints")):
            t = taint(doc, raw, f"spec.taints[{i}]", allowed=POOL_TAINT_FIELDS)
            if t is not None:
                taints.append(t)

    min_nodes, max_nodes, weight = 0, None, 0
    with doc.field():
        if spec.get("minNodes") is not None:
            min_nodes = as_int(spec.get("minNodes"), "spec.minNodes", minimum=0)
    with doc.field():
        if spec.get("maxNodes") is not None:
            max_nodes = as_int(spec.get("maxNodes"), "spec.maxNodes", minimum=0)
            if max_nodes < min_nodes:
                raise FieldError("spec.maxNodes", f"is below spec.minNodes ({min_nodes})", max_nodes)
    with doc.field():
        if spec.get("weight") is not None:
            weight = as_int(spec.get("weight"), "spec.weight", minimum=0, maximum=MAX_WEIGHT)

    capacity_types: tuple[CapacityType, ...] = ()
    with doc.field():
        names = str_list(spec.get("capacityTypes"), "spec.capacityTypes")
        options = [str(c) for c in CapacityType]
        capacity_types = tuple(
            CapacityType(choice(c, f"spec.capacityTypes[{i}]", options)) for i, c in enumerate(names)
        )

    pool_zones: tuple[str, ...] = ()
    with doc.field():
        pool_zones = str_list(spec.get("zones"), "spec.zones")
    for i, z in enumerate(pool_zones):
        if zones and z not in zones:
            doc.error(f"spec.zones[{i}]", "is not a zone of any offering in the catalog", z, did_you_mean(z, zones))

    limits = _limits(doc, spec.get("limits"))
    overhead = _overhead(doc, spec.get("daemonsetOverhead"))
    allow_fallback = True
    with doc.field():
        if spec.get("allowSpotFallback") is not None:
            allow_fallback = as_bool(spec.get("allowSpotFallback"), "spec.allowSpotFallback")
    disruption = _disruption(doc, spec.get("disruption"))

    if doc.failed:
        return None
    return NodePool(
        name=name,
        instance_types=instance_types,
        requirements=tuple(requirements),
        labels=labels,
        taints=tuple(taints),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        limits=limits,
        weight=weight,
        capacity_types=capacity_types,
        zones=pool_zones,
        daemonset_overhead=overhead,
        disruption=disruption,
        allow_spot_fallback=allow_fallback,
    )


def _quantities(doc: Doc, raw: object, path: str, allowed: tuple[str, ...], readers: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    m = fields_of(doc, raw, path, allowed)
    if m is None:
        return out
    for key in allowed:
        if m.get(key) is None:
            continue
        with doc.field():
            try:
                out[key] = readers[key](m[key])
            except ValueError as exc:
                raise FieldError(f"{path}.{key}", str(exc), m[key], fix=QUANTITY_HELP) from None
    return out


def _limits(doc: Doc, raw: object) -> PoolLimits:
    readers = {
        "cpu": lambda v: cpu_milli(v, round_up=False),
        "memory": lambda v: memory_mib(v, round_up=False),
        GPU_RESOURCE: whole_count,
    }
    got = _quantities(doc, raw, "spec.limits", LIMIT_FIELDS, readers)
    return PoolLimits(cpu_milli=got.get("cpu"), memory_mib=got.get("memory"), gpus=got.get(GPU_RESOURCE))


def _overhead(doc: Doc, raw: object) -> Resources:
    readers = {"cpu": cpu_milli, "memory": memory_mib, "pods": whole_count}
    got = _quantities(doc, raw, "spec.daemonsetOverhead", OVERHEAD_FIELDS, readers)
    return Resources(cpu_milli=got.get("cpu", 0), memory_mib=got.get("memory", 0), pods=got.get("pods", 0))


def _duration(value: object, path: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise FieldError(path, str(exc), value, fix=DURATION_HELP) from None


def _disruption(doc: Doc, raw: object) -> Disruption:
    default = Disruption()
    try:
        m = as_mapping(raw, "spec.disruption")
    except FieldError as err:
        doc.report(err)
        return default
    check_fields(doc, m, "spec.disruption", DISRUPTION_FIELDS)
    policy = default.consolidation_policy
    after = default.consolidate_after_s
    empty_after = default.consolidate_empty_after_s
    threshold = default.utilization_threshold
    measured = default.use_measured_gpu_utilization
    budgets = default.budgets
    grace = default.termination_grace_period_s
    with doc.field():
        if m.get("consolidationPolicy") is not None:
            options = [str(p) for p in ConsolidationPolicy]
            policy = ConsolidationPolicy(
                choice(m["consolidationPolicy"], "spec.disruption.consolidationPolicy", options)
            )
    with doc.field():
        if m.get("consolidateAfter") is not None:
            value = m["consolidateAfter"]
            after = math.inf if value == "Never" else _duration(value, "spec.disruption.consolidateAfter")
    with doc.field():
        if m.get("consolidateEmptyAfter") is not None:
            value = m["consolidateEmptyAfter"]
            path = "spec.disruption.consolidateEmptyAfter"
            empty_after = math.inf if value == "Never" else _duration(value, path)
    with doc.field():
        if m.get("utilizationThreshold") is not None:
            path = "spec.disruption.utilizationThreshold"
            threshold = as_float(m["utilizationThreshold"], path, minimum=0.0, maximum=1.0)
    with doc.field():
        if m.get("useMeasuredGpuUtilization") is not None:
            measured = as_bool(m["useMeasuredGpuUtilization"], "spec.disruption.useMeasuredGpuUtilization")
    with doc.field():
        if "budgets" in m:
            items = as_list(m["budgets"], "spec.disruption.budgets")
            budgets = tuple(
                b for i, raw_b in enumerate(items) if (b := _budget(doc, raw_b, f"spec.disruption.budgets[{i}]"))
            )
    with doc.field():
        if m.get("terminationGracePeriod") is not None:
            grace = _duration(m["terminationGracePeriod"], "spec.disruption.terminationGracePeriod")
    return Disruption(
        termination_grace_period_s=grace,
        consolidation_policy=policy,
        consolidate_after_s=after,
        consolidate_empty_after_s=empty_after,
        budgets=budgets,
        utilization_threshold=threshold,
        use_measured_gpu_utilization=measured,
    )


def _budget(doc: Doc, raw: object, path: str) -> DisruptionBudget | None:
    before = len(doc.problems)
    m = fields_of(doc, raw, path, BUDGET_FIELDS)
    if m is None:
        return None
    nodes = "10%"
    schedule: str | None = None
    duration: float | None = None
    reasons: tuple[str, ...] = ()
    with doc.field():
        value = m.get("nodes", "10%")
        nodes = as_str(value, f"{path}.nodes", required=True)
        if not _BUDGET_NODES.match(nodes):
            raise FieldError(f"{path}.nodes", "must be a node count or a percentage", value, fix='e.g. "10%" or "2"')
    with doc.field():
        if m.get("schedule") is not None:
            schedule = as_str(m["schedule"], f"{path}.schedule", required=True)
            problem = cron_problem(schedule)
            if problem:
                raise FieldError(
                    f"{path}.schedule", problem, schedule, fix='use 5 cron fields (UTC), e.g. "0 9 * * 1-5"'
                )
    with doc.field():
        if m.get("duration") is not None:
            duration = _duration(m["duration"], f"{path}.duration")
    if (schedule is None) != (duration is None) and len(doc.problems) == before:
        doc.error(
            path, "schedule and duration must be set together", fix="set both, or neither for an always-on budget"
        )
    with doc.field():
        reasons = str_list(m.get("reasons"), f"{path}.reasons")
        for i, r in enumerate(reasons):
            choice(r, f"{path}.reasons[{i}]", BUDGET_REASONS)
    if len(doc.problems) > before:
        return None
    return DisruptionBudget(nodes=nodes, schedule=schedule, duration_s=duration, reasons=reasons)


_CRON_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of week", 0, 7, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
_CRON_PART = re.compile(r"^(?:(\*)|([A-Za-z0-9]{1,9})(?:-([A-Za-z0-9]{1,9}))?)(?:/([0-9]{1,4}))?$")


def cron_problem(expr: str) -> str | None:
    """None if ``expr`` is a valid 5-field cron expression (or macro), else what is wrong with it."""
    text = expr.strip()
    if text in _CRON_MACROS:
        return None
    fields = text.split()
    if len(fields) != len(_CRON_FIELDS):
        return f"a cron schedule has 5 fields, this has {len(fields)}"
    for value, (label, lo, hi, names) in zip(fields, _CRON_FIELDS, strict=True):
        for part in value.split(","):
            m = _CRON_PART.match(part)
            if m is None:
                return f"invalid {label} field {value!r}"
            if m[4] is not None and int(m[4]) == 0:
                return f"step 0 in {label} field {value!r}"
            for token in (m[2], m[3]):
                if token is None:
                    continue
                if token.upper() in names:
                    continue
                if not (token.isascii() and token.isdigit()) or not lo <= int(token) <= hi:
                    return f"{label} must be {lo}..{hi}, got {token!r}"
    return None
