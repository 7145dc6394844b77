"""The pure GPR core: durations, validation, state machine, queue, delays, eviction, wait times, cost, timeouts."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from gpuscale.core.durations import parse_egs_duration as parse_duration
from gpuscale.core.gpr import (
    GPR_LABEL,
    GPR_TAINT,
    TRANSITIONS,
    CapacityView,
    Gpr,
    GprConfig,
    GprNode,
    GprState,
    GprStatus,
    GprValidationError,
    IllegalTransition,
    NodePoolDetails,
    Trigger,
    admits_pod,
    cancel,
    candidate_types,
    estimate_cost,
    format_duration,
    gpr_node_taints,
    gpr_to_dict,
    gpr_toleration,
    new_gpr,
    parse_gpr_spec,
    plan_gprs,
    priority_band,
    queue_order,
    request_release,
    spec_from_dict,
    spec_to_dict,
    status_from_record,
    status_to_record,
    transition,
    with_priority,
)
from gpuscale.core.model import CapacityType, Catalog, InstanceType, Offering, Pod, TaintEffect, Toleration
from gpuscale.errors import InputError

H = 3600.0
T0 = 1_700_000_000.0


def _it(name: str, model: str, gpus: int, price: float, mem_gib: int = 20) -> InstanceType:
    return InstanceType(
        name=name,
        provider="linode",
        vcpus=4 * gpus,
        memory_mib=32768 * gpus,
        gpu_count=gpus,
        gpu_model=model,
        gpu_memory_mib=mem_gib * 1024,
        offerings=(Offering("us-ord", CapacityType.ON_DEMAND, price),),
    )


CATALOG = Catalog(
    "test",
    (
        _it("g2-rtx4000a1-s", "RTX4000-Ada", 1, 0.52),
        _it("g2-rtx4000a4-s", "RTX4000-Ada", 4, 2.96),
        _it("g1-rtx6000-1", "RTX6000", 1, 1.5, 24),
    ),
)


def spec(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"requestName": "train", "gpuShape": "RTX4000 Ada", "exitDuration": "8h"}
    base.update(kw)
    return base


def gpr(gid: str, created: float = T0, **kw: object) -> Gpr:
    return new_gpr(gid, parse_gpr_spec(spec(**kw), CATALOG), CATALOG, created)


def node(name: str, model: str = "RTX4000-Ada", gpus: int = 1, **kw: Any) -> GprNode:
    itype = {"RTX4000-Ada": "g2-rtx4000a1-s", "RTX6000": "g1-rtx6000-1"}[model] if gpus == 1 else "g2-rtx4000a4-s"
    return GprNode(name=name, instance_type=itype, gpu_model=model, gpu_count=gpus, gpu_memory_mib=20480, **kw)


def holding(g: Gpr, nodes: tuple[str, ...], *, start: float, state: GprState = GprState.PROVISIONED) -> Gpr:
    st = replace(
        g.status,
        provisioning_status=state,
        internal_state="Reserved",
        start_timestamp=start if state is GprState.PROVISIONED else None,
        inventory_nodes=nodes,
        node_list=nodes,
        state_since=start,
    )
    return replace(g, status=st)


NO_DYN = GprConfig(enable_dynamic_node=False)


# ------------------------------------------------------------------------------------------------ durations
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0d8h0m", 8 * 3600),
        ("8h", 8 * 3600),
        ("30m", 1800),
        ("1d", 86400),
        ("1d2h3m4s", 86400 + 7200 + 180 + 4),
        (" 2H ", 7200),
        ("0d0h0m", 0),
        ("90s", 90),
    ],
)
def test_parse_duration_accepts_egs_forms(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "8", "h", "8h30", "30m8h", "1.5h", "8 h", "abc", "1w"])
def test_parse_duration_rejects_malformed(text: str) -> None:
    with pytest.raises(InputError, match="exitDuration: is not a duration"):
        parse_duration(text, where="exitDuration")


def test_parse_duration_rejects_negative() -> None:
    with pytest.raises(InputError, match="must not be negative"):
        parse_duration("-1h")


@pytest.mark.parametrize("seconds", [0, 59 * 60, 8 * 3600, 86400 + 3661, 3 * 86400 + 5 * 60])
def test_format_duration_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_format_duration_egs_style() -> None:
    assert format_duration(8 * 3600) == "0d8h0m"
    assert format_duration(86400 + 90) == "1d0h1m30s"


# ------------------------------------------------------------------------------------------------ validation
def _errors(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(GprValidationError) as exc:
        parse_gpr_spec(data, CATALOG)
    return {e.field: e.message for e in exc.value.errors}


def test_valid_spec_defaults() -> None:
    s = parse_gpr_spec(spec(idleTimeOutDuration="30m"), CATALOG)
    assert s.priority == 101 and s.number_of_gpu_nodes == 1 and s.number_of_gpus == 1
    assert s.exit_duration_s == 8 * 3600 and s.idle_timeout_s == 1800
    assert s.enforce_idle_timeout is True
    assert parse_gpr_spec(spec(), CATALOG).enforce_idle_timeout is False
    assert (
        parse_gpr_spec(spec(idleTimeOutDuration="30m", enforceIdleTimeOut=False), CATALOG).enforce_idle_timeout is False
    )


def test_spec_round_trips_through_egs_dict() -> None:
    s = parse_gpr_spec(
        spec(priority=250, numberOfGPUNodes=2, idleTimeOutDuration="0d0h30m", workloadSelector={"app": "train"}),
        CATALOG,
    )
    assert spec_from_dict(spec_to_dict(s)) == s


def test_validation_reports_every_bad_field_at_once() -> None:
    errs = _errors(
        spec(priority=301, numberOfGPUNodes=0, exitDuration="-2h", idleTimeOutDuration="soon", earlyRelease="yes")
    )
    assert set(errs) == {"priority", "numberOfGPUNodes", "exitDuration", "idleTimeOutDuration", "earlyRelease"}
    assert "between 1 and 300" in errs["priority"]
    assert "negative" in errs["exitDuration"]
    assert "not a duration" in errs["idleTimeOutDuration"]


@pytest.mark.parametrize(
    ("data", "field", "needle"),
    [
        (spec(priority=0), "priority", "got 0"),
        (spec(numberOfGPUs=0), "numberOfGPUs", "between 1 and 64"),
        (spec(exitDuration="8x"), "exitDuration", "not a duration"),
        (spec(exitDuration="0h"), "exitDuration", "longer than zero"),
        (spec(exitDuration=None), "exitDuration", "required"),
        (spec(requestName=""), "requestName", "required"),
        (spec(priorty=5), "priorty", "did you mean priority"),
        (spec(gpuShape="H100"), "gpuShape", "unknown GPU shape 'H100'"),
        (spec(numberOfGPUs=8), "numberOfGPUs", "at most 4"),
        (spec(gpuShape="RTX6000", memoryPerGpu=48), "memoryPerGpu", "at most 24 GB"),
        (spec(gpuShape=None), "gpuShape", "give gpuShape or instanceType"),
        (spec(gpuShape=None, instanceType="g2-rtx4000a1-x"), "instanceType", "did you mean g2-rtx4000a1-s"),
        (spec(gpuShape="RTX6000", instanceType="g2-rtx4000a1-s"), "gpuShape", "does not match"),
        (spec(numberOfGPUNodes="2"), "numberOfGPUNodes", "must be an integer"),
        (spec(workloadSelector={"app": "bad value!"}), "workloadSelector", "invalid label value"),
    ],
)
def test_validation_field_errors(data: dict[str, object], field: str, needle: str) -> None:
    errs = _errors(data)
    assert field in errs, errs
    assert needle in errs[field]


def test_unknown_fields_are_errors_and_egs_aliases_are_accepted() -> None:
    assert "someEgsOnlyField" in _errors(spec(someEgsOnlyField=True))
    assert "did you mean numberOfGPUs" in _errors(spec(numberOfGpus=4))["numberOfGpus"]
    data = spec(sliceName="team-a", memoryPerGPU=20)
    data["gprName"] = data.pop("requestName")
    s = parse_gpr_spec(data, CATALOG)
    assert (s.request_name, s.memory_per_gpu) == ("train", 20)


def test_shape_spellings_and_auto_selection() -> None:
    s = parse_gpr_spec(spec(gpuShape="NVIDIA RTX 4000 Ada Generation", numberOfGPUs=2), CATALOG)
    assert [it.name for it in candidate_types(s, CATALOG)] == ["g2-rtx4000a4-s"]
    auto = parse_gpr_spec(spec(gpuShape=None, enableAutoGpuSelection=True, memoryPerGpu=24), CATALOG)
    assert [it.name for it in candidate_types(auto, CATALOG)] == ["g1-rtx6000-1"]
    pref = parse_gpr_spec(spec(gpuShape="RTX6000", enableAutoGpuSelection=True), CATALOG)
    assert candidate_types(pref, CATALOG)[0].name == "g1-rtx6000-1"


def test_validation_against_the_shipped_linode_catalog() -> None:
    from gpuscale.catalogs import load_catalog

    cat = load_catalog("linode")
    s = parse_gpr_spec(spec(numberOfGPUs=4, numberOfGPUNodes=2), cat)
    assert candidate_types(s, cat)[0].gpu_count == 4
    with pytest.raises(GprValidationError, match="gpuShape: unknown GPU shape 'A100'"):
        parse_gpr_spec(spec(gpuShape="A100"), cat)


def test_priority_bands() -> None:
    bands = [priority_band(p) for p in (1, 100, 101, 200, 201, 300)]
    assert bands == ["low", "low", "medium", "medium", "high", "high"]


# ------------------------------------------------------------------------------------------------ state machine
EXPECTED_EDGES = {
    ("Queued", "admit"): "Provisioning",
    ("Queued", "cancel"): "Cancelled",
    ("Queued", "delay-limit"): "Failed",
    ("Queued", "unservable"): "Failed",
    ("Provisioning", "nodes-ready"): "Provisioned",
    ("Provisioning", "provisioning-failed"): "Failed",
    ("Provisioning", "early-release"): "Released",
    ("Provisioning", "evict"): "Evicted",
    ("Provisioned", "exit-duration"): "Complete",
    ("Provisioned", "early-release"): "Released",
    ("Provisioned", "idle-timeout"): "Released",
    ("Provisioned", "node-lost"): "Failed",
    ("Provisioned", "evict"): "Evicted",
    ("Failed", "requeue"): "Queued",
    ("Evicted", "requeue"): "Queued",
}


def test_transition_table_is_exactly_the_documented_lifecycle() -> None:
    assert {(s.value, t.value): n.value for (s, t), n in TRANSITIONS.items()} == EXPECTED_EDGES


@pytest.mark.parametrize(("state", "trigger"), list(itertools.product(GprState, Trigger)))
def test_every_edge_allowed_or_rejected(state: GprState, trigger: Trigger) -> None:
    g = gpr("gpr-1")
    g = replace(g, status=replace(g.status, provisioning_status=state))
    expected = EXPECTED_EDGES.get((state.value, trigger.value))
    if expected is None:
        with pytest.raises(IllegalTransition):
            transition(g, trigger, T0)
    else:
        out = transition(g, trigger, T0 + 5, reason="why")
        assert out.state.value == expected
        assert out.status.state_since == T0 + 5 and out.status.last_trigger == trigger.value
        internal = {"Provisioning": "Reserved", "Provisioned": "Reserved", "Queued": ""}.get(expected, "Released")
        assert out.status.internal_state == internal


def test_transition_bookkeeping() -> None:
    g = transition(gpr("gpr-1"), Trigger.ADMIT, T0)
    assert g.status.internal_state == "Reserved"
    g = transition(g, Trigger.NODES_READY, T0 + 60)
    assert g.status.start_timestamp == T0 + 60
    failed = transition(g, Trigger.NODE_LOST, T0 + 120, reason="node n1 disappeared")
    assert failed.status.failure_reason == "node n1 disappeared"
    assert failed.status.internal_state == "Released" and failed.status.completion_timestamp == T0 + 120
    again = transition(failed, Trigger.REQUEUE, T0 + 130)
    assert again.state is GprState.QUEUED and again.status.retry_count == 1
    assert again.request_id == "gpr-1-a1" != g.request_id
    assert again.status.start_timestamp is None and again.status.node_list == ()


def test_user_operations_respect_the_state_machine() -> None:
    q = gpr("gpr-1")
    assert cancel(q, T0).state is GprState.CANCELLED
    with pytest.raises(IllegalTransition, match="cancel a queued one instead"):
        request_release(q)
    prov = transition(q, Trigger.ADMIT, T0)
    with pytest.raises(IllegalTransition):
        cancel(prov, T0)
    assert request_release(prov).spec.early_release
    assert with_priority(prov, 250).spec.priority == 250
    with pytest.raises(GprValidationError, match="priority"):
        with_priority(prov, 0)
    with pytest.raises(IllegalTransition):
        with_priority(cancel(q, T0), 5)


def test_status_record_round_trip() -> None:
    g = transition(transition(gpr("gpr-1"), Trigger.ADMIT, T0), Trigger.NODES_READY, T0 + 1)
    g = replace(g, status=replace(g.status, node_pool_details=NodePoolDetails("linode", "c1", "p", ("1", "2"))))
    assert status_from_record(status_to_record(g.status)) == g.status
    d = gpr_to_dict(g, now=T0 + 1 + H)
    assert d["status"]["provisioningStatus"] == "Provisioned"
    assert d["status"]["remainingDuration"] == "0d7h0m"
    assert d["spec"]["exitDuration"] == "0d8h0m"


# ------------------------------------------------------------------------------------------------ planner
def test_queue_order_priority_then_age() -> None:
    gs = [
        gpr("gpr-a", T0 + 3, priority=101),
        gpr("gpr-b", T0 + 1, priority=50),
        gpr("gpr-c", T0 + 2, priority=250),
        gpr("gpr-d", T0 + 1, priority=101),
    ]
    assert [g.gpr_id for g in queue_order(gs)] == ["gpr-c", "gpr-d", "gpr-a", "gpr-b"]


def test_admission_from_inventory_serves_higher_priority_first() -> None:
    low = gpr("gpr-low", T0, priority=10)
    high = gpr("gpr-high", T0 + 50, priority=290)
    view = CapacityView(nodes=(node("n1"), node("n2", "RTX6000")))
    out = plan_gprs([low, high], view, CATALOG, NO_DYN, T0 + 60).by_id()
    assert out["gpr-high"].state is GprState.PROVISIONING
    assert out["gpr-high"].status.inventory_nodes == ("n1",)
    assert out["gpr-low"].state is GprState.QUEUED
    assert "ENABLE_DYNAMIC_NODE is false" in out["gpr-low"].status.failure_reason


def test_inventory_admission_labels_nodes_then_becomes_provisioned() -> None:
    g = gpr("gpr-1", numberOfGPUNodes=2)
    view = CapacityView(nodes=(node("n1"), node("n2"), node("big", gpus=4)))
    p1 = plan_gprs([g], view, CATALOG, NO_DYN, T0)
    assert p1.launches == ()
    assert {a.node_name for a in p1.assigns} == {"n1", "n2"}
    assert all(a.taints == gpr_node_taints("gpr-1") and a.labels == {GPR_LABEL: "gpr-1"} for a in p1.assigns)
    g1 = p1.by_id()["gpr-1"]
    labelled = CapacityView(nodes=(node("n1", gpr_id="gpr-1"), node("n2", gpr_id="gpr-1"), node("big", gpus=4)))
    g2 = plan_gprs([g1], labelled, CATALOG, NO_DYN, T0 + 5).by_id()["gpr-1"]
    assert g2.state is GprState.PROVISIONED
    assert g2.status.node_list == ("n1", "n2") and g2.status.num_gpus_allocated == 2
    assert g2.status.start_timestamp == T0 + 5


def test_scale_up_launches_with_deterministic_request_id_and_gpr_labels() -> None:
    g = gpr("gpr-1", numberOfGPUNodes=2, numberOfGPUs=4)
    plan = plan_gprs([g], CapacityView(), CATALOG, GprConfig(provider="linode"), T0)
    (la,) = plan.launches
    assert la.request_id == "gpr-1-a0" and la.count == 2 and la.instance_type == "g2-rtx4000a4-s"
    assert la.labels[GPR_LABEL] == "gpr-1" and la.taints == gpr_node_taints("gpr-1") and la.zone == "us-ord"
    g1 = plan.by_id()["gpr-1"]
    assert g1.state is GprState.PROVISIONING and g1.status.scale_up_triggered
    assert g1.status.cost == pytest.approx(2 * 2.96 * 8)
    # Nodes still launching: the same launch (same request id) is re-emitted, which the provider deduplicates.
    launching = CapacityView(
        nodes=(node("x1", gpus=4, created=True, ready=False, request_id="gpr-1-a0", node_id="1", gpr_id="gpr-1"),)
    )
    again = plan_gprs([g1], launching, CATALOG, GprConfig(), T0 + 30)
    assert [x.request_id for x in again.launches] == ["gpr-1-a0"]
    ready = CapacityView(
        nodes=tuple(
            node(f"x{i}", gpus=4, created=True, request_id="gpr-1-a0", node_id=str(i), gpr_id="gpr-1") for i in (1, 2)
        )
    )
    done = plan_gprs([g1], ready, CATALOG, GprConfig(), T0 + 60)
    g2 = done.by_id()["gpr-1"]
    assert done.launches == () and g2.state is GprState.PROVISIONED
    assert g2.status.node_pool_details.node_ids == ("1", "2") and g2.status.num_gpus_allocated == 8


def test_missing_token_blocks_scale_up_with_exact_reason() -> None:
    msg = "LINODE_TOKEN environment variable is not set"
    plan = plan_gprs([gpr("gpr-1")], CapacityView(scale_up_blocked=msg), CATALOG, GprConfig(), T0)
    assert plan.launches == ()
    assert plan.by_id()["gpr-1"].status.failure_reason == msg
    assert plan.by_id()["gpr-1"].state is GprState.QUEUED


def test_delay_counted_once_per_interval_and_capped() -> None:
    cfg = GprConfig(enable_dynamic_node=False, max_delayed_count=3, delay_interval_s=60)
    g = gpr("gpr-1")
    seen = []
    for t in (0, 10, 60, 100, 120):
        out = plan_gprs([g], CapacityView(), CATALOG, cfg, T0 + t)
        g = out.by_id().get("gpr-1", g)
        seen.append((g.status.delayed_count, g.state))
    assert seen == [
        (1, GprState.QUEUED),
        (1, GprState.QUEUED),
        (2, GprState.QUEUED),
        (2, GprState.QUEUED),
        (3, GprState.FAILED),
    ]
    assert g.status.last_trigger == "delay-limit" and "ENABLE_DYNAMIC_NODE is false" in g.status.failure_reason
    # A GPR that failed by delay limit is not requeued even with requeueOnFailure.
    g = replace(g, spec=replace(g.spec, requeue_on_failure=True))
    assert plan_gprs([g], CapacityView(), CATALOG, cfg, T0 + 500).updates == ()


def test_node_limit_delays_with_reason() -> None:
    held = holding(gpr("gpr-old"), (), start=T0)
    held = replace(
        held,
        status=replace(
            held.status,
            scale_up_triggered=True,
            node_pool_details=NodePoolDetails(request_id="gpr-old-a0", count=2, instance_type="g2-rtx4000a1-s"),
        ),
    )
    view = CapacityView(
        nodes=tuple(
            node(f"o{i}", created=True, request_id="gpr-old-a0", node_id=str(i), gpr_id="gpr-old") for i in (1, 2)
        )
    )
    held = replace(held, status=replace(held.status, node_list=("o1", "o2")))
    out = plan_gprs([held, gpr("gpr-new", T0 + 1)], view, CATALOG, GprConfig(max_nodes=2), T0 + 10)
    new = out.by_id()["gpr-new"]
    assert new.state is GprState.QUEUED and "node limit is reached (2/2" in new.status.failure_reason
    assert out.launches == ()
    assert new.status.estimated_wait_time_s == pytest.approx(8 * H - 10 + 300)


def test_eviction_chooses_fewest_then_lowest_and_records_evicted_by() -> None:
    nodes = tuple(node(f"n{i}", gpr_id=gid) for i, gid in ((1, "gpr-a"), (2, "gpr-b"), (3, "gpr-b"), (4, "gpr-c")))
    a = holding(gpr("gpr-a", priority=10, enableEviction=True), ("n1",), start=T0)
    b = holding(
        gpr("gpr-b", priority=20, enableEviction=True, numberOfGPUNodes=2, requeueOnFailure=True),
        ("n2", "n3"),
        start=T0,
    )
    c = holding(gpr("gpr-c", priority=5), ("n4",), start=T0)
    view = CapacityView(nodes=nodes)
    # Needs two nodes: evicting b alone (one GPR) beats evicting a and another.
    big = gpr("gpr-hi", T0 + 1, priority=250, numberOfGPUNodes=2)
    out = plan_gprs([a, b, c, big], view, CATALOG, NO_DYN, T0 + 60)
    got = out.by_id()
    assert got["gpr-b"].state is GprState.EVICTED and got["gpr-b"].status.evicted_by == "gpr-hi"
    assert got["gpr-a"].state is GprState.PROVISIONED and got["gpr-c"].state is GprState.PROVISIONED
    assert got["gpr-hi"].state is GprState.PROVISIONING and got["gpr-hi"].status.inventory_nodes == ("n2", "n3")
    assert {(x.node_name, x.gpr_id) for x in out.assigns} == {("n2", "gpr-hi"), ("n3", "gpr-hi")}
    # Next pass: the evicted GPR is requeued (requeueOnFailure) with a new attempt.
    nxt = plan_gprs(list(got.values()), view, CATALOG, NO_DYN, T0 + 70).by_id()
    assert nxt["gpr-b"].state is GprState.QUEUED and nxt["gpr-b"].status.retry_count == 1
    # Needs one node: the lowest-priority evictable GPR (a) goes; c (priority 5) does not allow eviction.
    small = gpr("gpr-mid", T0 + 1, priority=150)
    got2 = plan_gprs([a, b, c, small], view, CATALOG, NO_DYN, T0 + 60).by_id()
    assert got2["gpr-a"].state is GprState.EVICTED and got2["gpr-b"].state is GprState.PROVISIONED
    # Nobody outranks: no eviction, just a delay.
    lowly = gpr("gpr-low", T0 + 1, priority=15)
    got3 = plan_gprs([a, b, c, lowly], view, CATALOG, NO_DYN, T0 + 60).by_id()
    assert got3["gpr-a"].state is GprState.EVICTED
    # Nobody evictable below: only c (priority 5) is lower, and it does not allow eviction.
    got4 = plan_gprs([a, b, c, gpr("gpr-x", priority=8)], view, CATALOG, NO_DYN, T0).by_id()
    assert got4["gpr-x"].state is GprState.QUEUED
    assert all(got4[x].state is GprState.PROVISIONED for x in ("gpr-a", "gpr-b", "gpr-c"))


def test_wait_time_from_queue_ahead_and_release_times() -> None:
    held = holding(gpr("gpr-run", exitDuration="3h"), ("n1",), start=T0 - H)
    first = gpr("gpr-first", T0, priority=200, exitDuration="1h")
    second = gpr("gpr-second", T0, priority=100, exitDuration="1h")
    never = gpr("gpr-never", T0, priority=100, numberOfGPUNodes=5)
    view = CapacityView(nodes=(node("n1", gpr_id="gpr-run"),))
    out = plan_gprs([held, first, second, never], view, CATALOG, NO_DYN, T0).by_id()
    assert out["gpr-first"].status.estimated_wait_time_s == pytest.approx(2 * H)
    assert out["gpr-second"].status.estimated_wait_time_s == pytest.approx(3 * H)
    assert out["gpr-never"].status.estimated_wait_time_s is None
    d = gpr_to_dict(out["gpr-second"])
    assert d["status"]["estimatedWaitTime"] == "0d3h0m"


def test_cost_estimate_from_catalog() -> None:
    s = parse_gpr_spec(spec(numberOfGPUNodes=2, exitDuration="0d8h0m"), CATALOG)
    assert estimate_cost(s, CATALOG) == pytest.approx(2 * 0.52 * 8)
    assert gpr("gpr-1", numberOfGPUNodes=2).status.cost == pytest.approx(8.32)


def test_exit_duration_completes_and_deletes_launched_nodes() -> None:
    g = holding(gpr("gpr-1", exitDuration="8h"), (), start=T0)
    g = replace(
        g,
        status=replace(
            g.status,
            node_list=("x1",),
            scale_up_triggered=True,
            node_pool_details=NodePoolDetails(request_id="gpr-1-a0", count=1, node_ids=("11",)),
        ),
    )
    view = CapacityView(nodes=(node("x1", created=True, request_id="gpr-1-a0", node_id="11", gpr_id="gpr-1"),))
    before = plan_gprs([g], view, CATALOG, GprConfig(), T0 + 8 * H - 1)
    assert before.by_id()["gpr-1"].status.remaining_duration_s == pytest.approx(1)
    assert before.deletes == ()
    at = plan_gprs([g], view, CATALOG, GprConfig(), T0 + 8 * H)
    assert at.by_id()["gpr-1"].state is GprState.COMPLETE
    assert [(d.node_id, d.gpr_id) for d in at.deletes] == [("11", "gpr-1")]
    # With dynamic nodes disabled nothing is ever deleted.
    assert plan_gprs([g], view, CATALOG, NO_DYN, T0 + 8 * H).deletes == ()


def test_idle_timeout_releases_after_sustained_idleness_only_when_enforced() -> None:
    g = holding(gpr("gpr-1", idleTimeOutDuration="30m"), ("n1",), start=T0)

    def at(t: float, util: float | None, cur: Gpr, cfg: GprConfig = NO_DYN) -> Gpr:
        view = CapacityView(nodes=(node("n1", gpr_id="gpr-1", gpu_utilization=util),))
        return plan_gprs([cur], view, CATALOG, cfg, t).by_id().get(cur.gpr_id, cur)

    g1 = at(T0 + 60, 0.0, g)
    assert g1.status.idle_since == T0 + 60
    g2 = at(T0 + 60 + 1799, 0.01, g1)
    assert g2.state is GprState.PROVISIONED
    busy = at(T0 + 60 + 1000, 0.7, g1)
    assert busy.status.idle_since is None
    g3 = at(T0 + 60 + 1800, 0.0, g2)
    assert g3.state is GprState.RELEASED and g3.status.last_trigger == "idle-timeout"
    unknown = at(T0 + 60, None, g)
    assert unknown.status.idle_since is None
    lax = replace(g, spec=replace(g.spec, enforce_idle_timeout=False))
    assert at(T0 + 7 * H, 0.0, at(T0 + 60, 0.0, lax)).state is GprState.PROVISIONED


def test_early_release_and_node_loss_and_unassign() -> None:
    g = holding(gpr("gpr-1"), ("n1",), start=T0)
    released = request_release(g)
    view = CapacityView(nodes=(node("n1", gpr_id="gpr-1"),))
    out = plan_gprs([released], view, CATALOG, NO_DYN, T0 + 10)
    assert out.by_id()["gpr-1"].state is GprState.RELEASED
    assert [(u.node_name, u.gpr_id) for u in out.unassigns] == [("n1", "gpr-1")]
    lost = plan_gprs([g], CapacityView(), CATALOG, NO_DYN, T0 + 10).by_id()["gpr-1"]
    assert lost.state is GprState.FAILED and "n1" in lost.status.failure_reason


def test_provisioning_failures_and_requeue() -> None:
    g = transition(gpr("gpr-1", requeueOnFailure=True), Trigger.ADMIT, T0)
    g = replace(
        g,
        status=replace(
            g.status,
            scale_up_triggered=True,
            node_pool_details=NodePoolDetails(request_id="gpr-1-a0", count=1, instance_type="g2-rtx4000a1-s"),
        ),
    )
    view = CapacityView(failed_requests={"gpr-1-a0": "instance failed to start"})
    no_requeue = replace(g, spec=replace(g.spec, requeue_on_failure=False))
    failed = plan_gprs([no_requeue], view, CATALOG, GprConfig(), T0 + 5).by_id()["gpr-1"]
    assert failed.state is GprState.FAILED and failed.status.failure_reason == "instance failed to start"
    # With requeueOnFailure the same pass requeues it and launches a new attempt under a new request id.
    re = plan_gprs([g], view, CATALOG, GprConfig(), T0 + 5)
    assert [t.trigger for t in re.transitions] == [Trigger.PROVISIONING_FAILED, Trigger.REQUEUE, Trigger.ADMIT]
    g2 = re.by_id()["gpr-1"]
    assert g2.state is GprState.PROVISIONING and g2.status.retry_count == 1
    assert [la.request_id for la in re.launches] == ["gpr-1-a1"]
    timeout = plan_gprs([no_requeue], CapacityView(), CATALOG, GprConfig(provisioning_timeout_s=600), T0 + 600).by_id()
    assert timeout["gpr-1"].state is GprState.FAILED and "0/1 nodes ready" in timeout["gpr-1"].status.failure_reason
    exhausted = replace(failed, spec=g.spec, status=replace(failed.status, retry_count=3))
    assert plan_gprs([exhausted], CapacityView(), CATALOG, GprConfig(), T0 + 10).updates == ()


def test_orphan_launched_nodes_are_deleted_by_node_id() -> None:
    view = CapacityView(nodes=(node("z", created=True, request_id="gpr-gone-a0", node_id="77", gpr_id="gpr-gone"),))
    assert [(d.node_id, d.gpr_id) for d in plan_gprs([], view, CATALOG, GprConfig(), T0).deletes] == [
        ("77", "gpr-gone")
    ]


def test_workload_selector_and_toleration_decide_who_lands() -> None:
    g = gpr("gpr-1", workloadSelector={"matchLabels": {"app": "train"}})
    tol = gpr_toleration("gpr-1")
    assert tol == Toleration(GPR_TAINT, "Equal", "gpr-1", TaintEffect.NO_SCHEDULE)
    assert admits_pod(g, Pod("p", labels={"app": "train"}, tolerations=(tol,)))
    assert not admits_pod(g, Pod("p", labels={"app": "train"}))
    assert not admits_pod(g, Pod("p", labels={"app": "other"}, tolerations=(tol,)))
    assert not admits_pod(g, Pod("p", labels={"app": "train"}, tolerations=(gpr_toleration("gpr-2"),)))
    assert admits_pod(g, Pod("p", labels={"app": "train"}, tolerations=(Toleration(GPR_TAINT, "Exists"),)))


def test_status_defaults() -> None:
    st = GprStatus()
    assert st.provisioning_status is GprState.QUEUED and st.delayed_count == 0
