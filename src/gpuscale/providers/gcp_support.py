"""Naming and error mapping of the GKE provider (:mod:`gpuscale.providers.gcp`): instance type -> machine and
accelerators, label-safe keys, the node pool of an offering, the API methods used, and SDK errors -> the error tree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from google.api_core import exceptions as gexc

from gpuscale.core.model import Taint, TaintEffect
from gpuscale.errors import (
    AuthenticationError,
    InsufficientCapacity,
    InvalidProviderRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers._support import digest_key

T = TypeVar("T")

PROVIDER_NAME = "gcp"
GPU_TAINT = Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present")
L_CLUSTER, L_POOL, L_TYPE, L_REQ, L_SLOT = (
    "gpuscale-cluster",
    "gpuscale-pool",
    "gpuscale-type",
    "gpuscale-req",
    "gpuscale-slot",
)
MAX_POOL_SIZE = 1000
API_CALLS = (
    "container.projects.locations.clusters.nodePools.list",
    "container.projects.locations.clusters.nodePools.create",
    "container.projects.locations.clusters.nodePools.setSize",
    "container.projects.locations.clusters.nodePools.delete",
    "container.projects.locations.operations.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.deleteInstances",
    "compute.instanceGroupManagers.listErrors",
    "compute.zoneOperations.get",
)
"""Every API method the provider calls (``docs/providers/gcp.md`` lists the IAM permissions for each)."""

_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{1,40}$")
_CAPACITY = re.compile(r"ZONE_RESOURCE_POOL_EXHAUSTED|STOCKOUT|does not have enough resources", re.IGNORECASE)
_QUOTA = re.compile(r"QUOTA_EXCEEDED|RESOURCE_EXHAUSTED|quota", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+")

_ACCELERATORS = {
    "t4": "nvidia-tesla-t4",
    "v100": "nvidia-tesla-v100",
    "p100": "nvidia-tesla-p100",
    "p4": "nvidia-tesla-p4",
}
_BUILT_IN = (  # (machine type pattern, accelerator type, GPU count from the name's number or a table)
    (re.compile(r"^a2-(?:highgpu|megagpu)-(\d+)g$"), "nvidia-tesla-a100"),
    (re.compile(r"^a2-ultragpu-(\d+)g$"), "nvidia-a100-80gb"),
    (re.compile(r"^a3-(?:highgpu|edgegpu)-(\d+)g$"), "nvidia-h100-80gb"),
    (re.compile(r"^a3-megagpu-(\d+)g$"), "nvidia-h100-mega-80gb"),
    (re.compile(r"^a3-ultragpu-(\d+)g$"), "nvidia-h200-141gb"),
)
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """What a node pool needs for an instance type: machine type, accelerator type and count."""

    machine_type: str
    accelerator_type: str
    accelerator_count: int


def machine_spec(instance_type: str) -> MachineSpec | None:
    """The machine and accelerators of a catalog instance type (``a3-highgpu-8g``, ``g2-standard-24``, or an N1 type
    with attached GPUs ``n1-standard-8-t4x2``); None when it is not a GPU type gpuscale knows."""
    m = re.fullmatch(r"(n1-[a-z]+-\d+)-([a-z0-9]+)x(\d+)", instance_type)
    if m and m.group(2) in _ACCELERATORS:
        return MachineSpec(m.group(1), _ACCELERATORS[m.group(2)], int(m.group(3)))
    for pattern, accel in _BUILT_IN:
        m = pattern.match(instance_type)
        if m:
            return MachineSpec(instance_type, accel, int(m.group(1)))
    m = re.fullmatch(r"g2-standard-(\d+)", instance_type)
    if m and int(m.group(1)) in _G2_GPUS:
        return MachineSpec(instance_type, "nvidia-l4", _G2_GPUS[int(m.group(1))])
    return None


def label_key(value: str) -> str:
    """A request id or pool name as a GCE label value: itself when it is one (lower-case, at most 40 characters),
    else ``h-`` + 30 hex digits of its SHA-256."""
    return value if _LABEL_VALUE.match(value) else digest_key(value)


def scrub(text: str) -> str:
    """``text`` with any bearer token masked."""
    return _BEARER.sub(r"\1***", text)


def op_error(message: str, what: str) -> ProviderError:
    """The error tree class of a failed operation's message."""
    text = f"gcp {what}: {scrub(message)[:300]}"
    if _CAPACITY.search(message):
        return InsufficientCapacity(text, provider=PROVIDER_NAME)
    if _QUOTA.search(message):
        return QuotaExceeded(text, provider=PROVIDER_NAME)
    return ProviderError(text, provider=PROVIDER_NAME)


def call(what: str, fn: Callable[[], T]) -> T:
    """Run one SDK call; map its failure to the error tree (chained, scrubbed). No retry here."""
    try:
        return fn()
    except gexc.GoogleAPICallError as exc:
        err = map_api_error(exc, what)
        exc._response = None  # the HTTP response holds the request, and so its Authorization header
        raise err from exc
    except gexc.RetryError as exc:
        err = TransientProviderError(f"gcp {what}: {scrub(str(exc))[:200]}", provider=PROVIDER_NAME)
    except OSError as exc:  # connection refused / reset, timeouts from the HTTP layer
        err = TransientProviderError(f"gcp {what}: connection failed ({type(exc).__name__})", provider=PROVIDER_NAME)
    except Exception as exc:
        if "google.auth" in type(exc).__module__:
            raise AuthenticationError(
                f"gcp {what}: no usable credentials ({type(exc).__name__})", provider=PROVIDER_NAME
            ) from None
        if "requests" in type(exc).__module__ or "urllib3" in type(exc).__module__:
            raise TransientProviderError(
                f"gcp {what}: connection failed ({type(exc).__name__})", provider=PROVIDER_NAME
            ) from None
        raise
    raise err from None


def map_api_error(exc: gexc.GoogleAPICallError, what: str) -> ProviderError:
    """The error tree class of an SDK error: capacity, quota, rate limit, auth, invalid, not found, transient."""
    status = int(exc.code or 0)
    reasons = " ".join(
        str(r)
        for r in [
            getattr(exc, "reason", None),
            *[e.get("reason", "") for e in (exc.errors or []) if isinstance(e, dict)],
        ]
        if r
    )
    message = scrub(f"{exc.message} {reasons}".strip())
    text = f"gcp {what}: {message[:300]}"
    if _CAPACITY.search(message):
        return InsufficientCapacity(text, provider=PROVIDER_NAME, status=status)
    if status == 403 and _QUOTA.search(message):
        return QuotaExceeded(text, provider=PROVIDER_NAME, status=status)
    if status == 429:
        if "QUOTA_EXCEEDED" in message or ("RESOURCE_EXHAUSTED" in message and "rate" not in message.lower()):
            return QuotaExceeded(text, provider=PROVIDER_NAME, status=status)
        return RateLimited(text, provider=PROVIDER_NAME, retry_after=5.0)
    if status in (401, 403):
        return AuthenticationError(
            f"gcp {what}: permission denied (HTTP {status}): {message[:200]}", provider=PROVIDER_NAME
        )
    if status == 404:
        return NotFound(text, provider=PROVIDER_NAME, status=404)
    if status in (400, 409, 412):
        return InvalidProviderRequest(message[:300], provider=PROVIDER_NAME, status=status)
    if status >= 500 or status == 408:
        return TransientProviderError(text, provider=PROVIDER_NAME, status=status)
    return ProviderError(text, provider=PROVIDER_NAME, status=status or None)
