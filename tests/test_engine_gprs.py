"""One engine for pods and GPRs: the GPR manager hands its launches and releases to the node controller, whose claim
table, availability record and node lifecycle then carry the nodes of both (controller/gprnodes.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
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
from gpuscale.controller.gprnodes import request_of
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.gpr import GprState, gpr_toleration, is_gpr_request_id
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.core.plan import PlannerConfig
from gpuscale.errors import ProviderError
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.store import GprStore
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine

SPEC = {
    "requestName": "train",
    "gpuShape": "RTX4000-Ada",
    "numberOfGPUs": 1,
    "numberOfGPUNodes": 2,
    "exitDuration": "8h",
    "workloadSelector": {"app": "train"},
}


class _Rig:
    """A simulated cloud and cluster, the node controller and a GPR manager whose engine is that controller."""

    def __init__(self, tmp_path: Path) -> None:
        self.engine = Engine()
        self.cluster = SimCluster(self.engine, CATALOG, [POOL], seed=1)
        self.cloud = SimCloud(self.engine, CATALOG, FAST, seed=1, listener=self.cluster)
        self.db = tmp_path / "gpr.db"
        self.restart()

    def restart(self) -> None:
        """A crash of both processes: new controller and manager over the same cloud, cluster and GPR database."""
        clock: Clock = self.engine.clock
        cfg = ControllerConfig(planner=PlannerConfig(exact_solver=False))
        self.ctrl = Controller(self.cluster, self.cloud, [POOL], CATALOG, clock, cfg)
        self.manager = GprManager(GprStore(self.db), CATALOG, provider=self.cloud, clock=clock, engine=self.ctrl)

    def run(self, until: float, step: float = 2.0) -> None:
        t = self.engine.now()
        while t < until:
            t += step
            self.engine.run_until(t)
            self.manager.reconcile()
            self.ctrl.reconcile()
            self.cluster.schedule()

    def gpr_nodes(self) -> list[str]:
        return sorted(n.node_name for n in self.cloud.alive() if is_gpr_request_id(n.request_id))

    def disrupted(self, names: list[str]) -> list[str]:
        kinds = {str(EventKind.CONSOLIDATE), str(EventKind.DRAIN), str(EventKind.DELETE)}
        return [e.object for e in self.ctrl.backend.events  # type: ignore[attr-defined]
                if e.kind in kinds and e.object.removeprefix("node/") in names]  # fmt: skip


def test_gpr_nodes_are_claims_of_the_one_engine_and_never_consolidated(tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    gid = rig.manager.create(SPEC).gpr_id
    rig.run(600.0)  # the nodes stay idle far past consolidateAfter (30 s)
    assert rig.manager.get(gid).state is GprState.PROVISIONED
    names = rig.gpr_nodes()
    assert len(names) == 2
    gpr_claims = {k: c for k, c in rig.ctrl.claims.items() if is_gpr_request_id(request_of(k))}
    assert len(gpr_claims) == 2  # both nodes in the one claim table, under the GPR's request id
    assert {c.phase for c in gpr_claims.values()} == {ClaimPhase.INITIALIZED}
    assert rig.disrupted(names) == []
    assert rig.cloud.counters.duplicate_nodes == 0
    assert rig.cloud.counters.launch_calls == 1


def test_pods_outside_the_gpr_get_their_own_nodes_and_the_gprs_pods_run_on_its_nodes(tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    gid = rig.manager.create(SPEC).gpr_id
    for i in range(2):  # arrive while the GPR's nodes are in flight: that capacity is not theirs
        rig.cluster.add_pod(pod(f"web-{i}", gpus=1), 3600.0)
    rig.run(4.0)
    launched_for_pods = [n for n in rig.cloud.alive() if not is_gpr_request_id(n.request_id)]
    assert launched_for_pods  # at once: the GPR's nodes in flight were not counted as room for these pods
    rig.run(120.0)
    names = rig.gpr_nodes()
    on_gpr = [p for n in names for p in rig.cluster.pods_on(n)]
    assert on_gpr == []
    assert rig.cluster.running_count() == 2  # served on nodes the controller launched for them
    own = [n for n in rig.cloud.alive() if not is_gpr_request_id(n.request_id)]
    assert len(own) >= 1
    tol = (gpr_toleration(gid),)
    rig.cluster.add_pod(pod("train-0", gpus=1, tolerations=tol, selector={"gpuscale.io/gpr": gid}), 3600.0)
    rig.run(140.0)
    assert [p for n in names for p in rig.cluster.pods_on(n)] == ["default/train-0"]
    assert rig.cloud.counters.duplicate_nodes == 0


def test_a_released_gprs_nodes_are_drained_and_deleted_by_the_engine(tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    gid = rig.manager.create(SPEC).gpr_id
    rig.run(120.0)
    names = rig.gpr_nodes()
    assert len(names) == 2
    rig.manager.release(gid)
    rig.run(240.0)
    assert rig.gpr_nodes() == []
    assert not [k for k in rig.ctrl.claims if is_gpr_request_id(request_of(k))]
    deleted = {e.object.removeprefix("node/") for e in rig.ctrl.backend.events  # type: ignore[attr-defined]
               if e.kind == str(EventKind.DELETE)}  # fmt: skip
    assert set(names) <= deleted  # deleted through the controller's lifecycle
    assert rig.manager.get(gid).state in (GprState.RELEASED, GprState.COMPLETE)


def test_a_gprs_nodes_do_not_count_towards_the_pools_min_nodes(tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    pool = replace(POOL, min_nodes=1)
    rig.ctrl = Controller(rig.cluster, rig.cloud, [pool], CATALOG, rig.engine.clock, rig.ctrl.config)
    rig.manager = GprManager(GprStore(rig.db), CATALOG, provider=rig.cloud, clock=rig.engine.clock, engine=rig.ctrl)
    rig.manager.create(SPEC)
    rig.run(120.0)
    assert len(rig.gpr_nodes()) == 2
    own = [n for n in rig.cloud.alive() if not is_gpr_request_id(n.request_id)]
    assert len(own) == 1  # minNodes is kept by a node pods can use


class _Crash(Exception):
    pass


@pytest.mark.parametrize("point", ["launch:before", "launch:after"])
@pytest.mark.parametrize("nth", [1, 2])
def test_a_crash_while_gpr_nodes_launch_leaks_nothing_and_duplicates_nothing(
    tmp_path: Path, point: str, nth: int
) -> None:
    """Kill points: both processes die at the nth mutating call of a kind while a GPR's and pods' nodes launch;
    new ones over the same cloud, cluster and GPR database finish the job."""
    rig = _Rig(tmp_path)
    gid = rig.manager.create(SPEC).gpr_id
    rig.cluster.add_pod(pod("web-0", gpus=1), 3600.0)
    seen = {"n": 0}

    def hook(name: str) -> None:
        if name == point:
            seen["n"] += 1
            if seen["n"] == nth:
                raise _Crash(name)

    rig.cloud.hook = hook
    with pytest.raises((_Crash, ProviderError)):
        rig.run(120.0)
    rig.cloud.hook = None
    rig.restart()
    rig.run(rig.engine.now() + 300.0)
    assert rig.manager.get(gid).state is GprState.PROVISIONED  # no GPR lost
    assert len(rig.gpr_nodes()) == 2
    assert rig.cloud.counters.duplicate_nodes == 0
    alive = {n.node_id for n in rig.cloud.alive()}
    claimed = {c.node_id for c in rig.ctrl.claims.values() if c.node_id}
    assert alive <= claimed  # no leak: every billed node is a claim of the one engine
    assert rig.cluster.running_count() == 1


# ------------------------------------------------------------------------------- kill points with GPR nodes launching
def _crash_run_with_gprs(
    seed: int, points: dict[int, bool], db: Path
) -> tuple[Any, Any, GprManager, list[str], int, set[str]]:
    """The controller crash run of test_controller (two waves of pods, consolidation, deletes) with two GPRs sharing
    the engine: A (2 nodes) at 0 s, released at 800 s; B (1 node) at 450 s, released at 1500 s. A crash kills both
    processes; new ones start from the cluster, the cloud and the GPR database."""
    import random

    from test_controller import CATALOG as CTL_CATALOG
    from test_controller import CRASH_POOL, Crash, CrashingBackend, CrashingProvider, CrashPlan, Harness, gpod

    class Plan(CrashPlan):  # also records the kind of every mutating call, in order
        kinds: list[str]

        def around(self, kind: str, effect: Any) -> Any:
            if kind not in ("launch", "gpr-launch", "provider-delete"):
                self.kinds.append(kind)
            return super().around(kind, effect)

    plan = Plan(points)
    plan.kinds = []
    h = Harness([CRASH_POOL], seed=seed)
    h.backend = CrashingBackend(h.cluster, plan)

    class Provider(CrashingProvider):
        def launch(self, request: Any) -> Any:  # GPR launches are their own kind of kill point
            kind = "gpr-launch" if is_gpr_request_id(request.request_id) else "launch"
            plan.kinds.append(kind)
            return plan.around(kind, lambda: self.inner.launch(request))

        def delete_node(self, node_id: str) -> None:
            plan.kinds.append("provider-delete")
            plan.around("provider-delete", lambda: self.inner.delete_node(node_id))

    h.provider = Provider(h.cloud, plan)

    def start() -> GprManager:
        h.ctrl = h.new_controller()
        return GprManager(GprStore(db), CTL_CATALOG, provider=h.provider, clock=h.engine.clock, engine=h.ctrl)

    manager = start()
    spec = {"requestName": "a", "gpuShape": "A10", "numberOfGPUs": 1, "exitDuration": "8h"}
    rng = random.Random(seed)
    for i in range(10):
        h.engine.at(0.0, h.cluster.add_pod, gpod(f"a{i}"), rng.choice([150.0, 400.0, 900.0]))
    for i in range(5):
        h.engine.at(500.0, h.cluster.add_pod, gpod(f"b{i}"), rng.choice([100.0, 300.0]))
    ids: list[str] = []
    script: dict[float, Callable[[GprManager], object]] = {
        0.0: lambda m: ids.append(m.create({**spec, "numberOfGPUNodes": 2}).gpr_id),
        450.0: lambda m: ids.append(m.create({**spec, "requestName": "b", "numberOfGPUNodes": 1}).gpr_id),
        800.0: lambda m: m.release(ids[0]),
        1500.0: lambda m: m.release(ids[1]),
    }
    restarts = 0
    provisioned: set[str] = set()
    t = 0.0
    while t < 2400.0:
        h.engine.run_until(t)
        if t in script:
            script[t](manager)
        try:
            manager.reconcile()
            h.ctrl.reconcile()
        except Crash:
            restarts += 1
            manager = start()
        provisioned |= {g.gpr_id for g in manager.list_gprs((GprState.PROVISIONED,))}
        t += 2.0
    return h, plan, manager, ids, restarts, provisioned


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory when the machine has one (the GPR database commits every pass)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="gpuscale-test-") as d:
        yield Path(d)


def test_crash_restart_while_gpr_nodes_launch_at_seeded_points(fast_dir: Path) -> None:
    """Kill points while GPR and pod nodes launch, drain and are deleted: no leak, no duplicate, no GPR lost."""
    import random

    tmp_path = fast_dir

    fired: list[str] = []
    h, base, manager, ids, _, provisioned = _crash_run_with_gprs(0, {}, tmp_path / "base.db")
    assert [manager.get(g).state for g in ids] == [GprState.RELEASED, GprState.RELEASED]
    assert provisioned == set(ids)
    total = base.calls
    gpr_calls = [i + 1 for i, kind in enumerate(base.kinds) if kind == "gpr-launch"]
    assert len(gpr_calls) >= 2
    for k in range(8):
        rng = random.Random(k)
        # one kill point at a GPR launch (before or after its effect), two anywhere else
        points = {gpr_calls[k % len(gpr_calls)]: k % 2 == 1}
        points |= {rng.randint(1, total): rng.random() < 0.5 for _ in range(2)}
        h, plan, manager, ids, restarts, provisioned = _crash_run_with_gprs(0, points, tmp_path / f"run{k}.db")
        where = (k, plan.fired)
        fired += plan.fired
        assert restarts == len(plan.fired) > 0
        # no GPR lost: each was provisioned, held until its release, and released
        assert provisioned == set(ids), where
        assert [manager.get(g).state for g in ids] == [GprState.RELEASED, GprState.RELEASED], where
        assert h.cloud.counters.duplicate_nodes == 0, where
        assert h.cloud.counters.idempotency_mismatches == 0, where
        assert h.cluster.counters.pods_completed == 15 and h.cluster.pending_count() == 0, where
        assert not h.alive(), where  # nothing leaked
        assert not h.cluster.list_nodes(), where
    assert fired.count("gpr-launch") == 8
    assert {"launch", "gpr-launch"} <= set(fired)
