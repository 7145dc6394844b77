"""GPR demand in the controller's engine: the nodes of GPU Provisioning Requests live in the same claim table, go
through the same provider calls and availability record and the same node lifecycle as the nodes of pods.

The GPR manager (:class:`~gpuscale.gpr.manager.GprManager` with ``engine=controller``) decides which reservations
hold capacity. Its inventory is :meth:`GprSteps.gpr_inventory`: the engine's free nodes (Ready and initialised, no
pods but DaemonSet pods, not leaving or being replaced, not planned for a pending pod, not held by a GPR) and the
nodes a GPR holds by label. The manager hands each launch (N nodes of one type, in one zone, with the GPR's labels and
taints) to :meth:`GprSteps.launch_gpr_nodes`, each free node it borrows to the inventory's ``assign`` (the engine
labels and taints the Node), each borrowed node it gives back to ``unassign`` (labels and taint removed) and each
launched node a GPR no longer holds to :meth:`GprSteps.release_gpr_node`. The controller then:

- launches in the first of its pools that offers the GPR's type (so the pool's limits count GPR nodes too), and
  records every node of the launch as a claim keyed by the GPR's request id (``<id>`` for the first node,
  ``<id>#<node id>`` for the others, as :func:`~gpuscale.core.reconcile.sync_claims` keys a multi-node request), so
  a node is never adopted twice and a restarted controller adopts GPR nodes like its own;
- holds a node for a GPR while its Node carries the GPR's label ``gpuscale.io/gpr`` (a launched node also while it is
  in flight): such a node is never a consolidation candidate, never counts towards ``minNodes``, and a launched one
  in flight is never room for pending pods; held nodes are rebuilt from the labels after a restart;
- on release of a launched node follows the label :data:`~gpuscale.core.gpr.RELEASE_POLICY_LABEL` the launch put on
  it (the GPR's ``releasePolicy``): ``Delete`` drains (pods of the GPR evicted, PDBs honoured) and deletes it through
  the normal lifecycle; ``Consolidate`` (the default) removes the GPR's labels and taint, and the node is an ordinary
  node of its pool again (consolidated after ``consolidateAfter`` when empty, or borrowed by the next GPR).
  Borrowed nodes are always given back, never deleted by their GPR.

:class:`GprNodes` is the state (the GPR labels seen on Nodes, releases not yet carried out, labels just written, the
provider as last observed for the manager); it costs nothing while no GPR manager uses this engine (pods-only
clusters behave exactly as before).

**One reader of the provider.** In engine mode the controller's observe step is the only caller of the provider's
``list_nodes`` and ``poll_errors`` (``poll_errors`` drains the provider's queue: two readers would each take events
meant for the other). Each round it hands both to :class:`GprFeed`, which keeps the last node list and queues the
events whose request id is a GPR's until the manager takes them with :meth:`GprSteps.gpr_observation` (each event
once; bounded, see :class:`GprFeed`). The controller still handles every event for its own claims, GPR nodes
included. Who reacts to what, exactly once each:

- a GPR launch's ``launch-failed``: the engine fails the claim and marks the offering in the shared availability
  record; the manager fails the GPR's attempt (``ProvisioningFailed``; requeued or not per the GPR core);
- a GPR node's ``node-failed`` or spot notice: the engine drains and deletes the node (involuntary), the manager never
  deletes it. A Provisioning GPR's attempt fails on a ``node-failed`` of its request (its other launched nodes are
  then released as usual; the failed node's release is dropped, as it is leaving already); a Provisioned GPR learns
  of the loss when the node leaves the provider's list (``NodeLost``).

Until the engine's first observation (a manager pass before the controller's first round, after a restart)
:meth:`GprSteps.gpr_observation` returns None and the manager skips its pass rather than asking the provider.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.shell import LEAVING, ShellBase, World
from gpuscale.core import labels as L
from gpuscale.core.gpr import (
    GPR_LABEL,
    GPR_TAINT,
    RELEASE_POLICY_LABEL,
    GprNode,
    gpr_id_of_request,
    is_gpr_request_id,
)
from gpuscale.core.model import CapacityType, Node, Pod, Taint
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL, ClaimPhase, NodeClaim
from gpuscale.core.reconcile import Decisions, EventKind, Rules, adopt_claim, start_drain
from gpuscale.errors import ProviderError
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, ProviderEvent

log = logging.getLogger("gpuscale.controller")
_HOLDING = (ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED, ClaimPhase.INITIALIZED)
_LIVE_PODS = ("Pending", "Running", "")
WRITE_GRACE_S = 120.0
"""How long a label the engine wrote counts before the Node shows it (a watch that lags behind the write)."""


def request_of(key: str) -> str:
    """The request id of a claim key (``<id>`` or ``<id>#<node id>``)."""
    return key.split("#", 1)[0]


def launched_for(key: str, node: Node | None = None) -> str | None:
    """The GPR a claim's node was launched for (from the claim key, else the Node's request-id label), or None."""
    rid = request_of(key) if key else (node.labels.get(REQUEST_ID_LABEL, "") if node is not None else "")
    return gpr_id_of_request(rid) if is_gpr_request_id(rid) else None


MAX_GPR_EVENTS = 1024
"""How many distinct GPR provider events (request id, node id, kind) wait at most for the GPR manager."""


class GprFeed:
    """The provider as the engine last observed it, kept for the GPR manager: the node list of the last round and the
    GPR launches' events not taken yet (the engine is the provider's only reader; see the module docstring).

    Events wait in arrival order until :meth:`take` returns them, once. The same event reported again before it was
    taken (same request id, node id and kind) is kept once, its latest report in its place; past ``limit`` distinct
    events the oldest is dropped, counted in :attr:`dropped` and logged (a manager that has not run for that long).
    A round whose observation failed keeps the queue and makes :meth:`take` raise that error until the next round
    observes again."""

    def __init__(self, limit: int = MAX_GPR_EVENTS) -> None:
        self.limit = limit
        self.cloud: Sequence[CloudNode] | None = None
        """The provider's node list as of the last round that observed it; None before the first."""
        self.error: ProviderError | None = None
        """Why the last round could not observe the provider (None: it did)."""
        self.dropped = 0
        self.fresh = False
        """The last round's observation changed the GPR nodes listed, or brought GPR events."""
        self._events: OrderedDict[tuple[str, str, str], ProviderEvent] = OrderedDict()
        self._lock = threading.Lock()
        self._taken: tuple[object, tuple[CloudNode, ...]] = (None, ())
        """(the list last taken, its GPR nodes)."""
        self._gprs: tuple[object, tuple[CloudNode, ...]] = (None, ())
        """(a list, its GPR nodes): the last one looked at."""

    def observed(self, cloud: Sequence[CloudNode], events: Sequence[ProviderEvent]) -> None:
        """A round listed ``cloud`` and polled ``events``: keep the list, queue the events of GPR launches."""
        with self._lock:
            before = self.cloud
            if before is None:
                self.fresh = bool(self._gpr_nodes(cloud))
            else:
                self.fresh = cloud is not before and self._gpr_nodes(cloud) != self._gpr_nodes(before)
            self.cloud, self.error = cloud, None
            for ev in events:
                if not is_gpr_request_id(ev.request_id):
                    continue
                self.fresh = True
                key = (ev.request_id, ev.node_id, str(ev.kind))
                self._events.pop(key, None)
                self._events[key] = ev
                if len(self._events) > self.limit:
                    _, old = self._events.popitem(last=False)
                    self.dropped += 1
                    log.warning("GPR event queue full (%d): dropped %s of %s", self.limit, old.kind, old.request_id)

    def failed(self, error: ProviderError) -> None:
        """A round could not observe the provider."""
        with self._lock:
            self.error = error

    def take(self) -> tuple[Sequence[CloudNode], list[ProviderEvent]] | None:
        """(the last node list, the queued events, which leave the queue), or None before the first observation;
        raises the error of a round that could not observe (the events stay queued)."""
        with self._lock:
            if self.error is not None:
                raise self.error
            if self.cloud is None:
                return None
            events = list(self._events.values())
            self._events.clear()
            self._taken = (self.cloud, self._gpr_nodes(self.cloud))
            return self.cloud, events

    def news(self) -> bool:
        """True if the manager has not taken all there is: events are queued, or the last list's GPR nodes differ from
        those of the list it took last."""
        with self._lock:
            if self._events:
                return True
            if self.cloud is None or self.cloud is self._taken[0]:
                return False
            return self._gpr_nodes(self.cloud) != self._taken[1]

    def _gpr_nodes(self, cloud: Sequence[CloudNode]) -> tuple[CloudNode, ...]:
        if self._gprs[0] is not cloud:
            self._gprs = (cloud, tuple(n for n in cloud if is_gpr_request_id(n.request_id)))
        return self._gprs[1]

    def __len__(self) -> int:
        return len(self._events)


class GprNodes:
    """Which nodes GPRs hold, and which launched GPR nodes were released (see the module docstring)."""

    def __init__(self) -> None:
        self.enabled = False
        """True once a GPR manager uses this engine: from then on GPR nodes are this engine's (adopted, protected)."""
        self.released: dict[str, str] = {}
        """Node id -> GPR id of launched nodes the GPR manager released, until their release is carried out."""
        self.seen: dict[str, str | None] = {}
        """Node name -> its GPR label (None: none), as of the last observation, with :attr:`written` on top."""
        self.written: dict[str, tuple[str | None, float]] = {}
        """Node name -> (GPR label, when) the engine wrote and the Node did not show yet."""
        self.workloads: dict[str, Mapping[str, str]] = {}
        """The active GPRs' workload selectors, as the GPR manager last said: their nodes are room only for their
        pods (in the planner's snapshot and consolidation's simulation)."""
        self.feed = GprFeed()
        """The provider as last observed, for the GPR manager (kept only while :attr:`enabled`)."""
        self._version = 0
        self._keys: tuple[int, int, frozenset[str]] = (-1, -1, frozenset())

    def provider_observed(self, cloud: Sequence[CloudNode], events: Sequence[ProviderEvent]) -> None:
        """The round's provider observation: kept for the GPR manager while one uses this engine."""
        if self.enabled:
            self.feed.observed(cloud, events)

    def observe(self, nodes: Mapping[str, Node], now: float) -> None:
        """The GPR labels of the observed Nodes (and the labels written but not seen yet)."""
        if not self.enabled:
            return
        seen: dict[str, str | None] = {name: n.labels.get(GPR_LABEL) for name, n in nodes.items()}
        for name, (label, at) in list(self.written.items()):
            if name not in seen or seen[name] == label or now - at > WRITE_GRACE_S:
                del self.written[name]
            else:
                seen[name] = label
        if seen != self.seen:
            self.seen = seen
            self._version += 1

    def wrote(self, name: str, label: str | None, now: float) -> None:
        """The engine just set (or, with None, removed) the GPR label of Node ``name``."""
        self.written[name] = (label, now)
        if name in self.seen and self.seen[name] != label:
            self.seen = {**self.seen, name: label}
            self._version += 1

    def label_of(self, name: str, node: Node | None = None) -> str | None:
        """The GPR label of Node ``name``: as just written by the engine, else as ``node`` (or last seen) shows."""
        if name in self.written:
            return self.written[name][0]
        return node.labels.get(GPR_LABEL) if node is not None else self.seen.get(name)

    def held(self, key: str, claim: NodeClaim) -> bool:
        """True if a GPR holds the claim's node: its Node carries a GPR label, or it was launched for a GPR and its
        Node is not seen yet."""
        name = claim.node_name
        if name and name in self.seen:
            return self.seen[name] is not None
        return is_gpr_request_id(request_of(key))

    def keys(self, claims: ClaimTable) -> frozenset[str]:
        """Keys of the claims whose node a GPR holds (recomputed only when the table or the labels changed)."""
        if not self.enabled:
            return frozenset()
        version, seen, keys = self._keys
        if version != claims.version or seen != self._version:
            keys = frozenset(k for k, c in claims.items() if self.held(k, c))
            self._keys = (claims.version, self._version, keys)
        return keys

    def foreign(self, request_id: str) -> bool:
        """True if a provider node of ``request_id`` belongs to a GPR engine other than this one."""
        return not self.enabled and is_gpr_request_id(request_id)


class EngineInventory:
    """The engine's nodes as the GPR manager's :class:`~gpuscale.gpr.manager.Inventory`."""

    def __init__(self, engine: GprSteps) -> None:
        self._engine = engine

    def nodes(self) -> Sequence[GprNode]:
        """Free nodes of the engine and nodes a GPR holds by label (see :meth:`GprSteps._inventory_nodes`)."""
        return self._engine._inventory_nodes()

    def assign(self, node_name: str, labels: Mapping[str, str], taints: Sequence[Taint]) -> None:
        """A GPR borrows the node: label and taint it; from then on the engine holds it for that GPR."""
        self._engine._label_for_gpr(node_name, labels, taints)

    def unassign(self, node_name: str) -> None:
        """The GPR gives the node back: its GPR labels and taint are removed; it is an ordinary node again."""
        self._engine._give_back(node_name, "GprUnassigned")


class GprSteps(ShellBase):
    """The controller's GPR entry points and its release step (mixed into the controller)."""

    _rules: Rules

    def _now_for_gpr(self) -> float:
        return self.clock.now()

    # ------------------------------------------------------------------------------------- GPR manager side
    def serve_gprs(self) -> None:
        """A GPR manager hands its demand to this engine: GPR nodes are adopted from now on (after a restart too)."""
        self.gpr.enabled = True

    def gpr_observation(self) -> tuple[Sequence[CloudNode], list[ProviderEvent]] | None:
        """The provider as this engine last observed it, for the GPR manager: (its node list, the events of GPR
        launches not taken yet, each returned once), or None before this engine's first observation. Raises the
        provider error of a round that could not observe."""
        self.gpr.enabled = True
        return self.gpr.feed.take()

    def _gpr_wake_times(self) -> list[float]:
        """Just after this round when its observation brought news for the GPR manager (GPR nodes listed differently
        from the round before, or GPR events): a driver that runs the manager's pass before the round gives it a pass
        that sees them, instead of leaving them until its next periodic pass (once per change)."""
        feed = self.gpr.feed
        if self.gpr.enabled and feed.fresh and feed.news():
            return [self.observed.now + 1e-6]
        return []

    def hold_gpr_workloads(self, workloads: Mapping[str, Mapping[str, str]]) -> None:
        """The active GPRs' workload selectors (gprId -> selector), from the GPR manager's last pass."""
        if workloads != self.gpr.workloads:
            self.gpr.workloads = {g: dict(sel) for g, sel in workloads.items()}

    def gpr_inventory(self) -> EngineInventory:
        """This engine's nodes as inventory the GPR core can borrow (see the module docstring)."""
        self.gpr.enabled = True
        return EngineInventory(self)

    def launch_gpr_nodes(self, request: LaunchRequest) -> list[CloudNode]:
        """Launch a GPR's nodes once (the provider's idempotency returns the same nodes for the same request id) and
        record each as a claim. Provider errors propagate, as data for the GPR manager's admission."""
        self.gpr.enabled = True
        request = self._in_pool(request)
        nodes = self.launcher.call(request)
        now = self._now_for_gpr()
        rid = request.request_id
        live = sorted(
            (n for n in nodes if n.state not in (CloudNodeState.DELETING, CloudNodeState.GONE)),
            key=lambda n: n.node_id,
        )
        known = {c.node_id for k, c in self.claims.items() if request_of(k) == rid and c.node_id}
        for cn in live:
            if cn.node_id in known:
                continue
            first = self.claims.get(rid)
            key = rid if first is None else f"{rid}#{cn.node_id}"
            claim = adopt_claim(key, cn, {}, self._fleet, self._rules, now)
            self.claims[key] = replace(claim, reason=f"GPR {gpr_id_of_request(rid)}")
            self._record(
                now,
                EventKind.SCALE_UP,
                f"node/{cn.node_name or cn.node_id}",
                "GprScaleUp",
                f"launched {cn.instance_type} in {cn.zone} for GPR {gpr_id_of_request(rid)}",
                request_id=key,
                instanceType=cn.instance_type,
                zone=cn.zone,
            )
        return list(nodes)

    def _in_pool(self, request: LaunchRequest) -> LaunchRequest:
        """The GPR launch in the first of this controller's pools that offers its type on demand in its zone (so
        the pool's limits count it and its template labels it), else as asked."""
        for p in self.pools.values():
            if (
                (not p.instance_types or request.instance_type in p.instance_types)
                and (not p.zones or request.zone in p.zones)
                and (not p.capacity_types or CapacityType.ON_DEMAND in p.capacity_types)
            ):
                return replace(request, pool=p.name, labels={**request.labels, L.POOL: p.name})
        return request

    def release_gpr_node(self, node_id: str) -> None:
        """The GPR no longer holds launched node ``node_id``: give it back or delete it (its release policy) in the
        next round."""
        self.gpr.enabled = True
        self.gpr.released[node_id] = ""

    # ------------------------------------------------------------------------------------- inventory
    def _inventory_nodes(self) -> list[GprNode]:
        """Nodes a GPR may borrow or holds by label, observed now: every Node with a GPR label (but a launched node
        its own GPR holds, which the manager sees from the provider), every free node of this engine (``ready``), and
        every node launched for a GPR and given back to its pool (``ready`` only when free): the manager sees by the
        label that it is no longer its GPR's."""
        self.gpr.enabled = True
        nodes = list(self.backend.list_nodes())
        by_node: dict[str, list[Pod]] = {}
        for p in self.backend.list_pods():
            if p.node_name and p.phase in _LIVE_PODS and not p.is_daemonset:
                by_node.setdefault(p.node_name, []).append(p)
        planned = set(self.scaleup.planned_on_node.values())
        util: Mapping[str, float] | None = None
        out: list[GprNode] = []
        for node in sorted(nodes, key=lambda n: n.name):
            found = self.claims.by_node_name(node.name)
            key, c = found if found is not None else ("", None)
            label = self.gpr.label_of(node.name, node)
            pods = by_node.get(node.name, [])
            if label is not None:
                if launched_for(key, node) == label:
                    continue
                if util is None:
                    util = self.backend.gpu_utilization()
            elif c is None:
                continue
            free = label is None and c is not None and self._free_for_gpr(c, node, pods, planned)
            if label is None and not free and launched_for(key) is None:
                continue
            up = node.allocatable.gpus > 0 and not node.unschedulable and (c is None or c.phase in _HOLDING)
            it = self._types.get(c.instance_type if c is not None else node.labels.get(L.INSTANCE_TYPE, ""))
            out.append(
                GprNode(
                    name=node.name,
                    instance_type=it.name if it is not None else "",
                    gpu_model=it.gpu_model if it is not None else None,
                    gpu_count=it.gpu_count if it is not None else node.allocatable.gpus,
                    gpu_memory_mib=it.gpu_memory_mib if it is not None else 0,
                    gpus_used=sum(p.request.gpus for p in pods),
                    ready=free or (label is not None and up),
                    gpr_id=label,
                    node_id=c.node_id if c is not None else "",
                    hourly_cost=node.hourly_cost or 0.0,
                    gpu_utilization=util.get(node.name) if util is not None else None,
                )
            )
        return out

    def _free_for_gpr(self, c: NodeClaim, node: Node, pods: Sequence[Pod], planned: set[str]) -> bool:
        """True if a GPR may borrow the claim's node: Ready and initialised with GPUs, no pods but DaemonSet pods,
        schedulable, not being replaced nor a replacement, not planned for a pending pod, not being released."""
        return (
            c.phase is ClaimPhase.INITIALIZED
            and node.allocatable.gpus > 0
            and not node.unschedulable
            and not pods
            and node.name not in planned
            and node.name not in self.replacements.by_old
            and not (c.replaces and c.replaces in self.replacements.by_old)
            and c.node_id not in self.gpr.released
        )

    def _label_for_gpr(self, node_name: str, labels: Mapping[str, str], taints: Sequence[Taint]) -> None:
        """Label and taint a node a GPR borrows (idempotent)."""
        now = self._now_for_gpr()
        gid = labels.get(GPR_LABEL)
        self.backend.update_node(node_name, dict(labels), tuple(taints))
        self.gpr.wrote(node_name, gid, now)
        self._record(now, EventKind.GPR_BORROW, f"node/{node_name}", "GprBorrowed", f"held by GPR {gid}")

    def _give_back(self, node_name: str, reason: str) -> None:
        """Remove a GPR's labels and taint from a node: an ordinary node of its pool again (idempotent)."""
        now = self._now_for_gpr()
        gid = self.gpr.label_of(node_name)
        self.backend.update_node(node_name, {GPR_LABEL: None, RELEASE_POLICY_LABEL: None}, untaint=(GPR_TAINT,))
        self.gpr.wrote(node_name, None, now)
        self._record(now, EventKind.GPR_RETURN, f"node/{node_name}", reason, f"given back by GPR {gid}")

    # ------------------------------------------------------------------------------------- the round's step
    def _release_gpr_nodes(self, w: World) -> None:
        """Carry out the release of every released launched GPR node whose claim holds it (its release policy:
        drain and delete, or give back once its Node is registered); forget releases of nodes no longer listed."""
        if not self.gpr.released:
            return
        listed = {cn.node_id: cn for cn in w.cloud}
        by_id = {c.node_id: k for k, c in self.claims.items() if c.node_id in self.gpr.released}
        out = Decisions()
        for node_id in list(self.gpr.released):
            key = by_id.get(node_id)
            claim = self.claims.get(key) if key is not None else None
            if claim is None or claim.phase not in _HOLDING:
                if (claim is not None and claim.phase in LEAVING) or node_id not in listed:
                    del self.gpr.released[node_id]
                continue
            assert key is not None
            node = w.nodes.get(claim.node_name) if claim.node_name else None
            if node is not None and self.gpr.label_of(node.name, node) != launched_for(key):
                del self.gpr.released[node_id]  # given back already (perhaps borrowed since): not this GPR's now
                continue
            labels = {**listed[node_id].labels, **(node.labels if node is not None else {})}
            if labels.get(RELEASE_POLICY_LABEL) == "Delete":
                start_drain(key, claim, "GprReleased", w.nodes, w.now, out, involuntary=False)
                del self.gpr.released[node_id]
            elif node is not None:  # Consolidate: back to its pool once its Node is there to unlabel
                self._give_back(node.name, "GprReleased")
                del self.gpr.released[node_id]
        if out.actions:
            self._apply(out, w)
