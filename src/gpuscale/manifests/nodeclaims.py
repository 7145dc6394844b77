"""``gpuscale.io/v1alpha1`` ``GPUNodeClaim``: the cluster's record of one node gpuscale launched.

A restarted controller reads these objects back (with the provider's node list) to rebuild its claim table, so no
node is leaked or launched twice. The object is cluster-scoped; :func:`object_name` names it after the claim's key
(the key itself when it is a DNS label; ``<request id>.<node id>`` for a second node of one request, keyed
``<request id>#<node id>``; else a readable stem and a hash), and ``spec.requestId`` keeps the key:

* ``spec`` (set once): ``requestId`` (the claim's key), ``pool``, ``instanceType``, ``zone``, ``capacityType``,
  ``hourlyPrice``,
  ``replaces``, ``requestedAt``, ``pods`` (the pending pods it was launched for, at most :data:`MAX_PODS`);
* ``metadata.labels``: ``gpuscale.io/pool``, and ``gpuscale.io/gpr`` (the GPR's id) on a node launched for a GPR;
* ``status`` (the status subresource): ``phase``, ``providerID``, ``nodeName``, ``reason``, ``phaseSince``,
  ``launchAttempts`` (failed launch attempts so far, while Requested).

Times are RFC 3339 strings in UTC. :func:`claim_object` writes a claim; :func:`read_record` reads one back with its
launch attempts and :func:`read_nodeclaim` the claim alone (strict: unknown fields are errors). The writer is
:mod:`gpuscale.kube.nodeclaims`. The field tables below are also what ``deploy/crds/gpunodeclaim.yaml`` is
generated from (:mod:`gpuscale.manifests.crds`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from typing import Any

from gpuscale.core.gpr import GPR_LABEL, gpr_id_of_request, is_gpr_request_id
from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.manifests.fields import as_float, as_int, as_list, as_mapping, as_str, check_fields, choice
from gpuscale.manifests.pools import TOP_FIELDS
from gpuscale.manifests.problems import Doc, FieldError

KIND = "GPUNodeClaim"
API_VERSION = "gpuscale.io/v1alpha1"
SPEC_FIELDS = (
    "requestId", "pool", "instanceType", "zone", "capacityType", "hourlyPrice", "replaces", "requestedAt", "pods"
)  # fmt: skip
STATUS_FIELDS = ("phase", "providerID", "nodeName", "reason", "phaseSince", "launchAttempts")
PHASES = tuple(str(p) for p in ClaimPhase)
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A DNS label (at most 63 characters): a key of this form is the object's name as it is."""
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""An object name: a lowercase RFC 1123 subdomain (see :func:`object_name`)."""
MAX_NAME = 253
MAX_LABEL = 63
KEY_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(#[!-~]+)?$"
"""A claim key (``spec.requestId``): gpuscale's request id (a DNS label), with ``#<node id>`` for a second node of
one request (the provider's node id: printable ASCII, no spaces)."""
MAX_KEY = 253
"""Longest claim key recorded."""
MAX_PODS = 64
"""Most pods a record names (a node launched for more records the first 64)."""
MAX_ATTEMPTS = 1_000_000
MAX_REASON = 256
"""Longest ``status.reason`` written (a longer reason is cut)."""
MAX_PRICE = 1_000_000.0
"""Largest hourly price accepted (far beyond any real instance)."""
_LABEL = re.compile(LABEL_PATTERN)
_KEY = re.compile(KEY_PATTERN)
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
STEM = 40
"""Characters of a key kept readable in a hashed name."""


def _is_label(text: str) -> bool:
    return len(text) <= MAX_LABEL and _LABEL.match(text) is not None


def recordable_key(key: str) -> bool:
    """True if ``key`` can be recorded: a claim key (:data:`KEY_PATTERN`) of at most :data:`MAX_KEY` characters."""
    return len(key) <= MAX_KEY and _KEY.match(key) is not None


def object_name(key: str) -> str:
    """The GPUNodeClaim name of claim ``key``: deterministic and collision-free, a lowercase RFC 1123 subdomain of at
    most 253 characters. A DNS-label key is its own name (no dot); ``<id>#<node id>`` with both parts DNS labels is
    ``<id>.<node id>`` (one dot); any other key is ``x.<stem>.<hash>`` (two dots: the key lowercased with other
    characters as ``-``, cut to 40, then 32 hex digits of its SHA-256), so the three forms never meet."""
    if _is_label(key):
        return key
    rid, sep, node = key.partition("#")
    if sep and _is_label(rid) and _is_label(node):
        return f"{rid}.{node}"
    stem = _NOT_LABEL.sub("-", key.lower()).strip("-")[:STEM].strip("-") or "claim"
    return f"x.{stem}.{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def record_labels(key: str, pool: str) -> dict[str, str]:
    """The labels of claim ``key``'s object: its pool, and the GPR a GPR node was launched for."""
    labels = {"gpuscale.io/pool": pool}
    rid = key.split("#", 1)[0]
    if is_gpr_request_id(rid):
        labels[GPR_LABEL] = gpr_id_of_request(rid)
    return labels


def rfc3339(t: float) -> str:
    """Epoch seconds as an RFC 3339 UTC time (``2026-01-02T03:04:05Z``, microseconds only when present)."""
    stamp = dt.datetime.fromtimestamp(t, tz=dt.UTC)
    text = stamp.isoformat(timespec="microseconds" if stamp.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def parse_time(value: object, path: str) -> float:
    """An RFC 3339 time with a zone -> epoch seconds."""
    text = as_str(value, path, required=True)
    try:
        stamp = dt.datetime.fromisoformat(text)
    except ValueError:
        raise FieldError(path, "is not an RFC 3339 time", text, fix='e.g. "2026-01-02T03:04:05Z"') from None
    if stamp.tzinfo is None:
        raise FieldError(path, "has no time zone", text, fix='append "Z" for UTC')
    return stamp.timestamp()


def claim_object(claim: NodeClaim, attempts: int = 0, key: str = "") -> dict[str, Any]:
    """The GPUNodeClaim object recording ``claim`` (spec and status) after ``attempts`` failed launch attempts;
    ``key`` is its key in the claim table (default: its request id)."""
    key = key or claim.request_id
    spec: dict[str, Any] = {
        "requestId": key,
        "pool": claim.pool,
        "instanceType": claim.instance_type,
        "zone": claim.zone,
        "capacityType": str(claim.capacity_type),
        "hourlyPrice": claim.hourly_price,
        "requestedAt": rfc3339(claim.created_at),
    }
    if claim.replaces:
        spec["replaces"] = claim.replaces
    if claim.pods:
        spec["pods"] = list(claim.pods[:MAX_PODS])
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": object_name(key), "labels": record_labels(key, claim.pool)},
        "spec": spec,
        "status": claim_status(claim, attempts),
    }


def claim_status(claim: NodeClaim, attempts: int = 0) -> dict[str, Any]:
    """The ``status`` of the claim's object (what a status-subresource patch sends); empty fields are left out."""
    status: dict[str, Any] = {"phase": str(claim.phase), "phaseSince": rfc3339(claim.since)}
    reason = claim.reason[:MAX_REASON]
    for key, value in (("providerID", claim.node_id), ("nodeName", claim.node_name), ("reason", reason)):
        if value:
            status[key] = value
    if attempts:
        status["launchAttempts"] = attempts
    return status


def read_nodeclaim(doc: Doc, obj: dict[str, Any]) -> NodeClaim | None:
    """The :class:`NodeClaim` a GPUNodeClaim object records; None if it has problems (reported to ``doc``)."""
    got = read_record(doc, obj)
    return None if got is None else got[0]


def read_record(doc: Doc, obj: dict[str, Any]) -> tuple[NodeClaim, int] | None:
    """(the :class:`NodeClaim`, its failed launch attempts) a GPUNodeClaim object records; None if it has problems
    (reported to ``doc``).

    An object without a status (created, never updated) is in phase Requested since its ``requestedAt``.
    """
    check_fields(doc, obj, "", TOP_FIELDS)
    meta: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    status: dict[str, Any] = {}
    with doc.field():
        meta = as_mapping(obj.get("metadata"), "metadata")
    with doc.field():
        spec = as_mapping(obj.get("spec"), "spec")
    with doc.field():
        status = as_mapping(obj.get("status"), "status")
    check_fields(doc, spec, "spec", SPEC_FIELDS)
    check_fields(doc, status, "status", STATUS_FIELDS)
    name = rid = pool = itype = zone = ""
    cap = CapacityType.ON_DEMAND
    price, requested = 0.0, 0.0
    with doc.field():
        name = as_str(meta.get("name"), "metadata.name", required=True)
        doc.name = name
    with doc.field():
        rid = as_str(spec.get("requestId"), "spec.requestId", required=True)
        if not recordable_key(rid):
            raise FieldError(
                "spec.requestId", f"must be a request id (a DNS label), with '#<node id>' for a second node, at most "
                f"{MAX_KEY} characters", rid, fix="use gpuscale's request id",
            )  # fmt: skip
        if name and object_name(rid) != name:
            raise FieldError(
                "spec.requestId",
                f"differs from metadata.name {name!r} (its record is named {object_name(rid)!r})",
                rid,
                fix="use the key the object was created for",
            )
    with doc.field():
        pool = as_str(spec.get("pool"), "spec.pool", required=True)
    with doc.field():
        itype = as_str(spec.get("instanceType"), "spec.instanceType", required=True)
    with doc.field():
        zone = as_str(spec.get("zone"), "spec.zone", required=True)
    with doc.field():
        cap = CapacityType(choice(spec.get("capacityType"), "spec.capacityType", [str(c) for c in CapacityType]))
    with doc.field():
        if spec.get("hourlyPrice") is not None:
            price = as_float(spec["hourlyPrice"], "spec.hourlyPrice", minimum=0.0, maximum=MAX_PRICE)
    replaces = ""
    with doc.field():
        replaces = as_str(spec.get("replaces"), "spec.replaces")
    with doc.field():
        requested = parse_time(spec.get("requestedAt"), "spec.requestedAt")
    pods: tuple[str, ...] = ()
    with doc.field():
        listed = as_list(spec.get("pods"), "spec.pods")
        if len(listed) > MAX_PODS:
            raise FieldError("spec.pods", f"names more than {MAX_PODS} pods", len(listed), fix="keep the first ones")
        pods = tuple(as_str(p, f"spec.pods[{i}]", required=True) for i, p in enumerate(listed))
    phase = ClaimPhase.REQUESTED
    since = requested
    node_id = node_name = reason = ""
    with doc.field():
        if status.get("phase") is not None:
            phase = ClaimPhase(choice(status["phase"], "status.phase", PHASES))
    with doc.field():
        if status.get("phaseSince") is not None:
            since = parse_time(status["phaseSince"], "status.phaseSince")
    with doc.field():
        node_id = as_str(status.get("providerID"), "status.providerID")
    with doc.field():
        node_name = as_str(status.get("nodeName"), "status.nodeName")
    with doc.field():
        reason = as_str(status.get("reason"), "status.reason")
    attempts = 0
    with doc.field():
        if status.get("launchAttempts") is not None:
            attempts = as_int(status["launchAttempts"], "status.launchAttempts", minimum=0, maximum=MAX_ATTEMPTS)
    if doc.failed:
        return None
    claim = NodeClaim(
        request_id=rid,
        pool=pool,
        instance_type=itype,
        zone=zone,
        capacity_type=cap,
        phase=phase,
        created_at=requested,
        since=since,
        hourly_price=price,
        node_id=node_id,
        node_name=node_name,
        pods=pods,
        replaces=replaces,
        reason=reason,
    )
    return claim, attempts
