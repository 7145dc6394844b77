"""Well-known label, taint and annotation keys used by gpuscale.

Nodes that gpuscale creates carry the Kubernetes well-known labels and the NVIDIA GPU Feature Discovery labels, so
that existing node selectors keep working. Pool ``requirements`` may use any of the ``TEMPLATE_KEYS``.
"""

from __future__ import annotations

INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
ARCH = "kubernetes.io/arch"
OS = "kubernetes.io/os"
HOSTNAME = "kubernetes.io/hostname"

CAPACITY_TYPE = "gpuscale.io/capacity-type"
POOL = "gpuscale.io/pool"
INSTANCE_FAMILY = "gpuscale.io/instance-family"
PROVIDER = "gpuscale.io/provider"

GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_MEMORY = "nvidia.com/gpu.memory"
"""GPU memory per GPU, in MiB (as GPU Feature Discovery reports it)."""

TEMPLATE_KEYS = (
    INSTANCE_TYPE,
    ZONE,
    REGION,
    ARCH,
    OS,
    CAPACITY_TYPE,
    POOL,
    INSTANCE_FAMILY,
    PROVIDER,
    GPU_PRODUCT,
    GPU_COUNT,
    GPU_MEMORY,
)
"""Labels whose value is known before a node exists, usable in pool requirements and pod selectors."""

GANG_ANNOTATION = "gpuscale.io/gang"
GANG_SIZE_ANNOTATION = "gpuscale.io/gang-size"
DO_NOT_DISRUPT_ANNOTATION = "gpuscale.io/do-not-disrupt"

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
