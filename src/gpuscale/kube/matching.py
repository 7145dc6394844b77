"""Cloud nodes matched to Node objects by provider id (``spec.providerID``).

A cloud's node list knows its instances, not the Kubernetes names they register under. :class:`ProviderIdMatcher`
wraps a provider and fills each :class:`~gpuscale.providers.base.CloudNode`'s ``node_name`` from the cached Node whose
provider id names the same instance, so the controller follows the claim from launch to registration. The instance is
the last part of the provider id: ``linode://12345``, ``aws:///us-east-1a/i-0abc``, ``gce://project/zone/name``,
``kwok://name``; Alibaba's ``cn-hangzhou.i-xyz`` ends with it after a dot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuscale.kube.cache import KubeCache
from gpuscale.providers.base import CloudNode, LaunchRequest, Provider, ProviderCapabilities, ProviderEvent

__all__ = ["ProviderIdMatcher"]


class ProviderIdMatcher:
    """A provider whose listed nodes carry the name of the Node registered for them."""

    def __init__(self, inner: Provider, cache: KubeCache) -> None:
        self.inner = inner
        self.cache = cache
        self.name = inner.name
        self._index: tuple[int, dict[str, str]] = (-1, {})

    @property
    def capabilities(self) -> ProviderCapabilities:
        return self.inner.capabilities

    def _names(self) -> dict[str, str]:
        if self._index[0] != self.cache.version:
            out = {}
            for obj in self.cache.objects("nodes"):
                pid = str((obj.get("spec") or {}).get("providerID") or "")
                if not pid:
                    continue
                last = pid.rstrip("/").rsplit("/", 1)[-1]
                out[last] = out[pid] = obj["metadata"]["name"]
                if "." in last and "://" not in pid:
                    out[last.split(".", 1)[1]] = obj["metadata"]["name"]
            self._index = (self.cache.version, out)
        return self._index[1]

    def _match(self, nodes: Sequence[CloudNode]) -> list[CloudNode]:
        names = self._names()
        out = []
        for cn in nodes:
            name = next((names[k] for k in (cn.instance_id, cn.node_id) if k and k in names), None)
            out.append(replace(cn, node_name=name) if name and not cn.node_name else cn)
        return out

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        return self._match(self.inner.launch(request))

    def delete_node(self, node_id: str) -> None:
        self.inner.delete_node(node_id)

    def list_nodes(self) -> Sequence[CloudNode]:
        return self._match(self.inner.list_nodes())

    def poll_errors(self) -> Sequence[ProviderEvent]:
        return self.inner.poll_errors()
