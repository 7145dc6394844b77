"""The launcher (controller.launcher): idempotent request ids, one provider call per due claim, verdicts carried out
(claim transitions, offering marks, back-offs, retries at due times), never a sleep."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.controller.availability import Availability
from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.launcher import Launcher
from gpuscale.core.model import CapacityType, NodePool, OfferingKey
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim, new_claim
from gpuscale.core.reconcile import LaunchRules, Note, Outcome
from gpuscale.errors import InsufficientCapacity, ProviderError, QuotaExceeded, RateLimited, TransientProviderError
from gpuscale.providers.base import (
    CloudNode,
    CloudNodeState,
    LaunchRequest,
    ProviderCapabilities,
    ProviderEvent,
)

OD = CapacityType.ON_DEMAND


class Cloud:
    """A stateful provider: one node per request id (idempotent), queued faults, every call counted."""

    name = "fake"

    def __init__(self) -> None:
        self.nodes: dict[str, CloudNode] = {}
        self.faults: list[ProviderError] = []
        self.calls: list[str] = []

    @property
    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities()

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        self.calls.append(request.request_id)
        if self.faults:
            raise self.faults.pop(0)
        if request.request_id not in self.nodes:
            n = len(self.nodes) + 1
            self.nodes[request.request_id] = CloudNode(
                f"n{n}", request.request_id, request.pool, request.instance_type, request.zone, OD,
                CloudNodeState.PROVISIONING, node_name=f"node-{n}",
            )  # fmt: skip
        return [self.nodes[request.request_id]]

    def delete_node(self, node_id: str) -> None:
        self.nodes = {k: v for k, v in self.nodes.items() if v.node_id != node_id}

    def list_nodes(self) -> Sequence[CloudNode]:
        return list(self.nodes.values())

    def poll_errors(self) -> Sequence[ProviderEvent]:
        return []


def setup() -> tuple[Launcher, Cloud, ClaimTable, list[Note], Availability]:
    cloud = Cloud()
    notes: list[Note] = []
    av = Availability()
    return Launcher(cloud, av, LaunchRules(quota_backoff_s=60.0), notes.append), cloud, ClaimTable(), notes, av


def add(launcher: Launcher, claims: ClaimTable, seed: tuple[str, ...]) -> str:
    rid = launcher.request_id(seed, claims)
    claims[rid] = new_claim(rid, "gpu", "g1", "z1", OD, 0.0)
    return rid


def request(c: NodeClaim) -> LaunchRequest:
    return LaunchRequest(c.request_id, c.pool, c.instance_type, c.zone, c.capacity_type)


def test_request_ids_are_deterministic_and_never_reused() -> None:
    launcher, _, claims, _, _ = setup()
    a = launcher.request_id(("up", "gpu", "g1", "p1"), claims)
    assert a == launcher.request_id(("up", "gpu", "g1", "p1"), claims)  # a restart asks again under the same id
    assert a.startswith("gs-") and a != launcher.request_id(("up", "gpu", "g1", "p2"), claims)
    claims[a] = new_claim(a, "gpu", "g1", "z1", OD, 0.0)
    assert launcher.request_id(("up", "gpu", "g1", "p1"), claims) == f"{a}-1"  # in use
    del claims[a]
    launcher.forget(a)
    assert launcher.request_id(("up", "gpu", "g1", "p1"), claims) == f"{a}-1"  # burnt


def test_a_launch_is_one_call_and_moves_the_claim_to_launched() -> None:
    launcher, cloud, claims, notes, av = setup()
    av.back_off("gpu", 0.0, 1.0, 600.0)
    rid = add(launcher, claims, ("s",))
    assert launcher.launch(rid, request(claims[rid]), claims, None, 5.0) is Outcome.OK
    assert cloud.calls == [rid] and claims[rid].phase is ClaimPhase.LAUNCHED and claims[rid].node_id == "n1"
    assert "gpu" not in av.backoffs  # a success ends the pool's back-off
    assert [str(n.kind) for n in notes] == ["ScaleUp"]


def test_a_capacity_error_fails_the_claim_and_marks_the_offering() -> None:
    launcher, cloud, claims, notes, av = setup()
    cloud.faults = [InsufficientCapacity("none")]
    rid = add(launcher, claims, ("s",))
    assert launcher.launch(rid, request(claims[rid]), claims, NodePool("gpu"), 10.0) is Outcome.CAPACITY
    assert claims[rid].phase is ClaimPhase.FAILED
    assert av.offerings[OfferingKey("g1", "z1", OD)] == 190.0
    assert [str(n.kind) for n in notes] == ["LaunchFailed", "OfferingUnavailable"]


def test_retryable_errors_wait_for_their_due_time_and_keep_the_id() -> None:
    launcher, cloud, claims, _, av = setup()
    cloud.faults = [RateLimited("slow", retry_after=7.0), TransientProviderError("503")]
    rid = add(launcher, claims, ("s",))
    assert launcher.launch(rid, request(claims[rid]), claims, None, 0.0) is Outcome.RETRY
    assert not launcher.due(rid, 6.9) and launcher.due(rid, 7.0)
    assert av.backed_off("gpu", 6.9)
    assert launcher.launch(rid, request(claims[rid]), claims, None, 7.0) is Outcome.RETRY
    assert launcher.retry_at[rid] == 8.0 and launcher.attempts[rid] == 1
    assert launcher.launch(rid, request(claims[rid]), claims, None, 8.0) is Outcome.OK
    assert cloud.calls == [rid, rid, rid] and len(cloud.nodes) == 1
    assert rid not in launcher.retry_at and rid not in launcher.attempts


def test_a_quota_error_backs_the_pool_off_exponentially() -> None:
    launcher, cloud, claims, notes, av = setup()
    for i, now in enumerate((0.0, 100.0)):
        cloud.faults = [QuotaExceeded("quota")]
        rid = add(launcher, claims, (str(i),))
        assert launcher.launch(rid, request(claims[rid]), claims, None, now) is Outcome.QUOTA
    assert av.backoffs["gpu"].until == 100.0 + 120.0
    assert [n.message.rsplit(" ", 1)[-1] for n in notes if str(n.kind) == "Backoff"] == ["60s", "120s"]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(["ok", "rate", "transient", "quota", "capacity", "other"]),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.floats(0.0, 30.0), min_size=8, max_size=8),
)
def test_a_claim_is_only_ever_tried_when_due_and_ends_in_one_state(outcomes: list[str], gaps: list[float]) -> None:
    """Whatever errors come back, a caller that tries only due claims calls the provider at or after each due
    time, under one request id, and the claim ends Launched, Failed, or still Requested with a retry pending."""
    errors: dict[str, ProviderError] = {
        "rate": RateLimited("r", retry_after=3.0),
        "transient": TransientProviderError("t"),
        "quota": QuotaExceeded("q"),
        "capacity": InsufficientCapacity("c"),
        "other": ProviderError("p"),
    }
    launcher, cloud, claims, _, _ = setup()
    cloud.faults = [errors[o] for o in outcomes if o != "ok"]  # then the cloud answers
    rid = add(launcher, claims, ("s",))
    now, called_at, dues = 0.0, [], []
    for gap in gaps:
        if claims[rid].phase is not ClaimPhase.REQUESTED:
            break
        now += gap
        if not launcher.due(rid, now):
            continue
        dues.append(launcher.retry_at.get(rid, 0.0))
        called_at.append(now)
        launcher.launch(rid, request(claims[rid]), claims, None, now)
    assert all(t >= d for t, d in zip(called_at, dues, strict=True))
    assert set(cloud.calls) <= {rid} and len(cloud.calls) == len(called_at)
    phase = claims[rid].phase
    assert phase in (ClaimPhase.LAUNCHED, ClaimPhase.FAILED, ClaimPhase.REQUESTED)
    if phase is ClaimPhase.REQUESTED and called_at:
        assert rid in launcher.retry_at and launcher.retry_at[rid] > called_at[-1]
