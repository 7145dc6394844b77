"""``gpuscale bench planner``: planner speed on a large synthetic cluster.

10,000 pending pods (1/2/4/8-GPU, fractional, CPU-only; selectors on GPU model and zone; tolerations) × 400 instance
types (3 zones, on-demand and spot) × 1,000 existing, partly filled nodes. Prints plan time, pods/s and peak memory
(tracemalloc) for the greedy planner and with the exact solver.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
import tracemalloc
from dataclasses import dataclass

import click

from gpuscale.core import labels as L
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    InstanceType,
    Node,
    NodePool,
    Offering,
    Pod,
    Snapshot,
    Taint,
    TaintEffect,
    Toleration,
)
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner import plan
from gpuscale.core.resources import Request, Resources

ZONES = ("zone-a", "zone-b", "zone-c")
GPU_MODELS = {  # model: ($/GPU-hour, GiB per GPU)
    "T4": (0.53, 16),
    "A10": (1.01, 24),
    "L4": (0.80, 24),
    "L40S": (1.86, 48),
    "A100": (3.67, 80),
    "H100": (6.88, 80),
    "V100": (3.06, 16),
    "RTX6000": (1.50, 24),
    "RTX4000-Ada": (0.52, 20),
    "A10G": (1.21, 24),
}
GPU_TAINT = Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE, "present")
GPU_TOLERATION = Toleration("nvidia.com/gpu", "Exists")


def synthetic_catalog(rng: random.Random) -> Catalog:
    """400 instance types: 200 GPU (10 models × 1/2/4/8 GPUs × 5 sizes), 200 CPU-only."""
    types: list[InstanceType] = []
    for model, (gpu_price, gib) in GPU_MODELS.items():
        for count in (1, 2, 4, 8):
            for size, cpu_per_gpu in enumerate((4, 8, 12, 16, 24)):
                vcpus = cpu_per_gpu * count
                mem = vcpus * 8 * 1024
                price = count * gpu_price + vcpus * 0.02 + rng.uniform(0, 0.05)
                offers = [Offering(z, CapacityType.ON_DEMAND, round(price, 4)) for z in ZONES]
                offers += [Offering(z, CapacityType.SPOT, round(price * rng.uniform(0.3, 0.6), 4)) for z in ZONES]
                types.append(
                    InstanceType(
                        f"{model.lower()}-{count}x-s{size}",
                        "bench",
                        vcpus,
                        mem,
                        count,
                        model,
                        gib * 1024,
                        family=model.lower(),
                        offerings=tuple(offers),
                    )
                )
    for family in range(10):
        for size in range(20):
            vcpus = 2 * (size + 1)
            ratio = (2, 4, 8)[family % 3]
            price = vcpus * (0.035 + 0.004 * family) + ratio * vcpus * 0.002
            offers = [Offering(z, CapacityType.ON_DEMAND, round(price, 4)) for z in ZONES]
            offers += [Offering(z, CapacityType.SPOT, round(price * 0.4, 4)) for z in ZONES]
            types.append(
                InstanceType(
                    f"c{family}-{vcpus}",
                    "bench",
                    vcpus,
                    vcpus * ratio * 1024,
                    family=f"c{family}",
                    offerings=tuple(offers),
                )
            )
    return Catalog("bench", tuple(types))


def synthetic_snapshot(seed: int = 7, pods: int = 10_000, nodes: int = 1_000) -> Snapshot:
    """The benchmark's snapshot (deterministic for ``seed``)."""
    rng = random.Random(seed)
    cat = synthetic_catalog(rng)
    gpu_types = [t for t in cat.instance_types if t.gpu_count]
    cpu_types = [t for t in cat.instance_types if not t.gpu_count]
    pools = (
        NodePool(
            "gpu",
            instance_types=tuple(t.name for t in gpu_types),
            taints=(GPU_TAINT,),
            capacity_types=(CapacityType.ON_DEMAND,),
            max_nodes=5000,
        ),
        NodePool(
            "gpu-spot",
            instance_types=tuple(t.name for t in gpu_types if t.gpu_model in ("T4", "A10", "L4")),
            taints=(GPU_TAINT, Taint("spot", TaintEffect.NO_SCHEDULE, "true")),
            capacity_types=(CapacityType.SPOT,),
            weight=10,
            max_nodes=200,
        ),
        NodePool(
            "cpu",
            instance_types=tuple(t.name for t in cpu_types),
            max_nodes=2000,
            daemonset_overhead=Resources(200, 512, 0, 5),
        ),
    )
    existing: list[Node] = []
    bound: list[Pod] = []
    for i in range(nodes):
        t = rng.choice(gpu_types if i % 3 else cpu_types)
        zone = rng.choice(ZONES)
        lab = {
            L.INSTANCE_TYPE: t.name,
            L.ZONE: zone,
            L.CAPACITY_TYPE: "on-demand",
            L.POOL: "gpu" if t.gpu_count else "cpu",
        }
        if t.gpu_model:
            lab[L.GPU_PRODUCT] = t.gpu_model
        name = f"node-{i:04d}"
        existing.append(
            Node(
                name,
                Resources(t.vcpus * 1000, t.memory_mib, t.gpu_count),
                lab,
                (GPU_TAINT,) if t.gpu_count else (),
                pool=lab[L.POOL],
            )
        )
        for g in range(t.gpu_count if rng.random() < 0.9 else 0):
            bound.append(
                Pod(
                    f"run-{i}-{g}",
                    request=Request(2000, 8192, 1),
                    node_name=name,
                    phase="Running",
                    tolerations=(GPU_TOLERATION,),
                )
            )
        if not t.gpu_count:
            bound.append(
                Pod(f"run-{i}-c", request=Request(t.vcpus * 800, t.memory_mib // 2), node_name=name, phase="Running")
            )
    pending: list[Pod] = []
    models = list(GPU_MODELS)
    for j in range(pods):
        kind = rng.random()
        sel: dict[str, str] = {}
        tols: tuple[Toleration, ...] = (GPU_TOLERATION,)
        if rng.random() < 0.3:
            tols = (GPU_TOLERATION, Toleration("spot", "Equal", "true", TaintEffect.NO_SCHEDULE))
        if kind < 0.45:
            req = Request(rng.choice((2000, 4000, 8000)), rng.choice((8192, 16384, 32768)), rng.choice((1, 1, 2, 4, 8)))
        elif kind < 0.65:
            req = Request(1000, 4096, gpu_milli=rng.choice((250, 300, 500, 700)))
        else:
            req = Request(rng.choice((250, 500, 1000, 2000)), rng.choice((512, 1024, 4096)))
            tols = ()
        if req.wants_gpu and rng.random() < 0.5:
            sel[L.GPU_PRODUCT] = rng.choice(models)
        if rng.random() < 0.2:
            sel[L.ZONE] = rng.choice(ZONES)
        pending.append(
            Pod(f"p-{j:05d}", request=req, node_selector=sel, tolerations=tols, priority=rng.choice((0, 0, 0, 100)))
        )
    return Snapshot(tuple(bound + pending), tuple(existing), pools, cat)


@dataclass(frozen=True)
class BenchResult:
    """One timed planner run."""

    label: str
    seconds: float
    pods_per_s: float
    peak_mib: float
    launches: int
    nodes: int
    hourly_cost: float
    blocked: int


def run(snapshot: Snapshot, solver: bool, label: str) -> BenchResult:
    """Time one plan, and measure its peak memory in a second, traced run."""
    cfg = PlannerConfig(exact_solver=solver, solver_time_limit_s=2.0)
    t0 = time.perf_counter()
    result = plan(snapshot, cfg, 0.0)
    seconds = time.perf_counter() - t0
    tracemalloc.start()
    plan(snapshot, cfg, 0.0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    pending = sum(1 for p in snapshot.pods if p.pending)
    return BenchResult(
        label,
        seconds,
        pending / seconds,
        peak / 2**20,
        len(result.launches),
        sum(x.count for x in result.launches),
        result.total_hourly_cost,
        len(result.blocked),
    )


@click.command("planner")
@click.option("--pods", default=10_000, show_default=True)
@click.option("--nodes", default=1_000, show_default=True)
@click.option("--seed", default=7, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def planner_command(pods: int, nodes: int, seed: int, as_json: bool) -> None:
    """Planner speed: pending pods × 400 instance types × existing nodes (target: <= 1 s for 10,000 pods)."""
    snap = synthetic_snapshot(seed, pods, nodes)
    with contextlib.suppress(ImportError):  # a controller imports the solver once: not part of a plan's time
        import scipy.optimize  # noqa: F401
    results = [run(snap, False, "greedy"), run(snap, True, "greedy+milp")]
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=2))
        return
    click.echo(f"{pods} pending pods, {len(snap.catalog.instance_types)} instance types, {nodes} existing nodes")
    for r in results:
        click.echo(
            f"{r.label:>12}: {r.seconds:.3f} s, {r.pods_per_s:,.0f} pods/s, peak {r.peak_mib:.0f} MiB, "
            f"{r.nodes} new nodes in {r.launches} launches, ${r.hourly_cost:,.2f}/h, {r.blocked} blocked"
        )
