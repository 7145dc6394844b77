"""Immutable domain model of the decision core.

Units, everywhere in the core:
  * CPU in millicores (``cpu_milli``), memory in MiB (``memory_mib``);
  * whole GPUs as a count (``gpus``);
  * a *fraction* of one physical GPU as milli-GPU (``gpu_milli``, 1..999). See :mod:`gpuscale.core.resources`
    for the one place where the fractional-GPU convention is defined.

Everything here is a frozen dataclass built by the adapters (manifest parser, catalog loaders, trace loaders, the
simulator) and read by the pure planning functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpuscale.core.labels import GPU_PRODUCT
from gpuscale.core.resources import Request, Resources


class TaintEffect(StrEnum):
    """Kubernetes taint effects."""

    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint (``key=value:effect``)."""

    key: str
    effect: TaintEffect
    value: str = ""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration. ``operator`` is ``Equal`` or ``Exists``; ``effect`` None matches every effect."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: TaintEffect | None = None


class SelectorOperator(StrEnum):
    """Node selector requirement operators (required node affinity)."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry of a node selector term."""

    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.operator in (SelectorOperator.EXISTS, SelectorOperator.DOES_NOT_EXIST):
            return f"{self.key} {self.operator}"
        return f"{self.key} {self.operator} [{', '.join(self.values)}]"


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """A node selector term: its requirements are ANDed. Terms of an affinity are ORed."""

    requirements: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod as the scheduler sees it.

    ``request`` is the effective request (init-container max rule already applied). ``affinity`` holds the terms of
    ``requiredDuringSchedulingIgnoredDuringExecution`` (ORed); an empty tuple means no required affinity.
    """

    name: str
    namespace: str = "default"
    request: Request = field(default_factory=Request)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: tuple[SelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    node_name: str | None = None
    phase: str = "Pending"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    gang: str | None = None
    gang_size: int = 0
    is_daemonset: bool = False
    key: str = field(init=False, repr=False, compare=False)
    """``namespace/name``, the identity used in plans and reports (derived)."""
    pending: bool = field(init=False, repr=False, compare=False)
    """True when the pod waits for a node: not bound and in phase ``Pending`` (derived, stored rather than a property:
    controllers read it hundreds of thousands of times per replay)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")
        object.__setattr__(self, "pending", self.node_name is None and self.phase == "Pending")


@dataclass(frozen=True, slots=True)
class Node:
    """A node of the cluster (or one already being launched, ``launching=True``)."""

    name: str
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    pool: str | None = None
    launching: bool = False
    hourly_cost: float = 0.0

    @property
    def gpu_model(self) -> str | None:
        """The GPU product from the GPU Feature Discovery label, if any."""
        return self.labels.get(GPU_PRODUCT)


class CapacityType(StrEnum):
    """Purchase option of an offering."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"


@dataclass(frozen=True, slots=True)
class Offering:
    """Where and how an instance type can be bought, and for how much."""

    zone: str
    capacity_type: CapacityType
    hourly_price: float
    available: bool = True


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A machine shape from a provider catalog. Memory in MiB, GPU memory per GPU in MiB."""

    name: str
    provider: str
    vcpus: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str | None = None
    gpu_memory_mib: int = 0
    arch: str = "amd64"
    family: str = ""
    region: str = ""
    offerings: tuple[Offering, ...] = ()

    @property
    def capacity(self) -> Resources:
        """Raw capacity before system reservations and DaemonSet overhead."""
        return Resources(cpu_milli=self.vcpus * 1000, memory_mib=self.memory_mib, gpus=self.gpu_count)

    def cheapest(self) -> Offering | None:
        """The cheapest available offering, or None."""
        avail = [o for o in self.offerings if o.available]
        return min(avail, key=lambda o: (o.hourly_price, o.zone, o.capacity_type)) if avail else None


@dataclass(frozen=True, slots=True)
class Catalog:
    """A set of instance types from one or more providers."""

    name: str
    instance_types: tuple[InstanceType, ...]
    warnings: tuple[str, ...] = ()

    def by_name(self) -> dict[str, InstanceType]:
        """Instance types indexed by name (memoised per catalog object: treat the result as read-only)."""
        hit = _BY_NAME.get(id(self))
        if hit is not None and hit[0] is self:
            return hit[1]
        table = {it.name: it for it in self.instance_types}
        if len(_BY_NAME) >= _BY_NAME_SIZE:
            _BY_NAME.clear()
        _BY_NAME[id(self)] = (self, table)
        return table


_BY_NAME: dict[int, tuple[Catalog, dict[str, InstanceType]]] = {}
"""Catalog id -> (the catalog, kept alive so that its id is not reused while the entry exists, its types by name): a
plain table rather than a :class:`~gpuscale.core.memo.Memo`, whose maker closure and key cost more than the lookup
(controllers ask thousands of times per replay). Forgotten past ``_BY_NAME_SIZE`` catalogs."""
_BY_NAME_SIZE = 256


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """Upper bounds on the total capacity of a pool's nodes. None means unbounded."""

    cpu_milli: int | None = None
    memory_mib: int | None = None
    gpus: int | None = None

    @property
    def bounded(self) -> bool:
        """True if any limit is set."""
        return (self.cpu_milli, self.memory_mib, self.gpus) != (None, None, None)

    def allows(self, total: Resources) -> bool:
        """True if ``total`` stays within every set limit."""
        return (
            (self.cpu_milli is None or total.cpu_milli <= self.cpu_milli)
            and (self.memory_mib is None or total.memory_mib <= self.memory_mib)
            and (self.gpus is None or total.gpus <= self.gpus)
        )


class ConsolidationPolicy(StrEnum):
    """When a pool's nodes may be removed or replaced."""

    WHEN_EMPTY = "WhenEmpty"
    WHEN_EMPTY_OR_UNDERUTILIZED = "WhenEmptyOrUnderutilized"


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """At most ``nodes`` (an integer, or a percentage like ``"10%"``) of a pool's nodes disrupted at once.

    With ``schedule`` (cron, UTC) the budget is active only for ``duration_s`` after each schedule hit. ``reasons``
    limits it to some disruption reasons (``Empty``, ``Underutilized``, ``Drifted``); empty means all.
    """

    nodes: str = "10%"
    schedule: str | None = None
    duration_s: float | None = None
    reasons: tuple[str, ...] = ()


INVOLUNTARY_GRACE_S = 120.0
"""The drain bound of an involuntary drain when the pool sets no ``terminationGracePeriod``: a spot interruption
notice (AWS) gives two minutes before the instance is reclaimed, and a failed node's pods run nowhere anyway."""


@dataclass(frozen=True, slots=True)
class Disruption:
    """A pool's scale-down and consolidation settings."""

    consolidation_policy: ConsolidationPolicy = ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED
    consolidate_after_s: float = 30.0
    budgets: tuple[DisruptionBudget, ...] = (DisruptionBudget(),)
    utilization_threshold: float = 0.5
    use_measured_gpu_utilization: bool = False
    consolidate_empty_after_s: float | None = None
    """How long an empty node waits before removal (None: ``consolidate_after_s``). Longer than
    ``consolidate_after_s``, it keeps freshly emptied GPU nodes warm for the next pods while underused ones are still
    packed quickly."""
    termination_grace_period_s: float | None = None
    """How long a draining node waits for its evicted pods, counted from the first accepted eviction, before it is
    deleted anyway (``spec.disruption.terminationGracePeriod``). None: a voluntary drain waits as long as it takes
    and an involuntary one (spot notice, node failure) :data:`INVOLUNTARY_GRACE_S`."""

    def wait_s(self, empty: bool) -> float:
        """How long a node must stay a candidate before it is disrupted: empty, or underutilised."""
        if empty and self.consolidate_empty_after_s is not None:
            return self.consolidate_empty_after_s
        return self.consolidate_after_s


@dataclass(frozen=True, slots=True)
class NodePool:
    """A ``GPUNodePool``: which instance types it may launch and how its nodes look.

    Instance types are chosen by ``instance_types`` (explicit names; empty means all of the catalog) and then
    filtered by ``requirements`` on well-known labels (see :mod:`gpuscale.core.labels`). ``zones`` and
    ``capacity_types`` restrict offerings (empty means any). Higher ``weight`` pools are preferred over cheaper
    lower-weight ones.
    """

    name: str
    instance_types: tuple[str, ...] = ()
    requirements: tuple[Requirement, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    min_nodes: int = 0
    max_nodes: int | None = None
    limits: PoolLimits = field(default_factory=PoolLimits)
    weight: int = 0
    capacity_types: tuple[CapacityType, ...] = ()
    zones: tuple[str, ...] = ()
    daemonset_overhead: Resources = field(default_factory=lambda: Resources(pods=0))
    disruption: Disruption = field(default_factory=Disruption)
    allow_spot_fallback: bool = True


@dataclass(frozen=True, slots=True)
class OfferingKey:
    """Identifies an offering across the catalog: instance type × zone × capacity type."""

    instance_type: str
    zone: str
    capacity_type: CapacityType


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the planner needs, observed at one instant.

    ``unavailable`` maps offerings that must not be used (e.g. after an insufficient-capacity error) to the time
    (seconds, same clock as ``now``) until which they stay unavailable. ``workloads`` maps each active GPR (one
    holding nodes) to its ``workloadSelector``: a node labelled for it takes only pods matching it (the GPR workload
    predicate of :mod:`gpuscale.core.predicates`; empty when no GPR is active).
    """

    pods: tuple[Pod, ...] = ()
    nodes: tuple[Node, ...] = ()
    pools: tuple[NodePool, ...] = ()
    catalog: Catalog = field(default_factory=lambda: Catalog("empty", ()))
    unavailable: Mapping[OfferingKey, float] = field(default_factory=dict)
    workloads: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
