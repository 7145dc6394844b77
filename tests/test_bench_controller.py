"""benchmarks/bench_controller.py on a small cluster: its emulator serves lists in pages the controller's cache reads
whole, and a run reports a launch for every burst pod."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import ModuleType

import pytest

from gpuscale.fakes.kube_api import KubeAPIServer
from gpuscale.kube.cache import LIST_PAGE, WATCHED, KubeCache
from kube_harness import client_for

pytest.importorskip("lightkube")


def _bench() -> ModuleType:
    path = Path(__file__).parents[1] / "benchmarks" / "bench_controller.py"
    spec = importlib.util.spec_from_file_location("bench_controller", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_emulator_pages_lists_and_the_cache_reads_every_page() -> None:
    bench = _bench()
    server = KubeAPIServer(bench.BenchEmulator()).start()
    client = client_for(server)
    try:
        bench.populate(server, 3, 2 * LIST_PAGE + 7)
        page = server.call(lambda: server.emulator._list(server._rt("pods"), None, {"limit": "500"}))
        assert len(page["items"]) == LIST_PAGE and page["metadata"]["continue"]
        cache = KubeCache(client, tuple(w for w in WATCHED if w.name in ("pods", "nodes"))).start()
        try:
            cache.wait_synced(20)
            assert len(cache.objects("pods")) == 2 * LIST_PAGE + 7 and len(cache.objects("nodes")) == 3
            server.create("pods", {"metadata": {"name": "late"}, "spec": {"containers": []}}, "ml")
            for _ in range(100):  # the watch starts from the list's resourceVersion
                if cache.get("pods", "ml/late") is not None:
                    break
                time.sleep(0.05)
            assert cache.get("pods", "ml/late") is not None
        finally:
            cache.stop()
    finally:
        client.close()
        server.close()


def test_a_small_run_reports_a_launch_for_every_burst_pod(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    argv = ["--nodes", "20", "--pods", "200", "--bursts", "2", "--burst-size", "3", "--gap", "2", "--json"]
    assert bench.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["burst_pods"] == 6 and report["pods_without_launch"] == 0
    assert 0 < report["launch_latency_p50_s"] <= report["launch_latency_p99_s"] < 30
    assert report["peak_rss_mb"] > 0 and report["rounds"] > 0
