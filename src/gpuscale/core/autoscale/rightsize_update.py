"""Right-sizing applied, pure: whether a workload's pod template requests are due a change and the JSON patch that
makes it (the VPA updater's rules, with ``updateMode: Recreate`` meaning "patch the template, let the rolling update
recreate the pods").

* ``Off`` (the default) never changes anything: the recommendation is only reported;
* a controlled resource (``cpu``, ``memory``) of a container is changed only when its current request is outside the
  recommendation's ``[lower, upper]`` band (or not set), and then to the target;
* at most one change per workload per ``updateInterval`` seconds;
* never while a PodDisruptionBudget selecting the workload's pods allows no disruption;
* GPU model and count are never touched (see :func:`gpuscale.core.autoscale.rightsize.gpu_advice`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuscale.core.autoscale.rightsize import Limits, Recommendation

RESOURCES = ("cpu", "memory")


class UpdateMode(StrEnum):
    OFF = "Off"
    RECREATE = "Recreate"


@dataclass(frozen=True, slots=True)
class RightsizePolicy:
    """``spec.rightsizing`` of a GPUWorkloadScaler, as read."""

    mode: UpdateMode = UpdateMode.OFF
    min_allowed: Limits = field(default_factory=Limits)
    max_allowed: Limits = field(default_factory=Limits)
    controlled: tuple[str, ...] = RESOURCES
    update_interval_s: float = 3600.0
    history_s: float = 8 * 86_400.0
    server: str = ""
    """The Prometheus holding the usage history."""


@dataclass(frozen=True, slots=True)
class TemplateContainer:
    """A container of the workload's pod template: its index, name and ``resources`` as written."""

    index: int
    name: str
    resources: Mapping[str, Any] | None
    """None: the container has no ``resources`` field."""

    def request(self, resource: str) -> float | None:
        """The current request in millicores (cpu) or MiB (memory); None when not set or unreadable."""
        return _parse(((self.resources or {}).get("requests") or {}).get(resource), resource)

    def limit(self, resource: str) -> float | None:
        return _parse(((self.resources or {}).get("limits") or {}).get(resource), resource)


@dataclass(frozen=True, slots=True)
class Change:
    container: str
    resource: str
    current: float | None
    target: float
    lower: float
    upper: float


@dataclass(frozen=True, slots=True)
class PDB:
    """A PodDisruptionBudget as the decision needs it."""

    name: str
    match_labels: Mapping[str, str]
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...]
    disruptions_allowed: int


class Verdict(StrEnum):
    APPLY = "Apply"
    OFF = "Off"
    IN_BAND = "WithinBounds"
    RATE_LIMITED = "RateLimited"
    BLOCKED = "DisruptionBudget"
    NO_CHANGE = "NoRecommendation"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    changes: tuple[Change, ...]
    message: str
    patch: tuple[dict[str, Any], ...] = ()
    """JSON patch (RFC 6902) operations on the workload (only for APPLY)."""


def out_of_band(recs: Sequence[Recommendation], containers: Sequence[TemplateContainer],
                policy: RightsizePolicy) -> tuple[Change, ...]:  # fmt: skip
    """The controlled requests outside their recommendation's band (a request not set counts as outside)."""
    by_name = {r.container: r for r in recs}
    out: list[Change] = []
    for c in containers:
        rec = by_name.get(c.name)
        if rec is None:
            continue
        for res in policy.controlled:
            b = rec.cpu_milli if res == "cpu" else rec.memory_mib
            cur = c.request(res)
            target = math.ceil(b.target)
            limit = c.limit(res)
            if limit is not None:
                target = min(target, math.floor(limit))  # a request above its limit is refused by the API
            outside = cur is None or cur < b.lower or cur > b.upper
            if outside and (cur is None or abs(cur - target) >= 1):
                out.append(Change(c.name, res, cur, float(target), b.lower, b.upper))
    return tuple(out)


def blocking_budget(pdbs: Sequence[PDB], labels: Mapping[str, str]) -> str | None:
    """The first PDB selecting pods with ``labels`` that allows no disruption now (None: nothing blocks)."""
    for p in sorted(pdbs, key=lambda p: p.name):
        if p.disruptions_allowed <= 0 and selects(p, labels):
            return p.name
    return None


def selects(p: PDB, labels: Mapping[str, str]) -> bool:
    """A LabelSelector's meaning (an empty selector selects every pod of the namespace, as for a policy/v1 PDB)."""
    if any(labels.get(k) != v for k, v in p.match_labels.items()):
        return False
    for key, op, values in p.match_expressions:
        has = key in labels
        if op == "In" and not (has and labels[key] in values):
            return False
        if op == "NotIn" and has and labels[key] in values:
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
    return True


def decide(policy: RightsizePolicy, recs: Sequence[Recommendation], containers: Sequence[TemplateContainer], *,
           last_update: float | None, blocked_by: str | None, now: float) -> Decision:  # fmt: skip
    """Whether to patch the workload's template now, and the patch."""
    changes = out_of_band(recs, containers, policy)
    if not recs:
        return Decision(Verdict.NO_CHANGE, (), "no usage history: no recommendation")
    if not changes:
        return Decision(Verdict.IN_BAND, (), "every controlled request is within its recommended bounds")
    what = describe(changes)
    if policy.mode is UpdateMode.OFF:
        return Decision(Verdict.OFF, changes, f"recommended (updateMode Off, not applied): {what}")
    if last_update is not None and now < last_update + policy.update_interval_s:
        wait = last_update + policy.update_interval_s - now
        return Decision(Verdict.RATE_LIMITED, changes,
                        f"next change allowed in {wait:.0f} s (updateInterval {policy.update_interval_s:.0f} s): "
                        f"{what}")  # fmt: skip
    if blocked_by is not None:
        return Decision(Verdict.BLOCKED, changes,
                        f"PodDisruptionBudget {blocked_by} allows no disruption now: {what}")  # fmt: skip
    return Decision(Verdict.APPLY, changes, f"requests updated: {what}", json_patch(changes, containers))


def describe(changes: Sequence[Change]) -> str:
    parts = []
    for c in changes:
        was = "unset" if c.current is None else quantity(c.resource, c.current)
        parts.append(f"{c.container} {c.resource} {was} -> {quantity(c.resource, c.target)} "
                     f"(bounds {quantity(c.resource, c.lower)}..{quantity(c.resource, c.upper)})")  # fmt: skip
    return "; ".join(parts)


def quantity(resource: str, value: float) -> str:
    """Millicores as ``NNNm``, MiB as ``NNNMi`` (rounded up)."""
    return f"{math.ceil(value)}m" if resource == "cpu" else f"{math.ceil(value)}Mi"


def json_patch(changes: Sequence[Change], containers: Sequence[TemplateContainer]) -> tuple[dict[str, Any], ...]:
    """RFC 6902 operations setting the changed requests; each container's name is tested first, so a template
    reordered since it was read makes the API refuse the patch instead of changing the wrong container."""
    ops: list[dict[str, Any]] = []
    by_name = {c.name: c for c in containers}
    for name in dict.fromkeys(ch.container for ch in changes):
        c = by_name[name]
        base = f"/spec/template/spec/containers/{c.index}"
        ops.append({"op": "test", "path": f"{base}/name", "value": name})
        values = {ch.resource: quantity(ch.resource, ch.target) for ch in changes if ch.container == name}
        if c.resources is None:
            ops.append({"op": "add", "path": f"{base}/resources", "value": {"requests": values}})
        elif not isinstance(c.resources.get("requests"), Mapping):
            ops.append({"op": "add", "path": f"{base}/resources/requests", "value": values})
        else:
            for res, v in values.items():
                ops.append({"op": "add", "path": f"{base}/resources/requests/{res}", "value": v})
    return tuple(ops)


# ----------------------------------------------------------------------------------------------- quantities
_SUFFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
           "m": 1e-3, "u": 1e-6, "n": 1e-9}  # fmt: skip


def _parse(value: object, resource: str) -> float | None:
    """A Kubernetes quantity as millicores (cpu) or MiB (memory); None when absent or not a quantity."""
    if value is None:
        return None
    text = str(value).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, scale = text[: -len(suffix)], _SUFFIX[suffix]
            break
    else:
        number, scale = text, 1.0
    try:
        n = float(number) * scale
    except ValueError:
        return None
    if not math.isfinite(n) or n < 0:
        return None
    return n * 1000 if resource == "cpu" else n / 2**20
