"""The openb packing benchmark: the protocol of the FGD paper (Weng et al., USENIX ATC'23) on the Alibaba trace.

Protocol (``../shared/data/README.md``): the fixed cluster of ``openb_node_list_gpu_node`` receives the pods of one
pod list, shuffled with the seed, and never deletes any; it then receives pods sampled uniformly with replacement from
the same list until the next sample would take the *arrived* GPU demand (every pod that arrived, placed or not, in
milli-GPU) above 130 % of the cluster's GPU capacity. The shared README says "in file order"; the paper's runs use the
simulator's ``--shuffle-pod=true``, and only shuffled runs reproduce its BestFit figures (``shuffle=False`` gives the
file order). After every arrival the allocated GPU share is recorded; the figure at ``k`` is 100 % minus the mean
allocated share over the arrivals whose arrived demand rounds to ``k`` % of capacity, or lies within one point of it
if none does (as the paper's analysis script does); on clusters so small that one pod jumps further, the state after
the last arrival that did not pass ``k`` is used. Each pod goes to the feasible node the scorer ranks highest (lowest
row on ties); a scorer with a ``gpus_for(state, req, node)`` method also picks the physical GPU of a fraction.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from gpuscale.core.resources import Request
from gpuscale.core.scoring import SCORERS, Scorer, Workload
from gpuscale.core.state import BoolArray, ClusterState, IntArray, NodeShape
from gpuscale.errors import InputError
from gpuscale.resources import data_dir
from gpuscale.traces.openb import load_nodes, load_pods

KS: tuple[int, ...] = (90, 100, 110, 130)
"""Arrived-demand levels (% of GPU capacity) at which the unallocated share is reported."""

TARGET_PCT = 130.0
"""The workload is extended until arrived GPU demand reaches this share of capacity."""

DEFAULT_SEEDS: tuple[int, ...] = tuple(range(42, 52))

PUBLISHED_K100: dict[str, dict[str, float]] = {
    "default": {"random": 13.75, "dot-product": 9.44, "gpu-clustering": 8.42, "gpu-packing": 8.19, "best-fit": 7.09,
                "fgd": 4.77},
    "cpu050": {"random": 11.02, "dot-product": 6.94, "gpu-clustering": 6.52, "gpu-packing": 6.47, "best-fit": 6.42,
               "fgd": 5.00},
    "gpushare40": {"random": 15.04, "dot-product": 10.66, "gpu-clustering": 10.18, "gpu-packing": 10.19,
                   "best-fit": 8.53, "fgd": 6.05},
    "gpuspec10": {"random": 13.69, "dot-product": 9.75, "gpu-clustering": 8.06, "gpu-packing": 7.77, "best-fit": 6.88,
                  "fgd": 5.30},
    "multigpu20": {"random": 13.16, "dot-product": 8.19, "gpu-clustering": 6.62, "gpu-packing": 6.49,
                   "best-fit": 6.27, "fgd": 4.47},
}  # fmt: skip
"""Published medians (10 seeds) of the unallocated GPU share at k = 100, from the FGD paper, per workload."""

PUBLISHED_K130_DEFAULT: dict[str, float] = {
    "random": 12.62, "dot-product": 9.20, "gpu-clustering": 8.21, "gpu-packing": 7.94, "best-fit": 6.89, "fgd": 4.60,
}  # fmt: skip
"""Published medians at k = 130 on the default workload."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """One seeded run: unallocated GPU share (%) per k, failed pods, pods that arrived, wall seconds."""

    seed: int
    unallocated_pct: dict[int, float]
    failed_pods: int
    arrived_pods: int
    seconds: float


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Runs of one scorer on one workload over several seeds, with medians."""

    workload: str
    scorer: str
    runs: tuple[RunResult, ...]
    seconds: float
    published: dict[int, float] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        """The seeds, in run order."""
        return [r.seed for r in self.runs]

    def median(self, k: int) -> float:
        """Median over seeds of the unallocated share at ``k``."""
        return float(statistics.median(r.unallocated_pct[k] for r in self.runs))

    @property
    def failed_pods(self) -> int:
        """Median over seeds of the pods that failed to place (rounded down)."""
        return int(statistics.median_low(r.failed_pods for r in self.runs))

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` shape of the issue."""
        return {
            "workload": self.workload,
            "scorer": self.scorer,
            "seeds": self.seeds,
            "unallocated_pct": {str(k): _num(self.median(k)) for k in sorted(self.runs[0].unallocated_pct)},
            "failed_pods": self.failed_pods,
            "seconds": round(self.seconds, 2),
            "per_seed": [
                {
                    "seed": r.seed,
                    "unallocated_pct": {str(k): _num(v) for k, v in r.unallocated_pct.items()},
                    "failed_pods": r.failed_pods,
                    "arrived_pods": r.arrived_pods,
                }
                for r in self.runs
            ],
        }


def _num(x: float) -> float | None:
    """``x`` rounded for JSON; None when not measured (NaN: the run never reached that k)."""
    return None if np.isnan(x) else round(x, 2)


def _cell(x: float) -> str:
    return "-" if np.isnan(x) else f"{x:.2f}"


def workload_name(pods_path: str | Path) -> str:
    """The workload name of a pod list file (``openb_pod_list_default.csv.gz`` -> ``default``)."""
    stem = Path(pods_path).name.split(".")[0]
    m = re.fullmatch(r"openb_pod_list_(\w+)", stem)
    return m.group(1) if m else stem


def parse_seeds(text: str) -> tuple[int, ...]:
    """Parse ``42-51`` or ``1,2,5`` (or a mix) into seeds; raises InputError on bad input."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise InputError("bad seed list", where="--seeds", value=text, fix="use e.g. 42-51 or 1,2,3")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise InputError("seed range runs backwards", where="--seeds", value=part, fix="write low-high")
        seeds.extend(range(lo, hi + 1))
    return tuple(seeds)


class _HintedState(ClusterState):
    """A ClusterState whose next :meth:`place` may take the physical GPUs a scorer chose (``hint``)."""

    hint: tuple[int, ...] | None = None

    def choose_gpus(self, req: Request, i: int) -> tuple[int, ...]:
        hint, self.hint = self.hint, None
        if hint is not None and req.gpu_milli and all(self.gpu_free[i, g] >= req.gpu_milli for g in hint):
            return hint
        return super().choose_gpus(req, i)


class _Feasibility:
    """Fast feasibility masks over a ClusterState, with per-model-set masks cached."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._masks: dict[frozenset[str], BoolArray] = {}

    def candidates(self, req: Request) -> IntArray:
        s = self.state
        ok = (s.cpu_free >= req.cpu_milli) & (s.mem_free >= req.memory_mib) & (s.pods_free >= 1)
        if req.gpus:
            ok &= s.full_free >= req.gpus
        elif req.gpu_milli:
            ok &= s.max_free >= req.gpu_milli
        if req.wants_gpu and req.gpu_models is not None:
            mask = self._masks.get(req.gpu_models)
            if mask is None:
                allowed = [i for i, m in enumerate(s.models) if m in req.gpu_models]
                mask = np.isin(s.model_idx, np.array(allowed, dtype=np.int64))
                self._masks[req.gpu_models] = mask
            ok &= mask
        return np.flatnonzero(ok)


def arrival_sequence(
    requests: Sequence[Request],
    capacity_milli: int,
    seed: int,
    *,
    shuffle: bool = False,
    target_pct: float = TARGET_PCT,
) -> list[int]:
    """Indices into ``requests`` in arrival order: the file (shuffled with ``seed`` if asked), then seeded samples.

    Sampling stops before the first sample that would take arrived GPU demand above ``target_pct`` of capacity.
    """
    rng = np.random.default_rng(seed)
    n = len(requests)
    order = [int(i) for i in rng.permutation(n)] if shuffle else list(range(n))
    demand = np.array([r.gpu_demand_milli for r in requests], dtype=np.int64)
    arrived = int(demand.sum())
    if arrived <= 0:
        raise InputError("the pod list asks for no GPU at all", where="--pods", fix="use a pod list with GPU pods")
    limit = target_pct / 100.0 * capacity_milli
    if arrived > limit:
        cum = np.cumsum(demand[order])
        return order[: int(np.searchsorted(cum, limit, side="right"))]
    while True:
        for i in rng.integers(0, n, size=1024):
            d = int(demand[i])
            if arrived + d > limit:
                return order
            arrived += d
            order.append(int(i))


def run_once(
    shapes: Sequence[NodeShape],
    requests: Sequence[Request],
    scorer: Scorer,
    seed: int,
    *,
    shuffle: bool = True,
    ks: Sequence[int] = KS,
    target_pct: float = TARGET_PCT,
) -> RunResult:
    """One seeded run of the protocol (see the module docstring) with ``scorer``."""
    t0 = time.perf_counter()
    state = _HintedState(shapes)
    capacity = state.total_gpu_milli()
    if capacity <= 0:
        raise InputError("the node list has no GPUs", where="--nodes")
    gpus_for: Callable[[ClusterState, Request, int], tuple[int, ...] | None] | None = getattr(scorer, "gpus_for", None)
    reseed: Callable[[int], None] | None = getattr(scorer, "reseed", None)
    if reseed is not None:
        reseed(seed)
    scorer.prepare(state, Workload.from_requests(requests, top=len(requests)))
    feas = _Feasibility(state)
    seq = arrival_sequence(requests, capacity, seed, shuffle=shuffle, target_pct=target_pct)
    arrived_log = np.empty(len(seq), dtype=np.int64)
    alloc_log = np.empty(len(seq), dtype=np.int64)
    arrived = allocated = failed = 0
    for step, idx in enumerate(seq):
        req = requests[idx]
        arrived += req.gpu_demand_milli
        cand = feas.candidates(req)
        if cand.size:
            node = int(cand[int(np.argmax(scorer.score(state, req, cand)))])
            if gpus_for is not None:
                state.hint = gpus_for(state, req, node)
            state.place(req, node)
            allocated += req.gpu_demand_milli
        else:
            failed += 1
        arrived_log[step] = arrived
        alloc_log[step] = allocated
    arrived_pct = np.round(arrived_log * 100.0 / capacity)
    alloc_pct = alloc_log * 100.0 / capacity
    result: dict[int, float] = {}
    for k in ks:
        sel = arrived_pct == k
        if not sel.any():
            sel = np.abs(arrived_pct - k) <= 1
        if not sel.any():  # small clusters: one pod can jump several points; take the state just before passing k
            before = np.flatnonzero(arrived_log * 100.0 <= k * capacity)
            sel = before[-1:] if before.size else before
        result[k] = float(100.0 - alloc_pct[sel].mean()) if np.size(alloc_pct[sel]) else float("nan")
    return RunResult(seed, result, failed, len(seq), time.perf_counter() - t0)


def run_bench(
    shapes: Sequence[NodeShape],
    requests: Sequence[Request],
    scorer_name: str,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    *,
    workload: str = "",
    shuffle: bool = True,
    factory: Callable[[], Scorer] | None = None,
) -> BenchResult:
    """Run one scorer (by registry name, or ``factory``) over ``seeds``."""
    make = factory or SCORERS[scorer_name]
    t0 = time.perf_counter()
    runs = tuple(run_once(shapes, requests, make(), s, shuffle=shuffle) for s in seeds)
    published: dict[int, float] = {}
    if workload in PUBLISHED_K100 and scorer_name in PUBLISHED_K100[workload]:
        published[100] = PUBLISHED_K100[workload][scorer_name]
    if workload == "default" and scorer_name in PUBLISHED_K130_DEFAULT:
        published[130] = PUBLISHED_K130_DEFAULT[scorer_name]
    return BenchResult(workload, scorer_name, runs, time.perf_counter() - t0, published)


VARIANT_SEED = 0
"""Seed of the sampling that builds a multi-GPU variant (fixed, so a variant is the same file for every run)."""


def multigpu_variant(requests: Sequence[Request], share_pct: float, seed: int = VARIANT_SEED) -> list[Request]:
    """The openb rule for multi-GPU-heavy workloads: every pod of ``requests``, plus multi-GPU pods (2 or more whole
    GPUs) sampled with replacement from those of ``requests`` until they make ``share_pct`` % of the GPU demand.

    The shipped ``multigpu20`` file is ``default`` built this way: all 8,152 pods kept, 172 multi-GPU pods added,
    multi-GPU pods 20.4 % of the GPU demand (against 7.3 % in ``default``).
    """
    if not 0 < share_pct < 100:
        raise InputError("must be a percentage above 0 and below 100", where="--multigpu", value=str(share_pct),
                         fix="give the multi-GPU share of GPU demand, e.g. 30")  # fmt: skip
    multi = [r for r in requests if r.gpus >= 2]
    if not multi:
        raise InputError("the pod list has no multi-GPU pod to sample", where="--pods",
                         fix="use a pod list with pods of 2 or more GPUs")  # fmt: skip
    total = sum(r.gpu_demand_milli for r in requests)
    wanted = sum(r.gpu_demand_milli for r in multi)
    out = list(requests)
    rng = np.random.default_rng(seed)
    # add until multi / total reaches the share: wanted + x >= share * (total + x)
    while wanted * 100 < share_pct * total:
        r = multi[int(rng.integers(0, len(multi)))]
        out.append(r)
        wanted += r.gpu_demand_milli
        total += r.gpu_demand_milli
    return out


def load_workload(nodes: str | Path, pods: str | Path) -> tuple[list[NodeShape], list[Request]]:
    """Load a node list and a pod list (the pods' requests, in file order)."""
    return load_nodes(nodes), [p.request for p in load_pods(pods)]


DATA_DIR = data_dir() / "openb"
"""Where the openb files are looked for: ``$GPUSCALE_DATA_DIR/openb`` (not shipped; see :func:`missing_trace`)."""

DEFAULT_NODES = DATA_DIR / "openb_node_list_gpu_node.csv.gz"
DEFAULT_PODS = DATA_DIR / "openb_pod_list_default.csv.gz"


def render_table(results: Sequence[BenchResult], console: Console) -> None:
    """Print ``results`` as a rich table, with the published medians where known."""
    if not results:
        return
    first = results[0]
    ks = sorted(first.runs[0].unallocated_pct)
    table = Table(
        title=f"openb {first.workload}: unallocated GPU share (%) at arrived demand k, median of seeds "
        f"{first.seeds[0]}-{first.seeds[-1]} ({len(first.seeds)} runs)"
    )
    table.add_column("scorer")
    for k in ks:
        table.add_column(f"k={k}", justify="right")
    table.add_column("paper k=100", justify="right")
    if first.workload == "default":
        table.add_column("paper k=130", justify="right")
    table.add_column("failed pods", justify="right")
    table.add_column("seconds", justify="right")
    for r in results:
        row = [r.scorer, *(_cell(r.median(k)) for k in ks)]
        row.append(f"{r.published[100]:.2f}" if 100 in r.published else "-")
        if first.workload == "default":
            row.append(f"{r.published[130]:.2f}" if 130 in r.published else "-")
        row += [str(r.failed_pods), f"{r.seconds:.1f}"]
        table.add_row(*row)
    console.print(table)
    if first.workload in PUBLISHED_K100:
        fgd = PUBLISHED_K100[first.workload]["fgd"]
        console.print(f"Published FGD median at k=100 on {first.workload}: {fgd:.2f} (lower is better).")


@click.command("openb")
@click.option(
    "--nodes",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_NODES,
    show_default=True,
    help="openb node list (CSV or CSV.gz).",
)
@click.option(
    "--pods",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_PODS,
    show_default=True,
    help="openb pod list (CSV or CSV.gz, either column set).",
)
@click.option(
    "--scorer", default="all", show_default=True, help=f"Scorer name ({', '.join(sorted(SCORERS))}) or 'all'."
)
@click.option("--seeds", default="42-51", show_default=True, help="Seeds, e.g. 42-51 or 1,2,3.")
@click.option(
    "--file-order",
    is_flag=True,
    help="Place the file's pods in file order instead of shuffling them with the seed first. The "
    "published figures come from shuffled runs (the simulator's --shuffle-pod=true).",
)
@click.option(
    "--multigpu",
    type=click.FloatRange(min=0, max=100, min_open=True, max_open=True),
    default=None,
    help="Build a multi-GPU-heavy variant of the pod list first: add sampled multi-GPU pods until they make this "
    "percentage of the GPU demand (the rule behind multigpu20), e.g. 30, 40, 50.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def openb_command(
    nodes: Path, pods: Path, scorer: str, seeds: str, file_order: bool, multigpu: float | None, as_json: bool
) -> None:
    """Packing quality on the Alibaba openb GPU trace, with the FGD paper's protocol."""
    try:
        seed_list = parse_seeds(seeds)
        names = sorted(SCORERS) if scorer == "all" else [scorer]
        unknown = [n for n in names if n not in SCORERS]
        if unknown:
            raise InputError(
                "unknown scorer",
                where="--scorer",
                value=scorer,
                fix=f"use one of {', '.join(sorted(SCORERS))}, all",
            )
        shapes, requests = load_workload(nodes, pods)
        if multigpu is not None:
            requests = multigpu_variant(requests, multigpu)
    except InputError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    workload = workload_name(pods) if multigpu is None else f"multigpu{multigpu:g} (built from {workload_name(pods)})"
    console = Console(stderr=as_json)
    results = []
    for name in names:
        if not as_json:
            console.print(f"running {name} on {workload} ({len(seed_list)} seeds)...")
        results.append(run_bench(shapes, requests, name, seed_list, workload=workload, shuffle=not file_order))
    if as_json:
        payload = [r.to_json() for r in results]
        click.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
    else:
        render_table(results, console)
