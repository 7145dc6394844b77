"""Insufficient capacity: a refused GPR launch marks its offering unavailable for a TTL and moves to the next
candidate offering (zone or instance type) instead of failing the attempt; the planner honours the marks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builders import GPR_SPEC
from gpuscale.core.gpr import (
    CapacityView,
    GprConfig,
    GprState,
    NodePoolDetails,
    Trigger,
    candidate_offerings,
    new_gpr,
    parse_gpr_spec,
    plan_gprs,
    retarget_launch,
    transition,
)
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering, OfferingKey
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.store import GprStore
from gpuscale.sim.cloud import CapacityRule, CloudBehaviour, SimCloud
from gpuscale.sim.engine import Dist, Engine

T0 = 1_700_000_000.0
TTL = 600.0


def _it(name: str, model: str, gpus: int, prices: dict[str, float]) -> InstanceType:
    return InstanceType(
        name=name,
        provider="sim",
        vcpus=8 * gpus,
        memory_mib=32768 * gpus,
        gpu_count=gpus,
        gpu_model=model,
        gpu_memory_mib=20480,
        offerings=tuple(Offering(z, CapacityType.ON_DEMAND, p) for z, p in prices.items()),
    )


CATALOG = Catalog(
    "capacity-test",
    (
        _it("ada4-s", "RTX4000-Ada", 4, {"z1": 2.96, "z2": 3.10}),
        _it("ada4-m", "RTX4000-Ada", 4, {"z1": 3.57}),
        _it("rtx6000-4", "RTX6000", 4, {"z1": 6.0}),
    ),
)

SPEC = GPR_SPEC


def _key(it: str, zone: str) -> OfferingKey:
    return OfferingKey(it, zone, CapacityType.ON_DEMAND)


def _world(tmp_path: Path, rules: tuple[CapacityRule, ...], **cfg: Any) -> tuple[GprManager, SimCloud, Engine]:
    engine = Engine(start=T0)
    d = Dist.const(5.0)
    behaviour = CloudBehaviour(
        launch_latency=d,
        registration_latency=d,
        device_plugin_delay=Dist.const(0.0),
        deletion_latency=d,
        capacity=rules,
    )
    cloud = SimCloud(engine, CATALOG, behaviour)
    config = GprConfig(unavailable_ttl_s=TTL, provider="sim", **cfg)
    m = GprManager(GprStore(tmp_path / "gpr.db"), CATALOG, config=config, provider=cloud, clock=engine.clock)
    return m, cloud, engine


def _zones_and_types(cloud: SimCloud) -> set[tuple[str, str]]:
    return {(n.instance_type, n.zone) for n in cloud.alive()}


def test_candidate_offerings_order_and_skip() -> None:
    spec = parse_gpr_spec(SPEC, CATALOG)
    names = [(it.name, o.zone) for it, o in candidate_offerings(spec, CATALOG)]
    assert names == [("ada4-s", "z1"), ("ada4-s", "z2"), ("ada4-m", "z1")]
    skipped = candidate_offerings(spec, CATALOG, {_key("ada4-s", "z1"), _key("ada4-s", "z2")})
    assert [(it.name, o.zone) for it, o in skipped] == [("ada4-m", "z1")]
    auto = parse_gpr_spec({**SPEC, "enableAutoGpuSelection": True}, CATALOG)
    assert [it.name for it, _ in candidate_offerings(auto, CATALOG)][-1] == "rtx6000-4"
    fixed = parse_gpr_spec({**SPEC, "gpuShape": None, "instanceType": "ada4-s"}, CATALOG)
    assert [o.zone for _, o in candidate_offerings(fixed, CATALOG)] == ["z1", "z2"]


def test_capacity_error_moves_the_launch_to_the_next_zone_in_the_same_reconcile(tmp_path: Path) -> None:
    m, cloud, engine = _world(tmp_path, (CapacityRule(0, instance_type="ada4-s", zone="z1"),))
    g = m.create(SPEC)
    r = m.reconcile()
    assert r.launched == [f"{g.gpr_id}-a0"] and "insufficient capacity" in r.errors[0]
    got = m.get(g.gpr_id)
    assert got.state is GprState.PROVISIONING
    d = got.status.node_pool_details
    assert (d.instance_type, d.zone, d.request_id) == ("ada4-s", "z2", f"{g.gpr_id}-a0")
    assert got.status.cost == pytest.approx(2 * 3.10 * 8, abs=1e-6)  # the estimate follows the new offering
    assert _zones_and_types(cloud) == {("ada4-s", "z2")} and len(cloud.alive()) == 2
    assert m.unavailable_offerings == {_key("ada4-s", "z1"): T0 + TTL}
    assert cloud.counters.insufficient_capacity == 1 and cloud.counters.duplicate_nodes == 0
    kinds = [(e.kind, e.payload.get("type"), e.outcome) for e in m.store.journal()]
    assert kinds[-2][0] == "launch" and (kinds[-2][2] or "").startswith("error: insufficient capacity")
    assert kinds[-1] == ("launch", "ada4-s", "ok")
    engine.run_until(T0 + 20)
    m.reconcile()
    assert m.get(g.gpr_id).state is GprState.PROVISIONED


def test_auto_gpu_selection_falls_back_to_another_gpu_model(tmp_path: Path) -> None:
    no_ada = (CapacityRule(0, instance_type="ada4-s"), CapacityRule(0, instance_type="ada4-m"))
    m, cloud, _ = _world(tmp_path, no_ada)
    g = m.create({**SPEC, "enableAutoGpuSelection": True})
    m.reconcile()
    got = m.get(g.gpr_id)
    assert got.state is GprState.PROVISIONING and got.status.node_pool_details.instance_type == "rtx6000-4"
    assert _zones_and_types(cloud) == {("rtx6000-4", "z1")}
    assert cloud.counters.insufficient_capacity == 3  # ada4-s z1, ada4-s z2, ada4-m z1: each tried once
    assert set(m.unavailable_offerings) == {_key("ada4-s", "z1"), _key("ada4-s", "z2"), _key("ada4-m", "z1")}


def test_without_a_candidate_left_the_attempt_fails_with_the_reason(tmp_path: Path) -> None:
    no_ada = (CapacityRule(0, instance_type="ada4-s"), CapacityRule(0, instance_type="ada4-m"))
    m, cloud, _ = _world(tmp_path, no_ada)
    g = m.create(SPEC)  # RTX4000-Ada only: three offerings, all refused
    r = m.reconcile()
    got = m.get(g.gpr_id)
    assert got.state is GprState.FAILED and "insufficient capacity for ada4-m" in got.status.failure_reason
    assert [t.trigger for t in r.transitions][-1] is Trigger.PROVISIONING_FAILED
    assert cloud.counters.insufficient_capacity == 3 and cloud.alive() == []


def test_marks_steer_later_gprs_and_expire_after_the_ttl(tmp_path: Path) -> None:
    # ada4-s/z1 has no capacity for the first 15 minutes only.
    m, cloud, engine = _world(tmp_path, (CapacityRule(0, instance_type="ada4-s", zone="z1", end=T0 + 900),))
    first = m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    assert cloud.counters.insufficient_capacity == 1
    engine.run_until(T0 + 60)
    second = m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    # Within the TTL the marked offering is not tried again: the second GPR is admitted on z2 directly.
    assert m.get(second.gpr_id).status.node_pool_details.zone == "z2"
    assert cloud.counters.insufficient_capacity == 1
    engine.run_until(T0 + TTL + 400)  # the mark expired and the capacity is back
    assert m.unavailable_offerings == {}
    third = m.create({**SPEC, "numberOfGPUNodes": 1})
    m.reconcile()
    assert m.get(third.gpr_id).status.node_pool_details.zone == "z1"
    assert m.get(first.gpr_id).status.node_pool_details.zone == "z2"
    assert cloud.counters.insufficient_capacity == 1 and cloud.counters.launch_calls == 4


def test_same_pass_launches_skip_an_offering_marked_moments_ago(tmp_path: Path) -> None:
    m, cloud, _ = _world(tmp_path, (CapacityRule(0, instance_type="ada4-s", zone="z1"),))
    a = m.create({**SPEC, "numberOfGPUNodes": 1, "priority": 250})
    b = m.create({**SPEC, "numberOfGPUNodes": 1, "priority": 150})
    m.reconcile()  # both were planned on ada4-s/z1; only the first launch asks the cloud there
    assert cloud.counters.insufficient_capacity == 1
    assert {m.get(x.gpr_id).status.node_pool_details.zone for x in (a, b)} == {"z2"}
    assert len(cloud.alive()) == 2


def test_a_queued_gpr_whose_every_offering_is_marked_waits_with_a_reason_and_an_estimate() -> None:
    spec = parse_gpr_spec(SPEC, CATALOG)
    g = new_gpr("gpr-000000000001", spec, CATALOG, T0)
    marks = {_key("ada4-s", "z1"): T0 + 300, _key("ada4-s", "z2"): T0 + 500, _key("ada4-m", "z1"): T0 + 900}
    cfg = GprConfig(scale_up_latency_s=120.0)
    plan = plan_gprs([g], CapacityView(unavailable=marks), CATALOG, cfg, T0)
    got = plan.by_id()[g.gpr_id]
    assert got.state is GprState.QUEUED and plan.launches == ()
    assert "insufficient capacity for every candidate offering" in got.status.failure_reason
    assert "2023-11-14T22:18:20Z" in got.status.failure_reason  # T0 + 300: the first mark to expire
    assert got.status.estimated_wait_time_s == pytest.approx(300 + 120)
    # Expired marks are ignored: at T0 + 600 two offerings are back and the cheapest free one is used.
    later = plan_gprs([g], CapacityView(unavailable=marks), CATALOG, cfg, T0 + 600)
    (launch,) = later.launches
    assert (launch.instance_type, launch.zone) == ("ada4-s", "z1")


def test_planner_retargets_a_provisioning_gpr_on_the_next_reconcile() -> None:
    spec = parse_gpr_spec(SPEC, CATALOG)
    g = transition(new_gpr("gpr-000000000002", spec, CATALOG, T0), Trigger.ADMIT, T0)
    details = NodePoolDetails(pool=g.gpr_id, instance_type="ada4-s", zone="z1", request_id=g.request_id, count=2)
    g = replace(g, status=replace(g.status, node_pool_details=details, scale_up_triggered=True))
    view = CapacityView(unavailable={_key("ada4-s", "z1"): T0 + TTL})
    plan = plan_gprs([g], view, CATALOG, GprConfig(), T0 + 10)
    (launch,) = plan.launches
    assert (launch.instance_type, launch.zone, launch.request_id, launch.count) == ("ada4-s", "z2", g.request_id, 2)
    assert plan.by_id()[g.gpr_id].status.node_pool_details.zone == "z2"
    everything = {_key(it.name, o.zone): T0 + TTL for it, o in candidate_offerings(spec, CATALOG)}
    failed = plan_gprs([g], CapacityView(unavailable=everything), CATALOG, GprConfig(), T0 + 10).by_id()[g.gpr_id]
    assert failed.state is GprState.FAILED and "every candidate offering" in failed.status.failure_reason
    assert retarget_launch(g, CATALOG, set(everything)) is None
