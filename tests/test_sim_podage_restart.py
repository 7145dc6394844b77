"""``repack`` and ``spotToSpot`` with ``maxPodAge`` after a controller restart: a pod already bound when the new
controller first observes the cluster may have run for any time, so its age is unknown and it is not young (as
``rightsize``'s in ``test_sim_rightsize``); counting its age from the restart moved pods older than the limit."""

from __future__ import annotations

from typing import Any

from builders import crashing_options_factory
from gpuscale.sim.runner import SimResult, run_simulation
from gpuscale.sim.scenario import parse_scenario
from test_repack import SIM, SIM_CAT, SPOT_CAT, SPOT_SIM


def _run(text: str, catalog: Any, crash_at: float | None) -> SimResult:
    """``text`` simulated, the first controller crashing at its first reconcile from ``crash_at`` on."""
    factory, built = crashing_options_factory(crash_at)
    res = run_simulation(parse_scenario(text, source="r.yaml", catalog=catalog), factory)
    assert len(built) == (1 if crash_at is None else 2) and res.report["duplicateLaunches"] == 0
    return res


def _repacked(crash_at: float | None) -> tuple[float, float]:
    """(when the small pod's node was consolidated, when the 4-GPU node's GPUs were ready)."""
    res = _run(SIM.format(extra=", repack: {maxPodAge: 10m}"), SIM_CAT, crash_at)
    events = res.cluster.events
    gone = [e.at for e in events if e.kind == "Consolidate" and e.reason == "Underutilized"]
    (ready,) = [e.at for e in events if e.kind == "GpusReady" and e.object == "node/gpu-00002"]
    return gone[0] if gone else float("inf"), ready


def test_repack_after_a_restart_does_not_take_an_old_pod_for_a_young_one() -> None:
    # the small pod has run 20 minutes when the 4-GPU node is launched: older than maxPodAge 10m, it waits for the
    # node to be up. Restarted at 15 min, the controller has no age for it and lets it wait too (counting its age
    # from the restart made it young: its node went while the new one was in flight)
    gone, ready = _repacked(None)
    assert gone >= ready
    gone, ready = _repacked(15 * 60.0)
    assert gone >= ready


HOLD = """  - source: burst
    prefix: keep
    count: 1
    at: 20m
    runtime: 30m
    shape: {{cpu: 2, memory: 2Gi, annotations: {{gpuscale.io/do-not-disrupt: "true"}}}}
  - source: burst
    prefix: poke
    count: 1
    at: 60m
    runtime: 1m
    shape: {{cpu: 1, memory: 1Gi}}
"""


def _swaps(crash_at: float | None) -> list[Any]:
    text = SPOT_SIM.replace("policy:", HOLD + "policy:").format(extra=", spotToSpot: {maxPodAge: 10m}")
    res = _run(text, SPOT_CAT, crash_at)
    return [e for e in res.cluster.events if e.kind == "Consolidate" and "spot to spot" in e.message]


def test_spot_to_spot_after_a_restart_does_not_take_an_old_pod_for_a_young_one() -> None:
    # the small pod lands on the big spot node at 20 min with a do-not-disrupt pod that holds the node until 50 min,
    # when the small pod is past maxPodAge 10m: never swapped. Restarted at 60 min (a pod arriving wakes it), the
    # controller has no age for it and leaves it (counting its age from the restart swapped it)
    assert _swaps(None) == []
    assert _swaps(3600.0) == []
