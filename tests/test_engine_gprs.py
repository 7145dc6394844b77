"""One engine for pods and GPRs: the GPR manager hands its launches and releases to the node controller, whose claim
table, availability record and node lifecycle then carry the nodes of both (controller/gprnodes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders import pod
from gpuscale.clock import Clock
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.gprnodes import request_of
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.gpr import GprState, gpr_toleration, is_gpr_request_id
from gpuscale.core.model import CapacityType, Catalog, Disruption, DisruptionBudget, InstanceType, NodePool, Offering
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.core.plan import PlannerConfig
from gpuscale.errors import ProviderError
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.store import GprStore
from gpuscale.sim.cloud import CloudBehaviour, SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Dist, Engine

OD = CapacityType.ON_DEMAND


def _it(name: str, gpus: int, price: float) -> InstanceType:
    return InstanceType(name, "linode", 8 * gpus, 32768 * gpus, gpus, "RTX4000-Ada", 20480,
                        offerings=(Offering("us-ord", OD, price),))  # fmt: skip


CATALOG = Catalog("one-cloud", (_it("g2-rtx4000a1-s", 1, 0.52), _it("g2-rtx4000a4-s", 4, 2.96)))
FAST = CloudBehaviour(
    launch_latency=Dist.const(5.0),
    registration_latency=Dist.const(10.0),
    device_plugin_delay=Dist.const(10.0),
    deletion_latency=Dist.const(5.0),
)
POOL = NodePool(
    "gpu",
    instance_types=("g2-rtx4000a1-s", "g2-rtx4000a4-s"),
    capacity_types=(OD,),
    disruption=Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),)),
)
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
