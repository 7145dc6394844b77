"""Small builders of core objects for tests (no I/O)."""

from __future__ import annotations

from typing import Any

from gpuscale.core import labels as L
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    Disruption,
    DisruptionBudget,
    InstanceType,
    Node,
    NodePool,
    Offering,
    Pod,
    Requirement,
    SelectorOperator,
    SelectorTerm,
    Taint,
    TaintEffect,
    Toleration,
)
from gpuscale.core.resources import Request, Resources
from gpuscale.sim.cloud import CloudBehaviour
from gpuscale.sim.engine import Dist

OD = CapacityType.ON_DEMAND
SPOT = CapacityType.SPOT

FIXED_CLOUD = CloudBehaviour(
    launch_latency=Dist.const(30),
    registration_latency=Dist.const(30),
    device_plugin_delay=Dist.const(120),
    deletion_latency=Dist.const(0),
)
"""A simulated cloud without randomness: a node launched at 0 runs at 30 s, registers at 60 s, has its GPUs
allocatable at 180 s, and is gone as soon as it is deleted."""


def itype(
    name: str,
    vcpus: int,
    mem_gib: int,
    gpus: int = 0,
    model: str | None = None,
    price: float = 1.0,
    zones: tuple[str, ...] = ("z1",),
    spot: float | None = None,
    gpu_mem_mib: int = 24576,
) -> InstanceType:
    offers = [Offering(z, OD, price) for z in zones]
    if spot is not None:
        offers += [Offering(z, SPOT, spot) for z in zones]
    return InstanceType(
        name,
        "test",
        vcpus,
        mem_gib * 1024,
        gpus,
        model if gpus else None,
        gpu_mem_mib if gpus else 0,
        offerings=tuple(offers),
    )


def catalog(*types: InstanceType) -> Catalog:
    return Catalog("test", tuple(types))


def default_catalog() -> Catalog:
    return catalog(
        itype("cpu-4", 4, 16, price=0.2),
        itype("cpu-16", 16, 64, price=0.8),
        itype("t4-1", 8, 32, 1, "T4", price=0.6),
        itype("t4-4", 48, 192, 4, "T4", price=2.6),
        itype("a100-1", 12, 85, 1, "A100", price=3.0, gpu_mem_mib=81920),
        itype("a100-8", 96, 1152, 8, "A100", price=22.0, gpu_mem_mib=81920),
    )


def pod(
    name: str,
    cpu: int = 500,
    mem: int = 512,
    gpus: int = 0,
    milli: int = 0,
    selector: dict[str, str] | None = None,
    affinity: tuple[SelectorTerm, ...] = (),
    tolerations: tuple[Toleration, ...] = (),
    priority: int = 0,
    node: str | None = None,
    gang: str | None = None,
    gang_size: int = 0,
    models: frozenset[str] | None = None,
) -> Pod:
    return Pod(
        name=name,
        request=Request(cpu, mem, gpus, milli, models),
        node_selector=selector or {},
        affinity=affinity,
        tolerations=tolerations,
        priority=priority,
        node_name=node,
        phase="Running" if node else "Pending",
        gang=gang,
        gang_size=gang_size,
    )


def node(
    name: str,
    cpu: int,
    mem_mib: int,
    gpus: int = 0,
    model: str | None = None,
    labels: dict[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    pool: str | None = None,
    launching: bool = False,
    unschedulable: bool = False,
) -> Node:
    lab = dict(labels or {})
    if model:
        lab[L.GPU_PRODUCT] = model
    return Node(name, Resources(cpu, mem_mib, gpus), lab, taints, unschedulable, pool, launching)


def pool(name: str = "gpu", **kw: Any) -> NodePool:
    return NodePool(name=name, **kw)


def req(key: str, op: str, *values: str) -> Requirement:
    return Requirement(key, SelectorOperator(op), tuple(values))


def term(*reqs: Requirement) -> SelectorTerm:
    return SelectorTerm(tuple(reqs))


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> Taint:
    return Taint(key, TaintEffect(effect), value)


def tol(key: str = "", op: str = "Equal", value: str = "", effect: str | None = None) -> Toleration:
    return Toleration(key, op, value, TaintEffect(effect) if effect else None)


GPR_SPEC = {
    "requestName": "train",
    "gpuShape": "RTX4000-Ada",
    "numberOfGPUs": 4,
    "numberOfGPUNodes": 2,
    "exitDuration": "8h",
}
"""A GPUProvisioningRequest spec: two nodes of four RTX4000-Ada GPUs for eight hours (copy before changing)."""


def _one_cloud_type(name: str, gpus: int, price: float) -> InstanceType:
    return InstanceType(name, "linode", 8 * gpus, 32768 * gpus, gpus, "RTX4000-Ada", 20480,
                        offerings=(Offering("us-ord", OD, price),))  # fmt: skip


ONE_CLOUD = Catalog(
    "one-cloud", (_one_cloud_type("g2-rtx4000a1-s", 1, 0.52), _one_cloud_type("g2-rtx4000a4-s", 4, 2.96))
)
"""Two Linode-like RTX4000-Ada types, one GPU and four: the catalog of the tests where pods and GPRs share a cloud."""
ONE_CLOUD_FAST = CloudBehaviour(
    launch_latency=Dist.const(5.0),
    registration_latency=Dist.const(10.0),
    device_plugin_delay=Dist.const(10.0),
    deletion_latency=Dist.const(5.0),
)
"""A quick, deterministic simulated cloud for those tests: GPUs allocatable 25 s after a launch."""
ONE_CLOUD_POOL = NodePool(
    "gpu",
    instance_types=("g2-rtx4000a1-s", "g2-rtx4000a4-s"),
    capacity_types=(OD,),
    disruption=Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),)),
)


def crashing_options_factory(crash_at: float | None) -> tuple[Any, list[Any]]:
    """A controller factory for ``run_simulation`` building options controllers, the first of which crashes at its
    first reconcile from ``crash_at`` on (None: never), and the list of the controllers it built."""
    from gpuscale.controller.options import options_controller
    from gpuscale.sim.runner import ControllerCrash

    built: list[Any] = []

    def factory(**kw: Any) -> Any:
        c = options_controller(**kw)
        if not built and crash_at is not None:
            reconcile = c.reconcile

            def crashing() -> Any:
                if c.clock.now() >= crash_at:
                    raise ControllerCrash("test")
                return reconcile()

            c.reconcile = crashing  # type: ignore[method-assign]
        built.append(c)
        return c

    return factory, built
