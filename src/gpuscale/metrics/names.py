"""The metric names gpuscale exports or reads, in one place.

The agent exports :data:`DCGM` (the NVIDIA DCGM exporter's names and units, so dashboards and scalers written for
it work unchanged). :data:`CONTROLLER` lists the controller's own metrics that the dashboard and rules use.
"""

from __future__ import annotations

from types import MappingProxyType

DCGM = MappingProxyType(
    {
        "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
        "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
        "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
        "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
        "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
        "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    }
)
"""DCGM field name -> help text, as the DCGM exporter writes them (all gauges)."""

GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
"""Labels on every agent series, in the DCGM exporter's order."""
POD_LABELS = ("container", "namespace", "pod")
"""Labels added when the GPU is known to be used by a pod."""

CONTROLLER = MappingProxyType(
    {
        "gpuscale_nodes": "Nodes by pool and state.",
        "gpuscale_gpus": "GPUs by pool and state.",
        "gpuscale_pending_gpu_pods": "Pods waiting for a GPU.",
        "gpuscale_launches_total": "Node launches by pool.",
        "gpuscale_launch_failures_total": "Failed node launches by pool and reason.",
        "gpuscale_decisions_total": "Scaling decisions by kind.",
        "gpuscale_hourly_cost_dollars": "Hourly cost of the running nodes.",
        "gpuscale_gpr_queue_length": "GPU provisioning requests waiting.",
        "gpuscale_gpr_wait_seconds": "Wait of GPU provisioning requests.",
        "gpuscale_reconcile_seconds": "Duration of a reconcile round.",
        "gpuscale_scaler_desired_replicas": "Desired replicas of a GPUWorkloadScaler.",
        "gpuscale_scaler_current_replicas": "Current replicas of a GPUWorkloadScaler's target.",
        "gpuscale_budget_granted_gpus": "GPUs granted to a model by its GPUBudget.",
    }
)
"""Controller metric names the dashboard and rules use (base names; histograms add _bucket/_sum/_count)."""

PLANNED: frozenset[str] = frozenset()
"""Names in :data:`CONTROLLER` the controller does not export yet (none: the scaler and budget metrics are live)."""


def known(name: str) -> bool:
    """Whether ``name`` (or the histogram/summary base it is a sample of) is a metric gpuscale produces."""
    if name in DCGM or name in CONTROLLER:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in CONTROLLER:
            return True
    return False
