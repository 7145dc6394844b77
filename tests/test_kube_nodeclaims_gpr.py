"""GPUNodeClaims over real HTTP against the emulated API server, beyond the pods' own claims: the nodes of a
multi-node GPR are recorded (one object each, named from the claim key) and restored after a restart mid-launch; a
record deleted by hand is created again; a replica that loses the Lease and wins it back restores from the records."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gpuscale.core.gpr import GPR_LABEL
from gpuscale.core.leader import ElectionConfig
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube import API_VERBS, PREFLIGHT_VERBS
from gpuscale.kube.command import ControllerProcess
from gpuscale.kube.endpoints import ProcessEndpoints
from gpuscale.kube.gpr_store import gpr_id_for
from gpuscale.kube.kwok import KwokConfig
from gpuscale.manifests.nodeclaims import object_name
from kube_harness import CONFIG, client_for, kwok_pool
from test_kube_e2e import gpu_pod
from test_kube_gpr import gpr, gpr_nodes, status
from test_kube_nodeclaims import CATALOG, RES, ClaimWorld, LaggingKwok, _bound, _records

pytest.importorskip("lightkube")


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", kwok_pool(consolidate_after="60s"))
        yield srv


def _gpr_records(server: KubeAPIServer, gpr_id: str) -> dict[str, dict[str, Any]]:
    return {k: o for k, o in _records(server).items() if (o["metadata"].get("labels") or {}).get(GPR_LABEL) == gpr_id}


def test_a_two_node_gpr_is_recorded_and_a_restart_mid_launch_restores_both_nodes(server: KubeAPIServer) -> None:
    w = ClaimWorld(server, kwok=KwokConfig(device_plugin_delay_s=30))  # GPUs show 30 s after a node is created
    try:
        created = server.create("gpuprovisioningrequests", gpr("train"), namespace="ml")
        gpr_id = gpr_id_for(created)
        w.until(lambda: len(gpr_nodes(server, gpr_id)) == 2)
        w.written()
        keys = sorted(k for k in w.proc.controller.claims if k.startswith(gpr_id))
        assert len(keys) == 2 and "#" not in keys[0] and keys[1].startswith(keys[0] + "#"), keys
        records = _gpr_records(server, gpr_id)
        assert sorted(records) == sorted(object_name(k) for k in keys), "one record per node, named from its key"
        assert sorted(r["spec"]["requestId"] for r in records.values()) == keys, "the full key is kept"
        second = records[object_name(keys[1])]
        assert second["metadata"]["name"] == keys[1].replace("#", ".")
        assert second["metadata"]["labels"] == {"gpuscale.io/pool": "ada", GPR_LABEL: gpr_id}
        assert {r["status"]["reason"] for r in records.values()} == {f"GPR {gpr_id}"}
        assert status(server, "train")["provisioningStatus"] == "Provisioning", "the GPUs are not there yet"
        names = {n["metadata"]["name"] for n in gpr_nodes(server, gpr_id)}

        w.kill()  # mid-launch: nodes made, not initialised, GPR not Provisioned
        w.next_provider = {"hidden": 2}  # the new controller's first node lists lag behind
        w.proc = w.start()
        w.round(1)
        claims = w.proc.controller.claims
        assert sorted(k for k in claims if k.startswith(gpr_id)) == keys, "both restored under their keys"
        assert {claims[k].reason for k in keys} == {f"GPR {gpr_id}"}, "from the records, not adopted"
        assert w.proc.controller.gpr.keys(claims) == frozenset(keys), "held for the GPR"
        w.until(lambda: status(server, "train")["provisioningStatus"] == "Provisioned", advance=10)
        assert {n["metadata"]["name"] for n in gpr_nodes(server, gpr_id)} == names, "no leak, no duplicate"
        assert len(w.kwok_nodes()) == 2 and len(_records(server)) == 2
        assert all(isinstance(p, LaggingKwok) for p in w.providers)
        assert sum(len(p.launched) for p in w.providers[1:]) <= 1, "at most the same launch redone (idempotent)"
        w.until(lambda: all(claims[k].phase is ClaimPhase.INITIALIZED for k in keys), advance=10)
        w.written()
        assert {r["status"]["phase"] for r in _gpr_records(server, gpr_id).values()} == {"Initialized"}
        assert set(server.requests()) <= set(API_VERBS) | set(PREFLIGHT_VERBS), "RBAC grants everything used"
    finally:
        w.close()


def test_a_record_deleted_by_hand_is_created_again_within_a_few_rounds(server: KubeAPIServer) -> None:
    w = ClaimWorld(server)
    try:
        server.create("pods", gpu_pod("keep-0"), namespace="ml")
        w.scheduler.step()
        w.until(lambda: _bound(server, "keep-0") is not None)
        (rid,) = w.proc.controller.claims
        w.until(lambda: _records(server).get(rid, {}).get("status", {}).get("phase") == "Initialized")
        w.round(1)  # the writer has seen its object in the cache
        before = _records(server)[rid]
        server.delete(RES, rid)  # kubectl delete gpunodeclaim <name>
        w.settle()
        assert rid not in _records(server)
        for _ in range(3):
            w.round(1)
            if rid in _records(server) and _records(server)[rid].get("status"):
                break
        after = _records(server)[rid]
        assert after["spec"] == before["spec"] and after["status"] == before["status"], "the same record again"
        assert after["metadata"]["uid"] != before["metadata"]["uid"], "a new object"
        writer = w.proc.nodeclaims
        assert writer is not None and writer.recreated == 1
        n = writer.writes
        for _ in range(3):
            w.round(1)
        assert writer.writes == n and writer.recreated == 1, "nothing written while nothing changes"

        # deleted again, and the claim changes before the writer looked at the cache: its status patch finds no
        # object (404), and the same write creates it again
        writer.cache = None
        server.delete(RES, rid)
        w.settle()
        claims = w.proc.controller.claims
        claims[rid] = replace(claims[rid], reason="checked by hand")
        writer.flush()
        w.written()
        again = _records(server)[rid]
        assert again["status"]["reason"] == "checked by hand" and again["status"]["phase"] == "Initialized"
        assert again["metadata"]["uid"] != after["metadata"]["uid"] and writer.recreated == 1
    finally:
        w.close()


# --------------------------------------------------------------------------------------------------- leadership
ELECTION = ElectionConfig(lease_duration_s=100.0, renew_deadline_s=60.0, retry_period_s=0.1)
"""Tries every 100 ms of real time; the manual clock's jumps stay well inside the renew deadline."""


def _replica(server: KubeAPIServer, clock: Any, identity: str, kwok: KwokConfig) -> ControllerProcess:
    proc = ControllerProcess(client_for(server), CATALOG, "kwok", clock=clock, config=CONFIG, kwok=kwok)
    proc.start(sync_timeout_s=5, check=False)  # access checks: tests/test_kube_e2e.py
    proc.endpoints = ProcessEndpoints(
        proc.client, proc.cache, clock, namespace="gpuscale", leader_elect=True, metrics_port=0, health_port=0,
        host="127.0.0.1", identity=identity, election=ELECTION,
    ).start()  # fmt: skip
    return proc


def _wait(cond: Any, what: str) -> None:
    for _ in range(400):
        if cond():
            return
        time.sleep(0.025)
    raise AssertionError(what)


def _hand_lease(server: KubeAPIServer, to: ControllerProcess, other: ControllerProcess) -> None:
    """The Lease changes hands (as when the holder misses its renewals): ``to`` leads, ``other`` stands by."""
    assert to.endpoints is not None and to.endpoints.elector is not None and other.endpoints is not None
    (lease,) = server.items("leases")
    server.patch("leases", lease["metadata"]["name"], {"spec": {"holderIdentity": to.endpoints.elector.identity}},
                 "gpuscale")  # fmt: skip
    _wait(lambda: to.endpoints.may_act() and not other.endpoints.may_act(), "the Lease did not change hands")


def test_a_replica_that_wins_the_lease_back_restores_its_claims_from_the_records(server: KubeAPIServer) -> None:
    from gpuscale.clock import ManualClock
    from kube_harness import Scheduler

    server.create("namespaces", {"metadata": {"name": "gpuscale"}})
    clock = ManualClock(1_000_000.0)
    kwok = KwokConfig()
    scheduler = Scheduler(server)
    a = _replica(server, clock, "replica-a", kwok)
    procs = [a]
    try:
        assert a.endpoints is not None
        _wait(a.endpoints.may_act, "replica-a never led")
        b = _replica(server, clock, "replica-b", kwok)
        procs.append(b)

        def rounds(n: int = 1, advance: float = 1.0) -> None:
            for _ in range(n):
                time.sleep(0.1)  # the watches deliver
                for p in procs:
                    p.step()
                    if p.nodeclaims is not None:
                        p.nodeclaims.settle()
                time.sleep(0.05)
                scheduler.step()
                clock.sleep(advance)

        def until(cond: Any, n: int = 30) -> None:
            for _ in range(n):
                if cond():
                    return
                rounds()
            assert cond(), "condition not reached"

        server.create("pods", gpu_pod("first-0"), namespace="ml")
        scheduler.step()
        until(lambda: _bound(server, "first-0") is not None)
        (first,) = a.controller.claims
        stale = a.controller
        assert b.rounds == 0

        _hand_lease(server, b, a)
        rounds()  # a notices it stands by; b restores from the records and leads
        assert b.nodeclaims is not None and b.nodeclaims.restored and first in b.controller.claims
        server.create("pods", gpu_pod("second-0"), namespace="ml")  # first-0 keeps its node busy: a new node
        scheduler.step()
        until(lambda: _bound(server, "second-0") is not None)
        (second,) = [k for k in b.controller.claims if k != first]
        assert second not in a.controller.claims, "a's table is stale"
        until(lambda: _records(server).get(second, {}).get("status", {}).get("phase") == "Initialized")

        _hand_lease(server, a, b)
        rounds()
        claims = a.controller.claims
        assert claims.get(second) is not None and claims[second].pods == ("ml/second-0",), (
            "restored from its record (an adopted claim has no pods)"
        )
        assert sorted(claims) == sorted([first, second])
        assert a.controller is not stale, "rebuilt on winning the Lease back"
        assert claims[second].phase is ClaimPhase.INITIALIZED
        rounds(3)
        kwok_nodes = [n for n in server.items("nodes") if (n["metadata"].get("labels") or {}).get("type") == "kwok"]
        assert len(kwok_nodes) == 2 and sorted(_records(server)) == sorted([first, second]), "no leak, no duplicate"
    finally:
        for p in procs:
            p.close()
