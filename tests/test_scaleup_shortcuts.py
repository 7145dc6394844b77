"""Whole simulated runs are identical with the scale-up's shortcuts on and off: the planner's (single candidates not
scored, memoised choices, pool totals only where read, the integer program's bound and small-program answers), the
shell's (a round like the last ``EMPTY``, ``IDLE`` or in-flight ``COVERED`` one returns at once, and so does one
whose batch window is open) and the snapshot's (the Nodes shown to the planner kept while their Node and claim are
the same objects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuscale.controller import scaleup
from gpuscale.controller.shell import LEAVING
from gpuscale.core.nodeclaim import IN_FLIGHT
from gpuscale.core.reconcile.scaleup import Gate, gate_scale_up
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import load_scenario
from test_planner_fastpaths import _slow

ROOT = Path(__file__).resolve().parent.parent

TOO_LARGE = """  - source: burst
    count: 2
    at: 3h
    shape: {cpu: 4, memory: 16Gi, gpus: 64}
    runtime: 1h
policy:
"""
"""Two pods no offering holds: pending for the rest of the day, so most rounds see only them (gate ``EMPTY``)."""


def _run(path: Path) -> tuple[Any, ...]:
    res = simulate_policy(load_scenario(path), "gpuscale")
    events = [(e.at, e.kind, e.object, e.reason, e.message) for e in res.cluster.events]
    report = {k: v for k, v in res.report.items() if k != "wallSeconds"}
    return events, [repr(n) for n in res.cloud.launched()], res.reconcile_times, report


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    text = (ROOT / "examples" / "demo.yaml").read_text()
    assert text.count("policy:\n") == 1
    path = tmp_path / "demo-too-large.yaml"
    path.write_text(text.replace("policy:\n", TOO_LARGE))
    return path


def _count_gates(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The gate verdicts of the scale-up rounds from now on (one per round that asked the gate)."""
    gates: list[object] = []
    real_gate = gate_scale_up

    def counting(*args: Any, **kwargs: Any) -> Any:
        verdict = real_gate(*args, **kwargs)
        gates.append(verdict.gate)
        return verdict

    monkeypatch.setattr(scaleup, "gate_scale_up", counting)
    return gates


def test_runs_with_and_without_the_scale_up_shortcuts_are_identical(
    scenario: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gates = _count_gates(monkeypatch)
    fast = _run(scenario)
    rounds, asked = len(fast[2]), len(gates)
    assert Gate.EMPTY in gates and asked < rounds - 100  # the EMPTY shortcut was taken, many times
    with pytest.MonkeyPatch.context() as mp:
        _slow(mp)
        mp.setattr(scaleup.ScaleUpSteps, "shortcuts", False)
        gates.clear()
        slow = _run(scenario)
        assert len(gates) == rounds  # every round asked the gate
    assert slow == fast


def test_ack_spot_run_is_identical_without_the_planner_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / "benchmarks" / "scenarios" / "ack-spot.yaml"
    fast = _run(path)
    _slow(monkeypatch)
    assert _run(path) == fast


def _fresh_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every snapshot builds every Node it shows anew (nothing kept from the last one)."""
    snapshot = scaleup.ScaleUpSteps._snapshot

    def fresh(self: Any, *args: Any) -> Any:
        self._shown = self._shown_off = None
        return snapshot(self, *args)

    monkeypatch.setattr(scaleup.ScaleUpSteps, "_snapshot", fresh)


def test_demo_run_is_identical_without_the_round_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo (pods arriving in waves, nodes launched, drained and deleted, spot interruptions) takes the idle,
    covered and open-batch shortcuts many times and decides exactly as without them and the kept Nodes."""
    gates = _count_gates(monkeypatch)
    kept = scaleup.ScaleUpSteps._in_flight
    reused: list[bool] = []

    def checked(self: Any) -> tuple[set[str], set[str]]:  # the kept answers equal ones computed afresh
        before = self._in_flight_kept
        got = kept(self)
        pods = {k for _, c in self.claims.in_phases(IN_FLIGHT) for k in c.pods}
        names = {c.node_name for _, c in self.claims.in_phases(IN_FLIGHT) if c.node_name}
        assert got == (pods, names)
        reused.append(before is not None and got is before[1])
        return got

    monkeypatch.setattr(scaleup.ScaleUpSteps, "_in_flight", checked)
    leaving = scaleup.ScaleUpSteps._leaving

    def checked_leaving(self: Any) -> frozenset[str]:
        got = leaving(self)
        assert got == {c.node_name for _, c in self.claims.in_phases(LEAVING) if c.node_name}
        return got

    monkeypatch.setattr(scaleup.ScaleUpSteps, "_leaving", checked_leaving)
    signature = scaleup.ScaleUpSteps._signature

    def checked_signature(self: Any, real: Any, virtual: Any, w: Any) -> object:  # the kept claim phases are right
        got = signature(self, real, virtual, w)
        assert got[2] == frozenset((k, c.phase) for k, c in self.claims.items())  # type: ignore[index]
        return got

    monkeypatch.setattr(scaleup.ScaleUpSteps, "_signature", checked_signature)
    path = ROOT / "examples" / "demo.yaml"
    fast = _run(path)
    fast_gates = list(gates)
    assert reused.count(True) > 10 and reused.count(False) > 10
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scaleup.ScaleUpSteps, "shortcuts", False)
        _fresh_snapshots(mp)
        gates.clear()
        slow = _run(path)
        assert len(gates) == len(slow[2])  # every round asked the gate
    assert slow == fast
    skipped = {g: gates.count(g) - fast_gates.count(g) for g in (Gate.IDLE, Gate.COVERED, Gate.WAIT)}
    assert all(n > 10 for n in skipped.values()), skipped  # each shortcut was taken, many times
