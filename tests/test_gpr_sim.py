"""GPR workloads in the simulator: seeded arrivals through the real GprManager on SimCloud, and the report."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuscale.errors import InputError
from gpuscale.sim.gpr import (
    DEFAULT_SCENARIO,
    generate_requests,
    gpr_sim_command,
    load_gpr_scenario,
    parse_gpr_scenario,
    run_gpr_simulation,
    simulate_gprs,
)

BASE: dict[str, Any] = {
    "name": "test",
    "seed": 3,
    "duration": "2d",
    "catalog": "linode",
    "reconcileInterval": "30s",
    "manager": {"maxNodes": 12, "maxDelayedCount": 0, "delayInterval": "5m", "scaleUpLatency": "3m"},
    "cloud": {
        "launchLatency": {"distribution": "lognormal", "median": "90s", "sigma": 0.3},
        "registrationLatency": "60s",
        "deletionLatency": "30s",
    },
    "requests": {
        "ratePerHour": 2.0,
        "priorities": {"low": 1, "medium": 1, "high": 1},
        "shapes": [
            {"weight": 2, "gpuShape": "RTX4000-Ada", "numberOfGPUs": 1},
            {"weight": 1, "gpuShape": "RTX4000-Ada", "numberOfGPUs": 4, "numberOfGPUNodes": 2},
        ],
        "exitDuration": {"distribution": "lognormal", "median": "3h", "sigma": 0.5},
    },
}


def scenario(**changes: Any) -> dict[str, Any]:
    """BASE with nested changes: ``requests={"ratePerHour": 3}`` updates only that key."""
    out = copy.deepcopy(BASE)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def test_same_seed_same_run_and_another_seed_another_run() -> None:
    sc = scenario(requests={"idleTimeout": {"fraction": 0.5}, "workloadStops": {"fraction": 0.5}})
    a = run_gpr_simulation(sc)
    b = run_gpr_simulation(sc)
    a.pop("wallSeconds")
    b.pop("wallSeconds")
    assert a == b
    assert a["requests"]["submitted"] > 50 and a["requests"]["served"] > 0
    c = run_gpr_simulation({**sc, "seed": 4})
    c.pop("wallSeconds")
    assert c != a
    parsed = parse_gpr_scenario(sc)
    assert generate_requests(parsed) == generate_requests(parsed)


def test_generator_draws_the_configured_mix() -> None:
    sc = parse_gpr_scenario(
        scenario(
            duration="20d",
            requests={
                "ratePerHour": 3,
                "priorities": {"low": 3, "high": 1},
                "idleTimeout": {"fraction": 0.5, "duration": "45m"},
                "enableEviction": 1.0,
            },
        )
    )
    reqs = generate_requests(sc)
    n = len(reqs)
    assert abs(n - 3 * 24 * 20) < 4 * (3 * 24 * 20) ** 0.5  # Poisson count within 4 sigma
    prios = [r.spec["priority"] for r in reqs]
    assert all(1 <= p <= 100 or 201 <= p <= 300 for p in prios)
    assert 0.65 < sum(p <= 100 for p in prios) / n < 0.85
    timeouts = [r.spec.get("idleTimeOutDuration") for r in reqs]
    assert set(timeouts) == {None, "45m"} and 0.4 < timeouts.count("45m") / n < 0.6
    # eviction is only ever offered by low- and medium-priority requests
    assert all(r.spec.get("enableEviction") is (r.spec["priority"] <= 200 or None) for r in reqs)
    assert all(reqs[i].at < reqs[i + 1].at for i in range(n - 1)) and reqs[-1].at < 20 * 86400


def test_high_priority_waits_less_than_low_on_a_congested_cluster() -> None:
    sc = scenario(
        manager={"maxNodes": 5},
        requests={
            "ratePerHour": 2.2,
            "shapes": [{"gpuShape": "RTX4000-Ada", "numberOfGPUs": 1}],
            "exitDuration": {"distribution": "lognormal", "median": "2h", "sigma": 0.3},
        },
    )
    result = simulate_gprs(parse_gpr_scenario(sc))
    w = result.report["waitSeconds"]
    assert w["low"]["served"] > 20 and w["high"]["served"] > 20
    assert w["low"]["p95"] > 3600  # the cluster is congested: low-priority requests wait hours
    assert w["high"]["mean"] < w["low"]["mean"] / 2
    assert w["high"]["p95"] < w["low"]["p95"] / 2
    assert w["medium"]["mean"] < w["low"]["mean"]
    assert result.cloud.counters.nodes_launched > 5 and result.report["requests"]["failed"] == 0


def test_idle_timeout_releases_and_bounds_idle_gpu_hours() -> None:
    interval, timeout = 30.0, 1800.0
    requests = {
        "ratePerHour": 1.0,
        "exitDuration": "8h",
        "idleTimeout": {"fraction": 1.0, "duration": "30m"},
        "workloadStops": {"fraction": 1.0, "after": {"distribution": "uniform", "min": "20m", "max": "2h"}},
    }
    with_timeout = simulate_gprs(parse_gpr_scenario(scenario(manager={"maxNodes": 100}, requests=requests)))
    stopped = [o for o in with_timeout.outcomes if o.workload_stopped_at is not None and o.ended_at is not None]
    assert len(stopped) > 20
    for o in stopped:
        assert o.final_state == "Released" and o.last_trigger == "idle-timeout", o
        assert o.idle_timeout_s == timeout
        held_idle = o.ended_at - o.workload_stopped_at  # type: ignore[operator]
        assert timeout <= held_idle <= timeout + interval + 1e-6, o
        assert o.idle_after_stop_gpu_hours == pytest.approx(o.held_gpus * held_idle / 3600)
    report = with_timeout.report
    assert report["requests"]["releasedIdle"] == len(stopped)
    assert (
        report["gpuHours"]["idleAfterStopWithTimeout"]
        <= sum(o.held_gpus for o in stopped) * (timeout + interval) / 3600 + 1e-3
    )
    # The same workloads without an idle timeout stay idle until their exit duration.
    without = run_gpr_simulation(
        scenario(manager={"maxNodes": 100}, requests={**requests, "idleTimeout": {"fraction": 0.0}})
    )
    assert without["requests"]["releasedIdle"] == 0
    assert without["gpuHours"]["idleAfterWorkloadStopped"] > 3 * report["gpuHours"]["idleAfterWorkloadStopped"]
    assert without["cost"]["total"] > report["cost"]["total"]


def test_costs_and_gpu_hours_equal_the_cloud_accounting() -> None:
    sc = parse_gpr_scenario(
        scenario(
            inventory=[{"instanceType": "g2-gpu-rtx4000a4-s", "count": 1}],
            requests={"earlyRelease": {"fraction": 0.3}, "enableEviction": 0.5, "requeueOnFailure": 1.0},
        )
    )
    result = simulate_gprs(sc)
    end = sc.duration_s
    cost = result.report["cost"]
    assert cost["total"] == pytest.approx(result.cloud.total_cost(end), abs=1e-3) and cost["total"] > 0
    assert cost["unattributed"] == 0.0
    assert sum(o.cost for o in result.outcomes) == pytest.approx(result.cloud.total_cost(end), rel=1e-9)
    for band in ("low", "medium", "high"):
        mine = sum(o.cost for o in result.outcomes if o.band == band)
        assert cost["byPriority"][band] == pytest.approx(mine, abs=1e-3)
    hours = result.report["gpuHours"]
    assert hours["billed"] == pytest.approx(result.cloud.gpu_hours_bought(end), abs=1e-3)
    assert hours["provisioned"] == pytest.approx(hours["billed"] + hours["inventoryHeld"], abs=2e-3)
    assert 0 < hours["used"] <= hours["held"] <= hours["provisioned"] + 1e-3
    assert hours["inventoryHeld"] > 0  # the existing node was lent to GPRs
    assert result.cloud.counters.duplicate_nodes == 0


def test_insufficient_capacity_falls_back_to_other_offerings() -> None:
    sc = scenario(
        cloud={**BASE["cloud"], "capacity": [{"instanceType": "g2-gpu-rtx4000a4-s", "maxNodes": 0}]},
        requests={"shapes": [{"gpuShape": "RTX4000-Ada", "numberOfGPUs": 4}]},
    )
    result = simulate_gprs(parse_gpr_scenario(sc))
    report = result.report
    assert result.cloud.counters.insufficient_capacity > 0 and report["requests"]["capacityFallbacks"] > 0
    assert "provisioning-failed" not in report["requests"]["failuresByTrigger"]
    assert {t for (_, t) in result.cloud.cost_by_pool_type()} == {"g2-gpu-rtx4000a4-m"}
    assert report["requests"]["served"] == report["requests"]["submitted"] > 0


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("requestz: {}\n", "scenario.yaml:1 requestz", "unknown field"),
        ("requests:\n  shapes:\n    - {gpuShape: H200}\n", "scenario.yaml:3 requests.shapes[0].gpuShape", "H200"),
        ("requests:\n  shapes:\n    - {gpuShape: RTX6000, priority: 250}\n", "requests.shapes[0].priority", "unknown"),
        ("requests:\n  priorities: {urgent: 1}\n  shapes: [{gpuShape: RTX6000}]\n", "priorities.urgent", "unknown"),
        ("manager: {maxNodes: 0}\nrequests: {shapes: [{gpuShape: RTX6000}]}\n", "manager.maxNodes", ">= 1"),
        ("manager: {delayInterval: soon}\nrequests: {shapes: [{gpuShape: RTX6000}]}\n", "delayInterval", ""),
        (
            "requests:\n  shapes: [{gpuShape: RTX6000}]\n  idleTimeout: {fraction: 1, duration: 10s}\n",
            "scenario.yaml:3 requests.idleTimeout.duration",
            "at least 1m",
        ),
        ("requests:\n  shapes: [{gpuShape: RTX6000}]\n  ratePerHour: 0\n", "requests.ratePerHour", "greater than zero"),
        ("requests:\n  shapes: []\n", "requests.shapes", "at least one"),
        ("requests:\n  shapes: [{gpuShape: RTX6000, weight: 0}]\n", "requests.shapes", "positive weight"),
        ("name: x\n", "requests", "is required"),
        ("inventory: [{instanceType: g6-standard-2}]\nrequests: {shapes: [{gpuShape: RTX6000}]}\n", "inventory", ""),
    ],
)
def test_scenario_validation_names_the_field(tmp_path: Path, text: str, where: str, message: str) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        load_gpr_scenario(path)
    assert where in str(exc.value) and message in str(exc.value)


def test_cli_runs_the_shipped_scenario_and_reports_errors(tmp_path: Path) -> None:
    assert DEFAULT_SCENARIO.is_file()
    runner = CliRunner()
    result = runner.invoke(gpr_sim_command, ["--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["simulatedHours"] == 168 and report["requests"]["submitted"] > 100
    assert report["wallSeconds"] < 30  # a simulated week takes seconds
    small = tmp_path / "small.yaml"
    small.write_text("duration: 1d\nrequests:\n  ratePerHour: 1\n  shapes: [{gpuShape: RTX6000, numberOfGPUs: 2}]\n")
    text = runner.invoke(gpr_sim_command, [str(small), "--seed", "1"])
    assert text.exit_code == 0 and "wait time until nodes ready" in text.output and "seed 1" in text.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("requests:\n  shapes: [{gpuShape: RTX6000, numberOfGPUs: 9}]\n")
    failed = runner.invoke(gpr_sim_command, [str(bad)])
    assert failed.exit_code == 2 and "error:" in failed.output and "numberOfGPUs" in failed.output
    missing = runner.invoke(gpr_sim_command, [str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "not found" in missing.output
