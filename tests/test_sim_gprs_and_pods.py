"""GPRs and bursty pods on the same Linode pools in one simulation (benchmarks/scenarios/gprs-and-pods.yaml): the
GPR manager's launches go through the node controller (sim/gpr/mixed.py), run by `gpuscale simulate` and `compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuscale.cli import main
from gpuscale.controller.gprnodes import GprNodes
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import load_scenario, parse_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "benchmarks" / "scenarios" / "gprs-and-pods.yaml"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_simulate_json_reports_gprs_beside_pods() -> None:
    code, out, _ = run("simulate", str(SCENARIO), "--json")
    assert code == 0
    r = json.loads(out)
    assert r["gprSharedEngine"] is True
    assert r["duplicateLaunches"] == 0
    assert r["gprNodesDisrupted"] == 0
    assert r["podsCompleted"] == r["podsArrived"] == 40 + 2  # pods served: the bursts and train-a's workload
    assert r["podsOnGprNodesOutsideGpr"] == 0
    assert r["gprNodesBorrowed"] >= 1  # a tune GPR reuses the node train-a gave back to the pool
    assert len(r["gprs"]) == 5
    for g in r["gprs"]:  # every GPR provisioned, or not with its reason stated
        assert g["waitS"] is not None or g["reason"], g
    assert r["gprsProvisioned"] == 4 and r["gprWaitP50s"] > 0
    big = next(g for g in r["gprs"] if g["requestName"] == "big")
    assert "insufficient capacity" in big["reason"]


def test_compare_json_has_the_gpr_figures_for_each_policy() -> None:
    code, out, _ = run("compare", str(SCENARIO), "--json", "--policies", "gpuscale,karpenter")
    assert code == 0
    rows = {r["policy"]: r for r in json.loads(out)}
    for name in ("gpuscale", "karpenter"):
        assert rows[name]["duplicateLaunches"] == 0
        assert rows[name]["gprNodesDisrupted"] == 0
        assert rows[name]["gprsProvisioned"] == 4


def test_without_the_engines_protection_gpr_nodes_would_be_disrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure can fail: a controller that does not know which claims are GPR nodes consolidates them."""
    monkeypatch.setattr(GprNodes, "keys", lambda self, claims: frozenset())
    r = simulate_policy(load_scenario(SCENARIO), "gpuscale").report
    assert r["gprNodesDisrupted"] > 0


def test_pods_on_a_held_gpr_node_that_are_not_its_workload_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure can fail: when the side forgets which pods are a GPR's workload, they count as outsiders."""
    from gpuscale.sim.gpr.mixed import GprSide

    start = GprSide._start_workload

    def forgetful(self: GprSide, gid: str, spec: object) -> None:
        start(self, gid, spec)  # type: ignore[arg-type]
        self._workload[gid] = ()

    monkeypatch.setattr(GprSide, "_start_workload", forgetful)
    r = simulate_policy(load_scenario(SCENARIO), "gpuscale").report
    assert r["podsOnGprNodesOutsideGpr"] == 2


def test_a_bad_gpr_entry_is_one_line_naming_the_field(tmp_path: Path) -> None:
    text = SCENARIO.read_text().replace("numberOfGPUNodes: 2", "numberOfGPUNodes: 0")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    code, _, err = run("simulate", str(bad))
    assert code == 2
    assert "gprs[0].spec.numberOfGPUNodes" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_scenario_without_gprs_has_no_gpr_figures() -> None:
    text = SCENARIO.read_text()
    sc = parse_scenario(text[: text.index("gprs:")] + "policy:\n  name: gpuscale\n")
    assert sc.gprs == ()
    assert "gprNodesDisrupted" not in simulate_policy(sc, "gpuscale").report
