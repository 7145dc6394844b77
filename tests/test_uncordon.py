"""A node gpuscale cordoned for its replacement (``rightsize``, ``spotToSpot``) takes pods again when the replacement
fails and the node is kept: the pure decision (:func:`progress_replacements` emits :class:`Uncordon` only for nodes
gpuscale cordoned), a simulated ``spotToSpot`` run (the ``rightsize`` one is in ``test_sim_rightsize``), and the
Kubernetes adapter's ``uncordon`` over HTTP against the emulated API server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from gpuscale.catalogs import load_catalog
from gpuscale.clock import ManualClock
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.core.reconcile import DropReplacement, Uncordon, progress_replacements, retry_uncordons
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.backend import DISRUPTED_TAINT
from gpuscale.kube.command import ControllerProcess
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import parse_scenario
from kube_harness import client_for
from test_reconcile_core import claim, k8s
from test_repack import SPOT_CAT, SPOT_SIM


# ------------------------------------------------------------------------------------------------ the decision
def test_a_failed_replacement_uncordons_only_a_node_gpuscale_cordoned() -> None:
    old = claim("old", ClaimPhase.INITIALIZED, node_id="n0", name="node-0")
    new = claim("new", ClaimPhase.FAILED, node_id="n1", name="node-1")
    table = {"old": old, "new": new}

    def by_name(name: str) -> tuple[str, NodeClaim] | None:
        return next(((k, c) for k, c in table.items() if c.node_name == name), None)

    reps = {"node-0": (("new",), "Underutilized")}
    nodes = {"node-0": k8s("node-0", cordoned=True)}
    d = progress_replacements(reps, table, by_name, nodes, 7.0, cordoned={"node-0"})
    assert d.actions[:2] == [Uncordon("node-0"), DropReplacement("node-0")]
    # cordoned by someone else (not recorded): kept cordoned
    d = progress_replacements(reps, table, by_name, nodes, 7.0, cordoned=set())
    assert not any(isinstance(a, Uncordon) for a in d.actions)
    # the replacement is ready: the node drains (never uncordoned)
    table["new"] = replace(new, phase=ClaimPhase.INITIALIZED)
    d = progress_replacements(reps, table, by_name, nodes, 8.0, cordoned={"node-0"})
    assert DropReplacement("node-0") in d.actions and not any(isinstance(a, Uncordon) for a in d.actions)
    # the old node itself is leaving (e.g. a spot notice drains it): the replacement is dropped, nothing uncordoned
    table["new"], table["old"] = new, replace(old, phase=ClaimPhase.DRAINING)
    d = progress_replacements(reps, table, by_name, nodes, 9.0, cordoned={"node-0"})
    assert d.actions == [DropReplacement("node-0")]


def test_an_uncordon_is_sent_again_at_its_due_time_until_the_node_is_schedulable() -> None:
    table = {
        "a": claim("a", ClaimPhase.INITIALIZED, node_id="n0", name="node-0"),
        "b": claim("b", ClaimPhase.INITIALIZED, node_id="n1", name="node-1"),
        "c": claim("c", ClaimPhase.DRAINING, node_id="n2", name="node-2"),
    }

    def by_name(name: str) -> tuple[str, NodeClaim] | None:
        return next(((k, c) for k, c in table.items() if c.node_name == name), None)

    nodes = {
        "node-0": k8s("node-0", cordoned=True),
        "node-1": k8s("node-1"),
        "node-2": k8s("node-2", cordoned=True),
    }
    due = {"node-0": 10.0, "node-1": 10.0, "node-2": 10.0, "gone": 10.0}
    # before its due time a node still cordoned waits; the schedulable, leaving and vanished ones are settled
    assert retry_uncordons(due, nodes, by_name, 9.0) == ([], ["node-1", "node-2", "gone"])
    assert retry_uncordons(due, nodes, by_name, 10.0) == (["node-0"], ["node-1", "node-2", "gone"])


# ------------------------------------------------------------------------------------------------ simulated
LATE = """  - source: burst
    prefix: late
    count: 1
    at: 27m
    runtime: 1h
    shape: {{cpu: 2, memory: 2Gi}}
"""
STUCK = "  devicePluginDelay: 60s\n  instanceTypes: {{tiny: {{devicePluginDelay: 2h}}}}\n"


def test_a_spot_node_whose_swap_failed_takes_pods_again() -> None:
    """The big spot node is cordoned at 20 min for a swap to a tiny spot node whose GPUs never show (gpuInit 5 m):
    the swap is aborted at 26 min and the node kept, and uncordoned. A CPU pod arriving at 27 min lands on it
    (without the uncordon a small node was launched for it at 27 min); the next swap, to a small spot node, then
    moves both pods."""
    text = SPOT_SIM.replace("policy:", LATE + "policy:").replace("  devicePluginDelay: 60s\n", STUCK)
    text = text.format(extra=", spotToSpot: true, deadlines: {gpuInit: 5m}")
    res = simulate_policy(parse_scenario(text, source="s.yaml", catalog=SPOT_CAT), "gpuscale")
    (aborted,) = [e for e in res.cluster.events if e.kind == "ReplaceAborted"]
    assert 20 * 60 < aborted.at < 27 * 60 and "node kept" in aborted.message
    ups = [e.message for e in res.cluster.events if e.kind == "ScaleUp" and "to replace" not in e.message]
    assert ups == ["launched big spot in z1 ($0.26/h) for 1 pod(s)"]  # none for the late pod
    swaps = [e.message for e in res.cluster.events if e.kind == "ScaleUp" and "to replace" in e.message]
    assert swaps[1].startswith("launched small spot in z1 ($0.17/h) for 2 pod(s)")  # the late pod was on the node
    assert res.report["duplicateLaunches"] == 0


def test_a_failed_uncordon_is_retried_until_the_node_is_schedulable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same failed swap, with the first uncordon request failing (the backend logs it and the node stays
    cordoned): it is sent again a second later and succeeds, the late pod lands on the kept node, and no request
    follows once the node is seen schedulable."""
    calls: list[tuple[str, float]] = []
    real = SimCluster.uncordon

    def flaky(self: SimCluster, node_name: str) -> None:
        calls.append((node_name, self.engine.now()))
        if len(calls) > 1:  # the first request fails (an API error, logged by the adapter): nothing changes
            real(self, node_name)

    monkeypatch.setattr(SimCluster, "uncordon", flaky)
    text = SPOT_SIM.replace("policy:", LATE + "policy:").replace("  devicePluginDelay: 60s\n", STUCK)
    text = text.format(extra=", spotToSpot: true, deadlines: {gpuInit: 5m}")
    res = simulate_policy(parse_scenario(text, source="s.yaml", catalog=SPOT_CAT), "gpuscale")
    (aborted,) = [e for e in res.cluster.events if e.kind == "ReplaceAborted"]
    assert len(calls) == 2 and calls[0][0] == calls[1][0]  # retried once, nothing after it succeeded
    assert aborted.at <= calls[0][1] < calls[1][1] < 27 * 60
    ups = [e.message for e in res.cluster.events if e.kind == "ScaleUp" and "to replace" not in e.message]
    assert ups == ["launched big spot in z1 ($0.26/h) for 1 pod(s)"]  # none for the late pod: the node took it


# ------------------------------------------------------------------------------------------------ Kubernetes
@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    pytest.importorskip("lightkube")
    with KubeAPIServer() as srv:
        yield srv


def _wait(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def _node(name: str, **spec: object) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": spec, "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}


def test_kube_uncordon_undoes_gpuscales_cordon_only(server: KubeAPIServer) -> None:
    other = {"key": "team", "value": "a", "effect": "NoSchedule"}
    server.create("nodes", _node("ours", taints=[other]))
    server.create("nodes", _node("human", unschedulable=True))
    proc = ControllerProcess(client_for(server), load_catalog("linode"), "kwok", clock=ManualClock(1e6))
    proc = proc.start(sync_timeout_s=5)
    try:
        be = proc.backend
        _wait(lambda: len(be.list_nodes()) == 2)
        be.cordon("ours")
        cordoned = server.get("nodes", "ours")
        assert cordoned is not None and cordoned["spec"]["unschedulable"] is True
        assert [t["key"] for t in cordoned["spec"]["taints"]] == ["team", DISRUPTED_TAINT]
        _wait(lambda: any(n.name == "ours" and n.unschedulable for n in be.list_nodes()))
        be.uncordon("ours")
        node = server.get("nodes", "ours")
        assert node is not None and not node["spec"].get("unschedulable")
        assert [t["key"] for t in node["spec"]["taints"]] == ["team"]  # gpuscale's taint gone, the others kept
        _wait(lambda: any(n.name == "ours" and not n.unschedulable for n in be.list_nodes()))
        patches = server.requests().count(("patch", "nodes"))
        be.uncordon("ours")  # idempotent: nothing left to undo, no request
        be.uncordon("human")  # cordoned by a person (no gpuscale taint): left alone
        be.uncordon("gone")  # no such node: ignored
        assert server.requests().count(("patch", "nodes")) == patches
        human = server.get("nodes", "human")
        assert human is not None and human["spec"]["unschedulable"] is True
    finally:
        proc.close()
