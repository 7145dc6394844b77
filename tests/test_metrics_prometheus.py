"""A real Prometheus scraping ``gpuscale agent --simulate`` over HTTP, read through the gpuscale client: the DCGM
series and labels arrive, every error class is produced by a real server, a backfilled history
(``promtool tsdb create-blocks-from openmetrics``) reads back through a range query, and every dashboard panel's
PromQL parses and names metrics gpuscale produces."""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import scaling_scenario
from gpuscale.errors import (
    MetricsUnavailable,
    NoData,
    NotANumber,
    QueryRejected,
    TooManySeries,
)
from gpuscale.metrics import names
from gpuscale.metrics.prometheus import PrometheusClient
from prom_harness import ROOT, agent, free_port, prometheus, tool, wait_for

DASHBOARD = ROOT / "deploy" / "grafana" / "gpuscale-dashboard.json"
HISTORY_START = 3 * 3600
"""The backfilled history runs from now - 3 h ..."""
HISTORY_STEPS = 61
"""... for an hour, one sample a minute."""
HISTORY_POD = {"namespace": "ml", "pod": "train-0", "container": "trainer"}


def _history_value(i: int) -> float:
    """GPU memory used (MiB) by the backfilled pod at minute ``i``: a ramp with a peak at minute 45."""
    return 20000.0 + 300.0 * i if i <= 45 else 33500.0 - 500.0 * (i - 45)


CPU_CORES = {"train-0": 0.5, "train-1": 1.5}
"""Constant CPU use (cores) of the backfilled pods' trainer containers."""


def _memory_mib(pod: str, i: int) -> float:
    return 1000.0 + 10.0 * i if pod == "train-0" else 2000.0


@pytest.fixture(scope="module")
def history_start() -> float:
    return float(int(time.time()) // 60 * 60 - HISTORY_START)


@pytest.fixture(scope="module")
def controller() -> Iterator[tuple[str, set[str]] | None]:
    """The controller's metric set (``gpuscale.kube.metrics``) after two rounds with nodes, a launch failure, a
    queued GPR and decisions, served on 127.0.0.1: its scrape target and the sample names it exports. None when the
    controller's metrics module is not installed."""
    try:
        import prometheus_client

        from gpuscale.kube import metrics as kube_metrics
    except ImportError:
        yield None
        return
    m = kube_metrics.ControllerMetrics()
    now = time.time()
    gpr = kube_metrics.QueuedGpr
    m.observe([], [], now - 30, gprs=[gpr("g1", True, now - 90), gpr("g2", True, now - 60)], round_seconds=0.02)
    m.observe([], [], now, gprs=[gpr("g2", True, now - 60)], result=_Round(), round_seconds=0.04)
    m.nodes.labels("a100", "Initialized").set(2)
    m.gpus.labels("a100", "Initialized").set(16)
    m.cost.labels("a100").set(65.5)
    m.launches.labels("a100").inc(2)
    m.failures.labels("a100", "LaunchTimeout").inc()
    m.pending.set(3)
    m.observe_scalers({("ml", "llm"): (4, 2)}, {("ml", "shared", "llama"): 4})
    text = prometheus_client.generate_latest(m.registry).decode()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    server, _ = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=m.registry)
    try:
        yield f"127.0.0.1:{server.server_port}", exported
    finally:
        server.shutdown()


@dataclass
class _Round:
    """A reconcile round's counted decisions."""

    planned: bool = True
    launched: int = 2
    disrupted: int = 0
    evicted: int = 0
    deleted: int = 1


@pytest.fixture(scope="module")
def scenario_port() -> int:
    """The port the scaling scenario's agent will listen on: scraped (and down) from the start, so the scenario's
    first polls need not wait for Prometheus to discover it."""
    return free_port()


@pytest.fixture(scope="module")
def prom(
    tmp_path_factory: pytest.TempPathFactory,
    history_start: float,
    controller: tuple[str, set[str]] | None,
    scenario_port: int,
) -> Iterator[tuple[PrometheusClient, str]]:
    """Prometheus with a backfilled hour of history, scraping a 2-GPU simulated agent at 40 % utilisation (GPU 1 is
    used by ml/llama-0/server) and the controller's metrics. Yields the client and the agent's scrape target."""
    tmp = tmp_path_factory.mktemp("prom")
    promtool = tool("promtool")
    data = tmp / "data"
    om = tmp / "history.om"
    labels = 'Hostname="history-node",gpu="0",modelName="NVIDIA A100-SXM4-40GB",' + ",".join(
        f'{k}="{v}"' for k, v in HISTORY_POD.items()
    )
    steps = [(i, history_start + 60 * i) for i in range(HISTORY_STEPS)]
    lines = ["# TYPE DCGM_FI_DEV_FB_USED gauge"]
    lines += [f"DCGM_FI_DEV_FB_USED{{{labels}}} {_history_value(i)} {t:.0f}" for i, t in steps]
    lines += ["# TYPE DCGM_FI_DEV_FB_FREE gauge"]
    lines += [f"DCGM_FI_DEV_FB_FREE{{{labels}}} {40960 - _history_value(i)} {t:.0f}" for i, t in steps]
    lines += ["# TYPE container_cpu_usage_seconds counter"]
    for pod, cores in CPU_CORES.items():
        sel = f'namespace="ml",pod="{pod}",container="trainer"'
        lines += [f"container_cpu_usage_seconds_total{{{sel}}} {cores * 60 * i} {t:.0f}" for i, t in steps]
    lines += ["# TYPE container_memory_working_set_bytes gauge"]
    for pod in CPU_CORES:
        sel = f'namespace="ml",pod="{pod}",container="trainer"'
        lines += [
            f"container_memory_working_set_bytes{{{sel}}} {_memory_mib(pod, i) * 2**20:.0f} {t:.0f}" for i, t in steps
        ]
    om.write_text("\n".join([*lines, "# EOF", ""]))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True, capture_output=True
    )
    args = [
        "--simulate",
        "--gpus",
        "2",
        "--model",
        "a100",
        "--curve",
        "0:40",
        "--hostname",
        "node-a",
        "--pod",
        "1=ml/llama-0/server",
    ]
    extra = [controller[0]] if controller else []
    with (
        agent(tmp, args) as a,
        prometheus(tmp, [a.target, *extra, f"127.0.0.1:{scenario_port}"], data=data) as p,
        PrometheusClient(p.url) as client,
    ):
        wait_for(lambda: len(client.query("DCGM_FI_DEV_GPU_UTIL")) == 2)
        if controller:
            wait_for(lambda: client.query("count_over_time(gpuscale_pending_gpu_pods[1m]) >= 2"))
        yield client, a.target


def test_the_dcgm_series_arrive_with_the_exporter_labels(prom: tuple[PrometheusClient, str]) -> None:
    client, target = prom
    for name in names.DCGM:
        samples = sorted(client.query(name), key=lambda s: s.labels["gpu"])
        assert [s.labels["gpu"] for s in samples] == ["0", "1"], name
        for s in samples:
            assert s.labels["Hostname"] == "node-a"
            assert s.labels["modelName"] == "NVIDIA A100-SXM4-40GB"
            assert s.labels["device"] == f"nvidia{s.labels['gpu']}"
            assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", s.labels["UUID"])
            assert s.labels["job"] == "gpuscale-agent" and s.labels["instance"] == target
        assert "pod" not in samples[0].labels
        assert {k: samples[1].labels[k] for k in ("namespace", "pod", "container")} == {
            "namespace": "ml",
            "pod": "llama-0",
            "container": "server",
        }
    assert client.value("avg(DCGM_FI_DEV_GPU_UTIL)") == 40.0
    assert client.value('DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod="llama-0"}') == pytest.approx(0.4)
    used = client.value('DCGM_FI_DEV_FB_USED{gpu="0"}')
    free = client.value('DCGM_FI_DEV_FB_FREE{gpu="0"}')
    assert used + free == 40960 and used == round(40960 * (0.05 + 0.85 * 0.4))
    assert client.value(f'up{{instance="{target}"}}') == 1.0


def test_value_errors_come_from_a_real_server(prom: tuple[PrometheusClient, str]) -> None:
    client, _ = prom
    with pytest.raises(TooManySeries) as many:
        client.value("DCGM_FI_DEV_GPU_UTIL")
    assert many.value.count == 2 and "aggregate" in str(many.value)
    with pytest.raises(NoData):
        client.value("DCGM_FI_DEV_GPU_UTIL_NO_SUCH_METRIC")
    with pytest.raises(NotANumber):
        client.value("avg(DCGM_FI_DEV_GPU_UTIL) * (0/0)")
    with pytest.raises(NotANumber):
        client.value("1/0")
    with pytest.raises(QueryRejected) as bad:
        client.value("avg(DCGM_FI_DEV_GPU_UTIL")
    assert bad.value.error_type == "bad_data" and bad.value.status == 400 and "parenthes" in str(bad.value)
    assert bad.value.retry.kind == "never"
    with pytest.raises(QueryRejected, match="range vector"):
        client.value("DCGM_FI_DEV_GPU_UTIL[1m]")
    assert NoData.retry.kind == "backoff"


def test_connection_failures_and_timeouts_are_metrics_unavailable() -> None:
    with (
        PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=1.0) as closed,
        pytest.raises(MetricsUnavailable, match="cannot reach") as exc,
    ):
        closed.value("up")
    assert exc.value.retry.kind == "backoff" and exc.value.__cause__ is not None
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        start = time.monotonic()
        with (
            PrometheusClient(f"http://127.0.0.1:{port}", timeout=0.3) as slow,
            pytest.raises(MetricsUnavailable, match=r"did not answer within 0\.3s"),
        ):
            slow.value("up")
        assert time.monotonic() - start < 3


def test_backfilled_history_reads_back_through_a_range_query(
    prom: tuple[PrometheusClient, str], history_start: float
) -> None:
    client, _ = prom
    end = history_start + 60 * (HISTORY_STEPS - 1)
    series = client.usage('DCGM_FI_DEV_FB_USED{pod="train-0"}', history_start, end, 60)
    assert len(series) == 1
    assert series[0].labels.items() >= {**HISTORY_POD, "Hostname": "history-node"}.items()
    assert series[0].points == tuple((history_start + 60 * i, _history_value(i)) for i in range(HISTORY_STEPS))
    peak = client.value('max_over_time(DCGM_FI_DEV_FB_USED{pod="train-0"}[2h])', at=end)
    assert peak == _history_value(45) == max(series[0].values())
    coarse = client.query_range('DCGM_FI_DEV_FB_USED{pod="train-0"}', history_start, end, 600)
    assert [v for _, v in coarse[0].points] == [_history_value(i) for i in range(0, HISTORY_STEPS, 10)]
    assert client.usage('DCGM_FI_DEV_FB_USED{pod="nobody"}', history_start, end, 60) == []
    with pytest.raises(QueryRejected):
        client.query_range("up", end, history_start, 60)


# --- the dashboard ---------------------------------------------------------------------------------------------------

_GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "${Hostname}": ".*",
    "$Hostname": ".*",
}
_NOT_METRICS = frozenset(
    "by without on ignoring group_left group_right bool and or unless offset inf nan".split()  # noqa: SIM905
)


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())


def _queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in _panels(board) for t in p.get("targets", ()) if "expr" in t]


def _expand(expr: str) -> str:
    for var, value in _GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside strings, braces and brackets, not followed by '('
    (a function) and not a keyword."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    found = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", bare):
        if not m.group(2) and m.group(1).lower() not in _NOT_METRICS:
            found.add(m.group(1))
    return found


def test_the_metric_name_extractor() -> None:
    assert metric_names('sum by (pool) (rate(gpuscale_launches_total{pool=~"a|b"}[5m])) / on (pool) x_y') == {
        "gpuscale_launches_total",
        "x_y",
    }
    assert metric_names("histogram_quantile(0.9, sum by (le) (rate(gpuscale_gpr_wait_seconds_bucket[5m])))") == {
        "gpuscale_gpr_wait_seconds_bucket"
    }


def test_the_dashboard_covers_the_required_views() -> None:
    board = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"].lower() for p in _panels(board))
    for topic in ("utilisation", "memory", "scaling", "node", "cost", "gpr queue"):
        assert topic in titles, topic
    ids = [p["id"] for p in _panels(board)]
    assert len(ids) == len(set(ids))
    assert all(
        t.get("datasource", {}).get("uid") == "${datasource}" for p in _panels(board) for t in p.get("targets", ())
    )


def test_every_dashboard_query_parses_on_prometheus_and_names_known_metrics(
    prom: tuple[PrometheusClient, str],
) -> None:
    client, _ = prom
    queries = _queries()
    assert len(queries) >= 8
    unknown = {(title, n) for title, expr in queries for n in metric_names(expr) if not names.known(n)}
    assert not unknown, f"metrics gpuscale does not produce: {sorted(unknown)}"
    for title, expr in queries:
        assert metric_names(expr), f"{title}: {expr!r} names no metric"
        client.query(_expand(expr))  # raises QueryRejected (HTTP 400) on a syntax error
    gpu_panels = [expr for _, expr in queries if "DCGM_FI_" in expr]
    live = [expr for expr in gpu_panels if client.query(_expand(expr))]
    assert len(live) == len(gpu_panels), "every GPU panel shows data from the agent"


def test_a_syntax_error_in_a_panel_would_be_caught(prom: tuple[PrometheusClient, str]) -> None:
    client, _ = prom
    with pytest.raises(QueryRejected):
        client.query(_expand("sum by (Hostname (DCGM_FI_DEV_GPU_UTIL)"))
    assert math.isfinite(client.value(_expand('avg(DCGM_FI_DEV_GPU_UTIL{Hostname=~"$Hostname"})')))


def _dashboard_metrics() -> dict[str, set[str]]:
    board = json.loads(DASHBOARD.read_text())
    return {t["expr"]: metric_names(t["expr"]) for p in _panels(board) for t in p.get("targets", ()) if "expr" in t}


def test_every_controller_metric_the_dashboard_names_is_exported(controller: tuple[str, set[str]] | None) -> None:
    if controller is None:
        pytest.skip("gpuscale.kube.metrics is not installed")
    _, exported = controller
    used = {n for found in _dashboard_metrics().values() for n in found if not n.startswith("DCGM_")}
    missing = used - exported - names.PLANNED
    assert not missing, f"the dashboard names controller metrics the controller does not export: {sorted(missing)}"
    assert exported & used, "the dashboard shows some of the controller's metrics"
    assert not (names.PLANNED & exported), "a planned metric is exported now: remove it from names.PLANNED"


def test_dashboard_panels_show_the_scraped_controller_and_agent(
    prom: tuple[PrometheusClient, str], controller: tuple[str, set[str]] | None
) -> None:
    if controller is None:
        pytest.skip("gpuscale.kube.metrics is not installed")
    client, _ = prom
    _, exported = controller
    assert client.value("count(up == 1)") == 2  # the agent and the controller (the scenario's agent is not up)
    empty = [
        expr
        for expr, found in _dashboard_metrics().items()
        if found <= exported | set(names.DCGM) and not client.query(_expand(expr))
    ]
    assert not empty, f"panels with no data although their metrics are scraped: {empty}"
    assert client.value("sum(gpuscale_hourly_cost_dollars)") == 65.5
    assert client.value("sum(gpuscale_gpr_queue_length)") == 1
    assert client.value('sum(gpuscale_launch_failures_total{reason="LaunchTimeout"})') == 1


def test_right_sizing_usage_reads_back_from_the_backfilled_history(
    prom: tuple[PrometheusClient, str], history_start: float
) -> None:
    """The right-sizer's Prometheus source (``gpuscale.scaling.usage.PrometheusUsage``) reads the backfilled
    cAdvisor and DCGM history back through range queries, pooled per workload."""
    from gpuscale.core.autoscale import rightsize
    from gpuscale.scaling.usage import PrometheusUsage

    client, _ = prom
    end = history_start + 60 * (HISTORY_STEPS - 1)
    usage = PrometheusUsage(client, namespace="ml", end=end, window_s=end - history_start - 600, step_s=60).usage()
    n = (HISTORY_STEPS - 1) - 10 + 1
    (trainer,) = usage.containers
    assert (trainer.workload, trainer.container, trainer.containers_in_pod) == ("ml/train", "trainer", 1)
    assert len(trainer.cpu_cores) == 2 * n
    assert sorted(v for _, v in trainer.cpu_cores) == pytest.approx([0.5] * n + [1.5] * n)
    want = sorted((history_start + 60 * i, _memory_mib(p, i)) for p in CPU_CORES for i in range(10, HISTORY_STEPS))
    assert list(trainer.memory_mib) == want
    (gpu,) = usage.gpus
    assert (gpu.workload, gpu.total_mib, gpu.gpus_per_pod) == ("ml/train", 40960, 1)
    assert [v for _, v in gpu.used_mib] == [_history_value(i) for i in range(10, HISTORY_STEPS)]
    advice = rightsize.gpu_advice(gpu)
    assert advice.peak_mib == _history_value(45) and advice.total_mib == 40960
    rec = rightsize.recommend(trainer)
    assert rec.cpu_milli.lower <= rec.cpu_milli.target <= rec.cpu_milli.upper
    assert rec.cpu_milli.target >= 1500  # the 90th percentile of the pooled samples is the busier pod's 1.5 cores
    empty = PrometheusUsage(client, namespace="nobody", end=end, window_s=3000, step_s=60).usage()
    assert empty.containers == () and empty.gpus == ()


def test_scalers_scale_simulated_deployments_from_real_prometheus_metrics(
    prom: tuple[PrometheusClient, str], scenario_port: int, tmp_path: Path
) -> None:
    """The HPA computation and a KEDA scaler poll this Prometheus while it scrapes an agent playing a stepped load
    curve, each scaling a simulated deployment: replicas and conditions match the hand-computed tables."""
    client, _ = prom
    played = scaling_scenario.play(client, tmp_path, scenario_port)
    assert played.hpa == scaling_scenario.EXPECTED, "\n".join(map(str, played.hpa))
    assert played.hpa_deployment.history == [(3, 3), (7, 4), (11, 3), (13, 2), (15, 1)]
    assert played.keda == scaling_scenario.KEDA_EXPECTED
    assert played.keda_deployment.history == [(3, 1), (5, 3), (11, 2), (15, 0)]
