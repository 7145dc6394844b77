"""The simulator report's launch metrics: duplicate (redundant) launches versus nodes that merely stayed unused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from builders import FIXED_CLOUD, OD, catalog, itype, pod, taint, tol
from gpuscale.controller.backend import ClusterBackend
from gpuscale.core.model import Catalog, NodePool, Pod
from gpuscale.core.resources import Resources
from gpuscale.providers.base import LaunchRequest, Provider
from gpuscale.sim.cloud import CloudBehaviour, SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Dist, Engine, SimClock
from gpuscale.sim.report import build_report, format_report
from gpuscale.sim.runner import run_simulation
from gpuscale.sim.scenario import Scenario, WorkloadSpec
from gpuscale.sim.workloads import PodShape, burst

CAT = catalog(
    itype("cpu-4", 4, 16, price=0.2),
    itype("t4-1", 8, 32, 1, "T4", price=0.6),
    itype("t4-2", 16, 64, 2, "T4", price=1.2),
    itype("a100-1", 12, 85, 1, "A100", price=3.0),
)
POOLS = (
    NodePool("gpu", labels={"team": "ml"}, taints=(taint("nvidia.com/gpu"),)),
    NodePool("plain"),
    NodePool("cpu", daemonset_overhead=Resources(cpu_milli=500, memory_mib=1024, pods=5)),
)
GPU_TOL = (tol("nvidia.com/gpu", "Exists"),)


class World:
    """A simulated cloud and cluster wired together, with a hand-driven "controller"."""

    def __init__(self, behaviour: CloudBehaviour = FIXED_CLOUD) -> None:
        self.eng = Engine()
        self.cluster = SimCluster(self.eng, CAT, POOLS, seed=1)
        self.cloud = SimCloud(self.eng, CAT, behaviour, listener=self.cluster)
        self.cluster.spot_notices = self.cloud.spot_notices
        self.n = 0

    def launch(
        self, *pods: str, it: str = "t4-1", count: int = 1, pool: str = "gpu", rid: str | None = None
    ) -> list[str]:
        """Launch for the pods named (short names in the default namespace); returns the node names."""
        self.n += 1
        keys = tuple(f"default/{p}" for p in pods)
        request = LaunchRequest(rid or f"r{self.n}", pool, it, "z1", OD, count, pods=keys)
        return [n.node_name for n in self.cloud.launch(request)]

    def add(self, p: Pod, duration: float = 3600.0) -> None:
        self.cluster.add_pod(p, duration)

    def run(self, t: float) -> None:
        self.eng.run_until(t)

    def where(self) -> dict[str, str | None]:
        return {p.name: p.node_name for p in self.cluster.list_pods()}

    def report(self) -> dict[str, Any]:
        return build_report(self.cloud, self.cluster)


def gpu_pod(name: str, gpus: int = 1, milli: int = 0, **kw: Any) -> Pod:
    return pod(name, cpu=1000, mem=1024, gpus=gpus, milli=milli, tolerations=GPU_TOL, **kw)


def test_a_node_launched_while_a_node_in_flight_already_covers_every_pending_pod_is_a_duplicate() -> None:
    w = World()
    w.add(gpu_pod("p"))
    (first,) = w.launch("p")
    w.run(10.0)
    (second,) = w.launch("p")  # the first node is still provisioning and has room for p
    assert w.cloud.redundant_nodes == [second]
    w.run(40.0)
    (third,) = w.launch("p")  # running, not registered: still in flight
    w.run(100.0)
    (fourth,) = w.launch("p")  # registered, device plugin not ready: GPUs count at template capacity
    assert w.cloud.redundant_nodes == [second, third, fourth]
    r = w.report()
    assert r["nodesLaunched"] == 4 and r["redundantLaunches"] == 3 and r["duplicateLaunches"] == 3
    assert r["cloud"]["redundant_launches"] == 3 and r["cloud"]["duplicate_nodes"] == 0
    w.run(1000.0)
    assert w.where()["p"] in {first, second, third, fourth}
    assert r["duplicateLaunches"] == w.report()["duplicateLaunches"]


def test_a_node_launched_for_pods_beyond_the_room_in_flight_is_not_a_duplicate() -> None:
    w = World()
    for i in range(3):
        w.add(gpu_pod(f"p{i}"))
    w.launch("p0")
    w.launch("p1")
    w.launch("p2")  # two GPUs in flight for three one-GPU pods: each of the three is needed
    assert w.cloud.counters.redundant_launches == 0
    w.launch("p0", "p1", it="t4-2")  # three GPUs in flight for three pods: not needed
    w.launch("p0")
    assert w.cloud.redundant_nodes == [n.node_name for n in w.cloud.alive()][3:]
    w.run(1000.0)
    r = w.report()
    assert r["nodesLaunched"] == 5 and r["duplicateLaunches"] == r["redundantLaunches"] == 2
    assert r["unusedNodes"] == 2


def test_each_node_of_a_multi_node_launch_is_checked_against_the_earlier_ones() -> None:
    w = World()
    for i in range(3):
        w.add(gpu_pod(f"p{i}"))
    names = w.launch("p0", "p1", "p2", count=5)
    assert w.cloud.redundant_nodes == names[3:]
    again = w.cloud.launch(LaunchRequest("r1", "gpu", "t4-1", "z1", OD, 5, pods=("default/p0",)))
    assert [n.node_name for n in again] == names
    assert w.cloud.counters.idempotent_replays == 1 and w.cloud.counters.redundant_launches == 2


def test_launches_without_pods_or_for_pods_no_longer_pending_are_never_duplicates() -> None:
    w = World()
    w.add(gpu_pod("p"))
    w.launch("p")
    w.launch()  # minNodes, replacements: no pods
    w.launch(count=3)
    w.launch("gone", "other")  # pods that are not pending (bound, completed, cancelled or unknown)
    assert w.cloud.counters.redundant_launches == 0
    w.run(1000.0)
    r = w.report()
    assert r["nodesLaunched"] == 6 and r["duplicateLaunches"] == 0 and r["unusedNodes"] == 5
    assert "nodes launched      6 (0 duplicate, 5 never used, 0 failed launches)" in format_report(r)


def test_a_node_left_unused_because_a_running_pod_completed_is_unused_not_duplicate() -> None:
    w = World()
    w.add(gpu_pod("a"), duration=100.0)
    (first,) = w.launch("a")
    w.run(180.0)
    assert w.where() == {"a": first}  # runs until 280 s
    w.add(gpu_pod("b"))
    (second,) = w.launch("b")  # the only GPU is taken: a genuine launch (its GPUs appear at 360 s)
    w.run(280.0)
    assert w.where() == {"b": first}  # a completed and b took its GPU before the new node was ready
    w.run(2000.0)
    r = w.report()
    assert r["unusedNodes"] == 1 and r["duplicateLaunches"] == 0 and r["redundantLaunches"] == 0
    assert second not in w.cluster.used_nodes


def test_fractions_share_one_gpu_in_flight() -> None:
    w = World()
    w.add(gpu_pod("f0", gpus=0, milli=500))
    w.add(gpu_pod("f1", gpus=0, milli=500))
    (a,) = w.launch("f0", "f1")
    (b,) = w.launch("f1")  # 500 + 500 milli fit on the one GPU in flight
    assert w.cloud.redundant_nodes == [b]
    w.run(1000.0)
    assert w.where() == {"f0": a, "f1": a}

    w = World()
    w.add(gpu_pod("f0", gpus=0, milli=500))
    w.add(gpu_pod("f1", gpus=0, milli=600))
    w.launch("f0")
    w.launch("f1")  # 600 + 500 > 1000: the first node's GPU takes one of them only
    assert w.cloud.counters.redundant_launches == 0
    w.launch("f0")  # 600 on the first node, 500 on the second
    assert w.cloud.counters.redundant_launches == 1


def test_fractions_never_straddle_two_gpus_in_flight() -> None:
    w = World()
    for i in range(3):
        w.add(gpu_pod(f"f{i}", gpus=0, milli=600))
    w.launch("f0", "f1", it="t4-2")
    w.launch("f2")  # 1800 milli < 2 GPUs, but a 600-milli fraction per GPU only
    assert w.cloud.counters.redundant_launches == 0
    w.launch("f2")
    assert w.cloud.counters.redundant_launches == 1


def test_a_registered_node_whose_device_plugin_is_not_ready_counts_at_template_gpu_capacity() -> None:
    w = World()
    (node,) = w.launch(it="t4-2")
    w.run(100.0)
    registered = w.cluster.node(node)
    assert registered is not None and registered.allocatable.gpus == 0
    for name in ("p", "q", "r"):
        w.add(gpu_pod(name))
    w.add(pod("c", cpu=500, tolerations=GPU_TOL))
    w.launch("r")  # three GPUs wanted, two on the registered node: needed
    assert w.cloud.counters.redundant_launches == 0
    w.launch("q")  # two registered (not yet advertised) + one in flight: not needed
    assert w.cloud.counters.redundant_launches == 1
    # the what-if changed nothing: the GPUs are still not allocatable and no GPU pod is bound early
    w.run(179.0)
    assert w.where() == {"p": None, "q": None, "r": None, "c": node}
    registered = w.cluster.node(node)
    assert registered is not None and registered.allocatable.gpus == 0
    w.run(180.0)
    assert w.where() == {"p": node, "q": node, "r": None, "c": node}


def test_cordoned_nodes_and_nodes_whose_gpus_failed_are_not_room() -> None:
    w = World()
    (node,) = w.launch(it="t4-2")
    w.run(200.0)
    w.cluster.cordon(node)
    w.add(gpu_pod("p"))
    w.launch("p")  # the only free GPUs are on a cordoned node
    assert w.cloud.counters.redundant_launches == 0
    w.cluster.uncordon(node)
    w.add(gpu_pod("q"))
    w.launch("q")  # p and q fit on the uncordoned node (the scheduler has not bound them yet)
    assert w.cloud.counters.redundant_launches == 1
    w.run(200.0)
    assert w.where() == {"p": node, "q": node}

    for failure_rate, expected in ((0.0, 1), (1.0, 0)):
        f = World(replace(FIXED_CLOUD, gpu_init_failure_rate=failure_rate))
        f.launch(it="t4-2")
        f.run(100.0)  # registered; with the failure its GPUs never appear
        f.add(pod("c", cpu=500, tolerations=GPU_TOL))
        f.launch("c", it="cpu-4", pool="cpu")  # before the scheduler ran: a CPU pod the node could take
        assert f.cloud.counters.redundant_launches == expected


def test_nodes_in_flight_that_are_deleted_or_fail_are_not_room() -> None:
    w = World()
    w.add(gpu_pod("p"))
    w.launch("p")
    (node,) = w.cloud.alive()
    w.cloud.delete_node(node.node_id)
    w.launch("p")
    assert w.cloud.counters.redundant_launches == 0
    f = World(replace(FIXED_CLOUD, launch_failure_rate=1.0))
    f.add(gpu_pod("p"))
    f.launch("p")
    f.run(31.0)  # failed while provisioning
    f.launch("p")
    assert f.cloud.counters.redundant_launches == 0 and f.cloud.counters.async_launch_failures == 1


def test_taints_and_gpu_models_decide_what_room_counts() -> None:
    w = World()
    w.add(pod("no-tol", gpus=1))
    w.launch("no-tol")  # pool gpu: tainted
    w.launch("no-tol", pool="plain")  # the GPU in flight is tainted: this launch is needed
    assert w.cloud.counters.redundant_launches == 0
    w.add(gpu_pod("a100", models=frozenset({"A100"})))
    w.launch("a100", pool="plain")  # T4 nodes in flight do not help an A100 pod
    w.launch("a100", it="a100-1", pool="plain")
    assert w.cloud.counters.redundant_launches == 0
    w.launch("no-tol", it="a100-1")  # now both pods have room in flight
    assert w.cloud.counters.redundant_launches == 1


def test_node_selectors_decide_what_room_counts() -> None:
    w = World()
    w.add(gpu_pod("ml", selector={"team": "ml"}))  # only pool gpu's nodes carry team=ml
    w.launch("ml", pool="plain")
    w.launch("ml", pool="plain")
    w.launch("ml")
    assert w.cloud.counters.redundant_launches == 0
    w.launch("ml", pool="plain")
    assert w.cloud.counters.redundant_launches == 1


def test_room_for_the_launched_pods_is_not_enough_while_other_pods_wait() -> None:
    w = World()
    w.add(gpu_pod("big", gpus=2))
    w.add(gpu_pod("small"))
    w.launch("small")
    w.launch("small")  # small would fit in flight, big would not: needed
    w.launch("big", it="t4-2")
    assert w.cloud.counters.redundant_launches == 0
    w.launch("small")  # largest first: big on the t4-2, small on a t4-1
    assert w.cloud.counters.redundant_launches == 1


def test_daemonset_pods_are_ignored() -> None:
    w = World()
    w.add(gpu_pod("p"))
    w.add(replace(pod("ds", cpu=100_000), is_daemonset=True))  # fits nowhere, and does not count
    w.launch("p")
    w.launch("p")
    assert w.cloud.counters.redundant_launches == 1


class NaiveController:
    """Launches one node per pending GPU pod at every reconcile, ignoring the nodes in flight."""

    def __init__(
        self,
        *,
        backend: ClusterBackend,
        provider: Provider,
        pools: Sequence[NodePool],
        catalog: Catalog,
        clock: SimClock,
        config: Mapping[str, Any],
    ) -> None:
        self.backend, self.provider, self.pool = backend, provider, pools[0]
        self.n = 0

    def reconcile(self) -> None:
        for p in self.backend.list_pods():
            if p.node_name is None:
                self.n += 1
                self.provider.launch(LaunchRequest(f"naive-{self.n}", self.pool.name, "t4-1", "z1", pods=(p.key,)))


def test_a_controller_that_ignores_capacity_in_flight_scores_duplicates() -> None:
    behaviour = FIXED_CLOUD
    arrivals = burst(8, at=10.0, shape=PodShape(cpu_milli=1000, memory_mib=1024, gpus=1), runtime=Dist.const(600))
    scenario = Scenario(
        "burst",
        seed=1,
        catalog=CAT,
        pools=(NodePool("plain"),),
        cloud=behaviour,
        workload=(WorkloadSpec("burst", lambda seed: arrivals),),
        policy={"name": "naive"},
        duration_s=3600.0,
    )
    r = run_simulation(scenario, NaiveController).report
    assert r["podsCompleted"] == 8
    # 8 genuine nodes; every later reconcile before the GPUs appear buys 8 more for the same pods
    assert r["nodesLaunched"] > 8
    assert r["duplicateLaunches"] == r["redundantLaunches"] == r["nodesLaunched"] - 8
    assert r["unusedNodes"] == r["nodesLaunched"] - 8
