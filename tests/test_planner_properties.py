"""Property tests of the planner: every placement fits, pools stay within max and limits, plans are deterministic,
and the plan costs at least a per-resource lower bound of the LP relaxation."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import itype, node, pod, pool, taint, tol
from gpuscale.core import labels as L
from gpuscale.core.model import Catalog, PoolLimits, Snapshot
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner import build_options, plan, pod_order, solo_count
from gpuscale.core.predicates import static_failure
from gpuscale.core.resources import MILLI_PER_GPU
from gpuscale.core.state import ClusterState, NodeShape
from gpuscale.core.templates import template_labels

MODELS = ("T4", "A100")


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    types = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from((0, 1, 2, 4, 8)))
        types.append(
            itype(
                f"t{i}",
                draw(st.sampled_from((4, 8, 16, 32))),
                draw(st.sampled_from((16, 32, 64))),
                gpus,
                draw(st.sampled_from(MODELS)),
                price=draw(st.floats(0.1, 10.0).map(lambda x: round(x, 2))),
                zones=("z1", "z2"),
                spot=draw(st.one_of(st.none(), st.just(0.05))),
            )
        )
    cat = Catalog("h", tuple(types))
    pools = []
    for j in range(draw(st.integers(1, 2))):
        pools.append(
            pool(
                f"p{j}",
                max_nodes=draw(st.one_of(st.none(), st.integers(0, 6))),
                limits=PoolLimits(gpus=draw(st.one_of(st.none(), st.integers(0, 16)))),
                taints=draw(st.sampled_from(((), (taint("gpu", "yes"),)))),
                weight=draw(st.integers(0, 2)),
            )
        )
    nodes = [
        node(f"n{k}", 8000, 32768, draw(st.sampled_from((0, 1, 2))), "T4", pool="p0", labels={L.ZONE: "z1"})
        for k in range(draw(st.integers(0, 3)))
    ]
    pods = []
    for k in range(draw(st.integers(1, 25))):
        kind = draw(st.integers(0, 2))
        gpus = draw(st.sampled_from((1, 2, 4))) if kind == 0 else 0
        milli = draw(st.sampled_from((100, 300, 500, 700))) if kind == 1 else 0
        sel = draw(st.sampled_from(({}, {L.GPU_PRODUCT: "A100"}, {L.ZONE: "z2"}, {L.CAPACITY_TYPE: "on-demand"})))
        tols = draw(st.sampled_from(((), (tol("gpu", "Exists"),))))
        gang = draw(st.sampled_from((None, None, None, "g1")))
        pods.append(
            pod(
                f"q{k}",
                draw(st.sampled_from((250, 1000, 4000))),
                draw(st.sampled_from((256, 2048, 16384))),
                gpus=gpus,
                milli=milli,
                selector=sel,
                tolerations=tols,
                priority=draw(st.integers(0, 2)),
                gang=gang,
                gang_size=3 if gang else 0,
            )
        )
    return Snapshot(tuple(pods), tuple(nodes), tuple(pools), cat)


def check_plan(s: Snapshot, cfg: PlannerConfig) -> float:
    r = plan(s, cfg, 0.0)
    assert r == plan(s, cfg, 0.0), "plan must be deterministic"
    pods = {p.key: p for p in s.pods}
    assert set(r.placements).isdisjoint(b.pod for b in r.blocked)
    pending = {p.key for p in s.pods if p.pending}
    assert set(r.placements) | {b.pod for b in r.blocked} == pending, "every pending pod is placed or has a reason"
    # existing nodes: bound pods + placed pods fit, per physical GPU
    state = ClusterState([NodeShape(n.name, n.allocatable, n.gpu_model) for n in s.nodes])
    idx = {n.name: i for i, n in enumerate(s.nodes)}
    for p in sorted(s.pods, key=lambda p: p.key):
        if p.node_name:
            state.occupy(p.request, idx[p.node_name])
    for key in sorted((k for k, v in r.placements.items() if v in idx), key=lambda k: pod_order(pods[k])):
        n = s.nodes[idx[r.placements[key]]]
        assert static_failure(pods[key], n.labels, n.taints, n.unschedulable) is None
        state.place(pods[key].request, idx[r.placements[key]])  # raises if it does not fit
    # new nodes: each launch node holds its pods, passes predicates
    options = {(o.pool.name, o.itype.name, o.offering.zone, o.offering.capacity_type): o for o in build_options(s, 0)}
    per_node: dict[str, list[str]] = defaultdict(list)
    for key, where in r.placements.items():
        if where not in idx:
            per_node[where].append(key)
    pool_nodes: dict[str, int] = defaultdict(int)
    pool_gpus: dict[str, int] = defaultdict(int)
    for n in s.nodes:
        if n.pool:
            pool_nodes[n.pool] += 1
    for launch in r.launches:
        o = options[(launch.pool, launch.instance_type, launch.zone, launch.capacity_type)]
        assert launch.hourly_cost == o.price * launch.count
        pool_nodes[launch.pool] += launch.count
        pool_gpus[launch.pool] += o.itype.gpu_count * launch.count
        labels = template_labels(o.pool, o.itype, o.offering)
        for i in range(launch.count):
            keys = sorted(per_node[f"{launch.id}/{i}"], key=lambda k: pod_order(pods[k]))
            assert keys, "no empty new nodes"
            st_ = ClusterState([NodeShape("new", o.alloc, o.itype.gpu_model)])
            for k in keys:
                assert static_failure(pods[k], labels, o.taints) is None
                st_.place(pods[k].request, 0)
    for pl in s.pools:
        if pl.max_nodes is not None:
            existing = sum(1 for n in s.nodes if n.pool == pl.name)
            assert pool_nodes[pl.name] <= max(pl.max_nodes, existing)
        if pl.limits.gpus is not None:
            existing_gpus = sum(n.allocatable.gpus for n in s.nodes if n.pool == pl.name)
            assert pool_gpus[pl.name] + existing_gpus <= max(pl.limits.gpus, existing_gpus)
    # lower bound: on each resource dimension, every new-node pod costs at least its cheapest share
    opts = build_options(s, 0)
    bounds = [0.0, 0.0, 0.0]
    for key, where in r.placements.items():
        if where in idx:
            continue
        rq = pods[key].request
        shares = [float("inf")] * 3
        for o in opts:
            if static_failure(pods[key], o.labels, o.taints) is None and solo_count(o, rq, 1):
                a = o.alloc
                d = (
                    rq.cpu_milli / max(a.cpu_milli, 1),
                    rq.memory_mib / max(a.memory_mib, 1),
                    rq.gpu_demand_milli / (MILLI_PER_GPU * a.gpus) if a.gpus else 0.0,
                )
                shares = [min(x, o.price * y) for x, y in zip(shares, d, strict=True)]
        bounds = [b + x for b, x in zip(bounds, shares, strict=True)]
    assert r.total_hourly_cost >= max(bounds) - 1e-6
    return r.total_hourly_cost


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_greedy_plans_are_valid(s: Snapshot) -> None:
    check_plan(s, PlannerConfig(exact_solver=False))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_solver_plans_are_valid_and_never_costlier(s: Snapshot) -> None:
    greedy = check_plan(s, PlannerConfig(exact_solver=False))
    exact = check_plan(s, PlannerConfig(exact_solver=True, solver_time_limit_s=1.0))
    assert exact <= greedy + 1e-6
