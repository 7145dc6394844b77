"""The consolidation gate: the consolidation step's clocks, caches and skips, owned by one object.

A controller asks "should some node be consolidated?" every round, but the answer rarely changes, and the pass that
answers it (:func:`gpuscale.core.disruption.plan_disruption`) simulates moving pods. :class:`ConsolidationGate`
keeps what lets most rounds skip it:

- **consolidateAfter clocks** (``since``): when each candidate became one; a node is *due* once its pool's wait
  (for empty or for underutilised nodes) has passed, a drifted node at once. Not a cache: the state both gates share.
- **candidate reasons** (``classes``), keyed by node and kept while the node's bound pods and allocatable are
  unchanged (``touched``): a reason is :func:`~gpuscale.core.disruption.classify_node` of the node, its pool and
  its pods, so nothing else can change it; pools that judge by measured utilisation are recomputed every round.
- **resting nodes** (``futile``): a node the pass kept for a reason other than consolidateAfter (its pods fit
  nowhere cheaper, a budget, a PDB, minNodes, lost work), keyed by its own pods. A pass's answer for it depends
  on the pods and nodes it sees, the disruptions under way, offerings, PDB allowances and the time (budget
  windows). So a rest ends when: its own pods change; room appears anywhere (a pod leaves a node, a pending pod
  planned onto a node stops holding room there, a node joins or its allocatable changes: the pass packs pods
  best-fit over every node, so no finer test is sound); room is taken on a node one of its pods could take as
  that node stood at the last round (a pod binds or is planned there, the node is cordoned or goes: best-fit is not
  monotone in the room either, a fuller node can become one pod's best fit and leave room for another) and a pass
  over the resting nodes so hit, alone, would act now (the controller's probe: when it acts on none, each was judged
  with no action before it, as in a full pass until its first action, which ends every rest next round); a node
  joins or a node in flight appears (budgets in percent and minNodes count them); a disruption starts or ends (for
  a rest by a budget, also one that the resting pass started itself and that ended before the next round:
  :meth:`ConsolidationGate.started`); unavailable offerings change; while PDBs exist, bound pods move or the pending
  pods not planned anywhere change; one of its pool's scheduled budgets opens or closes (:func:`budget_edge`); or
  ``consolidationRetry`` passes (a safety net). A node kept by a budget rests
  until a *timed* end that is a wake-up time (:meth:`ConsolidationGate.wake_times`): a budget's room counts
  disruptions as the pass sees them, so a quiet cluster must still look again then.
- **the pass rate** (``disruptionInterval``) and **the unchanged-inputs skip**, keyed by the pass's inputs (nodes
  with their allocatable, bound pods, due candidates, disruptions, protected nodes, unavailable offerings,
  measured utilisation): a pass over the same inputs is skipped unless a clock ran out, a rest ended (budget
  windows are the only time the pass reads besides the clocks, and they end rests) or ``consolidationRefresh``
  passed.

**Invariant**: every skip drops only work whose answer is "no action". The decisions equal those of an uncached
gate that classifies every candidate afresh and passes every due candidate to the planner whenever the pass rate
allows; and every time at which the cached gate could decide differently without the cluster changing (a clock
running out, a held-back pass, a budget rest ending) is a wake-up time. ``check=True`` evaluates that uncached
reference beside every round and records each difference in :attr:`ConsolidationGate.mismatches` (tests assert
there are none; ``benchmarks/gate_check.py`` runs the openb replay so).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count
from operator import ne

from gpuscale.controller.config import ControllerConfig
from gpuscale.core.cron import parse_cron
from gpuscale.core.disruption import DisruptionReason, classify_node
from gpuscale.core.disruption.passmemo import PassMemo, build_row, may_take
from gpuscale.core.model import Node, NodePool, OfferingKey, Pod
from gpuscale.core.resources import Resources

# Enum members read per candidate per round, as module constants (a global is cheaper than an Enum class attribute
# in Python 3.11: see controller/loop.py)
_EMPTY = DisruptionReason.EMPTY
_DRIFTED = DisruptionReason.DRIFTED

PoolOf = Callable[[str], NodePool | None]
"""The pool of a node name (through its claim)."""


def pod_moves(before: Mapping[str, Sequence[Pod]], after: Mapping[str, Sequence[Pod]]) -> tuple[set[str], set[str]]:
    """Between two observations' bound pods by node: (nodes some pod left, nodes whose set of pods changed).

    Only nodes whose pod lists differ are compared by pod key (lists of the same objects are equal at once); they
    are found by C-level maps over ``after`` (a node not seen before gets None, which differs from any list), in
    ``after``'s order, and the nodes gone are looked for only when ``after`` does not hold every name of ``before``."""
    left: set[str] = set()
    moved: set[str] = set()
    before_get = before.get
    new_names = 0
    for name in compress(after, map(ne, map(before_get, after), after.values())):
        new = after[name]
        old = before_get(name)
        if old is None:
            new_names += 1
            if new:  # pods on a node not seen before: nothing left it
                moved.add(name)
            continue
        old_keys = {p.key for p in old}
        new_keys = {p.key for p in new}
        if old_keys != new_keys:
            moved.add(name)
            if not old_keys <= new_keys:
                left.add(name)
    if len(after) - new_names != len(before):  # (else every name of before is in after)
        for name in before.keys() - after.keys():
            if before[name]:  # every pod left the node
                moved.add(name)
                left.add(name)
    return left, moved


def budget_edge(pool: NodePool, now: float) -> float:
    """The first time after ``now`` at which one of the pool's scheduled budgets opens or closes (inf if none)."""
    edge = math.inf
    for b in pool.disruption.budgets:
        if b.schedule is None or b.duration_s is None or b.duration_s <= 0:
            continue
        cron = parse_cron(b.schedule)
        last = cron.last_fire(now, b.duration_s)
        if last is not None and last + b.duration_s > now:
            edge = min(edge, last + b.duration_s)
        nxt = cron.next_fire(now)
        if nxt is not None:
            edge = min(edge, nxt)
    return edge


class PassInputs:
    """The unchanged-inputs skip's key: the small inputs (candidates, disruptions, protected nodes, unavailable
    offerings, measured utilisation) and the nodes (name, cordon, allocatable, launching) and bound pods (key, node)
    of a pass. Equal when all are; the node and pod sets are made only when the small inputs are equal (most passes
    differ there already). ``nodes`` and ``pods`` are the pass's own lists (never changed afterwards)."""

    __slots__ = ("_big", "nodes", "pods", "small")

    def __init__(self, small: tuple[object, ...], nodes: Sequence[Node], pods: Sequence[Pod]) -> None:
        self.small = small
        self.nodes = nodes
        self.pods = pods
        self._big: tuple[frozenset[object], frozenset[object]] | None = None

    def big(self) -> tuple[frozenset[object], frozenset[object]]:
        if self._big is None:
            self._big = (
                frozenset([(n.name, n.unschedulable, n.allocatable, n.launching) for n in self.nodes]),
                frozenset([(p.key, p.node_name) for p in self.pods if p.node_name is not None]),
            )
        return self._big

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PassInputs) and self.small == other.small and self.big() == other.big()

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A round where the cached decisions differ from the uncached reference (check mode)."""

    at: float
    what: str
    cached: object
    reference: object


def _placement_changed(node: Node, before: Node) -> bool:
    """Whether pods that could (not) go to the node may now differ though its allocatable did not: its labels or
    taints changed (a zone or GPU label relabelled, a taint removed or added). The gate then treats its room as new:
    every rest ends and the node is classified again."""
    if node is before:
        return False
    return node.taints != before.taints or (node.labels is not before.labels and node.labels != before.labels)


class ConsolidationGate:
    """Clocks, caches and skips of the consolidation step (see the module docstring for the invariant)."""

    def __init__(self, pools: Mapping[str, NodePool], config: ControllerConfig, *, check: bool = False) -> None:
        self.pools = pools
        self.config = config
        self.check = check
        self.measured = any(p.disruption.use_measured_gpu_utilization for p in pools.values())
        """Some pool judges utilisation by measured GPU use (its reasons are recomputed every round)."""
        self.since: dict[str, float] = {}
        """Candidate node -> when it became a candidate (its consolidateAfter clock)."""
        self.classes: dict[str, DisruptionReason | None] = {}
        """Candidate node -> its reason at the last look."""
        self.futile: dict[str, tuple[frozenset[str], float]] = {}
        """Resting node -> (its pods when it was kept, when to look again anyway)."""
        self.timed: dict[str, float] = {}
        """Resting nodes kept by a disruption budget -> when to look again (a wake-up time: see :meth:`rest`)."""
        self._rests_matched: frozenset[str] = frozenset()
        """Resting nodes whose pods matched their rest at the last round (none rested again since)."""
        self._room: tuple[
            Mapping[str, Sequence[Pod]], Mapping[str, Resources], frozenset[str], frozenset[OfferingKey]
        ] = (
            {},
            {},
            frozenset(),
            frozenset(),
        )
        self._nodes_seen: list[Node] = []
        """The last round's node objects, in order (the same ones again: the same room)."""
        self._node_names: frozenset[str] = frozenset()
        """The names of ``_nodes_seen`` (made again when the node objects change)."""
        self._seen: tuple[frozenset[str], Mapping[str, str], frozenset[str]] = (frozenset(), {}, frozenset())
        """The last round's node names, pending pods planned onto nodes (pod -> node) and unplanned pending pods."""
        self._names_with_flying: tuple[object, object, frozenset[str]] = (None, None, frozenset())
        """(node names, claims in flight, their union) as last made (the same two objects: the same union)."""
        self.last_pass_at = -math.inf
        self.skipped = False
        """Some candidate was due but the pass rate held it back (wake up when the interval ends)."""
        self._signature: object = None
        self._classified: tuple[frozenset[str], dict[str, DisruptionReason]] | None = None
        """The candidates and their reasons at the last classification (reused while nothing touched them)."""
        self._classified_from: object = None
        """The candidate set object of the last classification: when it is the step's own candidate node set
        (:attr:`candidate_nodes`, never changed once made) and handed in again, the candidates are the same."""
        self.last_evaluation = -math.inf
        self.candidate_nodes: tuple[object, set[str]] = (None, set())
        """(what the candidate node set was made from, the set): kept by the consolidation step between rounds."""
        self.memo = PassMemo()
        """The passes' rows and last all-kept pass (reused only where the pass provably decides the same)."""
        self.mismatches: list[Mismatch] = []
        self._started: frozenset[str] = frozenset()
        """Nodes the last pass started disrupting (see :meth:`started`)."""

    # ------------------------------------------------------------------------------------------------ clocks
    def forget(self, node_name: str) -> None:
        """The node stopped being a candidate for good (draining, gone)."""
        self.since.pop(node_name, None)

    def wait_s(self, node_name: str, pool_of: PoolOf) -> float:
        """How long the node must stay a candidate: its pool's wait for empty or for underutilised nodes."""
        pool = pool_of(node_name)
        empty = self.classes.get(node_name) is DisruptionReason.EMPTY
        return pool.disruption.wait_s(empty) if pool is not None else 0.0

    def wake_times(self, pool_of: PoolOf) -> list[float]:
        """When a clock runs out, when a held-back pass may run, and when a resting node is due again (its retry
        time or its pool's next budget window edge, whichever comes first): every time the gate's answer could
        change without the cluster changing."""
        times: list[float] = list(self.timed.values())
        known = self.classes
        for name, t in self.since.items():
            pool = pool_of(name)
            if pool is not None:  # (Disruption.wait_s, inlined: every candidate, every round)
                d = pool.disruption
                empty_s = d.consolidate_empty_after_s
                times.append(
                    t + (empty_s if empty_s is not None and known.get(name) is _EMPTY else d.consolidate_after_s)
                )
        if self.skipped:
            times.append(self.last_pass_at + self.config.disruption_interval_s)
        return times

    # ------------------------------------------------------------------------------------------------ selecting
    def select(
        self,
        candidates: set[str],
        disrupting: set[str],
        nodes: Mapping[str, Node],
        by_node: Mapping[str, Sequence[Pod]],
        pods: Sequence[Pod],
        has_pdbs: bool,
        utilization: Mapping[str, float],
        unavailable_now: frozenset[OfferingKey],
        now: float,
        pool_of: PoolOf,
        planned: Mapping[str, str] | None = None,
        flying: frozenset[str] = frozenset(),
        probe: Callable[[set[str]], bool] | None = None,
    ) -> list[str]:
        """The candidates due for a pass now: reasons refreshed where something changed, clocks started, resting
        nodes left out (unless what rests them changed). ``planned``: pending pods the pass places on nodes (pod
        key -> node name; they hold room there and do not count as disrupted for PDBs); ``flying``: claims of nodes
        in flight (the pass counts them in its pools' totals for budgets and minNodes). Only the unbound ones of
        ``pods`` are read (the pending pods). ``probe``: whether a pass over the given resting nodes alone, now,
        would act (asked only when room was taken where their pods fit; None: their rests end then)."""

        def on_node(name: str) -> frozenset[str]:
            return frozenset(p.key for p in by_node.get(name, ()))

        prev_by_node, prev_room, prev_disrupting, prev_unavailable = self._room
        room: Mapping[str, Resources] = {}
        room_grew: set[str] = set()  # schedulable nodes that are new or whose allocatable, labels or taints changed
        seen = list(nodes.values())
        prev_seen = self._nodes_seen
        self._nodes_seen = seen
        # the positions whose node object is not last round's (C-level; None when the number of nodes changed)
        remade = list(compress(count(), map(operator.is_not, seen, prev_seen))) if len(seen) == len(prev_seen) else None
        patched: dict[str, Resources] | None = None
        if remade and len(remade) * 4 <= len(seen):
            # a few nodes remade under the same names, in the same order: last round's room with theirs replaced (a
            # node cordoned dropped) is the room made afresh, in the same order, and the node names are the same
            patched = dict(prev_room)
            grew: list[str] = []
            for i in remade:
                n = seen[i]
                name = n.name
                b = prev_room.get(name)
                if name != prev_seen[i].name or (b is None and not n.unschedulable):
                    patched = None  # another node, or one no longer cordoned (its place in the order): made afresh
                    break
                if n.unschedulable:
                    patched.pop(name, None)
                else:
                    a = patched[name] = n.allocatable
                    if (b is not a and b != a) or _placement_changed(n, prev_seen[i]):
                        grew.append(name)
        if remade == []:
            room = prev_room  # the very same nodes as last round: the same room (and names)
        elif patched is not None:
            room = patched
            room_grew.update(grew)
        else:
            self._node_names = frozenset(nodes)
            prev_alloc = prev_room.get
            before = {p.name: p for p in prev_seen}
            before_get = before.get
            room = fresh = {}
            for n in seen:
                if not n.unschedulable:
                    name = n.name
                    a = fresh[name] = n.allocatable
                    # (last round's very node object, schedulable then too: in the last room with this allocatable)
                    if (was := before_get(name)) is not n and (
                        was is None  # (a new name: not in the last room either)
                        or (b := prev_alloc(name)) is None
                        or (b is not a and b != a)
                        or _placement_changed(n, was)
                    ):
                        room_grew.add(name)
        left_some: set[str] = set()
        pods_moved: set[str] = set()
        if by_node is not prev_by_node:  # (lists of the same pods compare equal at once)
            left_some, pods_moved = pod_moves(prev_by_node, by_node)  # nodes a pod left; nodes whose pods changed
        same_disrupting = disrupting == prev_disrupting
        changed = not same_disrupting or unavailable_now != prev_unavailable
        changed = changed or (has_pdbs and bool(pods_moved))
        prev_names, prev_planned, prev_pending = self._seen
        names = self._node_names
        if flying:  # (the union is kept while the node names and the claims in flight are the same objects)
            made = self._names_with_flying
            if made[0] is names and made[1] is flying:
                names = made[2]
            else:
                union = names | flying
                self._names_with_flying = (names, flying, union)
                names = union
        if planned:  # only a pending pod holds room on the node it is planned onto (as the pass sees it)
            waiting = {p.key for p in pods if p.pending}
            planned = {k: v for k, v in planned.items() if k in waiting}
        else:
            planned = {}
        pending: frozenset[str] = frozenset()
        if has_pdbs:  # PDB allowances count pending pods not planned anywhere
            pending = frozenset(p.key for p in pods if p.node_name is None and p.phase == "Pending")
            pending = pending - planned.keys()
        self._seen = (names, planned, pending)
        # a node joining raises percentage budgets and minNodes headroom: every resting node is looked at again
        changed = changed or (names is not prev_names and not names <= prev_names) or pending != prev_pending
        if planned != prev_planned:  # a planned pod that left its node (or moved) frees room there
            get = planned.get
            left_some = left_some | {n for k, n in prev_planned.items() if get(k) != n}
        # room appeared somewhere (a pod left, a planned pod stopped holding room, a node joined or grew): every
        # resting node is looked at again. The pass packs pods best-fit over all nodes, so room on a node none of a
        # resting node's pods fit can still change its outcome (seen on the openb replay): no finer test is sound.
        changed = changed or bool(left_some) or bool(room_grew)
        touched = pods_moved | room_grew
        if room is not prev_room:  # nodes gone or cordoned (none when the very same nodes are seen again)
            touched |= prev_room.keys() - room.keys()
        self._room = (by_node, room, prev_disrupting if same_disrupting else frozenset(disrupting), unavailable_now)
        if self._started:
            if self.timed and not self._started <= disrupting:  # a disruption the resting pass counted has ended
                self.futile = {n: v for n, v in self.futile.items() if n not in self.timed}
                self.timed = {}
                self._signature = None  # a rest ended: pass again
            self._started = frozenset()
        if self.futile:
            resting = len(self.futile)
            # room taken on a node (a pod bound or planned there, the node cordoned or gone): the rests whose pods
            # could take that node's room before end (best-fit is not monotone in the room: see _shrunk_rests)
            hit: set[str] = set()
            if not changed:
                shrunk = pods_moved - left_some
                if planned:
                    old = prev_planned.get
                    shrunk |= {n for k, n in planned.items() if old(k) != n}
                if room is not prev_room:
                    shrunk |= prev_room.keys() - room.keys()
                if shrunk:
                    hit = self._shrunk_rests(shrunk, prev_room, prev_seen, prev_by_node, by_node)
                    futile = self.futile  # (only rests that nothing else ends are probed)
                    hit = {n for n in hit if n in candidates and n not in pods_moved and futile[n][1] > now}
                    if hit and probe is not None and not probe(hit):
                        hit = set()  # judged as they were: each kept with no action before it (see rest ends)
            # a rest whose pods matched at the last round still does if its node's pods did not change since
            matched = self._rests_matched
            self.futile = {
                n: (keys, until)
                for n, (keys, until) in self.futile.items()
                if not changed
                and n not in hit
                and until > now
                and n in candidates
                and ((n in matched and n not in pods_moved) or keys == on_node(n))
            }
            self._rests_matched = frozenset(self.futile)
            if len(self.futile) < resting:  # a rest ended (its retry time, a budget edge, a change): pass again
                self._signature = None
            if self.timed:
                self.timed = {n: t for n, t in self.timed.items() if n in self.futile}
        classes = self._classify(candidates, nodes, touched, by_node, utilization)
        # a node's clock runs from when it became a candidate, whatever its reason since (see docs/controller.md)
        if self.since.keys() != classes.keys():  # (equal keys: the same map again)
            self.since = {n: self.since.get(n, now) for n in classes}
        due: list[str] = []
        futile, since, known = self.futile, self.since, self.classes
        for name, why in classes.items():  # (wait_s and Disruption.wait_s, inlined: every candidate, every round)
            if name in futile:
                continue
            if why is not _DRIFTED:
                pool = pool_of(name)
                if pool is not None:
                    d = pool.disruption
                    empty_s = d.consolidate_empty_after_s
                    wait = empty_s if empty_s is not None and known.get(name) is _EMPTY else d.consolidate_after_s
                    if now - since[name] < wait:
                        continue
                elif now - since[name] < 0.0:
                    continue
            due.append(name)
        return due

    def open_pass(self, due: Sequence[str], now: float) -> bool:
        """True if a pass may run now over ``due`` (the pass rate allows it); records the pass."""
        if not due:
            self.skipped = False
            return False
        if now - self.last_pass_at < self.config.disruption_interval_s:
            self.skipped = True
            return False
        self.skipped = False
        self.last_pass_at = now
        return True

    def inputs_changed(self, signature: object, now: float, pool_of: PoolOf) -> bool:
        """False if the pass's inputs equal the last evaluated ones, no clock ran out since and the refresh period
        has not passed (the pass is then skipped); True records ``signature`` as evaluated."""
        last = self.last_evaluation
        # the same inputs are skipped unless a clock ran out since (looked at only then: most passes differ)
        if (
            signature == self._signature
            and now - last < self.config.consolidation_refresh_s
            and not any(last < t + self.wait_s(name, pool_of) <= now for name, t in self.since.items())
        ):
            return False
        self._signature = signature
        self.last_evaluation = now
        return True

    def rest(
        self, node_name: str, pod_keys: frozenset[str], now: float, pool_of: PoolOf | None = None, timed: bool = False
    ) -> None:
        """The pass kept the node for a reason only a cluster change can lift: leave it out until one happens, the
        retry time passes, or one of its pool's scheduled budgets opens or closes.

        ``timed`` (kept by a disruption budget): that time is a wake-up time. A budget's room depends on the
        nodes being disrupted as the pass counts them, more than the gate watches, so a quiet cluster must still
        look again then. Other rests end only through cluster changes, which wake a controller by themselves
        (their retry time is a safety net taken at the next round, not a wake-up)."""
        until = now + self.config.consolidation_retry_s
        pool = pool_of(node_name) if pool_of is not None else None
        if pool is not None and pool.disruption.budgets:  # (no budget: no edge, budget_edge's inf)
            until = min(until, budget_edge(pool, now))
        self.futile[node_name] = (pod_keys, until)
        if node_name in self._rests_matched:  # (a new rest: its pods are compared at the next round)
            self._rests_matched = self._rests_matched - {node_name}
        if timed:
            self.timed[node_name] = until
        else:
            self.timed.pop(node_name, None)

    def started(self, nodes: set[str]) -> None:
        """A pass started disrupting ``nodes``. The rests it made by a budget counted them as under way: the next
        round ends those rests if one of them is no longer being disrupted (it may have ended between two rounds, so
        that no round saw the disruptions change). Other rests wait for room, pods or nodes, which the end of a
        disruption does not bring (a disrupted node leaves no room behind; a replacement joining ends every rest)."""
        self._started = frozenset(nodes)

    # ------------------------------------------------------------------------------------------------ reference
    def reference_due(
        self,
        candidates: set[str],
        nodes: Mapping[str, Node],
        by_node: Mapping[str, Sequence[Pod]],
        utilization: Mapping[str, float],
        now: float,
        pool_of: PoolOf,
    ) -> list[str]:
        """The uncached answer (check mode): every candidate classified afresh, none resting."""
        out: list[str] = []
        for name in candidates:
            why = self._reason(name, nodes, by_node, utilization)
            if why is None:
                continue
            cached = self.classes.get(name)
            if cached is not why:
                self.mismatches.append(Mismatch(now, f"reason of {name}", cached, why))
            pool = pool_of(name)
            wait = pool.disruption.wait_s(why is DisruptionReason.EMPTY) if pool is not None else 0.0
            if why is DisruptionReason.DRIFTED or now - self.since.get(name, now) >= wait:
                out.append(name)
        return out

    def compare(self, now: float, cached: object, reference: object) -> None:
        """Record a difference between the cached and the uncached decisions of this round."""
        if cached != reference:
            self.mismatches.append(Mismatch(now, "decisions", cached, reference))

    # ------------------------------------------------------------------------------------------------ internals
    def _shrunk_rests(
        self,
        shrunk: set[str],
        prev_room: Mapping[str, Resources],
        prev_seen: Sequence[Node],
        prev_by_node: Mapping[str, Sequence[Pod]],
        by_node: Mapping[str, Sequence[Pod]],
    ) -> set[str]:
        """The resting nodes some pod of which could take the room that one of the ``shrunk`` nodes had at the last
        round (its allocatable less its bound pods then: at least the room the pass saw, which counted planned pods
        too). Room taken on a node can change a resting node's outcome: the pass packs best-fit, so a fuller node
        can become a pod's best fit and leave another node's room to a second pod (seen on the openb replay: a pod
        bound to an empty node kept by emptyWait made a resting node's two pods fit). A node none of a resting
        node's pods fit is never chosen for them, before or after, so their packing is unchanged: the same test as
        the pass memo's (:func:`~gpuscale.core.disruption.passmemo.may_take`, without GPR workload selectors, which
        only narrow it)."""
        before = {n.name: n for n in prev_seen if n.name in shrunk and n.name in prev_room}
        if not before:  # none was a destination at the last round
            return set()
        rows = [build_row(n, prev_by_node.get(name) or ()) for name, n in before.items()]
        return {
            name
            for name in self.futile
            if any(may_take(row, p, None) for p in by_node.get(name, ()) for row in rows if row.node.name != name)
        }

    def _reason(
        self,
        name: str,
        nodes: Mapping[str, Node],
        by_node: Mapping[str, Sequence[Pod]],
        utilization: Mapping[str, float],
    ) -> DisruptionReason | None:
        n = nodes.get(name)
        pool = self.pools.get(n.pool or "") if n is not None else None
        if n is None or pool is None or n.unschedulable or n.launching:
            return None
        return classify_node(n, pool, by_node.get(name, []), utilization)

    def _classify(
        self,
        candidates: set[str],
        nodes: Mapping[str, Node],
        touched: set[str],
        by_node: Mapping[str, Sequence[Pod]],
        utilization: Mapping[str, float],
    ) -> dict[str, DisruptionReason]:
        """Candidate reason per node, recomputed only for nodes whose pods or capacity changed (``touched``) or that
        just became candidates; measured-utilisation pools are recomputed every time."""
        measured = self.measured
        known = self.classes
        # (the step's own candidate set handed in again: equal to the last one without comparing them)
        same_set = candidates is self._classified_from and candidates is self.candidate_nodes[1]
        if (
            not measured
            and self._classified is not None
            and len(known) == len(candidates)
            and (same_set or candidates == self._classified[0])
            and touched.isdisjoint(candidates)
        ):  # the same candidates, each with a reason kept from the last look and none touched: the same answer
            self._classified_from = candidates
            return self._classified[1]
        pools = self.pools
        self._classified_from = candidates
        if not measured and self._classified is not None:
            # only the touched candidates and those without a kept reason (new ones) are looked at; the reasons of
            # nodes no longer candidates are dropped: the same map as the loop below makes
            prev_candidates, prev_out = self._classified
            same = len(known) == len(candidates) and (same_set or candidates == prev_candidates)
            redo = touched & candidates if same else (touched & candidates) | (candidates - known.keys())
            known = dict(known)
            changed = dict(prev_out)
            if not same:
                for name in prev_candidates - candidates:
                    known.pop(name, None)
                    changed.pop(name, None)
            for name in redo:
                n = nodes.get(name)
                pool = pools.get(n.pool or "") if n is not None else None
                if n is None or pool is None or n.unschedulable or n.launching:
                    known.pop(name, None)  # (as below: no reason kept, looked at again next time)
                    changed.pop(name, None)
                    continue
                why = known[name] = classify_node(n, pool, by_node.get(name, []), utilization)
                if why is None:
                    changed.pop(name, None)
                else:
                    changed[name] = why
            self.classes = known
            self._classified = (prev_candidates if same else frozenset(candidates), changed)
            return changed
        cache: dict[str, DisruptionReason | None] = {}
        out: dict[str, DisruptionReason] = {}
        for name in candidates:
            if measured or name in touched or name not in known:
                n = nodes.get(name)
                pool = pools.get(n.pool or "") if n is not None else None
                if n is None or pool is None or n.unschedulable or n.launching:
                    continue
                why = classify_node(n, pool, by_node.get(name, []), utilization)
            else:
                why = known[name]
            cache[name] = why
            if why is not None:
                out[name] = why
        self.classes = cache
        self._classified = (frozenset(candidates), out)
        return out
