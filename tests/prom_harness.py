"""A real Prometheus (and promtool) for tests, and ``gpuscale agent --simulate`` as a real subprocess.

The binaries come from ``.tools/prometheus/usr/bin`` (unpacked from the Debian package by ``scripts/test``) or PATH.
When they are absent the tests skip, except under CI (``CI`` set), where absence is a failure.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".tools" / "prometheus" / "usr" / "bin"
T = TypeVar("T")


def tool(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; skips the test when absent (fails under CI)."""
    local = TOOLS / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} not found in {TOOLS} or on PATH (scripts/test installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready within {timeout}s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class Agent:
    """A running ``gpuscale agent``."""

    url: str
    """``http://127.0.0.1:PORT/metrics``"""
    target: str
    """``127.0.0.1:PORT``"""
    proc: subprocess.Popen[bytes]
    started: float
    """Unix time of the simulated curve's t=0 (NaN for NVML)."""


@contextmanager
def agent(tmp: Path, args: Sequence[str]) -> Iterator[Agent]:
    """``gpuscale agent --host 127.0.0.1 --port 0 ARGS`` in a subprocess, until the block ends."""
    log = tmp / f"agent-{time.monotonic_ns()}.log"
    cmd = [
        sys.executable,
        "-c",
        "from gpuscale.cli import main; main()",
        "agent",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *args,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)/metrics", log.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"agent did not start ({proc.poll()}): {log.read_text()[-2000:]}")
            time.sleep(0.05)
        target = f"127.0.0.1:{m.group(1)}"
        start = re.search(r"curve t=0 at ([0-9.]+)", log.read_text())
        yield Agent(f"http://{target}/metrics", target, proc, float(start.group(1)) if start else math.nan)
    finally:
        _stop(proc)


@dataclass(frozen=True)
class Prometheus:
    """A running Prometheus."""

    url: str
    data: Path
    proc: subprocess.Popen[bytes]


@contextmanager
def prometheus(
    tmp: Path, targets: Sequence[str], *, scrape_interval: str = "250ms", data: Path | None = None
) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1 scraping ``targets`` (``host:port``) under job ``gpuscale-agent``; ``data`` may hold
    backfilled blocks."""
    binary = tool("prometheus")
    data = data or tmp / "prom-data"
    data.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    target_list = ", ".join(f"'{t}'" for t in targets)
    config.write_text(
        f"global:\n  scrape_interval: {scrape_interval}\n  evaluation_interval: {scrape_interval}\n"
        f"scrape_configs:\n  - job_name: gpuscale-agent\n    static_configs:\n      - targets: [{target_list}]\n"
    )
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=30d",
                "--web.enable-lifecycle",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/-/ready", proc, 30, log)
        yield Prometheus(url, data, proc)
    finally:
        _stop(proc)


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, every: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy; that value, or an AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # a metrics error while the first scrape is still coming
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")
