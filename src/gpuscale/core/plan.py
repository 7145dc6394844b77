"""Output types of the scale-up planner."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpuscale.core.model import CapacityType


class BlockReason(StrEnum):
    """Why a pending pod got no existing node and no new node."""

    NO_MATCHING_POOL = "NoMatchingPool"
    """No pool's node template matches the pod's node selector / required affinity."""
    TAINT_NOT_TOLERATED = "TaintNotTolerated"
    """Every matching pool taints its nodes with a taint the pod does not tolerate."""
    TOO_LARGE = "RequestTooLarge"
    """The request is larger than the biggest instance type of every matching pool."""
    POOL_AT_MAX_NODES = "PoolAtMaxNodes"
    """Every feasible pool has reached ``maxNodes``."""
    POOL_AT_LIMITS = "PoolAtLimits"
    """Every feasible pool would exceed its ``limits``."""
    NO_OFFERING_AVAILABLE = "NoOfferingAvailable"
    """Every feasible offering is marked unavailable (until a time)."""
    GANG_INCOMPLETE = "GangIncomplete"
    """The pod belongs to a gang that cannot be placed all together."""
    NO_POOLS = "NoNodePools"
    """No node pool is configured at all."""
    INVALID_REQUEST = "InvalidRequest"
    """The pod's request cannot be satisfied by any node by construction (e.g. gang-size mismatch)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """``count`` new nodes of one offering in one pool, with the pods planned onto them."""

    id: str
    pool: str
    instance_type: str
    capacity_type: CapacityType
    zone: str
    count: int
    hourly_cost: float
    """Total $/h of the ``count`` nodes."""
    pods: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Blocked:
    """A pending pod that triggers no scale-up, with a reason code and a sentence naming the blocker."""

    pod: str
    reason: BlockReason
    message: str


@dataclass(frozen=True, slots=True)
class ScaleUpPlan:
    """The result of :func:`gpuscale.core.planner.plan`.

    ``placements`` maps every placed pending pod to an existing node name or a launch id (``<launch-id>/<n>`` for
    the n-th node of a launch).
    """

    launches: tuple[Launch, ...] = ()
    placements: dict[str, str] = field(default_factory=dict)
    blocked: tuple[Blocked, ...] = ()
    solver: str = "greedy"

    @property
    def total_hourly_cost(self) -> float:
        """$/h of all launches."""
        return sum(launch.hourly_cost for launch in self.launches)

    def to_json(self) -> dict[str, object]:
        """The documented ``--json`` shape."""
        return {
            "launches": [
                {
                    "id": launch.id,
                    "pool": launch.pool,
                    "instanceType": launch.instance_type,
                    "capacityType": str(launch.capacity_type),
                    "zone": launch.zone,
                    "count": launch.count,
                    "hourlyCost": round(launch.hourly_cost, 6),
                    "pods": list(launch.pods),
                }
                for launch in self.launches
            ],
            "placements": dict(self.placements),
            "blocked": [{"pod": b.pod, "reason": str(b.reason), "message": b.message} for b in self.blocked],
            "totalHourlyCost": round(self.total_hourly_cost, 6),
        }


DEFAULT_GANG_TOLERANCE = 0.05
"""The extra price per member a gang may pay by default to sit on fewer new nodes (5 %)."""


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Knobs of the scale-up planner.

    ``scorer`` names the placement scorer for existing nodes (see :mod:`gpuscale.core.scoring`). With
    ``exact_solver`` the greedy plan is improved by an integer program (HiGHS via SciPy) within
    ``solver_time_limit_s``; the greedy plan is kept whenever the solver is unavailable, times out or is not cheaper.
    ``launch_id_prefix`` makes launch ids unique across reconcile rounds.
    """

    scorer: str = "fill-frag"
    exact_solver: bool = True
    solver_time_limit_s: float = 2.0
    launch_id_prefix: str = "launch"
    milp_max_classes: int = 200
    """Above this many pod classes on new nodes the integer program is skipped (the greedy plan stands)."""
    candidate_types: int = 12
    """How many of the best stand-alone instance types the greedy packer fully evaluates per new-node pattern."""
    gang_tolerance: float | None = DEFAULT_GANG_TOLERANCE
    """A gang's members go on as few new nodes as the options within this fraction of the cheapest price per member
    allow (a gang waits for the slowest of its nodes); None: the cheapest options only. See
    :mod:`gpuscale.core.planner.gangs`."""
