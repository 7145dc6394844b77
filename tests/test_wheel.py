"""The built wheel runs anywhere: installed into a fresh virtualenv in an empty directory, with no source tree, no
``../shared`` data and no ``GPUSCALE_DATA_DIR``, the first-contact commands work.

No network: the wheel is installed with ``--no-deps`` and the new virtualenv sees the project virtualenv's
site-packages (for numpy, click, ...) through a ``.pth`` file, which adds that directory without running its own
``.pth`` files (so the editable install of the source tree stays invisible). Deselect with ``-m 'not wheel'``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [pytest.mark.wheel, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


@dataclass
class Transcript:
    """Every command run so far with its exit code and output, for failure messages."""

    lines: list[str] = field(default_factory=list)

    def add(self, argv: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        self.lines.append(f"$ {' '.join(argv)}   -> exit {proc.returncode}")
        self.lines += [f"  | {line}" for line in (proc.stdout + proc.stderr).splitlines()[:40]]

    def __str__(self) -> str:
        return "\n".join(self.lines)


def _build_wheel(tmp: Path) -> Path:
    """Build the wheel from a copy of the sources, so the shared working tree gets no build/ or egg-info."""
    src = tmp / "src-copy"
    (src / "src").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "src" / "gpuscale",
        src / "src" / "gpuscale",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    out = tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("gpuscale-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new virtualenv with the wheel installed (no deps, no index) and the project's dependencies visible."""
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "_project_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return env_dir


def test_wheel_installed_in_a_fresh_venv_runs_from_an_empty_directory(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    env_dir = _fresh_venv(tmp_path, wheel)
    work = tmp_path / "empty" / "work"
    work.mkdir(parents=True)
    assert not any(p.exists() for p in (work.parent / "shared", work.parent.parent / "shared"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUSCALE_DATA_DIR", "VIRTUAL_ENV")}
    env |= {"PYTHONNOUSERSITE": "1", "COLUMNS": "80", "NO_COLOR": "1"}
    log = Transcript()

    def run(*args: str, expect: int = 0, extra_env: dict[str, str] | None = None) -> str:
        argv = [str(env_dir / "bin" / args[0]), *args[1:]]
        proc = subprocess.run(
            argv, cwd=work, env=env | (extra_env or {}), capture_output=True, text=True, timeout=TIMEOUT_S
        )
        log.add([args[0], *args[1:]], proc)
        assert proc.returncode == expect, str(log)
        assert "Traceback" not in proc.stderr, str(log)
        return proc.stdout + proc.stderr

    where = run("python", "-c", "import gpuscale; print(gpuscale.__file__)")
    assert Path(where.strip()).is_relative_to(env_dir), str(log)
    assert str(ROOT) not in where, str(log)

    helptext = run("gpuscale", "--help")
    for command in ("plan", "explain", "demo", "simulate", "compare", "simulate-gpr", "examples", "gpr", "serve"):
        assert f"  {command} " in helptext, f"{command} missing from --help\n{log}"

    listing = run("gpuscale", "examples")
    assert "snapshot.yaml" in listing and "gpr-scenario.yaml" in listing, str(log)
    run("gpuscale", "examples", "copy", ".")
    assert (work / "snapshot.yaml").is_file() and (work / "demo.yaml").is_file(), str(log)
    run("gpuscale", "examples", "copy", ".", expect=2)  # never overwrites without --force

    plan = run("gpuscale", "plan", "snapshot.yaml", "--catalog", "linode")
    assert "pending pod" in plan, str(log)

    demo = run("gpuscale", "demo")
    assert "total cost" in demo and str(env_dir) in demo, str(log)  # the shipped scenario, read from the venv

    gpr = run("gpuscale", "simulate-gpr")
    assert "requests:" in gpr and "served" in gpr, str(log)

    compare = run("gpuscale", "compare", "demo.yaml")
    assert "cost" in compare and len(compare.splitlines()) >= 6, str(log)

    if "  catalog " in helptext:  # the shipped price data, read from the venv
        assert "linode" in run("gpuscale", "catalog", "list"), str(log)
        assert "g1-gpu-rtx6000-1" in run("gpuscale", "catalog", "show", "linode"), str(log)

    # the openb trace is not shipped: one line saying where to get it, exit 2
    missing = run("gpuscale", "bench", "openb", "--scorer", "fgd", "--seeds", "42", expect=2)
    assert len(missing.strip().splitlines()) == 1, str(log)
    assert "alibaba/clusterdata" in missing and "cluster-trace-gpu-v2023" in missing, str(log)
    assert "GPUSCALE_DATA_DIR" in missing, str(log)

    # without the server extra (its modules made unimportable), gpr and serve stay listed and name the extra
    blockers = tmp_path / "no-server-extra"
    for module in ("fastapi", "httpx", "pydantic", "uvicorn"):
        (blockers / module).mkdir(parents=True)
        (blockers / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n"
        )
    no_server = {"PYTHONPATH": str(blockers)}
    helptext = run("gpuscale", "--help", extra_env=no_server)
    assert "  gpr " in helptext and "  serve " in helptext, str(log)
    refused = run("gpuscale", "gpr", "list", expect=2, extra_env=no_server)
    assert "gpuscale[server]" in refused, str(log)
    print(f"\n{log}")  # the transcript, for the record (pytest -s)
