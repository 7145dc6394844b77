"""``GPUWorkloadScaler`` and ``GPUBudget`` (``gpuscale.io/v1alpha1``), and KEDA ``ScaledObject`` pasted as is, into
the core's :class:`~gpuscale.core.autoscale.keda.ScalerSpec` and :class:`~gpuscale.core.autoscale.budget.Budget`.

Strict: unknown fields are errors (with close matches), every problem of a file is reported at once with its
file:line and fix. Triggers keep KEDA's layout: ``metadata`` values are strings, as KEDA writes them. Besides
``type: prometheus`` (any PromQL query), ``type: dcgm`` names a DCGM exporter metric (:data:`DCGM_SHORTCUTS`) and
gpuscale writes the per-pod average query for the target. The field tables below are the single list the CRDs
(``deploy/crds/gpuworkloadscaler.yaml``, ``deploy/crds/gpubudget.yaml``) are tested against.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscale.core.autoscale.budget import Budget, ModelShare
from gpuscale.core.autoscale.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    DEFAULT_TOLERANCE,
    Behavior,
    MetricKind,
    MetricTarget,
    PolicyType,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
)
from gpuscale.core.autoscale.keda import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_MAX_REPLICAS,
    DEFAULT_POLLING_INTERVAL_S,
    Fallback,
    ScalerSpec,
    Schedule,
    Trigger,
)
from gpuscale.core.autoscale.rightsize_update import RightsizePolicy
from gpuscale.core.cron import CronSchedule, parse_cron
from gpuscale.errors import InputError
from gpuscale.inputs import read_text
from gpuscale.manifests import read_documents
from gpuscale.manifests.fields import (
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_fields,
    choice,
    fields_of,
    metadata_and_spec,
)
from gpuscale.manifests.problems import Doc, FieldError, ManifestError, did_you_mean
from gpuscale.manifests.rightsizing import read_rightsizing

API_VERSION = "gpuscale.io/v1alpha1"
KEDA_API_VERSION = "keda.sh/v1alpha1"
SCALER_KIND = "GPUWorkloadScaler"
BUDGET_KIND = "GPUBudget"
KEDA_KIND = "ScaledObject"
MAX_REPLICAS = 100_000
MAX_SECONDS = 86_400 * 365
MAX_VALUE = 1e15

TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
KEDA_SPEC_FIELDS = (
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
    "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers",
)  # fmt: skip
OWN_SPEC_FIELDS = ("behavior", "schedules", "priority", "gpuBudget", "rightsizing")
SPEC_FIELDS = (*KEDA_SPEC_FIELDS, *OWN_SPEC_FIELDS)
TARGET_FIELDS = ("apiVersion", "kind", "name", "envSourceContainerName")
FALLBACK_FIELDS = ("failureThreshold", "replicas", "behavior")
ADVANCED_FIELDS = ("horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount", "scalingModifiers")
HPA_CONFIG_FIELDS = ("name", "behavior")
BEHAVIOR_FIELDS = ("scaleUp", "scaleDown")
RULES_FIELDS = ("stabilizationWindowSeconds", "selectPolicy", "policies", "tolerance")
POLICY_FIELDS = ("type", "value", "periodSeconds")
TRIGGER_FIELDS = ("type", "name", "metadata", "metricType", "authenticationRef", "useCachedMetrics")
TRIGGER_TYPES = ("prometheus", "dcgm")
METRIC_TYPES = ("AverageValue", "Value")
PROMETHEUS_METADATA = (
    "serverAddress", "query", "threshold", "activationThreshold", "ignoreNullValues", "namespace", "customHeaders",
    "unsafeSsl", "queryParameters", "timeout", "authModes",
)  # fmt: skip
DCGM_METADATA = ("metric", "threshold", "activationThreshold", "serverAddress", "ignoreNullValues")
SCHEDULE_FIELDS = ("name", "start", "end", "timezone", "desiredReplicas")
GPU_BUDGET_REF_FIELDS = ("name", "model", "gpusPerReplica")
BUDGET_SPEC_FIELDS = ("totalGPUs", "elasticShare", "models")
MODEL_FIELDS = ("name", "guaranteedGPUs")
DEFAULT_SERVER = "http://prometheus-operated.monitoring:9090"

_FB_USED_PCT = (
    "100 * sum(DCGM_FI_DEV_FB_USED{{{sel}}}) / (sum(DCGM_FI_DEV_FB_USED{{{sel}}}) + sum(DCGM_FI_DEV_FB_FREE{{{sel}}}))"
)
DCGM_SHORTCUTS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("avg(DCGM_FI_DEV_GPU_UTIL{{{sel}}})", "GPU utilisation, percent"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (
        "100 * avg(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{sel}}})",
        "graphics engine active, percent",
    ),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("avg(DCGM_FI_DEV_MEM_COPY_UTIL{{{sel}}})", "memory copy utilisation, percent"),
    "memory-pressure": (_FB_USED_PCT, "framebuffer used over used + free (DCGM_FI_DEV_FB_USED/_FREE), percent"),
}
"""``type: dcgm`` metrics: the PromQL template (``sel`` is the target's pod selector) and what it measures. Every
shortcut reads as a per-pod average in percent, so its ``threshold`` is a percentage."""

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NUMBER = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")


@dataclass(frozen=True, slots=True)
class BudgetRef:
    name: str
    model: str
    gpus_per_replica: int = 1


@dataclass(frozen=True, slots=True)
class ScalerManifest:
    """One scaler as read: identity, target, the core spec and what the cluster reconcile needs besides."""

    name: str
    namespace: str
    kind: str
    target_kind: str
    target_name: str
    spec: ScalerSpec
    queries: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Trigger name -> (server address, PromQL query)."""
    priority: int = 0
    budget: BudgetRef | None = None
    rightsizing: RightsizePolicy | None = None
    """``spec.rightsizing``: the workload opted in to right-sizing (see :mod:`gpuscale.manifests.rightsizing`)."""


@dataclass(frozen=True, slots=True)
class ScalerFile:
    scalers: tuple[ScalerManifest, ...]
    budgets: tuple[Budget, ...]


# ------------------------------------------------------------------------------------------------------ loading
def load_scalers(path: str | Path) -> ScalerFile:
    """Every GPUWorkloadScaler, ScaledObject and GPUBudget of a YAML file; :class:`InputError` lists every problem."""
    return parse_scalers(read_text(path, what="scaler file"), source=str(path))


def parse_scalers(text: str, *, source: str) -> ScalerFile:
    """Like :func:`load_scalers`, for text in memory."""
    problems: list[InputError] = []
    scalers: list[ScalerManifest] = []
    budgets: list[Budget] = []
    read_documents(text, source, problems, lambda doc, data, _: _read_object(doc, data, scalers, budgets))
    _check_unique(problems, source, [(f"{s.namespace}/{s.name}", "scaler") for s in scalers])
    _check_unique(problems, source, [(b.name, "GPUBudget") for b in budgets])
    if problems:
        raise ManifestError(source, problems)
    if not scalers and not budgets:
        raise InputError(
            "holds no GPUWorkloadScaler, ScaledObject or GPUBudget", where=source,
            fix=f"add a document with apiVersion: {API_VERSION} and kind: {SCALER_KIND}",
        )  # fmt: skip
    return ScalerFile(tuple(scalers), tuple(budgets))


def _check_unique(problems: list[InputError], source: str, keyed: list[tuple[str, str]]) -> None:
    seen: set[str] = set()
    for key, what in keyed:
        if key in seen:
            problems.append(InputError(f"duplicate {what} {key!r}", where=source, fix="give each a unique name"))
        seen.add(key)


def _read_object(doc: Doc, data: object, scalers: list[ScalerManifest], budgets: list[Budget]) -> None:
    if not isinstance(data, dict):
        doc.error("", "a document must be a Kubernetes object (a mapping with apiVersion and kind)", data)
        return
    kind, api = data.get("kind"), data.get("apiVersion")
    kinds = (SCALER_KIND, KEDA_KIND, BUDGET_KIND)
    if kind not in kinds:
        doc.error("kind", "is not a kind read here", kind, fix=did_you_mean(str(kind), kinds))
        return
    doc.kind = str(kind)
    want = KEDA_API_VERSION if kind == KEDA_KIND else API_VERSION
    if api != want:
        doc.error("apiVersion", f"a {kind} has apiVersion {want}", api, fix=f"set apiVersion: {want}")
        return
    if kind == BUDGET_KIND:
        budget = read_budget(doc, data)
        if budget is not None:
            budgets.append(budget)
    else:
        scaler = read_scaler(doc, data)
        if scaler is not None:
            scalers.append(scaler)


# ----------------------------------------------------------------------------------------------------- scalars
def _count(m: Mapping[str, Any], key: str, path: str, default: int, *, minimum: int = 0,
           maximum: int = MAX_REPLICAS) -> int:  # fmt: skip
    value = m.get(key)
    return default if value is None else as_int(value, f"{path}.{key}", minimum=minimum, maximum=maximum)


def _number_text(value: object, path: str, *, positive: bool = False) -> float:
    """A number written as a string (KEDA's trigger metadata), finite and within +-1e15."""
    text = as_str(value, path, required=True).strip()
    if not _NUMBER.match(text) or len(text) > 40:
        raise FieldError(path, "is not a number", value, fix='write a decimal number as a string, e.g. "70"')
    number = float(text)
    if not math.isfinite(number) or abs(number) > MAX_VALUE:
        raise FieldError(path, f"must be within +-{MAX_VALUE:g}", value)
    if positive and number <= 0:
        raise FieldError(path, "must be greater than 0", value)
    return number


def _bool_text(value: object, path: str) -> bool:
    text = as_str(value, path, required=True).strip().lower()
    if text not in ("true", "false"):
        raise FieldError(path, 'must be "true" or "false"', value, fix='write it as a string: "true"')
    return text == "true"


# ----------------------------------------------------------------------------------------------------- scalers
def read_scaler(doc: Doc, obj: dict[str, Any]) -> ScalerManifest | None:
    """A GPUWorkloadScaler or a ScaledObject; None if it has problems (reported to ``doc``)."""
    kind = str(obj.get("kind"))
    meta, spec = metadata_and_spec(doc, obj, TOP_FIELDS)
    name = namespace = ""
    with doc.field():
        name = as_str(meta.get("name"), "metadata.name", required=True)
        doc.name = name
        if len(name) > 253 or not _NAME.match(name):
            raise FieldError("metadata.name", "must be a DNS subdomain name", name,
                             fix="use lower-case letters, digits, '-' and '.'")  # fmt: skip
    with doc.field():
        namespace = as_str(meta.get("namespace"), "metadata.namespace") or "default"
        if len(namespace) > 63 or not _LABEL.match(namespace):
            raise FieldError("metadata.namespace", "must be a DNS label (a namespace name)", namespace,
                             fix="use at most 63 lower-case letters, digits and '-'")  # fmt: skip
    check_fields(doc, spec, "spec", KEDA_SPEC_FIELDS if kind == KEDA_KIND else SPEC_FIELDS)
    target_kind, target_name = _target(doc, spec.get("scaleTargetRef"))

    counts: dict[str, int] = {}
    for key, default, maximum in (
        ("minReplicaCount", 0, MAX_REPLICAS), ("maxReplicaCount", DEFAULT_MAX_REPLICAS, MAX_REPLICAS),
        ("pollingInterval", DEFAULT_POLLING_INTERVAL_S, MAX_SECONDS),
        ("cooldownPeriod", DEFAULT_COOLDOWN_S, MAX_SECONDS),
        ("initialCooldownPeriod", 0, MAX_SECONDS),
    ):  # fmt: skip
        with doc.field():
            counts[key] = _count(spec, key, "spec", default, minimum=1 if key == "pollingInterval" else 0,
                                 maximum=maximum)  # fmt: skip
    lo, hi = counts.get("minReplicaCount", 0), counts.get("maxReplicaCount", DEFAULT_MAX_REPLICAS)
    if hi < lo or hi < 1:
        doc.error("spec.maxReplicaCount", f"must be at least 1 and at least minReplicaCount ({lo})", hi)
    idle: int | None = None
    with doc.field():
        if spec.get("idleReplicaCount") is not None:
            idle = as_int(spec["idleReplicaCount"], "spec.idleReplicaCount", minimum=0, maximum=0)
            if lo <= idle:
                raise FieldError("spec.idleReplicaCount", "must be less than minReplicaCount", idle,
                                 fix="set minReplicaCount to 1 or more, or remove idleReplicaCount")  # fmt: skip
    fallback = _fallback(doc, spec.get("fallback"), hi)
    behavior = _behavior_source(doc, spec, kind)
    triggers, queries = _triggers(doc, spec.get("triggers"), namespace, target_name)
    if fallback is not None:
        for i, t in enumerate(triggers):
            if t.metric.kind is MetricKind.VALUE:
                doc.error(f"spec.triggers[{i}].metricType", "fallback works only with AverageValue triggers",
                          "Value", fix="use metricType: AverageValue or remove spec.fallback")  # fmt: skip
    schedules = _schedules(doc, spec.get("schedules"), hi)
    priority = 0
    with doc.field():
        if spec.get("priority") is not None:
            priority = as_int(spec["priority"], "spec.priority", minimum=0, maximum=1_000_000)
    budget = _budget_ref(doc, spec.get("gpuBudget"))
    servers = [server for server, _ in queries.values()]
    rightsizing = read_rightsizing(doc, spec.get("rightsizing"), servers[0] if servers else DEFAULT_SERVER)
    if doc.failed:
        return None
    core = ScalerSpec(
        triggers=tuple(triggers), min_replicas=lo, max_replicas=hi, idle_replicas=idle,
        polling_interval_s=counts["pollingInterval"], cooldown_s=counts["cooldownPeriod"],
        initial_cooldown_s=counts["initialCooldownPeriod"], fallback=fallback,
        behavior=behavior, schedules=tuple(schedules),
    )  # fmt: skip
    return ScalerManifest(name, namespace, kind, target_kind, target_name, core, queries, priority, budget,
                          rightsizing)  # fmt: skip


def _target(doc: Doc, raw: object) -> tuple[str, str]:
    path = "spec.scaleTargetRef"
    try:
        m = as_mapping(raw, path)
    except FieldError as err:
        doc.report(err)
        return "", ""
    if raw is None:
        doc.error(path, "is required", fix="name the Deployment: scaleTargetRef: {name: my-model}")
        return "", ""
    check_fields(doc, m, path, TARGET_FIELDS)
    kind = name = ""
    with doc.field():
        kind = as_str(m.get("kind"), f"{path}.kind") or "Deployment"
    with doc.field():
        as_str(m.get("apiVersion"), f"{path}.apiVersion")
    with doc.field():
        as_str(m.get("envSourceContainerName"), f"{path}.envSourceContainerName")
    with doc.field():
        name = as_str(m.get("name"), f"{path}.name", required=True)
        if len(name) > 253 or not _NAME.match(name):
            raise FieldError(f"{path}.name", "must be a DNS subdomain name (a workload name)", name,
                             fix="use lower-case letters, digits, '-' and '.'")  # fmt: skip
    return kind, name


def _fallback(doc: Doc, raw: object, hi: int) -> Fallback | None:
    if raw is None:
        return None
    path = "spec.fallback"
    m = fields_of(doc, raw, path, FALLBACK_FIELDS)
    if m is None:
        return None
    threshold = replicas = 0
    with doc.field():
        threshold = as_int(m.get("failureThreshold"), f"{path}.failureThreshold", minimum=0, maximum=MAX_REPLICAS)
    with doc.field():
        replicas = as_int(m.get("replicas"), f"{path}.replicas", minimum=0, maximum=MAX_REPLICAS)
    with doc.field():
        if m.get("behavior") not in (None, "static"):
            raise FieldError(f"{path}.behavior", "only static fallback is supported", m.get("behavior"),
                             fix="remove it (static is the default)")  # fmt: skip
    return Fallback(threshold, replicas)


def _behavior_source(doc: Doc, spec: Mapping[str, Any], kind: str) -> Behavior:
    """``spec.behavior`` or KEDA's ``spec.advanced.horizontalPodAutoscalerConfig.behavior`` (not both)."""
    raw, path = spec.get("behavior"), "spec.behavior"
    try:
        adv = as_mapping(spec.get("advanced"), "spec.advanced")
        check_fields(doc, adv, "spec.advanced", ADVANCED_FIELDS)
        if adv.get("scalingModifiers") is not None:
            doc.error("spec.advanced.scalingModifiers", "is not supported", fix="remove it; one query per trigger")
        hpa = as_mapping(adv.get("horizontalPodAutoscalerConfig"), "spec.advanced.horizontalPodAutoscalerConfig")
        check_fields(doc, hpa, "spec.advanced.horizontalPodAutoscalerConfig", HPA_CONFIG_FIELDS)
        if hpa.get("behavior") is not None:
            if raw is not None:
                raise FieldError(path, "is set twice (also under spec.advanced.horizontalPodAutoscalerConfig)",
                                 fix="keep one of the two")  # fmt: skip
            raw, path = hpa["behavior"], "spec.advanced.horizontalPodAutoscalerConfig.behavior"
    except FieldError as err:
        doc.report(err)
    return read_behavior(doc, raw, path)


def read_behavior(doc: Doc, raw: object, path: str) -> Behavior:
    """An HPA v2 ``behavior``; absent parts take the HPA's defaults."""
    m = fields_of(doc, raw, path, BEHAVIOR_FIELDS)
    if m is None:
        return Behavior()
    up = _rules(doc, m.get("scaleUp"), f"{path}.scaleUp", DEFAULT_SCALE_UP)
    down = _rules(doc, m.get("scaleDown"), f"{path}.scaleDown", DEFAULT_SCALE_DOWN)
    return Behavior(up, down)


def _rules(doc: Doc, raw: object, path: str, default: ScalingRules) -> ScalingRules:
    m = fields_of(doc, raw, path, RULES_FIELDS)
    if m is None:
        return default
    window, select, tolerance, policies = (
        default.stabilization_window_s,
        default.select_policy,
        DEFAULT_TOLERANCE,
        default.policies,
    )
    with doc.field():
        window = _count(m, "stabilizationWindowSeconds", path, window, maximum=3600)
    with doc.field():
        if m.get("selectPolicy") is not None:
            select = SelectPolicy(choice(m["selectPolicy"], f"{path}.selectPolicy", [str(s) for s in SelectPolicy]))
    with doc.field():
        if m.get("tolerance") is not None:
            tolerance = _tolerance(m["tolerance"], f"{path}.tolerance")
    with doc.field():
        if "policies" in m:
            items = as_list(m["policies"], f"{path}.policies")
            if not items:
                raise FieldError(
                    f"{path}.policies", "must list at least one policy",
                    fix="remove it for the default, or add {type: Pods, value: 4, periodSeconds: 15}",
                )  # fmt: skip
            got = [_policy(doc, p, f"{path}.policies[{i}]") for i, p in enumerate(items)]
            policies = tuple(p for p in got if p is not None)
    return ScalingRules(window, policies, select, tolerance)


def _tolerance(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise FieldError(path, "must be a number such as 0.05", value)
    number = _number_text(value, path) if isinstance(value, str) else float(value)
    if not 0 <= number <= 1:
        raise FieldError(path, "must be between 0 and 1", value, fix="e.g. 0.05 for 5 %")
    return number


def _policy(doc: Doc, raw: object, path: str) -> ScalingPolicy | None:
    before = len(doc.problems)
    m = fields_of(doc, raw, path, POLICY_FIELDS)
    if m is None:
        return None
    kind, value, period = PolicyType.PODS, 0, 0
    with doc.field():
        kind = PolicyType(choice(m.get("type"), f"{path}.type", [str(t) for t in PolicyType]))
    with doc.field():
        value = as_int(m.get("value"), f"{path}.value", minimum=1, maximum=MAX_REPLICAS)
    with doc.field():
        period = as_int(m.get("periodSeconds"), f"{path}.periodSeconds", minimum=1, maximum=1800)
    return None if len(doc.problems) > before else ScalingPolicy(kind, value, period)


def _triggers(doc: Doc, raw: object, namespace: str, target: str) -> tuple[list[Trigger], dict[str, tuple[str, str]]]:
    triggers: list[Trigger] = []
    queries: dict[str, tuple[str, str]] = {}
    try:
        items = as_list(raw, "spec.triggers")
    except FieldError as err:
        doc.report(err)
        return triggers, queries
    if not items:
        doc.error(
            "spec.triggers", "must list at least one trigger",
            fix='add one, e.g. {type: dcgm, metadata: {metric: DCGM_FI_DEV_GPU_UTIL, threshold: "70"}}',
        )  # fmt: skip
    names: set[str] = set()
    for i, item in enumerate(items):
        got = _trigger(doc, item, f"spec.triggers[{i}]", i, namespace, target)
        if got is None:
            continue
        trigger, server, query = got
        if trigger.name in names:
            doc.error(
                f"spec.triggers[{i}].name",
                "is used by another trigger",
                trigger.name,
                fix="give each trigger its own name",
            )
            continue
        names.add(trigger.name)
        triggers.append(trigger)
        queries[trigger.name] = (server, query)
    return triggers, queries


def _trigger(doc: Doc, raw: object, path: str, index: int, namespace: str,
             target: str) -> tuple[Trigger, str, str] | None:  # fmt: skip
    before = len(doc.problems)
    m = fields_of(doc, raw, path, TRIGGER_FIELDS)
    if m is None:
        return None
    kind = name = ""
    metric_type = "AverageValue"
    meta: dict[str, Any] = {}
    with doc.field():
        kind = choice(m.get("type"), f"{path}.type", TRIGGER_TYPES)
    with doc.field():
        name = as_str(m.get("name"), f"{path}.name") or f"trigger-{index}"
    with doc.field():
        if m.get("metricType") is not None:
            metric_type = choice(m["metricType"], f"{path}.metricType", METRIC_TYPES)
    with doc.field():
        meta = as_mapping(m.get("metadata"), f"{path}.metadata")
        if m.get("metadata") is None:
            raise FieldError(
                f"{path}.metadata", "is required", fix='set at least threshold: "70" and the query or metric'
            )
    mpath = f"{path}.metadata"
    check_fields(doc, meta, mpath, PROMETHEUS_METADATA if kind == "prometheus" else DCGM_METADATA)
    threshold, activation, ignore_null = 1.0, 0.0, True
    with doc.field():
        threshold = _number_text(meta.get("threshold"), f"{mpath}.threshold", positive=True)
    with doc.field():
        if meta.get("activationThreshold") is not None:
            activation = _number_text(meta["activationThreshold"], f"{mpath}.activationThreshold")
    with doc.field():
        if meta.get("ignoreNullValues") is not None:
            ignore_null = _bool_text(meta["ignoreNullValues"], f"{mpath}.ignoreNullValues")
    server = query = ""
    with doc.field():
        server = as_str(meta.get("serverAddress"), f"{mpath}.serverAddress", required=kind == "prometheus")
        if server and not server.startswith(("http://", "https://")):
            raise FieldError(f"{mpath}.serverAddress", "must be an http:// or https:// URL", server)
    for key in ("namespace", "customHeaders", "unsafeSsl", "queryParameters", "timeout", "authModes"):
        with doc.field():
            as_str(meta.get(key), f"{mpath}.{key}")
    metric_kind = MetricKind(metric_type)
    if kind == "prometheus":
        with doc.field():
            query = as_str(meta.get("query"), f"{mpath}.query", required=True)
    else:
        with doc.field():
            shortcut = choice(meta.get("metric"), f"{mpath}.metric", DCGM_SHORTCUTS)
            # names are validated ([a-z0-9.-]): only '.' is special in the regex, escaped inside a PromQL string
            pods = target.replace(".", "\\\\.")
            selector = f'namespace="{namespace}",pod=~"{pods}-.*"'
            query = DCGM_SHORTCUTS[shortcut][0].format(sel=selector)
        if metric_type != "AverageValue":
            doc.error(f"{path}.metricType", "a dcgm trigger is a per-pod average (AverageValue)", metric_type,
                      fix="remove metricType")  # fmt: skip
        metric_kind = MetricKind.POD_AVERAGE
    if len(doc.problems) > before:
        return None
    trigger = Trigger(name, MetricTarget(name, metric_kind, threshold), activation, ignore_null)
    return trigger, server or DEFAULT_SERVER, query


def _schedules(doc: Doc, raw: object, hi: int) -> list[Schedule]:
    out: list[Schedule] = []
    try:
        items = as_list(raw, "spec.schedules")
    except FieldError as err:
        doc.report(err)
        return out
    for i, item in enumerate(items):
        path = f"spec.schedules[{i}]"
        before = len(doc.problems)
        m = fields_of(doc, item, path, SCHEDULE_FIELDS)
        if m is None:
            continue
        crons: dict[str, CronSchedule] = {}
        for key in ("start", "end"):
            with doc.field():
                text = as_str(m.get(key), f"{path}.{key}", required=True)
                try:
                    crons[key] = parse_cron(text, where=f"{path}.{key}")
                except InputError as exc:
                    raise FieldError(f"{path}.{key}", exc.reason, text, fix=exc.fix) from None
        with doc.field():
            tz = as_str(m.get("timezone"), f"{path}.timezone") or "UTC"
            if tz not in ("UTC", "Etc/UTC"):
                raise FieldError(f"{path}.timezone", "only UTC is supported", tz, fix="write the cron times in UTC")
        replicas = name = None
        with doc.field():
            replicas = as_int(m.get("desiredReplicas"), f"{path}.desiredReplicas", minimum=1, maximum=hi)
        with doc.field():
            name = as_str(m.get("name"), f"{path}.name")
        if len(doc.problems) == before and replicas is not None:
            out.append(Schedule(crons["start"], crons["end"], replicas, name or ""))
    return out


def _budget_ref(doc: Doc, raw: object) -> BudgetRef | None:
    if raw is None:
        return None
    path = "spec.gpuBudget"
    before = len(doc.problems)
    m = fields_of(doc, raw, path, GPU_BUDGET_REF_FIELDS)
    if m is None:
        return None
    name = model = ""
    gpus = 1
    with doc.field():
        name = as_str(m.get("name"), f"{path}.name", required=True)
    with doc.field():
        model = as_str(m.get("model"), f"{path}.model", required=True)
    with doc.field():
        gpus = _count(m, "gpusPerReplica", path, 1, minimum=1, maximum=64)
    return None if len(doc.problems) > before else BudgetRef(name, model, gpus)


# ----------------------------------------------------------------------------------------------------- budgets
def read_budget(doc: Doc, obj: dict[str, Any]) -> Budget | None:
    """A GPUBudget; None if it has problems (reported to ``doc``)."""
    meta, spec = metadata_and_spec(doc, obj, TOP_FIELDS)
    name = ""
    with doc.field():
        name = as_str(meta.get("name"), "metadata.name", required=True)
        doc.name = name
    check_fields(doc, spec, "spec", BUDGET_SPEC_FIELDS)
    total, share = 0, 1.0
    with doc.field():
        total = as_int(spec.get("totalGPUs"), "spec.totalGPUs", minimum=0, maximum=MAX_REPLICAS)
    with doc.field():
        if spec.get("elasticShare") is not None:
            share = _share(spec["elasticShare"], "spec.elasticShare")
    models: list[ModelShare] = []
    with doc.field():
        for i, item in enumerate(as_list(spec.get("models"), "spec.models")):
            model = _model(doc, item, f"spec.models[{i}]")
            if model is None:
                continue
            if any(x.name == model.name for x in models):
                doc.error(f"spec.models[{i}].name", "is listed twice", model.name, fix="list each model once")
            models.append(model)
    guaranteed = sum(m.guaranteed_gpus for m in models)
    if not doc.failed and guaranteed > total:
        doc.error("spec.models", f"guarantees {guaranteed} GPUs, more than totalGPUs ({total})", guaranteed,
                  fix="lower guaranteedGPUs or raise totalGPUs")  # fmt: skip
    return None if doc.failed else Budget(name, total, share, tuple(models))


def _share(value: object, path: str) -> float:
    if isinstance(value, str) and value.strip().endswith("%"):
        number = _number_text(value.strip()[:-1], path) / 100
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(path, 'must be a fraction (0.5) or a percentage ("50%")', value)
    else:
        number = float(value)
    if not 0 <= number <= 1:
        raise FieldError(path, "must be between 0 and 1 (0 % and 100 %)", value)
    return number


def _model(doc: Doc, raw: object, path: str) -> ModelShare | None:
    before = len(doc.problems)
    m = fields_of(doc, raw, path, MODEL_FIELDS)
    if m is None:
        return None
    name, gpus = "", 0
    with doc.field():
        name = as_str(m.get("name"), f"{path}.name", required=True)
    with doc.field():
        gpus = _count(m, "guaranteedGPUs", path, 0)
    return None if len(doc.problems) > before else ModelShare(name, gpus)
