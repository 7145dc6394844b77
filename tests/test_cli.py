"""The command line's contract: exit codes, one-line errors, lazy commands and extras, explain, plan DIR, compare."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import gpuscale.cli as cli
from gpuscale.cli import Lazy, LazyGroup, RootGroup, main
from gpuscale.resources import example

SNAPSHOT = example("snapshot.yaml")
COMMANDS = {
    "bench",
    "catalog",
    "compare",
    "demo",
    "examples",
    "explain",
    "gpr",
    "plan",
    "serve",
    "simulate",
    "simulate-gpr",
}
SMALL_SCENARIO = """\
name: small-burst
seed: 5
duration: 2h
catalog: linode
pools:
  - name: gpu
workload:
  - source: burst
    count: 4
    at: 5m
    shape: {cpu: 4, memory: 16Gi, gpus: 1}
    runtime: 30m
policy:
  name: gpuscale
"""


def invoke(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner(env=env).invoke(main, list(args))


def _boom(*_: object, **__: object) -> None:
    raise RuntimeError("planner exploded while holding sekrit-token-1234 and more\nsecond line")


# --- exit codes ------------------------------------------------------------------------------------------------------


def test_bad_input_exits_2_with_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\nmetadata: {name: x}\nspec: {containers: 7}\n")
    res = invoke("plan", str(bad))
    assert res.exit_code == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad.yaml" in errors[0]
    assert "Traceback" not in res.output


def test_usage_error_exits_2() -> None:
    res = invoke("plan")
    assert res.exit_code == 2 and "Missing argument" in res.stderr


def test_internal_error_is_one_line_exit_1_and_scrubs_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "run_plan", _boom)
    res = invoke("plan", str(SNAPSHOT), env={"LINODE_TOKEN": "sekrit-token-1234", "GPUSCALE_DEBUG": ""})
    assert res.exit_code == 1
    assert isinstance(res.exception, SystemExit)  # handled: no exception escapes the command
    lines = [line for line in res.stderr.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("internal error: RuntimeError: planner exploded")
    assert "--debug" in lines[0] and "issue" in lines[0]
    assert "sekrit-token-1234" not in res.output and "second line" not in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_exception(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setattr(cli, "run_plan", _boom)
    args = ["--debug", "plan", str(SNAPSHOT)] if how == "flag" else ["plan", str(SNAPSHOT)]
    res = CliRunner(env={"GPUSCALE_DEBUG": "1" if how == "env" else ""}).invoke(main, args)
    assert isinstance(res.exception, RuntimeError) and "internal error" not in res.stderr


def test_keyboard_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_plan", interrupt)
    res = invoke("plan", str(SNAPSHOT))
    assert res.exit_code == 130 and res.stderr.splitlines()[-1] == "interrupted"


def test_provider_error_is_an_error_not_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuscale.errors import AuthenticationError

    def auth(*_: object, **__: object) -> None:
        raise AuthenticationError("LINODE_TOKEN environment variable is not set", provider="linode")

    monkeypatch.setattr(cli, "run_plan", auth)
    res = invoke("plan", str(SNAPSHOT))
    assert res.exit_code == 1 and res.stderr.splitlines()[-1] == "error: LINODE_TOKEN environment variable is not set"


@pytest.mark.parametrize("kind", ["input", "provider", "internal"])
def test_huge_error_messages_are_clipped(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from gpuscale.errors import InputError, ProviderError

    def huge(*_: object, **__: object) -> None:
        text = "x" * 2_000_000
        raise InputError(text) if kind == "input" else ProviderError(text) if kind == "provider" else ValueError(text)

    monkeypatch.setattr(cli, "run_plan", huge)
    res = invoke("plan", str(SNAPSHOT))
    assert res.exit_code == (2 if kind == "input" else 1)
    last = res.stderr.splitlines()[-1]
    assert len(last) < 6000 and ("2,000,000" in last or "more characters" in last)


def test_broken_pipe_is_quiet() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuscale.cli", "catalog", "show", "alibaba:cn-wulanchabu", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == "", err


# --- lazy commands and extras ----------------------------------------------------------------------------------------


def test_help_lists_every_command() -> None:
    res = invoke("--help")
    assert res.exit_code == 0
    rows = res.stdout.split("Commands:")[1].splitlines()
    listed = {line.split()[0] for line in rows if line.startswith("  ") and line[2] != " "}
    assert listed >= COMMANDS


_WITHOUT = """
import sys
for name in {mods!r}:
    sys.modules[name] = None
from gpuscale.cli import main
main(prog_name="gpuscale")
"""


def _without(mods: list[str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    code = _WITHOUT.format(mods=mods)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def test_server_commands_without_the_extra_name_it() -> None:
    mods = ["fastapi", "httpx", "uvicorn", "pydantic"]
    helped = _without(mods, "--help")
    assert helped.returncode == 0
    for name in ("gpr", "serve"):
        text = " ".join(helped.stdout.split())
        assert f" {name} " in text and "(needs pip install 'gpuscale[server]')" in text.split(f" {name} ", 1)[1][:120]
    for args in (["gpr", "list"], ["serve"], ["gpr", "--help"]):
        res = _without(mods, *args)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.count("\n") == 1 and "pip install 'gpuscale[server]'" in res.stderr
        assert "Traceback" not in res.stderr


def test_simulate_out_without_matplotlib_names_the_sim_extra(tmp_path: Path) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(SMALL_SCENARIO)
    res = _without(["matplotlib"], "simulate", str(scen), "--out", str(tmp_path / "out"))
    assert res.returncode == 2, res.stderr
    assert "pip install 'gpuscale[sim]'" in res.stderr and "Traceback" not in res.stderr


def test_plan_without_scipy_says_the_plan_is_greedy() -> None:
    res = _without(["scipy"], "plan", str(SNAPSHOT), "--json")
    assert res.returncode == 0, res.stderr
    assert "pip install 'gpuscale[solver]'" in res.stderr and json.loads(res.stdout)["launches"]


def test_an_import_error_of_gpuscale_itself_is_never_hidden() -> None:
    group = RootGroup("g", lazy={"broken": Lazy("gpuscale.no_such_module:command", "never importable")})
    res = CliRunner().invoke(group, ["broken"])
    assert res.exit_code == 1 and "internal error: ModuleNotFoundError" in res.stderr
    assert isinstance(LazyGroup("h", lazy={}), click.Group)


# --- explain and plan DIR --------------------------------------------------------------------------------------------


def test_explain_unknown_pod_suggests_close_names() -> None:
    res = invoke("explain", str(SNAPSHOT), "default/train-8gpu")
    assert res.exit_code == 2
    line = res.stderr.strip().splitlines()[-1]
    assert "did you mean ml/train-8gpu" in line and line.count(" or ") <= 2


def test_explain_with_no_close_name_says_how_to_name_a_pod() -> None:
    res = invoke("explain", str(SNAPSHOT), "zzzzzzzz")
    assert res.exit_code == 2 and "namespace/name" in res.stderr and "did you mean" not in res.stderr


def test_plan_and_explain_read_a_directory(tmp_path: Path) -> None:
    docs = SNAPSHOT.read_text().split("\n---\n")
    half = len(docs) // 2
    (tmp_path / "a.yaml").write_text("\n---\n".join(docs[:half]) + "\n")
    (tmp_path / "b.yaml").write_text("\n---\n".join(docs[half:]))
    whole = json.loads(invoke("plan", str(SNAPSHOT), "--json", "--no-solver").stdout)
    res = invoke("plan", str(tmp_path), "--json", "--no-solver")
    assert res.exit_code == 0, res.stderr
    split = json.loads(res.stdout)
    assert split["totalHourlyCost"] == whole["totalHourlyCost"] and len(split["blocked"]) == len(whole["blocked"])
    explained = invoke("explain", str(tmp_path), "ml/train-8gpu")
    assert explained.exit_code == 0 and "RequestTooLarge" in explained.stdout


def test_skipped_catalog_rows_are_one_note_details_with_v() -> None:
    res = invoke("plan", str(SNAPSHOT), "--no-solver")
    assert res.exit_code == 0
    assert "warning:" not in res.stderr
    notes = [line for line in res.stderr.splitlines() if "catalog row" in line]
    assert notes == ["note: linode:us-ord: 1 catalog row skipped (1 with incomplete specs or price); -v for details"]
    verbose = invoke("plan", str(SNAPSHOT), "--no-solver", "-v")
    assert "g3-gpu-rtxpro6000-blackwell-1" in verbose.stderr and "-v for details" not in verbose.stderr


def test_unknown_catalog_warnings_stay_warnings() -> None:
    from gpuscale.catalogs.skips import summarise

    s = summarise("x", ["aws: excluded 3 instance type(s) with non-NVIDIA accelerator 'Inferentia' (a, b, c)", "odd"])
    assert s.total == 3 and s.others == ("odd",) and "3 non-NVIDIA" in (s.line() or "")


# --- compare ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compare_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    scen = tmp_path_factory.mktemp("cmp") / "small.yaml"
    scen.write_text(SMALL_SCENARIO)
    out = {}
    for key, args, env in (
        ("json", ["--json"], {}),
        ("csv", ["--csv"], {}),
        ("80", [], {"COLUMNS": "80"}),
        ("60", [], {"COLUMNS": "60"}),
        ("piped", [], {"COLUMNS": ""}),
    ):
        res = CliRunner(env=env).invoke(main, ["compare", str(scen), *args])
        assert res.exit_code == 0, res.output
        out[key] = res.stdout
    return out


@pytest.mark.parametrize(("key", "width"), [("80", 80), ("60", 60), ("piped", 80)])
def test_compare_table_fits_and_shows_every_cost(compare_runs: dict[str, str], key: str, width: int) -> None:
    text = compare_runs[key]
    assert all(len(line) <= width for line in text.splitlines()[1:]), text
    assert "…" not in text and "┃" not in text
    for row in json.loads(compare_runs["json"]):
        assert f"{row['costUsd']:,.2f}" in text, (row, text)
        assert (row["policy"] if row["policy"] != "lower-bound" else "lower bound") in text


def test_compare_csv_matches_json(compare_runs: dict[str, str]) -> None:
    rows = list(csv.DictReader(io.StringIO(compare_runs["csv"])))
    want = json.loads(compare_runs["json"])
    assert [r["policy"] for r in rows] == [r["policy"] for r in want]
    assert [float(r["costUsd"]) for r in rows] == [r["costUsd"] for r in want]
    assert rows[0]["nodesLaunched"] == str(want[0]["nodesLaunched"]) and rows[-1]["nodesLaunched"] == ""
