"""``gpuscale simulate``, ``gpuscale compare`` and ``gpuscale demo`` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuscale.cli import main
from gpuscale.sim.commands import COMPARE_KEYS
from gpuscale.sim.policies import POLICIES

SCENARIO = """\
name: small-burst
seed: 5
duration: 3h
catalog: linode
pools:
  - name: gpu
    disruption: {consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 2m}
cloud:
  devicePluginDelay: 60s
workload:
  - source: burst
    count: 6
    at: 5m
    shape: {cpu: 4, memory: 16Gi, gpus: 1}
    runtime: 40m
  - source: burst
    count: 4
    at: 90m
    shape: {cpu: 2, memory: 8Gi, gpuMilli: 500}
    runtime: 20m
policy:
  name: gpuscale
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SCENARIO)
    return path


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def test_simulate_json_reports_every_pod(scenario: Path) -> None:
    code, out, _ = run("simulate", str(scenario), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["scenario"] == "small-burst" and report["policy"] == "gpuscale"
    assert report["podsArrived"] == 10 and report["podsCompleted"] == 10 and report["podsPending"] == 0
    assert report["costUsd"] > 0 and 0 < report["gpuUtilization"] <= 1
    assert report["gpuHoursRequested"] == pytest.approx(6 * 40 / 60 + 4 * 0.5 * 20 / 60, rel=1e-6)
    assert report["nodesAliveAtEnd"] == 0  # everything scaled back down


def test_simulate_text_and_out_dir(scenario: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    code, out, _ = run("simulate", str(scenario), "--out", str(out_dir), "--policy", "karpenter")
    assert code == 0
    assert "total cost" in out and "policy karpenter" in out
    written = {p.name for p in out_dir.iterdir()}
    assert "report.json" in written and any(n.endswith(".csv") for n in written)
    assert any(n.endswith(".png") for n in written)
    assert json.loads((out_dir / "report.json").read_text())["policy"] == "karpenter"


def test_seed_override_is_deterministic(scenario: Path) -> None:
    a = json.loads(run("simulate", str(scenario), "--json", "--seed", "9")[1])
    b = json.loads(run("simulate", str(scenario), "--json", "--seed", "9")[1])
    for key in ("costUsd", "pendingP95s", "nodesLaunched"):
        assert a[key] == b[key]
    assert a["seed"] == 9


def test_compare_json_has_one_object_per_policy_and_the_bound(scenario: Path) -> None:
    code, out, _ = run("compare", str(scenario), "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["policy"] for r in rows] == [*POLICIES, "lower-bound"]
    for r in rows[:-1]:
        assert tuple(r) == COMPARE_KEYS
    assert set(rows[-1]) == {"policy", "costUsd"}
    bound = rows[-1]["costUsd"]
    assert bound > 0
    assert all(r["costUsd"] >= bound for r in rows[:-1])
    by = {r["policy"]: r for r in rows}
    # static peak buys the peak up front: nobody waits for a node after the first reconcile, and it costs the most
    assert by["static-peak"]["costUsd"] >= max(by[p]["costUsd"] for p in ("gpuscale", "karpenter"))
    assert by["gpuscale"]["duplicateLaunches"] == 0


def test_compare_table_and_plot(scenario: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "cmp"
    code, out, _ = run("compare", str(scenario), "--policies", "gpuscale,cluster-autoscaler", "--out", str(out_dir))
    assert code == 0
    assert "gpuscale" in out and "cluster-autoscaler" in out and "lower bound" in out
    assert (out_dir / "compare.png").stat().st_size > 0
    rows = json.loads((out_dir / "compare.json").read_text())
    assert [r["policy"] for r in rows] == ["gpuscale", "cluster-autoscaler", "lower-bound"]


def test_demo_runs_the_shipped_scenario() -> None:
    code, out, _ = run("demo", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["scenario"] == "demo-bursty-day" and report["simulatedSeconds"] == 86400
    assert report["podsArrived"] > 300 and report["costUsd"] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("compare", "{scenario}", "--policies", "gpuscale,magic"), "--policies"),
        (("simulate", "{missing}"), "missing.yaml"),
    ],
)
def test_bad_input_is_a_clear_error(scenario: Path, tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    argv = [a.format(scenario=scenario, missing=tmp_path / "missing.yaml") for a in args]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code != 0
    assert needle in res.output + (res.stderr or "")
    assert "Traceback" not in res.output


def test_bad_scenario_field_names_the_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("count: 6", "count: -6"))
    res = CliRunner().invoke(main, ["simulate", str(bad)])
    assert res.exit_code == 2
    assert "workload" in res.stderr and "count" in res.stderr and "bad.yaml" in res.stderr


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("name: gpuscale", "name: gpuscale\n  scorer: magic", "policy.scorer"),
        ("name: gpuscale", "name: gpuscale\n  batchIdle: soon", "policy.batchIdle"),
        ("name: gpuscale", "name: gpuscale\n  consolidation: maybe", "policy.consolidation"),
    ],
)
def test_bad_policy_settings_are_clear_errors(tmp_path: Path, old: str, new: str, field: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace(old, new))
    for command in ("simulate", "compare"):
        res = CliRunner().invoke(main, [command, str(bad)])
        assert res.exit_code == 2, res.output
        assert field in res.stderr and "bad.yaml:" in res.stderr
        assert "Traceback" not in res.output + res.stderr
