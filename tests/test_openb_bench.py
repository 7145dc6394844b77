"""The openb benchmark harness: protocol, metric, determinism and the click command, on small cuts of the trace."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gpuscale.bench.openb import (
    KS,
    arrival_sequence,
    openb_command,
    parse_seeds,
    run_bench,
    run_once,
    workload_name,
)
from gpuscale.core.resources import Request, Resources
from gpuscale.core.scoring import SCORERS, make_scorer
from gpuscale.core.state import NodeShape
from gpuscale.errors import InputError
from gpuscale.traces.openb import load_nodes, load_pods

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared openb data not present")


def cut(src: Path, dst: Path, rows: list[int]) -> Path:
    """Write the header and the given data rows (0-based) of ``src`` to ``dst``."""
    with gzip.open(src, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    dst.write_text("\n".join([lines[0], *(lines[1 + i] for i in rows)]) + "\n", encoding="utf-8")
    return dst


@pytest.fixture
def small_trace(tmp_path: Path) -> tuple[Path, Path]:
    """20 nodes spread over the node list (every GPU model) and the first 200 pods of the default workload."""
    nodes = cut(DATA / "openb_node_list_gpu_node.csv.gz", tmp_path / "nodes.csv", list(range(0, 1213, 61)))
    pods = cut(DATA / "openb_pod_list_default.csv.gz", tmp_path / "openb_pod_list_small.csv", list(range(200)))
    return nodes, pods


@needs_data
def test_small_cut_end_to_end_is_deterministic(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    shapes = load_nodes(nodes)
    requests = [p.request for p in load_pods(pods)]
    assert len(shapes) == 20 and len(requests) == 200
    capacity = sum(s.capacity.gpus for s in shapes) * 1000
    for name in sorted(SCORERS):
        a = run_bench(shapes, requests, name, (1, 2), workload="small")
        b = run_bench(shapes, requests, name, (1, 2), workload="small")
        np.testing.assert_equal([r.unallocated_pct for r in a.runs], [r.unallocated_pct for r in b.runs])
        for r in a.runs:
            assert set(r.unallocated_pct) == set(KS)
            assert all(0.0 <= v <= 100.0 for v in r.unallocated_pct.values())
            assert r.unallocated_pct[90] >= 9.0  # at most ~90 % can be allocated when ~90 % arrived
            seq = arrival_sequence(requests, capacity, r.seed, shuffle=True)
            assert r.arrived_pods == len(seq)
            assert 0 <= r.failed_pods <= r.arrived_pods
    fill = run_bench(shapes, requests, "fill-frag", (1, 2, 3)).median(100)
    rnd = run_bench(shapes, requests, "random", (1, 2, 3)).median(100)
    assert fill <= rnd


@needs_data
def test_cli_json_shape_and_table(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    runner = CliRunner()
    args = ["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1-2"]
    res = runner.invoke(openb_command, [*args, "--scorer", "best-fit", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["workload"] == "small" and doc["scorer"] == "best-fit" and doc["seeds"] == [1, 2]
    assert set(doc["unallocated_pct"]) == {"90", "100", "110", "130"}
    assert isinstance(doc["failed_pods"], int) and doc["seconds"] >= 0
    res = runner.invoke(openb_command, [*args, "--scorer", "all", "--json"])
    assert res.exit_code == 0, res.output
    assert sorted(d["scorer"] for d in json.loads(res.stdout)) == sorted(SCORERS)
    res = runner.invoke(openb_command, [*args, "--scorer", "random", "--file-order"])
    assert res.exit_code == 0 and "random" in res.output and "k=100" in res.output
    bad = runner.invoke(openb_command, [*args, "--scorer", "nope"])
    assert bad.exit_code != 0 and "unknown scorer" in bad.output
    bad = runner.invoke(openb_command, [*args, "--seeds", "9-1"])
    assert bad.exit_code != 0 and "--seeds" in bad.output


def test_metric_counts_failed_demand_at_each_k() -> None:
    # One node, 2 GPUs, CPU for one pod only: the second 1-GPU pod fails, so half the arrived GPU stays unallocated.
    shapes = [NodeShape("n", Resources(cpu_milli=10, memory_mib=10, gpus=2), "T4")]
    pods = [Request(cpu_milli=6, memory_mib=1, gpus=1)]
    r = run_once(shapes, pods, make_scorer("best-fit"), seed=0, ks=(20, 50, 100, 130))
    assert r.arrived_pods == 2 and r.failed_pods == 1
    assert r.unallocated_pct[50] == pytest.approx(50.0)  # after pod 1: 50 % arrived, 50 % allocated
    assert r.unallocated_pct[100] == pytest.approx(50.0)  # pod 2 arrived but failed
    assert r.unallocated_pct[130] == pytest.approx(50.0)  # the next pod would pass 130 %: last state
    assert math.isnan(r.unallocated_pct[20])  # before the first arrival: not measured


def test_arrival_sequence_extends_to_the_target_without_passing_it() -> None:
    reqs = [Request(gpus=1), Request(gpu_milli=500), Request(cpu_milli=5)]
    cap = 10_000
    seq = arrival_sequence(reqs, cap, seed=3)
    assert seq[:3] == [0, 1, 2]
    demand = np.cumsum([reqs[i].gpu_demand_milli for i in seq])
    assert demand[-1] <= 13_000 and demand[-1] + 1000 > 13_000 - 1000
    assert seq == arrival_sequence(reqs, cap, seed=3)
    assert sorted(arrival_sequence(reqs, cap, seed=3, shuffle=True)[:3]) == [0, 1, 2]
    with pytest.raises(InputError, match="no GPU"):
        arrival_sequence([Request(cpu_milli=1)], cap, seed=1)


def test_helpers() -> None:
    assert parse_seeds("42-44,50") == (42, 43, 44, 50)
    with pytest.raises(InputError):
        parse_seeds("x")
    assert workload_name("../x/openb_pod_list_gpushare40.csv.gz") == "gpushare40"
    assert workload_name("mine.csv") == "mine"


@needs_data
def test_the_multigpu_rule_rebuilds_the_shipped_multigpu20_from_default() -> None:
    from gpuscale.bench.openb import load_workload, multigpu_variant

    nodes = DATA / "openb_node_list_gpu_node.csv.gz"
    _, default = load_workload(nodes, DATA / "openb_pod_list_default.csv.gz")
    _, shipped = load_workload(nodes, DATA / "openb_pod_list_multigpu20.csv.gz")

    def multi_share(reqs: list[Request]) -> float:
        return 100 * sum(r.gpu_demand_milli for r in reqs if r.gpus >= 2) / sum(r.gpu_demand_milli for r in reqs)

    built = multigpu_variant(default, multi_share(shipped))
    assert built[: len(default)] == default  # every pod kept, in order
    added, shipped_added = len(built) - len(default), len(shipped) - len(default)  # 172 in the shipped file
    assert abs(added - shipped_added) <= 0.05 * shipped_added  # sampled sizes (2, 4, 8 GPUs) vary with the seed
    for pct in (30, 40, 50):
        assert pct <= multi_share(multigpu_variant(default, pct)) < pct + 1
    assert multigpu_variant(default, 30) == multigpu_variant(default, 30)  # one fixed file per share
