"""A simulated Kubernetes cluster implementing :class:`gpuscale.controller.backend.ClusterBackend`.

Nodes appear when the simulated cloud says their kubelet registered, labelled like real gpuscale nodes (the pool's
labels, the launch request's labels, then the well-known and GPU Feature Discovery labels of
:func:`gpuscale.core.templates.template_labels`, the hostname and the launch request id) and tainted with the pool's
and the request's taints. A GPU node advertises ``nvidia.com/gpu`` as allocatable only after its device-plugin
delay.

A scheduler binds pending pods as kube-scheduler would: the core's label/taint predicates
(:func:`gpuscale.core.predicates.static_fit`), resources with per-GPU milli accounting
(:class:`gpuscale.core.state.ClusterState`, so a fraction never straddles two GPUs), GPU-model constraints, gangs
all-or-nothing, higher priority first, then first come first served; among feasible nodes the configured core scorer
(best fit by default) chooses. Bound pods run for their duration, then complete. A pod that loses its node (node
deleted, spot reclaim, eviction) goes back to pending and, when bound again, runs its full duration again.

``evict`` refuses (returns False) when a PodDisruptionBudget would be violated; do-not-disrupt is the controller's
job, but the cluster counts every disruption of an annotated pod as a violation, for tests and reports.

Redundant launches (the simulator's duplicate-launch metric): :meth:`SimCluster.launch_is_redundant` answers the
cloud, before it creates a node for pods, whether that node is needed. It is not when one of its pods is pending and
every pending pod (DaemonSet pods excluded) fits, by first-fit-decreasing (largest GPU demand, then CPU, first), into
the free room of the registered schedulable nodes (GPUs counted at their template capacity while the device plugin
is not ready; cordoned nodes and nodes whose GPUs failed to initialise do not count) and of the nodes in flight (at
their template allocatable, labels and taints), with the same predicates and per-GPU accounting as the scheduler.

Its records (knobs, counters, nodes, pods, what-if templates and cursors) are in :mod:`gpuscale.sim.cluster_records`,
its scheduling pass and failure memo in :mod:`gpuscale.sim.schedule` (a :class:`~gpuscale.sim.schedule.Scheduler` it
holds and tells what changed).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from gpuscale.controller.backend import Event, PodDisruptionBudget
from gpuscale.core import labels as L
from gpuscale.core.disruption import do_not_disrupt
from gpuscale.core.gpr.spec import GPR_LABEL
from gpuscale.core.model import Catalog, InstanceType, Node, NodePool, Offering, Pod, Taint
from gpuscale.core.nodeclaim import REQUEST_ID_LABEL
from gpuscale.core.predicates import static_fit
from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources
from gpuscale.core.scoring import make_scorer
from gpuscale.core.state import ABSENT_GPU, BoolArray, ClusterState, NodeShape, Placement
from gpuscale.core.templates import template_allocatable, template_labels
from gpuscale.providers.base import CloudNode, LaunchRequest
from gpuscale.sim.cloud import InFlightNode
from gpuscale.sim.cluster_records import ClusterBehaviour as ClusterBehaviour
from gpuscale.sim.cluster_records import ClusterCounters as ClusterCounters
from gpuscale.sim.cluster_records import (
    NodeTemplate,
    SimNode,
    SimPod,
    demand,
    ffd_key,
    placed,
)
from gpuscale.sim.engine import Engine, Timer, stream
from gpuscale.sim.firstfit import first_fit
from gpuscale.sim.schedule import Scheduler


class SimCluster:
    """The simulated cluster. Implements ``ClusterBackend`` plus the hooks the simulated cloud and workloads use."""

    def __init__(
        self,
        engine: Engine,
        catalog: Catalog,
        pools: Sequence[NodePool] = (),
        behaviour: ClusterBehaviour | None = None,
        *,
        seed: int = 0,
        pdbs: Sequence[PodDisruptionBudget] = (),
    ) -> None:
        self.engine = engine
        self.behaviour = behaviour or ClusterBehaviour()
        self.pools = {p.name: p for p in pools}
        self.pdbs: list[PodDisruptionBudget] = list(pdbs)
        self.counters = ClusterCounters()
        self.events: list[Event] = []
        self.spot_notices: Mapping[str, float] = {}
        """node name -> deadline of spot notices (the runner points this at the cloud's)."""
        self.version = 0
        """Bumped on every state change (the runner reconciles only after changes)."""
        self.pending_samples: list[float] = []
        """Seconds each pending episode lasted, for every bind so far."""
        self.used_nodes: set[str] = set()
        """Names of every node that ever ran a pod."""
        self._rng = stream(seed, "cluster.utilization")
        self._scorer = make_scorer(self.behaviour.scorer)
        self._models = sorted({it.gpu_model for it in catalog.instance_types if it.gpu_model})
        self._gmax = max([it.gpu_count for it in catalog.instance_types] + [1])
        self._nodes: dict[str, SimNode] = {}
        self._slots: list[SimNode | None] = []
        self._free_slots: list[int] = []
        self._state = self._make_state(max(16, len(self._models) + 1))
        self._pods: dict[str, SimPod] = {}
        self._pod_objs: dict[str, Pod] = {}
        """Each pod's current ``Pod`` in the order of ``_pods`` (kept at every change: ``list_pods`` is a copy)."""
        self._pending: dict[str, SimPod] = {}
        self._pending_gpu_milli = 0
        """Total GPU demand of the pending pods (DaemonSet pods excluded)."""
        self._gpu_waiting: dict[str, SimNode] = {}
        """Registered GPU nodes whose device plugin is not ready yet (but will be)."""
        self._gpu_failed: dict[str, SimNode] = {}
        """Registered GPU nodes whose GPUs never become allocatable."""
        self._templates: dict[str, NodeTemplate] = {}
        """Node name -> template of nodes in flight (pruned when it outgrows what is in flight)."""
        self._masks: dict[tuple[object, ...], np.ndarray] = {}
        self._gpr_workloads: dict[str, Mapping[str, str]] = {}
        """Active GPRs' workload selectors: their nodes take only matching pods (:func:`set_gpr_workload`)."""
        self._sig_pod: dict[tuple[object, ...], Pod] = {}
        self.scheduler = Scheduler(self._pending, self._state, self._scorer, self._masks, self._mask, self._bind)
        self._sched_timer: Timer | None = None
        self._seq = 0
        self._gpu_s_closed = 0.0
        self._cancel_samples: list[float] = []
        self._pods_listed: tuple[int, tuple[Pod, ...]] = (-1, ())
        self._nodes_listed: tuple[int, tuple[Node, ...]] = (-1, ())
        self._nodes_version = 0
        """Changes of the node list alone (``version`` counts pod changes too): ``list_nodes`` is rebuilt only then."""
        self._node_objs: dict[str, Node | None] = {}
        """Each registered node's ``Node`` in the order of ``_nodes`` (None until made: the names in ``_stale_nodes``
        are made again at the next ``list_nodes``, which is then a copy of the values)."""
        self._stale_nodes: set[str] = set()
        """Nodes changed since the last ``list_nodes`` (their ``SimNode.cache`` was dropped)."""

    # ------------------------------------------------------------------------------------------- slot storage
    def _make_state(self, n: int) -> ClusterState:
        shapes = [
            NodeShape(f"_slot{i}", Resources(0, 0, 0, 0), self._models[i] if i < len(self._models) else None)
            for i in range(n)
        ]
        st = ClusterState(shapes, max_gpus=self._gmax)
        st.gpu_cap[:] = 0
        st.gpu_free[:] = ABSENT_GPU
        st.full_free[:] = 0
        st.max_free[:] = ABSENT_GPU
        self._slots.extend([None] * (n - len(self._slots)))
        self._scorer.prepare(st, None)
        return st

    def _grow(self) -> None:
        old = self._state
        n_old = len(old)
        new = self._make_state(n_old * 2)
        for name in (
            "model_idx",
            "cpu_cap",
            "mem_cap",
            "gpu_cap",
            "pods_cap",
            "cpu_free",
            "mem_free",
            "pods_free",
            "full_free",
            "max_free",
        ):
            getattr(new, name)[:n_old] = getattr(old, name)
        new.gpu_free[:n_old] = old.gpu_free
        new.names[:n_old] = old.names
        assert new.models == old.models
        self._state = new
        self.scheduler.use_state(new)
        for sig, mask in self._masks.items():
            grown = np.zeros(len(new), dtype=bool)
            grown[:n_old] = mask
            self._masks[sig] = grown

    def _alloc_slot(self) -> int:
        if not self._free_slots:
            n = len(self._state)
            used = sum(1 for s in self._slots if s is not None)
            if used >= n:
                self._grow()
            self._free_slots = [i for i in range(len(self._state)) if self._slots[i] is None]
            heapq.heapify(self._free_slots)
        return heapq.heappop(self._free_slots)

    def _set_slot(self, sn: SimNode) -> None:
        st, i, a = self._state, sn.slot, sn.allocatable
        st.names[i] = sn.name
        model = sn.itype.gpu_model if sn.itype is not None else None
        st.model_idx[i] = st.models.index(model) if model in st.models else st.models.index(None)
        st.cpu_cap[i] = st.cpu_free[i] = a.cpu_milli
        st.mem_cap[i] = st.mem_free[i] = a.memory_mib
        st.pods_cap[i] = st.pods_free[i] = a.pods
        st.gpu_cap[i] = 0
        st.gpu_free[i, :] = ABSENT_GPU
        st.full_free[i] = 0
        st.max_free[i] = ABSENT_GPU

    def _clear_slot(self, i: int) -> None:
        st = self._state
        st.names[i] = f"_slot{i}"
        for arr in (st.cpu_cap, st.cpu_free, st.mem_cap, st.mem_free, st.pods_cap, st.pods_free, st.gpu_cap):
            arr[i] = 0
        st.gpu_free[i, :] = ABSENT_GPU
        st.full_free[i] = 0
        st.max_free[i] = ABSENT_GPU
        for mask in self._masks.values():
            mask[i] = False
        self._slots[i] = None
        heapq.heappush(self._free_slots, i)

    def _static_ok(self, sig: tuple[object, ...], sn: SimNode) -> bool:
        return static_fit(self._sig_pod[sig], sn.labels, sn.taints, sn.unschedulable, self._gpr_workloads) is None

    def set_gpr_workload(self, gpr_id: str, selector: Mapping[str, str] | None) -> None:
        """From now on the nodes of GPR ``gpr_id`` take only pods matching ``selector`` (None: the GPR ended, its
        nodes are ordinary again)."""
        if selector is None:
            if self._gpr_workloads.pop(gpr_id, None) is None:
                return
        elif self._gpr_workloads.get(gpr_id) == selector:
            return
        else:
            self._gpr_workloads[gpr_id] = dict(selector)
        for sn in list(self._nodes.values()):
            if sn.labels.get(GPR_LABEL) == gpr_id:
                self._node_changed(sn, more_room=selector is None)

    def _mask(self, sig: tuple[object, ...], pod: Pod) -> np.ndarray:
        mask = self._masks.get(sig)
        if mask is None:
            self._sig_pod[sig] = pod
            mask = np.zeros(len(self._state), dtype=bool)
            for sn in self._nodes.values():
                mask[sn.slot] = self._static_ok(sig, sn)
            self._masks[sig] = mask
        return mask

    def _node_changed(self, sn: SimNode, *, more_room: bool) -> None:
        sn.cache = None
        self._stale_nodes.add(sn.name)
        self.scheduler.row_grew(sn.slot)
        for sig, mask in self._masks.items():
            mask[sn.slot] = self._static_ok(sig, sn)
        self.version += 1
        self._nodes_version += 1
        if more_room:
            self._capacity_grew()

    def _capacity_grew(self) -> None:
        self.scheduler.capacity_grew()
        self._wake_scheduler()

    def _wake_scheduler(self) -> None:
        if self._pending and self._sched_timer is None:
            self._sched_timer = self.engine.after(0.0, self._run_scheduler)

    # ----------------------------------------------------------------------------------- cloud listener hooks
    def node_registered(
        self,
        node: CloudNode,
        itype: InstanceType,
        taints: tuple[Taint, ...],
        hourly_price: float,
        gpu_delay: float | None,
    ) -> None:
        """A cloud node's kubelet joined: add the Node (GPUs allocatable after ``gpu_delay``; None means never)."""
        if node.node_name in self._nodes:
            return
        # the template made for it in flight, if any (from the same request, type, taints and price: the same)
        tpl = self._templates.pop(node.node_name, None) or self._template(node, itype, taints, hourly_price)
        sn = SimNode(node.node_name, self._alloc_slot())
        sn.labels = dict(tpl.labels)
        sn.taints = tpl.taints
        sn.pool = node.pool
        sn.price = hourly_price
        sn.itype = itype
        sn.allocatable = tpl.allocatable
        sn.gpu_count = sn.allocatable.gpus
        sn.created_at = self.engine.now()
        self._slots[sn.slot] = sn
        self._nodes[sn.name] = sn
        self._node_objs[sn.name] = None  # made at the next list_nodes (_node_changed below marks it stale)
        self._set_slot(sn)
        self.counters.nodes_registered += 1
        self._record("NodeRegistered", f"node/{sn.name}", "Registered", f"{itype.name} in {node.zone} joined")
        if sn.gpu_count and gpu_delay is not None:
            sn.gpu_timer = self.engine.after(gpu_delay, self._gpus_ready, sn)
            self._gpu_waiting[sn.name] = sn
        elif not sn.gpu_count:
            sn.gpu_ready = True
        else:
            self._gpu_failed[sn.name] = sn
        self._node_changed(sn, more_room=True)

    def _template(
        self, node: CloudNode, itype: InstanceType, taints: tuple[Taint, ...], hourly_price: float
    ) -> NodeTemplate:
        """Labels, taints and allocatable of a node of ``itype`` launched as ``node`` (see the module docstring)."""
        pool = self.pools.get(node.pool) or NodePool(name=node.pool)
        offering = Offering(node.zone, node.capacity_type, hourly_price)
        labels = {**pool.labels, **node.labels, **template_labels(pool, itype, offering)}
        labels[L.HOSTNAME] = node.node_name
        labels[REQUEST_ID_LABEL] = node.request_id
        return NodeTemplate(
            labels, tuple(dict.fromkeys((*pool.taints, *taints))), template_allocatable(pool, itype), itype.gpu_model
        )

    def _gpus_ready(self, sn: SimNode) -> None:
        if self._nodes.get(sn.name) is not sn:
            return
        sn.gpu_timer = None
        sn.gpu_ready = True
        self._gpu_waiting.pop(sn.name, None)
        st, i = self._state, sn.slot
        st.gpu_cap[i] = sn.gpu_count
        st.gpu_free[i, : sn.gpu_count] = MILLI_PER_GPU
        st.full_free[i] = sn.gpu_count
        st.max_free[i] = MILLI_PER_GPU
        self.counters.nodes_gpu_ready += 1
        self._record("GpusReady", f"node/{sn.name}", "DevicePluginReady", f"{sn.gpu_count} GPU(s) allocatable")
        self._node_changed(sn, more_room=True)

    def node_terminated(self, node: CloudNode, reason: str) -> None:
        """The cloud instance is going away: the Node disappears and its pods go back to pending."""
        sn = self._nodes.get(node.node_name)
        if sn is not None:
            self._remove_node(sn, reason, by_controller=False)

    # ------------------------------------------------------------------------------------------- workloads
    def add_pod(
        self, pod: Pod, duration: float, *, deadline: float | None = None, gpu_util: float | None = None
    ) -> None:
        """A new pod arrives pending; it runs ``duration`` seconds once bound, and is dropped if still pending at
        ``deadline`` (absolute time)."""
        if pod.key in self._pods:
            raise ValueError(f"pod {pod.key} already exists")
        now = self.engine.now()
        self._seq += 1
        sp = SimPod(
            pod if pod.node_name is None and pod.phase == "Pending" else replace(pod, node_name=None, phase="Pending"),
            max(0.0, duration),
            self._seq,
            now,
            self.behaviour.busy if gpu_util is None else gpu_util,
        )
        sp.fkey = self.scheduler.fkey(sp.pod.request, sp.sig)
        self._pods[pod.key] = sp
        self._pod_objs[pod.key] = sp.pod
        self._pending[pod.key] = sp
        self._pending_gpu_milli += _gpu_milli(sp.pod)
        self.scheduler.pod_pending(pod.key)
        self.counters.pods_arrived += 1
        if deadline is not None:
            sp.deadline = self.engine.at(deadline, self._cancel, sp)
        self.version += 1
        self._wake_scheduler()

    def _cancel(self, sp: SimPod) -> None:
        key = sp.pod.key
        if self._pods.get(key) is not sp or key not in self._pending:
            return
        del self._pending[key]
        self._pending_gpu_milli -= _gpu_milli(sp.pod)
        self.scheduler.pod_gone(key)
        del self._pods[key], self._pod_objs[key]
        self._cancel_samples.append(self.engine.now() - sp.pending_since)
        self.counters.pods_cancelled += 1
        self.version += 1

    # ------------------------------------------------------------------------------------------- scheduler
    def schedule(self) -> int:
        """Bind every pending pod that fits now (:meth:`Scheduler.schedule`); returns the number bound."""
        return self.scheduler.schedule()

    def _run_scheduler(self) -> None:
        self._sched_timer = None
        self.scheduler.schedule()

    def _bind(self, sp: SimPod, slot: int, placement: Placement | None = None) -> None:
        sn = self._slots[slot]
        assert sn is not None
        now = self.engine.now()
        req = sp.pod.request
        sp.placement = placement if placement is not None else self._state.place(req, slot)
        sp.node = sn
        sp.bound_at = now
        sp.pod = self._pod_objs[sp.pod.key] = placed(sp.pod, sn.name, "Running")
        del self._pending[sp.pod.key]
        self._pending_gpu_milli -= _gpu_milli(sp.pod)
        if sp.deadline is not None:
            sp.deadline.cancel()
            sp.deadline = None
        sn.pods.add(sp.pod.key)
        sn.gpu_busy += demand(req) * sp.gpu_util
        self.used_nodes.add(sn.name)
        self.pending_samples.append(now - sp.pending_since)
        self.counters.binds += 1
        sp.done = self.engine.after(sp.duration, self._complete, sp)
        self.version += 1
        if self.behaviour.record_pod_events:
            self._record("Scheduled", f"pod/{sp.pod.key}", "Bound", f"bound to {sn.name}")

    def _unbind(self, sp: SimPod) -> SimNode:
        sn = sp.node
        assert sn is not None and sp.placement is not None and sp.bound_at is not None
        now = self.engine.now()
        req = sp.pod.request
        self._state.release(req, sp.placement)
        self.scheduler.row_grew(sn.slot)
        sn.pods.discard(sp.pod.key)
        sn.gpu_busy -= demand(req) * sp.gpu_util
        if not sn.pods:
            sn.gpu_busy = 0.0
        self._gpu_s_closed += (now - sp.bound_at) * demand(req)
        if sp.done is not None:
            sp.done.cancel()
        sp.node, sp.placement, sp.bound_at, sp.done = None, None, None, None
        self.version += 1
        return sn

    def _complete(self, sp: SimPod) -> None:
        if self._pods.get(sp.pod.key) is not sp or sp.node is None:
            return
        sp.done = None
        self._unbind(sp)
        del self._pods[sp.pod.key], self._pod_objs[sp.pod.key]
        self.counters.pods_completed += 1
        self._capacity_grew()

    def _repend(self, sp: SimPod, reason: str, *, by_controller: bool) -> None:
        node = self._unbind(sp)
        sp.pod = self._pod_objs[sp.pod.key] = placed(sp.pod, None, "Pending")
        sp.pending_since = self.engine.now()
        self._pending[sp.pod.key] = sp
        self._pending_gpu_milli += _gpu_milli(sp.pod)
        self.scheduler.pod_pending(sp.pod.key)
        self.counters.disruptions += 1
        if by_controller and do_not_disrupt(sp.pod):
            self.counters.do_not_disrupt_violations += 1
        self._record("PodDisrupted", f"pod/{sp.pod.key}", reason, f"lost its place on {node.name}")

    # ------------------------------------------------------------------------------------ ClusterBackend API
    def list_pods(self) -> Sequence[Pod]:
        """Every pending or running pod (completed and cancelled pods are gone)."""
        if self._pods_listed[0] != self.version:
            self._pods_listed = (self.version, tuple(self._pod_objs.values()))
        return self._pods_listed[1]

    def list_nodes(self) -> Sequence[Node]:
        """Every registered node; GPUs count as allocatable only once the device plugin is ready."""
        if self._nodes_listed[0] != self._nodes_version:
            objs, nodes = self._node_objs, self._nodes
            for name in self._stale_nodes:
                if name in objs:
                    objs[name] = self._as_node(nodes[name])
            self._stale_nodes.clear()
            self._nodes_listed = (self._nodes_version, tuple(objs.values()))  # type: ignore[arg-type]
        return self._nodes_listed[1]

    def _as_node(self, sn: SimNode) -> Node:
        if sn.cache is None:
            a = sn.allocatable
            alloc = a if sn.gpu_ready else Resources(a.cpu_milli, a.memory_mib, 0, a.pods)
            # positional: name, allocatable, labels, taints, unschedulable, pool, launching, hourly_cost
            sn.cache = Node(sn.name, alloc, dict(sn.labels), sn.taints, sn.unschedulable, sn.pool, False, sn.price)
        return sn.cache

    def list_pdbs(self) -> Sequence[PodDisruptionBudget]:
        """The PodDisruptionBudgets."""
        return list(self.pdbs)

    def gpu_utilization(self) -> Mapping[str, float]:
        """Measured GPU utilisation of every node whose GPUs are allocatable."""
        noise = self.behaviour.utilization_noise
        out: dict[str, float] = {}
        for sn in self._nodes.values():
            if not sn.gpu_ready or not sn.gpu_count:
                continue
            u = sn.gpu_busy / sn.gpu_count
            if noise > 0:
                u += self._rng.gauss(0.0, noise)
            out[sn.name] = min(1.0, max(0.0, u))
        return out

    def cordon(self, node_name: str) -> None:
        """Mark a node unschedulable (a node that is already gone is ignored)."""
        sn = self._nodes.get(node_name)
        if sn is not None and not sn.unschedulable:
            sn.unschedulable = True
            self._node_changed(sn, more_room=False)

    def uncordon(self, node_name: str) -> None:
        """Make a cordoned node schedulable again."""
        sn = self._nodes.get(node_name)
        if sn is not None and sn.unschedulable:
            sn.unschedulable = False
            self._node_changed(sn, more_room=True)

    def update_node(
        self,
        node_name: str,
        labels: Mapping[str, str | None],
        taints: Sequence[Taint] = (),
        untaint: Sequence[str] = (),
    ) -> None:
        """Set or remove labels and add or remove taints of a node (a node that is already gone is ignored)."""
        sn = self._nodes.get(node_name)
        if sn is None:
            return
        new_labels = {k: v for k, v in {**sn.labels, **labels}.items() if v is not None}
        kept = tuple(t for t in sn.taints if t.key not in untaint)
        new_taints = (*kept, *(t for t in taints if t not in kept))
        if new_labels == sn.labels and new_taints == sn.taints:
            return
        sn.labels, sn.taints = new_labels, new_taints
        self._node_changed(sn, more_room=True)  # a label or taint removed may let pods in

    def evict(self, pod_key: str) -> bool:
        """Evict a running pod back to pending; False (and nothing changes) if a PDB would be violated.

        A pod that does not exist or is not bound counts as evicted.
        """
        sp = self._pods.get(pod_key)
        if sp is None or sp.node is None:
            return True
        for pdb in self._pdbs_for(sp.pod):
            unavailable = sum(1 for other in self._pods.values() if other.node is None and _pdb_selects(pdb, other.pod))
            if unavailable + 1 > pdb.max_unavailable:
                self.counters.pdb_refusals += 1
                self._record(
                    "EvictionRefused",
                    f"pod/{pod_key}",
                    "PodDisruptionBudget",
                    f"{pdb.namespace}/{pdb.name} allows {pdb.max_unavailable} unavailable, {unavailable} already are",
                )
                return False
        self.counters.evictions += 1
        self._repend(sp, "Evicted", by_controller=True)
        self._capacity_grew()
        return True

    def _pdbs_for(self, pod: Pod) -> Iterable[PodDisruptionBudget]:
        return (p for p in self.pdbs if _pdb_selects(p, pod))

    def delete_node(self, node_name: str) -> None:
        """Remove the Node object; its pods go back to pending. A node that is already gone is ignored."""
        sn = self._nodes.get(node_name)
        if sn is not None:
            self._remove_node(sn, "NodeDeleted", by_controller=True)

    def record(self, event: Event) -> None:
        """Record a decision."""
        self.events.append(event)

    def _record(self, kind: str, obj: str, reason: str, message: str) -> None:
        self.events.append(Event(self.engine.now(), kind, obj, reason, message))

    def _remove_node(self, sn: SimNode, reason: str, *, by_controller: bool) -> None:
        pods = sorted(sn.pods, key=lambda k: self._pods[k].seq)
        for key in pods:
            self._repend(self._pods[key], reason, by_controller=by_controller)
        if sn.gpu_timer is not None:
            sn.gpu_timer.cancel()
        self._gpu_waiting.pop(sn.name, None)
        self._gpu_failed.pop(sn.name, None)
        del self._nodes[sn.name], self._node_objs[sn.name]
        self._stale_nodes.discard(sn.name)
        self._clear_slot(sn.slot)
        self.counters.nodes_removed += 1
        if pods:
            self.counters.nodes_removed_with_pods += 1
        if sn.name in self.spot_notices:
            self.counters.spot_interruptions += 1
            if not pods:
                self.counters.spot_interruptions_survived += 1
        self._record("NodeRemoved", f"node/{sn.name}", reason, f"{len(pods)} pod(s) back to pending")
        self.version += 1
        self._nodes_version += 1
        if pods:
            self._capacity_grew()

    # ------------------------------------------------------------------------------------ redundant launches
    def launch_is_redundant(self, request: LaunchRequest, in_flight: Collection[InFlightNode]) -> bool:
        """True if a node launched for ``request`` now is not needed (see the module docstring).

        False at once when ``request.pods`` names no pending pod; else :meth:`pending_fit` with ``in_flight`` (which
        must not include the node being launched). Changes nothing.
        """
        pending = self._pending
        if not any(k in pending for k in request.pods):
            return False
        return self.pending_fit(in_flight)

    def pending_fit(self, in_flight: Collection[InFlightNode] = ()) -> bool:
        """True if every pending pod (DaemonSet pods excluded) fits, by first-fit-decreasing, into the free room of
        the registered schedulable nodes (GPUs at template capacity while their device plugin is not ready; nodes whose
        GPUs failed excluded) and of ``in_flight`` nodes at their template allocatable. Changes nothing."""
        todo = [sp for sp in self._pending.values() if not sp.pod.is_daemonset]
        if not todo:
            return True
        st = self._state
        waiting = list(self._gpu_waiting.values())
        # necessary condition first: enough GPU room in total (cheap, and false in every genuine scale-up)
        room = sum(n.itype.gpu_count for n in in_flight) + sum(sn.gpu_count for sn in waiting)
        need = self._pending_gpu_milli
        if need > room * MILLI_PER_GPU and need > room * MILLI_PER_GPU + int(np.maximum(st.gpu_free, 0).sum()):
            return False
        todo.sort(key=ffd_key)
        usable: BoolArray | None = None
        if self._gpu_failed:
            usable = np.ones(len(st), dtype=bool)
            usable[[sn.slot for sn in self._gpu_failed.values()]] = False
        for sn in waiting:  # count the GPUs the device plugin will advertise
            i = sn.slot
            st.gpu_cap[i] = sn.gpu_count
            st.gpu_free[i, : sn.gpu_count] = MILLI_PER_GPU
            st.full_free[i] = sn.gpu_count
            st.max_free[i] = MILLI_PER_GPU
        taken: list[tuple[Request, Placement]] = []
        try:
            return self._first_fit(todo, in_flight, usable, taken)
        finally:
            for req, pl in reversed(taken):
                st.release(req, pl)
            for sn in waiting:
                i = sn.slot
                st.gpu_cap[i] = 0
                st.gpu_free[i, :] = ABSENT_GPU
                st.full_free[i] = 0
                st.max_free[i] = ABSENT_GPU

    def _first_fit(
        self,
        todo: Sequence[SimPod],
        in_flight: Collection[InFlightNode],
        usable: BoolArray | None,
        taken: list[tuple[Request, Placement]],
    ) -> bool:
        """Place ``todo`` in order, each on the first row with room; placements on the live state go to ``taken``."""
        return first_fit(
            self._state,
            todo,
            self._mask,
            (lambda: self._in_flight_templates(in_flight)) if in_flight else None,
            usable,
            taken,
            self._gpr_workloads,
            self._gmax,
        )

    def _in_flight_templates(self, in_flight: Collection[InFlightNode]) -> list[NodeTemplate]:
        cache = self._templates
        if len(cache) > 2 * len(in_flight) + 64:
            names = {f.node.node_name for f in in_flight}
            self._templates = cache = {k: v for k, v in cache.items() if k in names}
        out: list[NodeTemplate] = []
        for f in in_flight:
            tpl = cache.get(f.node.node_name)
            if tpl is None:
                tpl = cache[f.node.node_name] = self._template(f.node, f.itype, f.taints, f.hourly_price)
            out.append(tpl)
        return out

    # ------------------------------------------------------------------------------------------- inspection
    def remove_pod(self, key: str) -> bool:
        """Delete a pod (a workload scaled down): a pending one is dropped, a running one frees its node at once.
        False if there is no such pod."""
        sp = self._pods.get(key)
        if sp is None:
            return False
        if key in self._pending:
            self._cancel(sp)
        else:
            self._complete(sp)
        return True

    def bound_at(self, key: str) -> float | None:
        """When the pod was bound to its node (None: pending or unknown)."""
        sp = self._pods.get(key)
        return None if sp is None else sp.bound_at

    def pending_count(self) -> int:
        """Pods waiting for a node."""
        return len(self._pending)

    def running_count(self) -> int:
        """Pods bound to a node."""
        return len(self._pods) - len(self._pending)

    def node(self, name: str) -> Node | None:
        """One node by name, or None."""
        sn = self._nodes.get(name)
        return self._as_node(sn) if sn is not None else None

    def pods_on(self, name: str) -> list[str]:
        """Keys of the pods bound to a node."""
        sn = self._nodes.get(name)
        return sorted(sn.pods) if sn is not None else []

    def gpu_hours_requested(self, now: float | None = None) -> float:
        """GPU-hours held by running pods so far (whole GPUs count 1, fractions their share)."""
        t = self.engine.now() if now is None else now
        running = sum(
            (t - sp.bound_at) * demand(sp.pod.request) for sp in self._pods.values() if sp.bound_at is not None
        )
        return (self._gpu_s_closed + running) / 3600.0

    def pending_durations(self, now: float | None = None) -> list[float]:
        """Every pending episode's length: finished ones, cancelled ones, and those still waiting (until now)."""
        t = self.engine.now() if now is None else now
        return [*self.pending_samples, *self._cancel_samples, *(t - sp.pending_since for sp in self._pending.values())]


def _gpu_milli(pod: Pod) -> int:
    return 0 if pod.is_daemonset else pod.request.gpu_demand_milli


def _pdb_selects(pdb: PodDisruptionBudget, pod: Pod) -> bool:
    return pdb.namespace == pod.namespace and all(pod.labels.get(k) == v for k, v in pdb.selector.items())
