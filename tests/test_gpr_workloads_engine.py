"""The GPR workload rule through the one engine: the GPR manager tells the node controller its active GPRs'
workloadSelectors (``hold_gpr_workloads``), so a pending pod that tolerates a GPR's taint but is not its workload is
not counted as placed on the GPR's idle node: the controller launches a node for it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from builders import pod
from gpuscale.controller.gprnodes import GprSteps
from gpuscale.core.gpr import GprState, is_gpr_request_id
from gpuscale.core.model import Toleration
from test_engine_gprs import SPEC, _Rig

ONE = {**SPEC, "numberOfGPUNodes": 1, "workloadSelector": {"app": "train"}}


def _outsider_next_to_an_idle_gpr_node(tmp_path: Path) -> tuple[_Rig, str]:
    rig = _Rig(tmp_path)
    gid = rig.manager.create(ONE).gpr_id
    rig.run(120.0)
    assert rig.manager.get(gid).state is GprState.PROVISIONED and len(rig.gpr_nodes()) == 1
    rig.cluster.set_gpr_workload(gid, {"app": "train"})  # the simulated scheduler applies the rule too
    outsider = replace(pod("outsider", gpus=1, tolerations=(Toleration(operator="Exists"),)), labels={"app": "web"})
    rig.cluster.add_pod(outsider, 3600.0)
    rig.run(240.0)
    return rig, gid


def test_the_engine_knows_the_active_gprs_selectors(tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    gid = rig.manager.create(ONE).gpr_id
    rig.run(60.0)
    assert rig.ctrl.gpr.workloads == {gid: {"app": "train"}}
    rig.manager.release(gid)
    rig.run(120.0)
    assert rig.ctrl.gpr.workloads == {}


def test_a_pending_pod_outside_the_selector_gets_a_node_launched(tmp_path: Path) -> None:
    rig, _ = _outsider_next_to_an_idle_gpr_node(tmp_path)
    own = [n for n in rig.cloud.alive() if not is_gpr_request_id(n.request_id)]
    assert len(own) == 1
    assert rig.cluster.pods_on(own[0].node_name) == ["default/outsider"]
    assert [p for n in rig.gpr_nodes() for p in rig.cluster.pods_on(n)] == []
    assert rig.cloud.counters.duplicate_nodes == 0


def test_without_the_selectors_the_outsider_is_planned_onto_the_gpr_node_and_stays_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: an engine not told the selectors counts the GPR's idle node as room."""
    monkeypatch.setattr(GprSteps, "hold_gpr_workloads", lambda self, workloads: None)
    rig, _ = _outsider_next_to_an_idle_gpr_node(tmp_path)
    assert [n for n in rig.cloud.alive() if not is_gpr_request_id(n.request_id)] == []
    assert rig.cluster.running_count() == 0
