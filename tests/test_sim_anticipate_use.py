"""``anticipate.learnUse`` in the simulator: with empty nodes deleted at once, an extra node bought for a pod expected
in the next 10 minutes is used only if the pod comes while it boots; on a stream of one pod every 5 minutes about half
go unused. Learning that, the rule buys less room (and pays less) than without it, no node is launched twice and the
consolidation gate's and the scale-up gate's check modes find nothing."""

from __future__ import annotations

from typing import Any

from builders import catalog, itype
from gpuscale.controller.options import OptionsController, options_controller
from gpuscale.sim.runner import SimResult, run_simulation
from gpuscale.sim.scenario import parse_scenario

CAT = catalog(itype("gpu-1", 8, 32, 1, "T4", price=0.6), itype("gpu-4", 32, 128, 4, "T4", price=2.2))

SCENARIO = """
name: anticipate-use
seed: 3
duration: 8h
catalog: x
pools:
  - name: gpu
    disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s, consolidateEmptyAfter: 0s}}
cloud:
  launchLatency: 30s
  registrationLatency: 30s
  devicePluginDelay: 120s
workload:
  - source: steady
    ratePerHour: 12
    duration: 6h
    runtime: 1h
    shapes:
      - {{cpu: 2, memory: 4Gi, gpus: 1}}
policy: {{name: gpuscale, anticipate: {{lead: 10m, waitCostPerGpuHour: 4, maxExtraGpus: 2{extra}}}}}
"""


def run(extra: str = "") -> tuple[SimResult, OptionsController]:
    sc = parse_scenario(SCENARIO.format(extra=extra), source="a.yaml", catalog=CAT)
    built: list[OptionsController] = []

    def factory(**kw: Any) -> Any:
        c = options_controller(**kw)
        assert isinstance(c, OptionsController)
        c.gate.check = True
        c.scaleup.check = True
        built.append(c)
        return c

    return run_simulation(sc, factory), built[-1]


def test_extra_nodes_that_go_unused_shrink_the_room_bought() -> None:
    plain, ctl_plain = run()
    res, ctl = run(", learnUse: true")
    a, a_plain = ctl.anticipation, ctl_plain.anticipation
    assert a is not None and a_plain is not None
    assert a_plain.stats.used == a_plain.stats.unused == 0  # followed only with learnUse
    st = a.stats
    assert st.used > 0 and st.unused > st.used  # most extra nodes ran no pod
    assert a.use_shares()[0] < 0.8
    assert 0 < st.extra_gpus < a_plain.stats.extra_gpus / 2
    assert res.report["costUsd"] < plain.report["costUsd"]
    assert res.report["duplicateLaunches"] == plain.report["duplicateLaunches"] == 0
    assert ctl.gate.mismatches == [] and ctl.scaleup.mismatches == []
