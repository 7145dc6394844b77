"""Records of the simulated cluster: its knobs and counters, its nodes and pods, and the what-if packing's node
templates and first-fit cursors (:mod:`gpuscale.sim.cluster` holds the behaviour)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpuscale.core.gpr.spec import GPR_TAINT
from gpuscale.core.model import InstanceType, Node, Pod, Taint
from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources
from gpuscale.core.state import IntArray, Placement
from gpuscale.sim.engine import Timer


def placed(pod: Pod, node_name: str | None, phase: str) -> Pod:
    """``pod`` bound to ``node_name`` (None: pending again) in ``phase``: ``dataclasses.replace`` spelt out, at a
    third of its cost. Every bind goes through here, so the copy is made field by field as ``Pod.__init__`` and
    ``__post_init__`` would make it (``key`` is the same, name and namespace do not change; ``pending`` is derived),
    without their argument passing (tests/test_round_bookkeeping.py checks that no field is left behind and that the
    copy equals ``replace``'s)."""
    new = _new(Pod)
    _set(new, "name", pod.name)
    _set(new, "namespace", pod.namespace)
    _set(new, "request", pod.request)
    _set(new, "node_selector", pod.node_selector)
    _set(new, "affinity", pod.affinity)
    _set(new, "tolerations", pod.tolerations)
    _set(new, "priority", pod.priority)
    _set(new, "node_name", node_name)
    _set(new, "phase", phase)
    _set(new, "labels", pod.labels)
    _set(new, "annotations", pod.annotations)
    _set(new, "gang", pod.gang)
    _set(new, "gang_size", pod.gang_size)
    _set(new, "is_daemonset", pod.is_daemonset)
    _set(new, "key", pod.key)
    _set(new, "pending", node_name is None and phase == "Pending")
    return new


_new = object.__new__
_set = object.__setattr__  # what the frozen dataclass's own __init__ calls per field


@dataclass(frozen=True, slots=True)
class ClusterBehaviour:
    """Knobs of the simulated cluster.

    ``scorer`` names the core scorer the scheduler uses among feasible nodes. Measured GPU utilisation of a node is
    the GPU share its pods hold, each weighted by the pod's own utilisation (``busy`` unless the arrival says
    otherwise), plus Gaussian noise of stddev ``utilization_noise``, clipped to 0..1.
    """

    scorer: str = "best-fit"
    busy: float = 1.0
    utilization_noise: float = 0.0
    record_pod_events: bool = False


@dataclass(slots=True)
class ClusterCounters:
    """What happened in the cluster. ``disruptions`` counts pods that lost their node or were evicted."""

    pods_arrived: int = 0
    binds: int = 0
    pods_completed: int = 0
    pods_cancelled: int = 0
    disruptions: int = 0
    evictions: int = 0
    pdb_refusals: int = 0
    do_not_disrupt_violations: int = 0
    nodes_registered: int = 0
    nodes_gpu_ready: int = 0
    nodes_removed: int = 0
    nodes_removed_with_pods: int = 0
    spot_interruptions: int = 0
    spot_interruptions_survived: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain dict (for reports)."""
        return {k: int(v) for k, v in asdict(self).items()}


class SimNode:
    """A registered node of the simulated cluster (mutable; owned by :class:`~gpuscale.sim.cluster.SimCluster`)."""

    __slots__ = (
        "allocatable",
        "cache",
        "created_at",
        "gpu_busy",
        "gpu_count",
        "gpu_ready",
        "gpu_timer",
        "itype",
        "labels",
        "name",
        "pods",
        "pool",
        "price",
        "slot",
        "taints",
        "unschedulable",
    )

    def __init__(self, name: str, slot: int) -> None:
        self.name = name
        self.slot = slot
        self.labels: dict[str, str] = {}
        self.taints: tuple[Taint, ...] = ()
        self.unschedulable = False
        self.pool = ""
        self.price = 0.0
        self.itype: InstanceType | None = None
        self.allocatable = Resources()
        self.gpu_count = 0
        self.gpu_ready = False
        self.gpu_timer: Timer | None = None
        self.gpu_busy = 0.0
        self.pods: set[str] = set()
        self.created_at = 0.0
        self.cache: Node | None = None


class SimPod:
    """A pod of the simulated cluster with its run state (mutable; owned by the cluster)."""

    __slots__ = (
        "arrived_at",
        "bound_at",
        "deadline",
        "done",
        "duration",
        "fkey",
        "gpu_util",
        "node",
        "pending_since",
        "placement",
        "pod",
        "seq",
        "sig",
    )

    def __init__(self, pod: Pod, duration: float, seq: int, now: float, gpu_util: float) -> None:
        self.pod = pod
        self.duration = duration
        self.seq = seq
        self.arrived_at = now
        self.pending_since = now
        self.bound_at: float | None = None
        self.node: SimNode | None = None
        self.placement: Placement | None = None
        self.done: Timer | None = None
        self.deadline: Timer | None = None
        self.gpu_util = gpu_util
        self.sig = static_sig(pod)
        self.fkey = -1
        """The scheduler's number for (request, signature): pods with equal ones fit the same rows (set by the
        cluster; an int, so the pass's failure sets do not hash a request each time)."""


def static_sig(pod: Pod) -> tuple[object, ...]:
    """What the label and taint predicates read of a pod (pods with equal signatures fit the same nodes). A pod that
    tolerates the GPR taint could pass it, so the GPR workload rule reads its labels too; other pods' labels never
    matter (every GPR node carries the taint)."""
    sig = (tuple(sorted(pod.node_selector.items())), pod.affinity, pod.tolerations)
    if any(t.key == GPR_TAINT or (t.key == "" and t.operator == "Exists") for t in pod.tolerations):
        return (*sig, tuple(sorted(pod.labels.items())))
    return sig


def demand(req: Request) -> float:
    """GPUs a request asks for, as a fraction of whole GPUs."""
    return req.gpu_demand_milli / MILLI_PER_GPU


def ffd_key(sp: SimPod) -> tuple[int, int, int, int]:
    """First-fit-decreasing order: largest GPU demand, then CPU, then memory, then arrival."""
    r = sp.pod.request
    return (-r.gpu_demand_milli, -r.cpu_milli, -r.memory_mib, sp.seq)


@dataclass(frozen=True, slots=True)
class NodeTemplate:
    """What a node would look like once registered: labels, taints, allocatable (GPUs at template capacity)."""

    labels: dict[str, str]
    taints: tuple[Taint, ...]
    allocatable: Resources
    gpu_model: str | None


class FitCursor:
    """First-fit position of one pod class (request and label/taint signature) during a what-if packing.

    Rows are only ever taken during the packing, so a row that cannot take the class stays unable to: each cursor
    moves forward over the rows that fitted the class when it was first seen, registered nodes first, then the nodes
    in flight.
    """

    __slots__ = ("extra", "extra_at", "live", "live_at")

    def __init__(self, live: IntArray) -> None:
        self.live = live
        self.live_at = 0
        self.extra: IntArray | None = None
        self.extra_at = 0
