"""Generate gpuscale's CustomResourceDefinitions from the readers' field tables.

``deploy/crds/gpunodepool.yaml``, ``offeringavailability.yaml`` and ``gpunodeclaim.yaml`` are written by
``gpuscale crds --out deploy/crds`` and checked by ``gpuscale crds --check deploy/crds`` (a test does the same).
Every object schema is built with :func:`obj`, which takes the parser's tuple of field names (``pools.SPEC_FIELDS``,
``nodeclaims.STATUS_FIELDS``, ...) and refuses a property list that differs from it, so a field added to a reader
without a schema (or the reverse) fails generation. Enumerations come from the core's enums; the validations are
those the readers enforce (ranges, patterns, required fields, CEL rules for the cross-field checks).

The GPUProvisioningRequest CRD is derived from the GPR schema elsewhere and is not written here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from gpuscale.core import labels as L
from gpuscale.core.headroom import HEADROOM_KEYS, HEADROOM_REQUIRED
from gpuscale.core.model import CapacityType, ConsolidationPolicy, SelectorOperator, TaintEffect
from gpuscale.core.resources import GPU_RESOURCE
from gpuscale.manifests import availability, nodeclaims, pools, status

Schema = dict[str, Any]
GROUP = "gpuscale.io"
VERSION = "v1alpha1"
DURATION = r"(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+"
"""A Go duration, as :func:`gpuscale.manifests.quantity.parse_duration` reads it."""
TIME = {"type": "string", "format": "date-time"}


def obj(
    fields: Sequence[str],
    props: Mapping[str, Schema],
    *,
    required: Sequence[str] = (),
    description: str = "",
    rules: Sequence[tuple[str, str]] = (),
) -> Schema:
    """An object schema whose properties are exactly ``fields`` (a reader's table), in that order."""
    missing = [f for f in fields if f not in props]
    extra = [p for p in props if p not in fields]
    if missing or extra:
        raise ValueError(f"schema and field table differ: missing {missing}, not in the table {extra}")
    unknown = [r for r in required if r not in fields]
    if unknown:
        raise ValueError(f"required fields not in the table: {unknown}")
    out: Schema = {"type": "object"}
    if description:
        out["description"] = description
    if required:
        out["required"] = list(required)
    out["properties"] = {f: props[f] for f in fields}
    if rules:
        out["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in rules]
    return out


def string(description: str = "", **kw: Any) -> Schema:
    """A string schema (``minLength``, ``pattern``, ``enum``, ``default`` ... as keywords)."""
    out: Schema = {"type": "string"}
    if description:
        out["description"] = description
    out.update(kw)
    return out


def integer(description: str = "", **kw: Any) -> Schema:
    """An integer schema."""
    out: Schema = {"type": "integer"}
    if description:
        out["description"] = description
    out.update(kw)
    return out


def array(items: Schema, description: str = "", **kw: Any) -> Schema:
    """An array schema."""
    out: Schema = {"type": "array"}
    if description:
        out["description"] = description
    out.update(kw)
    out["items"] = items
    return out


def enum(values: Sequence[str], description: str = "", **kw: Any) -> Schema:
    """A string that must be one of ``values``."""
    return string(description, enum=list(values), **kw)


QUANTITY: Schema = {"x-kubernetes-int-or-string": True}


def conditions() -> Schema:
    """A list of Kubernetes-style conditions, one per type."""
    item = obj(
        status.CONDITION_FIELDS,
        {
            "type": string(minLength=1, maxLength=316),
            "status": enum(status.CONDITION_STATUSES),
            "reason": string(maxLength=1024),
            "message": string(maxLength=32768),
            "lastTransitionTime": TIME,
            "observedGeneration": integer(minimum=0),
        },
        required=("type", "status", "lastTransitionTime"),
    )
    return {**array(item), "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


# ---------------------------------------------------------------------------------------------------- GPUNodePool
def _requirement() -> Schema:
    ops = [str(o) for o in SelectorOperator]
    return obj(
        ("key", "operator", "values"),
        {
            "key": enum(L.TEMPLATE_KEYS),
            "operator": enum(ops),
            "values": array(string(maxLength=128), maxItems=64),
        },
        required=("key", "operator"),
        rules=(
            (
                "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : true",
                "In and NotIn need at least one value",
            ),
            (
                "self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : true",
                "Exists and DoesNotExist take no values",
            ),
            (
                "self.operator in ['Gt', 'Lt'] ? has(self.values) && size(self.values) == 1"
                " && self.values[0].matches('^-?[0-9]+$') : true",
                "Gt and Lt need exactly one integer value",
            ),
        ),
    )


def _disruption() -> Schema:
    never_or_duration = f"^(Never|0|{DURATION})$"
    budget = obj(
        pools.BUDGET_FIELDS,
        {
            "nodes": string(pattern=pools._BUDGET_NODES.pattern, default="10%"),
            "schedule": string("Cron (5 fields, UTC) or a macro such as @daily; needs duration."),
            "duration": string(pattern=f"^(0|{DURATION})$"),
            "reasons": array(enum(pools.BUDGET_REASONS)),
        },
        rules=(("has(self.schedule) == has(self.duration)", "schedule and duration must be set together"),),
    )
    return obj(
        pools.DISRUPTION_FIELDS,
        {
            "consolidationPolicy": enum(
                [str(p) for p in ConsolidationPolicy], default=str(ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED)
            ),
            "consolidateAfter": string(
                'A duration ("30s", "10m", "1h30m") or "Never".', pattern=never_or_duration, default="30s"
            ),
            "consolidateEmptyAfter": string(
                'How long an empty node waits before removal ("30m", or "Never"); unset means consolidateAfter.'
                " Longer than consolidateAfter keeps freshly emptied GPU nodes warm for the next pods.",
                pattern=never_or_duration,
            ),
            "utilizationThreshold": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
            "useMeasuredGpuUtilization": {"type": "boolean", "default": False},
            "budgets": array(budget, maxItems=50),
            "terminationGracePeriod": string(
                "How long a draining node waits for its evicted pods, from the first accepted eviction, before it is"
                " deleted anyway (do-not-disrupt pods still hold a voluntary drain). Unset: no limit for a voluntary"
                " drain, 2m for a spot interruption or node failure.",
                pattern=f"^(0|{DURATION})$",
            ),
        },
    )


HEADROOM_FIELDS = HEADROOM_KEYS
"""``spec.headroom``: read by the Kubernetes controller (:mod:`gpuscale.kube.policy`) with the policy file's checks
(:func:`gpuscale.controller.policyopts.headroom_spec`), whose key list this is."""


def _headroom() -> Schema:
    duration = f"^{DURATION}$"
    return obj(
        HEADROOM_FIELDS,
        {
            "policy": enum(["Predictive"]),
            "maxNodes": integer("At most this many warm nodes.", minimum=1, maximum=1000),
            "maxHourlyCost": {
                "description": "At most this much per hour of warm nodes.",
                "type": "number",
                "minimum": 0,
                "maximum": 1e9,
            },
            "lead": string('The forecast window (default "10m").', pattern=duration),
            "quantile": {"type": "number", "minimum": 0, "maximum": 1},
            "days": integer(minimum=0, maximum=366),
            "minDays": integer(minimum=1, maximum=366),
            "recentWindows": integer(minimum=0, maximum=10_000),
            "instanceType": string("Warm nodes' instance type (default: cheapest per GPU).", minLength=1),
            "waitCostPerGpuHour": {"type": "number", "minimum": 0, "maximum": 1e9},
            "coldStart": string(pattern=duration),
            "launch": {"type": "boolean", "description": "false: only keep empty nodes warm, never launch one."},
        },
        required=HEADROOM_REQUIRED,
        description="Predictive warm headroom (gpuscale controller; see docs/policies.md).",
    )


def pool_schema() -> Schema:
    """The GPUNodePool ``openAPIV3Schema``."""
    spec = obj(
        (*pools.SPEC_FIELDS, "headroom"),
        {
            "instanceTypes": array(
                string(minLength=1), "Instance type names of the catalog; empty means every instance type."
            ),
            "requirements": array(
                _requirement(), "Requirements on the labels a node has before it exists; ANDed.", maxItems=32
            ),
            "labels": {
                "description": "Labels added to the pool's nodes (well-known labels are set by gpuscale).",
                "type": "object",
                "additionalProperties": {"type": "string"},
            },
            "taints": array(
                obj(
                    pools.POOL_TAINT_FIELDS,
                    {
                        "key": string(minLength=1),
                        "value": string(),
                        "effect": enum([str(e) for e in TaintEffect]),
                    },
                    required=("key", "effect"),
                )
            ),
            "minNodes": integer(minimum=0, default=0),
            "maxNodes": integer(minimum=0),
            "limits": obj(
                pools.LIMIT_FIELDS,
                {"cpu": QUANTITY, "memory": QUANTITY, GPU_RESOURCE: integer(minimum=0)},
                description="Upper bounds on the total capacity of the pool's nodes.",
            ),
            "weight": integer(
                "Higher-weight pools are preferred over cheaper lower-weight ones.",
                minimum=0,
                maximum=pools.MAX_WEIGHT,
                default=0,
            ),
            "capacityTypes": array(enum([str(c) for c in CapacityType])),
            "zones": array(string(minLength=1)),
            "daemonsetOverhead": obj(
                pools.OVERHEAD_FIELDS,
                {"cpu": QUANTITY, "memory": QUANTITY, "pods": integer(minimum=0)},
                description="Capacity taken on every node by DaemonSet pods.",
            ),
            "allowSpotFallback": {"type": "boolean", "default": True},
            "disruption": _disruption(),
            "headroom": _headroom(),
        },
        rules=(
            (
                "!has(self.maxNodes) || !has(self.minNodes) || self.maxNodes >= self.minNodes",
                "maxNodes must be >= minNodes",
            ),
        ),
    )
    pool_status = obj(
        status.POOL_STATUS_FIELDS,
        {
            "nodes": integer("Live nodes of the pool (launching, ready or draining).", minimum=0),
            "gpus": integer("GPUs on those nodes.", minimum=0),
            "hourlyCost": {
                "description": "What those nodes cost per hour (catalog currency).",
                "type": "number",
                "minimum": 0,
            },
            "conditions": conditions(),
        },
    )
    meta = {
        "type": "object",
        "properties": {"name": string(maxLength=63, pattern=pools._NAME.pattern)},
    }
    return _top(spec, pool_status, meta=meta, required=("spec",))


# -------------------------------------------------------------------------------------------- OfferingAvailability
def availability_schema() -> Schema:
    """The OfferingAvailability ``openAPIV3Schema``."""
    entry = obj(
        availability.ENTRY_FIELDS,
        {
            "instanceType": string(minLength=1),
            "zone": string("Absent means every zone of the instance type."),
            "capacityType": enum([str(c) for c in CapacityType], "Absent means both."),
            "until": {
                "description": 'RFC 3339 time with a zone, a duration from now ("15m"), or seconds from now.',
                "x-kubernetes-int-or-string": True,
            },
        },
        required=("instanceType", "until"),
    )
    spec = obj(availability.SPEC_FIELDS, {"unavailable": array(entry, maxItems=1000)})
    mark = obj(
        status.MARK_FIELDS,
        {
            "kind": enum(["backoff", "fallback", "retry"]),
            "key": string("The pool name, or the launch request id of a retry.", minLength=1),
            "until": string("RFC 3339 time the mark ends.", format="date-time"),
            "failures": integer("Consecutive failures so far.", minimum=0),
            "reason": string(maxLength=256),
        },
        required=("kind", "key", "until"),
    )
    marks = array(mark, "Back-offs, spot fallbacks and launch retries the controller keeps across restarts.")
    st = obj(status.AVAILABILITY_STATUS_FIELDS, {"conditions": conditions(), "marks": marks})
    return _top(spec, st)


# --------------------------------------------------------------------------------------------------- GPUNodeClaim
def nodeclaim_schema() -> Schema:
    """The GPUNodeClaim ``openAPIV3Schema``."""
    immutable = ("self == oldSelf", "spec is immutable: a claim records one launch")
    spec = obj(
        nodeclaims.SPEC_FIELDS,
        {
            "requestId": string(
                "The claim's key: the launch request id (the provider's idempotency key), with '#<node id>' for a "
                "second node of one request; metadata.name is derived from it.",
                maxLength=nodeclaims.MAX_KEY,
                pattern=nodeclaims.KEY_PATTERN,
            ),
            "pool": string("The GPUNodePool the node belongs to.", minLength=1),
            "instanceType": string(minLength=1),
            "zone": string(minLength=1),
            "capacityType": enum([str(c) for c in CapacityType]),
            "hourlyPrice": {"type": "number", "minimum": 0, "maximum": nodeclaims.MAX_PRICE},
            "replaces": string("The node this one was launched to replace, if any."),
            "requestedAt": {**TIME, "description": "When gpuscale asked the provider for the node."},
            "pods": array(
                string(minLength=1),
                "The pending pods (namespace/name) the node was launched for.",
                maxItems=nodeclaims.MAX_PODS,
            ),
        },
        required=("requestId", "pool", "instanceType", "zone", "capacityType", "requestedAt"),
        rules=(immutable,),
    )
    st = obj(
        nodeclaims.STATUS_FIELDS,
        {
            "phase": enum(nodeclaims.PHASES),
            "providerID": string("The provider's id of the node (its Node's spec.providerID)."),
            "nodeName": string("The Kubernetes Node name, once known."),
            "reason": string("Why the claim is in its phase."),
            "phaseSince": {**TIME, "description": "When the claim entered its phase."},
            "launchAttempts": integer(
                "Failed launch attempts so far (retried under the same request id).",
                minimum=0,
                maximum=nodeclaims.MAX_ATTEMPTS,
            ),
        },
    )
    meta = {
        "type": "object",
        "properties": {"name": string(maxLength=nodeclaims.MAX_NAME, pattern=nodeclaims.NAME_PATTERN)},
    }
    return _top(spec, st, meta=meta, required=("spec",))


def _top(spec: Schema, st: Schema, *, meta: Schema | None = None, required: Sequence[str] = ()) -> Schema:
    props = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": meta or {"type": "object"},
        "spec": spec,
        "status": st,
    }
    out: Schema = {"type": "object"}
    if required:
        out["required"] = list(required)
    out["properties"] = {f: props[f] for f in pools.TOP_FIELDS}
    return out


# ------------------------------------------------------------------------------------------------------ the CRDs
@dataclass(frozen=True, slots=True)
class CrdSpec:
    """One CRD: names, scope, printer columns, schema and the comment heading its file."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    schema: Schema
    columns: tuple[Schema, ...]
    comment: str
    scope: str = "Cluster"

    @property
    def file_name(self) -> str:
        return f"{self.kind.lower()}.yaml"

    def manifest(self) -> dict[str, Any]:
        """The CustomResourceDefinition object."""
        version: dict[str, Any] = {
            "name": VERSION,
            "served": True,
            "storage": True,
            "additionalPrinterColumns": [*self.columns, _col("Age", "date", ".metadata.creationTimestamp")],
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": self.schema},
        }
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{self.plural}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "scope": self.scope,
                "names": {
                    "kind": self.kind,
                    "listKind": f"{self.kind}List",
                    "plural": self.plural,
                    "singular": self.kind.lower(),
                    "shortNames": list(self.short_names),
                },
                "versions": [version],
            },
        }


def _col(name: str, type_: str, path: str, priority: int = 0) -> Schema:
    out: Schema = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        out["priority"] = priority
    return out


HEADER = "# Generated by `gpuscale crds --out deploy/crds` from the field tables of gpuscale.manifests; do not edit.\n"


def crd_specs() -> tuple[CrdSpec, ...]:
    """The CRDs gpuscale generates."""
    return (
        CrdSpec(
            kind="GPUNodePool",
            plural="gpunodepools",
            short_names=("gnp",),
            schema=pool_schema(),
            columns=(
                _col("Nodes", "integer", ".status.nodes"),
                _col("GPUs", "integer", ".status.gpus"),
                _col("$/h", "number", ".status.hourlyCost"),
                _col("Weight", "integer", ".spec.weight"),
                _col("Max", "integer", ".spec.maxNodes", priority=1),
            ),
            comment="GPUNodePool: a group of GPU nodes gpuscale may launch. Read by gpuscale.manifests.pools;\n"
            "reference: docs/snapshot-format.md. Unknown fields are pruned by the API server and rejected by\n"
            "`kubectl apply` (strict field validation), as gpuscale rejects them. The status is written by the\n"
            "controller: live nodes, their GPUs and their cost per hour.",
        ),
        CrdSpec(
            kind="OfferingAvailability",
            plural="offeringavailabilities",
            short_names=("oa",),
            schema=availability_schema(),
            columns=(),
            comment="OfferingAvailability: offerings (instance type x zone x capacity type) that must not be used\n"
            "until a time, e.g. after an insufficient-capacity error. Read by gpuscale.manifests.availability;\n"
            "reference: docs/snapshot-format.md.",
        ),
        CrdSpec(
            kind="GPUNodeClaim",
            plural="gpunodeclaims",
            short_names=("gnc",),
            schema=nodeclaim_schema(),
            columns=(
                _col("Pool", "string", ".spec.pool"),
                _col("Type", "string", ".spec.instanceType"),
                _col("Zone", "string", ".spec.zone"),
                _col("Capacity", "string", ".spec.capacityType", priority=1),
                _col("Phase", "string", ".status.phase"),
                _col("Node", "string", ".status.nodeName"),
                _col("$/h", "number", ".spec.hourlyPrice", priority=1),
            ),
            comment="GPUNodeClaim: gpuscale's record of one node it launched, named by the launch request id, so\n"
            "a restarted controller rebuilds its state from the cluster and the cloud. Written and read by\n"
            "gpuscale.manifests.nodeclaims; users only look at it (kubectl get gnc).",
        ),
    )


def render(spec: CrdSpec) -> str:
    """The CRD file's text: the comment heading, then the YAML."""
    comment = "".join(f"# {line}\n" for line in spec.comment.splitlines())
    body = yaml.safe_dump(spec.manifest(), sort_keys=False, allow_unicode=True, width=120)
    return HEADER + comment + body


def generate() -> dict[str, str]:
    """File name -> text of every generated CRD."""
    return {s.file_name: render(s) for s in crd_specs()}


def write(directory: Path) -> list[Path]:
    """Write every CRD into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in generate().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


def stale(directory: Path) -> list[str]:
    """The generated files that are missing from ``directory`` or differ from what would be generated."""
    bad = []
    for name, text in generate().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            bad.append(name)
    return bad


@click.command("crds")
@click.option(
    "--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None, help="Write the CRDs here."
)
@click.option(
    "--check",
    "check",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Exit 1 if the CRDs in this directory differ from the generated ones.",
)
def crds_command(out: Path | None, check: Path | None) -> None:
    """Print gpuscale's CRDs (GPUNodePool, OfferingAvailability, GPUNodeClaim), write them (--out) or --check them."""
    if check is not None:
        bad = stale(check)
        if bad:
            click.echo(f"error: out of date in {check}: {', '.join(bad)}; fix: gpuscale crds --out {check}", err=True)
            sys.exit(1)
        click.echo(f"{len(crd_specs())} CRDs in {check} are up to date")
        return
    if out is not None:
        try:
            written = write(out)
        except OSError as exc:
            click.echo(f"error: cannot write {out}: {exc.strerror}", err=True)
            sys.exit(2)
        for path in written:
            click.echo(f"wrote {path}")
        return
    click.echo("---\n".join(generate().values()), nl=False)
