"""The simulated cluster: registration, device-plugin delay, scheduling, completion, disruption, PDBs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from builders import FIXED_CLOUD, OD, SPOT, catalog, itype, pod, taint, tol
from gpuscale.controller.backend import Event, PodDisruptionBudget
from gpuscale.core import labels as L
from gpuscale.core.model import CapacityType, NodePool, Pod
from gpuscale.core.resources import Resources
from gpuscale.providers.base import LaunchRequest
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import ClusterBehaviour, SimCluster
from gpuscale.sim.engine import Engine

CAT = catalog(
    itype("cpu-4", 4, 16, price=0.2),
    itype("t4-1", 8, 32, 1, "T4", price=0.6, spot=0.2),
    itype("t4-2", 16, 64, 2, "T4", price=1.2),
    itype("a100-1", 12, 85, 1, "A100", price=3.0),
)
POOLS = (
    NodePool("gpu", labels={"team": "ml"}, taints=(taint("nvidia.com/gpu"),)),
    NodePool("cpu", daemonset_overhead=Resources(cpu_milli=500, memory_mib=1024, pods=5)),
)
GPU_TOL = (tol("nvidia.com/gpu", "Exists"),)


class World:
    def __init__(self, behaviour: ClusterBehaviour | None = None, pdbs: tuple[PodDisruptionBudget, ...] = ()) -> None:
        self.eng = Engine()
        self.cluster = SimCluster(self.eng, CAT, POOLS, behaviour, seed=1, pdbs=pdbs)
        self.cloud = SimCloud(self.eng, CAT, FIXED_CLOUD, listener=self.cluster)
        self.cluster.spot_notices = self.cloud.spot_notices
        self.n = 0

    def launch(self, it: str = "t4-1", count: int = 1, pool: str = "gpu", ct: CapacityType = OD) -> list[str]:
        self.n += 1
        nodes = self.cloud.launch(LaunchRequest(f"r{self.n}", pool, it, "z1", ct, count, labels={"extra": "yes"}))
        return [n.node_name for n in nodes]

    def ready(self, it: str = "t4-1", count: int = 1, pool: str = "gpu", ct: CapacityType = OD) -> list[str]:
        names = self.launch(it, count, pool, ct)
        self.run(self.eng.now() + 180.0)
        return names

    def run(self, t: float) -> None:
        self.eng.run_until(t)

    def add(self, p: Pod, duration: float = 3600.0, **kw: Any) -> None:
        self.cluster.add_pod(p, duration, **kw)

    def where(self) -> dict[str, str | None]:
        return {p.name: p.node_name for p in self.cluster.list_pods()}


def gpu_pod(name: str, gpus: int = 1, milli: int = 0, **kw: Any) -> Pod:
    return pod(name, cpu=1000, mem=1024, gpus=gpus, milli=milli, tolerations=GPU_TOL, **kw)


def test_nodes_register_with_labels_taints_and_gpus_only_after_the_device_plugin() -> None:
    w = World()
    (name,) = w.launch("t4-1")
    w.run(59.0)
    assert w.cluster.list_nodes() == ()
    w.run(60.0)
    (node,) = w.cluster.list_nodes()
    assert node.name == name and node.pool == "gpu" and node.hourly_cost == 0.6
    assert node.labels[L.INSTANCE_TYPE] == "t4-1" and node.labels[L.GPU_PRODUCT] == "T4"
    assert node.labels[L.GPU_COUNT] == "1" and node.labels[L.CAPACITY_TYPE] == "on-demand"
    assert node.labels[L.POOL] == "gpu" and node.labels["team"] == "ml" and node.labels["extra"] == "yes"
    assert node.taints == (taint("nvidia.com/gpu"),)
    assert node.allocatable.gpus == 0 and node.allocatable.cpu_milli == 8000
    w.add(gpu_pod("g"))
    w.add(pod("c", cpu=500, tolerations=GPU_TOL))
    w.run(179.0)
    assert w.where() == {"g": None, "c": name}  # a CPU pod may use the node before its GPUs appear
    w.run(180.0)
    assert w.cluster.list_nodes()[0].allocatable.gpus == 1
    assert w.where() == {"g": name, "c": name}


def test_daemonset_overhead_reduces_allocatable() -> None:
    w = World()
    w.ready("cpu-4", pool="cpu")
    (node,) = w.cluster.list_nodes()
    assert node.allocatable == Resources(cpu_milli=3500, memory_mib=16 * 1024 - 1024, gpus=0, pods=105)


def test_taints_selectors_and_cordon_are_respected() -> None:
    w = World()
    (gpu,) = w.ready("t4-1")
    w.add(pod("no-tol", gpus=1))
    w.add(pod("wrong-sel", gpus=1, selector={"team": "web"}, tolerations=GPU_TOL))
    w.run(w.eng.now())
    assert w.where() == {"no-tol": None, "wrong-sel": None}
    w.cluster.cordon(gpu)
    w.add(gpu_pod("ok", selector={"team": "ml"}))
    w.run(w.eng.now())
    assert w.where()["ok"] is None
    w.cluster.uncordon(gpu)
    w.run(w.eng.now())
    assert w.where()["ok"] == gpu


def test_fractions_fit_on_a_single_gpu_and_resources_are_never_overcommitted() -> None:
    w = World()
    (node,) = w.ready("t4-2")
    for i in range(4):
        w.add(gpu_pod(f"f{i}", gpus=0, milli=600))
    w.run(w.eng.now())
    placed = [n for n in w.where().values() if n]
    assert len(placed) == 2  # 600 + 600 > 1000: one fraction per GPU
    w.add(gpu_pod("whole", gpus=1))
    w.run(w.eng.now())
    assert w.where()["whole"] is None
    w.add(gpu_pod("small", gpus=0, milli=400))
    w.run(w.eng.now())
    assert w.where()["small"] == node
    # CPU: 16 cores, 3 GPU pods use 3; a 14-core pod does not fit, a 13-core one does
    w.add(pod("cpu-big", cpu=14000, tolerations=GPU_TOL))
    w.add(pod("cpu-ok", cpu=13000, tolerations=GPU_TOL))
    w.run(w.eng.now())
    assert w.where()["cpu-big"] is None and w.where()["cpu-ok"] == node


def test_gpu_model_constraints() -> None:
    w = World()
    w.ready("t4-1")
    w.add(gpu_pod("a100-only", models=frozenset({"A100"})))
    w.run(w.eng.now())
    assert w.where()["a100-only"] is None
    (a100,) = w.ready("a100-1")
    assert w.where()["a100-only"] == a100


def test_pods_complete_after_their_duration_and_free_capacity_for_pending_ones() -> None:
    w = World()
    (node,) = w.ready("t4-1")
    t0 = w.eng.now()
    w.add(gpu_pod("first"), duration=600.0)
    w.add(gpu_pod("second"), duration=600.0)
    w.run(t0)
    assert w.where() == {"first": node, "second": None}
    w.run(t0 + 600.0)
    assert w.where() == {"second": node}
    w.run(t0 + 1200.0)
    assert w.cluster.list_pods() == ()
    assert w.cluster.counters.pods_completed == 2
    assert sorted(w.cluster.pending_samples) == [0.0, 600.0]
    assert w.cluster.gpu_hours_requested() == pytest.approx(1200 / 3600)


def test_node_deletion_re_pends_pods_and_counts_disruptions() -> None:
    w = World()
    (a,) = w.ready("t4-1")
    w.add(gpu_pod("p1"), duration=1000.0)
    w.add(gpu_pod("p2"))
    w.run(w.eng.now())
    assert w.where() == {"p1": a, "p2": None}
    w.cluster.delete_node(a)
    assert w.where() == {"p1": None, "p2": None}
    assert w.cluster.counters.disruptions == 1 and w.cluster.counters.nodes_removed_with_pods == 1
    (b,) = w.ready("t4-1")
    t_bound = w.eng.now()
    assert w.where()["p1"] == b  # first come, first served
    w.run(t_bound + 999.0)
    assert w.where()["p1"] == b  # the restarted pod runs its full duration again
    w.run(t_bound + 1000.0)
    assert "p1" not in w.where()
    w.cluster.delete_node("gone-already")  # ignored


def test_evict_respects_pod_disruption_budgets_and_counts_do_not_disrupt() -> None:
    pdb = PodDisruptionBudget("web", "default", {"app": "web"}, max_unavailable=1)
    w = World(pdbs=(pdb,))
    (node,) = w.ready("t4-2")
    for i in range(2):
        w.add(replace(gpu_pod(f"web{i}"), labels={"app": "web"}))
    w.add(replace(gpu_pod("dnd", gpus=0), annotations={L.DO_NOT_DISRUPT_ANNOTATION: "true"}))
    w.run(w.eng.now())
    assert w.where() == {"web0": node, "web1": node, "dnd": node}
    assert w.cluster.evict("default/web0") is True
    assert w.cluster.evict("default/web1") is False  # web0 is still unavailable
    assert w.where()["web1"] == node
    assert w.cluster.counters.pdb_refusals == 1
    assert any(e.kind == "EvictionRefused" for e in w.cluster.events)
    assert w.cluster.evict("default/dnd") is True
    assert w.cluster.counters.do_not_disrupt_violations == 1
    assert w.cluster.evict("default/missing") is True
    strict = World(pdbs=(PodDisruptionBudget("all", "default", {}, max_unavailable=0),))
    strict.ready("t4-1")
    strict.add(gpu_pod("x"))
    strict.run(strict.eng.now())
    assert strict.cluster.evict("default/x") is False


def test_gangs_bind_all_or_nothing() -> None:
    w = World()
    w.ready("t4-2")
    for i in range(3):
        w.add(gpu_pod(f"g{i}", gang="job", gang_size=3))
    w.run(w.eng.now())
    assert set(w.where().values()) == {None}
    w.ready("t4-1")
    assert None not in w.where().values()
    w.add(gpu_pod("h0", gang="other", gang_size=2))
    w.run(w.eng.now())
    assert w.where()["h0"] is None  # waits for its second member


def test_spot_reclaim_re_pends_pods_and_counts_survival() -> None:
    w = World()
    a, b = w.ready("t4-1", count=2, ct=SPOT)
    w.add(gpu_pod("p"))
    w.run(w.eng.now())
    on = w.where()["p"]
    assert on is not None
    empty = b if on == a else a
    ids = {n.node_name: n.node_id for n in w.cloud.list_nodes()}
    w.cloud.interrupt(ids[on])
    w.cloud.interrupt(ids[empty])
    w.run(w.eng.now() + 121.0)
    assert w.where()["p"] is None and w.cluster.list_nodes() == ()
    assert w.cluster.counters.spot_interruptions == 2 and w.cluster.counters.spot_interruptions_survived == 1
    assert w.cluster.counters.disruptions == 1


def test_pods_pending_at_their_deadline_are_dropped() -> None:
    w = World()
    w.add(gpu_pod("late"), deadline=100.0)
    w.run(100.0)
    assert w.cluster.list_pods() == () and w.cluster.counters.pods_cancelled == 1
    assert w.cluster.pending_durations() == [100.0]


def test_measured_gpu_utilization() -> None:
    w = World(ClusterBehaviour(busy=0.8))
    (node,) = w.ready("t4-2")
    w.add(gpu_pod("a"))
    w.add(gpu_pod("b", gpus=0, milli=500), gpu_util=0.5)
    w.run(w.eng.now())
    assert w.cluster.gpu_utilization() == {node: pytest.approx((0.8 + 0.25) / 2)}
    noisy = World(ClusterBehaviour(utilization_noise=0.2))
    noisy.ready("t4-1")
    values = [next(iter(noisy.cluster.gpu_utilization().values())) for _ in range(50)]
    assert all(0.0 <= v <= 1.0 for v in values) and len(set(values)) > 10


def test_many_nodes_grow_the_slot_arrays_and_binding_stays_correct() -> None:
    w = World()
    names = w.ready("t4-1", count=40)
    for i in range(40):
        w.add(gpu_pod(f"p{i}"))
    w.run(w.eng.now())
    assert sorted(w.where().values()) == sorted(names)  # type: ignore[type-var]
    for n in names[:20]:
        w.cluster.delete_node(n)
    more = w.ready("t4-1", count=20)
    assert set(w.where().values()) == set(names[20:]) | set(more)
    assert len(w.cluster.list_nodes()) == 40


def test_records_events() -> None:
    w = World()
    w.cluster.record(Event(1.0, "ScaleUp", "pool/gpu", "Pending", "launch 1 node"))
    w.ready("t4-1")
    kinds = [e.kind for e in w.cluster.events]
    assert kinds[0] == "ScaleUp" and "NodeRegistered" in kinds and "GpusReady" in kinds
