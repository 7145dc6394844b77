"""The EKS simulator scenario (benchmarks/scenarios/eks-burst.yaml): the burst is served on the AWS catalog, the
offering that runs out of capacity is left for the next one, and nothing is launched twice."""

from __future__ import annotations

import json
from pathlib import Path

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
