"""The GPR workload rule in the scale-up planner: its pass over existing and in-flight nodes and its Blocked reasons
(``gpuscale explain``). A node labelled for an active GPR (``Snapshot.workloads``) is never room for a pod outside
the GPR's workloadSelector, even one that tolerates its taint."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import OD, catalog, itype, node, pod, pool
from gpuscale.core.gpr import GPR_LABEL, gpr_node_taints, gpr_toleration
from gpuscale.core.model import Pod, Snapshot, Toleration
from gpuscale.core.plan import BlockReason, PlannerConfig
from gpuscale.core.planner import plan
from gpuscale.core.predicates import gpr_workload_failure, static_failure

GID = "gpr-0123456789ab"
WORKLOADS = {GID: {"team": "train"}}
CAT = catalog(itype("g1", 8, 32, 1, "RTX", price=1.0))
POOL = pool("gpu", instance_types=("g1",), capacity_types=(OD,))
GPR_NODE = node("gpr-node", 8000, 32768, 1, "RTX", labels={GPR_LABEL: GID}, taints=tuple(gpr_node_taints(GID)))


def _pod(name: str, labels: dict[str, str], tolerations: tuple[Toleration, ...] = (gpr_toleration(GID),)) -> Pod:
    return replace(pod(name, cpu=1000, mem=1024, tolerations=tolerations), labels=labels)


def _snap(*pods: Pod, workloads: dict[str, dict[str, str]] | None = None, pools: tuple = (POOL,)) -> Snapshot:  # type: ignore[type-arg]
    return Snapshot(pods, (GPR_NODE,), pools, CAT, workloads=WORKLOADS if workloads is None else workloads)


def test_a_pod_outside_the_selector_gets_a_new_node_not_the_half_empty_gpr_node() -> None:
    result = plan(_snap(_pod("outsider", {"team": "infer"})), PlannerConfig(), 0.0)
    assert result.placements["default/outsider"].endswith("/0")  # a launch, not gpr-node
    assert [(x.pool, x.instance_type, x.count) for x in result.launches] == [("gpu", "g1", 1)]


def test_a_pod_matching_the_selector_is_placed_on_the_gpr_node() -> None:
    result = plan(_snap(_pod("member", {"team": "train", "x": "y"})), PlannerConfig(), 0.0)
    assert result.placements == {"default/member": "gpr-node"} and not result.launches


def test_without_an_active_gpr_the_taint_alone_decides() -> None:
    """The test above can fail: with no workloads the tolerating outsider is planned onto the GPR node."""
    result = plan(_snap(_pod("outsider", {"team": "infer"}), workloads={}), PlannerConfig(), 0.0)
    assert result.placements == {"default/outsider": "gpr-node"}


def test_pods_alike_but_for_their_labels_are_told_apart() -> None:
    """One class per answer of the GPR rule: the member goes to the GPR node, the outsider to a new node, whatever
    the order they are classified in."""
    for first, second in (("a-member", "b-outsider"), ("b-member", "a-outsider")):
        member = _pod(first if "member" in first else second, {"team": "train"})
        outsider = _pod(second if "outsider" in second else first, {"team": "infer"})
        result = plan(_snap(member, outsider), PlannerConfig(), 0.0)
        assert result.placements[member.key] == "gpr-node"
        assert result.placements[outsider.key] != "gpr-node" and len(result.launches) == 1


def test_a_gpr_node_in_flight_is_no_room_for_an_outsider_either() -> None:
    launching = replace(GPR_NODE, launching=True)
    snap = Snapshot((_pod("outsider", {"team": "infer"}),), (launching,), (POOL,), CAT, workloads=WORKLOADS)
    assert plan(snap, PlannerConfig(), 0.0).placements["default/outsider"] != "gpr-node"


def test_explain_states_the_gpr_reason_when_no_node_can_be_added() -> None:
    everything = (Toleration(operator="Exists"),)
    result = plan(_snap(_pod("outsider", {"team": "infer"}, everything), pools=()), PlannerConfig(), 0.0)
    (b,) = result.blocked
    assert b.reason is BlockReason.NO_POOLS
    assert b.message.endswith(
        f"; node gpr-node is held by GPR {GID}; pod labels do not match its workloadSelector team=train"
    )
    # a pod the taint already keeps off is not told about the GPR
    plain = plan(_snap(_pod("plain", {"team": "infer"}, ()), pools=()), PlannerConfig(), 0.0)
    assert "held by GPR" not in plain.blocked[0].message


def test_explain_names_a_few_gpr_nodes_and_counts_the_rest() -> None:
    nodes = tuple(replace(GPR_NODE, name=f"gpr-node-{i}") for i in range(5))
    snap = Snapshot((_pod("outsider", {"team": "infer"}),), nodes, (), CAT, workloads=WORKLOADS)
    message = plan(snap, PlannerConfig(), 0.0).blocked[0].message
    assert message.count("is held by GPR") == 3 and message.endswith("2 more GPR node(s) refuse it likewise")


GPRS = ("gpr-aaaaaaaaaaaa", "gpr-bbbbbbbbbbbb")
TEAMS = ("train", "infer", "web")


@st.composite
def gpr_snapshots(draw: st.DrawFn) -> Snapshot:
    """Nodes, some held by one of two GPRs (label and taint); pods with random team labels and tolerations (none,
    one GPR's, everything); each GPR active or not, selecting a random team (or nothing)."""
    nodes = []
    for k in range(draw(st.integers(1, 5))):
        held = draw(st.sampled_from((None, *GPRS)))
        labels = {GPR_LABEL: held} if held else {}
        taints = tuple(gpr_node_taints(held)) if held else ()
        nodes.append(node(f"n{k}", 4000, 16384, draw(st.sampled_from((0, 1, 2))), "RTX", labels=labels, taints=taints))
    pods = []
    for k in range(draw(st.integers(1, 12))):
        tols = draw(st.sampled_from(((), (Toleration(operator="Exists"),), (gpr_toleration(GPRS[0]),))))
        p = _pod(f"p{k:02d}", {"team": draw(st.sampled_from(TEAMS))}, tols)
        pods.append(replace(p, request=replace(p.request, gpus=draw(st.sampled_from((0, 1))))))
    workloads = {}
    for g in GPRS:
        if draw(st.booleans()):
            workloads[g] = draw(st.sampled_from(({}, {"team": "train"}, {"team": "infer"})))
    pools = draw(st.sampled_from(((), (POOL,))))
    return Snapshot(tuple(pods), tuple(nodes), pools, CAT, workloads=workloads)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpr_snapshots())
def test_no_pod_is_ever_placed_on_a_node_the_gpr_rule_refuses(snap: Snapshot) -> None:
    result = plan(snap, PlannerConfig(exact_solver=False), 0.0)
    by_name = {n.name: n for n in snap.nodes}
    pods = {p.key: p for p in snap.pods}
    for key, where in result.placements.items():
        n = by_name.get(where)
        if n is not None:
            assert static_failure(pods[key], n.labels, n.taints, n.unschedulable, snap.workloads) is None
    for b in result.blocked:  # every GPR node that refused a blocked pod only for the rule is named in its reason
        for n in snap.nodes:
            refused = gpr_workload_failure(pods[b.pod], n.labels, snap.workloads)
            if refused is not None and static_failure(pods[b.pod], n.labels, n.taints) is None:
                assert f"node {n.name} is held by GPR" in b.message or "more GPR node(s)" in b.message
