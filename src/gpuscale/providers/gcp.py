"""Google Cloud GKE provider: GPU nodes in GKE node pools, through the official ``google-cloud-container`` and
``google-cloud-compute`` SDKs.

Pools, slots and labels
-----------------------
One GKE node pool per *offering*: gpuscale pool, instance type, zone, capacity type, labels and taints
(:func:`pool_name` hashes them into ``gpuscale-<10 hex>``). A pool is created on demand with the machine type, its
accelerators (type, count, GPU driver installation), ``spot``, the zone as its only location, the taint
``nvidia.com/gpu=present:NoSchedule`` besides the request's, Kubernetes labels, and resource labels
``gpuscale-cluster``, ``gpuscale-pool`` and ``gpuscale-type`` that every VM of the pool inherits.

A launch of ``count`` nodes reserves ``count`` *slots* of the pool; a slot's node id is
``<pool name>/<request key>/<i>`` and is what :meth:`GcpProvider.launch` returns at once. A slot becomes a node when
the managed instance group (MIG) creates a VM for it: the provider then writes ``gpuscale-req=<request key>`` and
``gpuscale-slot=<i>`` on the VM (``instances.setLabels``), which is how a restarted provider knows which request
each VM serves, and how a relaunch of a served request id returns its nodes instead of creating more. A VM that
comes for a slot deleted before it came is surplus and is deleted. A VM of a gpuscale pool with neither label nor
slot (a launch a crashed process never labelled, or a VM GKE recreated on an upgrade) is never deleted on a guess:
it is listed with its name as node id and no request id, for the controller to adopt (and remove when idle).

Long-running operations, never waited on
----------------------------------------
Every change is a GKE or Compute operation. Nothing blocks: ``launch`` starts a create (or, for an existing pool,
a ``setSize`` to live VMs + open slots) and reads the operation once, so an error GKE reports at once (quota,
stockout) is raised from ``launch``; otherwise ``list_nodes`` and ``poll_errors`` carry the work on each round:
they read the operations started earlier, label new VMs, resize pools whose operation finished, and delete idle
pools. A pool runs one operation at a time, so a resize waits for the next round when one is running. The pool size
is only raised by ``setSize``; a specific node goes through the MIG's ``deleteInstances`` (which also lowers the
group's target size), so scale-down never removes a node GKE picks.

Errors
------
``ZONE_RESOURCE_POOL_EXHAUSTED`` / stockouts (in a synchronous error, a failed create operation or the MIG's
``listErrors``) -> :class:`~gpuscale.errors.InsufficientCapacity`, and the offering is marked unavailable for
``unavailable_ttl_s`` (later launches of it fail at once; :meth:`GcpProvider.unavailable_offerings` lists them);
``QUOTA_EXCEEDED`` and ``RESOURCE_EXHAUSTED`` -> :class:`~gpuscale.errors.QuotaExceeded`; 429 rate limits ->
``RateLimited``; 401/403 -> ``AuthenticationError``; 400 -> ``InvalidProviderRequest``; 5xx and timeouts ->
``TransientProviderError``. An asynchronous failure becomes a ``LAUNCH_FAILED`` event per open slot. The SDKs'
own retries are off (``retry=None`` on every call): the controller, which owns back-off, is the one retry layer.
Credentials come from Application Default Credentials (or are passed in) and never appear in messages or logs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.cloud import compute_v1, container_v1

from gpuscale.clock import Clock
from gpuscale.core import labels as wk
from gpuscale.core.model import CapacityType, TaintEffect
from gpuscale.errors import (
    InputError,
    InsufficientCapacity,
    InvalidProviderRequest,
    ProviderError,
    QuotaExceeded,
    TransientProviderError,
)
from gpuscale.providers._common import SlotProvider, slot_id
from gpuscale.providers._support import pool_name
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, ProviderCapabilities
from gpuscale.providers.gcp_support import (
    API_CALLS,
    GPU_TAINT,
    L_CLUSTER,
    L_POOL,
    L_REQ,
    L_SLOT,
    L_TYPE,
    MAX_POOL_SIZE,
    PROVIDER_NAME,
    MachineSpec,
    call,
    label_key,
    machine_spec,
    op_error,
    scrub,
)

__all__ = [
    "API_CALLS",
    "GPU_TAINT",
    "GcpConfig",
    "GcpProvider",
    "MachineSpec",
    "label_key",
    "machine_spec",
    "pool_name",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GcpConfig:
    """Where the cluster is and how the provider behaves. ``zones`` are the zones gpuscale may create pools in."""

    project: str
    location: str
    cluster: str
    zones: tuple[str, ...]
    api_endpoint: str | None = None
    """Override both APIs' endpoint (tests point it at a fake); None for Google's."""
    timeout_s: float = 30.0
    max_pools: int = 20
    max_nodes: int = 100
    gpu_driver_version: str = "DEFAULT"
    """GKE GPU driver installation: ``DEFAULT``, ``LATEST`` or ``INSTALLATION_DISABLED`` (own driver DaemonSet)."""
    unavailable_ttl_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("project", "location", "cluster"):
            if not getattr(self, name):
                raise InputError(
                    "is empty", where=f"gcp config {name}", fix="set the GKE cluster's project, location and name"
                )
        if not self.zones:
            raise InputError("names no zone", where="gcp config zones", fix="list the zones of the cluster's region")
        for name in ("max_pools", "max_nodes"):
            if getattr(self, name) < 1:
                raise InputError("must be at least 1", where=f"gcp config {name}", value=getattr(self, name))
        if self.gpu_driver_version not in ("DEFAULT", "LATEST", "INSTALLATION_DISABLED"):
            raise InputError(
                "unknown driver version",
                where="gcp config gpu_driver_version",
                value=self.gpu_driver_version,
                fix="use DEFAULT, LATEST or INSTALLATION_DISABLED",
            )

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.cluster}"


@dataclass
class _Slots:
    """A launch's open slots (no VM yet) in one pool."""

    request_id: str
    key: str
    pool: str
    request: LaunchRequest
    open: list[int]
    at: float


@dataclass
class _Vm:
    name: str
    id: str
    zone: str
    status: str
    labels: dict[str, str]
    fingerprint: str
    self_link: str
    created: float


@dataclass
class _PoolView:
    name: str
    status: str
    spot: bool
    labels: dict[str, str]
    groups: list[tuple[str, str]]  # (zone, MIG name)
    node_labels: dict[str, str] = field(default_factory=dict)
    vms: list[_Vm] = field(default_factory=list)


@dataclass
class _Op:
    kind: str  # "container" | "compute"
    name: str
    zone: str
    pool: str
    purpose: str


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


_STATE = {
    "PROVISIONING": CloudNodeState.PROVISIONING,
    "STAGING": CloudNodeState.PROVISIONING,
    "RUNNING": CloudNodeState.RUNNING,
    "STOPPING": CloudNodeState.DELETING,
    "SUSPENDING": CloudNodeState.DELETING,
    "TERMINATED": CloudNodeState.GONE,
}


class GcpProvider(SlotProvider["_PoolView"]):
    """The :class:`~gpuscale.providers.base.Provider` for GKE (see the module docstring)."""

    name = PROVIDER_NAME

    def __init__(self, config: GcpConfig, *, credentials: Any = None, clock: Clock | None = None) -> None:
        super().__init__(clock, config.unavailable_ttl_s)
        self.config = config
        opts = {"api_endpoint": config.api_endpoint} if config.api_endpoint else None
        kw: dict[str, Any] = {"transport": "rest", "client_options": opts, "credentials": credentials}
        self._gke = container_v1.ClusterManagerClient(**kw)
        self._vms = compute_v1.InstancesClient(**kw)
        self._migs = compute_v1.InstanceGroupManagersClient(**kw)
        self._zone_ops = compute_v1.ZoneOperationsClient(**kw)
        self._slots: dict[str, _Slots] = {}
        self._ops: list[_Op] = []
        self._bound: dict[str, tuple[str, int]] = {}
        self._deleting: set[str] = set()
        self._cancelled: dict[str, int] = {}
        self._request_ids: dict[str, str] = {}
        self._error_mark: dict[str, str] = {}
        self._seen: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"GcpProvider(cluster={self.config.parent!r})"

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Spot, the configured zones, specific nodes deleted through the MIG."""
        return ProviderCapabilities(
            spot=True,
            delete_specific_node=True,
            zones=self.config.zones,
            max_nodes_per_launch=MAX_POOL_SIZE,
            reports_node_ready=False,
        )

    # --- Provider protocol ---------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """Reserve ``request.count`` slots in the offering's pool (created if missing); return them at once."""
        spec = machine_spec(request.instance_type)
        if spec is None:
            raise InvalidProviderRequest(
                f"{request.instance_type!r} is not a GCP GPU instance type gpuscale knows",
                provider=self.name,
                field="instance_type",
            )
        if not 1 <= request.count <= MAX_POOL_SIZE:
            raise InvalidProviderRequest(f"count must be 1..{MAX_POOL_SIZE}", provider=self.name, field="count")
        if request.zone not in self.config.zones:
            raise InvalidProviderRequest(
                f"zone {request.zone!r} is not one of {list(self.config.zones)}", provider=self.name, field="zone"
            )
        self._refuse_if_out_of_stock(request, "ran out of capacity recently (ZONE_RESOURCE_POOL_EXHAUSTED)")
        key = label_key(request.request_id)
        with self._lock:
            self._request_ids[key] = request.request_id
            pools = self._observe()
            served = [n for n in self._nodes(pools) if label_key(n.request_id) == key]
            if served:
                return served
            total = sum(len(self._live(p)) for p in pools.values()) + sum(len(s.open) for s in self._slots.values())
            if total + request.count > self.config.max_nodes:
                raise QuotaExceeded(
                    f"gcp: max_nodes {self.config.max_nodes} reached ({total} gpuscale nodes)", provider=self.name
                )
            name = pool_name(request)
            slots = _Slots(request.request_id, key, name, request, list(range(request.count)), self.clock.now())
            pool = pools.get(name)
            if pool is None:
                if len(pools) >= self.config.max_pools:
                    raise QuotaExceeded(
                        f"gcp: max_pools {self.config.max_pools} gpuscale node pools exist", provider=self.name
                    )
                self._create_pool(request, spec, name)
                self._slots[key] = slots
            elif pool.status in ("PROVISIONING", "RUNNING", "RUNNING_WITH_ERROR", "RECONCILING"):
                self._slots[key] = slots
                if not any(o.pool == name and o.kind == "container" for o in self._ops):
                    self._resize(pool, raise_errors=True)
            else:
                raise TransientProviderError(f"gcp: node pool {name} is {pool.status}; retry later", provider=self.name)
            return self._slot_nodes(slots)

    def delete_node(self, node_id: str) -> None:
        """Delete one node: its VM through the MIG's ``deleteInstances``, or its open slot. Unknown ids succeed."""
        pool_id, _, rest = node_id.partition("/")
        key, _, slot_text = rest.partition("/")
        slot = int(slot_text) if slot_text.isdigit() else -1
        with self._lock:
            pools = self._observe()
            if not rest:  # an adopted VM, by name
                pool = next((p for p in pools.values() if any(v.name == node_id for v in p.vms)), None)
                pool_id = pool.name if pool else ""
            else:
                pool = pools.get(pool_id)
            vm = next(
                (
                    v
                    for v in (pool.vms if pool else [])
                    if (v.name == node_id if not rest else self._owner(v) == (key, slot))
                ),
                None,
            )
            if vm is not None and pool is not None:
                if vm.name not in self._deleting and self._delete_vm(pool, vm):
                    log.info("gcp: deleting VM %s of pool %s (node %s)", vm.name, pool_id, node_id)
                return
            slots = self._slots.get(key)
            if slots is not None and slots.pool == pool_id and slot in slots.open:
                slots.open.remove(slot)
                self._cancelled[pool_id] = self._cancelled.get(pool_id, 0) + 1
                if not slots.open:
                    del self._slots[key]

    # --- observing and progressing -------------------------------------------------------------------------------
    def _observe(self) -> dict[str, _PoolView]:
        """Read pools and VMs, then move pending work on: finished operations, VM labels, resizes, idle pools."""
        self._poll_ops()
        pools = self._pools()
        for pool in pools.values():
            self._bind(pool)
        for pool in pools.values():
            busy = any(o.pool == pool.name and o.kind == "container" for o in self._ops)
            if busy:
                continue
            open_slots = [s for s in self._slots.values() if s.pool == pool.name and s.open]
            if open_slots:
                self._check_mig_errors(pool, open_slots)
                if pool.status in ("RUNNING", "RUNNING_WITH_ERROR") and any(s.open for s in open_slots):
                    self._resize(pool, raise_errors=False)
            elif not pool.vms and pool.status in ("RUNNING", "RUNNING_WITH_ERROR", "ERROR"):
                self._delete_pool(pool)
        return pools

    def _pools(self) -> dict[str, _PoolView]:
        response = call(
            "list node pools",
            lambda: self._gke.list_node_pools(parent=self.config.parent, retry=None, timeout=self.config.timeout_s),
        )
        out: dict[str, _PoolView] = {}
        for p in response.node_pools:
            labels = dict(p.config.resource_labels)
            if labels.get(L_CLUSTER) != label_key(self.config.cluster):
                continue
            groups = []
            for url in p.instance_group_urls:
                parts = url.split("/")
                groups.append((parts[parts.index("zones") + 1], parts[-1]))
            out[p.name] = _PoolView(
                p.name, p.status.name, bool(p.config.spot), labels, groups, node_labels=dict(p.config.labels)
            )
        zones = sorted({z for p in out.values() for z, _ in p.groups})
        for zone in zones:
            req = compute_v1.ListInstancesRequest(
                project=self.config.project,
                zone=zone,
                filter=f'labels.{L_CLUSTER} = "{label_key(self.config.cluster)}"',
            )
            for vm in call(
                f"list VMs in {zone}",
                lambda r=req: list(
                    self._vms.list(  # type: ignore[misc]
                        request=r, retry=None, timeout=self.config.timeout_s
                    )
                ),
            ):
                pool = out.get(vm.labels.get("goog-k8s-node-pool-name", ""))
                if pool is not None:
                    pool.vms.append(
                        _Vm(
                            vm.name,
                            str(vm.id),
                            zone,
                            vm.status,
                            dict(vm.labels),
                            vm.label_fingerprint,
                            vm.self_link,
                            self.clock.now(),
                        )
                    )
        return out

    def _owner(self, vm: _Vm) -> tuple[str, int] | None:
        if L_REQ in vm.labels and vm.labels.get(L_SLOT, "").isdigit():
            return vm.labels[L_REQ], int(vm.labels[L_SLOT])
        return self._bound.get(vm.name)

    def _live(self, pool: _PoolView) -> list[_Vm]:
        return [v for v in pool.vms if v.name not in self._deleting and v.status not in ("STOPPING", "TERMINATED")]

    def _bind(self, pool: _PoolView) -> None:
        """Give each new VM of the pool an open slot (and write it on the VM); delete the VMs of deleted slots."""
        for vm in sorted(self._live(pool), key=lambda v: v.name):
            if self._owner(vm) is not None:
                continue
            slots = sorted((s for s in self._slots.values() if s.pool == pool.name and s.open), key=lambda s: s.at)
            if slots:
                s = slots[0]
                slot = s.open.pop(0)
                self._bound[vm.name] = (s.key, slot)
                if not s.open:
                    del self._slots[s.key]
                labels = {**vm.labels, L_REQ: s.key, L_SLOT: str(slot)}
                op = call(
                    f"label VM {vm.name}",
                    lambda v=vm, lb=labels: self._vms.set_labels_unary(  # type: ignore[misc]
                        project=self.config.project,
                        zone=v.zone,
                        instance=v.name,
                        instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                            labels=lb, label_fingerprint=v.fingerprint
                        ),
                        retry=None,
                        timeout=self.config.timeout_s,
                    ),
                )
                self._ops.append(_Op("compute", op.name, vm.zone, pool.name, "label"))
            elif self._cancelled.get(pool.name, 0) > 0:
                self._cancelled[pool.name] -= 1
                if self._delete_vm(pool, vm):
                    log.info("gcp: deleting VM %s of pool %s: no launch wants it", vm.name, pool.name)

    def _delete_vm(self, pool: _PoolView, vm: _Vm) -> bool:
        """Delete one VM through its MIG's ``deleteInstances`` (which lowers the group's target size too); False
        when the pool has no group in the VM's zone."""
        group = next((g for z, g in pool.groups if z == vm.zone), None)
        if group is None:
            return False
        op = call(
            f"delete VM {vm.name}",
            lambda: self._migs.delete_instances_unary(
                project=self.config.project,
                zone=vm.zone,
                instance_group_manager=group,
                instance_group_managers_delete_instances_request_resource=(
                    compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                        instances=[vm.self_link], skip_instances_on_validation_error=True
                    )
                ),
                retry=None,
                timeout=self.config.timeout_s,
            ),
        )
        self._deleting.add(vm.name)
        self._ops.append(_Op("compute", op.name, vm.zone, pool.name, "delete"))
        return True

    def _first_seen(self, vm: _Vm) -> float:
        return self._seen.setdefault(vm.name, vm.created)

    def _resize(self, pool: _PoolView, *, raise_errors: bool) -> None:
        """``setSize`` to live VMs + open slots when that is more than the MIG's target (never lower)."""
        if not pool.groups:
            return
        zone, group = pool.groups[0]
        mig = call(
            f"get MIG {group}",
            lambda: self._migs.get(
                project=self.config.project,
                zone=zone,
                instance_group_manager=group,
                retry=None,
                timeout=self.config.timeout_s,
            ),
        )
        want = len(self._live(pool)) + sum(len(s.open) for s in self._slots.values() if s.pool == pool.name)
        if want <= mig.target_size:
            return
        try:
            op = call(
                f"resize pool {pool.name}",
                lambda: self._gke.set_node_pool_size(
                    request=container_v1.SetNodePoolSizeRequest(
                        name=f"{self.config.parent}/nodePools/{pool.name}", node_count=want
                    ),
                    retry=None,
                    timeout=self.config.timeout_s,
                ),
            )
        except ProviderError as exc:
            if raise_errors:
                self._fail_slots(pool.name, exc, report=False)
                raise
            self._fail_slots(pool.name, exc, report=True)
            return
        log.info("gcp: resizing pool %s from %d to %d nodes", pool.name, mig.target_size, want)
        self._ops.append(_Op("container", op.name, self.config.location, pool.name, "resize"))

    def _create_pool(self, request: LaunchRequest, spec: MachineSpec, name: str) -> None:
        taints = [GPU_TAINT, *(t for t in request.taints if t != GPU_TAINT)]
        effect = container_v1.NodeTaint.Effect
        effects = {
            TaintEffect.NO_SCHEDULE: effect.NO_SCHEDULE,
            TaintEffect.PREFER_NO_SCHEDULE: effect.PREFER_NO_SCHEDULE,
            TaintEffect.NO_EXECUTE: effect.NO_EXECUTE,
        }
        driver = container_v1.GPUDriverInstallationConfig.GPUDriverVersion.__members__[self.config.gpu_driver_version]
        node_pool = container_v1.NodePool(
            name=name,
            initial_node_count=request.count,
            locations=[request.zone],
            management=container_v1.NodeManagement(auto_repair=True, auto_upgrade=True),
            config=container_v1.NodeConfig(
                machine_type=spec.machine_type,
                spot=request.capacity_type is CapacityType.SPOT,
                labels={**request.labels, wk.POOL: request.pool, wk.CAPACITY_TYPE: str(request.capacity_type)},
                taints=[container_v1.NodeTaint(key=t.key, value=t.value, effect=effects[t.effect]) for t in taints],
                resource_labels={
                    L_CLUSTER: label_key(self.config.cluster),
                    L_POOL: label_key(request.pool),
                    L_TYPE: label_key(request.instance_type),
                },
                accelerators=[
                    container_v1.AcceleratorConfig(
                        accelerator_type=spec.accelerator_type,
                        accelerator_count=spec.accelerator_count,
                        gpu_driver_installation_config=container_v1.GPUDriverInstallationConfig(
                            gpu_driver_version=driver
                        ),
                    )
                ],
            ),
        )
        try:
            op = call(
                f"create pool {name}",
                lambda: self._gke.create_node_pool(
                    parent=self.config.parent, node_pool=node_pool, retry=None, timeout=self.config.timeout_s
                ),
            )
        except InsufficientCapacity:
            self._mark_request_unavailable(request)
            raise
        log.info(
            "gcp: creating pool %s (%s x%d in %s) for request %s",
            name,
            request.instance_type,
            request.count,
            request.zone,
            request.request_id,
        )
        # Read the operation once (no waiting): GKE may already know the create failed.
        done = call(
            "get operation",
            lambda: self._gke.get_operation(
                name=f"projects/{self.config.project}/locations/{self.config.location}/operations/{op.name}",
                retry=None,
                timeout=self.config.timeout_s,
            ),
        )
        if done.status == container_v1.Operation.Status.DONE and done.error.message:
            err = op_error(done.error.message, f"create pool {name}")
            if isinstance(err, InsufficientCapacity):
                self._mark_request_unavailable(request)
            raise err
        self._ops.append(_Op("container", op.name, self.config.location, name, "create"))

    def _delete_pool(self, pool: _PoolView) -> None:
        op = call(
            f"delete pool {pool.name}",
            lambda: self._gke.delete_node_pool(
                name=f"{self.config.parent}/nodePools/{pool.name}", retry=None, timeout=self.config.timeout_s
            ),
        )
        log.info("gcp: deleting idle pool %s", pool.name)
        self._ops.append(_Op("container", op.name, self.config.location, pool.name, "delete-pool"))

    def _poll_ops(self) -> None:
        still: list[_Op] = []
        for op in self._ops:
            if op.kind == "container":
                got = call(
                    "get operation",
                    lambda o=op: self._gke.get_operation(  # type: ignore[misc]
                        name=f"projects/{self.config.project}/locations/{o.zone}/operations/{o.name}",
                        retry=None,
                        timeout=self.config.timeout_s,
                    ),
                )
                done = got.status == container_v1.Operation.Status.DONE
                message = got.error.message if done else ""
            else:
                zop = call(
                    "get operation",
                    lambda o=op: self._zone_ops.get(  # type: ignore[misc]
                        project=self.config.project,
                        zone=o.zone,
                        operation=o.name,
                        retry=None,
                        timeout=self.config.timeout_s,
                    ),
                )
                done = zop.status == compute_v1.Operation.Status.DONE
                message = "; ".join(e.message for e in zop.error.errors) if done else ""
            if not done:
                still.append(op)
            elif message and op.purpose in ("create", "resize"):
                err = op_error(message, f"{op.purpose} pool {op.pool}")
                self._fail_slots(op.pool, err, report=True)
            elif message:
                log.warning("gcp: %s of pool %s failed: %s", op.purpose, op.pool, scrub(message)[:300])
        self._ops = still

    def _check_mig_errors(self, pool: _PoolView, open_slots: list[_Slots]) -> None:
        """A MIG that cannot create VMs (stockout, quota) reports it in ``listErrors``: fail the open slots."""
        for zone, group in pool.groups:
            errors = call(
                f"list MIG errors {group}",
                lambda z=zone, g=group: list(
                    self._migs.list_errors(  # type: ignore[misc]
                        project=self.config.project,
                        zone=z,
                        instance_group_manager=g,
                        retry=None,
                        timeout=self.config.timeout_s,
                    )
                ),
            )
            since = _rfc3339(min(s.at for s in open_slots))
            fresh = [e for e in errors if e.timestamp >= since and e.timestamp > self._error_mark.get(group, "")]
            if not fresh:
                continue
            self._error_mark[group] = max(e.timestamp for e in fresh)
            last = fresh[-1].error
            self._fail_slots(pool.name, op_error(f"{last.code}: {last.message}", f"grow pool {pool.name}"), report=True)

    def _fail_slots(self, pool: str, err: ProviderError, *, report: bool) -> None:
        for key, s in list(self._slots.items()):
            if s.pool != pool:
                continue
            if isinstance(err, InsufficientCapacity):
                self._mark_request_unavailable(s.request)
            if report:
                self._launch_failed(pool, key, s.request_id, s.open, err)
            del self._slots[key]

    # --- building nodes ------------------------------------------------------------------------------------------
    def _slot_nodes(self, s: _Slots) -> list[CloudNode]:
        return self._open_slots(s.request, s.pool, s.key, s.open, s.at)

    def _nodes(self, pools: Mapping[str, _PoolView]) -> list[CloudNode]:
        out: list[CloudNode] = []
        for pool in pools.values():
            for vm in self._live(pool):
                owner = self._owner(vm)
                key = owner[0] if owner else ""
                state = _STATE.get(vm.status, CloudNodeState.PROVISIONING)
                out.append(
                    CloudNode(
                        node_id=slot_id(pool.name, key, owner[1]) if owner else vm.name,
                        request_id=self._request_ids.get(key, key),
                        pool=pool.node_labels.get(wk.POOL, pool.labels.get(L_POOL, "")),
                        instance_type=pool.labels.get(L_TYPE, ""),
                        zone=vm.zone,
                        capacity_type=CapacityType.SPOT if pool.spot else CapacityType.ON_DEMAND,
                        state=state,
                        created_at=self._first_seen(vm),
                        node_name=vm.name,
                        instance_id=vm.name,  # the last part of the Node's providerID gce://project/zone/name
                        labels=pool.node_labels,
                    )
                )
        for s in self._slots.values():
            out.extend(self._slot_nodes(s))
        return sorted(out, key=lambda n: n.node_id)
