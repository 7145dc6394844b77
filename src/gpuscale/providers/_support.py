"""Naming helpers the cloud providers share: the digest form of a long or unusable key, and the pool of an offering."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from gpuscale.providers.base import LaunchRequest


def digest_key(value: str) -> str:
    """``h-`` + 30 hex digits of the SHA-256 of ``value``: the form of a key a cloud would not take as it is."""
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:30]


def scrub_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every non-empty secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def pool_name(request: LaunchRequest) -> str:
    """The cloud node pool of a request's offering: ``gpuscale-`` + a hash of pool, type, zone, capacity, labels and
    taints (requests that differ in any of them never share a pool)."""
    taints = sorted(str(t) for t in request.taints)
    raw = repr(
        (
            request.pool,
            request.instance_type,
            request.zone,
            str(request.capacity_type),
            sorted(request.labels.items()),
            taints,
        )
    )
    return "gpuscale-" + hashlib.sha256(raw.encode()).hexdigest()[:10]
