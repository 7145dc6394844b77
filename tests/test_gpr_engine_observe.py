"""In engine mode the controller is the provider's one reader: its observe step lists the provider and polls its events
once a round and keeps, for the GPR manager, the last node list and the GPR launches' events until the manager takes
them (controller/gprnodes.py ``GprFeed``, ``gpr_observation``; gpr/manager.py ``_observe``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builders import ONE_CLOUD as CATALOG
from builders import ONE_CLOUD_FAST as FAST
from builders import ONE_CLOUD_POOL as POOL
from builders import pod
from gpuscale.clock import Clock
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.gprnodes import GprFeed, request_of
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.gpr import GprState, TransitionRecord, Trigger, is_gpr_request_id
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.core.plan import PlannerConfig
from gpuscale.errors import TransientProviderError
from gpuscale.gpr.manager import GprManager, ReconcileReport
from gpuscale.gpr.store import GprStore, StaleWrite
from gpuscale.providers.base import CloudNode, CloudNodeState, ProviderEvent, ProviderEventKind
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine
from test_engine_gprs import SPEC

GPR_RID = "gpr-0123456789abcdef-a1"


class CountingCloud(SimCloud):
    """The simulated cloud, counting the calls that read it; ``report`` queues an event it reports at the next poll
    (a node failure: the simulated cloud has no such fault of its own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.list_calls = 0
        self.poll_calls = 0
        self.reported: list[ProviderEvent] = []

    def list_nodes(self) -> Sequence[CloudNode]:
        self.list_calls += 1
        return super().list_nodes()

    def poll_errors(self) -> Sequence[ProviderEvent]:
        self.poll_calls += 1
        out = [*self.reported, *super().poll_errors()]
        self.reported = []
        return out

    def report(self, event: ProviderEvent) -> None:
        self.reported.append(event)


class Rig:
    """Simulated cloud and cluster, the controller, and a GPR manager on it; ``gpr_first``: in each tick the
    manager's pass runs before the controller's round (as in the simulator), else after it (as in the cluster)."""

    def __init__(self, tmp_path: Path, *, gpr_first: bool = True) -> None:
        self.engine = Engine()
        self.cluster = SimCluster(self.engine, CATALOG, [POOL], seed=1)
        self.cloud = CountingCloud(self.engine, CATALOG, FAST, seed=1, listener=self.cluster)
        self.db = tmp_path / "gpr.db"
        self.gpr_first = gpr_first
        self.reports: list[ReconcileReport] = []
        self.ticks = 0
        self.restart()

    def restart(self) -> None:
        clock: Clock = self.engine.clock
        cfg = ControllerConfig(planner=PlannerConfig(exact_solver=False))
        self.ctrl = Controller(self.cluster, self.cloud, [POOL], CATALOG, clock, cfg)
        self.manager = GprManager(GprStore(self.db), CATALOG, provider=self.cloud, clock=clock, engine=self.ctrl)

    def tick(self) -> None:
        if self.gpr_first:
            self.reports.append(self.manager.reconcile())
            self.ctrl.reconcile()
        else:
            self.ctrl.reconcile()
            self.reports.append(self.manager.reconcile())
        self.cluster.schedule()
        self.ticks += 1

    def run(self, until: float, step: float = 2.0) -> None:
        t = self.engine.now()
        while t < until:
            t += step
            self.engine.run_until(t)
            self.tick()

    def transitions(self, gid: str) -> list[TransitionRecord]:
        return [t for r in self.reports for t in r.transitions if t.gpr_id == gid]

    def events(self, reason: str, obj: str | None = None) -> list[str]:
        return [e.object for e in self.cluster.events if e.reason == reason and (obj is None or e.object == obj)]

    def pod_nodes(self) -> list[CloudNode]:
        return [n for n in self.cloud.alive() if not is_gpr_request_id(n.request_id)]

    def gpr_nodes(self) -> list[CloudNode]:
        return sorted((n for n in self.cloud.alive() if is_gpr_request_id(n.request_id)), key=lambda n: n.node_id)

    def provisioned(self) -> str:
        """A GPR of two nodes, provisioned."""
        gid = self.manager.create(SPEC).gpr_id
        self.run(self.engine.now() + 60.0)
        assert self.manager.get(gid).state is GprState.PROVISIONED
        return gid


def _ev(kind: ProviderEventKind, rid: str, node: str = "n1", msg: str = "") -> ProviderEvent:
    return ProviderEvent(kind, node_id=node, request_id=rid, message=msg)


# ----------------------------------------------------------------------------------------------- the queue itself
def test_the_feed_queues_only_gpr_events_and_gives_each_once() -> None:
    feed = GprFeed()
    assert feed.take() is None  # nothing observed yet: the manager waits
    cloud = (CloudNode("n1", GPR_RID, "gpu", "t", "z", CATALOG.instance_types[0].offerings[0].capacity_type,
                       CloudNodeState.RUNNING),)  # fmt: skip
    pods = _ev(ProviderEventKind.SPOT_INTERRUPTION, "r-pods-1")
    failed = _ev(ProviderEventKind.LAUNCH_FAILED, GPR_RID, msg="instance n1 failed to start")
    feed.observed(cloud, [pods, failed])
    assert len(feed) == 1 and feed.news()
    taken = feed.take()
    assert taken is not None and taken[0] is cloud and taken[1] == [failed]
    assert not feed.news()
    assert feed.take() == (cloud, [])  # the list again, the event never twice
    again = replace(failed, message="still failed")  # the same event reported again before it was taken: kept once
    feed.observed(cloud, [failed])
    feed.observed(cloud, [again])
    assert feed.take() == (cloud, [again])


def test_the_feed_is_bounded_dropping_the_oldest_and_keeps_events_over_a_failed_observation() -> None:
    feed = GprFeed(limit=3)
    evs = [_ev(ProviderEventKind.NODE_FAILED, f"gpr-0123456789abcdef-a{i}", node=f"n{i}") for i in range(5)]
    feed.observed((), evs[:2])
    feed.observed((), evs[2:])
    assert len(feed) == 3 and feed.dropped == 2
    error = TransientProviderError("list_nodes: request timed out", provider="sim")
    feed.failed(error)
    with pytest.raises(TransientProviderError):
        feed.take()
    assert len(feed) == 3  # kept for the manager's next pass
    feed.observed((), [])
    assert feed.take() == ((), evs[2:])


def test_the_feed_says_when_a_round_brought_gpr_news() -> None:
    feed = GprFeed()
    od = CATALOG.instance_types[0].offerings[0].capacity_type
    gpr = CloudNode("n1", GPR_RID, "gpu", "t", "z", od, CloudNodeState.RUNNING)
    pods = CloudNode("n2", "r-pods-1", "gpu", "t", "z", od, CloudNodeState.RUNNING)
    feed.observed((pods,), [])
    assert not feed.fresh  # no GPR node
    feed.observed((pods, gpr), [])
    assert feed.fresh
    feed.observed((replace(pods, state=CloudNodeState.READY), gpr), [])
    assert not feed.fresh  # only a pod node changed
    feed.observed((pods, replace(gpr, state=CloudNodeState.READY)), [])
    assert feed.fresh
    feed.observed((pods,), [])
    assert feed.fresh  # the GPR node left
    feed.observed((pods,), [_ev(ProviderEventKind.LAUNCH_FAILED, GPR_RID)])
    assert feed.fresh


def test_the_controller_asks_for_a_look_just_after_a_round_with_gpr_news(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.manager.create(SPEC)
    rig.run(4.0)  # 2 s: the pass waits, the first round observes; 4 s: the pass launches, the round sees the nodes
    assert rig.reports[0].skipped and rig.reports[1].launched
    now = rig.engine.now()
    assert rig.ctrl.next_wakeup() == pytest.approx(now, abs=1e-3)
    rig.manager.reconcile()  # the manager takes them; the next round sees no change
    rig.ctrl.reconcile()
    wake = rig.ctrl.next_wakeup()
    assert wake is None or wake > now + 1.0


# ----------------------------------------------------------------------------------------------- one reader
@pytest.mark.parametrize("gpr_first", [True, False])
def test_in_engine_mode_the_provider_is_listed_and_polled_once_a_tick(tmp_path: Path, gpr_first: bool) -> None:
    rig = Rig(tmp_path, gpr_first=gpr_first)
    rig.manager.create(SPEC)
    rig.cluster.add_pod(pod("web-0", gpus=1), 3600.0)
    rig.run(80.0)
    assert rig.manager.list_gprs((GprState.PROVISIONED,))
    assert rig.ticks == 40
    assert rig.cloud.list_calls == rig.ticks  # the controller's observe step only
    assert rig.cloud.poll_calls == rig.ticks


def test_without_an_engine_the_manager_reads_the_provider_itself(tmp_path: Path) -> None:
    engine = Engine()
    cloud = CountingCloud(engine, CATALOG, FAST, seed=1)
    manager = GprManager(GprStore(tmp_path / "gpr.db"), CATALOG, provider=cloud, clock=engine.clock)
    gid = manager.create(SPEC).gpr_id
    for t in range(2, 62, 2):
        engine.run_until(float(t))
        manager.reconcile()
    assert cloud.list_calls == cloud.poll_calls == 30
    assert manager.get(gid).state is GprState.PROVISIONED


# ----------------------------------------------------------------------------------------------- pod nodes' events
@pytest.mark.parametrize("gpr_first", [True, False])
def test_a_spot_notice_for_a_pod_node_is_handled_by_the_controller_while_gprs_exist(
    tmp_path: Path, gpr_first: bool
) -> None:
    rig = Rig(tmp_path, gpr_first=gpr_first)
    rig.provisioned()
    rig.cluster.add_pod(pod("web-0", gpus=1), 3600.0)
    rig.run(rig.engine.now() + 60.0)
    (node,) = rig.pod_nodes()
    rig.cloud.interrupt(node.node_id)  # polled in the next tick; the GPR pass runs first in it when gpr_first
    rig.run(rig.engine.now() + 2.0)
    assert [o for o in rig.events("SpotInterruption") if o.startswith("node/")] == [f"node/{node.node_name}"]
    claim = rig.ctrl.claims.get(node.request_id)
    assert claim is not None and claim.phase is ClaimPhase.DRAINING
    assert len(rig.ctrl.gpr.feed) == 0  # not a GPR's: never queued for the manager


@pytest.mark.parametrize("gpr_first", [True, False])
def test_a_pod_nodes_launch_failure_is_handled_by_the_controller_while_gprs_exist(
    tmp_path: Path, gpr_first: bool
) -> None:
    rig = Rig(tmp_path, gpr_first=gpr_first)
    rig.provisioned()
    passes = len(rig.reports)
    rig.cloud.behaviour = replace(FAST, launch_failure_rate=1.0)
    rig.cluster.add_pod(pod("web-0", gpus=1), 3600.0)
    rig.run(rig.engine.now() + 20.0)  # launched after the batch window, failed 5 s later, polled in the next tick
    failed = [e.object.removeprefix("nodeclaim/") for e in rig.cluster.events if e.reason == "LaunchFailed"]
    assert failed and not [k for k in failed if is_gpr_request_id(request_of(k))]
    assert not [k for k in failed if rig.ctrl.claims.get(k) is not None]  # each failed claim finished
    assert rig.ctrl.availability.offerings  # the offering is avoided
    assert not [r for r in rig.reports[passes:] if r.transitions]  # the GPR is untouched


# ----------------------------------------------------------------------------------------------- GPR nodes' events
@pytest.mark.parametrize("requeue", [False, True])
@pytest.mark.parametrize("gpr_first", [True, False])
def test_a_gpr_launch_failure_reaches_the_manager_even_when_the_controller_polls_first(
    tmp_path: Path, gpr_first: bool, requeue: bool
) -> None:
    rig = Rig(tmp_path, gpr_first=gpr_first)
    rig.cloud.behaviour = replace(FAST, launch_failure_rate=1.0)
    gid = rig.manager.create({**SPEC, "requeueOnFailure": requeue}).gpr_id
    rig.run(12.0)  # launched at 2 s (or 4 s), failed 5 s later, polled by the controller, taken by the manager
    moves = [(t.from_state, t.to_state, t.trigger) for t in rig.transitions(gid)]
    failed = (GprState.PROVISIONING, GprState.FAILED, Trigger.PROVISIONING_FAILED)
    assert moves.count(failed) == 1
    (fail,) = [t for t in rig.transitions(gid) if t.trigger is Trigger.PROVISIONING_FAILED]
    assert "failed to start" in fail.reason  # the provider's event, not a provisioning timeout
    if requeue:  # per the GPR core: queued again, and a new attempt launched under a new request id
        assert moves[moves.index(failed) + 1] == (GprState.FAILED, GprState.QUEUED, Trigger.REQUEUE)
    else:
        assert rig.manager.get(gid).state is GprState.FAILED
    gpr_claims = {k: c.phase for k, c in rig.ctrl.claims.items() if is_gpr_request_id(request_of(k))}
    assert ClaimPhase.INITIALIZED not in gpr_claims.values()
    assert rig.events("LaunchFailed")  # the engine handled its claims' failure too
    assert rig.cloud.counters.duplicate_nodes == 0


def test_a_gpr_nodes_failure_gets_one_reaction_the_engine_drains_it_the_manager_fails_the_gpr(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    gid = rig.provisioned()
    first, second = rig.gpr_nodes()
    deletes_before = rig.cloud.counters.delete_calls
    rig.cloud.report(_ev(ProviderEventKind.NODE_FAILED, first.request_id, first.node_id, "GPU fell off the bus"))
    rig.run(rig.engine.now() + 20.0)
    # the engine: drained and deleted the failed node once
    assert rig.events("NodeFailed") == [f"node/{first.node_name}"]
    assert len([e for e in rig.cluster.events if e.kind == str(EventKind.DELETE)
                and e.object == f"node/{first.node_name}"]) == 1  # fmt: skip
    assert first.node_id not in {n.node_id for n in rig.cloud.alive()}
    # the manager: the GPR failed once, because its node was lost; it deleted nothing itself
    moves = [(t.from_state, t.to_state, t.trigger) for t in rig.transitions(gid)]
    assert moves.count((GprState.PROVISIONED, GprState.FAILED, Trigger.NODE_LOST)) == 1
    assert rig.manager.get(gid).state is GprState.FAILED
    assert first.node_id not in [d for r in rig.reports for d in r.deleted]
    # its other node follows the GPR's release (Consolidate by default): given back to the pool, not deleted
    assert rig.events("GprReleased", f"node/{second.node_name}")
    assert second.node_id in {n.node_id for n in rig.cloud.alive()}
    assert rig.cloud.counters.delete_calls - deletes_before == 1
    assert rig.cloud.counters.duplicate_nodes == 0


def test_a_provisioning_gprs_node_failure_fails_the_attempt_once_and_the_engine_deletes_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    gid = rig.manager.create(SPEC).gpr_id
    rig.run(6.0)  # launched, not up yet
    assert rig.manager.get(gid).state is GprState.PROVISIONING
    first, second = rig.gpr_nodes()
    rig.cloud.report(_ev(ProviderEventKind.NODE_FAILED, first.request_id, first.node_id, "GPU fell off the bus"))
    rig.run(30.0)
    assert rig.events("NodeFailed") == [f"node/{first.node_name}"]  # the engine drained it
    assert len([e for e in rig.cluster.events if e.kind == str(EventKind.DELETE)
                and e.object == f"node/{first.node_name}"]) == 1  # fmt: skip
    moves = [(t.from_state, t.to_state, t.trigger, t.reason) for t in rig.transitions(gid)]
    failed = (GprState.PROVISIONING, GprState.FAILED, Trigger.PROVISIONING_FAILED, "GPU fell off the bus")
    assert moves.count(failed) == 1 and rig.manager.get(gid).state is GprState.FAILED
    assert first.node_id not in {n.node_id for n in rig.cloud.alive()}
    # the attempt's other node is released by the manager and given back by the engine (Consolidate), once
    assert rig.events("GprReleased") == [f"node/{second.node_name}"]
    assert rig.cloud.counters.duplicate_nodes == 0


# ----------------------------------------------------------------------------------------------- restart
def test_after_a_restart_the_manager_waits_for_the_engines_first_observation(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    gid = rig.provisioned()
    rig.restart()
    calls = rig.cloud.list_calls
    report = rig.manager.reconcile()  # before the new controller's first round
    assert report.skipped == "waiting for the node engine's first observation of the provider"
    assert not report.transitions and not report.launched and not report.deleted
    assert rig.cloud.list_calls == calls  # it did not read the provider itself
    rig.ctrl.reconcile()
    assert rig.cloud.list_calls == calls + 1
    report = rig.manager.reconcile()
    assert report.skipped == "" and not report.transitions and not report.launched
    assert rig.manager.get(gid).state is GprState.PROVISIONED
    assert rig.cloud.list_calls == calls + 1


def test_the_manager_skips_a_pass_when_the_engine_could_not_observe(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    gid = rig.provisioned()
    rig.ctrl.gpr.feed.failed(TransientProviderError("list_nodes: request timed out", provider="sim"))
    report = rig.manager.reconcile()
    assert report.skipped.startswith("cannot list provider nodes") and not report.transitions
    rig.ctrl.reconcile()
    assert rig.manager.reconcile().skipped == ""
    assert rig.manager.get(gid).state is GprState.PROVISIONED


class RacingStore(GprStore):
    """A GPR store whose next plan write loses a race (another writer changed a GPR meanwhile) when ``race`` is set."""

    race = False

    def apply(self, *args: Any, **kwargs: Any) -> list[int]:
        if self.race:
            self.race = False
            raise StaleWrite("a GPR changed since it was read")
        return super().apply(*args, **kwargs)


def test_a_failure_taken_by_a_pass_whose_plan_is_dropped_is_seen_by_the_next(tmp_path: Path) -> None:
    rig = Rig(tmp_path, gpr_first=False)
    store = RacingStore(rig.db)
    rig.manager = GprManager(store, CATALOG, provider=rig.cloud, clock=rig.engine.clock, engine=rig.ctrl)
    rig.cloud.behaviour = replace(FAST, launch_failure_rate=1.0)
    gid = rig.manager.create(SPEC).gpr_id
    rig.run(6.0)  # launched at 2 s; fails at 7 s
    assert rig.manager.get(gid).state is GprState.PROVISIONING
    store.race = True
    rig.engine.run_until(8.0)
    rig.ctrl.reconcile()  # polls the failure and queues it
    dropped = rig.manager.reconcile()  # takes it, but its plan is dropped
    assert dropped.skipped.startswith("plan dropped") and len(rig.ctrl.gpr.feed) == 0
    report = rig.manager.reconcile()
    (fail,) = [t for t in report.transitions if t.trigger is Trigger.PROVISIONING_FAILED]
    assert "failed to start" in fail.reason
