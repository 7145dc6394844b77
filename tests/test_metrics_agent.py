"""``gpuscale agent``: the simulated GPUs (curve, seed, derived fields), the DCGM exposition over real HTTP, the
no-driver path through the real ``nvidia-ml-py`` (this machine has no NVIDIA driver), and bad input."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.cli import main
from gpuscale.clock import ManualClock
from gpuscale.errors import InputError
from gpuscale.metrics import names
from gpuscale.metrics.agent import DcgmCollector, serve
from gpuscale.metrics.gpus import (
    LoadCurve,
    NoDriver,
    NvmlBackend,
    PodRef,
    SimulatedBackend,
    find_model,
    parse_pods,
)
from prom_harness import agent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from gpuscale.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_load_curves_interpolate_hold_and_repeat() -> None:
    curve = LoadCurve.parse("0:20, 10:80, 20:50")
    assert [curve.at(t) for t in (0, 5, 10, 15, 20, 99)] == [20, 50, 80, 65, 50, 50]
    looping = LoadCurve.parse("0:20,10:80", period=20)
    assert looping.at(25) == looping.at(5) == 50
    sine = LoadCurve(period=100)
    assert (sine.at(0), sine.at(50), sine.at(100)) == pytest.approx((10, 90, 10))


@pytest.mark.parametrize(
    ("text", "period", "fragment"),
    [
        ("0:20,10", None, "T:PERCENT"),
        ("0:20,0:30", None, "increase"),
        ("0:120", None, "PERCENT <= 100"),
        ("", None, "no points"),
        ("0:nan", None, "T:PERCENT"),
        ("0:10,10:20", 5, "period"),
    ],
)
def test_bad_curves_are_input_errors(text: str, period: float | None, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        LoadCurve.parse(text, period=period)


def test_models_pods_and_counts_are_checked() -> None:
    assert find_model("L4").memory_mib == 23034 and find_model("NVIDIA H100 80GB HBM3").max_w == 700
    with pytest.raises(InputError, match=r"unknown GPU model.*a100"):
        find_model("v100")
    assert parse_pods(["1=ml/llama/server", "0=ml/x"]) == {1: PodRef("ml", "llama", "server"), 0: PodRef("ml", "x")}
    for bad in ("ml/llama", "x=ml/llama", "1=ml", "1=ml//c"):
        with pytest.raises(InputError):
            parse_pods([bad])
    with pytest.raises(InputError, match="no GPU 2"):
        SimulatedBackend(ManualClock(), 2, find_model("a100"), pods={2: PodRef("a", "b")})
    with pytest.raises(InputError, match="between 1 and 64"):
        SimulatedBackend(ManualClock(), 0, find_model("a100"))


def test_simulated_gpus_follow_the_curve_on_the_injected_clock() -> None:
    clock = ManualClock(1000.0)
    sim = SimulatedBackend(clock, 2, find_model("a100"), LoadCurve.parse("0:0,100:100"), hostname="n1")
    assert [r.util_pct for r in sim.read()] == [0, 0]
    clock.advance_to(1050.0)
    r = sim.read()[0]
    assert r.util_pct == 50 and r.gr_engine_active == 0.5 and r.mem_copy_util_pct == 30
    assert r.fb_used_mib + r.fb_free_mib == 40960 and r.fb_used_mib == round(40960 * (0.05 + 0.85 * 0.5))
    assert r.power_w == pytest.approx(55 + 345 * 0.5) and r.temp_c == 55
    assert r.uuid != sim.read()[1].uuid and r.uuid == sim.read()[0].uuid


def test_noise_is_seeded_and_bounded() -> None:
    def readings(seed: int) -> list[float]:
        clock = ManualClock()
        sim = SimulatedBackend(clock, 4, find_model("t4"), LoadCurve.parse("0:50"), seed=seed, noise=10)
        out = []
        for t in range(20):
            clock.advance_to(float(t))
            out += [r.util_pct for r in sim.read()]
        return out

    assert readings(7) == readings(7) != readings(8)
    assert all(40 <= u <= 60 for u in readings(7)) and len(set(readings(7))) > 5


def test_the_exposition_has_the_dcgm_names_types_and_labels() -> None:
    clock = ManualClock()
    sim = SimulatedBackend(clock, 2, find_model("l4"), LoadCurve.parse("0:70"), pods={0: PodRef("ml", "p0", "c")})
    port, _, server = serve(sim, "node-x", "127.0.0.1", 0)
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        server.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == set(names.DCGM)
    for name, family in families.items():
        assert family.type == "gauge" and family.documentation == names.DCGM[name]
        assert len(family.samples) == 2
        first, second = family.samples
        assert first.labels.keys() == {*names.GPU_LABELS, *names.POD_LABELS}
        assert second.labels.keys() == set(names.GPU_LABELS)
        assert (first.labels["pod"], first.labels["namespace"], first.labels["container"]) == ("p0", "ml", "c")
        assert first.labels["Hostname"] == "node-x" and second.labels["device"] == "nvidia1"
    assert families["DCGM_FI_DEV_GPU_UTIL"].samples[1].value == 70


def test_without_a_driver_the_agent_says_so_in_one_line_and_exits_2() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    run = _run("agent", "--port", "0")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: no NVIDIA driver on this machine (NVML library not found); run on a GPU node or pass --simulate"
    ]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--curve", "0:200"], "--curve"),
        (["--model", "v100"], "--model"),
        (["--pod", "9=a/b"], "--pod"),
        (["--gpus", "0"], "--gpus"),
        (["--port", "70000"], "--port"),
    ],
)
def test_bad_agent_options_exit_2_with_one_line(args: list[str], fragment: str) -> None:
    res = CliRunner().invoke(main, ["agent", "--simulate", "--host", "127.0.0.1", "--port", "0", *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]


def test_the_agent_subprocess_serves_until_sigterm(tmp_path: Path) -> None:
    with agent(tmp_path, ["--simulate", "--gpus", "3", "--model", "h100", "--hostname", "h"]) as a:
        text = httpx.get(a.url, timeout=5).text
        assert text.count("DCGM_FI_DEV_GPU_UTIL{") == 3 and 'modelName="NVIDIA H100 80GB HBM3"' in text
    assert a.proc.returncode == 0


def test_agent_is_listed_in_help() -> None:
    run = _run("--help")
    assert run.returncode == 0 and "agent" in run.stdout and "DCGM" in run.stdout


# --- the NVML backend against a stateful fake of nvidia-ml-py's API ------------------------------------------------


class FakeNvml:
    """The part of ``pynvml`` the agent uses, over a list of GPUs (dicts in NVML's units: bytes, milliwatts).
    A GPU's field set to ``"unsupported"`` raises NotSupported; a GPU with ``lost`` raises GpuIsLost."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_DriverNotLoaded(NVMLError):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    NVML_TEMPERATURE_GPU = 0

    @dataclass
    class Util:
        gpu: int
        memory: int

    @dataclass
    class Memory:
        total: int
        used: int
        free: int

    def __init__(self, gpus: list[dict[str, object]], *, init_error: type[Exception] | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        assert self.initialised > 0, "NVML used before nvmlInit"
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, object]:
        return self.gpus[i]

    def _field(self, h: dict[str, object], key: str) -> Any:
        if h.get("lost"):
            raise self.NVMLError_GpuIsLost()
        if h[key] == "unsupported":
            raise self.NVMLError_NotSupported()
        return h[key]

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, object]) -> Util:
        return self.Util(self._field(h, "util"), self._field(h, "mem_util"))

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, object]) -> Memory:
        used, total = self._field(h, "used"), self._field(h, "total")
        return self.Memory(total, used, total - used)

    def nvmlDeviceGetUUID(self, h: dict[str, object]) -> str:
        return str(self._field(h, "uuid"))

    def nvmlDeviceGetMinorNumber(self, h: dict[str, object]) -> int:
        return int(self._field(h, "minor"))

    def nvmlDeviceGetName(self, h: dict[str, object]) -> bytes:
        return str(self._field(h, "name")).encode()  # older drivers' bindings return bytes

    def nvmlDeviceGetPowerUsage(self, h: dict[str, object]) -> int:
        return int(self._field(h, "power_mw"))

    def nvmlDeviceGetTemperature(self, h: dict[str, object], sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._field(h, "temp"))


def _gpu(minor: int, **over: object) -> dict[str, object]:
    gpu: dict[str, object] = {"util": 87, "mem_util": 40, "used": 30 * 2**30, "total": 80 * 2**30,
                              "uuid": f"GPU-{minor:08d}", "minor": minor, "name": "NVIDIA H100 80GB HBM3",
                              "power_mw": 612_345, "temp": 71}  # fmt: skip
    return gpu | over


def test_nvml_readings_are_converted_to_dcgm_units_and_labels() -> None:
    nvml = FakeNvml([_gpu(3), _gpu(5, power_mw="unsupported", util=12)])
    backend = NvmlBackend({1: PodRef("ml", "p", "c")}, nvml=nvml)
    first, second = backend.read()
    assert (first.index, first.minor, first.uuid, first.model) == (0, 3, "GPU-00000003", "NVIDIA H100 80GB HBM3")
    assert (first.util_pct, first.mem_copy_util_pct, first.fb_used_mib, first.fb_free_mib) == (87, 40, 30720, 51200)
    assert (first.power_w, first.temp_c, first.gr_engine_active, first.pod) == (612.345, 71, None, None)
    assert second.power_w is None and second.util_pct == 12 and second.pod == PodRef("ml", "p", "c")
    text = generate_latest(_registry(backend)).decode()
    assert 'DCGM_FI_DEV_GPU_UTIL{Hostname="h",UUID="GPU-00000005",container="c",device="nvidia5",gpu="1"' in text
    assert text.count("DCGM_FI_DEV_POWER_USAGE{") == 1 and "DCGM_FI_PROF_GR_ENGINE_ACTIVE{" not in text
    nvml.gpus[0]["lost"] = True
    assert [r.index for r in backend.read()] == [1]
    backend.close()
    assert nvml.initialised == 0


@pytest.mark.parametrize(
    ("error", "message"),
    [("NVMLError_LibraryNotFound", "NVML library not found"), ("NVMLError_DriverNotLoaded", "not loaded"),
     ("NVMLError", "NVML failed to start")],
)  # fmt: skip
def test_nvml_start_failures_are_no_driver(error: str, message: str) -> None:
    with pytest.raises(NoDriver, match=message):
        NvmlBackend(nvml=FakeNvml([], init_error=getattr(FakeNvml, error)))


def _registry(backend: NvmlBackend) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmCollector(backend, "h"))
    return registry


_WITHOUT = "import sys\nfor name in {mods!r}:\n    sys.modules[name] = None\nfrom gpuscale.cli import main\nmain()\n"


def _without(mods: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    code = _WITHOUT.format(mods=mods)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_without_the_agent_extra_the_command_names_it() -> None:
    helped = _without(["prometheus_client"], "--help")
    assert helped.returncode == 0 and "(needs pip install 'gpuscale[agent]')" in " ".join(helped.stdout.split())
    res = _without(["prometheus_client"], "agent", "--simulate")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "pip install 'gpuscale[agent]'" in res.stderr
    nvml = _without(["pynvml"], "agent", "--port", "0")
    assert nvml.returncode == 2 and nvml.stderr.count("\n") == 1 and "pip install 'gpuscale[agent]'" in nvml.stderr
    simulated = _without(["pynvml"], "agent", "--simulate", "--gpus", "0")  # --simulate never imports pynvml
    assert simulated.returncode == 2 and "--gpus" in simulated.stderr and "pynvml" not in simulated.stderr
