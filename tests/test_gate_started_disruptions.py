"""A budget rest ends when a disruption that the resting pass itself started has ended, even when it ended between
two rounds (no round saw the disruptions change): the consolidation gate's check mode finds no difference from the
uncached reference, and the nodes a budget held back go one after the other without waiting out the retry time."""

from __future__ import annotations

from typing import Any

from gpuscale.controller.consolidation import ConsolidationGate
from gpuscale.controller.loop import Controller, EventKind
from gpuscale.sim.cloud import SimCloud
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.engine import Engine
from test_consolidation_gate import CATALOG, CONFIG, FAST, _pod, _pool


def test_a_budget_rest_ends_when_the_disruption_its_pass_started_is_gone() -> None:
    pool = _pool("1", 60.0)  # one disruption at a time
    engine = Engine()
    cluster = SimCluster(engine, CATALOG, [pool], seed=1)
    cloud = SimCloud(engine, CATALOG, FAST, seed=1, listener=cluster)
    ctrl = Controller(cluster, cloud, [pool], CATALOG, engine.clock, CONFIG, check_gate=True)
    for i in range(3):  # pods ending at the same instant, on two nodes (a g1 and a g2)
        cluster.add_pod(_pod(f"p{i}", 1, 6000, {}), 300.0)
    t = 0.0
    while t < 600.0:  # a round every 10 s: an empty node's deletion (5 s) ends between two rounds
        t += 10.0
        engine.run_until(t)
        ctrl.reconcile()
    assert ctrl.gate.mismatches == []
    deletes = sorted(e.at for e in cluster.events if e.kind == str(EventKind.CONSOLIDATE))
    assert len(deletes) == 2 and cloud.alive() == []
    assert deletes[-1] - deletes[0] < 60.0  # not held until the retry time (5 minutes)
    assert CONFIG.consolidation_retry_s >= 300.0


def test_started_lifts_only_budget_rests_once_a_started_disruption_ended() -> None:
    gate = ConsolidationGate({"gpu": _pool("1", 60.0)}, CONFIG)
    args: tuple[Any, ...] = ({}, {}, [], False, {}, frozenset(), 1.0, lambda _: None)
    gate.select({"budget", "other"}, set(), *args)
    gate.rest("budget", frozenset(), 0.0, timed=True)
    gate.rest("other", frozenset(), 0.0)
    gate.select({"budget", "other"}, set(), *args)  # nothing changed: both rest
    assert set(gate.futile) == {"budget", "other"}
    gate.started({"gone"})  # the pass that rested them started disrupting "gone", which ended before this round
    gate.select({"budget", "other"}, set(), *args)
    assert set(gate.futile) == {"other"} and gate.timed == {}
