"""Pod classes: pods identical for scheduling, their equivalence key and the planning order."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuscale.core.model import Pod
from gpuscale.core.resources import Request


@dataclass(slots=True)
class PodClass:
    """Pods identical for scheduling: same request, selectors, affinity and tolerations."""

    index: int
    example: Pod
    pods: list[Pod] = field(default_factory=list)
    key: tuple[object, ...] = ()
    """:func:`class_key` of the pods."""

    @property
    def request(self) -> Request:
        return self.example.request


def referenced_keys(pod: Pod) -> tuple[str, ...]:
    """Label keys the pod's node selector and required affinity look at (sorted)."""
    keys = set(pod.node_selector)
    for term in pod.affinity:
        keys.update(r.key for r in term.requirements)
    return tuple(sorted(keys))


def class_key(pod: Pod) -> tuple[object, ...]:
    """Scheduling-equivalence key of a pod."""
    return (
        pod.request,
        tuple(sorted(pod.node_selector.items())),
        pod.affinity,
        tuple(sorted(pod.tolerations, key=repr)),
    )


def pod_order(pod: Pod) -> tuple[int, int, int, int, str]:
    """Planning order: higher priority first, then larger GPU, CPU, memory demand, then name."""
    r = pod.request
    return (-pod.priority, -r.gpu_demand_milli, -r.cpu_milli, -r.memory_mib, pod.key)
