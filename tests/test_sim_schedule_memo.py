"""The simulated scheduler's memo of pod shapes that fit nowhere gives the same bindings as trying every pod; the
Scheduler on its own, told of changes by its methods."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import FIXED_CLOUD, OD, catalog, itype, pod, taint, tol
from gpuscale.core.model import NodePool, Pod
from gpuscale.core.resources import Resources
from gpuscale.core.scoring import make_scorer
from gpuscale.core.state import ClusterState, NodeShape, Placement
from gpuscale.providers.base import LaunchRequest
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.cluster_records import SimPod
from gpuscale.sim.engine import Engine
from gpuscale.sim.schedule import Scheduler

CAT = catalog(
    itype("cpu-4", 4, 16, price=0.2),
    itype("t4-1", 8, 32, 1, "T4", price=0.6),
    itype("t4-2", 16, 64, 2, "T4", price=1.2),
    itype("a100-1", 12, 85, 1, "A100", price=3.0),
)
POOLS = (NodePool("gpu", taints=(taint("nvidia.com/gpu"),)), NodePool("cpu"))
TYPES = (("t4-1", "gpu"), ("t4-2", "gpu"), ("a100-1", "gpu"), ("cpu-4", "cpu"))
GPU_TOL = (tol("nvidia.com/gpu", "Exists"),)
SHAPES = (  # (cpu milli, memory MiB, whole GPUs, milli-GPU, tolerates the GPU taint)
    (1000, 1024, 1, 0, True),
    (2000, 4096, 2, 0, True),
    (500, 512, 0, 300, True),
    (500, 512, 0, 700, True),
    (3000, 8192, 0, 0, False),
    (1000, 1024, 1, 0, False),  # a GPU pod without the toleration: fits no node
)


class World:
    def __init__(self, memo: bool) -> None:
        self.eng = Engine()
        self.cluster = SimCluster(self.eng, CAT, POOLS, seed=1)
        self.cloud = SimCloud(self.eng, CAT, FIXED_CLOUD, listener=self.cluster)
        self.choose_calls = 0
        if not memo:  # every known shape looks as if it might fit: each pending pod is tried in full
            self.cluster.scheduler._fits_any = lambda req, sig, rows: True  # type: ignore[method-assign]
        choose = self.cluster.scheduler._choose

        def counted(sp: object) -> int | None:
            self.choose_calls += 1
            return choose(sp)  # type: ignore[arg-type]

        self.cluster.scheduler._choose = counted  # type: ignore[method-assign]
        self.n = 0

    def apply(self, op: tuple[str, int, int]) -> None:
        kind, a, b = op
        c = self.cluster
        names = sorted(n.name for n in c.list_nodes())
        pods = sorted(p.key for p in c.list_pods())
        if kind == "add":
            cpu, mem, gpus, milli, tolerates = SHAPES[a % len(SHAPES)]
            self.n += 1
            p = pod(f"p{self.n}", cpu=cpu, mem=mem, gpus=gpus, milli=milli, tolerations=GPU_TOL if tolerates else ())
            c.add_pod(p, 60.0 * (1 + b))
        elif kind == "launch":
            it, pool = TYPES[a % len(TYPES)]
            self.n += 1
            self.cloud.launch(LaunchRequest(f"r{self.n}", pool, it, "z1", OD, 1 + b % 2))
        elif kind == "run":
            self.eng.run_until(self.eng.now() + 10.0 * (1 + b))
        elif names and kind == "delete":
            c.delete_node(names[a % len(names)])
        elif names and kind == "cordon":
            c.cordon(names[a % len(names)])
        elif names and kind == "uncordon":
            c.uncordon(names[a % len(names)])
        elif pods and kind == "evict":
            c.evict(pods[a % len(pods)])

    def seen(self) -> tuple[object, ...]:
        return tuple((p.key, p.node_name, p.phase) for p in self.cluster.list_pods())


OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "launch", "run", "run", "delete", "cordon", "uncordon", "evict"]),
        st.integers(0, 20),
        st.integers(0, 20),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_bindings_are_the_same_with_and_without_the_memo(ops: list[tuple[str, int, int]]) -> None:
    with_memo, without = World(memo=True), World(memo=False)
    for op in ops:
        with_memo.apply(op)
        without.apply(op)
        assert with_memo.seen() == without.seen(), op
    with_memo.eng.run_until(with_memo.eng.now() + 3600.0)
    without.eng.run_until(without.eng.now() + 3600.0)
    assert with_memo.seen() == without.seen()
    assert with_memo.cluster.counters == without.cluster.counters
    assert with_memo.cluster.pending_samples == without.cluster.pending_samples
    assert with_memo.choose_calls <= without.choose_calls


def _gpu(name: str) -> Pod:
    return pod(name, cpu=1000, mem=1024, gpus=1, tolerations=GPU_TOL)


def test_a_shape_that_fit_nowhere_is_not_tried_again_until_a_node_gains_room() -> None:
    w = World(memo=True)
    w.apply(("launch", 0, 0))  # one t4-1
    w.eng.run_until(w.eng.now() + 600.0)
    for i in range(3):
        w.cluster.add_pod(_gpu(f"g{i}"), 1000.0)
    w.eng.run_until(w.eng.now())
    assert [p.node_name is not None for p in w.cluster.list_pods()] == [True, False, False]
    calls = w.choose_calls
    w.apply(("launch", 3, 0))  # a CPU node registers: it grows, but no GPU pod fits it
    w.eng.run_until(w.eng.now() + 600.0)
    w.cluster.add_pod(_gpu("late"), 1000.0)
    w.eng.run_until(w.eng.now())
    assert w.choose_calls == calls  # every pending GPU pod was known not to fit and only the CPU node grew
    w.eng.run_until(w.eng.now() + 1000.0)  # g0 completes: its node gains room, g1 takes it
    bound = {p.name for p in w.cluster.list_pods() if p.node_name is not None}
    assert bound == {"g1"}
    assert w.choose_calls > calls


def test_failures_are_kept_across_a_pass_of_new_pods_only() -> None:
    w = World(memo=True)
    w.apply(("launch", 0, 0))  # one t4-1 (GPU pool, tainted)
    w.eng.run_until(w.eng.now() + 600.0)
    for i in range(2):
        w.cluster.add_pod(_gpu(f"g{i}"), 5000.0)
    w.eng.run_until(w.eng.now())
    calls = w.choose_calls
    w.cluster.add_pod(pod("c", cpu=1000, mem=1024), 5000.0)  # a pass of the new pod only: fits no node yet
    w.eng.run_until(w.eng.now())
    assert w.choose_calls == calls + 1
    w.apply(("launch", 3, 0))  # a CPU node registers: a full pass, in which only c fits the row that grew
    w.eng.run_until(w.eng.now() + 600.0)
    assert w.choose_calls == calls + 2  # g1's failure was kept through c's pass: no search for it again
    bound = {p.name: p.node_name is not None for p in w.cluster.list_pods()}
    assert bound == {"g0": True, "g1": False, "c": True}


def test_the_pod_list_kept_at_every_change_is_the_pods_in_order() -> None:
    w = World(memo=True)

    def check() -> None:
        assert w.cluster.list_pods() == tuple(sp.pod for sp in w.cluster._pods.values())

    w.apply(("launch", 1, 1))  # two t4-2
    for i in range(6):
        w.cluster.add_pod(_gpu(f"g{i}"), 300.0 * (i + 1), deadline=w.eng.now() + 900.0)
        check()
    w.cluster.add_pod(pod("never", cpu=1000, mem=1024), 60.0, deadline=w.eng.now() + 30.0)  # cancelled at 30 s
    for op in [("run", 0, 5), ("evict", 0, 0), ("run", 0, 0), ("delete", 0, 0), ("run", 0, 40), ("evict", 1, 0)]:
        w.apply(op)
        check()
    seen = {p.name: (p.phase, p.node_name is not None) for p in w.cluster.list_pods()}
    assert "never" not in seen and len(seen) < 6 and any(not bound for _, bound in seen.values())
    w.eng.run_until(w.eng.now() + 3600.0)
    check()


class Host:
    """What a cluster gives its Scheduler, kept by hand: two CPU rows (1 and 4 cores), pending pods, masks, binds."""

    def __init__(self) -> None:
        self.state = ClusterState([NodeShape("small", Resources(1000, 4096)), NodeShape("big", Resources(4000, 4096))])
        self.pending: dict[str, SimPod] = {}
        self.masks: dict[tuple[object, ...], np.ndarray] = {}
        self.bound: list[tuple[str, int]] = []
        self.looked = 0  # searches for a node (each asks for the pod's mask)
        self.sched = Scheduler(self.pending, self.state, make_scorer("best-fit"), self.masks, self.mask, self.bind)

    def mask(self, sig: tuple[object, ...], p: Pod) -> np.ndarray:
        self.looked += 1
        return self.masks.setdefault(sig, np.ones(len(self.state), dtype=bool))

    def bind(self, sp: SimPod, row: int, placement: Placement | None) -> None:
        sp.placement = placement if placement is not None else self.state.place(sp.pod.request, row)
        del self.pending[sp.pod.key]
        self.bound.append((sp.pod.name, row))

    def add(self, name: str, cpu: int) -> SimPod:
        sp = SimPod(pod(name, cpu=cpu, mem=512), 60.0, len(self.pending) + len(self.bound), 0.0, 1.0)
        sp.fkey = self.sched.fkey(sp.pod.request, sp.sig)
        self.pending[sp.pod.key] = sp
        self.sched.pod_pending(sp.pod.key)
        return sp


def test_the_scheduler_owns_its_memo_and_learns_changes_by_its_methods() -> None:
    h = Host()
    filler = h.add("filler", 4000)
    assert h.sched.schedule() == 1 and h.bound == [("filler", 1)]
    big = h.add("big", 3000)
    assert h.sched.schedule() == 0 and h.looked == 2  # fits nowhere: remembered
    assert h.add("twin", 3000).fkey == big.fkey
    h.add("small", 500)
    assert h.sched.schedule() == 1 and h.bound[-1] == ("small", 0)
    assert h.looked == 3  # a pass of the new pods only: the twin shares big's failure, small is looked for
    h.sched.capacity_grew()  # room grew, but in no row the scheduler was told of: the known failure stands
    assert h.sched.schedule() == 0 and h.looked == 3
    assert filler.placement is not None
    h.state.release(filler.pod.request, filler.placement)
    h.sched.row_grew(1)
    h.sched.capacity_grew()
    assert h.sched.schedule() == 1 and h.bound[-1] == ("big", 1)
    assert h.looked == 4  # the twin, the same pair, fits none of the rows that grew now that big took row 1
    assert list(h.pending) == ["default/twin"]
    h.sched.pod_gone("default/twin")
    del h.pending["default/twin"]
    assert h.sched.schedule() == 0


def test_a_cluster_grown_past_its_first_rows_schedules_on_the_new_ones() -> None:
    w = World(memo=True)
    first = len(w.cluster._state)
    for _ in range(first // 2 + 2):
        w.apply(("launch", 3, 1))  # two cpu-4 nodes each
    w.eng.run_until(w.eng.now() + 600.0)
    assert len(w.cluster._state) > first and len(w.cluster.list_nodes()) > first
    for i in range(len(w.cluster.list_nodes())):
        w.cluster.add_pod(pod(f"c{i}", cpu=3000, mem=1024), 1000.0)
    w.eng.run_until(w.eng.now())
    assert all(p.node_name is not None for p in w.cluster.list_pods())
    assert len({p.node_name for p in w.cluster.list_pods()}) == len(w.cluster.list_nodes())
