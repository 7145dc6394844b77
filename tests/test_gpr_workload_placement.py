"""Nodes of an active GPR take only pods matching its workloadSelector: the scheduling predicate
(``core.predicates``) and the simulated scheduler that uses it, not only the GPR's taint."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscale.core.gpr import GPR_LABEL, gpr_node_taints, gpr_toleration
from gpuscale.core.model import Pod, Toleration
from gpuscale.core.predicates import FitFailureKind, static_failure, static_fit
from gpuscale.core.resources import Request
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "benchmarks" / "scenarios" / "gprs-and-pods.yaml"
GID = "gpr-0123456789ab"
LABELS = {GPR_LABEL: GID, "gpuscale.io/pool": "rtx"}
TAINTS = tuple(gpr_node_taints(GID))


def pod(name: str, labels: dict[str, str], tolerations: tuple[Toleration, ...] = (gpr_toleration(GID),)) -> Pod:
    return Pod(name, request=Request(cpu_milli=100, memory_mib=128), tolerations=tolerations, labels=labels)


def test_a_pod_tolerating_the_taint_but_outside_the_selector_fails_with_a_stated_reason() -> None:
    workloads = {GID: {"team": "train"}}
    outsider = pod("outsider", {"team": "infer"})
    failure = static_failure(outsider, LABELS, TAINTS, workloads=workloads)
    assert failure is not None and failure.kind is FitFailureKind.GPR_WORKLOAD
    reason = static_fit(outsider, LABELS, TAINTS, workloads=workloads)
    assert reason == f"GprWorkload: node is held by GPR {GID}; pod labels do not match its workloadSelector team=train"
    assert static_failure(pod("member", {"team": "train", "x": "y"}), LABELS, TAINTS, workloads=workloads) is None


def test_the_rule_binds_only_nodes_of_listed_gprs_and_an_empty_selector_admits_no_pod() -> None:
    everything = (Toleration(operator="Exists"),)
    member = pod("member", {"team": "train"}, everything)
    assert static_failure(member, LABELS, TAINTS) is None  # no active GPRs given: taint tolerated, rule off
    assert static_failure(member, LABELS, TAINTS, workloads={"gpr-other": {"team": "x"}}) is None
    assert static_failure(member, {"gpuscale.io/pool": "rtx"}, (), workloads={GID: {"team": "x"}}) is None
    empty = static_failure(member, LABELS, TAINTS, workloads={GID: {}})
    assert empty is not None and "(empty: no pod)" in empty.detail


def test_the_taint_still_comes_first_for_pods_that_do_not_tolerate_it() -> None:
    failure = static_failure(pod("plain", {"team": "x"}, ()), LABELS, TAINTS, workloads={GID: {"team": "x"}})
    assert failure is not None and failure.kind is FitFailureKind.TAINT


def _with_outsider(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each provisioned GPR with a workload also gets an outsider: tolerates its taint, selects its nodes, labels
    outside its workloadSelector. Returns the outsiders' keys."""
    from gpuscale.sim.gpr.mixed import GprSide

    start = GprSide._start_workload
    keys: list[str] = []

    def with_outsider(self: GprSide, gid: str, spec: object) -> None:
        start(self, gid, spec)  # type: ignore[arg-type]
        p = Pod(
            f"{gid}-outsider",
            request=Request(cpu_milli=100, memory_mib=128),
            node_selector={GPR_LABEL: gid},
            tolerations=(gpr_toleration(gid),),
            labels={"app": "not-the-gprs"},
        )
        self.cluster.add_pod(p, 3600.0)
        keys.append(p.key)

    monkeypatch.setattr(GprSide, "_start_workload", with_outsider)
    return keys


def test_the_simulated_scheduler_keeps_an_outsider_off_a_held_gpr_node(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = _with_outsider(monkeypatch)
    r = simulate_policy(load_scenario(SCENARIO), "gpuscale").report
    assert keys, "the scenario provisions a GPR with a workload"
    assert r["podsOnGprNodesOutsideGpr"] == 0
    assert r["gprNodesDisrupted"] == 0 and r["duplicateLaunches"] == 0


def test_without_the_predicate_the_outsider_lands_on_the_gpr_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail: with the scheduler not told the GPRs' selectors, the taint alone lets it in."""
    _with_outsider(monkeypatch)
    monkeypatch.setattr(SimCluster, "set_gpr_workload", lambda self, gid, selector: None)
    r = simulate_policy(load_scenario(SCENARIO), "gpuscale").report
    assert r["podsOnGprNodesOutsideGpr"] >= 1
