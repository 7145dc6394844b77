"""GPR demand in the controller's engine: the nodes of GPU Provisioning Requests live in the same claim table, go
through the same provider calls and availability record and the same node lifecycle as the nodes of pods.

The GPR manager (:class:`~gpuscale.gpr.manager.GprManager` with ``engine=controller``) decides which reservations
hold capacity and hands each launch (N nodes of one type, in one zone, with the GPR's labels and taints) to
:meth:`GprSteps.launch_gpr_nodes`, and each node a GPR no longer holds to :meth:`GprSteps.release_gpr_node`.
The controller then:

- launches in the first of its pools that offers the GPR's type (so the pool's limits count GPR nodes too), and
  records every node of the launch as a claim keyed by the GPR's request id (``<id>`` for the first node,
  ``<id>#<node id>`` for the others, as :func:`~gpuscale.core.reconcile.sync_claims` keys a multi-node request), so
  a node is never adopted twice and a restarted controller adopts GPR nodes like its own;
- never counts a GPR claim still in flight as room for pending pods (nor as a place a consolidated node's pods could
  go): its node will carry the GPR's taint;
- never makes a GPR claim a consolidation candidate while the GPR holds it;
- drains (pods of the GPR evicted, PDBs honoured) and deletes a released node through the normal lifecycle.

:class:`GprNodes` is the state (which keys are GPR claims, which nodes were released); it costs nothing while no GPR
launch was ever handed over (pods-only clusters behave exactly as before).
"""

from __future__ import annotations

from dataclasses import replace

from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.shell import LEAVING, ShellBase, World
from gpuscale.core import labels as L
from gpuscale.core.gpr import gpr_id_of_request, is_gpr_request_id
from gpuscale.core.model import CapacityType
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.core.reconcile import Decisions, EventKind, Rules, adopt_claim, start_drain
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest

_HOLDING = (ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED, ClaimPhase.INITIALIZED)


def request_of(key: str) -> str:
    """The request id of a claim key (``<id>`` or ``<id>#<node id>``)."""
    return key.split("#", 1)[0]


class GprNodes:
    """Which claims are GPR nodes, and which GPR nodes were released (see the module docstring)."""

    def __init__(self) -> None:
        self.enabled = False
        """True once a GPR launch was handed over: from then on GPR nodes are this engine's (adopted, protected)."""
        self.released: dict[str, str] = {}
        """Node id -> GPR id of nodes the GPR manager released, until their claim starts draining."""
        self._keys: tuple[int, frozenset[str]] = (-1, frozenset())

    def keys(self, claims: ClaimTable) -> frozenset[str]:
        """Keys of the claims that are GPR nodes (recomputed only when the table changed)."""
        if not self.enabled:
            return frozenset()
        version, keys = self._keys
        if version != claims.version:
            keys = frozenset(k for k in claims if is_gpr_request_id(request_of(k)))
            self._keys = (claims.version, keys)
        return keys

    def foreign(self, request_id: str) -> bool:
        """True if a provider node of ``request_id`` belongs to a GPR engine other than this one."""
        return not self.enabled and is_gpr_request_id(request_id)


class GprSteps(ShellBase):
    """The controller's GPR entry points and its release step (mixed into the controller)."""

    _rules: Rules

    def _now_for_gpr(self) -> float:
        return self.clock.now()

    # ------------------------------------------------------------------------------------- GPR manager side
    def serve_gprs(self) -> None:
        """A GPR manager hands its demand to this engine: GPR nodes are adopted from now on (after a restart too)."""
        self.gpr.enabled = True

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
        """The GPR no longer holds node ``node_id``: drain and delete it in the next round."""
        self.gpr.enabled = True
        self.gpr.released[node_id] = ""

    # ------------------------------------------------------------------------------------- the round's step
    def _release_gpr_nodes(self, w: World) -> None:
        """Start draining every released GPR node whose claim holds it; forget releases of nodes no longer listed."""
        if not self.gpr.released:
            return
        listed = {cn.node_id for cn in w.cloud}
        by_id = {c.node_id: k for k, c in self.claims.items() if c.node_id in self.gpr.released}
        out = Decisions()
        for node_id in list(self.gpr.released):
            key = by_id.get(node_id)
            claim = self.claims.get(key) if key is not None else None
            if claim is not None and claim.phase in _HOLDING:
                start_drain(key, claim, "GprReleased", w.nodes, w.now, out, involuntary=False)  # type: ignore[arg-type]
                del self.gpr.released[node_id]
            elif (claim is not None and claim.phase in LEAVING) or node_id not in listed:
                del self.gpr.released[node_id]
        if out.actions:
            self._apply(out, w)
