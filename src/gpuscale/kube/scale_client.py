"""The ``scale`` subresource of any workload (Deployment, StatefulSet, ReplicaSet, or a custom resource that serves
one), read and written as the HPA does: ``GET``/``PATCH .../NAME/scale`` with an ``autoscaling/v1`` Scale."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from gpuscale.kube.cache import raw
from gpuscale.kube.client import KubeClient

__all__ = ["KNOWN_TARGETS", "Scale", "ScaleClient", "selector_matcher"]

KNOWN_TARGETS: Mapping[str, tuple[str, str, str]] = {
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
}
"""Kind -> (group, version, plural) when ``scaleTargetRef.apiVersion`` is not given."""


@dataclass(frozen=True, slots=True)
class Scale:
    replicas: int
    """``spec.replicas``: what the workload is asked to run."""
    status_replicas: int
    selector: str
    """``status.selector``: the label selector of the workload's pods (may be empty)."""


def target_type(kind: str, api_version: str | None) -> tuple[str, str, str]:
    """(group, version, plural) of a scale target; an unknown kind is pluralised as the API does (lower-case + s)."""
    if not api_version and kind in KNOWN_TARGETS:
        return KNOWN_TARGETS[kind]
    group, _, version = (api_version or "apps/v1").rpartition("/")
    return group, version, kind.lower() + ("es" if kind.lower().endswith("s") else "s")


@cache
def _resource(group: str, version: str, kind: str, plural: str) -> Any:
    return create_namespaced_resource(group, version, kind, plural)


def rbac_name(kind: str, api_version: str | None) -> str:
    group, _, plural = target_type(kind, api_version)
    return f"{plural}.{group}/scale" if group else f"{plural}/scale"


class ScaleClient:
    """Reads and writes scale subresources through the process's :class:`KubeClient` (errors: :class:`KubeError`)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def _scale_type(self, kind: str, api_version: str | None) -> Any:
        group, version, plural = target_type(kind, api_version)
        return _resource(group, version, kind, plural).Scale

    def get(self, kind: str, api_version: str | None, namespace: str, name: str) -> Scale:
        got = self.client.run(
            self.client.api.get(self._scale_type(kind, api_version), name, namespace=namespace),
            verb="get",
            resource=rbac_name(kind, api_version),
        )
        return _scale(raw(got))

    def set(self, kind: str, api_version: str | None, namespace: str, name: str, replicas: int) -> Scale:
        got = self.client.run(
            self.client.api.patch(
                self._scale_type(kind, api_version),
                name,
                {"spec": {"replicas": replicas}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            ),
            verb="patch",
            resource=rbac_name(kind, api_version),
        )
        return _scale(raw(got))


def _scale(obj: Mapping[str, Any]) -> Scale:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return Scale(int(spec.get("replicas") or 0), int(status.get("replicas") or 0), str(status.get("selector") or ""))


_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def selector_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over pod labels for a serialised label selector (``a=b,c!=d,e in (f,g),h,!i``)."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for part in (p.strip() for p in parts if p.strip()):
        if m := _SET.match(part):
            key, values, negate = m.group(1), {v.strip() for v in m.group(3).split(",")}, m.group(2) == "notin"
            tests.append(lambda lb, k=key, vs=values, n=negate: (lb.get(k) in vs) != n)  # type: ignore[misc]
        elif "!=" in part:
            key, value = (x.strip() for x in part.split("!=", 1))
            tests.append(lambda lb, k=key, v=value: lb.get(k) != v)  # type: ignore[misc]
        elif "=" in part:
            key, value = (x.strip() for x in part.replace("==", "=").split("=", 1))
            tests.append(lambda lb, k=key, v=value: lb.get(k) == v)  # type: ignore[misc]
        elif part.startswith("!"):
            absent = part[1:].strip()
            tests.append(lambda lb, k=absent: k not in lb)  # type: ignore[misc]
        else:
            tests.append(lambda lb, k=part: k in lb)  # type: ignore[misc]
    return lambda labels: all(t(labels) for t in tests)
