"""``gpuscale scaler replay``: the shipped example end to end (text and JSON), and bad input as exit 2 with one
line naming file:line and the fix."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuscale.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "gpuscale" / "examples"
SCALER, HISTORY = str(EXAMPLES / "scaler.yaml"), str(EXAMPLES / "scaler-history.yaml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_replay_json_of_the_example() -> None:
    code, out, err = run("scaler", "replay", "--json", SCALER, HISTORY)
    assert code == 0, err
    rows = json.loads(out)
    assert set(rows[0]) == {"t", "currentReplicas", "desiredReplicas", "reason"}
    assert rows[0]["t"] == 0 and rows[-1]["t"] == 960
    # hand-checked: activation on the queue (3 > 0) at t=30; scale-up capped by Pods 2 per 60 s at t=90; the unready
    # pod at t=120 makes gpu-util's rebalanced ratio reverse, the queue wins (40 / 8); a failed gpu-util blocks the
    # scale-down at t=300 and t=330; the 120 s scale-down window at t=420 and t=600; zero after the 300 s cooldown
    assert [r["desiredReplicas"] for r in rows] == [0, 1, 3, 3, 5, 6, 6, 6, 6, 4, 4, 2, 2, 0, 0]
    assert [r["currentReplicas"] for r in rows[1:]] == [r["desiredReplicas"] for r in rows[:-1]]
    assert "Pods 2 pods per 60s" in rows[3]["reason"]
    assert "queue proposes 5" in rows[4]["reason"]
    assert "gpu-util (query failed, 1 in a row)" in rows[7]["reason"]
    assert "stabilization window 120s" in rows[10]["reason"]
    assert "cooldownPeriod 300s" in rows[13]["reason"]


def test_replay_text_and_options(tmp_path: Path) -> None:
    code, out, _ = run("scaler", "replay", SCALER, HISTORY)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("GPUWorkloadScaler inference/llama-70b -> Deployment/llama-70b")
    assert len(lines) == 2 + 15
    # from 4 replicas, a Monday at 09:00 UTC (the business-hours schedule keeps 2 at least)
    code, out, _ = run(
        "scaler", "replay", "--json", "--replicas", "4", "--start", "2026-01-05T09:00:00Z", SCALER, HISTORY
    )
    rows = json.loads(out)
    assert rows[0]["currentReplicas"] == 4 and min(r["desiredReplicas"] for r in rows) == 2


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "h.yaml"
    bad.write_text("- {t: 0, metrics: {gpu-util: 1}}\n- {t: 30, metrics: {gpu-utl: 2}}\n")
    code, out, err = run("scaler", "replay", SCALER, str(bad))
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0
    assert f"{bad}:2" in err and "is not a trigger of the scaler" in err and "did you mean gpu-util" in err
    bad.write_text("- {t: 30, metrics: {}}\n- {t: 30, metrics: {}}\n")
    code, _, err = run("scaler", "replay", SCALER, str(bad))
    assert code == 2 and "must be later than the step before" in err
    bad.write_text("{t: 0}\n")
    code, _, err = run("scaler", "replay", SCALER, str(bad))
    assert code == 2 and "a history is a non-empty YAML list of steps" in err
    code, _, err = run("scaler", "replay", SCALER, HISTORY, "--start", "yesterday")
    assert code == 2 and "--start" in err


def test_a_file_of_several_scalers_needs_scaler(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    other = (EXAMPLES / "scaler.yaml").read_text().replace("name: llama-70b\n  namespace", "name: other\n  namespace")
    both.write_text((EXAMPLES / "scaler.yaml").read_text() + "---\n" + other)
    code, _, err = run("scaler", "replay", str(both), HISTORY)
    assert code == 2 and "choose one with --scaler NAME" in err
    code, _, err = run("scaler", "replay", "--scaler", "other", str(both), HISTORY)
    assert code == 0, err


BUDGET_FILES = [str(EXAMPLES / n) for n in ("gpubudget.yaml", "scaler.yaml", "gpubudget-scalers.yaml")]


def test_arbitrate_explains_grants_and_refusals() -> None:
    code, out, err = run("scaler", "arbitrate", *BUDGET_FILES, "--desired", "llama-70b=6", "--desired", "mistral-7b=8")
    assert code == 0, err
    assert out.splitlines()[0] == "GPUBudget shared-inference: 16 of 16 GPUs granted, 0 free"
    assert "  llama-70b (llama-70b): 6 of 6 replicas, 12 GPUs" in out
    assert "  mistral-7b (mistral-7b): 4 of 8 replicas, 4 GPUs" in out
    assert "refused 4 replicas (4 GPUs): 0 GPUs left in the budget, 1 needed per replica; higher priority first: " \
           "llama-70b" in out  # fmt: skip
    code, out, _ = run("scaler", "arbitrate", *BUDGET_FILES, "--json", "--desired", "llama-70b=1")
    status = json.loads(out)["shared-inference"]
    grants = {g["scaler"]: g for g in status["grants"]}
    # llama wants 1 replica (2 GPUs) of its 4 guaranteed: the 2 idle are lent; mistral (default: max 8) uses them
    assert grants["llama-70b"]["granted"] == 1 and grants["mistral-7b"]["granted"] == 8
    assert status["usedGPUs"] == 10


def test_arbitrate_bad_input(tmp_path: Path) -> None:
    code, _, err = run("scaler", "arbitrate", *BUDGET_FILES, "--desired", "nobody=3")
    assert code == 2 and "no scaler named 'nobody'" in err
    code, _, err = run("scaler", "arbitrate", *BUDGET_FILES, "--desired", "llama-70b")
    assert code == 2 and "must be NAME=REPLICAS" in err
    code, _, err = run("scaler", "arbitrate", SCALER)
    assert code == 2 and "no GPUBudget in the files" in err
    other = tmp_path / "b.yaml"
    other.write_text((EXAMPLES / "gpubudget.yaml").read_text().replace("name: shared-inference", "name: other"))
    code, _, err = run("scaler", "arbitrate", str(other), SCALER)
    assert code == 2 and "names GPUBudget 'shared-inference', which is not in the files" in err
