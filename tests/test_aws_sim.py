"""The EKS simulator scenario (benchmarks/scenarios/eks-burst.yaml): the burst is served on the AWS catalog, the
offering that runs out of capacity is left for the next one, and nothing is launched twice; the side-by-side script
(benchmarks/providers_side_by_side.py, a wrapper of `compare --providers`) shows it beside LKE, GKE and ACK."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuscale.cli import main

SCENARIO = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "eks-burst.yaml"


def test_eks_burst_is_served_with_a_capacity_fallback_and_no_duplicates() -> None:
    res = CliRunner().invoke(main, ["simulate", str(SCENARIO), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["podsCompleted"] == report["podsArrived"] == 64
    assert report["duplicateLaunches"] == 0 and report["redundantLaunches"] == 0
    assert report["cloud"]["insufficient_capacity"] >= 1
    assert set(report["costByInstanceType"]) == {"g5.2xlarge", "g5.4xlarge"}
    assert report["nodesLaunched"] == 64
    assert report["pendingMaxS"] < 600


def test_side_by_side_script_prints_one_row_per_provider(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("side_by_side", SCENARIO.parents[1] / "providers_side_by_side.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(SCENARIO)]) == 0  # now a thin wrapper of `gpuscale compare --providers`
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("provider"))
    assert lines[header].split()[:3] == ["provider", "cost", "$"]
    assert [line.split()[0] for line in lines[header + 1 : header + 5]] == ["lke", "eks", "gke", "ack"]
