"""The live controller's optional policies: ``--policy-file`` / ``GPUSCALE_POLICY_FILE`` and ``spec.headroom`` of a
GPUNodePool.

The policy file holds the simulator's ``policy`` mapping (either the mapping itself or a document with a ``policy``
key, so a scenario's block can be copied as is); it is read through the guarded loader (:mod:`gpuscale.inputs`) and
checked by :meth:`~gpuscale.controller.config.ControllerConfig.from_policy`, with the same one-line errors.
``--batch-idle`` on the command line wins over the file's ``batchIdle``; without either, the live default
(:data:`BATCH_IDLE_S`) applies.

A GPUNodePool's ``spec.headroom`` is the pool's predictive warm headroom (the simulator's per-pool ``headroom``): it
wins over the policy file's ``headroom`` entry for the same pool. A pool whose ``spec.headroom`` is invalid is skipped
as every unreadable pool is (its status says ``InvalidPool``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.policyopts import headroom_spec
from gpuscale.core.headroom import HeadroomSpec
from gpuscale.errors import InputError
from gpuscale.inputs import load_yaml_file

__all__ = ["BATCH_IDLE_S", "HEADROOM_FIELD", "POLICY_FILE_ENV", "live_config", "load_policy", "pool_headroom"]

BATCH_IDLE_S = 0.5
"""The live controller's batch window: a round starts as soon as the watch shows a new Unschedulable pod, and plans
once no new one arrived for this long (Karpenter's batchIdleDuration is 1 s; a short window keeps a burst in one plan
while the launch follows the burst closely)."""

POLICY_FILE_ENV = "GPUSCALE_POLICY_FILE"
HEADROOM_FIELD = "headroom"
"""The GPUNodePool spec field read here (not by :func:`gpuscale.manifests.pools.read_pool`)."""


def load_policy(path: str) -> dict[str, Any]:
    """The ``policy`` mapping of ``path``, checked (raises :class:`InputError`: one line naming file and field)."""
    data = load_yaml_file(path, what="policy file")
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InputError("must be a mapping of policy settings", where=path, value=data, fix="e.g. evictMaxPodAge: 6h")
    if set(data) == {"policy"}:  # a scenario's block, copied with its key
        data = data["policy"] or {}
        if not isinstance(data, Mapping):
            raise InputError("must be a mapping of policy settings", where=f"{path}: policy", value=data)
    policy = {str(k): v for k, v in data.items()}
    ControllerConfig.from_policy(policy, where=f"{path}: policy")
    return policy


def live_config(policy: Mapping[str, Any] | None, batch_idle_s: float | None) -> ControllerConfig:
    """The controller's settings: ``policy`` (checked), with ``batchIdle`` from ``batch_idle_s`` when given (the
    command-line flag), else the policy's, else :data:`BATCH_IDLE_S`."""
    policy = dict(policy or {})
    if batch_idle_s is not None:
        policy["batchIdle"] = batch_idle_s
    elif "batchIdle" not in policy:
        policy["batchIdle"] = BATCH_IDLE_S
    return ControllerConfig.from_policy(policy)


def pool_headroom(obj: Mapping[str, Any]) -> HeadroomSpec | None:
    """A GPUNodePool object's ``spec.headroom`` (None when unset); raises :class:`InputError` naming the field."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get(HEADROOM_FIELD) is None:
        return None
    name = (obj.get("metadata") or {}).get("name", "")
    return headroom_spec(spec[HEADROOM_FIELD], f"GPUNodePool/{name} spec.{HEADROOM_FIELD}")


def without_headroom(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``obj`` without ``spec.headroom`` (for the pool reader, which does not know the field)."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or HEADROOM_FIELD not in spec:
        return obj
    return {**obj, "spec": {k: v for k, v in spec.items() if k != HEADROOM_FIELD}}
