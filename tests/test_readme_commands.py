"""Every command line of the README runs, verbatim, from the repository root, and prints what it promises."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_RUN = {"scripts/test": "runs this test suite; checked against .ci/run instead"}
EXPECT = {
    "scripts/demo": "total cost",
    "gpuscale demo": "total cost",
    "gpuscale simulate ": "total cost",
    "gpuscale compare examples/demo": "lower bound",
    "gpuscale compare --providers": "pods done",
    "gpuscale compare examples/inference": "gpuscale-budget",
    "gpuscale scaler replay ": "desired",
    "gpuscale rightsize ": "lower/target/upper",
    "gpuscale plan ": "pending pod(s)",
    "gpuscale explain ": "ml/train-8gpu",
    "gpuscale simulate-gpr ": "requests:",
    "gpuscale catalog show ": "g2-gpu-rtx4000a1-s",
}
"""A fragment of each command line and a fragment its output must contain."""


def readme_commands() -> list[str]:
    """The command lines of the README's ```bash blocks, without trailing ``# comments``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
    lines = []
    for block in blocks:
        for raw in block.splitlines():
            line = re.sub(r"\s+#.*$", "", raw).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


COMMANDS = readme_commands()


def test_readme_starts_with_the_two_commands() -> None:
    assert COMMANDS[:2] == ["scripts/demo", "scripts/test"]
    assert all(any(fragment in cmd + " " for fragment in EXPECT) or cmd in NOT_RUN for cmd in COMMANDS), COMMANDS


def test_scripts_test_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test\b", ci, flags=re.M), ci
    assert (ROOT / "scripts" / "test").stat().st_mode & 0o111


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in NOT_RUN])
def test_readme_command_runs(command: str) -> None:
    proc = subprocess.run(shlex.split(command), cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    expected = [out for fragment, out in EXPECT.items() if fragment in command + " "]
    assert expected, f"no output check for {command}"
    assert all(out in proc.stdout for out in expected), f"{command}\n{proc.stdout[-2000:]}"
