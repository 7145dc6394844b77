"""The controller's state carried from one round to the next, in small named objects.

- :class:`ScaleUpState`: the planner, the batch window and the planning memo (what the last plan saw and decided),
  with a check mode that plans beside every skipped plan and records where skipping would have launched less.
- :class:`Observation`: the time of the round, the pod, node and cloud lists as last returned (a driver that returns
  the same immutable tuple again is observed without looking at each pod or node), whether the claim sync may be
  skipped, the claims the provider stopped listing, and the round's wake-up times.
- :class:`Replacements`: nodes being replaced (with their replacements' claims) and claims drained involuntarily.
- :class:`Reports`: the last reason reported for each object (no repeated events).

Each decides nothing: the decisions are in :mod:`gpuscale.core.reconcile`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from itertools import compress
from typing import TYPE_CHECKING

from gpuscale.controller.batching import PendingBatch
from gpuscale.controller.consolidation import Mismatch
from gpuscale.core.disruption import DisruptionAction
from gpuscale.core.model import Node, Pod
from gpuscale.core.reconcile.launching import capped_backoff_s
from gpuscale.core.reconcile.scaleup import (
    Gate,
    PlanFn,
    PlanningMemo,
    ScaleUpDecision,
    displaced,
    held_back,
    scale_up_wake_times,
)
from gpuscale.providers.base import CloudNode

if TYPE_CHECKING:
    from gpuscale.controller.availability import Availability
    from gpuscale.controller.claims import ClaimTable


LivePods = tuple[list[Pod], dict[str, list[Pod]], list[Pod]]
"""(live pods in list order, those bound grouped by node name in that order, the unbound ones)."""


def live_pods(listed: Iterable[Pod], phases: Collection[str]) -> LivePods:
    """The pods of ``listed`` whose phase is in ``phases``, those with a node grouped by node name and those
    without one, in the order listed (the round regroups whenever the pod list changes)."""
    pods = [p for p in listed if p.phase in phases]  # (filtered first: a comprehension is cheaper than appends)
    by_node: dict[str, list[Pod]] = {}
    unbound: list[Pod] = []
    group_of = by_node.get
    for p in pods:
        name = p.node_name
        if name is None:
            unbound.append(p)
        elif (group := group_of(name)) is None:
            by_node[name] = [p]
        else:
            group.append(p)
    return pods, by_node, unbound


class ScaleUpState:
    """The scale-up's state: planner, batch window, planning memo and whether a plan is forced.

    Invariant (:class:`~gpuscale.core.reconcile.scaleup.PlanningMemo`, with its one exception): a plan the gate
    skips would have launched nothing the last plan did not already decide. With ``check``, the controller plans
    beside every skipped plan and :meth:`compare` records each launch order the skip held back as a
    :class:`Mismatch`.
    """

    def __init__(self, planner: PlanFn, batch: PendingBatch, *, check: bool = False) -> None:
        self.planner = planner
        self.batch = batch
        self.memo = PlanningMemo()
        self.force = False
        """A launch failed since the last plan (or a claim was lost): plan in the next scale-up whatever the gate."""
        self.check = check
        self.mismatches: list[Mismatch] = []
        self.checked: dict[Gate, int] = {}
        """Skipped plans compared so far, by the gate that skipped them (check mode)."""
        self.excused = 0
        """Launches held back by a skip that the memo's exception allows (check mode)."""

    def request_plan(self) -> None:
        """Plan in the next scale-up (the gate's batch, cover and signature checks are skipped)."""
        self.force = True

    def planned(self, memo: PlanningMemo) -> None:
        """A plan ran: keep what it saw and decided; the forced plan is done."""
        self.memo = memo
        self.force = False

    def keep(self, memo: PlanningMemo) -> None:
        """The gate skipped planning and updated the memo."""
        self.memo = memo

    @property
    def planned_on_node(self) -> Mapping[str, str]:
        """Pending pod -> the existing node the last plan put it on (read by consolidation)."""
        return self.memo.planned_on_node

    def wake_times(self, availability: Availability) -> list[float]:
        """When the open batch closes and, while pods are pending, when an offering mark, back-off or fallback
        ends (a plan may then launch what it could not)."""
        batch = self.batch
        closes = batch.wake_time() if batch.start is not None else None
        if not batch.seen:  # (most rounds) no expiry wakes a scale-up with nothing pending
            return [] if closes is None else [closes]
        return scale_up_wake_times(closes, True, availability.expiries())

    def compare(
        self,
        now: float,
        gate: Gate,
        reference: ScaleUpDecision,
        replan_interval_s: float,
        *,
        pending: Collection[str] | None = None,
        replan: Callable[[frozenset[str]], ScaleUpDecision] | None = None,
    ) -> None:
        """Check mode: record a skip whose plan (``reference``) has launch orders the last plan did not decide (see
        :func:`~gpuscale.core.reconcile.scaleup.held_back`; the orders its exception allows are only counted).
        ``pending``: the pending pods (default: every pod the memo placed); ``replan``: plans the same round with
        the given pods left out, called when the exception covered some."""
        self.checked[gate] = self.checked.get(gate, 0) + 1
        keys = self.memo.planned_on_node.keys() if pending is None else pending
        moved = displaced(self.memo, reference, keys, now, replan_interval_s)
        without = replan(moved) if moved and replan is not None else None
        wrong, excused = held_back(self.memo, reference, moved, without)
        self.excused += len(excused)
        if wrong:
            self.mismatches.append(Mismatch(now, f"skipped plan ({gate})", (), tuple(wrong)))


class Observation:
    """What the last rounds observed that the next round may reuse (see the module docstring)."""

    def __init__(self, foreign: Callable[[str], bool] | None) -> None:
        self.foreign = foreign
        """Request ids another engine owns (default: the GPR manager's): their nodes are never adopted, until the
        GPR manager hands its launches to this controller."""
        self.now = -math.inf
        """The time of the current round (notes from the launcher are stamped with it)."""
        self.pods_list: object = None
        self.pods: LivePods = ([], {}, [])
        """The live pods of ``pods_list`` (the backend's last pod list, kept if it was an immutable tuple), grouped
        (:func:`live_pods`)."""
        self.nodes_list: object = None
        self.nodes: dict[str, Node] = {}
        self.cloud_list: object = None
        self.cloud: list[CloudNode] = []
        self.synced: tuple[object, int] | None = None
        """(cloud list, claim table version) after a claim sync whose result a second sync would not change."""
        self.synced_nodes: object = None
        """The node list that sync depended on (a claim waited for its Node), or None if it depended on none."""
        self.settled_nodes = SettledNodes()
        """The listed nodes the next claim sync may leave out."""
        self.unlisted: set[str] = set()
        """Claims the provider stopped listing (lost after a grace period)."""
        self.wake_times: list[float] | None = None
        """Candidate wake-up times, computed on demand after each round (None: not yet)."""
        self.wake_next: float | None = None
        """The earliest of ``wake_times`` after the time it was last asked at (valid while ``wake_times`` is)."""
        self.deadlines: tuple[int, object, list[float], list[float]] | None = None
        """(the claim table's version, its answer for the timed phases, the deadlines of those claims, each plus
        1 µs) as last computed."""

    def live_pods(self, listed: Sequence[Pod], phases: Collection[str]) -> LivePods:
        """:func:`live_pods` of ``listed``, the very same answer as last time if the list is the same. Only an
        immutable tuple is recognised again, also a new tuple of the very same pod objects in the same order (a
        backend that lists again after a change elsewhere: pods are never changed in place, so the live pods and
        their grouping are the same); the answer's lists are shared, never changed."""
        last = self.pods_list
        if last is not None and (
            listed is last
            or (
                isinstance(listed, tuple)
                and isinstance(last, tuple)
                and len(listed) == len(last)
                and all(map(operator.is_, listed, last))
            )
        ):
            self.pods_list = listed
            return self.pods
        self.pods_list = listed if isinstance(listed, tuple) else None
        self.pods = found = live_pods(listed, phases)
        return found

    def patched_nodes(self, listed: Sequence[Node], normalise: Callable[[Node], Node]) -> dict[str, Node] | None:
        """The nodes by name of a new immutable node list of the same length as the last one, each at the same
        position under the same name (node objects replaced where the node changed): the last nodes with the changed
        ones normalised again, which is what the whole list normalised gives, in the same order (the last list had no
        name twice). None for any other list (normalise all)."""
        last, kept = self.nodes_list, self.nodes
        if not isinstance(last, tuple) or not isinstance(listed, tuple) or not len(listed) == len(last) == len(kept):
            return None
        nodes = dict(kept)
        for i in compress(range(len(listed)), map(operator.is_not, listed, last)):
            n = listed[i]
            if n.name != last[i].name:
                return None
            nodes[n.name] = n if n.pool is not None else normalise(n)
        return nodes

    def same_nodes(self, listed: object) -> bool:
        """True if ``listed`` is the node list observed last time (the same immutable tuple)."""
        return self.nodes_list is not None and listed is self.nodes_list

    def keep_nodes(self, listed: object, nodes: Mapping[str, Node]) -> None:
        """Remember the normalised node list (only an immutable tuple can be recognised again)."""
        if isinstance(listed, tuple):
            self.nodes_list, self.nodes = listed, dict(nodes)
        else:
            self.nodes_list, self.nodes = None, {}

    def keep_cloud(self, listed: object, alive: list[CloudNode]) -> None:
        """Remember the provider's node list and its live nodes."""
        self.cloud_list = listed if isinstance(listed, tuple) else None
        self.cloud = alive

    def sync_needed(self, claims_version: int) -> bool:
        """False if the provider list and the claims (and the node list, if that sync depended on it) are those left
        by the last sync whose result is a fixpoint: a sync of the same inputs would change nothing."""
        synced = self.synced
        if (
            synced is not None
            and synced == (self.cloud_list, claims_version)
            and (self.synced_nodes is None or self.synced_nodes is self.nodes_list)
        ):
            return False
        self.synced = None
        return True

    def synced_with(self, unlisted: set[str], settled: bool, claims_version: int, *, fixpoint: bool = False) -> None:
        """A claim sync ran; ``settled``: every listed node matched its settled claim (nothing depends on the
        cluster); ``fixpoint``: a sync of the same lists would change nothing (it depends on the node list).
        ``claims_version`` is the claim table's version once the sync's decisions are carried out."""
        self.unlisted = unlisted
        if self.cloud_list is None:
            return
        if settled:
            self.synced, self.synced_nodes = (self.cloud_list, claims_version), None
        elif fixpoint and self.nodes_list is not None:
            self.synced, self.synced_nodes = (self.cloud_list, claims_version), self.nodes_list


class SettledNodes:
    """Which listed nodes the claim sync may leave out: those a sync found settled (``Decisions.matched``: their
    claim needs nothing from them, whatever the time or the Nodes), kept by position in the provider's listing.

    Invariant: ``nodes[i]`` is the node object a sync found settled at position ``i`` of the listing it was given,
    ``keys[i]`` its claim key, and ``known`` maps that key to ``i``, only while the claim under that key has not
    changed since (the claim table's :meth:`~gpuscale.controller.claims.ClaimTable.watch_keys`); every other
    position holds None. A listed node is left out only if it is the very same object at the same position (nodes
    are immutable), so its claim would be found settled again: a sync of the other nodes with these keys as
    ``known`` decides exactly what a sync of the whole listing decides. A listing in another order, or from a
    provider that makes new node objects every time, is judged node by node again (correct, only not faster).
    """

    def __init__(self) -> None:
        self.table: object = None
        self.changed: set[str] = set()
        """Claim keys changed since they were last looked at (the table's change feed)."""
        self.nodes: list[CloudNode | None] = []
        self.keys: list[str] = []
        self.known: dict[str, int] = {}

    def todo(self, claims: ClaimTable, cloud: Sequence[CloudNode]) -> tuple[list[int], list[CloudNode], dict[str, int]]:
        """(positions of the listed nodes to judge, those nodes, the keys of the nodes left out)."""
        if claims is not self.table:  # another table: start over, following its changes
            self.table, self.changed = claims, claims.watch_keys()
            self.nodes, self.keys, self.known = [], [], {}
        nodes, keys, known = self.nodes, self.keys, self.known
        if self.changed:
            for key in self.changed:
                i = known.pop(key, None)
                if i is not None:
                    nodes[i] = None
            self.changed.clear()
        n, had = len(cloud), len(nodes)
        if had < n:
            nodes += [None] * (n - had)
            keys += [""] * (n - had)
        elif had > n:
            for i in range(n, had):
                if nodes[i] is not None:
                    del known[keys[i]]
            del nodes[n:], keys[n:]
        if not known:
            return list(range(n)), list(cloud), known
        pos = list(compress(range(n), map(operator.is_not, cloud, nodes)))  # (C-level: the listing is read every sync)
        for i in pos:
            if nodes[i] is not None:
                del known[keys[i]]
                nodes[i] = None
        todo = [cloud[i] for i in pos]
        if any((cn.request_id or cn.node_id) in known for cn in todo):  # a key listed twice: judge every node
            self.forget()
            return list(range(n)), list(cloud), self.known
        return pos, todo, known

    def found(self, pos: Sequence[int], cloud: Sequence[CloudNode], matched: Iterable[tuple[int, str]]) -> None:
        """The sync of the nodes at ``pos`` (of ``cloud``) found ``matched`` settled (indices into ``pos``); a key
        already known at another position (the same node listed twice) is not kept a second time."""
        nodes, keys, known = self.nodes, self.keys, self.known
        for j, key in matched:
            if key not in known:
                i = pos[j]
                nodes[i], keys[i], known[key] = cloud[i], key, i

    def forget(self) -> None:
        """Keep no node settled (every node of the next listing is judged)."""
        self.nodes = [None] * len(self.nodes)
        self.known = {}


UNCORDON_RETRY_MIN_S = 1.0
UNCORDON_RETRY_MAX_S = 60.0


class Replacements:
    """Nodes being replaced and claims drained involuntarily."""

    def __init__(self) -> None:
        self.by_old: dict[str, tuple[tuple[str, ...], DisruptionAction]] = {}
        """Replaced node -> (its replacements' claim keys, the disruption action)."""
        self.involuntary: set[str] = set()
        """Claims drained for a reason the workload did not choose (spot interruption, node failure)."""
        self.cordoned: set[str] = set()
        """Nodes gpuscale cordoned when it started their replacement (``rightsize``, ``spotToSpot``): uncordoned
        if the replacement fails and the node is kept. In memory only (see docs/policies.md)."""
        self.uncordon_due: dict[str, float] = {}
        """Nodes an uncordon was sent for -> when it is sent again if the node is still seen unschedulable (kept
        until it is seen schedulable, gone or leaving: :func:`~gpuscale.core.reconcile.retry_uncordons`)."""
        self.uncordon_sent: dict[str, int] = {}
        """Nodes an uncordon was sent for -> the requests sent so far (the back-off doubles with each)."""

    def start(self, old_node: str, rids: tuple[str, ...], action: DisruptionAction) -> None:
        """``old_node`` is being replaced by the claims ``rids``."""
        self.by_old[old_node] = (rids, action)

    def drop(self, old_node: str) -> None:
        """The replacement of ``old_node`` is over (drained, or abandoned)."""
        self.by_old.pop(old_node, None)
        self.cordoned.discard(old_node)

    def uncordoned(self, node: str, now: float) -> None:
        """An uncordon of ``node`` was sent: send it again after a back-off (1 s, doubling up to 60 s) while the
        node is still seen unschedulable (a failed request is only logged by the backend)."""
        n = self.uncordon_sent.get(node, 0) + 1
        self.uncordon_sent[node] = n
        self.uncordon_due[node] = now + capped_backoff_s(n, UNCORDON_RETRY_MIN_S, UNCORDON_RETRY_MAX_S)

    def uncordon_settled(self, node: str) -> None:
        """``node`` is seen schedulable (or gone, or leaving): no uncordon is sent again."""
        self.uncordon_due.pop(node, None)
        self.uncordon_sent.pop(node, None)

    def wake_times(self) -> list[float]:
        """When an uncordon is due again."""
        return list(self.uncordon_due.values())

    def progress(self) -> dict[str, tuple[tuple[str, ...], str]]:
        """Replaced node -> (replacement keys, reason), as :func:`~gpuscale.core.reconcile.progress_replacements`
        reads them."""
        return {old: (rids, str(a.reason)) for old, (rids, a) in self.by_old.items()}

    def finished(self, key: str) -> None:
        """Claim ``key`` is gone."""
        self.involuntary.discard(key)


class Reports:
    """The last reason reported per object, so that an unchanged reason is not recorded again every round."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}
        self._pods: set[str] = set()
        """The keys of ``last`` that are pods (``pod/...``): the only ones :meth:`prune_pods` looks at."""

    def changed(self, obj: str, reason: str) -> bool:
        """True (and remembered) if ``reason`` is new for ``obj``."""
        if self.last.get(obj) == reason:
            return False
        self.last[obj] = reason
        if obj.startswith("pod/"):
            self._pods.add(obj)
        return True

    def forget(self, obj: str) -> None:
        """Report ``obj``'s next reason even if it is the last one."""
        self.last.pop(obj, None)
        self._pods.discard(obj)

    def prune_pods(self, pending: Iterable[str]) -> None:
        """Forget the reasons of pods no longer pending (a new blockage is reported again)."""
        if not self._pods:
            return  # (most rounds: no pod's reason is kept)
        keep = set(pending)
        gone = [k for k in self._pods if k[len("pod/") :] not in keep]
        for k in gone:
            del self.last[k]
            self._pods.discard(k)
