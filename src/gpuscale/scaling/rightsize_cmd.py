"""``gpuscale rightsize USAGE.yaml | --prometheus URL``: VPA-style CPU and memory requests and GPU memory advice."""

from __future__ import annotations

import json
import math
import time

import click

from gpuscale.core.autoscale.rightsize import GpuAdvice, Recommendation, gpu_advice, recommend
from gpuscale.errors import InputError
from gpuscale.manifests.quantity import parse_duration
from gpuscale.scaling.usage import FileUsage, PrometheusUsage, Usage, UsageSource


def _seconds(text: str, option: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise InputError(str(exc), where=option, value=text, fix="e.g. 7d, 24h or 60s") from None
    if value <= 0:
        raise InputError("must be positive", where=option, value=text)
    return value


def _cpu(milli: float) -> str:
    return f"{math.ceil(milli)}m"


def _mem(mib: float) -> str:
    return f"{math.ceil(mib)}Mi"


def _row(r: Recommendation) -> dict[str, object]:
    return {
        "workload": r.workload, "container": r.container,
        "cpu": {"lowerBound": _cpu(r.cpu_milli.lower), "target": _cpu(r.cpu_milli.target),
                "upperBound": _cpu(r.cpu_milli.upper)},
        "memory": {"lowerBound": _mem(r.memory_mib.lower), "target": _mem(r.memory_mib.target),
                   "upperBound": _mem(r.memory_mib.upper)},
        "requests": {"cpu": None if r.requests.cpu_milli is None else _cpu(r.requests.cpu_milli),
                     "memory": None if r.requests.memory_mib is None else _mem(r.requests.memory_mib)},
        "confidenceDays": round(r.confidence_days, 3), "notes": list(r.notes),
    }  # fmt: skip


def _gpu_row(g: GpuAdvice) -> dict[str, object]:
    return {"workload": g.workload, "verdict": str(g.verdict), "peakMiB": round(g.peak_mib), "p95MiB": round(g.p95_mib),
            "gpuMemoryMiB": round(g.total_mib), "gpuMilli": g.gpu_milli, "reason": g.reason}  # fmt: skip


@click.command("rightsize")
@click.argument("usage_file", metavar="USAGE.yaml", required=False, type=click.Path(dir_okay=False))
@click.option("--prometheus", "server", default=None, help="Read usage from this Prometheus (range queries).")
@click.option("--namespace", default=None, help="With --prometheus: only this namespace.")
@click.option("--window", default="7d", show_default=True, help="With --prometheus: how much history.")
@click.option("--step", default="60s", show_default=True, help="With --prometheus: sample spacing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {containers: [...], gpus: [...]}.")
def rightsize_command(usage_file: str | None, server: str | None, namespace: str | None, window: str, step: str,
                      as_json: bool) -> None:  # fmt: skip
    """Recommend CPU and memory requests (VPA's percentiles and margin) and flag pods whose GPU memory use calls for
    a larger, smaller or fractional GPU. Nothing is changed: GPU model and count are for you to change."""
    if (usage_file is None) == (server is None):
        raise InputError("give a USAGE.yaml file or --prometheus URL (one of the two)", where="rightsize",
                         fix="e.g. gpuscale rightsize usage.yaml")  # fmt: skip
    source: UsageSource
    if server is not None:
        from gpuscale.metrics.prometheus import PrometheusClient

        client = PrometheusClient(server)
        source = PrometheusUsage(client, namespace=namespace, end=time.time(), window_s=_seconds(window, "--window"),
                                 step_s=_seconds(step, "--step"))  # fmt: skip
        try:
            usage: Usage = source.usage()
        finally:
            client.close()
    else:
        assert usage_file is not None
        usage = FileUsage(usage_file).usage()
    recs = [recommend(c) for c in usage.containers]
    gpus = [gpu_advice(g) for g in usage.gpus]
    if as_json:
        click.echo(json.dumps({"containers": [_row(r) for r in recs], "gpus": [_gpu_row(g) for g in gpus]}, indent=1))
        return
    if not recs and not gpus:
        click.echo("no usage found")
        return
    head = f"{'workload/container':<34} {'requests':>14}  {'cpu lower/target/upper':>24}"
    click.echo(f"{head}  {'memory lower/target/upper':>28}")
    for r in recs:
        req = "-" if r.requests.cpu_milli is None and r.requests.memory_mib is None else (
            f"{_cpu(r.requests.cpu_milli) if r.requests.cpu_milli is not None else '-'}/"
            f"{_mem(r.requests.memory_mib) if r.requests.memory_mib is not None else '-'}"
        )  # fmt: skip
        c, m = r.cpu_milli, r.memory_mib
        name = f"{r.workload}/{r.container}"
        click.echo(f"{name:<34} {req:>14}  {_cpu(c.lower) + '/' + _cpu(c.target) + '/' + _cpu(c.upper):>24}  "
                   f"{_mem(m.lower) + '/' + _mem(m.target) + '/' + _mem(m.upper):>28}")  # fmt: skip
        for note in r.notes:
            click.echo(f"  note: {note}")
    for g in gpus:
        click.echo(f"GPU {g.workload}: {g.verdict}: {g.reason}")
