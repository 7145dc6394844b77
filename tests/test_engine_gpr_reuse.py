"""One engine for pods and GPRs, second half: free nodes the engine owns are borrowed by GPRs before new ones are
launched, and a released GPR's launched nodes go back to their pool (releasePolicy Consolidate) or are deleted
(Delete); borrowed nodes are always given back (controller/gprnodes.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builders import ONE_CLOUD as CATALOG
from builders import ONE_CLOUD_POOL as POOL
from builders import pod
from gpuscale.controller.claims import ClaimTable
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.gprnodes import WRITE_GRACE_S, GprNodes, request_of
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.core.gpr import (
    GPR_LABEL,
    GPR_TAINT,
    RELEASE_POLICY_LABEL,
    GprState,
    GprValidationError,
    gpr_toleration,
    is_gpr_request_id,
    spec_from_dict,
)
from gpuscale.core.model import CapacityType, Disruption, DisruptionBudget, Node
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.resources import Resources
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.store import GprStore
from test_engine_gprs import SPEC, _Rig

SLOW_POOL = replace(POOL, disruption=Disruption(consolidate_after_s=600.0, budgets=(DisruptionBudget("100%"),)))
"""Empty nodes wait 10 minutes before consolidation: long enough for a GPR to arrive and find one free."""
ONE = {**SPEC, "numberOfGPUNodes": 1}


class Rig(_Rig):
    """The rig of test_engine_gprs with a pool whose empty nodes wait ``consolidateAfter`` 10 minutes."""

    def restart(self) -> None:
        clock = self.engine.clock
        cfg = ControllerConfig(planner=PlannerConfig(exact_solver=False))
        self.ctrl = Controller(self.cluster, self.cloud, [SLOW_POOL], CATALOG, clock, cfg)
        self.manager = GprManager(GprStore(self.db), CATALOG, provider=self.cloud, clock=clock, engine=self.ctrl)

    def gpr_launches(self) -> list[str]:
        """Nodes the engine launched for a GPR, ever."""
        return [e.object for e in self.cluster.events if e.reason == "GprScaleUp"]

    def node(self, name: str) -> tuple[dict[str, str], set[str]]:
        n = self.cluster.node(name)
        assert n is not None, name
        return dict(n.labels), {t.key for t in n.taints}

    def events(self, kind: EventKind, name: str) -> list[float]:
        return [e.at for e in self.cluster.events if e.kind == str(kind) and e.object == f"node/{name}"]

    def free_node(self) -> str:
        """A node launched for a pod that ran and left: Ready, initialised and empty."""
        self.cluster.add_pod(pod("warm-0", gpus=1), 60.0)
        self.run(self.engine.now() + 120.0)
        (name,) = [n.node_name for n in self.cloud.alive()]
        assert self.cluster.pods_on(name) == []
        return name


def test_a_gpr_arriving_while_a_fitting_free_node_exists_borrows_it_instead_of_launching(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    name = rig.free_node()
    gid = rig.manager.create(ONE).gpr_id
    rig.run(rig.engine.now() + 20.0)
    g = rig.manager.get(gid)
    assert g.state is GprState.PROVISIONED
    assert g.status.inventory_nodes == (name,) and not g.status.scale_up_triggered
    assert rig.gpr_launches() == []  # 0 launches for the GPR
    labels, taints = rig.node(name)
    assert labels[GPR_LABEL] == gid and GPR_TAINT in taints
    assert rig.events(EventKind.GPR_BORROW, name)
    rig.run(rig.engine.now() + 700.0)  # past consolidateAfter (600 s): a held node is never consolidated
    assert rig.events(EventKind.CONSOLIDATE, name) == []
    assert [n.node_name for n in rig.cloud.alive()] == [name]
    assert rig.cloud.counters.duplicate_nodes == 0


def test_a_node_that_does_not_fit_the_gpr_is_not_borrowed(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    name = rig.free_node()  # a one-GPU node
    gid = rig.manager.create({**ONE, "numberOfGPUs": 4}).gpr_id
    rig.run(rig.engine.now() + 120.0)
    assert rig.manager.get(gid).status.inventory_nodes == ()
    assert len(rig.gpr_launches()) == 1
    assert GPR_LABEL not in rig.node(name)[0]


def test_a_pod_arriving_meanwhile_lands_on_the_borrowed_node_only_if_it_is_the_gprs_workload(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    name = rig.free_node()
    gid = rig.manager.create(ONE).gpr_id
    rig.run(rig.engine.now() + 10.0)
    rig.cluster.set_gpr_workload(gid, {"app": "train"})  # the scheduler's GPR predicate (the simulator's GPR side)
    launched = {n.node_id for n in rig.cloud.alive()}
    rig.cluster.add_pod(pod("web-0", gpus=1), 3600.0)
    tol = (gpr_toleration(gid),)
    rig.cluster.add_pod(pod("sneaky-0", gpus=1, tolerations=tol), 3600.0)  # tolerates the taint, not its workload
    rig.run(rig.engine.now() + 120.0)
    assert rig.cluster.pods_on(name) == []
    assert len({n.node_id for n in rig.cloud.alive()} - launched) == 2  # both got nodes of their own
    own = replace(pod("train-0", gpus=1, tolerations=tol, selector={GPR_LABEL: gid}), labels={"app": "train"})
    rig.cluster.add_pod(own, 3600.0)
    rig.run(rig.engine.now() + 20.0)
    assert rig.cluster.pods_on(name) == ["default/train-0"]
    assert rig.cloud.counters.duplicate_nodes == 0


def test_a_borrowed_node_is_given_back_not_deleted_and_consolidated_later(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    name = rig.free_node()
    gid = rig.manager.create({**ONE, "releasePolicy": "Delete"}).gpr_id  # Delete concerns launched nodes only
    rig.run(rig.engine.now() + 20.0)
    rig.manager.release(gid)
    rig.run(rig.engine.now() + 10.0)
    labels, taints = rig.node(name)
    assert GPR_LABEL not in labels and GPR_TAINT not in taints
    back = rig.events(EventKind.GPR_RETURN, name)
    assert back and rig.events(EventKind.DRAIN, name) == []
    rig.run(back[0] + 900.0)
    (consolidated,) = rig.events(EventKind.CONSOLIDATE, name)
    assert consolidated >= back[0] + 600.0  # an ordinary empty node again: consolidateAfter counts from its return
    assert rig.cloud.alive() == []


@pytest.mark.parametrize("policy", ["Consolidate", "Delete"])
def test_a_released_gprs_launched_nodes_follow_its_release_policy(tmp_path: Path, policy: str) -> None:
    rig = Rig(tmp_path)
    gid = rig.manager.create({**SPEC, "releasePolicy": policy}).gpr_id
    rig.run(120.0)
    names = rig.gpr_nodes()
    assert len(names) == 2 and rig.node(names[0])[0][RELEASE_POLICY_LABEL] == policy
    rig.manager.release(gid)
    released_at = rig.engine.now()
    rig.run(released_at + 60.0)
    if policy == "Delete":  # drained and deleted at once
        assert all(rig.events(EventKind.DELETE, n) for n in names)
        assert rig.gpr_nodes() == []
        return
    for n in names:  # back in their pool: unlabelled, untainted, alive, no longer a GPR's
        labels, taints = rig.node(n)
        assert GPR_LABEL not in labels and RELEASE_POLICY_LABEL not in labels and GPR_TAINT not in taints
        assert rig.events(EventKind.DELETE, n) == []
    assert rig.ctrl.gpr.keys(rig.ctrl.claims) == frozenset()
    rig.run(released_at + 900.0)
    for n in names:  # consolidated like any other empty node, after consolidateAfter
        (at,) = rig.events(EventKind.CONSOLIDATE, n)
        assert at >= released_at + 600.0
    assert rig.gpr_nodes() == []


def test_a_released_gprs_node_is_reused_by_the_next_gpr_across_a_restart(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    first = rig.manager.create(ONE).gpr_id
    rig.run(120.0)
    (name,) = rig.gpr_nodes()
    rig.manager.release(first)
    rig.run(rig.engine.now() + 20.0)
    second = rig.manager.create({**ONE, "requestName": "next"}).gpr_id
    rig.run(rig.engine.now() + 20.0)
    g = rig.manager.get(second)
    assert g.state is GprState.PROVISIONED and g.status.inventory_nodes == (name,)
    assert len(rig.gpr_launches()) == 1  # the first GPR's launch only
    rig.restart()  # both processes: the borrow is rebuilt from the node's label
    rig.run(rig.engine.now() + 700.0)
    assert rig.manager.get(second).state is GprState.PROVISIONED
    assert rig.node(name)[0][GPR_LABEL] == second
    assert rig.events(EventKind.DRAIN, name) == [] and rig.events(EventKind.CONSOLIDATE, name) == []
    assert len(rig.gpr_launches()) == 1 and rig.cloud.counters.duplicate_nodes == 0
    held = rig.ctrl.gpr.keys(rig.ctrl.claims)
    assert [rig.ctrl.claims[k].node_name for k in held] == [name]


def test_a_restart_mid_way_keeps_the_borrow_without_leak_or_duplicate(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    name = rig.free_node()
    gid = rig.manager.create(ONE).gpr_id
    rig.manager.reconcile()  # borrowed (labelled) by the manager; the controller has not run since
    assert rig.node(name)[0][GPR_LABEL] == gid
    rig.restart()
    rig.run(rig.engine.now() + 700.0)
    g = rig.manager.get(gid)
    assert g.state is GprState.PROVISIONED and g.status.inventory_nodes == (name,)
    assert rig.gpr_launches() == [] and [n.node_name for n in rig.cloud.alive()] == [name]
    assert rig.events(EventKind.CONSOLIDATE, name) == []
    alive = {n.node_id for n in rig.cloud.alive()}
    assert alive <= {c.node_id for c in rig.ctrl.claims.values()}  # no leak
    rig.manager.release(gid)
    rig.run(rig.engine.now() + 30.0)
    assert len(rig.events(EventKind.GPR_RETURN, name)) == 1
    assert not any(is_gpr_request_id(request_of(k)) for k in rig.ctrl.claims)


def test_release_policy_is_read_and_a_bad_value_names_the_field() -> None:
    base = {"requestName": "x", "gpuShape": "T4", "exitDuration": "8h"}
    assert spec_from_dict(base).release_policy == "Consolidate"
    assert spec_from_dict({**base, "releasePolicy": "Delete"}).release_policy == "Delete"
    with pytest.raises(GprValidationError) as err:
        spec_from_dict({**base, "releasePolicy": "delete"})
    assert [e.field for e in err.value.errors] == ["releasePolicy"]
    assert "Consolidate or Delete" in str(err.value)


class _Crash(Exception):
    pass


@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("which", ["borrow", "give-back"])
def test_a_crash_while_a_node_is_borrowed_or_given_back_neither_leaks_nor_doubles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str, after: bool
) -> None:
    """Kill points around the label write of a borrow and of a give-back: both processes die before or after it;
    new ones over the same cloud, cluster and GPR database finish the job."""
    rig = Rig(tmp_path)
    name = rig.free_node()
    gid = rig.manager.create(ONE).gpr_id
    inner = rig.cluster.update_node
    armed = {"on": which == "borrow"}

    def crashing(node_name: str, labels: Any, taints: Any = (), untaint: Any = ()) -> None:
        if not armed["on"]:
            return inner(node_name, labels, taints, untaint)
        armed["on"] = False
        if after:
            inner(node_name, labels, taints, untaint)
        raise _Crash(which)

    monkeypatch.setattr(rig.cluster, "update_node", crashing)
    if which == "give-back":
        rig.run(rig.engine.now() + 20.0)
        assert rig.manager.get(gid).status.inventory_nodes == (name,)
        rig.manager.release(gid)
        armed["on"] = True
    with pytest.raises(_Crash):
        rig.run(rig.engine.now() + 20.0)
    rig.restart()
    rig.run(rig.engine.now() + 60.0)
    state = rig.manager.get(gid).state
    labels, taints = rig.node(name)
    if which == "borrow":
        assert state is GprState.PROVISIONED and rig.manager.get(gid).status.inventory_nodes == (name,)
        assert labels[GPR_LABEL] == gid and GPR_TAINT in taints
        assert rig.gpr_launches() == []  # the borrow was finished, not replaced by a launch
    else:
        assert state is GprState.RELEASED
        assert GPR_LABEL not in labels and GPR_TAINT not in taints
    assert [n.node_name for n in rig.cloud.alive()] == [name] and rig.cloud.counters.duplicate_nodes == 0
    assert {n.node_id for n in rig.cloud.alive()} <= {c.node_id for c in rig.ctrl.claims.values()}


# ------------------------------------------------------------------------------- which nodes a GPR holds (table)
def _claim(key: str, node: str) -> tuple[str, NodeClaim]:
    c = NodeClaim(key, "gpu", "g2-rtx4000a1-s", "z", CapacityType.ON_DEMAND, phase=ClaimPhase.INITIALIZED)
    return key, replace(c, node_name=node, node_id=f"id-{node}" if node else "")


LAUNCHED = "gpr-aaaa-a0"  # a claim of GPR gpr-aaaa's launch
HELD_CASES = [
    # (claim key, its node, that Node's GPR label or ... when no Node is seen, held?)
    (LAUNCHED, "", ..., True),  # launched, in flight: the GPR's
    (LAUNCHED, "n1", ..., True),  # launched, Node not seen yet
    (LAUNCHED, "n1", "gpr-aaaa", True),  # launched and labelled by its GPR
    (LAUNCHED, "n1", None, False),  # given back to its pool
    (LAUNCHED, "n1", "gpr-bbbb", True),  # given back, then borrowed by another GPR
    ("up-1", "n1", "gpr-bbbb", True),  # a pod node a GPR borrowed
    ("up-1", "n1", None, False),  # an ordinary node
    ("up-1", "", ..., False),  # an ordinary node in flight
]


@pytest.mark.parametrize(("key", "node", "label", "held"), HELD_CASES)
def test_which_claims_a_gpr_holds(key: str, node: str, label: Any, held: bool) -> None:
    table = ClaimTable()
    k, c = _claim(key, node)
    table[k] = c
    gpr = GprNodes()
    assert gpr.keys(table) == frozenset()  # nothing until a GPR manager uses the engine
    gpr.enabled = True
    nodes = {} if label is ... else {node: Node(node, Resources(gpus=1), labels={GPR_LABEL: label} if label else {})}
    gpr.observe(nodes, 0.0)
    assert (k in gpr.keys(table)) is held


def test_a_label_just_written_counts_until_the_node_shows_it_or_the_grace_ends() -> None:
    table = ClaimTable()
    k, c = _claim("up-1", "n1")
    table[k] = c
    gpr = GprNodes()
    gpr.enabled = True
    unlabelled = {"n1": Node("n1", Resources(gpus=1))}
    gpr.observe(unlabelled, 0.0)
    gpr.wrote("n1", "gpr-aaaa", 0.0)  # borrowed: held at once, before the watch shows the label
    assert gpr.keys(table) == {k}
    gpr.observe(unlabelled, 5.0)  # a lagging watch: the write still counts
    assert gpr.keys(table) == {k}
    gpr.observe(unlabelled, 5.0 + WRITE_GRACE_S + 1)  # the write never showed: the Node is believed
    assert gpr.keys(table) == frozenset()
    labelled = {"n1": Node("n1", Resources(gpus=1), labels={GPR_LABEL: "gpr-aaaa"})}
    gpr.observe(labelled, 200.0)
    gpr.wrote("n1", None, 200.0)  # given back: free at once
    assert gpr.keys(table) == frozenset()
