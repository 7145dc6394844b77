"""docs/controller.md and docs/simulator.md cannot drift from the code.

Every table between ``<!-- NAME:begin ... -->`` and ``<!-- NAME:end -->`` markers is compared with what the code
defines (the node-claim transition table, ``EventKind``, the keys ``ControllerConfig.from_policy`` accepts and their
defaults, the scenario parser's keys, the report dict of a real simulation), never with a list kept in this file.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpuscale.controller.config as controller_config
from builders import OD, catalog, itype
from gpuscale.controller.loop import ControllerConfig, EventKind
from gpuscale.core.disruption import DisruptionReason, KeepReason
from gpuscale.core.model import ConsolidationPolicy, NodePool
from gpuscale.core.nodeclaim import (
    TRANSITIONS,
    ClaimEvent,
    ClaimPhase,
    NodeClaim,
    deadline,
    new_claim,
    timeout_event,
)
from gpuscale.errors import InputError
from gpuscale.manifests.quantity import parse_duration
from gpuscale.sim import scenario as sc
from gpuscale.sim import scenario_fields as sf
from gpuscale.sim.commands import COMPARE_KEYS
from gpuscale.sim.engine import Dist
from gpuscale.sim.policies import POLICIES, factory_for
from gpuscale.sim.runner import run_simulation
from gpuscale.sim.scenario import Scenario, WorkloadSpec
from gpuscale.sim.workloads import PodShape, burst

DOCS = Path(__file__).resolve().parents[1] / "docs"
CONTROLLER = DOCS / "controller.md"
SIMULATOR = DOCS / "simulator.md"
TICKED = re.compile(r"`([^`]+)`")


def _rows(path: Path, name: str) -> list[list[str]]:
    """The body rows of the table between the ``name`` markers of ``path``, as lists of stripped cells."""
    text = path.read_text(encoding="utf-8")
    begin, end = f"<!-- {name}:begin", f"<!-- {name}:end -->"
    assert begin in text and end in text, f"{path.name} lost its {name} markers"
    body = text.split(begin, 1)[1].split("-->", 1)[1].split(end, 1)[0].strip().splitlines()
    assert len(body) >= 2 and set(body[1]) <= set("|-"), f"{path.name} {name}: not a table"
    rows = []
    for line in body[2:]:
        assert line.startswith("|") and line.endswith("|"), f"{path.name} {name}: bad row {line!r}"
        rows.append([c.strip() for c in line[1:-1].split("|")])
    return rows


def _first_cell_keys(path: Path, name: str) -> list[str]:
    """Backticked names in the first cell of every row (a row may document several keys)."""
    keys = [k for row in _rows(path, name) for k in TICKED.findall(row[0])]
    assert keys, f"{path.name} {name}: no documented keys"
    return keys


def _exactly(path: Path, name: str, expected: set[str]) -> None:
    keys = _first_cell_keys(path, name)
    assert len(keys) == len(set(keys)), f"{path.name} {name}: documented twice: {sorted(keys)}"
    assert set(keys) - expected == set(), f"{path.name} {name}: documented but not in the code"
    assert expected - set(keys) == set(), f"{path.name} {name}: in the code but not documented"


# ----------------------------------------------------------------------------------------------- controller.md
ROW = re.compile(r"^(\w+)$")


def test_transition_table_lists_exactly_the_code_transitions() -> None:
    rows = _rows(CONTROLLER, "transitions")
    documented: list[tuple[str, str, str]] = []
    for src, ev, dst, trigger in rows:
        assert ROW.match(src) and ROW.match(dst) and re.fullmatch(r"`\w+`", ev), (src, ev, dst)
        assert trigger, f"transition {src} {ev} has no trigger"
        documented.append((src, ev.strip("`"), dst))
    in_code = {(s.value, e.value, d.value) for (s, e), d in TRANSITIONS.items()}
    assert len(documented) == len(set(documented)), "a transition is documented twice"
    assert set(documented) - in_code == set(), "documented transitions the code does not have"
    assert in_code - set(documented) == set(), "transitions of the code missing from docs/controller.md"


def test_every_phase_event_and_reason_is_named() -> None:
    text = CONTROLLER.read_text(encoding="utf-8")
    for phase in ClaimPhase:
        assert re.search(rf"^\| {phase.value} \|", text, flags=re.MULTILINE), f"phase {phase} not described"
    names = [*ClaimEvent, *KeepReason, *DisruptionReason, *ConsolidationPolicy]
    for value in names:
        assert f"`{value.value}`" in text, value


def _claim(phase: ClaimPhase, **kw: Any) -> NodeClaim:
    return replace(new_claim("r", "pool", "type", "zone", OD, 0.0), phase=phase, **kw)


def test_deadlines_and_their_defaults_are_the_real_ones() -> None:
    rows = _rows(CONTROLLER, "deadlines")
    assert {r[0] for r in rows} == {p.value for p in ClaimPhase if deadline(_claim(p)) is not None}
    for phase, key, default, _, on_expiry in rows:
        claim = _claim(ClaimPhase(phase))
        assert deadline(claim) == parse_duration(default), f"default of the {phase} deadline"
        event = timeout_event(claim)
        assert event is not None and on_expiry == f"`{event.value}` → {TRANSITIONS[(claim.phase, event)].value}"
        # the documented key is the one that sets this phase's deadline
        cfg = ControllerConfig.from_policy({"deadlines": {key.strip("`"): "7s"}})
        assert deadline(_claim(claim.phase, deadlines=cfg.deadlines)) == 7.0, f"{key} does not set the {phase} deadline"


def test_every_event_kind_is_documented() -> None:
    _exactly(CONTROLLER, "events", {k.value for k in EventKind})
    for row in _rows(CONTROLLER, "events"):
        assert len(row) == 2 and row[1], f"event {row[0]} has no description"


def _policy_keys() -> tuple[set[str], set[str]]:
    """(keys ``ControllerConfig.from_policy`` accepts, those of them it ignores), found by asking it."""
    tree = ast.parse(inspect.getsource(controller_config))
    words = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"[a-z][A-Za-z]*", n.value)
    }
    accepted: set[str] = set()
    ignored: set[str] = set()
    for word in words:
        try:
            cfg = ControllerConfig.from_policy({word: object()})
        except InputError as exc:
            if "unknown policy setting" in str(exc):
                continue
        except Exception:  # a type error from the value: the key itself was accepted
            pass
        else:
            if cfg == ControllerConfig():
                ignored.add(word)
        accepted.add(word)
    # the keys the error message suggests are accepted keys too (guards the discovery above)
    with pytest.raises(InputError) as raised:
        ControllerConfig.from_policy({"noSuchSettingAnywhere": 1})
    suggested = set(re.findall(r"[A-Za-z]+", str(raised.value).split("use one of", 1)[1]))
    assert suggested and suggested <= accepted, suggested - accepted
    return accepted, ignored


def test_every_policy_setting_and_its_default_is_documented() -> None:
    accepted, ignored = _policy_keys()
    _exactly(CONTROLLER, "policy", accepted)
    for key, default, meaning in _rows(CONTROLLER, "policy"):
        name = key.strip("`")
        assert meaning, name
        if name in ignored:
            assert "ignored" in meaning, f"{name} is ignored by the controller; say so"
            continue
        assert re.fullmatch(r"`[^`]+`", default), f"{name}: the default must be a backticked YAML value"
        value = yaml.safe_load(default.strip("`"))
        assert ControllerConfig.from_policy({name: value}) == ControllerConfig(), f"documented default of {name}"


# ------------------------------------------------------------------------------------------------ simulator.md
def test_every_scenario_key_is_documented() -> None:
    _exactly(SIMULATOR, "scenario-keys", set(sc.TOP_FIELDS))
    _exactly(SIMULATOR, "cloud-keys", set(sc.CLOUD_FIELDS))
    _exactly(SIMULATOR, "capacity-keys", set(sc.CAPACITY_FIELDS))
    _exactly(SIMULATOR, "fault-keys", set(sc.FAULT_FIELDS))
    _exactly(SIMULATOR, "cluster-keys", set(sc.CLUSTER_FIELDS))
    _exactly(SIMULATOR, "shape-keys", set(sc.SHAPE_FIELDS))
    _exactly(SIMULATOR, "distributions", set(sf.DIST_KINDS))
    text = SIMULATOR.read_text(encoding="utf-8")
    for key in (*sc.TYPE_LATENCY_FIELDS, *sc.UTIL_FIELDS, *sc.PDB_FIELDS):
        assert f"`{key}`" in text or f"{key}:" in text, key
    for kind, params in sf.DIST_KINDS.items():
        row = next(r for r in _rows(SIMULATOR, "distributions") if r[0] == f"`{kind}`")
        assert set(TICKED.findall(row[1])) == set(params), kind


def test_every_workload_source_and_its_keys_are_documented() -> None:
    _exactly(SIMULATOR, "sources", set(sc.SOURCE_FIELDS))
    for row in _rows(SIMULATOR, "sources"):
        source = row[0].strip("`")
        documented = set(TICKED.findall(row[1]))
        missing = set(sc.SOURCE_FIELDS[source]) - documented
        assert missing == set(), f"keys of workload source {source} not documented: {sorted(missing)}"


def test_simulator_policy_keys_are_the_ones_the_controller_ignores() -> None:
    _, ignored = _policy_keys()
    _exactly(SIMULATOR, "simulator-policy", ignored)


def test_every_compare_policy_and_column_is_documented() -> None:
    _exactly(SIMULATOR, "policies", set(POLICIES))
    text = SIMULATOR.read_text(encoding="utf-8")
    for key in COMPARE_KEYS:
        assert f"`{key}`" in text, key


def _tiny_report() -> dict[str, Any]:
    cat = catalog(itype("gpu-1", 8, 32, 1, "T4", price=1.0))
    arrivals = burst(2, at=10.0, shape=PodShape(cpu_milli=1000, memory_mib=2048, gpus=1), runtime=Dist.const(600))
    scenario = Scenario(
        "tiny",
        seed=1,
        catalog=cat,
        pools=(NodePool("gpu"),),
        workload=(WorkloadSpec("burst", lambda seed: arrivals),),
        policy={"name": "gpuscale"},
        duration_s=3600.0,
    )
    result = run_simulation(scenario, factory_for("gpuscale", arrivals), policy_name="gpuscale")
    assert result.report["podsCompleted"] == 2
    return result.report


def test_every_report_key_is_documented() -> None:
    report = _tiny_report()
    _exactly(SIMULATOR, "report", set(report))
    _exactly(SIMULATOR, "report-cloud", set(report["cloud"]))
    _exactly(SIMULATOR, "report-cluster", set(report["cluster"]))
