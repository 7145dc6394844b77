"""GPU Provisioning Requests (GPRs): model, validation, lifecycle state machine and the pure GPR planner.

A GPR asks for ``numberOfGPUNodes`` nodes with ``numberOfGPUs`` GPUs each, of one GPU shape, for ``exitDuration``.
Field names follow Avesha EGS so existing requests carry over (:data:`SPEC_FIELDS`). Everything here is pure: the
imperative shell (:mod:`gpuscale.gpr`) loads GPRs, observes nodes, calls :func:`plan_gprs` and applies its actions.

Lifecycle (:data:`TRANSITIONS`; every edge has one trigger, :data:`TRIGGER_DOCS` says when it fires, and
:func:`transition` rejects every other edge)::

    Queued        --admit---------------> Provisioning   free inventory reserved and/or scale-up launched
    Queued        --cancel--------------> Cancelled      user cancel (only while queued)
    Queued        --delay-limit---------> Failed         delayedCount reached MAX_DELAYED_COUNT
    Queued        --unservable----------> Failed         spec no longer matches the catalog
    Provisioning  --nodes-ready---------> Provisioned    all nodes ready and labelled; exit clock starts
    Provisioning  --provisioning-failed-> Failed         launch rejected, node failed, or deadline missed
    Provisioning  --early-release-------> Released       user release
    Provisioning  --evict---------------> Evicted        a higher-priority GPR needs the capacity
    Provisioned   --exit-duration-------> Complete       exitDuration elapsed
    Provisioned   --early-release-------> Released       user release
    Provisioned   --idle-timeout--------> Released       no GPU use for idleTimeOutDuration (enforced)
    Provisioned   --node-lost-----------> Failed         a node disappeared
    Provisioned   --evict---------------> Evicted        a higher-priority GPR needs the capacity
    Failed        --requeue-------------> Queued         requeueOnFailure, retryCount < limit (not after
    Evicted       --requeue-------------> Queued         delay-limit or unservable); a new attempt/request id

Insufficient capacity: the shell marks an offering that refused a launch unavailable for a while
(:attr:`CapacityView.unavailable`); admission skips marked offerings (:func:`candidate_offerings`) and a provisioning
GPR whose pending launch targets a marked offering moves to the next candidate (:func:`retarget_launch`), failing
only when none is left.

Nodes serving a GPR carry the label and ``NoSchedule`` taint ``gpuscale.io/gpr=<gprId>`` (:func:`gpr_node_labels`,
:func:`gpr_node_taints`); only pods matching ``workloadSelector`` and tolerating the taint belong there
(:func:`admits_pod`).
"""

from __future__ import annotations

import difflib
import heapq
import itertools
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpuscale.core.gpus import gpu_model_variants, normalize_gpu_model
from gpuscale.core.labels import GPU_PRODUCT, POOL
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    InstanceType,
    Offering,
    OfferingKey,
    Pod,
    Taint,
    TaintEffect,
    Toleration,
)
from gpuscale.errors import GpuscaleError, InputError, short_repr

API_VERSION = "gpuscale.io/v1alpha1"
KIND = "GPUProvisioningRequest"
SHORT_NAME = "gpr"

PRIORITY_MIN = 1
PRIORITY_MAX = 300
DEFAULT_PRIORITY = 101
MAX_NODES_PER_GPR = 100

GPR_LABEL = "gpuscale.io/gpr"
"""Label (value: the gprId) on every node serving a GPR; pods select it with a node selector."""
GPR_TAINT = "gpuscale.io/gpr"
"""``NoSchedule`` taint key (value: the gprId) on every node serving a GPR; its workloads tolerate it."""
REQUEST_ID_PREFIX = "gpr-"


# ------------------------------------------------------------------------------------------------------- durations
_DURATION_RE = re.compile(r"(?:([0-9]{1,12})d)?(?:([0-9]{1,12})h)?(?:([0-9]{1,12})m)?(?:([0-9]{1,12})s)?")
MAX_DURATION_TEXT = 32
"""Longest duration string accepted (longer ones are refused before parsing)."""


def parse_duration(text: str, *, where: str = "duration") -> int:
    """Seconds in an EGS duration: ``0d8h0m``, ``8h``, ``30m``, ``1d12h``, ``90s`` (each unit optional, in order).

    Raises :class:`InputError` naming ``where`` for a negative, empty or malformed value.
    """
    if not isinstance(text, str):
        raise InputError("must be a duration string", where=where, value=text, fix="write e.g. 0d8h0m, 8h or 30m")
    if len(text) > MAX_DURATION_TEXT:
        raise InputError(
            f"is too long ({len(text)} characters)", where=where, value=text[:20], fix="write e.g. 0d8h0m, 8h or 30m"
        )
    s = text.strip().lower()
    if s.startswith("-"):
        raise InputError("must not be negative", where=where, value=text, fix="write a positive duration such as 8h")
    m = _DURATION_RE.fullmatch(s)
    if not s or m is None or not any(m.groups()):
        raise InputError(
            "is not a duration", where=where, value=text, fix="use days/hours/minutes/seconds in order: 0d8h0m, 8h, 30m"
        )
    d, h, mi, sec = (int(g) if g else 0 for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + sec


def format_duration(seconds: float) -> str:
    """EGS form of a duration: ``0d8h0m`` (``s`` appended only when there are leftover seconds)."""
    total = max(0, round(seconds))
    d, rem = divmod(total, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}d{h}h{m}m" + (f"{s}s" if s else "")


def priority_band(priority: int) -> str:
    """``low`` (1-100), ``medium`` (101-200) or ``high`` (201-300)."""
    return "low" if priority <= 100 else "medium" if priority <= 200 else "high"


def format_timestamp(t: float | None) -> str | None:
    """RFC 3339 UTC timestamp of Unix time ``t`` (None stays None)."""
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------------------------- spec
@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem with one field of a request (``field`` is the EGS field name)."""

    field: str
    message: str


class GprValidationError(InputError):
    """A GPR spec is invalid; ``errors`` lists every field-level problem."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        text = "; ".join(f"{e.field}: {e.message}" for e in self.errors)
        super().__init__(f"invalid GPU provisioning request: {text}")


class IllegalTransition(GpuscaleError):
    """A lifecycle transition that the state machine does not allow (e.g. cancelling a provisioned GPR)."""


@dataclass(frozen=True, slots=True)
class GprSpec:
    """What a GPR asks for. Durations in seconds; ``memory_per_gpu`` in GB; ``workload_selector`` pod labels."""

    request_name: str
    exit_duration_s: int
    cluster_name: str = ""
    instance_type: str | None = None
    gpu_shape: str | None = None
    enable_auto_gpu_selection: bool = False
    number_of_gpus: int = 1
    number_of_gpu_nodes: int = 1
    memory_per_gpu: int | None = None
    priority: int = DEFAULT_PRIORITY
    idle_timeout_s: int | None = None
    enforce_idle_timeout: bool = False
    early_release: bool = False
    enable_eviction: bool = False
    requeue_on_failure: bool = False
    enable_dynamic_node_pool: bool = True
    workload_selector: Mapping[str, str] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes."""
        return self.number_of_gpus * self.number_of_gpu_nodes


SPEC_FIELDS: tuple[str, ...] = (
    "requestName",
    "clusterName",
    "instanceType",
    "gpuShape",
    "enableAutoGpuSelection",
    "numberOfGPUs",
    "numberOfGPUNodes",
    "memoryPerGpu",
    "priority",
    "exitDuration",
    "idleTimeOutDuration",
    "enforceIdleTimeOut",
    "earlyRelease",
    "enableEviction",
    "requeueOnFailure",
    "enableDynamicNodePool",
    "workloadSelector",
)
"""EGS spec field names, in documentation order."""

_LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_KEY_RE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_BAD_CHARS_RE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
"""C0/C1 controls, bidi marks/overrides/isolates, BOM and lone UTF-16 surrogates: refused in every string."""

REQUEST_NAME_MAX = 40
"""EGS limit on ``requestName``."""
CLUSTER_NAME_MAX = 253
"""DNS-1123 subdomain limit on ``clusterName``."""
TEXT_MAX = 128
"""Limit on every other free string (``instanceType``, ``gpuShape``, ``sliceName``)."""
MAX_GPUS_PER_NODE = 64
MAX_MEMORY_PER_GPU_GB = 4096
MAX_SELECTOR_LABELS = 32
MAX_REPORTED = 10
"""Unknown fields reported one by one; the rest are counted."""
DEFAULT_MAX_EXIT_S = 365 * 86400
"""Default upper bound on ``exitDuration`` (the server's ``GPUSCALE_MAX_EXIT_DURATION`` changes it)."""
MAX_EXIT_CEILING_S = 100 * 365 * 86400
"""Hard ceiling on any duration, whatever the configured maximum (keeps times finite and JSON-safe)."""

SPEC_ALIASES: Mapping[str, str] = {"gprName": "requestName", "memoryPerGPU": "memoryPerGpu"}
"""EGS REST body keys accepted for our fields."""
IGNORED_EGS_FIELDS: tuple[str, ...] = ("sliceName", "preferredClusters", "enableAutoClusterSelection")
"""EGS REST body keys accepted, type-checked and ignored (gpuscale has no workspaces or cluster selection)."""


def clean_text(value: str) -> str | None:
    """Why ``value`` is not acceptable text (a lone surrogate, a control or bidi character), or None."""
    m = _BAD_CHARS_RE.search(value)
    if m is None:
        return None
    return f"contains a forbidden character U+{ord(m.group()):04X} at position {m.start()}"


def closest_field(name: str, known: Iterable[str]) -> str | None:
    """The known field name closest to ``name``, compared case-insensitively (None if nothing is close)."""
    by_lower = {k.lower(): k for k in known}
    low = name[:100].lower()
    if low in by_lower:
        return by_lower[low]
    close = difflib.get_close_matches(low, list(by_lower), n=1, cutoff=0.7)
    return by_lower[close[0]] if close else None


def unknown_field_errors(data: Mapping[Any, Any], known: Collection[str]) -> list[FieldError]:
    """A field error for every key of ``data`` not in ``known``, suggesting the closest valid name."""
    errors: list[FieldError] = []
    unknown = [k for k in data if not (isinstance(k, str) and k in known)]
    for key in unknown[:MAX_REPORTED]:
        text = str(key)
        label = text if len(text) <= 40 and clean_text(text) is None else short_repr(text, 40)
        close = closest_field(text, known)
        hint = f"; did you mean {close}?" if close else f"; valid fields: {', '.join(sorted(known)[:20])}"
        errors.append(FieldError(label, f"unknown field{hint}"))
    if len(unknown) > MAX_REPORTED:
        errors.append(FieldError("spec", f"and {len(unknown) - MAX_REPORTED:,} more unknown fields"))
    return errors


class _Reader:
    """Reads typed fields from an EGS dict, collecting field errors instead of raising on the first."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data
        self.errors: list[FieldError] = []

    def err(self, name: str, message: str) -> None:
        self.errors.append(FieldError(name, message))

    def string(self, name: str, *, required: bool = False, max_len: int = TEXT_MAX) -> str | None:
        v = self.data.get(name)
        if v is None or (isinstance(v, str) and not v.strip()):
            if required:
                self.err(name, "is required")
            return None
        if not isinstance(v, str):
            self.err(name, f"must be a string, got {type(v).__name__} {short_repr(v, 40)}")
            return None
        bad = clean_text(v)
        if bad:
            self.err(name, bad)
            return None
        v = v.strip()
        if len(v) > max_len:
            self.err(name, f"must be at most {max_len} characters, got {len(v):,} ({short_repr(v, 20)})")
            return None
        return v

    def integer(self, name: str, default: int | None, low: int, high: int) -> int | None:
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
            self.err(name, f"must be an integer, got {short_repr(v, 40)}")
            return default
        if not low <= v <= high:
            shown = short_repr(v, 20) if isinstance(v, float) or abs(v) < 10**18 else "a huge number"
            self.err(name, f"must be between {low} and {high}, got {shown}")
            return default
        return int(v)

    def boolean(self, name: str, default: bool | None) -> bool | None:
        v = self.data.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.err(name, f"must be true or false, got {short_repr(v, 40)}")
            return default
        return v

    def duration(self, name: str, *, required: bool = False, max_s: int = MAX_EXIT_CEILING_S) -> int | None:
        v = self.data.get(name)
        if v is None or v == "":
            if required:
                self.err(name, "is required (a duration such as 0d8h0m, 8h or 30m)")
            return None
        try:
            seconds = parse_duration(v, where=name)
        except InputError as exc:
            self.err(name, f"{exc.args[0].split(': ', 1)[-1]}")
            return None
        if seconds > max_s:
            self.err(name, f"must be at most {format_duration(max_s)}, got {format_duration(seconds)}")
            return None
        return seconds


def spec_from_dict(data: Mapping[str, Any], *, max_exit_s: int = MAX_EXIT_CEILING_S) -> GprSpec:
    """Structural parse of an EGS spec dict (types, Unicode, lengths, ranges, durations); raises
    :class:`GprValidationError`.

    Every key must be an EGS field (:data:`SPEC_FIELDS`), an alias (:data:`SPEC_ALIASES`) or an ignored EGS key
    (:data:`IGNORED_EGS_FIELDS`); others are errors naming the closest valid name. Catalog checks are in
    :func:`validate_spec`.
    """
    if not isinstance(data, Mapping):
        raise GprValidationError([FieldError("spec", f"must be an object, got {type(data).__name__}")])
    known = (*SPEC_FIELDS, *SPEC_ALIASES, *IGNORED_EGS_FIELDS)
    errors = unknown_field_errors(data, known)
    merged: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(key, str) and key in known:
            target = SPEC_ALIASES.get(key, key)
            if target in merged and key != target:
                errors.append(FieldError(key, f"is an alias of {target}; give only one of them"))
            merged[target] = value
    r = _Reader(merged)
    r.errors.extend(errors)
    _ignored_egs_fields(r)
    name = r.string("requestName", required=True, max_len=REQUEST_NAME_MAX)
    cluster = r.string("clusterName", max_len=CLUSTER_NAME_MAX)
    if cluster and not _DNS1123_SUBDOMAIN_RE.fullmatch(cluster):
        r.err("clusterName", "must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')")
    exit_s = r.duration("exitDuration", required=True, max_s=min(max_exit_s, MAX_EXIT_CEILING_S))
    if exit_s == 0:
        r.err("exitDuration", "must be longer than zero")
    idle_s = r.duration("idleTimeOutDuration", max_s=MAX_EXIT_CEILING_S)
    if idle_s == 0:
        idle_s = None
    gpus = r.integer("numberOfGPUs", 1, 1, MAX_GPUS_PER_NODE)
    nodes = r.integer("numberOfGPUNodes", 1, 1, MAX_NODES_PER_GPR)
    mem = r.integer("memoryPerGpu", None, 0, MAX_MEMORY_PER_GPU_GB)
    prio = r.integer("priority", DEFAULT_PRIORITY, PRIORITY_MIN, PRIORITY_MAX)
    enforce = r.boolean("enforceIdleTimeOut", None)
    selector = _workload_selector(r)
    spec = GprSpec(
        request_name=name or "",
        exit_duration_s=exit_s or 0,
        cluster_name=cluster or "",
        instance_type=r.string("instanceType"),
        gpu_shape=r.string("gpuShape"),
        enable_auto_gpu_selection=bool(r.boolean("enableAutoGpuSelection", False)),
        number_of_gpus=gpus or 1,
        number_of_gpu_nodes=nodes or 1,
        memory_per_gpu=mem or None,
        priority=prio if prio is not None else DEFAULT_PRIORITY,
        idle_timeout_s=idle_s,
        enforce_idle_timeout=(idle_s is not None) if enforce is None else (enforce and idle_s is not None),
        early_release=bool(r.boolean("earlyRelease", False)),
        enable_eviction=bool(r.boolean("enableEviction", False)),
        requeue_on_failure=bool(r.boolean("requeueOnFailure", False)),
        enable_dynamic_node_pool=bool(r.boolean("enableDynamicNodePool", True)),
        workload_selector=selector,
    )
    if r.errors:
        raise GprValidationError(r.errors)
    return spec


def _ignored_egs_fields(r: _Reader) -> None:
    r.string("sliceName", max_len=CLUSTER_NAME_MAX)
    r.boolean("enableAutoClusterSelection", None)
    clusters = r.data.get("preferredClusters")
    if clusters is not None and (
        not isinstance(clusters, list)
        or len(clusters) > MAX_SELECTOR_LABELS
        or not all(isinstance(c, str) and len(c) <= CLUSTER_NAME_MAX and clean_text(c) is None for c in clusters)
    ):
        r.err("preferredClusters", f"must be a list of at most {MAX_SELECTOR_LABELS} cluster names")


def _workload_selector(r: _Reader) -> dict[str, str]:
    raw = r.data.get("workloadSelector")
    if raw is None:
        return {}
    if isinstance(raw, Mapping) and "matchLabels" in raw:
        extra = unknown_field_errors(raw, ("matchLabels",))
        if extra:
            r.err("workloadSelector", f"only matchLabels is supported, got {extra[0].field}")
        raw = raw["matchLabels"]
    if not isinstance(raw, Mapping):
        r.err("workloadSelector", "must be a map of pod labels (or {matchLabels: {...}})")
        return {}
    if len(raw) > MAX_SELECTOR_LABELS:
        r.err("workloadSelector", f"at most {MAX_SELECTOR_LABELS} labels, got {len(raw):,}")
        return {}
    out: dict[str, str] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or len(k) > 316 or not _LABEL_KEY_RE.fullmatch(k):
            r.err("workloadSelector", f"invalid label key {short_repr(k, 40)}")
        elif not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE_RE.fullmatch(v):
            r.err("workloadSelector", f"invalid label value {short_repr(v, 40)} for {k}")
        else:
            out[k] = v
    return out


def spec_to_dict(spec: GprSpec) -> dict[str, Any]:
    """The EGS spec dict of ``spec`` (round-trips through :func:`spec_from_dict`)."""
    return {
        "requestName": spec.request_name,
        "clusterName": spec.cluster_name,
        "instanceType": spec.instance_type,
        "gpuShape": spec.gpu_shape,
        "enableAutoGpuSelection": spec.enable_auto_gpu_selection,
        "numberOfGPUs": spec.number_of_gpus,
        "numberOfGPUNodes": spec.number_of_gpu_nodes,
        "memoryPerGpu": spec.memory_per_gpu,
        "priority": spec.priority,
        "exitDuration": format_duration(spec.exit_duration_s),
        "idleTimeOutDuration": format_duration(spec.idle_timeout_s) if spec.idle_timeout_s else None,
        "enforceIdleTimeOut": spec.enforce_idle_timeout,
        "earlyRelease": spec.early_release,
        "enableEviction": spec.enable_eviction,
        "requeueOnFailure": spec.requeue_on_failure,
        "enableDynamicNodePool": spec.enable_dynamic_node_pool,
        "workloadSelector": {"matchLabels": dict(spec.workload_selector)},
    }


def _allowed_models(spec: GprSpec) -> frozenset[str] | None:
    """Canonical GPU models the spec accepts (None: any model)."""
    if spec.gpu_shape and not spec.enable_auto_gpu_selection:
        return frozenset(gpu_model_variants(spec.gpu_shape))
    return None


def _mem_ok(spec: GprSpec, gpu_memory_mib: int) -> bool:
    return spec.memory_per_gpu is None or gpu_memory_mib >= spec.memory_per_gpu * 1024 * 0.95


def _price(it: InstanceType) -> float:
    o = _on_demand(it)
    return o.hourly_price if o is not None else math.inf


def _on_demand(it: InstanceType) -> Offering | None:
    avail = [o for o in it.offerings if o.available and o.capacity_type is CapacityType.ON_DEMAND]
    if avail:
        return min(avail, key=lambda o: (o.hourly_price, o.zone))
    return it.cheapest()


def candidate_types(spec: GprSpec, catalog: Catalog) -> tuple[InstanceType, ...]:
    """Catalog instance types that can serve one node of ``spec``, best first (preferred shape, price, GPUs, name).

    With ``instanceType`` only that type; with ``gpuShape`` the types of that model (its memory variants too); with
    ``enableAutoGpuSelection`` every GPU type with enough GPUs and memory, the ``gpuShape`` ones first.
    """
    if spec.instance_type:
        it = catalog.by_name().get(spec.instance_type)
        ok = it is not None and it.gpu_count >= spec.number_of_gpus and _mem_ok(spec, it.gpu_memory_mib)
        return (it,) if ok and it is not None else ()
    preferred = _preferred_models(spec)
    allowed = _allowed_models(spec)
    if allowed is None and not spec.enable_auto_gpu_selection:
        return ()
    out = [
        it
        for it in catalog.instance_types
        if it.gpu_count >= spec.number_of_gpus
        and it.gpu_model
        and (allowed is None or it.gpu_model in allowed)
        and _mem_ok(spec, it.gpu_memory_mib)
        and _on_demand(it) is not None
    ]
    out.sort(key=lambda it: (it.gpu_model not in preferred, _price(it), it.gpu_count, it.name))
    return tuple(out)


def _preferred_models(spec: GprSpec) -> frozenset[str]:
    if not spec.gpu_shape:
        return frozenset()
    try:
        return frozenset(gpu_model_variants(spec.gpu_shape))
    except InputError:
        return frozenset()


def _offering_key(it: InstanceType, o: Offering) -> OfferingKey:
    return OfferingKey(it.name, o.zone, o.capacity_type)


def candidate_offerings(
    spec: GprSpec, catalog: Catalog, skip: Collection[OfferingKey] = frozenset()
) -> tuple[tuple[InstanceType, Offering], ...]:
    """Every (instance type, on-demand offering) that can serve one node of ``spec``, best first, without the
    offerings in ``skip`` (those that recently reported insufficient capacity).

    The order is that of :func:`candidate_types` (preferred shape, price, GPUs, name) applied per offering, with the
    zone last, so after a capacity error the next entry is the next zone of the same type or the next type. A type
    without an available on-demand offering contributes its cheapest offering, as the launch would use it.
    """
    preferred = _preferred_models(spec)
    rows: list[tuple[tuple[bool, float, int, str, str], InstanceType, Offering]] = []
    for it in candidate_types(spec, catalog):
        offers = [o for o in it.offerings if o.available and o.capacity_type is CapacityType.ON_DEMAND]
        if not offers:
            cheapest = it.cheapest()
            offers = [cheapest] if cheapest is not None else []
        for o in offers:
            if _offering_key(it, o) not in skip:
                rows.append(((it.gpu_model not in preferred, o.hourly_price, it.gpu_count, it.name, o.zone), it, o))
    rows.sort(key=lambda r: r[0])
    return tuple((it, o) for _, it, o in rows)


def validate_spec(spec: GprSpec, catalog: Catalog) -> list[FieldError]:
    """Field errors of ``spec`` against ``catalog``: unknown instance type or GPU shape, too many GPUs per node,
    too much memory per GPU, or no shape given at all. Empty when the spec can be served by the catalog."""
    errors: list[FieldError] = []
    models = sorted({it.gpu_model for it in catalog.instance_types if it.gpu_model})
    types = catalog.by_name()
    if spec.instance_type:
        it = types.get(spec.instance_type)
        if it is None:
            close = difflib.get_close_matches(spec.instance_type, list(types), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            errors.append(FieldError("instanceType", f"unknown instance type {spec.instance_type!r}{hint}"))
            return errors
        if not it.gpu_count:
            errors.append(FieldError("instanceType", f"{it.name} has no GPUs"))
        elif it.gpu_count < spec.number_of_gpus:
            errors.append(FieldError("numberOfGPUs", f"{it.name} has only {it.gpu_count} GPUs per node"))
        if spec.gpu_shape:
            try:
                if it.gpu_model not in gpu_model_variants(spec.gpu_shape):
                    errors.append(
                        FieldError("gpuShape", f"{spec.gpu_shape!r} does not match {it.name} ({it.gpu_model})")
                    )
            except InputError as exc:
                errors.append(FieldError("gpuShape", str(exc)))
        if not _mem_ok(spec, it.gpu_memory_mib):
            errors.append(
                FieldError("memoryPerGpu", f"{it.name} has {it.gpu_memory_mib // 1024} GB per GPU, asked for more")
            )
        return errors
    if not spec.gpu_shape and not spec.enable_auto_gpu_selection:
        errors.append(FieldError("gpuShape", "give gpuShape or instanceType, or set enableAutoGpuSelection: true"))
        return errors
    if spec.gpu_shape:
        try:
            variants = gpu_model_variants(spec.gpu_shape)
        except InputError as exc:
            errors.append(FieldError("gpuShape", str(exc)))
            return errors
        shape_types = [it for it in catalog.instance_types if it.gpu_model in variants]
        if not shape_types and not spec.enable_auto_gpu_selection:
            known = ", ".join(models) or "none"
            errors.append(
                FieldError(
                    "gpuShape",
                    f"unknown GPU shape {spec.gpu_shape!r} ({normalize_gpu_model(spec.gpu_shape)}) in catalog "
                    f"{catalog.name}; available shapes: {known}",
                )
            )
            return errors
    if candidate_types(spec, catalog):
        return errors
    scope = [
        it
        for it in catalog.instance_types
        if it.gpu_model and (_allowed_models(spec) is None or it.gpu_model in (_allowed_models(spec) or ()))
    ]
    max_gpus = max((it.gpu_count for it in scope), default=0)
    if spec.number_of_gpus > max_gpus:
        errors.append(FieldError("numberOfGPUs", f"at most {max_gpus} GPUs per node are available for this shape"))
    else:
        max_mem = max((it.gpu_memory_mib for it in scope), default=0) // 1024
        errors.append(FieldError("memoryPerGpu", f"at most {max_mem} GB per GPU are available for this shape"))
    return errors


def parse_gpr_spec(data: Mapping[str, Any], catalog: Catalog, *, max_exit_s: int = DEFAULT_MAX_EXIT_S) -> GprSpec:
    """Parse and validate an EGS spec dict against ``catalog`` (``exitDuration`` at most ``max_exit_s``); raises
    :class:`GprValidationError` with every field-level problem."""
    spec = spec_from_dict(data, max_exit_s=max_exit_s)
    errors = validate_spec(spec, catalog)
    if errors:
        raise GprValidationError(errors)
    return spec


def estimate_cost(spec: GprSpec, catalog: Catalog) -> float:
    """Estimated cost (currency of the catalog) of ``spec`` on its cheapest candidate type for the full exit
    duration; 0.0 when the catalog has no candidate."""
    cands = candidate_types(spec, catalog)
    if not cands:
        return 0.0
    return round(_price(cands[0]) * spec.number_of_gpu_nodes * spec.exit_duration_s / 3600.0, 4)


# ------------------------------------------------------------------------------------------------------ lifecycle
class GprState(StrEnum):
    """``provisioningStatus`` of a GPR."""

    QUEUED = "Queued"
    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    COMPLETE = "Complete"
    RELEASED = "Released"
    FAILED = "Failed"
    EVICTED = "Evicted"
    CANCELLED = "Cancelled"


class Trigger(StrEnum):
    """What moves a GPR from one state to the next."""

    ADMIT = "admit"
    NODES_READY = "nodes-ready"
    EXIT_DURATION = "exit-duration"
    EARLY_RELEASE = "early-release"
    IDLE_TIMEOUT = "idle-timeout"
    PROVISIONING_FAILED = "provisioning-failed"
    NODE_LOST = "node-lost"
    DELAY_LIMIT = "delay-limit"
    UNSERVABLE = "unservable"
    EVICT = "evict"
    REQUEUE = "requeue"
    CANCEL = "cancel"


TRANSITIONS: Mapping[tuple[GprState, Trigger], GprState] = {
    (GprState.QUEUED, Trigger.ADMIT): GprState.PROVISIONING,
    (GprState.QUEUED, Trigger.CANCEL): GprState.CANCELLED,
    (GprState.QUEUED, Trigger.DELAY_LIMIT): GprState.FAILED,
    (GprState.QUEUED, Trigger.UNSERVABLE): GprState.FAILED,
    (GprState.PROVISIONING, Trigger.NODES_READY): GprState.PROVISIONED,
    (GprState.PROVISIONING, Trigger.PROVISIONING_FAILED): GprState.FAILED,
    (GprState.PROVISIONING, Trigger.EARLY_RELEASE): GprState.RELEASED,
    (GprState.PROVISIONING, Trigger.EVICT): GprState.EVICTED,
    (GprState.PROVISIONED, Trigger.EXIT_DURATION): GprState.COMPLETE,
    (GprState.PROVISIONED, Trigger.EARLY_RELEASE): GprState.RELEASED,
    (GprState.PROVISIONED, Trigger.IDLE_TIMEOUT): GprState.RELEASED,
    (GprState.PROVISIONED, Trigger.NODE_LOST): GprState.FAILED,
    (GprState.PROVISIONED, Trigger.EVICT): GprState.EVICTED,
    (GprState.FAILED, Trigger.REQUEUE): GprState.QUEUED,
    (GprState.EVICTED, Trigger.REQUEUE): GprState.QUEUED,
}
"""The whole state machine: (state, trigger) -> next state. Any pair not listed is an illegal transition."""

TRIGGER_DOCS: Mapping[Trigger, str] = {
    Trigger.ADMIT: "capacity was found: free inventory nodes reserved and/or a scale-up launched",
    Trigger.NODES_READY: "every node of the GPR is ready and labelled for it; the exit-duration clock starts",
    Trigger.EXIT_DURATION: "exitDuration elapsed since startTimestamp",
    Trigger.EARLY_RELEASE: "the user released the GPR (earlyRelease) before its exit duration",
    Trigger.IDLE_TIMEOUT: "no GPU use on its nodes for idleTimeOutDuration (when enforceIdleTimeOut)",
    Trigger.PROVISIONING_FAILED: "the provider rejected the launch, a node failed, or nodes missed the deadline",
    Trigger.NODE_LOST: "a node serving the provisioned GPR disappeared",
    Trigger.DELAY_LIMIT: "delayedCount reached MAX_DELAYED_COUNT without the GPR being served",
    Trigger.UNSERVABLE: "the spec no longer matches any instance type of the catalog",
    Trigger.EVICT: "a higher-priority GPR needed its capacity (the GPR has enableEviction)",
    Trigger.REQUEUE: "requeueOnFailure is set and retryCount is below the limit",
    Trigger.CANCEL: "the user cancelled the GPR while it was still queued",
}

HOLDING_STATES = frozenset({GprState.PROVISIONING, GprState.PROVISIONED})
"""States in which a GPR holds nodes."""
FINAL_STATES = frozenset({GprState.COMPLETE, GprState.RELEASED, GprState.CANCELLED})
"""States no transition leaves. Failed and Evicted are final unless requeued."""
_FAILURE_TRIGGERS = frozenset({Trigger.PROVISIONING_FAILED, Trigger.NODE_LOST, Trigger.DELAY_LIMIT, Trigger.UNSERVABLE})
_REQUEUEABLE = frozenset({Trigger.PROVISIONING_FAILED, Trigger.NODE_LOST, Trigger.EVICT})


@dataclass(frozen=True, slots=True)
class NodePoolDetails:
    """Where the GPR's nodes come from: provider, cluster, pool, provider node ids, the chosen instance type, the
    launch request id and how many nodes that launch asked for."""

    provider: str = ""
    cluster: str = ""
    pool: str = ""
    node_ids: tuple[str, ...] = ()
    instance_type: str = ""
    zone: str = ""
    request_id: str = ""
    count: int = 0


@dataclass(frozen=True, slots=True)
class GprStatus:
    """Observed state of a GPR. Times are Unix seconds; durations seconds."""

    provisioning_status: GprState = GprState.QUEUED
    internal_state: str = ""
    failure_reason: str = ""
    start_timestamp: float | None = None
    completion_timestamp: float | None = None
    remaining_duration_s: float | None = None
    num_gpus_allocated: int = 0
    node_list: tuple[str, ...] = ()
    cost: float = 0.0
    estimated_wait_time_s: float | None = None
    delayed_count: int = 0
    retry_count: int = 0
    evicted_by: str = ""
    scale_up_triggered: bool = False
    node_pool_details: NodePoolDetails = field(default_factory=NodePoolDetails)
    inventory_nodes: tuple[str, ...] = ()
    """Names of existing (not launched-for-it) nodes reserved for the GPR."""
    state_since: float = 0.0
    last_trigger: str = ""
    last_delayed_at: float | None = None
    idle_since: float | None = None


@dataclass(frozen=True, slots=True)
class Gpr:
    """A GPR: id, spec, status, creation time (Unix seconds)."""

    gpr_id: str
    spec: GprSpec
    status: GprStatus
    created_at: float

    @property
    def state(self) -> GprState:
        """The provisioning status."""
        return self.status.provisioning_status

    @property
    def request_id(self) -> str:
        """Idempotency key of the current attempt's launch: deterministic per GPR and attempt."""
        return f"{self.gpr_id}-a{self.status.retry_count}"


def new_gpr(gpr_id: str, spec: GprSpec, catalog: Catalog, now: float) -> Gpr:
    """A freshly queued GPR with its cost estimate."""
    return Gpr(gpr_id, spec, GprStatus(cost=estimate_cost(spec, catalog), state_since=now), now)


def _internal_state(state: GprState, before: GprState) -> str:
    if state in HOLDING_STATES:
        return "Reserved"
    if state is GprState.QUEUED:
        return ""
    return "Released" if before in HOLDING_STATES or before is GprState.QUEUED else ""


def transition(gpr: Gpr, trigger: Trigger, now: float, *, reason: str = "") -> Gpr:
    """Apply ``trigger`` to ``gpr`` per :data:`TRANSITIONS`; raises :class:`IllegalTransition` for a forbidden edge.

    Keeps the status bookkeeping consistent: ``internalState``, ``completionTimestamp`` on leaving for a final
    state, ``failureReason`` on failures, ``retryCount`` and a fresh attempt on requeue.
    """
    nxt = TRANSITIONS.get((gpr.state, trigger))
    if nxt is None:
        allowed = sorted(t.value for (s, t) in TRANSITIONS if s is gpr.state)
        raise IllegalTransition(
            f"GPR {gpr.gpr_id} is {gpr.state}: {trigger} is not allowed"
            + (f" (allowed: {', '.join(allowed)})" if allowed else " (the GPR is final)")
        )
    st = gpr.status
    changes: dict[str, Any] = {
        "provisioning_status": nxt,
        "internal_state": _internal_state(nxt, gpr.state),
        "state_since": now,
        "last_trigger": trigger.value,
        "idle_since": None,
    }
    if trigger in _FAILURE_TRIGGERS:
        changes["failure_reason"] = reason or TRIGGER_DOCS[trigger]
    if nxt is GprState.PROVISIONED:
        changes.update(
            start_timestamp=now,
            failure_reason="",
            remaining_duration_s=float(gpr.spec.exit_duration_s),
            estimated_wait_time_s=0.0,
        )
    if nxt is GprState.PROVISIONING:
        changes.update(failure_reason="", estimated_wait_time_s=0.0)
    if nxt in (GprState.COMPLETE, GprState.RELEASED, GprState.FAILED, GprState.EVICTED, GprState.CANCELLED):
        changes.update(completion_timestamp=now, remaining_duration_s=0.0 if st.start_timestamp else None)
        changes.update(estimated_wait_time_s=None)
    if nxt is GprState.QUEUED:
        changes.update(
            retry_count=st.retry_count + 1,
            delayed_count=0,
            last_delayed_at=None,
            start_timestamp=None,
            completion_timestamp=None,
            remaining_duration_s=None,
            num_gpus_allocated=0,
            node_list=(),
            inventory_nodes=(),
            scale_up_triggered=False,
            node_pool_details=NodePoolDetails(),
        )
    return replace(gpr, status=replace(st, **changes))


def cancel(gpr: Gpr, now: float) -> Gpr:
    """Cancel a queued GPR (:class:`IllegalTransition` in any other state)."""
    return transition(gpr, Trigger.CANCEL, now, reason="cancelled by the user")


def request_release(gpr: Gpr) -> Gpr:
    """Mark a provisioning or provisioned GPR for early release; the next plan releases it."""
    if gpr.state not in HOLDING_STATES:
        raise IllegalTransition(
            f"GPR {gpr.gpr_id} is {gpr.state}: only a Provisioning or Provisioned GPR can be released"
            + (" (cancel a queued one instead)" if gpr.state is GprState.QUEUED else "")
        )
    return replace(gpr, spec=replace(gpr.spec, early_release=True))


def with_priority(gpr: Gpr, priority: int) -> Gpr:
    """Change the priority of a GPR that is not final; raises :class:`GprValidationError` when out of range."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise GprValidationError(
            [FieldError("priority", f"must be an integer between {PRIORITY_MIN} and {PRIORITY_MAX}, got {priority!r}")]
        )
    if gpr.state in FINAL_STATES:
        raise IllegalTransition(f"GPR {gpr.gpr_id} is {gpr.state}: its priority can no longer change")
    return replace(gpr, spec=replace(gpr.spec, priority=priority))


# ---------------------------------------------------------------------------------------------- node labelling
def gpr_node_labels(gpr_id: str) -> dict[str, str]:
    """Labels of every node serving GPR ``gpr_id``."""
    return {GPR_LABEL: gpr_id}


def gpr_node_taints(gpr_id: str) -> tuple[Taint, ...]:
    """Taints of every node serving GPR ``gpr_id``: only its workloads may schedule there."""
    return (Taint(GPR_TAINT, TaintEffect.NO_SCHEDULE, gpr_id),)


def gpr_toleration(gpr_id: str) -> Toleration:
    """The toleration a workload of GPR ``gpr_id`` needs."""
    return Toleration(key=GPR_TAINT, operator="Equal", value=gpr_id, effect=TaintEffect.NO_SCHEDULE)


def _tolerates(tol: Toleration, taint: Taint) -> bool:
    if tol.effect is not None and tol.effect != taint.effect:
        return False
    if tol.operator == "Exists":
        return tol.key in ("", taint.key)
    return tol.key == taint.key and tol.value == taint.value


def admits_pod(gpr: Gpr, pod: Pod) -> bool:
    """True if ``pod`` belongs on the GPR's nodes: its labels match ``workloadSelector`` and it tolerates the GPR
    taint. An empty selector matches no pod (a GPR never attracts unrelated workloads by accident)."""
    sel = gpr.spec.workload_selector
    if not sel or any(pod.labels.get(k) != v for k, v in sel.items()):
        return False
    return all(any(_tolerates(t, taint) for t in pod.tolerations) for taint in gpr_node_taints(gpr.gpr_id))


def is_gpr_request_id(request_id: str) -> bool:
    """True if a provider request id was made by the GPR manager (``gpr-...-a<attempt>``)."""
    return request_id.startswith(REQUEST_ID_PREFIX) and re.search(r"-a\d+$", request_id) is not None


def gpr_id_of_request(request_id: str) -> str:
    """The gprId of a GPR launch request id."""
    return re.sub(r"-a\d+$", "", request_id)


# --------------------------------------------------------------------------------------------------- the planner
@dataclass(frozen=True, slots=True)
class GprConfig:
    """Planner settings. ``max_delayed_count`` 0 means never give up; ``max_nodes`` None means unlimited."""

    enable_dynamic_node: bool = True
    max_delayed_count: int = 20
    delay_interval_s: float = 60.0
    max_retry_count: int = 3
    provisioning_timeout_s: float = 1800.0
    scale_up_latency_s: float = 300.0
    """Expected time from launch to ready nodes, for wait-time estimates."""
    idle_gpu_threshold: float = 0.05
    """A node whose GPU utilisation (0..1) is at or below this is idle."""
    max_nodes: int | None = None
    """Most nodes gpuscale may have launched for GPRs at once."""
    unavailable_ttl_s: float = 600.0
    """How long an offering that reported insufficient capacity is skipped (the shell keeps the marks)."""
    provider: str = ""
    cluster: str = ""


@dataclass(frozen=True, slots=True)
class GprNode:
    """A node as the GPR planner sees it.

    ``created`` nodes were launched for a GPR (``request_id`` names the launch) and are deleted when it ends;
    others are existing inventory that a GPR borrows (labelled and tainted, never deleted). ``gpr_id`` is the
    node's current GPR label. ``gpu_utilization`` (0..1, None unknown) feeds the idle timeout.
    """

    name: str
    instance_type: str = ""
    gpu_model: str | None = None
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    gpus_used: int = 0
    ready: bool = True
    gpr_id: str | None = None
    created: bool = False
    node_id: str = ""
    request_id: str = ""
    hourly_cost: float = 0.0
    gpu_utilization: float | None = None


@dataclass(frozen=True, slots=True)
class CapacityView:
    """What the planner may use. ``scale_up_blocked`` says why launching is impossible now (e.g. a missing token);
    ``failed_requests`` maps launch request ids to the asynchronous failure the provider reported.
    ``observed_created`` is False when the provider's nodes could not be listed: launched nodes absent from
    ``nodes`` are then unknown, not lost. ``unavailable`` maps offerings that reported insufficient capacity to the
    time until which they are skipped (entries in the past are ignored)."""

    nodes: tuple[GprNode, ...] = ()
    scale_up_blocked: str | None = None
    failed_requests: Mapping[str, str] = field(default_factory=dict)
    observed_created: bool = True
    unavailable: Mapping[OfferingKey, float] = field(default_factory=dict)

    def skipped_offerings(self, now: float) -> frozenset[OfferingKey]:
        """Offerings still marked unavailable at ``now``."""
        return frozenset(k for k, until in self.unavailable.items() if until > now)


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    """One state change the plan made."""

    gpr_id: str
    from_state: GprState
    to_state: GprState
    trigger: Trigger
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LaunchAction:
    """Launch ``count`` nodes for a GPR. ``request_id`` is deterministic per GPR and attempt (idempotent)."""

    gpr_id: str
    request_id: str
    pool: str
    instance_type: str
    zone: str
    count: int
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]


@dataclass(frozen=True, slots=True)
class AssignNode:
    """Label and taint an existing node for a GPR (idempotent)."""

    gpr_id: str
    node_name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]


@dataclass(frozen=True, slots=True)
class DeleteNode:
    """Delete a node launched for a GPR that no longer holds it, by its provider id."""

    node_id: str
    node_name: str
    gpr_id: str


@dataclass(frozen=True, slots=True)
class UnassignNode:
    """Remove the GPR label and taint from an existing node that its GPR no longer holds."""

    node_name: str
    gpr_id: str


@dataclass(frozen=True, slots=True)
class GprActions:
    """The result of :func:`plan_gprs`: persist ``updates`` (write-ahead) first, then apply the node actions in
    order: deletes and unassigns, then assigns and launches."""

    updates: tuple[Gpr, ...] = ()
    transitions: tuple[TransitionRecord, ...] = ()
    launches: tuple[LaunchAction, ...] = ()
    assigns: tuple[AssignNode, ...] = ()
    deletes: tuple[DeleteNode, ...] = ()
    unassigns: tuple[UnassignNode, ...] = ()

    def by_id(self) -> dict[str, Gpr]:
        """Updated GPRs by id."""
        return {g.gpr_id: g for g in self.updates}


def queue_order(gprs: Iterable[Gpr]) -> list[Gpr]:
    """Queued GPRs in service order: higher priority first, then older, then id."""
    return sorted(
        (g for g in gprs if g.state is GprState.QUEUED), key=lambda g: (-g.spec.priority, g.created_at, g.gpr_id)
    )


def _node_matches(spec: GprSpec, node: GprNode) -> bool:
    if node.created or not node.ready or not node.gpu_count:
        return False
    if node.gpu_count - node.gpus_used < spec.number_of_gpus or not _mem_ok(spec, node.gpu_memory_mib):
        return False
    if spec.instance_type:
        return node.instance_type == spec.instance_type
    allowed = _allowed_models(spec)
    if allowed is None:
        return spec.enable_auto_gpu_selection and node.gpu_model is not None
    return node.gpu_model in allowed


def _pick_nodes(spec: GprSpec, free: Sequence[GprNode], n: int) -> list[GprNode]:
    """Up to ``n`` matching free nodes, tightest fit first (fewest GPUs, cheapest, name)."""
    match = [x for x in free if _node_matches(spec, x)]
    match.sort(key=lambda x: (x.gpu_count - x.gpus_used, x.hourly_cost, x.name))
    return match[:n]


def _launch_action(g: Gpr, types: Mapping[str, InstanceType]) -> LaunchAction:
    d = g.status.node_pool_details
    labels = {**gpr_node_labels(g.gpr_id), POOL: d.pool}
    it = types.get(d.instance_type)
    if it is not None and it.gpu_model:
        labels[GPU_PRODUCT] = it.gpu_model
    return LaunchAction(
        gpr_id=g.gpr_id,
        request_id=d.request_id,
        pool=d.pool,
        instance_type=d.instance_type,
        zone=d.zone,
        count=d.count,
        labels=labels,
        taints=gpr_node_taints(g.gpr_id),
    )


def launch_action(gpr: Gpr, catalog: Catalog) -> LaunchAction:
    """The (idempotent) launch of a provisioning GPR's scale-up, from its ``nodePoolDetails``."""
    return _launch_action(gpr, catalog.by_name())


def retarget_launch(gpr: Gpr, catalog: Catalog, skip: Collection[OfferingKey]) -> Gpr | None:
    """Point a provisioning GPR's pending scale-up at the next candidate offering not in ``skip`` (after the
    current one reported insufficient capacity); None when no candidate is left.

    The launch keeps its request id (a refused launch created nothing), the pool and the node count; the instance
    type, zone and cost estimate follow the new offering.
    """
    st = gpr.status
    d = st.node_pool_details
    if gpr.state is not GprState.PROVISIONING or not st.scale_up_triggered or not d.count:
        return None
    options = candidate_offerings(gpr.spec, catalog, skip)
    if not options:
        return None
    it, offer = options[0]
    old = catalog.by_name().get(d.instance_type)
    old_offer = (
        next((o for o in old.offerings if o.zone == d.zone and o.capacity_type is CapacityType.ON_DEMAND), None)
        if old is not None
        else None
    )
    old_price = old_offer.hourly_price if old_offer is not None else 0.0
    hours = gpr.spec.exit_duration_s / 3600.0
    cost = max(0.0, st.cost + d.count * (offer.hourly_price - old_price) * hours)
    details = replace(d, instance_type=it.name, zone=offer.zone)
    return replace(gpr, status=replace(st, node_pool_details=details, cost=round(cost, 4)))


class _Planner:
    def __init__(self, gprs: Sequence[Gpr], view: CapacityView, catalog: Catalog, config: GprConfig, now: float):
        self.cur: dict[str, Gpr] = {g.gpr_id: g for g in gprs}
        self.orig = dict(self.cur)
        self.view = view
        self.catalog = catalog
        self.cfg = config
        self.now = now
        self.types = catalog.by_name()
        self.transitions: list[TransitionRecord] = []
        self.launches: list[LaunchAction] = []
        self.skip = view.skipped_offerings(now)
        self._cands: dict[tuple[object, ...], tuple[InstanceType, ...]] = {}
        self._offers: dict[tuple[object, ...], tuple[tuple[InstanceType, Offering], ...]] = {}

    # -- helpers
    @staticmethod
    def _shape_key(spec: GprSpec) -> tuple[object, ...]:
        """The spec fields :func:`candidate_types` depends on (a pass sees many GPRs of few shapes)."""
        return (
            spec.instance_type,
            spec.gpu_shape,
            spec.enable_auto_gpu_selection,
            spec.number_of_gpus,
            spec.memory_per_gpu,
        )

    def cands(self, spec: GprSpec) -> tuple[InstanceType, ...]:
        key = self._shape_key(spec)
        if key not in self._cands:
            self._cands[key] = candidate_types(spec, self.catalog)
        return self._cands[key]

    def offers(self, spec: GprSpec, *, skip: bool = True) -> tuple[tuple[InstanceType, Offering], ...]:
        """Candidate offerings of ``spec`` without (``skip``) or with the ones marked out of capacity."""
        key = (*self._shape_key(spec), skip)
        if key not in self._offers:
            self._offers[key] = candidate_offerings(spec, self.catalog, self.skip if skip else frozenset())
        return self._offers[key]

    def move(self, g: Gpr, trigger: Trigger, reason: str = "") -> Gpr:
        nxt = transition(g, trigger, self.now, reason=reason)
        self.transitions.append(TransitionRecord(g.gpr_id, g.state, nxt.state, trigger, reason))
        self.cur[g.gpr_id] = nxt
        return nxt

    def set_status(self, g: Gpr, **changes: Any) -> Gpr:
        nxt = replace(g, status=replace(g.status, **changes))
        self.cur[g.gpr_id] = nxt
        return nxt

    def owned(self, g: Gpr) -> list[GprNode]:
        """Nodes currently serving ``g``: its launched nodes of the current attempt and its borrowed ones."""
        inv = set(g.status.inventory_nodes)
        rid = g.request_id
        return [n for n in self.view.nodes if (n.created and n.request_id == rid) or (not n.created and n.name in inv)]

    def dynamic_ok(self, g: Gpr) -> bool:
        return self.cfg.enable_dynamic_node and g.spec.enable_dynamic_node_pool

    def node_cost(self, n: GprNode) -> float:
        if n.hourly_cost:
            return n.hourly_cost
        it = self.types.get(n.instance_type)
        return _price(it) if it is not None and math.isfinite(_price(it)) else 0.0

    # -- steps
    def run(self) -> GprActions:
        for g in list(self.cur.values()):
            if g.state in HOLDING_STATES and g.spec.early_release:
                self.move(g, Trigger.EARLY_RELEASE, "released early by the user")
        for g in list(self.cur.values()):
            if g.state is GprState.PROVISIONED:
                self.step_provisioned(g)
            elif g.state is GprState.PROVISIONING:
                self.step_provisioning(g)
        for g in list(self.cur.values()):
            if (
                g.state in (GprState.FAILED, GprState.EVICTED)
                and g.spec.requeue_on_failure
                and g.status.last_trigger in _REQUEUEABLE
                and g.status.retry_count < self.cfg.max_retry_count
            ):
                self.move(g, Trigger.REQUEUE, f"requeued after {g.status.last_trigger}")
        waits = self.admit_queue()
        for gid, w in waits.items():
            g = self.cur[gid]
            if g.state is GprState.QUEUED and g.status.estimated_wait_time_s != w:
                self.set_status(g, estimated_wait_time_s=w)
        assigns, deletes, unassigns = self.node_actions()
        updates = tuple(g for gid, g in self.cur.items() if g != self.orig.get(gid))
        return GprActions(
            updates=updates,
            transitions=tuple(self.transitions),
            launches=tuple(self.launches),
            assigns=tuple(assigns),
            deletes=tuple(deletes),
            unassigns=tuple(unassigns),
        )

    def step_provisioned(self, g: Gpr) -> None:
        owned = self.owned(g)
        names = {n.name for n in owned}
        inv = set(g.status.inventory_nodes)
        missing = [x for x in g.status.node_list if x not in names and (self.view.observed_created or x in inv)]
        if missing:
            self.move(g, Trigger.NODE_LOST, f"node(s) {', '.join(missing)} disappeared")
            return
        start = g.status.start_timestamp if g.status.start_timestamp is not None else self.now
        end = start + g.spec.exit_duration_s
        if self.now >= end:
            self.move(g, Trigger.EXIT_DURATION, "exit duration reached")
            return
        idle_since = g.status.idle_since
        if g.spec.idle_timeout_s and g.spec.enforce_idle_timeout:
            utils = [n.gpu_utilization for n in owned]
            idle = bool(utils) and all(u is not None and u <= self.cfg.idle_gpu_threshold for u in utils)
            idle_since = (idle_since if idle_since is not None else self.now) if idle else None
            if idle_since is not None and self.now - idle_since >= g.spec.idle_timeout_s:
                self.move(g, Trigger.IDLE_TIMEOUT, f"no GPU use for {format_duration(self.now - idle_since)}")
                return
        self.set_status(g, remaining_duration_s=end - self.now, idle_since=idle_since)

    def step_provisioning(self, g: Gpr) -> None:
        st = g.status
        rid = g.request_id
        if st.scale_up_triggered and rid in self.view.failed_requests:
            self.move(g, Trigger.PROVISIONING_FAILED, self.view.failed_requests[rid])
            return
        owned = self.owned(g)
        created = [n for n in owned if n.created]
        ready = [n for n in owned if n.ready and n.gpr_id == g.gpr_id]
        if st.scale_up_triggered and st.node_pool_details.count and not self.view.observed_created:
            if self.view.scale_up_blocked is not None:
                self.move(g, Trigger.PROVISIONING_FAILED, self.view.scale_up_blocked)
            elif self.now - st.state_since >= self.cfg.provisioning_timeout_s:
                self.move(g, Trigger.PROVISIONING_FAILED, "launched nodes cannot be observed")
            return
        if len(ready) >= g.spec.number_of_gpu_nodes and len(created) >= st.node_pool_details.count:
            nodes = tuple(sorted(n.name for n in ready))
            details = replace(st.node_pool_details, node_ids=tuple(sorted(n.node_id for n in created)))
            g = self.move(g, Trigger.NODES_READY)
            cost = sum(self.node_cost(n) for n in ready) * g.spec.exit_duration_s / 3600.0
            self.set_status(
                g,
                node_list=nodes,
                num_gpus_allocated=g.spec.number_of_gpus * len(ready),
                node_pool_details=details,
                cost=round(cost, 4) if cost else g.status.cost,
            )
            return
        if self.now - st.state_since >= self.cfg.provisioning_timeout_s:
            self.move(
                g,
                Trigger.PROVISIONING_FAILED,
                f"{len(ready)}/{g.spec.number_of_gpu_nodes} nodes ready after "
                f"{format_duration(self.now - st.state_since)}",
            )
            return
        need = st.node_pool_details.count - len(created)
        if st.scale_up_triggered and need > 0:
            if self.view.scale_up_blocked is not None:
                self.move(g, Trigger.PROVISIONING_FAILED, self.view.scale_up_blocked)
                return
            d = st.node_pool_details
            if not created and OfferingKey(d.instance_type, d.zone, CapacityType.ON_DEMAND) in self.skip:
                moved = retarget_launch(g, self.catalog, self.skip)
                if moved is None:
                    self.move(g, Trigger.PROVISIONING_FAILED, self.no_capacity_reason(g.spec))
                    return
                g = self.set_status(moved, node_pool_details=moved.status.node_pool_details, cost=moved.status.cost)
                st = g.status
            if self.dynamic_ok(g):
                self.launches.append(_launch_action(g, self.types))
        if created:
            ids = tuple(sorted(n.node_id for n in created))
            if ids != st.node_pool_details.node_ids:
                self.set_status(g, node_pool_details=replace(st.node_pool_details, node_ids=ids))

    # -- admission
    def holders(self) -> list[Gpr]:
        return [g for g in self.cur.values() if g.state in HOLDING_STATES]

    def free_nodes(self) -> list[GprNode]:
        held: set[str] = set()
        for g in self.holders():
            held.update(g.status.inventory_nodes)
        return [n for n in self.view.nodes if not n.created and n.name not in held]

    def created_in_use(self) -> int:
        """Launched nodes counted against ``max_nodes``: those expected by holders plus leftovers not yet gone."""
        holders = self.holders()
        rids = {g.request_id for g in holders}
        expected = sum(g.status.node_pool_details.count for g in holders if g.status.scale_up_triggered)
        leftovers = sum(1 for n in self.view.nodes if n.created and n.request_id not in rids)
        return expected + leftovers

    def budget(self) -> float:
        return math.inf if self.cfg.max_nodes is None else max(0, self.cfg.max_nodes - self.created_in_use())

    def admit_queue(self) -> dict[str, float | None]:
        for g in queue_order(self.cur.values()):
            self.try_admit(g)
        return self.estimate_waits()

    def try_admit(self, g: Gpr) -> None:
        spec = g.spec
        cands = self.cands(spec)
        free = self.free_nodes()
        take = _pick_nodes(spec, free, spec.number_of_gpu_nodes)
        rest = spec.number_of_gpu_nodes - len(take)
        if not cands and not take:
            errors = validate_spec(spec, self.catalog)
            if errors:
                self.move(g, Trigger.UNSERVABLE, "; ".join(f"{e.field}: {e.message}" for e in errors))
                return
        offers = self.offers(spec) if cands else ()
        dyn = self.dynamic_ok(g) and bool(offers) and self.view.scale_up_blocked is None
        if rest == 0 or (dyn and rest <= self.budget()):
            self.admit(g, take, rest, offers)
            return
        victims = self.choose_victims(g, cands, dyn)
        if victims is not None:
            for v in victims:
                self.move(self.cur[v.gpr_id], Trigger.EVICT, f"evicted by {g.gpr_id} (priority {spec.priority})")
                self.set_status(self.cur[v.gpr_id], evicted_by=g.gpr_id)
            take = _pick_nodes(spec, self.free_nodes(), spec.number_of_gpu_nodes)
            self.admit(self.cur[g.gpr_id], take, spec.number_of_gpu_nodes - len(take), offers)
            return
        self.delay(g, self.why_not(g, cands, offers, len(take)))

    def admit(self, g: Gpr, take: list[GprNode], rest: int, offers: Sequence[tuple[InstanceType, Offering]]) -> None:
        details = NodePoolDetails(provider=self.cfg.provider, cluster=self.cfg.cluster or g.spec.cluster_name)
        if rest > 0:
            it, offer = offers[0]
            details = replace(
                details,
                pool=g.gpr_id,
                instance_type=it.name,
                zone=offer.zone,
                request_id=g.request_id,
                count=rest,
            )
        how = f"{len(take)} inventory node(s)" + (f" + scale-up of {rest} x {details.instance_type}" if rest else "")
        g = self.move(g, Trigger.ADMIT, how)
        cost = sum(self.node_cost(n) for n in take)
        if rest:
            cost += rest * offers[0][1].hourly_price
        g = self.set_status(
            g,
            inventory_nodes=tuple(sorted(n.name for n in take)),
            scale_up_triggered=rest > 0,
            node_pool_details=details,
            cost=round(cost * g.spec.exit_duration_s / 3600.0, 4),
            estimated_wait_time_s=self.cfg.scale_up_latency_s if rest else 0.0,
        )
        if rest and self.view.scale_up_blocked is None:
            self.launches.append(_launch_action(g, self.types))

    def delay(self, g: Gpr, why: str) -> None:
        st = g.status
        due = st.last_delayed_at is None or self.now - st.last_delayed_at >= self.cfg.delay_interval_s
        count = st.delayed_count + 1 if due else st.delayed_count
        g = self.set_status(
            g, failure_reason=why, delayed_count=count, last_delayed_at=self.now if due else st.last_delayed_at
        )
        if self.cfg.max_delayed_count and count >= self.cfg.max_delayed_count:
            self.move(g, Trigger.DELAY_LIMIT, why)

    def why_not(
        self, g: Gpr, cands: Sequence[InstanceType], offers: Sequence[tuple[InstanceType, Offering]], have: int
    ) -> str:
        spec = g.spec
        shape = spec.instance_type or spec.gpu_shape or "any GPU"
        base = f"{have}/{spec.number_of_gpu_nodes} free inventory node(s) with {spec.number_of_gpus} x {shape}"
        if not self.cfg.enable_dynamic_node:
            return f"{base} and ENABLE_DYNAMIC_NODE is false"
        if not spec.enable_dynamic_node_pool:
            return f"{base} and enableDynamicNodePool is false"
        if self.view.scale_up_blocked is not None:
            return self.view.scale_up_blocked
        if not cands:
            return f"{base} and no catalog instance type fits"
        if not offers:
            return f"{base} and {self.no_capacity_reason(spec)}"
        return f"{base} and the node limit is reached ({self.created_in_use()}/{self.cfg.max_nodes} nodes)"

    def capacity_back_at(self, spec: GprSpec) -> float:
        """When a scale-up for ``spec`` can next be tried: now, or when the first out-of-capacity mark expires."""
        if self.offers(spec):
            return self.now
        keys = {_offering_key(it, o) for it, o in self.offers(spec, skip=False)}
        return min((self.view.unavailable[k] for k in keys if k in self.skip), default=self.now)

    def no_capacity_reason(self, spec: GprSpec) -> str:
        """Why no offering can be launched for ``spec``: every candidate is marked out of capacity (and until when)."""
        keys = {_offering_key(it, o) for it, o in self.offers(spec, skip=False)}
        marked = sorted((k for k in keys if k in self.skip), key=lambda k: (k.instance_type, k.zone))
        names = ", ".join(f"{k.instance_type} in {k.zone}" for k in marked) or "none"
        until = min((self.view.unavailable[k] for k in marked), default=self.now)
        return f"insufficient capacity for every candidate offering ({names}); retrying after {format_timestamp(until)}"

    def choose_victims(self, g: Gpr, cands: Sequence[InstanceType], dyn: bool) -> list[Gpr] | None:
        """The fewest, lowest-priority evictable holders whose capacity lets ``g`` be served, or None."""
        pool = sorted(
            (
                h
                for h in self.holders()
                if h.spec.enable_eviction and h.spec.priority < g.spec.priority and h.gpr_id != g.gpr_id
            ),
            key=lambda h: (h.spec.priority, -h.created_at, h.gpr_id),
        )
        if not pool:
            return None
        free = self.free_nodes()
        budget = self.budget()
        inv_by_name = {n.name: n for n in self.view.nodes if not n.created}

        def serves(combo: Sequence[Gpr]) -> bool:
            freed = [inv_by_name[x] for h in combo for x in h.status.inventory_nodes if x in inv_by_name]
            have = len(_pick_nodes(g.spec, [*free, *freed], g.spec.number_of_gpu_nodes))
            extra = sum(h.status.node_pool_details.count for h in combo if h.status.scale_up_triggered)
            return have >= g.spec.number_of_gpu_nodes or (dyn and g.spec.number_of_gpu_nodes - have <= budget + extra)

        def key(combo: Sequence[Gpr]) -> tuple[int, int, int]:
            prios = [h.spec.priority for h in combo]
            return (len(combo), max(prios), sum(prios))

        if len(pool) <= 12:
            for k in range(1, len(pool) + 1):
                found = [list(c) for c in itertools.combinations(pool, k) if serves(c)]
                if found:
                    return min(found, key=key)
            return None
        chosen: list[Gpr] = []
        for h in pool:
            chosen.append(h)
            if serves(chosen):
                for x in sorted(chosen, key=lambda h: -h.spec.priority):
                    rest = [y for y in chosen if y is not x]
                    if rest and serves(rest):
                        chosen = rest
                return chosen
        return None

    # -- wait-time estimate
    def estimate_waits(self) -> dict[str, float | None]:
        """Expected seconds until each queued GPR's nodes are ready, simulating the queue in order against free
        inventory, the launch budget and the expected release times of holders (no backfilling: an upper-end
        estimate). None when the GPR cannot be served even after everything ahead of it finishes."""
        queued = queue_order(self.cur.values())
        out: dict[str, float | None] = {}
        if not queued:
            return out
        lat = self.cfg.scale_up_latency_s
        free = list(self.free_nodes())
        budget = self.budget()
        inv_by_name = {n.name: n for n in self.view.nodes if not n.created}
        events: list[tuple[float, int, tuple[GprNode, ...], int]] = []
        seq = itertools.count()
        for h in self.holders():
            st = h.status
            if h.state is GprState.PROVISIONED and st.start_timestamp is not None:
                end = st.start_timestamp + h.spec.exit_duration_s
            else:
                end = self.now + (lat if st.scale_up_triggered else 0.0) + h.spec.exit_duration_s
            nodes = tuple(inv_by_name[x] for x in st.inventory_nodes if x in inv_by_name)
            heapq.heappush(events, (max(end, self.now), next(seq), nodes, st.node_pool_details.count))
        t = self.now
        for g in queued:
            cands = self.cands(g.spec)
            dyn = self.dynamic_ok(g) and bool(cands) and self.view.scale_up_blocked is None
            launch_from = self.capacity_back_at(g.spec) if dyn else self.now
            while True:
                take = _pick_nodes(g.spec, free, g.spec.number_of_gpu_nodes)
                rest = g.spec.number_of_gpu_nodes - len(take)
                if rest == 0 or (dyn and rest <= budget):
                    break
                if not events:
                    take = []
                    break
                t_end, _, nodes, count = heapq.heappop(events)
                t = max(t, t_end)
                free.extend(nodes)
                budget += count
            if rest and not (dyn and rest <= budget):
                out[g.gpr_id] = None
                continue
            ready_at = max(t, launch_from) + lat if rest else t
            out[g.gpr_id] = round(ready_at - self.now, 3)
            taken = {n.name for n in take}
            free = [n for n in free if n.name not in taken]
            budget -= rest
            heapq.heappush(events, (ready_at + g.spec.exit_duration_s, next(seq), tuple(take), rest))
        return out

    # -- node actions
    def node_actions(self) -> tuple[list[AssignNode], list[DeleteNode], list[UnassignNode]]:
        holders = self.holders()
        owner_inv = {x: g.gpr_id for g in holders for x in g.status.inventory_nodes}
        rids = {g.request_id for g in holders}
        assigns: list[AssignNode] = []
        deletes: list[DeleteNode] = []
        unassigns: list[UnassignNode] = []
        for n in self.view.nodes:
            if n.created:
                if n.request_id not in rids and self.cfg.enable_dynamic_node and n.node_id:
                    deletes.append(DeleteNode(n.node_id, n.name, n.gpr_id or gpr_id_of_request(n.request_id)))
                continue
            owner = owner_inv.get(n.name)
            if owner is not None and n.gpr_id != owner:
                assigns.append(AssignNode(owner, n.name, gpr_node_labels(owner), gpr_node_taints(owner)))
            elif owner is None and n.gpr_id is not None:
                unassigns.append(UnassignNode(n.name, n.gpr_id))
        return assigns, deletes, unassigns


def plan_gprs(gprs: Sequence[Gpr], view: CapacityView, catalog: Catalog, config: GprConfig, now: float) -> GprActions:
    """One pure planning pass over the GPRs.

    In order: early releases; exit-duration completion, idle-timeout release and lost nodes of provisioned GPRs;
    readiness, failures and (idempotent) launches of provisioning GPRs; requeue of failed/evicted GPRs with
    ``requeueOnFailure``; admission of queued GPRs in :func:`queue_order` from free inventory and/or a scale-up
    (when dynamic nodes are enabled and under ``max_nodes``), else eviction of the fewest, lowest-priority
    evictable holders, else a delay (counted at most once per ``delay_interval_s``; at ``max_delayed_count`` the GPR
    fails with the reason it waited for); wait-time estimates; and the node actions (label borrowed nodes, delete
    launched nodes and unlabel borrowed nodes whose GPR no longer holds them).
    """
    return _Planner(gprs, view, catalog, config, now).run()


# ---------------------------------------------------------------------------------------------- serialisation
def status_to_dict(status: GprStatus, *, remaining_s: float | None = None) -> dict[str, Any]:
    """EGS status dict (timestamps RFC 3339, durations like ``0d7h59m``); ``remaining_s`` overrides the stored
    remaining duration."""
    remaining = status.remaining_duration_s if remaining_s is None else remaining_s
    d = status.node_pool_details
    return {
        "provisioningStatus": status.provisioning_status.value,
        "internalState": status.internal_state,
        "failureReason": status.failure_reason,
        "startTimestamp": format_timestamp(status.start_timestamp),
        "completionTimestamp": format_timestamp(status.completion_timestamp),
        "remainingDuration": None if remaining is None else format_duration(remaining),
        "numGPUsAllocated": status.num_gpus_allocated,
        "nodeList": list(status.node_list),
        "cost": status.cost,
        "estimatedWaitTime": None
        if status.estimated_wait_time_s is None
        else format_duration(status.estimated_wait_time_s),
        "delayedCount": status.delayed_count,
        "retryCount": status.retry_count,
        "evictedBy": status.evicted_by,
        "scaleUpTriggered": status.scale_up_triggered,
        "nodePoolDetails": {
            "provider": d.provider,
            "cluster": d.cluster,
            "pool": d.pool,
            "nodeIds": list(d.node_ids),
            "instanceType": d.instance_type,
        },
    }


def gpr_to_dict(gpr: Gpr, *, now: float | None = None) -> dict[str, Any]:
    """The API form of a GPR: ``gprId``, ``createdTimestamp``, EGS ``spec`` and ``status``. With ``now`` the
    remaining duration of a provisioned GPR is computed for that instant."""
    st = gpr.status
    remaining = None
    if now is not None and gpr.state is GprState.PROVISIONED and st.start_timestamp is not None:
        remaining = max(0.0, st.start_timestamp + gpr.spec.exit_duration_s - now)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "gprId": gpr.gpr_id,
        "createdTimestamp": format_timestamp(gpr.created_at),
        "priorityBand": priority_band(gpr.spec.priority),
        "spec": spec_to_dict(gpr.spec),
        "status": status_to_dict(gpr.status, remaining_s=remaining),
    }


def status_to_record(status: GprStatus) -> dict[str, Any]:
    """Lossless JSON-able form of a status (for storage)."""
    d = status.node_pool_details
    return {
        "provisioning_status": status.provisioning_status.value,
        "internal_state": status.internal_state,
        "failure_reason": status.failure_reason,
        "start_timestamp": status.start_timestamp,
        "completion_timestamp": status.completion_timestamp,
        "remaining_duration_s": status.remaining_duration_s,
        "num_gpus_allocated": status.num_gpus_allocated,
        "node_list": list(status.node_list),
        "cost": status.cost,
        "estimated_wait_time_s": status.estimated_wait_time_s,
        "delayed_count": status.delayed_count,
        "retry_count": status.retry_count,
        "evicted_by": status.evicted_by,
        "scale_up_triggered": status.scale_up_triggered,
        "node_pool_details": {
            "provider": d.provider,
            "cluster": d.cluster,
            "pool": d.pool,
            "node_ids": list(d.node_ids),
            "instance_type": d.instance_type,
            "zone": d.zone,
            "request_id": d.request_id,
            "count": d.count,
        },
        "inventory_nodes": list(status.inventory_nodes),
        "state_since": status.state_since,
        "last_trigger": status.last_trigger,
        "last_delayed_at": status.last_delayed_at,
        "idle_since": status.idle_since,
    }


def status_from_record(rec: Mapping[str, Any]) -> GprStatus:
    """Inverse of :func:`status_to_record`."""
    d = dict(rec.get("node_pool_details") or {})
    details = NodePoolDetails(
        provider=d.get("provider", ""),
        cluster=d.get("cluster", ""),
        pool=d.get("pool", ""),
        node_ids=tuple(d.get("node_ids", ())),
        instance_type=d.get("instance_type", ""),
        zone=d.get("zone", ""),
        request_id=d.get("request_id", ""),
        count=int(d.get("count", 0)),
    )
    return GprStatus(
        provisioning_status=GprState(rec["provisioning_status"]),
        internal_state=rec.get("internal_state", ""),
        failure_reason=rec.get("failure_reason", ""),
        start_timestamp=rec.get("start_timestamp"),
        completion_timestamp=rec.get("completion_timestamp"),
        remaining_duration_s=rec.get("remaining_duration_s"),
        num_gpus_allocated=int(rec.get("num_gpus_allocated", 0)),
        node_list=tuple(rec.get("node_list", ())),
        cost=float(rec.get("cost", 0.0)),
        estimated_wait_time_s=rec.get("estimated_wait_time_s"),
        delayed_count=int(rec.get("delayed_count", 0)),
        retry_count=int(rec.get("retry_count", 0)),
        evicted_by=rec.get("evicted_by", ""),
        scale_up_triggered=bool(rec.get("scale_up_triggered", False)),
        node_pool_details=details,
        inventory_nodes=tuple(rec.get("inventory_nodes", ())),
        state_since=float(rec.get("state_since", 0.0)),
        last_trigger=rec.get("last_trigger", ""),
        last_delayed_at=rec.get("last_delayed_at"),
        idle_since=rec.get("idle_since"),
    )
