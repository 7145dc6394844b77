"""The controller's side of the per-node empty wait (``emptyWait``, :mod:`gpuscale.core.emptywait`): it records the
pods it sees arrive, decides each empty node's wait every consolidation step, and gives the consolidation gate a
node's pool with that wait as its ``consolidateEmptyAfter`` (never shorter than the pool's own), so the gate's
clocks, skips and wake-up times apply to it unchanged.

With ``learn`` it also records what keeping did, per pool and instance type (:class:`gpuscale.core.emptywait.Outcomes`):
every step, each node kept at the last step adds the time since to its shape's hours kept, and a landing if a pod
is now on it. Decisions read the outcomes as they were at the last *tick* (every quarter ``window``), and the
controller wakes at each tick: a decision then changes only with new inputs or at a time the consolidation gate is
told of (its cached decisions stay those of an uncached pass).

With ``learnReleased`` it also records the empty nodes it lets go and the pods that had to wait for a node (still
pending ``NEEDY_S`` after first seen), and settles the released nodes' would-be episodes against them
(:func:`gpuscale.core.emptywait.settle_released`) into the same outcomes.

The arrival history and the outcomes live in memory: after a restart they start again from nothing (empty nodes then
wait the pool's own wait until arrivals are seen again).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.shell import World
from gpuscale.core.emptywait import (
    NEEDY_S,
    EmptyWait,
    EmptyWaitSpec,
    Outcomes,
    Released,
    Shape,
    empty_wait,
    settle_released,
)
from gpuscale.core.model import NodePool, Pod
from gpuscale.core.nodeclaim import ClaimPhase


@dataclass
class EmptyWaitStats:
    """What the rule decided, for reports."""

    kept: int = 0
    """Empty nodes kept for ``maxWait`` (counted when the decision turns to keep)."""
    released: int = 0
    """Empty nodes left to the pool's own wait (counted when a node is first seen empty, or turns so)."""
    landed: int = 0
    """Kept empty nodes a pod landed on (with ``learn``)."""


class EmptyWaits:
    """Arrivals, this round's decisions and the pools the gate sees (see the module docstring)."""

    def __init__(self, spec: EmptyWaitSpec, first_seen: float) -> None:
        self.spec = spec
        self.first_seen = first_seen
        self.times: list[float] = []
        self.pods: list[Pod] = []
        self._seen: set[str] | None = None
        self.decisions: dict[str, EmptyWait] = {}
        """Empty node -> this round's decision."""
        self.look_at = math.inf
        """When a decision would change with time alone."""
        self.stats = EmptyWaitStats()
        self._pools: dict[tuple[str, float], NodePool] = {}
        self.outcomes: dict[tuple[str, str], Outcomes] = {}
        """(pool, instance type) -> what keeping its empty nodes did (with ``learn``)."""
        self._read: dict[tuple[str, str], Outcomes] = {}
        """The outcomes decisions read: :attr:`outcomes` at the last tick."""
        self._tick_at: float | None = None
        self._kinds: dict[str, tuple[str, str]] = {}
        self._last_at: float | None = None
        self._waiting: dict[str, tuple[float, Pod]] = {}
        """Pods first seen pending, not yet known needy (with ``learnReleased``)."""
        self.needy: list[tuple[float, Pod]] = []
        """Pods that had to wait for a node, not yet settled (time first seen, pod)."""
        self.released: dict[str, Released] = {}
        """Released empty node -> its open would-be episode."""

    def observe(self, w: World) -> None:
        """Record the pods first seen this round (not daemon pods); drop arrivals older than the history needs."""
        keys = {p.key for p in w.pods}
        if self._seen is not None:
            for p in w.pods:
                if p.key not in self._seen and not p.is_daemonset:
                    self.times.append(w.now)
                    self.pods.append(p)
                    if self.spec.learn_released and p.pending:
                        self._waiting[p.key] = (w.now, p)
        self._seen = keys
        if self._waiting:
            pending = {p.key for p in w.pods if p.pending}
            for key, (t, p) in list(self._waiting.items()):
                if key not in pending:
                    del self._waiting[key]
                elif w.now - t >= NEEDY_S:
                    self.needy.append((t, p))
                    del self._waiting[key]
        cut = 0
        keep_from = w.now - self.spec.history_s
        while cut < len(self.times) and self.times[cut] < keep_from:
            cut += 1
        if cut:
            del self.times[:cut]
            del self.pods[:cut]

    def decide(self, w: World, claims: ClaimTable) -> Mapping[str, EmptyWait]:
        """Each empty initialised node's decision this round."""
        by_node = w.by_node()
        if self.spec.learns:
            self._learn(w, by_node)
            if self._tick_at is None or w.now >= self._tick_at:
                self._read = dict(self.outcomes)
                self._tick_at = w.now + self.spec.window_s / 4
        out: dict[str, EmptyWait] = {}
        look = math.inf
        empty: list[tuple[tuple[str, str], float, str, Shape]] = []
        for _, c in claims.items():
            name = c.node_name
            if c.phase is not ClaimPhase.INITIALIZED or not name:
                continue
            node = w.nodes.get(name)
            if node is None or node.unschedulable or any(not p.is_daemonset for p in by_node.get(name, ())):
                continue
            shape = Shape(node.allocatable, c.hourly_price, node.labels, node.taints, node.gpu_model)
            empty.append(((c.pool, c.instance_type), c.hourly_price, name, shape))
        ranks: dict[tuple[str, str], int] = {}
        for kind, _, name, shape in sorted(empty, key=lambda e: (e[0], e[1], e[2])):
            rank = ranks[kind] = ranks.get(kind, 0) + 1
            self._kinds[name] = kind
            d = empty_wait(
                self.times,
                self.pods,
                self.first_seen,
                w.now,
                shape,
                self.spec,
                rank if self.spec.share_arrivals else 1,
                self._read.get(kind, Outcomes()),
            )
            if self._tick_at is not None:
                d = dataclasses.replace(d, until=min(d.until, self._tick_at))
            before = self.decisions.get(name)
            if d.wait_s is not None and (before is None or before.wait_s is None):
                self.stats.kept += 1
            elif d.wait_s is None and (before is None or before.wait_s is not None):
                self.stats.released += 1
            out[name] = d
            look = min(look, d.until)
        self.decisions = out
        self.look_at = look
        if self.spec.learn_released:
            self._settle(w, by_node, {name: shape for _, _, name, shape in empty})
        return out

    def _settle(self, w: World, by_node: Mapping[str, Sequence[Pod]], shapes: Mapping[str, Shape]) -> None:
        """Open a would-be episode for each empty node released this round (not yet open), drop those kept, close
        those landed on (a pod on the node) and settle the rest against the needy pods."""
        closed: list[tuple[tuple[str, str], float, bool]] = []
        for name, e in list(self.released.items()):
            d = self.decisions.get(name)
            if d is not None and d.wait_s is not None:
                del self.released[name]  # kept: the real outcome counts
            elif name in w.nodes and any(not p.is_daemonset for p in by_node.get(name, ())):
                closed.append((e.kind, w.now - e.start, True))
                del self.released[name]
        for name, d in self.decisions.items():
            if d.wait_s is None and name not in self.released and name in shapes:
                self.released[name] = Released(name, self._kinds[name], w.now, shapes[name])
        still, settled = settle_released(
            list(self.released.values()), self.needy, w.now, self.spec.max_wait_s, 2 * NEEDY_S
        )
        self.needy = []  # each matched one episode or none it can ever match (later episodes start after it)
        self.released = {e.node: e for e in still}
        for kind, kept_s, landed in closed + settled:
            self.stats.landed += landed
            self.outcomes[kind] = self.outcomes.get(kind, Outcomes()).add(kept_s, landed)

    def _learn(self, w: World, by_node: Mapping[str, Sequence[Pod]]) -> None:
        """Add the outcomes of the nodes kept at the last step: the time since, and a landing if a pod is on one."""
        now, last = w.now, self._last_at
        self._last_at = now
        if last is None:
            return
        dt = now - last
        if dt > 0.0:
            self.outcomes = {k: o.decayed(dt) for k, o in self.outcomes.items()}
        for name, d in self.decisions.items():
            kind = self._kinds.get(name)
            if d.wait_s is None or kind is None:
                continue
            landed = name in w.nodes and any(not p.is_daemonset for p in by_node.get(name, ()))
            self.stats.landed += landed
            self.outcomes[kind] = self.outcomes.get(kind, Outcomes()).add(max(0.0, dt), landed)
        live = set(self.decisions)
        self._kinds = {n: k for n, k in self._kinds.items() if n in live}

    def kept(self) -> Iterable[tuple[str, EmptyWait]]:
        """The empty nodes kept this round, with their decision."""
        return ((n, d) for n, d in self.decisions.items() if d.wait_s is not None)

    def pool_for(self, node_name: str, pool: NodePool | None) -> NodePool | None:
        """``pool`` as the gate must see it for this node: its empty wait raised to the node's kept wait."""
        d = self.decisions.get(node_name)
        if pool is None or d is None or d.wait_s is None:
            return pool
        wait = max(pool.disruption.wait_s(True), d.wait_s)
        key = (pool.name, wait)
        out = self._pools.get(key)
        if out is None:
            out = dataclasses.replace(
                pool, disruption=dataclasses.replace(pool.disruption, consolidate_empty_after_s=wait)
            )
            self._pools[key] = out
        return out
