"""GPRs as custom resources, end to end over real HTTP: a GPUProvisioningRequest applied to the emulated API server is
admitted, served by the GPR manager on the kwok provider (nodes with its labels and taints), Provisioned, expires
and is released; an invalid one gets ``Invalid``; a restart mid-provisioning neither leaks nor doubles a node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuscale.core.gpr import GPR_LABEL, GPR_TAINT
from gpuscale.core.nodeclaim import ClaimPhase
from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube import API_VERBS, PREFLIGHT_VERBS
from gpuscale.kube.gpr_store import RECORD_FIELD, gpr_id_for
from gpuscale.kube.kwok import KwokConfig

pytest.importorskip("lightkube")

from test_kube_e2e import CATALOG, POOL, World, gpu_pod  # the e2e world: emulator, scheduler, manual clock

CRD = yaml.safe_load((Path(__file__).parents[1] / "deploy" / "crds" / "gpuprovisioningrequest.yaml").read_text())
STATUS_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


def gpr(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuscale.io/v1alpha1",
        "kind": "GPUProvisioningRequest",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "requestName": name,
            "gpuShape": "RTX4000-Ada",
            "numberOfGPUs": 1,
            "numberOfGPUNodes": 2,
            "exitDuration": "1h",
            **spec,
        },
    }


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", POOL)
        yield srv


@pytest.fixture
def world(server: KubeAPIServer) -> Iterator[World]:
    w = World(server, KwokConfig(device_plugin_delay_s=30))  # GPUs show 30 s after a node is created
    yield w
    w.close()


def status(server: KubeAPIServer, name: str) -> dict[str, Any]:
    obj = server.get("gpuprovisioningrequests", name, namespace="ml")
    assert obj is not None
    return dict(obj.get("status") or {})


def gpr_nodes(server: KubeAPIServer, gpr_id: str) -> list[dict[str, Any]]:
    return [n for n in server.items("nodes") if (n["metadata"].get("labels") or {}).get(GPR_LABEL) == gpr_id]


def _gpr_claims_initialized(world: World, gpr_id: str) -> bool:
    claims = [c for k, c in world.proc.controller.claims.items() if k.startswith(gpr_id)]
    return len(claims) == 2 and all(c.phase is ClaimPhase.INITIALIZED for c in claims)


def events_on(world: World, name: str) -> list[str]:
    world.proc.backend.events.flush()
    return [
        str(e["reason"])
        for e in world.server.items("events")
        if (e.get("involvedObject") or {}).get("kind") == "GPUProvisioningRequest"
        and e["involvedObject"]["name"] == name
    ]


def test_a_gpr_applied_as_a_cr_is_provisioned_then_expires_and_is_released(world: World, server: KubeAPIServer) -> None:
    created = server.create("gpuprovisioningrequests", gpr("train"), namespace="ml")
    gpr_id = gpr_id_for(created)
    world.until(lambda: len(gpr_nodes(server, gpr_id)) == 2)
    st = status(server, "train")
    assert st["gprId"] == gpr_id and st["provisioningStatus"] == "Provisioning"
    for node in gpr_nodes(server, gpr_id):
        assert node["metadata"]["labels"][GPR_LABEL] == gpr_id
        taints = {(t["key"], t.get("value"), t["effect"]) for t in node["spec"]["taints"]}
        assert (GPR_TAINT, gpr_id, "NoSchedule") in taints
    assert not st[RECORD_FIELD]["journal"], "launches done: nothing left in doubt"
    world.until(lambda: status(server, "train")["provisioningStatus"] == "Provisioned", advance=10)
    st = status(server, "train")
    assert st["numGPUsAllocated"] == 2 and sorted(st["nodeList"]) == sorted(
        n["metadata"]["name"] for n in gpr_nodes(server, gpr_id)
    )
    jsonschema.validate(st, STATUS_SCHEMA)  # what the API server would keep (nothing pruned, nothing refused)
    ready = {c["type"]: c for c in st["conditions"]}
    assert ready["Ready"]["status"] == "True" and ready["Queued"]["status"] == "False"
    # One engine: the controller's claim table holds the GPR's nodes and follows them to Initialized (GPUs
    # allocatable, 30 s after creation here) like its own, so let the device plugin show them before the long jump.
    world.until(lambda: _gpr_claims_initialized(world, gpr_id), advance=10)
    world.round(3600)  # the exit duration passes
    world.until(lambda: not gpr_nodes(server, gpr_id))
    assert status(server, "train")["provisioningStatus"] == "Complete"
    reasons = events_on(world, "train")
    assert reasons[:3] == ["Queued", "Provisioning", "Provisioned"] and "Expired" in reasons
    assert set(server.requests()) <= set(API_VERBS) | set(PREFLIGHT_VERBS), "RBAC grants everything used"


def test_deleting_the_object_gives_its_nodes_back(world: World, server: KubeAPIServer) -> None:
    created = server.create("gpuprovisioningrequests", gpr("short"), namespace="ml")
    gpr_id = gpr_id_for(created)
    world.until(lambda: len(gpr_nodes(server, gpr_id)) == 2)
    server.delete("gpuprovisioningrequests", "short", namespace="ml")
    world.until(lambda: not gpr_nodes(server, gpr_id))


def test_pool_status_counts_nodes_gpus_and_cost(world: World, server: KubeAPIServer) -> None:
    def pool_status() -> dict[str, Any]:
        pool = server.get("gpunodepools", "ada", namespace="")
        assert pool is not None
        return dict(pool.get("status") or {})

    world.round(0)
    assert pool_status()["nodes"] == 0 and pool_status()["conditions"][0]["type"] == "Ready"
    server.create("pods", gpu_pod("p-0"), namespace="ml")
    world.scheduler.step()
    world.until(lambda: pool_status().get("nodes") == 1)
    st = pool_status()
    assert st["gpus"] == 1 and st["hourlyCost"] > 0
    assert st["conditions"][0]["status"] == "True" and "1 node(s)" in st["conditions"][0]["message"]


def test_an_invalid_cr_gets_an_invalid_condition_and_an_event_not_a_crash(world: World, server: KubeAPIServer) -> None:
    server.create("gpuprovisioningrequests", gpr("bad", numberOfGPUs=9, gpuShape="NoSuchGPU"), namespace="ml")
    world.round(1)
    world.round(1)
    st = status(server, "bad")
    (cond,) = [c for c in st["conditions"] if c["type"] == "Invalid"]
    assert cond["status"] == "True" and cond["reason"] == "InvalidSpec"
    assert "spec.gpuShape" in cond["message"] and "fix the spec" in cond["message"]
    assert RECORD_FIELD not in st
    assert events_on(world, "bad") == ["InvalidSpec"], "one event, not one per round"
    assert not [n for n in server.items("nodes") if (n["metadata"].get("labels") or {}).get(GPR_LABEL)]
    server.patch("gpuprovisioningrequests", "bad", {"spec": {"gpuShape": "RTX4000-Ada", "numberOfGPUs": 1}}, "ml")
    world.until(lambda: status(server, "bad").get("provisioningStatus") == "Provisioning")
    assert not [c for c in status(server, "bad")["conditions"] if c["type"] == "Invalid"]


def test_a_restart_mid_provisioning_neither_leaks_nor_doubles_a_node(world: World, server: KubeAPIServer) -> None:
    created = server.create("gpuprovisioningrequests", gpr("resume"), namespace="ml")
    gpr_id = gpr_id_for(created)
    world.until(lambda: len(gpr_nodes(server, gpr_id)) == 2)
    names = {n["metadata"]["name"] for n in gpr_nodes(server, gpr_id)}
    assert status(server, "resume")["provisioningStatus"] == "Provisioning"
    world.restart()
    for _ in range(3):
        world.round(1)
    assert {n["metadata"]["name"] for n in gpr_nodes(server, gpr_id)} == names
    world.until(lambda: status(server, "resume")["provisioningStatus"] == "Provisioned", advance=10)
    assert {n["metadata"]["name"] for n in gpr_nodes(server, gpr_id)} == names
    assert len([n for n in server.items("nodes") if (n["metadata"].get("labels") or {}).get(GPR_LABEL)]) == 2


def test_a_restart_with_an_intent_in_doubt_redoes_it_once(world: World, server: KubeAPIServer) -> None:
    """The launch was journalled in the CR but the process died before acting: the restarted controller finds
    the entry, reports it in doubt, and the launch is redone under the same request id (two nodes, not four)."""
    created = server.create("gpuprovisioningrequests", gpr("doubt"), namespace="ml")
    gpr_id = gpr_id_for(created)
    manager = world.proc.gpr_manager
    assert manager is not None

    def killed(*_: object, **__: object) -> None:
        raise KeyboardInterrupt("the process dies between persisting the plan and launching")

    manager._launch = killed  # type: ignore[method-assign]
    world.settle()
    with pytest.raises(KeyboardInterrupt):
        world.proc.step()
    world.settle()
    assert status(server, "doubt")["provisioningStatus"] == "Provisioning"
    assert not gpr_nodes(server, gpr_id)
    assert status(server, "doubt")[RECORD_FIELD]["journal"], "the intent is in the object"
    world.restart()
    assert world.proc.gpr_store is not None
    assert not world.proc.gpr_store.journal(pending_only=True), "in-doubt entries reported and closed at start"
    world.until(lambda: status(server, "doubt")["provisioningStatus"] == "Provisioned", advance=10)
    assert len(gpr_nodes(server, gpr_id)) == 2
    assert not status(server, "doubt")[RECORD_FIELD]["journal"]


def test_a_conflicting_status_write_is_dropped_and_retried_next_round(world: World, server: KubeAPIServer) -> None:
    server.create("gpuprovisioningrequests", gpr("race"), namespace="ml")
    world.round(0)
    store = world.proc.gpr_store
    assert store is not None
    (stored,) = store.list_gprs()
    server.patch("gpuprovisioningrequests", "race", {"metadata": {"labels": {"team": "x"}}}, "ml")  # rv moves on
    from gpuscale.gpr.store import StaleWrite

    with pytest.raises(StaleWrite):
        store.apply([(stored.gpr, stored.version - 1)], [], [], now=0.0)
    gpr_id = stored.gpr.gpr_id
    world.until(lambda: status(server, "race")["provisioningStatus"] == "Provisioned", advance=10)
    assert len(gpr_nodes(server, gpr_id)) == 2


def test_a_failed_launch_is_a_failed_gpr_with_a_warning_event(server: KubeAPIServer) -> None:
    rtx4000 = {it.name for it in CATALOG.instance_types if it.gpu_model == "RTX4000-Ada"}
    w = World(server, KwokConfig(unavailable_types=rtx4000))
    try:
        server.create("gpuprovisioningrequests", gpr("nocap", numberOfGPUNodes=1), namespace="ml")
        w.until(lambda: status(server, "nocap").get("provisioningStatus") == "Failed")
        st = status(server, "nocap")
        assert "no capacity" in st["failureReason"]
        assert {c["type"]: c["status"] for c in st["conditions"]} == {"Ready": "False", "Queued": "False"}
        w.proc.backend.events.flush()
        failed = [
            e
            for e in server.items("events")
            if e.get("reason") == "Failed" and (e.get("involvedObject") or {}).get("name") == "nocap"
        ]
        assert len(failed) == 1 and failed[0]["type"] == "Warning" and "no capacity" in str(failed[0]["message"])
        assert not [n for n in server.items("nodes") if (n["metadata"].get("labels") or {}).get(GPR_LABEL)]
    finally:
        w.close()


def test_editing_the_priority_of_an_admitted_gpr_is_applied(world: World, server: KubeAPIServer) -> None:
    server.create("gpuprovisioningrequests", gpr("prio", priority=101), namespace="ml")
    world.until(lambda: RECORD_FIELD in status(server, "prio"))
    server.patch("gpuprovisioningrequests", "prio", {"spec": {"priority": 250, "numberOfGPUs": 2}}, "ml")
    world.until(lambda: status(server, "prio")[RECORD_FIELD]["spec"]["priority"] == 250)
    assert status(server, "prio")[RECORD_FIELD]["spec"]["numberOfGPUs"] == 1, "other edits are not applied"
    server.patch("gpuprovisioningrequests", "prio", {"spec": {"priority": "urgent"}}, "ml")
    world.round(1)  # an edit the reader refuses is logged and left alone, never a crash
    assert status(server, "prio")[RECORD_FIELD]["spec"]["priority"] == 250


def test_gpr_queue_length_and_wait_reach_the_metrics(world: World, server: KubeAPIServer) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuscale.kube.metrics import ControllerMetrics

    server.create("gpuprovisioningrequests", gpr("wait", numberOfGPUNodes=1), namespace="ml")
    world.round(0)
    (entry,) = world.proc._gpr_queue()
    assert entry.gpr_id.startswith("gpr-") and entry.since > 0
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    now = world.clock.now()
    metrics.observe((), (), now, gprs=[type(entry)(entry.gpr_id, True, now - 90)])
    metrics.observe((), (), now + 10, gprs=[type(entry)(entry.gpr_id, False, now)])  # it left the queue
    text = generate_latest(registry).decode()
    assert "gpuscale_gpr_queue_length 0.0" in text
    assert "gpuscale_gpr_wait_seconds_count 1.0" in text


def test_a_gpr_borrows_a_free_node_of_the_engine_and_gives_it_back(world: World, server: KubeAPIServer) -> None:
    """One engine on a real API server: a GPR arriving while a free node of the pool exists labels and taints that
    node (no launch); deleting the GPR removes its label and taint, and the node is the pool's again."""
    from test_kube_e2e import _bound

    server.create("pods", gpu_pod("warm-0"), namespace="ml")
    world.until(lambda: _bound(server, "warm-0") is not None, advance=10)
    world.scheduler.complete("ml/warm-0")
    world.round(1)
    (free,) = [n["metadata"]["name"] for n in world.kwok_nodes()]
    created = server.create("gpuprovisioningrequests", gpr("borrow", numberOfGPUNodes=1), namespace="ml")
    gpr_id = gpr_id_for(created)
    world.until(lambda: status(server, "borrow").get("provisioningStatus") == "Provisioned")
    assert [n["metadata"]["name"] for n in gpr_nodes(server, gpr_id)] == [free]
    assert len(world.kwok_nodes()) == 1  # borrowed, not launched
    node = server.get("nodes", free)
    assert node is not None
    taints = {(t["key"], t.get("value"), t["effect"]) for t in node["spec"]["taints"]}
    assert (GPR_TAINT, gpr_id, "NoSchedule") in taints
    world.round(120)  # past consolidateAfter: a held node is not consolidated
    assert [n["metadata"]["name"] for n in world.kwok_nodes()] == [free]
    server.delete("gpuprovisioningrequests", "borrow", namespace="ml")
    world.until(lambda: not gpr_nodes(server, gpr_id))
    node = server.get("nodes", free)
    assert node is not None and GPR_LABEL not in node["metadata"].get("labels", {})
    assert not [t for t in node["spec"].get("taints") or [] if t["key"] == GPR_TAINT]
    world.until(lambda: not world.kwok_nodes(), advance=40)  # then consolidated like any empty node
    assert set(server.requests()) <= set(API_VERBS) | set(PREFLIGHT_VERBS), "RBAC grants everything used"
