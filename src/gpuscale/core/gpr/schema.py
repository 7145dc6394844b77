"""The GPR spec schema, written once: one :class:`SpecField` row per EGS field.

Three readers derive from :data:`SPEC_SCHEMA`: the core reader (:func:`gpuscale.core.gpr.spec.spec_from_dict` takes
its bounds and field list from here), the REST model and the OpenAPI body schema of the API (:mod:`gpuscale.gpr.api`)
and the CRD's OpenAPI schema (``deploy/crds/gpuprovisioningrequest.yaml``, written by
``python -m gpuscale.manifests.gpr_crd --out deploy/crds``). :func:`spec_json_schema` renders the table for the CRD
(OpenAPI v3.0, ``nullable``) or for the API (OpenAPI 3.1, ``type: [T, "null"]``, plus the REST-only EGS aliases and
ignored fields).

Patterns use only what Python's ``re``, Go's RE2 (the API server) and Rust's ``regex`` (pydantic) read alike: no
look-around and no ``\\u`` escapes. So the schema refuses C0/C1 control characters; bidi controls, the BOM and lone
surrogates, which have no escape common to the three, are refused by the core reader alone. The core also trims
whitespace around strings, reads a bare label map as ``workloadSelector``, checks label keys (the CRD with a CEL
rule) and caps ``exitDuration`` at the server's configured maximum: the schema cannot say those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["text", "integer", "boolean", "duration", "selector", "names"]

MAX_SELECTOR_LABELS = 32
LABEL_VALUE_MAX = 63
LABEL_KEY_MAX = 316
DURATION_TEXT_MAX = 32
_CTRL = r"\x00-\x1f\x7f-\x9f"
TEXT_PATTERN = rf"^[^{_CTRL}]*$"
"""Free text without control characters (blank allowed: an optional blank string is read as absent)."""
NONBLANK_TEXT_PATTERN = rf"^[^{_CTRL}]*[^{_CTRL}\s][^{_CTRL}]*$"
"""Free text without control characters and with at least one non-space character."""
DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
CLUSTER_PATTERN = rf"^( *|{DNS1123_SUBDOMAIN})$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
RELEASE_POLICIES = ("Consolidate", "Delete")
"""Values of ``releasePolicy`` (exact spelling); the first is the default."""
RELEASE_POLICY_PATTERN = rf"^( *|{'|'.join(RELEASE_POLICIES)})$"
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


def _egs_duration_pattern() -> str:
    """``0d8h0m``, ``8h``, ``30m``, ``90s``: units in d-h-m-s order, at least one, 1-12 digits each, any case."""
    units = [f"[0-9]{{1,12}}[{u}{u.upper()}]" for u in "dhms"]
    alternatives = ["".join([units[i], *(f"({u})?" for u in units[i + 1 :])]) for i in range(4)]
    return rf"^\s*({'|'.join(alternatives)})\s*$"


DURATION_PATTERN = _egs_duration_pattern()
NONZERO_PATTERN = "[1-9]"
"""Searched (not anchored): a duration with a non-zero digit is longer than zero."""


@dataclass(frozen=True, slots=True)
class SpecField:
    """One field of a GPR spec: its EGS name, kind, bounds, patterns (all must match) and documentation."""

    name: str
    kind: Kind
    description: str
    required: bool = False
    default: bool | int | None = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    patterns: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    """Other REST body keys read as this field (EGS spellings); never in the CRD."""
    rest_only: bool = False
    """An EGS REST key that is type-checked and ignored (no CRD field, no spec attribute)."""


REQUEST_NAME_MAX = 40
CLUSTER_NAME_MAX = 253
TEXT_MAX = 128
MAX_GPUS_PER_NODE = 64
MAX_NODES_PER_GPR = 100
MAX_MEMORY_PER_GPU_GB = 4096
PRIORITY_MIN = 1
PRIORITY_MAX = 300
DEFAULT_PRIORITY = 101

SPEC_SCHEMA: tuple[SpecField, ...] = (
    SpecField(
        "requestName",
        "text",
        "A name for the request.",
        required=True,
        max_length=REQUEST_NAME_MAX,
        patterns=(NONBLANK_TEXT_PATTERN,),
        aliases=("gprName",),
    ),
    SpecField(
        "clusterName",
        "text",
        "The cluster (e.g. the LKE cluster) whose nodes serve the request: a DNS-1123 subdomain.",
        max_length=CLUSTER_NAME_MAX,
        patterns=(CLUSTER_PATTERN,),
    ),
    SpecField(
        "instanceType",
        "text",
        "One catalog instance type, e.g. g2-gpu-rtx4000a4-s. Alternative to gpuShape.",
        max_length=TEXT_MAX,
        patterns=(TEXT_PATTERN,),
    ),
    SpecField(
        "gpuShape",
        "text",
        "GPU model, e.g. RTX4000-Ada (any common spelling). Alternative to instanceType.",
        max_length=TEXT_MAX,
        patterns=(TEXT_PATTERN,),
    ),
    SpecField(
        "enableAutoGpuSelection",
        "boolean",
        "Any GPU model with enough GPUs per node and memory may serve the request (gpuShape first).",
        default=False,
    ),
    SpecField("numberOfGPUs", "integer", "GPUs per node.", default=1, minimum=1, maximum=MAX_GPUS_PER_NODE),
    SpecField("numberOfGPUNodes", "integer", "Nodes.", default=1, minimum=1, maximum=MAX_NODES_PER_GPR),
    SpecField(
        "memoryPerGpu",
        "integer",
        "Minimum GPU memory per GPU, in GB.",
        minimum=0,
        maximum=MAX_MEMORY_PER_GPU_GB,
        aliases=("memoryPerGPU",),
    ),
    SpecField(
        "priority",
        "integer",
        "1-300; higher is served first. Low 1-100, medium 101-200, high 201-300.",
        default=DEFAULT_PRIORITY,
        minimum=PRIORITY_MIN,
        maximum=PRIORITY_MAX,
    ),
    SpecField(
        "exitDuration",
        "duration",
        "How long the nodes are held once ready, e.g. 0d8h0m, 8h or 30m (longer than zero).",
        required=True,
        max_length=DURATION_TEXT_MAX,
        patterns=(DURATION_PATTERN, NONZERO_PATTERN),
    ),
    SpecField(
        "idleTimeOutDuration",
        "duration",
        "Release the nodes after this long without GPU use, e.g. 30m (empty or 0m disables).",
        max_length=DURATION_TEXT_MAX,
        patterns=(f"^$|{DURATION_PATTERN}",),
    ),
    SpecField(
        "enforceIdleTimeOut",
        "boolean",
        "Whether the idle timeout releases the nodes (default true when a timeout is set).",
    ),
    SpecField("earlyRelease", "boolean", "Set to true to give the nodes back before exitDuration.", default=False),
    SpecField(
        "enableEviction",
        "boolean",
        "A higher-priority request that cannot be served otherwise may evict this one.",
        default=False,
    ),
    SpecField(
        "requeueOnFailure", "boolean", "Queue the request again after a failed attempt or an eviction.", default=False
    ),
    SpecField(
        "enableDynamicNodePool",
        "boolean",
        "Nodes may be created for the request (also needs ENABLE_DYNAMIC_NODE on the controller).",
        default=True,
    ),
    SpecField(
        "releasePolicy",
        "text",
        "gpuscale extension: what becomes of the nodes launched for the request when it is released or expires. "
        "Consolidate (default): they return to their pool as ordinary nodes and are consolidated like any other "
        "(after the pool's consolidateAfter when empty), so a later request can reuse them; Delete: they are drained "
        "and deleted at once. Borrowed existing nodes are always returned, never deleted.",
        max_length=TEXT_MAX,
        patterns=(RELEASE_POLICY_PATTERN,),
    ),
    SpecField(
        "workloadSelector",
        "selector",
        "Pods with these labels (tolerating the gpuscale.io/gpr taint) are the request's workloads.",
    ),
    SpecField(
        "sliceName",
        "text",
        "EGS workspace; accepted and ignored.",
        max_length=CLUSTER_NAME_MAX,
        patterns=(TEXT_PATTERN,),
        rest_only=True,
    ),
    SpecField(
        "preferredClusters",
        "names",
        "EGS cluster preference; accepted and ignored.",
        maximum=MAX_SELECTOR_LABELS,
        max_length=CLUSTER_NAME_MAX,
        rest_only=True,
    ),
    SpecField("enableAutoClusterSelection", "boolean", "EGS; accepted and ignored.", rest_only=True),
)
"""The GPR spec, in documentation order."""

SPEC_FIELDS: tuple[str, ...] = tuple(f.name for f in SPEC_SCHEMA if not f.rest_only)
"""EGS spec field names, in documentation order."""
SPEC_ALIASES: Mapping[str, str] = {a: f.name for f in SPEC_SCHEMA for a in f.aliases}
"""EGS REST body keys accepted for our fields."""
IGNORED_EGS_FIELDS: tuple[str, ...] = tuple(f.name for f in SPEC_SCHEMA if f.rest_only)
"""EGS REST body keys accepted, type-checked and ignored (gpuscale has no workspaces or cluster selection)."""
FIELDS_BY_NAME: Mapping[str, SpecField] = {f.name: f for f in SPEC_SCHEMA}


def _nullable(node: dict[str, Any], dialect: str) -> dict[str, Any]:
    if dialect == "crd":
        return {**node, "nullable": True}
    return {**node, "type": [node["type"], "null"]}


def _with_patterns(node: dict[str, Any], patterns: Sequence[str]) -> dict[str, Any]:
    if len(patterns) == 1:
        node["pattern"] = patterns[0]
    elif patterns:
        node["allOf"] = [{"pattern": p} for p in patterns]
    return node


def field_json_schema(f: SpecField, dialect: Literal["crd", "openapi31"]) -> dict[str, Any]:
    """The schema of one field: absent and null mean the default, as in the core reader."""
    node: dict[str, Any]
    if f.kind in ("text", "duration"):
        node = {"type": "string"}
        if f.max_length is not None:
            node["maxLength"] = f.max_length
        _with_patterns(node, f.patterns)
    elif f.kind == "integer":
        node = {"type": "integer", "minimum": f.minimum, "maximum": f.maximum}
    elif f.kind == "boolean":
        node = {"type": "boolean"}
    elif f.kind == "names":
        item = {"type": "string", "maxLength": f.max_length, "pattern": TEXT_PATTERN}
        node = {"type": "array", "maxItems": f.maximum, "items": item}
    else:
        labels: dict[str, Any] = {
            "type": "object",
            "maxProperties": MAX_SELECTOR_LABELS,
            "additionalProperties": {"type": "string", "maxLength": LABEL_VALUE_MAX, "pattern": LABEL_VALUE_PATTERN},
        }
        if dialect == "crd":
            labels["x-kubernetes-validations"] = [
                {
                    "rule": f"self.all(k, size(k) <= {LABEL_KEY_MAX} && k.matches('{LABEL_KEY_PATTERN}'))",
                    "message": "label keys must be valid Kubernetes label keys",
                }
            ]
        else:
            labels["propertyNames"] = {"maxLength": LABEL_KEY_MAX, "pattern": LABEL_KEY_PATTERN}
        node = {"type": "object", "properties": {"matchLabels": labels}}
        if dialect != "crd":
            node["additionalProperties"] = False
    out: dict[str, Any] = {"description": f.description, **node}
    if f.default is not None:
        out["default"] = f.default
    return out if f.required else _nullable(out, dialect)


def spec_json_schema(dialect: Literal["crd", "openapi31"], *, rest: bool = False) -> dict[str, Any]:
    """The spec object's schema: for the CRD (``crd``: structural, OpenAPI v3.0; unknown fields are pruned by the
    API server and refused by ``kubectl``'s strict field validation) or for the REST API (``openapi31``; with
    ``rest`` also the EGS aliases and ignored fields)."""
    props: dict[str, Any] = {}
    for f in SPEC_SCHEMA:
        if f.rest_only and not rest:
            continue
        props[f.name] = field_json_schema(f, dialect)
        if rest:
            for alias in f.aliases:
                props[alias] = {**field_json_schema(f, dialect), "description": f"EGS alias of {f.name}"}
    out: dict[str, Any] = {
        "type": "object",
        "required": [f.name for f in SPEC_SCHEMA if f.required],
        "properties": props,
    }
    if dialect == "crd":
        out["x-kubernetes-validations"] = [
            {
                "rule": "has(self.instanceType) || has(self.gpuShape) || "
                "(has(self.enableAutoGpuSelection) && self.enableAutoGpuSelection == true)",
                "message": "give gpuShape or instanceType, or set enableAutoGpuSelection to true",
            }
        ]
    else:
        out["additionalProperties"] = False
    return out
