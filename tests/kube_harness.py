"""Test harness for the Kubernetes adapter: an emulated API server, a client for it, and a scheduler stand-in.

:func:`kubeconfig_for` writes the kubeconfig a user would have; :class:`Scheduler` plays kube-scheduler over HTTP
(through the emulator's helpers): it binds each unbound pod to the first node that fits it by the core's predicates
and free capacity, or marks it ``PodScheduled=False`` / ``Unschedulable``; pods bound to kwok nodes start Running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lightkube import KubeConfig

from gpuscale.clock import ManualClock
from gpuscale.controller.loop import ControllerConfig
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import Resources
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.client import KubeClient
from gpuscale.kube.command import ControllerProcess
from gpuscale.manifests.nodes import read_node
from gpuscale.manifests.pods import read_pod
from gpuscale.manifests.problems import Doc, Notes

TOLERATE_KWOK = [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]
CONFIG = ControllerConfig(batch_idle_s=0.0, batch_max_s=0.0, lost_grace_s=5.0, orphan_grace_s=5.0)
"""The end-to-end controller config: no batching wait, short lost/orphan graces."""


def kwok_pool(*, consolidate_after: str) -> dict[str, Any]:
    """The GPUNodePool ``ada`` of the e2e tests: one Linode GPU type in us-ord on kwok nodes, at most 4."""
    return {
        "apiVersion": "gpuscale.io/v1alpha1",
        "kind": "GPUNodePool",
        "metadata": {"name": "ada"},
        "spec": {
            "instanceTypes": ["g2-gpu-rtx4000a1-s"],
            "zones": ["us-ord"],
            "capacityTypes": ["on-demand"],
            "taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}],
            "maxNodes": 4,
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": consolidate_after},
        },
    }


class RoundsWorld:
    """An end-to-end world driven in rounds: subclasses give :meth:`start` (a started process) and set ``server``,
    ``scheduler`` and ``clock``; a round advances the clock, steps the controller, then the scheduler."""

    proc: ControllerProcess
    server: KubeAPIServer
    scheduler: Scheduler
    clock: ManualClock

    def start(self) -> ControllerProcess:
        raise NotImplementedError

    def settle(self) -> None:
        """Let the watches deliver what was written (the cache version stops moving)."""
        last = -1
        for _ in range(100):
            time.sleep(0.02)
            if self.proc.cache.version == last and self.proc.cache.healthy:
                return
            last = self.proc.cache.version

    def round(self, advance: float = 0.0) -> None:
        self.clock.sleep(advance)
        self.settle()
        self.proc.step()
        self.settle()
        self.scheduler.step()
        self.settle()

    def kwok_nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.server.items("nodes") if (n["metadata"].get("labels") or {}).get("type") == "kwok"]

    def restart(self) -> None:
        self.proc.close()
        self.proc = self.start()

    def until(self, cond: Callable[[], bool], *, advance: float = 1.0, rounds: int = 40) -> None:
        for _ in range(rounds):
            if cond():
                return
            self.round(advance)
        assert cond(), "condition not reached"


def kubeconfig_dict(url: str, token: str = "test-token") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulated", "cluster": {"server": url}}],
        "users": [{"name": "gpuscale", "user": {"token": token}}],
        "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "gpuscale"}}],
        "current-context": "emulated",
    }


def kubeconfig_for(server: KubeAPIServer, path: Path) -> Path:
    path.write_text(yaml.safe_dump(kubeconfig_dict(server.url)))
    return path


def client_for(server: KubeAPIServer) -> KubeClient:
    config = KubeConfig.from_dict(kubeconfig_dict(server.url)).get()
    assert config is not None  # lightkube's get() returns its current context or raises; never None here
    return KubeClient(config, timeout_s=5.0)


def _doc() -> Doc:
    return Doc(source="harness", index=1, line=None, problems=[])


class Scheduler:
    """Binds unbound pods to fitting nodes (core predicates, free CPU, memory, GPUs) or marks them unschedulable."""

    def __init__(self, server: KubeAPIServer) -> None:
        self.server = server

    def step(self) -> list[str]:
        """One scheduling pass; returns the pod keys bound."""
        nodes = {}
        for obj in self.server.items("nodes"):
            n = read_node(_doc(), obj, {})
            if n is not None:
                nodes[n.name] = n
        used: dict[str, Resources] = {name: Resources() for name in nodes}
        pods = self.server.items("pods")
        unbound = []
        for obj in pods:
            phase = (obj.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                continue
            p = read_pod(_doc(), obj, Notes())
            if p is None:
                continue
            if p.node_name:
                if p.node_name in used:
                    used[p.node_name] = used[p.node_name] + Resources(
                        cpu_milli=p.request.cpu_milli, memory_mib=p.request.memory_mib, gpus=p.request.gpus, pods=1
                    )
            else:
                unbound.append((p, obj))
        bound = []
        for p, obj in sorted(unbound, key=lambda x: x[0].key):
            need = Resources(
                cpu_milli=p.request.cpu_milli, memory_mib=p.request.memory_mib, gpus=p.request.gpus, pods=1
            )
            target = None
            for name, n in sorted(nodes.items()):
                if static_fit(p, n.labels, n.taints, n.unschedulable) is not None:
                    continue
                total = used[name] + need
                a = n.allocatable
                if total.cpu_milli <= a.cpu_milli and total.memory_mib <= a.memory_mib and total.gpus <= a.gpus:
                    target = name
                    break
            if target is None:
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no fit"}
                if (obj.get("status") or {}).get("conditions") != [cond]:
                    self.server.patch("pods", p.name, {"status": {"conditions": [cond]}}, p.namespace, status=True)
                continue
            used[target] = used[target] + need
            self.server.patch("pods", p.name, {"spec": {"nodeName": target}}, p.namespace)
            self.server.patch(
                "pods",
                p.name,
                {"status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}},
                p.namespace,
                status=True,
            )
            bound.append(p.key)
        return bound

    def complete(self, key: str) -> None:
        ns, name = key.split("/", 1)
        self.server.patch("pods", name, {"status": {"phase": "Succeeded"}}, ns, status=True)
