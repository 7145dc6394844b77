"""GPR spec: the dict reader that turns a request into a :class:`GprSpec` (every field-level problem reported at
once as :class:`GprValidationError`), with field names, bounds and patterns from :mod:`gpuscale.core.gpr.schema`."""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuscale.core.durations import format_egs_duration, parse_egs_duration
from gpuscale.core.gpr.schema import (
    CLUSTER_NAME_MAX,
    DEFAULT_PRIORITY,
    DNS1123_SUBDOMAIN,
    FIELDS_BY_NAME,
    IGNORED_EGS_FIELDS,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_SELECTOR_LABELS,
    RELEASE_POLICIES,
    SPEC_ALIASES,
    SPEC_FIELDS,
    TEXT_MAX,
)
from gpuscale.errors import InputError, short_repr

API_VERSION = "gpuscale.io/v1alpha1"
KIND = "GPUProvisioningRequest"
SHORT_NAME = "gpr"


GPR_LABEL = "gpuscale.io/gpr"
"""Label (value: the gprId) on every node serving a GPR; pods select it with a node selector."""
GPR_TAINT = "gpuscale.io/gpr"
"""``NoSchedule`` taint key (value: the gprId) on every node serving a GPR; its workloads tolerate it."""
REQUEST_ID_PREFIX = "gpr-"
RELEASE_POLICY_LABEL = "gpuscale.io/gpr-release-policy"
"""Label (``Consolidate`` or ``Delete``, the GPR's ``releasePolicy``) on every node launched for a GPR: the node
controller reads it when the GPR lets the node go (and after a restart)."""


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
    release_policy: str = RELEASE_POLICIES[0]
    """``Consolidate``: launched nodes return to their pool when the GPR ends; ``Delete``: they are deleted."""

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes."""
        return self.number_of_gpus * self.number_of_gpu_nodes


_LABEL_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)
_LABEL_KEY_RE = re.compile(LABEL_KEY_PATTERN)
_DNS1123_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN)
_BAD_CHARS_RE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
"""C0/C1 controls, bidi marks/overrides/isolates, BOM and lone UTF-16 surrogates: refused in every string."""

MAX_REPORTED = 10
"""Unknown fields reported one by one; the rest are counted."""
DEFAULT_MAX_EXIT_S = 365 * 86400
"""Default upper bound on ``exitDuration`` (the server's ``GPUSCALE_MAX_EXIT_DURATION`` changes it)."""
MAX_EXIT_CEILING_S = 100 * 365 * 86400
"""Hard ceiling on any duration, whatever the configured maximum (keeps times finite and JSON-safe)."""


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

    def text(self, name: str) -> str | None:
        """A text field with the required flag and length limit of its :data:`SPEC_SCHEMA` row."""
        f = FIELDS_BY_NAME[name]
        return self.string(name, required=f.required, max_len=f.max_length or TEXT_MAX)

    def count(self, name: str) -> int | None:
        """An integer field with the default and bounds of its :data:`SPEC_SCHEMA` row."""
        f = FIELDS_BY_NAME[name]
        assert f.minimum is not None and f.maximum is not None
        default = f.default if isinstance(f.default, int) and not isinstance(f.default, bool) else None
        return self.integer(name, default, f.minimum, f.maximum)

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
            seconds = parse_egs_duration(v, where=name)
        except InputError as exc:
            self.err(name, f"{exc.args[0].split(': ', 1)[-1]}")
            return None
        if seconds > max_s:
            self.err(name, f"must be at most {format_egs_duration(max_s)}, got {format_egs_duration(seconds)}")
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
    name = r.text("requestName")
    cluster = r.text("clusterName")
    if cluster and not _DNS1123_SUBDOMAIN_RE.fullmatch(cluster):
        r.err("clusterName", "must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')")
    exit_s = r.duration("exitDuration", required=True, max_s=min(max_exit_s, MAX_EXIT_CEILING_S))
    if exit_s == 0:
        r.err("exitDuration", "must be longer than zero")
    idle_s = r.duration("idleTimeOutDuration", max_s=MAX_EXIT_CEILING_S)
    if idle_s == 0:
        idle_s = None
    gpus = r.count("numberOfGPUs")
    nodes = r.count("numberOfGPUNodes")
    mem = r.count("memoryPerGpu")
    prio = r.count("priority")
    enforce = r.boolean("enforceIdleTimeOut", None)
    selector = _workload_selector(r)
    policy = r.text("releasePolicy")
    if policy is not None and policy not in RELEASE_POLICIES:
        r.err("releasePolicy", f"must be {' or '.join(RELEASE_POLICIES)}, got {short_repr(policy, 40)}")
        policy = None
    spec = GprSpec(
        request_name=name or "",
        exit_duration_s=exit_s or 0,
        cluster_name=cluster or "",
        instance_type=r.text("instanceType"),
        gpu_shape=r.text("gpuShape"),
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
        release_policy=policy or RELEASE_POLICIES[0],
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
        "exitDuration": format_egs_duration(spec.exit_duration_s),
        "idleTimeOutDuration": format_egs_duration(spec.idle_timeout_s) if spec.idle_timeout_s else None,
        "enforceIdleTimeOut": spec.enforce_idle_timeout,
        "earlyRelease": spec.early_release,
        "enableEviction": spec.enable_eviction,
        "requeueOnFailure": spec.requeue_on_failure,
        "enableDynamicNodePool": spec.enable_dynamic_node_pool,
        "workloadSelector": {"matchLabels": dict(spec.workload_selector)},
        "releasePolicy": spec.release_policy,
    }
