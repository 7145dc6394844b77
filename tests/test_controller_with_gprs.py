"""The node controller and the GPR manager on one cloud: the controller leaves the GPR manager's nodes alone (never
adopts, consolidates or deletes them), and both read one Availability record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builders import ONE_CLOUD as CATALOG
from builders import ONE_CLOUD_FAST as FAST
from builders import ONE_CLOUD_POOL as POOL
from gpuscale.clock import Clock
from gpuscale.controller.availability import Availability
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.gpr import GprState, is_gpr_request_id
from gpuscale.core.nodeclaim import Deadlines
from gpuscale.core.plan import PlannerConfig
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.store import GprStore
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine

CONTROLLER_ACTS = {
    str(k)
    for k in (
        EventKind.ADOPTED,
        EventKind.TIMEOUT,
        EventKind.CONSOLIDATE,
        EventKind.DRAIN,
        EventKind.DELETE,
        EventKind.EVICT,
        EventKind.ORPHAN,
        EventKind.LOST,
    )
}
SPEC = {
    "requestName": "train",
    "gpuShape": "RTX4000-Ada",
    "numberOfGPUs": 1,
    "numberOfGPUNodes": 1,
    "exitDuration": "8h",
}


def _run(tmp_path: Path, **controller_kw: Any) -> tuple[Controller, GprManager, SimCloud, str]:
    engine = Engine()
    cluster = SimCluster(engine, CATALOG, [POOL], seed=1)
    cloud = SimCloud(engine, CATALOG, FAST, seed=1, listener=cluster)
    shared = Availability()
    clock: Clock = engine.clock
    manager = GprManager(GprStore(tmp_path / "gpr.db"), CATALOG, provider=cloud, clock=clock, availability=shared)
    # a registration deadline shorter than this cloud's registration latency: a node the controller wrongly took for its
    # own would time out and be deleted
    cfg = ControllerConfig(planner=PlannerConfig(exact_solver=False), deadlines=Deadlines(registration_s=3.0))
    ctrl = Controller(cluster, cloud, [POOL], CATALOG, clock, cfg, availability=shared, **controller_kw)
    g = manager.create(SPEC)
    t = 0.0
    while t < 600.0:
        t += 2.0
        engine.run_until(t)
        manager.reconcile()
        ctrl.reconcile()
    return ctrl, manager, cloud, g.gpr_id


def test_the_controller_leaves_an_active_gprs_nodes_alone(tmp_path: Path) -> None:
    ctrl, manager, cloud, gpr_id = _run(tmp_path)
    assert manager.get(gpr_id).state is GprState.PROVISIONED
    gpr_nodes = [n for n in cloud.alive() if is_gpr_request_id(n.request_id)]
    assert len(gpr_nodes) == 1  # launched once, never deleted by the controller
    assert not any(is_gpr_request_id(k) for k in ctrl.claims)
    events = ctrl.backend.events  # type: ignore[attr-defined]
    names = {n.node_name for n in gpr_nodes}
    touched = [e for e in events if e.kind in CONTROLLER_ACTS and e.object.removeprefix("node/") in names]
    assert touched == []  # no adoption, timeout, consolidation, drain or delete of the GPR's node
    assert cloud.counters.duplicate_nodes == 0


def test_without_the_ownership_rule_the_controller_would_delete_the_gprs_node(tmp_path: Path) -> None:
    """The failure the rule prevents (and proof the test above can fail): the controller adopts the GPR's node,
    times it out by its own deadline and deletes it under the GPR."""
    ctrl, _, cloud, _ = _run(tmp_path, foreign=None)
    kinds = {e.kind for e in ctrl.backend.events}  # type: ignore[attr-defined]
    assert {str(EventKind.ADOPTED), str(EventKind.TIMEOUT), str(EventKind.DELETE)} <= kinds
    assert not [n for n in cloud.alive() if is_gpr_request_id(n.request_id)]  # the GPR lost its node
