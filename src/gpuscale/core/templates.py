"""What a node launched from a pool would look like: its labels, taints and allocatable capacity."""

from __future__ import annotations

from gpuscale.core import labels as L
from gpuscale.core.model import InstanceType, NodePool, Offering
from gpuscale.core.resources import DEFAULT_MAX_PODS, Resources


def template_labels(pool: NodePool, itype: InstanceType, offering: Offering) -> dict[str, str]:
    """Labels a node of ``itype`` bought as ``offering`` in ``pool`` carries (well-known, GPU Feature Discovery, pool).

    Pool labels come first, so the well-known labels always win over a pool label with the same key.
    """
    out = dict(pool.labels)
    out.update(
        {
            L.INSTANCE_TYPE: itype.name,
            L.ZONE: offering.zone,
            L.ARCH: itype.arch,
            L.OS: "linux",
            L.CAPACITY_TYPE: str(offering.capacity_type),
            L.POOL: pool.name,
            L.PROVIDER: itype.provider,
        }
    )
    if itype.region:
        out[L.REGION] = itype.region
    if itype.family:
        out[L.INSTANCE_FAMILY] = itype.family
    if itype.gpu_count and itype.gpu_model:
        out[L.GPU_PRODUCT] = itype.gpu_model
        out[L.GPU_COUNT] = str(itype.gpu_count)
        if itype.gpu_memory_mib:
            out[L.GPU_MEMORY] = str(itype.gpu_memory_mib)
    return out


def template_allocatable(pool: NodePool, itype: InstanceType) -> Resources:
    """Capacity left for workload pods on such a node: the instance's capacity minus the pool's DaemonSet overhead."""
    overhead = pool.daemonset_overhead
    return Resources(
        cpu_milli=max(0, itype.vcpus * 1000 - overhead.cpu_milli),
        memory_mib=max(0, itype.memory_mib - overhead.memory_mib),
        gpus=itype.gpu_count,
        pods=max(0, DEFAULT_MAX_PODS - overhead.pods),
    )
