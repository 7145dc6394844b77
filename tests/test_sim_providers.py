"""Provider profiles in the simulator (sim/profiles.py), ``compare --providers`` and the GKE and ACK scenarios."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuscale.catalogs import load_catalog
from gpuscale.cli import main
from gpuscale.core.model import CapacityType
from gpuscale.errors import InputError, RateLimited
from gpuscale.providers.base import LaunchRequest
from gpuscale.sim.cloud import ApiRateLimit, CloudBehaviour, SimCloud, contract_catalog
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.compare_providers import PROVIDER_KEYS, format_providers, parse_providers
from gpuscale.sim.engine import Dist, Engine
from gpuscale.sim.profiles import PROFILES
from gpuscale.sim.scenario import load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "benchmarks" / "scenarios"

SMALL = """\
name: small
seed: 2
duration: 2h
catalog: linode
pools:
  - name: gpu
    instanceTypes: [g1-gpu-rtx6000-1]
    disruption: {consolidationPolicy: WhenEmpty, consolidateAfter: 5m}
cloud:
  launchLatency: 10s
workload:
  source: burst
  count: 6
  spread: 30s
  shape: {cpu: 4, memory: 16Gi, gpus: 1}
  runtime: 30m
"""


def test_every_profile_names_its_catalog_and_a_source_for_every_value() -> None:
    assert set(PROFILES) == {"lke", "eks", "gke", "ack"}
    for p in PROFILES.values():
        catalog = load_catalog(p.catalog)
        assert {it.provider for it in catalog.instance_types} == {p.provider}
        assert p.sources and all(("documented" in why or "assumption" in why) for _, why in p.sources), p.name
        assert p.behaviour.api_rate is not None


def test_profiles_differ_where_the_providers_do() -> None:
    lke, eks, gke, ack = (PROFILES[n].behaviour for n in ("lke", "eks", "gke", "ack"))
    assert (eks.spot_notice_s, gke.spot_notice_s, ack.spot_notice_s) == (120.0, 30.0, 300.0)
    assert ack.spot_protection_s == 3600.0 and gke.spot_protection_s == 0.0
    assert eks.deletion_latency == Dist.const(0.0)  # EC2 stops billing at shutting-down
    assert lke.spot_interruptions_per_hour == 0.0  # no spot on Linode


def test_cloud_provider_selects_profile_and_catalog_and_keys_override_it() -> None:
    text = SMALL.replace("catalog: linode\n", "").replace("g1-gpu-rtx6000-1", "g2-standard-8")
    scen = parse_scenario(text.replace("  launchLatency: 10s", "  provider: gke\n  launchLatency: 10s"))
    gke = PROFILES["gke"].behaviour
    assert scen.provider == "gke" and scen.catalog.name == "gcp:us-central1"
    assert scen.cloud.launch_latency == Dist.const(10.0)
    assert scen.cloud.device_plugin_delay == gke.device_plugin_delay
    assert scen.cloud.spot_notice_s == 30.0 and scen.cloud.api_rate == gke.api_rate
    rate = parse_scenario(
        text.replace("  launchLatency: 10s", "  provider: gke\n  apiRateLimit: {burst: 5, perSecond: 1}")
    )
    assert rate.cloud.api_rate == ApiRateLimit(5.0, 1.0)


def test_without_a_provider_the_cloud_defaults_are_unchanged() -> None:
    scen = parse_scenario(SMALL)
    assert scen.cloud == CloudBehaviour(launch_latency=Dist.const(10.0))
    assert scen.provider is None


@pytest.mark.parametrize(
    ("cloud", "where"),
    [("provider: aks", "cloud.provider"), ("provider: 3", "cloud.provider"), ("apiRateLimit: {burst: 5}", "apiRate")],
)
def test_bad_provider_settings_are_one_line_errors(cloud: str, where: str) -> None:
    with pytest.raises(InputError) as err:
        parse_scenario(SMALL.replace("launchLatency: 10s", cloud), source="s.yaml")
    assert where in str(err.value) and "\n" not in str(err.value)


def test_running_a_scenario_on_another_provider_drops_its_cloud_and_type_names() -> None:
    own = load_scenario(SCENARIOS / "eks-burst.yaml")
    same = load_scenario(SCENARIOS / "eks-burst.yaml", provider=PROFILES["eks"])
    assert same.cloud == own.cloud and same.catalog.name == own.catalog.name == "aws:us-east-1"
    assert same.pools == own.pools
    other = load_scenario(SCENARIOS / "eks-burst.yaml", provider=PROFILES["gke"])
    assert other.catalog.name == "gcp:us-central1" and other.provider == "gke"
    assert other.cloud == PROFILES["gke"].behaviour  # the EKS capacity rule and latencies are gone
    assert other.pools[0].instance_types == () and other.pools[0].disruption == own.pools[0].disruption
    assert other.arrivals() == own.arrivals()


def _cloud(rate: ApiRateLimit | None, **kw: float) -> SimCloud:
    return SimCloud(Engine(), contract_catalog(), CloudBehaviour(api_rate=rate, **kw))  # type: ignore[arg-type]


def _req(rid: str, count: int = 1, ct: CapacityType = CapacityType.ON_DEMAND) -> LaunchRequest:
    return LaunchRequest(rid, "p", "sim-gpu-1", "sim-z1", ct, count=count)


def test_api_rate_limit_is_a_token_bucket_on_nodes_launched() -> None:
    cloud = _cloud(ApiRateLimit(burst=3.0, per_second=0.5))
    cloud.launch(_req("a", 2))
    with pytest.raises(RateLimited) as err:
        cloud.launch(_req("b", 2))
    assert err.value.retry_after == pytest.approx(2.0)  # one token short, half a token per second
    assert cloud.launch(_req("a", 2))  # a replay is free
    cloud.engine.run_until(2.0)
    assert len(cloud.launch(_req("b", 2))) == 2
    assert cloud.counters.rate_limited == 1 and cloud.counters.nodes_launched == 4


def test_spot_protection_delays_every_interruption_notice() -> None:
    cloud = _cloud(None, spot_interruptions_per_hour=50.0, spot_protection_s=3600.0)
    for i in range(5):
        cloud.launch(_req(f"s{i}", ct=CapacityType.SPOT))
    cloud.engine.run_until(3600.0)
    assert cloud.counters.spot_notices == 0
    cloud.engine.run_until(3 * 3600.0)
    assert cloud.counters.spot_notices == 5


@pytest.mark.parametrize("name", ["gke-spot", "ack-spot"])
def test_provider_scenario_falls_back_across_zones_and_to_on_demand(name: str) -> None:
    scen = load_scenario(SCENARIOS / f"{name}.yaml")
    res = simulate_policy(scen, "gpuscale")
    rep = res.report
    assert rep["duplicateLaunches"] == 0 and rep["redundantLaunches"] == 0
    assert rep["podsCompleted"] == rep["podsArrived"] == 40
    assert rep["cloud"]["insufficient_capacity"] >= 2
    launched = Counter((n.zone, n.capacity_type) for n in res.cloud.launched())
    spot_zones = {z for (z, ct) in launched if ct is CapacityType.SPOT}
    assert len(spot_zones) >= 2  # spot moved to another zone
    assert sum(n for (_, ct), n in launched.items() if ct is CapacityType.SPOT) == 16  # all the spot there was
    assert any(ct is CapacityType.ON_DEMAND for (_, ct) in launched)  # then on-demand


def test_compare_providers_prints_one_row_per_provider_within_80_columns(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    res = CliRunner().invoke(main, ["compare", "--providers", "lke,eks,gke,ack", str(path)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(i for i, line in enumerate(lines) if line.startswith("provider"))
    assert [line.split()[0] for line in lines[header + 1 : header + 5]] == ["lke", "eks", "gke", "ack"]
    assert "gke: catalog gcp:us-central1" in lines

    res = CliRunner().invoke(main, ["compare", "--providers", "lke,gke", str(path), "--json", "--seed", "4"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["provider"] for r in rows] == ["lke", "gke"] and all(list(r) == list(PROVIDER_KEYS) for r in rows)
    assert rows[0]["catalog"] == "linode:us-ord" and rows[1]["catalog"] == "gcp:us-central1"
    assert all(r["duplicateLaunches"] == 0 and r["podsCompleted"] == 6 for r in rows)

    res = CliRunner().invoke(main, ["compare", "--providers", "eks", str(path), "--csv", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    parsed = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["provider"] for r in parsed] == ["eks"] and float(parsed[0]["costUsd"]) > 0
    assert json.loads((tmp_path / "compare.json").read_text())[0]["provider"] == "eks"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--providers", "lke,azure"], "--providers: unknown provider profile"),
        (["--providers", "lke,lke"], "named twice"),
        (["--providers", "lke", "--policies", "karpenter"], "--policies and --providers both given"),
        (["--providers", "lke", "--json", "--csv"], "--json and --csv both given"),
    ],
)
def test_compare_providers_refuses_bad_flags_with_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    res = CliRunner().invoke(main, ["compare", *args, str(path)])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_narrow_terminal_gets_one_block_per_provider() -> None:
    row = dict.fromkeys(PROVIDER_KEYS, 0) | {"provider": "gke", "catalog": "gcp:us-central1", "costUsd": 1.5}
    text = format_providers([row], "t", width=40)
    assert max(len(line) for line in text.splitlines()[3:]) <= 40 and "  cost $" in text
    assert [p.name for p in parse_providers(" gke , ack ")] == ["gke", "ack"]


def test_gpr_scenarios_take_a_provider_profile_too() -> None:
    from gpuscale.sim.gpr.scenario import load_gpr_scenario, parse_gpr_scenario

    example = ROOT / "src" / "gpuscale" / "examples" / "gpr-scenario.yaml"
    text = example.read_text().replace("\ncloud:\n", "\ncloud:\n  provider: lke\n  iceProbability: 0.1\n", 1)
    scen = parse_gpr_scenario(text, source="gpr.yaml", base_dir=example.parent)
    plain = load_gpr_scenario(example)
    assert scen.cloud.api_rate == PROFILES["lke"].behaviour.api_rate and plain.cloud.api_rate is None
    assert scen.cloud.ice_probability == 0.1 and scen.cloud.launch_latency == plain.cloud.launch_latency
