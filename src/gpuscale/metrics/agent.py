"""``gpuscale agent``: a GPU exporter speaking the NVIDIA DCGM exporter's metric names, units and labels.

Each scrape of ``/metrics`` reads the GPUs once through a :class:`~gpuscale.metrics.gpus.GpuBackend` (NVML, or the
seeded simulation with ``--simulate``) and writes one gauge sample per GPU and field, labelled ``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname`` and, when the GPU's pod is known, ``container``, ``namespace``, ``pod``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType
from wsgiref.simple_server import WSGIServer

import click
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscale.clock import SystemClock
from gpuscale.errors import InputError
from gpuscale.metrics.gpus import (
    GpuBackend,
    GpuReading,
    LoadCurve,
    NoDriver,
    NvmlBackend,
    SimulatedBackend,
    find_model,
    parse_pods,
)
from gpuscale.metrics.names import DCGM

DEFAULT_PORT = 9400

_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_copy_util_pct",
    "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
}
"""DCGM field -> :class:`GpuReading` attribute."""
assert set(_FIELDS) == set(DCGM)


def labels(reading: GpuReading, hostname: str) -> dict[str, str]:
    """The DCGM exporter's labels for one GPU."""
    out = {
        "gpu": str(reading.index),
        "UUID": reading.uuid,
        "device": f"nvidia{reading.minor}",
        "modelName": reading.model,
        "Hostname": hostname,
    }
    if reading.pod is not None:
        out |= {"container": reading.pod.container, "namespace": reading.pod.namespace, "pod": reading.pod.pod}
    return out


class DcgmCollector(Collector):
    """Reads ``backend`` at every scrape and yields the DCGM gauges."""

    def __init__(self, backend: GpuBackend, hostname: str) -> None:
        self.backend = backend
        self.hostname = hostname

    def collect(self) -> Iterator[Metric]:
        """One gauge family per DCGM field; a field a backend cannot read (``None``) is left out for that GPU."""
        readings = self.backend.read()
        for name, attr in _FIELDS.items():
            family = Metric(name, DCGM[name], "gauge")
            for r in readings:
                value = getattr(r, attr)
                if value is not None:
                    family.add_sample(name, labels(r, self.hostname), float(value))
            yield family


def serve(backend: GpuBackend, hostname: str, host: str, port: int) -> tuple[int, threading.Thread, WSGIServer]:
    """Start serving ``/metrics`` in a daemon thread; returns the bound port, the thread and the server."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmCollector(backend, hostname))
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server.server_port, thread, server


@click.command("agent")
@click.option("--simulate", is_flag=True, help="Simulated GPUs following a load curve instead of NVML.")
@click.option("--gpus", "count", type=int, default=1, show_default=True, help="Simulated GPU count.")
@click.option("--model", default="a100", show_default=True, help="Simulated GPU model (short or NVML name).")
@click.option("--curve", default=None, help="Simulated utilisation T:PERCENT,... (seconds since start; linear).")
@click.option("--period", type=float, default=None, help="Repeat the curve every PERIOD seconds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the simulated noise and UUIDs.")
@click.option("--noise", type=float, default=0.0, show_default=True, help="Simulated noise (percentage points).")
@click.option("--pod", "pods", multiple=True, help="GPU=NAMESPACE/POD[/CONTAINER]: the pod using a GPU.")
@click.option("--hostname", default=None, help="Hostname label [default: $NODE_NAME or the host name].")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True, help="Port (0: any free port).")
def agent_command(
    simulate: bool,
    count: int,
    model: str,
    curve: str | None,
    period: float | None,
    seed: int,
    noise: float,
    pods: tuple[str, ...],
    hostname: str | None,
    host: str,
    port: int,
) -> None:
    """Export GPU metrics in the DCGM exporter's format on /metrics (NVML, or --simulate)."""
    host_label = hostname or os.environ.get("NODE_NAME") or socket.gethostname()
    pod_map = parse_pods(pods)
    if not 0 <= port <= 65535:
        raise InputError("not a TCP port", where="--port", value=port)
    backend: GpuBackend
    if simulate:
        load = LoadCurve.parse(curve, period=period) if curve else LoadCurve(period=period)
        backend = SimulatedBackend(
            SystemClock(), count, find_model(model), load, seed=seed, noise=noise, hostname=host_label, pods=pod_map
        )
        what = (
            f"{count} simulated {backend.model.name} GPU{'s' if count != 1 else ''} (curve t=0 at {backend.start:.3f})"
        )
    else:
        try:
            backend = NvmlBackend(pod_map)
        except NoDriver as exc:
            click.echo(f"error: {exc}; run on a GPU node or pass --simulate", err=True)
            raise click.exceptions.Exit(2) from exc
        what = f"{len(backend.read())} NVML GPUs"
    try:
        bound, _, server = serve(backend, host_label, host, port)
    except OSError as exc:
        click.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        raise click.exceptions.Exit(2) from exc
    click.echo(f"gpuscale agent: {what} on http://{host}:{bound}/metrics", err=True)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    try:
        stop.wait()
    finally:
        server.shutdown()
