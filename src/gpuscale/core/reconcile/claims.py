"""The claim lifecycle decisions of one round, as pure functions of what was observed.

- :func:`sync_claims`: every provider node is a claim keyed by its request id: a Requested claim whose node is
  listed becomes Launched, a node nobody claims is adopted (after a restart), claims advance Launched ->
  Registered -> Initialized as the Node appears and advertises its GPUs, and a claim whose node vanished is Gone
  (Lost, or Deleted if gpuscale was deleting it), after ``lost_grace_s`` for one launched moments ago (never while
  a Launched claim's Node is in the cluster: the list lags its launches, and losing the claim would launch its pods
  a second node);
- :func:`on_provider_events`: spot interruption notices, asynchronous launch failures and failed nodes;
- :func:`expire_deadlines`: claims past their phase's deadline fail, and their offering is avoided for a while;
- :func:`progress_replacements`: a replaced node drains once all its replacements are initialised;
- :func:`restore_claims`: a restarted controller's claims from the recorded ones (its GPUNodeClaims) and the
  provider's node list, before its first round.

Each returns a :class:`~gpuscale.core.reconcile.records.Decisions`; none changes its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuscale.core.model import CapacityType, Node, OfferingKey
from gpuscale.core.nodeclaim import (
    TIMED_PHASES,
    ClaimEvent,
    ClaimPhase,
    NodeClaim,
    expired,
    new_claim,
    timeout_event,
    transition,
)
from gpuscale.core.reconcile.records import (
    DELETING,
    LAUNCH_FAILED,
    NODE_FAILED,
    SPOT_INTERRUPTION,
    ClearRetry,
    CloudNodeView,
    Cordon,
    Decisions,
    DrainStarted,
    DropReplacement,
    EventKind,
    FinishClaim,
    Fleet,
    MarkUnavailable,
    Note,
    ProviderEventView,
    Rules,
    SetClaim,
    Uncordon,
    find_node,
)
from gpuscale.core.resources import Resources
from gpuscale.core.templates import template_allocatable

ADVANCING = frozenset({ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED})
"""Claim phases that move on when the cluster shows the node (registered, GPUs allocatable)."""
RUNNING = (ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED, ClaimPhase.INITIALIZED)
"""Claim phases whose node an interruption or a failure drains."""
_SETTLED = frozenset(ClaimPhase) - ADVANCING - {ClaimPhase.REQUESTED}
"""Claim phases a listed node teaches nothing (once the claim has its node id and name)."""
# Enum members read per listed node as module constants: a class attribute of an Enum costs ~4 times a global lookup
# in Python 3.11 (EnumType defines __getattr__).
_REQUESTED, _LAUNCHED, _REGISTERED = ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED, ClaimPhase.REGISTERED


def adopt_claim(
    key: str, cn: CloudNodeView, nodes: Mapping[str, Node], fleet: Fleet, rules: Rules, now: float
) -> NodeClaim:
    """The claim of a provider node no claim knows (found after a restart): Deleting if the provider is deleting it,
    Draining if its Node is cordoned, Registered if its Node exists, else Launched (timed from its creation)."""
    pool = fleet.pools.get(cn.pool)
    it = fleet.types.get(cn.instance_type)
    expected = template_allocatable(pool, it) if pool is not None and it is not None else Resources()
    node = nodes.get(cn.node_name) if cn.node_name else None
    if cn.state == DELETING:
        phase = ClaimPhase.DELETING
    elif node is not None and node.unschedulable:
        phase = ClaimPhase.DRAINING
    elif node is not None:
        phase = ClaimPhase.REGISTERED
    else:
        phase = ClaimPhase.LAUNCHED
    since = cn.created_at if phase is ClaimPhase.LAUNCHED and cn.created_at > 0 else now
    claim = new_claim(
        key,
        cn.pool,
        cn.instance_type,
        cn.zone,
        cn.capacity_type,
        cn.created_at or now,
        expected=expected,
        hourly_price=fleet.price(cn.instance_type, cn.zone, cn.capacity_type),
        reason="Adopted",
        deadlines=rules.deadlines_for(cn.pool),
    )
    return replace(claim, phase=phase, since=since, node_id=cn.node_id, node_name=cn.node_name)


def advance_claim(claim: NodeClaim, nodes: Mapping[str, Node], now: float, out: Decisions) -> NodeClaim:
    """``claim`` after what its Node shows: Launched -> Registered when the Node exists, Registered -> Initialized
    when it advertises the expected GPUs (notes appended to ``out``)."""
    if claim.node_name and claim.phase not in ADVANCING:
        return claim
    node = find_node(claim, nodes)
    if node is None:
        return claim
    if not claim.node_name:
        claim = replace(claim, node_name=node.name)
    if claim.phase is _LAUNCHED:
        claim = transition(claim, ClaimEvent.REGISTERED, now, reason="Node object registered")
        out.note(EventKind.REGISTERED, f"node/{node.name}", "Registered", "node joined the cluster")
    if claim.phase is _REGISTERED and node.allocatable.gpus >= claim.expected.gpus:
        claim = transition(claim, ClaimEvent.INITIALIZED, now, reason="GPUs allocatable")
        gpus = node.allocatable.gpus
        out.note(
            EventKind.INITIALIZED,
            f"node/{node.name}",
            "Initialized",
            f"{gpus} GPU(s) allocatable" if claim.expected.gpus else "node ready (no GPUs)",
        )
    return claim


def sync_claims(
    claims: Mapping[str, NodeClaim],
    cloud: Sequence[CloudNodeView],
    nodes: Mapping[str, Node],
    fleet: Fleet,
    rules: Rules,
    now: float,
    *,
    requested: int | None = None,
    foreign: Callable[[str], bool] | None = None,
    known: Collection[str] = (),
) -> Decisions:
    """Match the provider's node list against the claims (see the module docstring).

    ``claims`` is in table order (the order claims were added); ``requested`` is how many are Requested (counted
    here when not given). A node whose request id names a claim with another node id is a second node of that
    request and is claimed as ``<id>#<node id>``. Nodes whose request id ``foreign`` owns (another engine's, e.g.
    the GPR manager's) are left alone: never adopted, so never consolidated, drained or deleted here.

    ``known``: the claim keys of listed nodes left out of ``cloud`` because the caller knows each teaches nothing
    (the node and its claim are the very ones an earlier sync found settled, see :attr:`Decisions.matched`); no
    node of ``cloud`` may have one of these keys as its request id (or node id). The decisions are those of a sync
    of the whole listing, in the same order (a settled node adds no action).
    """
    out = Decisions()
    table: dict[str, NodeClaim] | None = None  # the claims with this sync's changes, made on the first change
    current: Mapping[str, NodeClaim] = claims
    lookup = claims.get  # current.get (bound again when the table is made)
    learnt = False  # some claim changed (or was adopted)
    waiting = False  # some listed claim's next step depends on its Node (Launched or Registered, unchanged)
    listed_requests = 0  # Requested claims whose node this sync found (they are Launched now)
    seen: set[str] = set()
    saw = seen.add
    matched = out.matched.append
    for i, cn in enumerate(cloud):
        key = cn.request_id or cn.node_id
        existing = lookup(key)
        if existing is None:
            if foreign is not None and cn.request_id and foreign(cn.request_id):
                continue
        elif (  # the listed node teaches nothing about its claim (inline: this runs for every node of every sync)
            existing.node_id == cn.node_id
            and existing.phase in _SETTLED
            and existing.node_name
            and (not cn.node_name or existing.node_name == cn.node_name)
        ):
            saw(key)
            matched((i, key))
            continue
        if existing is not None and existing.node_id and existing.node_id != cn.node_id:
            key = f"{key}#{cn.node_id}"
            existing = current.get(key)
        if existing is None:
            claim = adopt_claim(key, cn, nodes, fleet, rules, now)
            out.note(
                EventKind.ADOPTED,
                f"node/{cn.node_name or cn.node_id}",
                str(claim.phase),
                f"rebuilt claim {key} from the provider ({cn.state}) and the cluster: {claim.phase}",
                request_id=key,
            )
        else:
            claim = existing
            if claim.phase is _REQUESTED:
                claim = transition(claim, ClaimEvent.LAUNCHED, now, node_id=cn.node_id, node_name=cn.node_name)
                out.actions.append(ClearRetry(key))
                listed_requests += 1
            if not claim.node_id or (cn.node_name and claim.node_name != cn.node_name):
                claim = replace(claim, node_id=cn.node_id, node_name=cn.node_name or claim.node_name)
        seen.add(key)
        claim = advance_claim(claim, nodes, now, out)
        if claim is existing:  # a Launched or Registered claim whose Node shows nothing new yet
            waiting = True
            continue
        learnt = True
        if table is None:
            table = dict(claims)
            current, lookup = table, table.get
        table[key] = claim
        out.actions.append(SetClaim(key, claim))
    if requested is None:
        requested = sum(1 for c in claims.values() if c.phase is ClaimPhase.REQUESTED)
    requested -= listed_requests
    if len(seen) + len(known) + requested == len(current):
        # every claim was listed, or is still Requested (seen claims are never Requested; known ones are seen)
        out.settled = not learnt and not waiting
        out.fixpoint = True
        return out
    for key, claim in list(current.items()):
        if key in seen or key in known or claim.phase is ClaimPhase.REQUESTED:
            continue
        if claim.phase is ClaimPhase.LAUNCHED and (
            now - claim.since < rules.lost_grace_s or find_node(claim, nodes) is not None
        ):
            # not listed yet (eventual consistency): lost only after the grace period, and never while its Node is
            # in the cluster (the node exists; the list lags)
            out.unlisted.add(key)
            continue
        name = f"node/{claim.node_name or key}"
        if claim.phase is ClaimPhase.DELETING:
            gone = transition(claim, ClaimEvent.DELETED, now, reason="provider no longer lists it")
            out.actions.append(FinishClaim(key, gone))
            out.note(EventKind.GONE, name, "Deleted", "node is gone")
        elif claim.phase is not ClaimPhase.FAILED:
            gone = transition(claim, ClaimEvent.LOST, now, reason="provider no longer lists it")
            out.actions.append(FinishClaim(key, gone))
            out.note(
                EventKind.LOST,
                name,
                "NodeLost",
                f"node of claim {key} ({claim.phase}) vanished without gpuscale deleting it",
                request_id=key,
            )
            out.replan = True
    out.fixpoint = not out.unlisted  # the finished claims leave the table; the failed ones stay unlisted and idle
    return out


def start_drain(
    key: str, claim: NodeClaim, reason: str, nodes: Mapping[str, Node], now: float, out: Decisions, *, involuntary: bool
) -> NodeClaim:
    """Append the actions that start draining ``claim``: the Disrupt transition, a cordon of its node if it is
    still schedulable, and the drain record. Returns the draining claim."""
    draining = transition(claim, ClaimEvent.DISRUPT, now, reason=reason)
    out.actions.append(SetClaim(key, draining))
    node = find_node(claim, nodes)
    if node is not None and not node.unschedulable:
        out.actions.append(Cordon(node.name))
    out.actions.append(DrainStarted(key, claim.node_name, involuntary))
    return draining


def _claim_of_event(claims: Mapping[str, NodeClaim], node_id: str, request_id: str) -> tuple[str, NodeClaim] | None:
    for key, c in claims.items():
        if (node_id and c.node_id == node_id) or (request_id and key == request_id and not node_id):
            return key, c
    if request_id and request_id in claims:
        return request_id, claims[request_id]
    return None


def on_provider_events(
    claims: Mapping[str, NodeClaim],
    events: Iterable[ProviderEventView],
    nodes: Mapping[str, Node],
    rules: Rules,
    now: float,
) -> Decisions:
    """Spot interruption: avoid the spot offering for ``unavailable_ttl_s`` and drain the node (involuntary).
    Asynchronous launch failure of a Requested or Launched claim: fail it and avoid its offering. Node failure:
    drain the node. Events about unknown nodes are ignored."""
    out = Decisions()
    table = dict(claims)
    for ev in events:
        found = _claim_of_event(table, ev.node_id, ev.request_id)
        if found is None:
            continue
        key, c = found
        if ev.kind == SPOT_INTERRUPTION:
            spot = OfferingKey(c.instance_type, c.zone, CapacityType.SPOT)
            out.actions.append(MarkUnavailable(spot, now + rules.unavailable_ttl_s, "spot interruption notice"))
            if c.phase in RUNNING:
                table[key] = start_drain(key, c, "SpotInterruption", nodes, now, out, involuntary=True)
                out.replan = True
            left = f"; reclaimed in {ev.deadline - now:.0f}s" if ev.deadline is not None else ""
            out.note(
                EventKind.SPOT_INTERRUPTION,
                f"node/{c.node_name or key}",
                "SpotInterruption",
                f"interruption notice: cordon, launch replacement, drain{left}",
                request_id=key,
            )
        elif ev.kind == LAUNCH_FAILED:
            if c.phase in (ClaimPhase.REQUESTED, ClaimPhase.LAUNCHED):
                failed = transition(c, ClaimEvent.LAUNCH_FAILED, now, reason=ev.message or "launch failed")
                table[key] = failed
                out.actions.append(SetClaim(key, failed))
                offering = OfferingKey(c.instance_type, c.zone, c.capacity_type)
                out.actions.append(
                    MarkUnavailable(offering, now + rules.unavailable_ttl_s, "asynchronous launch failure")
                )
                out.replan = True
                out.note(EventKind.LAUNCH_FAILED, f"nodeclaim/{key}", "LaunchFailed", ev.message)
        elif ev.kind == NODE_FAILED and c.phase in RUNNING:
            table[key] = start_drain(key, c, "NodeFailed", nodes, now, out, involuntary=True)
            out.replan = True
            out.note(EventKind.NODE_FAILED, f"node/{c.node_name or key}", "NodeFailed", ev.message)
    return out


def expire_deadlines(timed: Iterable[tuple[str, NodeClaim]], rules: Rules, now: float) -> Decisions:
    """Fail every claim of ``timed`` (claims in a timed phase) past its deadline. A registration timeout avoids the
    offering for ``unavailable_ttl_s`` (a node that never joined is likely to fail the same way; a launch timeout
    follows retries, back-offs or quota and says nothing of the offering); a GPU-init timeout avoids the type in
    that zone, both capacity types, for ``gpu_init_unavailable_ttl_s``."""
    out = Decisions()
    for key, c in timed:
        if c.phase not in TIMED_PHASES or not expired(c, now):
            continue
        ev = timeout_event(c)
        assert ev is not None
        out.actions.append(SetClaim(key, transition(c, ev, now, reason=f"{ev} after {now - c.since:.0f}s")))
        out.replan = True
        msg = f"{c.phase} for {now - c.since:.0f}s ({ev}); deleting and re-planning"
        if ev is ClaimEvent.REGISTRATION_TIMEOUT and c.instance_type and c.zone:
            offering = OfferingKey(c.instance_type, c.zone, c.capacity_type)
            why = f"{c.node_name or key} timed out in {c.phase}"
            out.actions.append(MarkUnavailable(offering, now + rules.unavailable_ttl_s, why))
        if ev is ClaimEvent.GPU_INIT_TIMEOUT:
            for ct in CapacityType:
                offering = OfferingKey(c.instance_type, c.zone, ct)
                why = f"GPUs of {c.node_name or key} never became allocatable"
                out.actions.append(MarkUnavailable(offering, now + rules.gpu_init_unavailable_ttl_s, why))
        out.note(EventKind.TIMEOUT, f"node/{c.node_name or key}", str(ev), msg, request_id=key)
    return out


_REPLACEMENT_FAILED = frozenset({ClaimPhase.FAILED, ClaimPhase.GONE, ClaimPhase.DRAINING})


def progress_replacements(
    replacements: Mapping[str, tuple[tuple[str, ...], str]],
    claims: Mapping[str, NodeClaim],
    claim_of_node: Callable[[str], tuple[str, NodeClaim] | None],
    nodes: Mapping[str, Node],
    now: float,
    cordoned: Collection[str] = frozenset(),
) -> Decisions:
    """Drain a replaced node once all its replacements are initialised; keep it if one of them failed, and make it
    schedulable again if it is in ``cordoned`` (the nodes gpuscale cordoned when it started their replacement).

    ``replacements`` maps the old node's name to (request ids of its replacements, the disruption reason);
    ``claim_of_node`` finds the (key, claim) of a node name.
    """
    out = Decisions()
    for old_name, (rids, reason) in replacements.items():
        found = claim_of_node(old_name)
        new = [claims.get(rid) for rid in rids]
        if found is None or found[1].phase is not ClaimPhase.INITIALIZED:
            out.actions.append(DropReplacement(old_name))
            continue
        failed = [rid for rid, c in zip(rids, new, strict=True) if c is None or c.phase in _REPLACEMENT_FAILED]
        if failed:
            if old_name in cordoned:
                out.actions.append(Uncordon(old_name))
            out.actions.append(DropReplacement(old_name))
            out.note(
                EventKind.REPLACE_ABORTED,
                f"node/{old_name}",
                "ReplacementFailed",
                f"replacement {', '.join(failed)} did not come up; node kept",
            )
            continue
        if all(c is not None and c.phase is ClaimPhase.INITIALIZED for c in new):
            out.actions.append(DropReplacement(old_name))
            start_drain(found[0], found[1], reason, nodes, now, out, involuntary=False)
            names = ", ".join(str(c.node_name) for c in new if c is not None)
            out.note(
                EventKind.DRAIN,
                f"node/{old_name}",
                reason,
                f"replacement {names} {'is' if len(new) == 1 else 'are'} ready; draining",
            )
    return out


def retry_uncordons(
    due: Mapping[str, float],
    nodes: Mapping[str, Node],
    claim_of_node: Callable[[str], tuple[str, NodeClaim] | None],
    now: float,
) -> tuple[list[str], list[str]]:
    """Of the nodes an :class:`Uncordon` was sent for (``due``: when to send it again), (those to uncordon again now,
    those settled). A node is settled once it is seen schedulable, or gone, or leaving (its claim not Initialized);
    one still unschedulable is asked again at its due time (a failed request is retried in a later round)."""
    again: list[str] = []
    settled: list[str] = []
    for name, at in due.items():
        node = nodes.get(name)
        found = claim_of_node(name)
        if node is None or not node.unschedulable or found is None or found[1].phase is not ClaimPhase.INITIALIZED:
            settled.append(name)
        elif at <= now:
            again.append(name)
    return again, settled


# ------------------------------------------------------------------------------------------------ restarting
@dataclass(slots=True)
class Restored:
    """What :func:`restore_claims` makes of the recorded claims."""

    claims: dict[str, NodeClaim] = field(default_factory=dict)
    """The claims to seed the table with, oldest request first."""
    stale: list[str] = field(default_factory=list)
    """Keys of records whose node is gone (the provider does not list it): their records are deleted."""
    notes: list[Note] = field(default_factory=list)


def restore_claim(record: NodeClaim, fleet: Fleet, rules: Rules) -> NodeClaim:
    """``record`` with what a record does not keep recomputed: the expected capacity (the pool's template for the
    type), the pool's deadlines, and the price when none was recorded."""
    pool = fleet.pools.get(record.pool)
    it = fleet.types.get(record.instance_type)
    expected = template_allocatable(pool, it) if pool is not None and it is not None else Resources()
    price = record.hourly_price or fleet.price(record.instance_type, record.zone, record.capacity_type)
    return replace(record, expected=expected, deadlines=rules.deadlines_for(record.pool), hourly_price=price)


def restore_claims(
    records: Mapping[str, NodeClaim],
    cloud: Sequence[CloudNodeView],
    nodes: Mapping[str, Node],
    fleet: Fleet,
    rules: Rules,
    now: float,
    *,
    foreign: Callable[[str], bool] | None = None,
) -> Restored:
    """The claim table of a restarted controller, from the recorded claims (by key) and what the provider lists.

    - a record whose node the provider lists keeps its phase, reason, pods and pool (a Requested one becomes
      Launched) and advances as its Node shows (registered, GPUs allocatable);
    - a Requested record whose node is not listed stays Requested, with a fresh launch deadline: it is launched
      again under the same request id (the provider's idempotency returns the node if it was made);
    - a Launched record launched less than ``lost_grace_s`` ago, or whose Node is in the cluster, stays (the listing
      may lag, as in a round);
    - any other record whose node is not listed is stale: its node is gone (its record is deleted).

    Records of ``foreign`` request ids (another engine's) are left alone. Provider nodes no record names are not
    touched here: the first round adopts them (:func:`sync_claims`).
    """
    out = Restored()
    by_id: dict[str, CloudNodeView] = {}
    by_key: dict[str, CloudNodeView] = {}
    for listed in cloud:
        by_id.setdefault(listed.node_id, listed)
        by_key.setdefault(listed.request_id or listed.node_id, listed)
    d = Decisions()
    for key, record in sorted(records.items(), key=lambda kv: (kv[1].created_at, kv[0])):
        if foreign is not None and foreign(key.split("#", 1)[0]):
            continue
        claim = restore_claim(record, fleet, rules)
        cn = by_id.get(claim.node_id) if claim.node_id else by_key.get(key)
        name = f"node/{claim.node_name or (cn.node_name if cn is not None else '') or key}"
        finished = claim.phase is ClaimPhase.GONE
        if cn is not None and not finished:
            if claim.phase is ClaimPhase.REQUESTED:
                claim = transition(claim, ClaimEvent.LAUNCHED, now, node_id=cn.node_id, node_name=cn.node_name)
            elif not claim.node_id or (cn.node_name and claim.node_name != cn.node_name):
                claim = replace(claim, node_id=cn.node_id, node_name=cn.node_name or claim.node_name)
            claim = advance_claim(claim, nodes, now, d)
            out.claims[key] = claim
            d.note(EventKind.ADOPTED, name, "Restored", f"claim {key} restored from its record: {claim.phase}")
        elif claim.phase is ClaimPhase.REQUESTED:
            out.claims[key] = replace(claim, since=now)
            d.note(
                EventKind.ADOPTED,
                f"nodeclaim/{key}",
                "Restored",
                f"claim {key} restored Requested (its node is not listed): launched again under the same id",
            )
        elif claim.phase is ClaimPhase.LAUNCHED and (
            now - claim.since < rules.lost_grace_s or find_node(claim, nodes) is not None
        ):
            out.claims[key] = claim
        else:
            out.stale.append(key)
            gone = claim.phase in (ClaimPhase.DELETING, ClaimPhase.GONE, ClaimPhase.FAILED)
            d.note(
                EventKind.GONE if gone else EventKind.LOST,
                name,
                "Deleted" if gone else "NodeLost",
                f"record {key} ({claim.phase}) names a node the provider does not list: record deleted",
                request_id=key,
            )
    out.notes = d.notes()
    return out
