"""Value types of the disruption decisions: reasons, actions, kept candidates, budgets' verdicts, PDBs, offerings
and the typed records passed between its modules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from gpuscale.core.model import (
    CapacityType,
    DisruptionBudget,
    InstanceType,
    Node,
    NodePool,
    Offering,
    OfferingKey,
    Pod,
)
from gpuscale.core.resources import Resources


class DisruptionReason(StrEnum):
    """Why a node is disrupted (the values budgets' ``reasons`` refer to)."""

    EMPTY = "Empty"
    UNDERUTILIZED = "Underutilized"
    DRIFTED = "Drifted"


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """How many more nodes may be disrupted for a reason, and which budget decided it (None: unlimited)."""

    allowed: int | None
    budget: DisruptionBudget | None = None


@dataclass(frozen=True, slots=True)
class PoolOffering:
    """One offering a pool may launch, with the node it would produce."""

    pool: NodePool
    instance_type: InstanceType
    offering: Offering
    labels: Mapping[str, str]
    allocatable: Resources

    @property
    def key(self) -> OfferingKey:
        """The offering's key (type, zone, capacity type)."""
        return OfferingKey(self.instance_type.name, self.offering.zone, self.offering.capacity_type)

    @property
    def price(self) -> float:
        """$/h of one node."""
        return self.offering.hourly_price


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget:
    """A PDB: pods matching ``selector`` in ``namespace`` may lose at most ``max_unavailable`` at once."""

    name: str
    namespace: str
    selector: Mapping[str, str]
    max_unavailable: int = 0

    def matches(self, pod: Pod) -> bool:
        """True if the PDB selects ``pod``."""
        return pod.namespace == self.namespace and all(pod.labels.get(k) == v for k, v in self.selector.items())


class ActionKind(StrEnum):
    """What to do with a node."""

    DELETE = "Delete"
    REPLACE = "Replace"


class KeepReason(StrEnum):
    """Why a candidate node is kept."""

    WAITING = "ConsolidateAfter"
    DO_NOT_DISRUPT = "DoNotDisrupt"
    PDB = "PodDisruptionBudget"
    MIN_NODES = "MinNodes"
    BUDGET = "DisruptionBudget"
    PODS_DO_NOT_FIT = "PodsDoNotFit"
    NO_REPLACEMENT = "NoCheaperReplacement"
    WORK_LOST = "WorkLostExceedsSaving"
    """Evicting its pods loses more work than the consolidation saves (:mod:`gpuscale.core.disruption.workcost`)."""


@dataclass(frozen=True, slots=True)
class Replacement:
    """One new node a replaced node's remaining pods go to (``pods``: those planned onto it)."""

    pool: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    hourly_price: float
    allocatable: Resources
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DisruptionAction:
    """Delete or replace ``node``; ``pods`` are the workload pods to evict."""

    kind: ActionKind
    node: str
    pool: str
    reason: DisruptionReason
    message: str
    pods: tuple[str, ...] = ()
    replacements: tuple[Replacement, ...] = ()
    """The new nodes of a REPLACE: usually one; several when splitting the pods over smaller nodes is cheaper."""
    savings_per_hour: float = 0.0

    @property
    def replacement(self) -> Replacement | None:
        """The first (usually only) new node of a REPLACE; None for a DELETE."""
        return self.replacements[0] if self.replacements else None


@dataclass(frozen=True, slots=True)
class Kept:
    """A candidate node that stays, and why."""

    node: str
    pool: str
    reason: KeepReason
    message: str
    candidate: DisruptionReason | None = None


@dataclass(frozen=True, slots=True)
class DisruptionPlan:
    """Actions to take now, candidates kept with their reason, and the updated candidate-since map."""

    actions: tuple[DisruptionAction, ...] = ()
    kept: tuple[Kept, ...] = ()
    since: Mapping[str, float] = field(default_factory=dict)


class FreeRoom(NamedTuple):
    """Room a node's pods leave on it (negative when overcommitted): a per-node total, so an upper bound on what one
    more pod can get."""

    cpu_milli: int
    memory_mib: int
    gpu_milli: int
    """Milli-GPU over all of the node's GPUs."""
    pods: int


_REASON_ORDER = {DisruptionReason.EMPTY: 0, DisruptionReason.DRIFTED: 1, DisruptionReason.UNDERUTILIZED: 2}


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node that may be disrupted, why, and its workload pods."""

    node: Node
    pool: NodePool
    reason: DisruptionReason
    message: str
    pods: list[Pod]
    share: float
    """Requested share of the node (:func:`~gpuscale.core.disruption.candidates.request_share`)."""
    price: float
    """$/h of the node."""

    @property
    def sort_key(self) -> tuple[int, float, float, str]:
        """Empty first, then drifted, then underutilised; least used, then dearest, then by name."""
        return (_REASON_ORDER[self.reason], self.share, -self.price, self.node.name)
