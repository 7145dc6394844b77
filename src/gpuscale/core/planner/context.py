"""The mutable state of one planning run (copied for gang transactions) and the groups of new nodes it opens."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuscale.core.model import InstanceType, NodePool
from gpuscale.core.plan import Blocked
from gpuscale.core.planner.options import Option
from gpuscale.core.resources import Resources
from gpuscale.core.state import ClusterState

_NOTHING_USED = Resources(pods=0)
"""A pool's usage before any node (shared: Resources is immutable)."""


def unbounded(pool: NodePool) -> bool:
    """True if the pool has neither maxNodes nor limits: :meth:`Context.headroom` is then never 0 and reads none of
    the pool's totals."""
    lim = pool.limits
    return pool.max_nodes is None and lim.cpu_milli is None and lim.memory_mib is None and lim.gpus is None


@dataclass(slots=True)
class NewNodes:
    """``count`` identical new nodes of one option, each carrying ``pattern`` (class index -> pods per node)."""

    option: Option
    pattern: dict[int, int]
    count: int
    pods: list[list[str]] = field(default_factory=list)
    """Pods per node (filled when pods are assigned)."""


@dataclass(slots=True)
class Context:
    """Mutable planning state (copied for gang transactions)."""

    state: ClusterState
    pool_nodes: dict[str, int]
    pool_usage: dict[str, Resources]
    groups: list[NewNodes]
    placements: dict[str, str]
    blocked: list[Blocked]

    def copy(self) -> Context:
        return Context(
            self.state.copy(),
            dict(self.pool_nodes),
            dict(self.pool_usage),
            [NewNodes(g.option, dict(g.pattern), g.count, [list(p) for p in g.pods]) for g in self.groups],
            dict(self.placements),
            list(self.blocked),
        )

    def headroom(self, pool: NodePool, itype: InstanceType) -> int:
        """How many more nodes of ``itype`` the pool may get (max nodes and limits)."""
        n = 1 << 30
        if pool.max_nodes is not None:
            n = min(n, pool.max_nodes - self.pool_nodes.get(pool.name, 0))
        used = self.pool_usage.get(pool.name, _NOTHING_USED)
        lim = pool.limits
        for cap, have, each in (
            (lim.cpu_milli, used.cpu_milli, itype.vcpus * 1000),
            (lim.memory_mib, used.memory_mib, itype.memory_mib),
            (lim.gpus, used.gpus, itype.gpu_count),
        ):
            if cap is not None and each > 0:
                n = min(n, (cap - have) // each)
        return max(0, n)

    def add_nodes(self, opt: Option, count: int) -> None:
        """Count ``count`` new nodes of ``opt`` in its pool's totals. A pool without maxNodes or limits keeps none:
        no reader asks for them (:meth:`headroom`, the integer program and ``explain`` read the totals of the pools
        with maxNodes or limits only, and the initial context holds only those)."""
        if unbounded(opt.pool):
            return
        pool = opt.pool.name
        self.pool_nodes[pool] = self.pool_nodes.get(pool, 0) + count
        cap = Resources(opt.itype.vcpus * 1000, opt.itype.memory_mib, opt.itype.gpu_count, 0).scaled(count)
        self.pool_usage[pool] = self.pool_usage.get(pool, Resources(pods=0)) + cap
