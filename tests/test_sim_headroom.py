"""Predictive warm headroom and eviction-cost awareness in the simulator: warm nodes stay within ``maxNodes`` and
``maxHourlyCost``, serve arriving pods without a cold start, and are consolidated once the forecast drops; held-back
consolidations of long-running pods."""

from __future__ import annotations

from typing import Any

from builders import catalog, itype
from gpuscale.controller.config import ControllerConfig
from gpuscale.controller.options import HEADROOM_REASON, OptionsController
from gpuscale.core.nodeclaim import IN_FLIGHT
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.runner import run_simulation
from gpuscale.sim.scenario import parse_scenario

CAT = catalog(itype("gpu-1", 8, 32, 1, "T4", price=0.6), itype("gpu-4", 32, 128, 4, "T4", price=2.2))

SCENARIO = """
name: headroom
seed: 3
duration: 10h
catalog: x
pools:
  - name: gpu
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 5m}}
    {headroom}
cloud:
  launchLatency: 30s
  registrationLatency: 30s
  devicePluginDelay: 120s
workload:
  - source: steady
    ratePerHour: 12
    duration: 4h
    runtime: 1h
    shapes:
      - {{cpu: 2, memory: 4Gi, gpus: 1}}
policy: {{name: gpuscale}}
"""
HEADROOM = "headroom: {policy: Predictive, maxNodes: 3, maxHourlyCost: 1.3, lead: 10m, quantile: 1.0}"


class Checked(OptionsController):
    """Records, after every round, the warm nodes (kept empty and in flight) and their $/h."""

    seen: list[tuple[float, int, float]]

    def reconcile(self) -> Any:
        out = super().reconcile()
        flight = [c for _, c in self.claims.items() if c.reason == HEADROOM_REASON and c.phase in IN_FLIGHT]
        kept = [c for _, c in self.claims.items() if c.node_name in self.warm]
        price = sum(c.hourly_price for c in flight + kept)
        self.seen.append((self.clock.now(), len(flight) + len(kept), price))
        return out


def test_warm_nodes_are_bounded_serve_arrivals_and_go_when_the_forecast_drops() -> None:
    sc = parse_scenario(SCENARIO.format(headroom=HEADROOM), source="h.yaml", catalog=CAT)
    seen: list[tuple[float, int, float]] = []
    built: list[Checked] = []

    def factory(**kw: Any) -> Checked:
        cfg = ControllerConfig.from_policy(kw["config"])
        c = Checked(kw["backend"], kw["provider"], kw["pools"], kw["catalog"], kw["clock"], cfg)
        c.seen = seen
        built.append(c)
        return c

    res = run_simulation(sc, factory)
    ctl = built[-1]
    assert ctl.headroom_stats.launched > 0
    # at most maxNodes, and at most maxHourlyCost: two $0.60 nodes (a third would cost $1.80/h > $1.30/h)
    assert max(n for _, n, _ in seen) == 2
    assert max(p for _, _, p in seen) <= 1.3 + 1e-9
    # the workload stops at 4 h: an hour of quiet windows later the forecast is 0 and the warm nodes are consolidated
    assert all(n == 0 for t, n, _ in seen if t > 6 * 3600)
    assert res.cloud.hourly_rate == 0.0
    assert ctl.headroom_stats.warm_usd > 0
    # pods arriving while warm nodes wait start without a cold start: less pending time than without headroom
    plain = simulate_policy(parse_scenario(SCENARIO.format(headroom=""), source="h.yaml", catalog=CAT), "gpuscale")
    assert res.report["pendingP50s"] < plain.report["pendingP50s"]
    assert res.report["costUsd"] > plain.report["costUsd"]  # and it is paid for
    # launch: false only keeps empty nodes warm
    keep_only = HEADROOM.replace("quantile: 1.0", "quantile: 1.0, launch: false")
    kept = simulate_policy(
        parse_scenario(SCENARIO.format(headroom=keep_only), source="h.yaml", catalog=CAT), "gpuscale"
    )
    assert not [e for e in kept.cluster.events if e.reason == HEADROOM_REASON]
    assert kept.report["pendingP50s"] <= plain.report["pendingP50s"]


LONG = """
name: long-pods
seed: 1
duration: 12h
catalog: x
pools:
  - name: gpu
    instanceTypes: [gpu-4]
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 1m}}
cloud:
  launchLatency: 30s
  registrationLatency: 30s
  devicePluginDelay: 60s
workload:
  - source: burst
    prefix: long
    count: 1
    at: 0s
    runtime: 11h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
  - source: burst
    prefix: short
    count: 3
    at: 1s
    runtime: 4h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
  - source: burst
    prefix: late
    count: 4
    at: 30m
    runtime: 10h
    shape: {{cpu: 2, memory: 4Gi, gpus: 1}}
policy: {{name: gpuscale{extra}}}
"""


def test_eviction_cost_keeps_nodes_whose_pods_did_hours_of_work() -> None:
    plain = simulate_policy(parse_scenario(LONG.format(extra=""), source="l.yaml", catalog=CAT), "gpuscale")
    aware = simulate_policy(
        parse_scenario(LONG.format(extra=", evictionCost: {horizon: 1h}"), source="l.yaml", catalog=CAT), "gpuscale"
    )
    assert plain.report["disruptions"] > 0  # the default packs the long pod's node away after 4 h
    assert aware.report["disruptions"] < plain.report["disruptions"]
    kept = [e for e in aware.cluster.events if e.reason == "WorkLostExceedsSaving"]
    assert kept and "of work, more than" in kept[0].message
