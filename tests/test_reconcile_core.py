"""The pure node reconcile (core.reconcile): table tests over the claim transitions it decides, and property tests
over random observations."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import OD, SPOT, catalog, itype, node, pool
from gpuscale.core.disruption import PodDisruptionBudget
from gpuscale.core.labels import DO_NOT_DISRUPT_ANNOTATION
from gpuscale.core.model import CapacityType, Node, OfferingKey, Pod
from gpuscale.core.nodeclaim import (
    REQUEST_ID_LABEL,
    TRANSITIONS,
    ClaimEvent,
    ClaimPhase,
    Deadlines,
    NodeClaim,
    new_claim,
)
from gpuscale.core.reconcile import (
    AllowFallback,
    BackOff,
    BurnId,
    ClearRetry,
    Cordon,
    Decisions,
    DeleteNode,
    DrainStarted,
    DropReplacement,
    EventKind,
    Evict,
    EvictBlocked,
    FinishClaim,
    Fleet,
    LaunchRules,
    MarkUnavailable,
    Note,
    Outcome,
    RemoveOrphan,
    RetryAt,
    Rules,
    SetClaim,
    drain_step,
    expire_deadlines,
    judge_launch_error,
    on_provider_events,
    orphan_step,
    progress_replacements,
    sync_claims,
)
from gpuscale.core.resources import Request
from gpuscale.errors import (
    AuthenticationError,
    InsufficientCapacity,
    InvalidProviderRequest,
    NotFound,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from gpuscale.providers.base import CloudNode, CloudNodeState, ProviderEvent, ProviderEventKind

T4 = itype("t4-1", 8, 32, 1, "T4", price=0.6, spot=0.2)
FLEET = Fleet({"gpu": pool("gpu")}, catalog(T4).by_name())
RULES = Rules(deadlines=Deadlines(launch_s=300, registration_s=900, gpu_init_s=600), lost_grace_s=30.0)


def claim(
    key: str, phase: ClaimPhase, *, since: float = 0.0, node_id: str = "", name: str = "", ct: CapacityType = OD
) -> NodeClaim:
    c = new_claim(key, "gpu", "t4-1", "z1", ct, 0.0, expected=T4.capacity, deadlines=RULES.deadlines)
    return replace(c, phase=phase, since=since, node_id=node_id, node_name=name)


def cloud(
    rid: str, node_id: str, name: str = "", state: CloudNodeState = CloudNodeState.RUNNING, at: float = 0.0
) -> CloudNode:
    return CloudNode(node_id, rid, "gpu", "t4-1", "z1", OD, state, created_at=at, node_name=name)


def k8s(name: str, gpus: int = 1, *, rid: str = "", cordoned: bool = False) -> Node:
    labels = {REQUEST_ID_LABEL: rid} if rid else {}
    return node(name, 8000, 32768, gpus, "T4", labels=labels, pool="gpu", unschedulable=cordoned)


def apply(claims: Mapping[str, NodeClaim], d: Decisions) -> dict[str, NodeClaim]:
    """What the shell does with a decision record, reduced to the claim table."""
    out = dict(claims)
    for a in d.actions:
        if isinstance(a, SetClaim):
            out[a.key] = a.claim
        elif isinstance(a, FinishClaim):
            del out[a.key]
    return out


def kinds(d: Decisions) -> list[str]:
    return [str(a.kind) for a in d.actions if isinstance(a, Note)]


# ------------------------------------------------------------------------------------------------ claim sync table
SYNC_TABLE = [
    # (claim phase, provider lists it, Node registered, GPUs allocatable, now) -> phase after (None: finished)
    (ClaimPhase.REQUESTED, True, False, False, 10.0, ClaimPhase.LAUNCHED),
    (ClaimPhase.REQUESTED, True, True, False, 10.0, ClaimPhase.REGISTERED),
    (ClaimPhase.REQUESTED, True, True, True, 10.0, ClaimPhase.INITIALIZED),
    (ClaimPhase.REQUESTED, False, False, False, 10.0, ClaimPhase.REQUESTED),
    (ClaimPhase.LAUNCHED, True, True, True, 10.0, ClaimPhase.INITIALIZED),
    (ClaimPhase.LAUNCHED, False, False, False, 10.0, ClaimPhase.LAUNCHED),  # within lost grace
    (ClaimPhase.LAUNCHED, False, False, False, 100.0, None),  # lost
    (ClaimPhase.LAUNCHED, False, True, False, 100.0, ClaimPhase.LAUNCHED),  # its Node joined: the list lags
    (ClaimPhase.REGISTERED, True, True, False, 10.0, ClaimPhase.REGISTERED),
    (ClaimPhase.REGISTERED, True, True, True, 10.0, ClaimPhase.INITIALIZED),
    (ClaimPhase.INITIALIZED, False, True, True, 10.0, None),  # lost
    (ClaimPhase.DRAINING, False, True, True, 10.0, None),  # lost
    (ClaimPhase.DELETING, False, False, False, 10.0, None),  # deleted
    (ClaimPhase.DELETING, True, False, False, 10.0, ClaimPhase.DELETING),
    (ClaimPhase.FAILED, False, False, False, 10.0, ClaimPhase.FAILED),  # cleaned up by the drain step, not here
]


@pytest.mark.parametrize(("phase", "listed", "registered", "gpus", "now", "after"), SYNC_TABLE)
def test_claim_sync_table(
    phase: ClaimPhase, listed: bool, registered: bool, gpus: bool, now: float, after: ClaimPhase | None
) -> None:
    has_node = phase not in (ClaimPhase.REQUESTED,)
    c = claim("r1", phase, node_id="n1" if has_node else "", name="node-1" if has_node else "")
    listing = [cloud("r1", "n1", "node-1")] if listed else []
    nodes = {"node-1": k8s("node-1", 1 if gpus else 0)} if registered else {}
    d = sync_claims({"r1": c}, listing, nodes, FLEET, RULES, now)
    table = apply({"r1": c}, d)
    if after is None:
        assert "r1" not in table
        gone = next(a for a in d.actions if isinstance(a, FinishClaim))
        assert gone.claim.phase is ClaimPhase.GONE
        assert kinds(d) in (["NodeLost"], ["NodeGone"])
        assert d.replan == (phase is not ClaimPhase.DELETING)
    else:
        assert table["r1"].phase is after
    if phase is ClaimPhase.REQUESTED and listed:
        assert ClearRetry("r1") in d.actions  # a pending launch retry is moot
    if phase is ClaimPhase.LAUNCHED and not listed and after is not None:
        assert d.unlisted == {"r1"}


ADOPT_TABLE = [
    # (provider state, Node registered, cordoned) -> adopted phase
    (CloudNodeState.RUNNING, False, False, ClaimPhase.LAUNCHED),
    (CloudNodeState.RUNNING, True, False, ClaimPhase.INITIALIZED),  # Registered, then its GPUs are there
    (CloudNodeState.RUNNING, True, True, ClaimPhase.DRAINING),
    (CloudNodeState.DELETING, True, False, ClaimPhase.DELETING),
]


@pytest.mark.parametrize(("state", "registered", "cordoned", "phase"), ADOPT_TABLE)
def test_adoption_table(state: CloudNodeState, registered: bool, cordoned: bool, phase: ClaimPhase) -> None:
    nodes = {"node-1": k8s("node-1", cordoned=cordoned)} if registered else {}
    d = sync_claims({}, [cloud("r9", "n9", "node-1", state, at=5.0)], nodes, FLEET, RULES, 50.0)
    table = apply({}, d)
    assert table["r9"].phase is phase
    assert table["r9"].hourly_price == 0.6 and table["r9"].expected == T4.capacity
    assert kinds(d)[0] == "NodeClaimAdopted"
    if phase is ClaimPhase.LAUNCHED:
        assert table["r9"].since == 5.0  # timed from its creation: a node that never joins still times out


def test_a_second_node_of_one_request_is_its_own_claim() -> None:
    c = claim("r1", ClaimPhase.INITIALIZED, node_id="n1", name="node-1")
    listing = [cloud("r1", "n1", "node-1"), cloud("r1", "n2", "node-2")]
    d = sync_claims({"r1": c}, listing, {"node-1": k8s("node-1")}, FLEET, RULES, 10.0)
    table = apply({"r1": c}, d)
    assert set(table) == {"r1", "r1#n2"}
    assert table["r1#n2"].node_id == "n2"


def test_a_settled_listing_is_flagged_so_the_shell_may_skip_it() -> None:
    c = claim("r1", ClaimPhase.INITIALIZED, node_id="n1", name="node-1")
    d = sync_claims({"r1": c}, [cloud("r1", "n1", "node-1")], {}, FLEET, RULES, 10.0)
    assert d.settled and d.actions == []


def test_a_node_found_by_its_request_id_label_names_the_claim() -> None:
    c = claim("r1", ClaimPhase.LAUNCHED, node_id="n1")
    d = sync_claims({"r1": c}, [cloud("r1", "n1")], {"ip-10-0-0-1": k8s("ip-10-0-0-1", rid="r1")}, FLEET, RULES, 1.0)
    after = apply({"r1": c}, d)["r1"]
    assert after.node_name == "ip-10-0-0-1" and after.phase is ClaimPhase.INITIALIZED


def test_the_fleet_keeps_each_offering_answer_as_the_catalog_scan_gives_it() -> None:
    a100 = itype("a100-1", 16, 64, 1, "A100", price=3.0, zones=("z1", "z2"), spot=1.1)
    fleet = Fleet({"gpu": pool("gpu")}, catalog(T4, a100).by_name())
    asks = [(t, z, ct) for t in ("t4-1", "a100-1", "none") for z in ("z1", "z2", "z3") for ct in (OD, SPOT)]
    for _ in range(2):  # the second round is answered from the kept answers
        for t, z, ct in asks:
            it = {"t4-1": T4, "a100-1": a100}.get(t)
            want = next((o for o in it.offerings if o.zone == z and o.capacity_type is ct), None) if it else None
            assert fleet.offering(t, z, ct) is want
            assert fleet.price(t, z, ct) == (want.hourly_price if want else 0.0)
    assert fleet.offering("a100-1", "z2", SPOT) is a100.offerings[3] and fleet.offering("t4-1", "z2", OD) is None
    assert fleet == Fleet({"gpu": pool("gpu")}, catalog(T4, a100).by_name())  # the kept answers are no field


# ------------------------------------------------------------------------------------------------ deadlines
DEADLINE_TABLE = [
    (ClaimPhase.REQUESTED, 301.0, ClaimEvent.LAUNCH_TIMEOUT, 0),
    (ClaimPhase.LAUNCHED, 901.0, ClaimEvent.REGISTRATION_TIMEOUT, 1),
    (ClaimPhase.REGISTERED, 601.0, ClaimEvent.GPU_INIT_TIMEOUT, 2),
]


@pytest.mark.parametrize(("phase", "now", "event", "marks"), DEADLINE_TABLE)
def test_deadline_table(phase: ClaimPhase, now: float, event: ClaimEvent, marks: int) -> None:
    c = claim("r1", phase, name="node-1" if phase is not ClaimPhase.REQUESTED else "")
    assert expire_deadlines([("r1", c)], RULES, now - 2.0).actions == []  # not yet
    d = expire_deadlines([("r1", c)], RULES, now)
    after = apply({"r1": c}, d)["r1"]
    assert after.phase is ClaimPhase.FAILED and after.history[-1].event is event
    got = [a for a in d.actions if isinstance(a, MarkUnavailable)]
    assert len(got) == marks
    if event is ClaimEvent.GPU_INIT_TIMEOUT:
        assert {m.offering.capacity_type for m in got} == {OD, SPOT}
        assert all(m.until == now + RULES.gpu_init_unavailable_ttl_s for m in got)
    assert d.replan and kinds(d) == ["NodeClaimTimeout"]


# ------------------------------------------------------------------------------------------------ provider events
def test_spot_interruption_avoids_the_offering_and_drains_involuntarily() -> None:
    c = claim("r1", ClaimPhase.INITIALIZED, node_id="n1", name="node-1", ct=SPOT)
    ev = ProviderEvent(ProviderEventKind.SPOT_INTERRUPTION, node_id="n1", deadline=130.0)
    d = on_provider_events({"r1": c}, [ev], {"node-1": k8s("node-1")}, RULES, 10.0)
    assert d.actions[0] == MarkUnavailable(OfferingKey("t4-1", "z1", SPOT), 190.0, "spot interruption notice")
    assert Cordon("node-1") in d.actions and DrainStarted("r1", "node-1", True) in d.actions
    assert apply({"r1": c}, d)["r1"].phase is ClaimPhase.DRAINING
    assert d.replan and kinds(d) == ["SpotInterruption"]


def test_an_async_launch_failure_fails_the_claim_and_an_unknown_node_is_ignored() -> None:
    c = claim("r1", ClaimPhase.LAUNCHED, node_id="n1")
    events = [
        ProviderEvent(ProviderEventKind.LAUNCH_FAILED, request_id="r1", message="boom"),
        ProviderEvent(ProviderEventKind.NODE_FAILED, node_id="nobody"),
    ]
    d = on_provider_events({"r1": c}, events, {}, RULES, 10.0)
    assert apply({"r1": c}, d)["r1"].phase is ClaimPhase.FAILED
    assert [type(a).__name__ for a in d.actions] == ["SetClaim", "MarkUnavailable", "Note"]


def test_a_node_failure_drains_a_running_node_only() -> None:
    ok = claim("r1", ClaimPhase.INITIALIZED, node_id="n1", name="node-1")
    leaving = claim("r2", ClaimPhase.DELETING, node_id="n2", name="node-2")
    events = [ProviderEvent(ProviderEventKind.NODE_FAILED, node_id=n) for n in ("n1", "n2")]
    nodes = {"node-1": k8s("node-1", cordoned=True), "node-2": k8s("node-2")}
    d = on_provider_events({"r1": ok, "r2": leaving}, events, nodes, RULES, 10.0)
    table = apply({"r1": ok, "r2": leaving}, d)
    assert table["r1"].phase is ClaimPhase.DRAINING and table["r2"].phase is ClaimPhase.DELETING
    assert not any(isinstance(a, Cordon) for a in d.actions)  # already cordoned


# ------------------------------------------------------------------------------------------------ replacements
def test_a_replaced_node_drains_once_every_replacement_is_initialized_and_is_kept_if_one_fails() -> None:
    old = claim("old", ClaimPhase.INITIALIZED, node_id="n0", name="node-0")
    new = claim("new", ClaimPhase.REGISTERED, node_id="n1", name="node-1")
    table = {"old": old, "new": new}

    def by_name(name: str) -> tuple[str, NodeClaim] | None:
        return next(((k, c) for k, c in table.items() if c.node_name == name), None)

    reps = {"node-0": (("new",), "Underutilized")}
    assert progress_replacements(reps, table, by_name, {}, 5.0).actions == []  # still coming up
    table["new"] = replace(new, phase=ClaimPhase.INITIALIZED)
    d = progress_replacements(reps, table, by_name, {"node-0": k8s("node-0")}, 6.0)
    assert d.actions[0] == DropReplacement("node-0")
    assert apply(table, d)["old"].phase is ClaimPhase.DRAINING and kinds(d) == ["Drain"]
    table["new"] = replace(new, phase=ClaimPhase.FAILED)
    d = progress_replacements(reps, table, by_name, {}, 7.0)
    assert kinds(d) == ["ReplaceAborted"] and apply(table, d)["old"].phase is ClaimPhase.INITIALIZED


# ------------------------------------------------------------------------------------------------ launch verdicts
RL = LaunchRules(unavailable_ttl_s=180.0, max_backoff_s=600.0)
VERDICTS = [
    (InsufficientCapacity("no t4"), Outcome.CAPACITY, ClaimPhase.FAILED, ["MarkUnavailable"]),
    (QuotaExceeded("quota"), Outcome.QUOTA, ClaimPhase.FAILED, ["BackOff"]),
    (RateLimited("slow down", retry_after=7.0), Outcome.RETRY, ClaimPhase.REQUESTED, ["BackOff", "RetryAt"]),
    (TransientProviderError("503"), Outcome.RETRY, ClaimPhase.REQUESTED, ["RetryAt"]),
    (ProviderError("odd"), Outcome.RETRY, ClaimPhase.REQUESTED, ["RetryAt"]),
    (InvalidProviderRequest("bad", field="labels"), Outcome.FAILED, ClaimPhase.FAILED, ["BackOff"]),
    (AuthenticationError("denied"), Outcome.FAILED, ClaimPhase.FAILED, ["BackOff"]),
    (NotFound("gone"), Outcome.FAILED, ClaimPhase.FAILED, []),
    (InvalidProviderRequest("used", field="request_id"), Outcome.BURNT, None, ["BurnId"]),
]


@pytest.mark.parametrize(("exc", "outcome", "phase", "effects"), VERDICTS)
def test_launch_verdict_table(
    exc: ProviderError, outcome: Outcome, phase: ClaimPhase | None, effects: list[str]
) -> None:
    c = claim("r1", ClaimPhase.REQUESTED)
    v = judge_launch_error("r1", c, exc, attempts=0, pool=pool("gpu"), fallback_active=False, rules=RL, now=100.0)
    assert v.outcome is outcome
    assert [type(a).__name__ for a in v.actions if not isinstance(a, (SetClaim, Note))] == effects
    sets = [a.claim for a in v.actions if isinstance(a, SetClaim)]
    assert (sets[-1].phase if sets else (None if outcome is Outcome.BURNT else ClaimPhase.REQUESTED)) is phase


def test_rate_limit_waits_its_retry_after_and_transient_errors_double_from_the_policy_delay() -> None:
    c = claim("r1", ClaimPhase.REQUESTED)
    v = judge_launch_error(
        "r1", c, RateLimited("x", retry_after=7.0), attempts=0, pool=None, fallback_active=False, rules=RL, now=100.0
    )
    assert RetryAt("r1", 107.0) in v.actions and BackOff("gpu", 7.0, False, "x") in v.actions
    delays = []
    for n in range(4):
        v = judge_launch_error(
            "r1", c, TransientProviderError("t"), attempts=n, pool=None, fallback_active=False, rules=RL, now=0.0
        )
        delays.append(next(a.at for a in v.actions if isinstance(a, RetryAt)))
    assert delays == [1.0, 2.0, 4.0, 8.0]  # TransientProviderError's policy: 1 s base
    configured = replace(RL, retry_base_s=3.0)
    v = judge_launch_error(
        "r1", c, TransientProviderError("t"), attempts=1, pool=None, fallback_active=False, rules=configured, now=0.0
    )
    assert next(a.at for a in v.actions if isinstance(a, RetryAt)) == 6.0


def test_a_retryable_error_gives_up_after_the_policys_attempts() -> None:
    c = claim("r1", ClaimPhase.REQUESTED)
    limit = TransientProviderError("t").retry.max_attempts
    v = judge_launch_error(
        "r1", c, TransientProviderError("t"), attempts=limit - 1, pool=None, fallback_active=False, rules=RL, now=0.0
    )
    assert v.outcome is Outcome.FAILED
    assert "gave up after" in next(a for a in v.actions if isinstance(a, SetClaim)).claim.reason


def test_spot_capacity_error_opens_the_fallback_once() -> None:
    c = claim("r1", ClaimPhase.REQUESTED, ct=SPOT)
    spot_pool = pool("gpu", capacity_types=(SPOT,), allow_spot_fallback=True)
    for active in (False, True):
        v = judge_launch_error(
            "r1", c, InsufficientCapacity("x"), attempts=0, pool=spot_pool, fallback_active=active, rules=RL, now=0.0
        )
        assert AllowFallback("gpu", 180.0, announce=not active) in v.actions


def test_quota_backoff_uses_the_configured_base_else_the_policy() -> None:
    c = claim("r1", ClaimPhase.REQUESTED)
    for rules, base in ((RL, 60.0), (replace(RL, quota_backoff_s=5.0), 5.0)):
        v = judge_launch_error(
            "r1", c, QuotaExceeded("q"), attempts=0, pool=None, fallback_active=False, rules=rules, now=0.0
        )
        assert next(a for a in v.actions if isinstance(a, BackOff)).base_s == base


# ------------------------------------------------------------------------------------------------ properties
PHASES = list(ClaimPhase)
Observation = tuple[dict[str, NodeClaim], list[CloudNode], dict[str, Node], float]


@st.composite
def observations(draw: st.DrawFn) -> Observation:
    n = draw(st.integers(0, 6))
    claims: dict[str, NodeClaim] = {}
    listing: list[CloudNode] = []
    nodes: dict[str, Node] = {}
    for i in range(n):
        phase = draw(st.sampled_from([p for p in PHASES if p is not ClaimPhase.GONE]))
        known = draw(st.booleans())
        has_node = phase is not ClaimPhase.REQUESTED and (phase is not ClaimPhase.FAILED or draw(st.booleans()))
        name = f"node-{i}" if has_node and draw(st.booleans()) else ""
        since = float(draw(st.integers(0, 2000)))
        if known:
            claims[f"r{i}"] = claim(f"r{i}", phase, since=since, node_id=f"n{i}" if has_node else "", name=name)
        if draw(st.booleans()):
            state = draw(st.sampled_from([CloudNodeState.RUNNING, CloudNodeState.DELETING]))
            listing.append(cloud(f"r{i}", f"n{i}", name, state, at=since))
        if name and draw(st.booleans()):
            nodes[name] = k8s(name, draw(st.integers(0, 1)), cordoned=draw(st.booleans()))
    now = float(draw(st.integers(0, 3000)))
    return claims, listing, nodes, now


def _legal_history(c: NodeClaim) -> bool:
    return all(TRANSITIONS.get((t.source, t.event)) is t.target for t in c.history)


@settings(max_examples=300, deadline=None)
@given(observations())
def test_sync_decisions_are_legal_complete_and_a_fixpoint(obs: Observation) -> None:
    claims, listing, nodes, now = obs
    before = dict(claims)
    d = sync_claims(claims, listing, nodes, FLEET, RULES, now)
    assert claims == before  # pure: the inputs are not changed
    table = apply(claims, d)
    # every decided change follows the transition table
    assert all(_legal_history(c) for c in table.values())
    for a in d.actions:
        if isinstance(a, FinishClaim):
            assert a.claim.phase is ClaimPhase.GONE and _legal_history(a.claim)
    # every listed node is claimed, by exactly one claim
    node_ids = [c.node_id for c in table.values() if c.node_id]
    assert len(node_ids) == len(set(node_ids))
    assert {cn.node_id for cn in listing} <= set(node_ids)
    # a Requested claim is never lost, and only a claim the provider does not list is finished
    listed = {c.node_id for c in listing}
    for a in d.actions:
        if isinstance(a, FinishClaim):
            assert before[a.key].phase is not ClaimPhase.REQUESTED and before[a.key].node_id not in listed
    # a second sync of the same observation learns nothing
    again = sync_claims(table, listing, nodes, FLEET, RULES, now)
    assert apply(table, again) == table
    assert not any(isinstance(a, Note) for a in again.actions)


@settings(max_examples=200, deadline=None)
@given(observations(), st.lists(st.sampled_from(list(ProviderEventKind)), max_size=4), st.randoms())
def test_events_and_deadlines_only_take_allowed_edges(
    obs: Observation, event_kinds: list[ProviderEventKind], rnd: random.Random
) -> None:
    claims, _, nodes, now = obs
    keys = list(claims) or ["nobody"]
    events = [
        ProviderEvent(k, node_id=claims[key].node_id if key in claims else "", request_id=key)
        for k in event_kinds
        for key in [rnd.choice(keys)]
    ]
    d = on_provider_events(claims, events, nodes, RULES, now)
    table = apply(claims, d)
    assert all(_legal_history(c) for c in table.values())
    drained = [a.key for a in d.actions if isinstance(a, DrainStarted)]
    assert len(drained) == len(set(drained))  # a claim starts draining once
    timed = list(table.items())
    d2 = expire_deadlines(timed, RULES, now)
    after = apply(table, d2)
    assert all(_legal_history(c) for c in after.values())
    for key, c in after.items():
        if c is not table[key]:
            assert c.phase is ClaimPhase.FAILED and table[key].phase in (
                ClaimPhase.REQUESTED,
                ClaimPhase.LAUNCHED,
                ClaimPhase.REGISTERED,
            )


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(
        [
            InsufficientCapacity("c"),
            QuotaExceeded("q"),
            RateLimited("r", retry_after=3.0),
            TransientProviderError("t"),
            ProviderError("p"),
            InvalidProviderRequest("i", field="labels"),
            InvalidProviderRequest("i", field="request_id"),
            AuthenticationError("a"),
            NotFound("n"),
        ]
    ),
    st.integers(0, 12),
    st.floats(0, 1e6),
)
def test_a_verdict_never_retries_in_the_past_and_never_both_fails_and_retries(
    exc: ProviderError, attempts: int, now: float
) -> None:
    c = claim("r1", ClaimPhase.REQUESTED)
    v = judge_launch_error("r1", c, exc, attempts=attempts, pool=None, fallback_active=False, rules=RL, now=now)
    retries = [a for a in v.actions if isinstance(a, RetryAt)]
    failed = [a for a in v.actions if isinstance(a, SetClaim) and a.claim.phase is ClaimPhase.FAILED]
    burnt = [a for a in v.actions if isinstance(a, BurnId)]
    assert all(r.at > now for r in retries) and all(r.at - now <= RL.max_backoff_s for r in retries)
    assert len(retries) + len(failed) + len(burnt) == 1  # exactly one fate for the claim
    assert (v.outcome is Outcome.RETRY) == bool(retries)
    assert any(isinstance(a, Note) and a.kind in (EventKind.LAUNCH_FAILED, EventKind.LAUNCH_RETRY) for a in v.actions)


# ------------------------------------------------------------------------------------------------ draining, orphans
def _bound(name: str, node_name: str, *, web: bool = False, pinned: bool = False) -> Pod:
    return Pod(
        name,
        request=Request(cpu_milli=1000, memory_mib=1024, gpus=0),
        node_name=node_name,
        phase="Running",
        labels={"app": "web"} if web else {},
        annotations={DO_NOT_DISRUPT_ANNOTATION: "true"} if pinned else {},
    )


def test_drain_step_table() -> None:
    draining = claim("d", ClaimPhase.DRAINING, node_id="n1", name="node-1")
    empty = claim("e", ClaimPhase.DRAINING, node_id="n2", name="node-2")
    failed = claim("f", ClaimPhase.FAILED, node_id="n3", name="node-3")
    nothing = claim("x", ClaimPhase.FAILED)
    deleting = claim("g", ClaimPhase.DELETING, node_id="n4", name="node-4")
    later = claim("h", ClaimPhase.DELETING, node_id="n5", name="node-5")
    pods = [_bound("free", "node-1"), _bound("pinned", "node-1", pinned=True), _bound("web", "node-1", web=True)]
    pods.append(replace(_bound("ds", "node-2"), is_daemonset=True))
    by_node: dict[str, list[Pod]] = {}
    for p in pods:
        by_node.setdefault(str(p.node_name), []).append(p)
    nodes = {f"node-{i}": k8s(f"node-{i}") for i in range(1, 6)}
    pdb = PodDisruptionBudget("web", "default", {"app": "web"}, max_unavailable=0)
    leaving = [(c.request_id, c) for c in (draining, empty, failed, nothing, deleting, later)]
    d = drain_step(leaving, by_node, nodes, pods, [pdb], set(), {"h": 500.0}, 100.0)
    table = apply({k: c for k, c in leaving}, d)
    assert Evict("default/free", "d", "node-1", draining.reason) in d.actions
    blocked = {a.pod: a.reason for a in d.actions if isinstance(a, EvictBlocked)}
    assert blocked == {"default/pinned": "DoNotDisrupt", "default/web": "PodDisruptionBudget"}
    assert table["e"].phase is ClaimPhase.DELETING  # only a DaemonSet pod left: drained
    assert table["f"].phase is ClaimPhase.DELETING and "x" not in table
    assert [a.key for a in d.actions if isinstance(a, DeleteNode)] == ["e", "f", "g"]  # h's recheck is not due
    # an involuntary drain (spot reclaim) does not wait for do-not-disrupt
    d = drain_step([("d", draining)], by_node, nodes, pods, [pdb], {"d"}, {}, 100.0)
    assert {a.pod for a in d.actions if isinstance(a, Evict)} == {"default/free", "default/pinned"}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.booleans()), max_size=12), st.integers(0, 3))
def test_evictions_never_exceed_a_pdb_and_never_move_a_pinned_pod_voluntarily(
    layout: list[tuple[int, bool, bool]], allowed: int
) -> None:
    pods = [_bound(f"p{i}", f"node-{n}", web=web, pinned=pin) for i, (n, web, pin) in enumerate(layout)]
    by_node: dict[str, list[Pod]] = {}
    for p in pods:
        by_node.setdefault(str(p.node_name), []).append(p)
    nodes = {f"node-{i}": k8s(f"node-{i}") for i in range(3)}
    leaving = [(f"r{i}", claim(f"r{i}", ClaimPhase.DRAINING, node_id=f"n{i}", name=f"node-{i}")) for i in range(3)]
    pdb = PodDisruptionBudget("web", "default", {"app": "web"}, max_unavailable=allowed)
    d = drain_step(leaving, by_node, nodes, pods, [pdb], set(), {}, 0.0)
    evicted = {a.pod for a in d.actions if isinstance(a, Evict)}
    web = {p.key for p in pods if p.labels}
    assert len(evicted & web) <= allowed
    assert not evicted & {p.key for p in pods if p.annotations}
    # every pod of a draining node is either evicted or held with a reason
    held = {a.pod for a in d.actions if isinstance(a, EvictBlocked)}
    assert evicted | held == {p.key for p in pods} and not evicted & held


def test_orphan_step_waits_out_the_grace_period() -> None:
    labelled = {"a": k8s("a", rid="gone"), "b": k8s("b", rid="r1"), "c": k8s("c", rid="listed")}
    claims = {"r1": claim("r1", ClaimPhase.INITIALIZED, node_id="n1", name="b")}
    first = orphan_step(labelled.values(), claims, lambda n: n == "b", {"listed"}, {}, 30.0, 100.0)
    assert first.remove == [] and first.since == {"a": 100.0}
    later = orphan_step(labelled.values(), claims, lambda n: n == "b", {"listed"}, first.since, 30.0, 130.0)
    assert later.remove == [RemoveOrphan("a", "gone")] and later.since == {}


def test_capped_backoff_doubles_from_the_base_up_to_the_cap_and_never_overflows() -> None:
    from gpuscale.core.reconcile import capped_backoff_s

    assert [capped_backoff_s(n, 1.0, 60.0) for n in (0, 1, 2, 3, 6, 7, 8)] == [1.0, 1.0, 2.0, 4.0, 32.0, 60.0, 60.0]
    assert capped_backoff_s(3, 2.5, 1e9) == 10.0
    # a failure count past a float's exponent (an API server down for days at 60 s retries) stays at the cap
    assert capped_backoff_s(2_000, 1.0, 60.0) == 60.0
    assert capped_backoff_s(10**6, 3.0, 3600.0) == 3600.0
