"""The controller process against a large emulated cluster: launch latency, round time, memory.

Starts the Kubernetes API emulator (``gpuscale.fakes.kube_api``) with ``--nodes`` CPU nodes running ``--pods`` pods,
then runs ``gpuscale controller --provider kwok`` as a separate process against it and creates pending GPU pods in
``--bursts`` bursts of ``--burst-size`` (each marked Unschedulable at once, as the scheduler would, and bound to a new
kwok node once one with its GPU allocatable appears). Reports:

* time from a pod's creation to the launch made for it: the API server's creation of the kwok Node launched for
  the pod (the Node names its pods in ``gpuscale.io/launched-for``), both timed by the emulator's clock; p50 and p99
  over every burst pod; this includes the controller's batch window (``--batch-idle``, 0.5 s by default);
* reconcile time per round, from the process's own ``gpuscale_reconcile_seconds`` histogram (``/metrics``);
* the controller process's peak RSS (``VmHWM``).

Targets (issue 12): p99 at most 2 s, peak RSS at most 150 MB.

    .venv/bin/python benchmarks/bench_controller.py                  # 1,000 nodes, 10,000 pods, 5 bursts of 20
    .venv/bin/python benchmarks/bench_controller.py --nodes 100 --pods 1000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuscale.fakes.kube_api import KubeAPIEmulator, KubeAPIServer
from gpuscale.kube.kwok import LAUNCHED_FOR_ANNOTATION

TOLERATE = [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]
POOL = {
    "apiVersion": "gpuscale.io/v1alpha1",
    "kind": "GPUNodePool",
    "metadata": {"name": "ada"},
    "spec": {
        "instanceTypes": ["g2-gpu-rtx4000a1-s"],  # one GPU per node: every burst pod needs its own launch
        "zones": ["us-ord"],
        "capacityTypes": ["on-demand"],
        "taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}],
        "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
    },
}


class BenchEmulator(KubeAPIEmulator):
    """The emulator as a real API server behaves at this size, where the benchmark would otherwise time the emulator:

    * without kmock's log of every request served: kmock matches each new request against its route by scanning
      that whole log, so the time per request grows with the requests served (tens of ms after a few thousand);
    * lists paged by ``limit``/``continue`` (the controller lists in pages, as informers do): the continue token is
      the list's resourceVersion and an offset, and every page carries that resourceVersion, so a watch from it
      replays whatever changed while the pages were read.
    """

    async def _handle(self, request: Any) -> Any:
        self._requests[:] = [request]  # the request being served is the last one kmock logged
        return await super()._handle(request)

    def _list(self, rt: Any, namespace: str | None, params: Any) -> dict[str, Any]:
        out: dict[str, Any] = super()._list(rt, namespace, params)
        limit = int(params.get("limit") or 0)
        if limit <= 0:
            return out
        rv, _, offset = str(params.get("continue") or "").partition(":")
        start = int(offset or 0)
        items = out["items"]
        out["items"] = items[start : start + limit]
        out["metadata"] = {"resourceVersion": rv or out["metadata"]["resourceVersion"]}
        if start + limit < len(items):
            out["metadata"]["continue"] = f"{out['metadata']['resourceVersion']}:{start + limit}"
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kubeconfig(url: str, path: Path) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "bench", "cluster": {"server": url}}],
                "users": [{"name": "bench", "user": {"token": "bench"}}],
                "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
                "current-context": "bench",
            }
        )
    )


def populate(server: KubeAPIServer, nodes: int, pods: int) -> None:
    """CPU nodes (8 CPU, 32 GiB) with running pods spread over them."""
    server.create("gpunodepools", POOL)
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    for i in range(nodes):
        server.create(
            "nodes",
            {
                "metadata": {"name": f"cpu-{i:05d}", "labels": {"kubernetes.io/hostname": f"cpu-{i:05d}"}},
                "status": {"allocatable": alloc, "capacity": alloc},
            },
        )
    for i in range(pods):
        name = f"web-{i:06d}"
        server.create(
            "pods",
            {
                "metadata": {"name": name, "labels": {"app": f"web-{i % 50}"}},
                "spec": {
                    "nodeName": f"cpu-{i % max(1, nodes):05d}",
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}],
                },
            },
            namespace="apps",
        )
        server.patch("pods", name, {"status": {"phase": "Running"}}, namespace="apps", status=True)


def created_at(server: KubeAPIServer, key: tuple[str, str, str]) -> float:
    """When the emulator stored the object ``key`` (plural, namespace, name), read on its loop."""
    return float(server.call(lambda: server.emulator.created_at[key]))


def burst(server: KubeAPIServer, index: int, size: int) -> list[tuple[str, float]]:
    """Create ``size`` pending one-GPU pods; returns (name, creation time) pairs."""
    made = []
    for j in range(size):
        name = f"train-{index:02d}-{j:03d}"
        server.create(
            "pods",
            {
                "metadata": {"name": name},
                "spec": {
                    "tolerations": TOLERATE,
                    "containers": [
                        {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}}}
                    ],
                },
            },
            namespace="ml",
        )
        created = created_at(server, ("pods", "ml", name))
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/N nodes fit"}
        server.patch("pods", name, {"status": {"conditions": [cond]}}, namespace="ml", status=True)
        made.append((name, created))
    return made


def bind_new_nodes(server: KubeAPIServer, bound: set[str], used: set[str]) -> None:
    """Play the scheduler for the burst pods: bind each pending one to a kwok node nobody uses yet (one GPU each)."""
    em = server.emulator
    nodes_rt, pods_rt = server._rt("nodes"), server._rt("pods")

    def free_nodes() -> list[str]:
        return sorted(
            o["metadata"]["name"]
            for o in em._select(nodes_rt, None)
            if (o["metadata"].get("labels") or {}).get("type") == "kwok"
            and str(((o.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")) != "0"
            and o["metadata"]["name"] not in used
        )

    def waiting() -> list[str]:
        return sorted(
            o["metadata"]["name"]
            for o in em._select(pods_rt, "ml")
            if not (o.get("spec") or {}).get("nodeName") and o["metadata"]["name"] not in bound
        )

    for pod, node in zip(server.call(waiting), server.call(free_nodes), strict=False):
        server.patch("pods", pod, {"spec": {"nodeName": node}}, namespace="ml")
        server.patch("pods", pod, {"status": {"phase": "Running"}}, namespace="ml", status=True)
        bound.add(pod)
        used.add(node)


def launch_latencies(server: KubeAPIServer, made: list[tuple[str, float]]) -> tuple[list[float], int]:
    """Seconds from each pod's creation to the creation of the kwok Node launched for it (the launch call itself:
    the provider's create of that Node, which names the pods in its ``gpuscale.io/launched-for`` annotation); and how
    many pods have none."""
    em = server.emulator

    def node_times() -> dict[str, float]:
        out: dict[str, float] = {}
        made_at = {name: t for (kind, _, name), t in em.created_at.items() if kind == "nodes"}
        for o in em._select(server._rt("nodes"), None):
            meta = o["metadata"]
            pods = (meta.get("annotations") or {}).get(LAUNCHED_FOR_ANNOTATION, "")
            at = made_at.get(meta["name"])
            for pod in filter(None, pods.split(",")):
                if at is not None:
                    out[pod] = min(at, out.get(pod, at))
        return out

    first = server.call(node_times)
    out = [first[f"ml/{name}"] - created for name, created in made if f"ml/{name}" in first]
    return out, len(made) - len(out)


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(gpuscale_reconcile_seconds_(?:sum|count|bucket)(?:\{le=\"([^\"]+)\"\})?) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(3))
    return out


def _quantile_from_buckets(metrics: dict[str, float], q: float) -> float | None:
    buckets = sorted(
        (float(k.split('le="')[1].rstrip('"}')), v) for k, v in metrics.items() if "_bucket" in k and "+Inf" not in k
    )
    total = metrics.get("gpuscale_reconcile_seconds_count", 0.0)
    if not total:
        return None
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--burst-size", type=int, default=20)
    ap.add_argument("--gap", type=float, default=5.0, help="Seconds between bursts.")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    server = KubeAPIServer(BenchEmulator()).start()
    t0 = time.monotonic()
    populate(server, args.nodes, args.pods)
    setup_s = time.monotonic() - t0
    tmp = Path(tempfile.mkdtemp())
    _kubeconfig(server.url, tmp / "config")
    metrics_port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "gpuscale.cli",
        "controller",
        "--kubeconfig",
        str(tmp / "config"),
        "--provider",
        "kwok",
        "--bind-address",
        "127.0.0.1",
        "--metrics-port",
        str(metrics_port),
        "--health-port",
        str(metrics_port),
        "--interval",
        "1",
    ]
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": ""}
    log = open(tmp / "controller.log", "w")  # noqa: SIM115 - kept open for the child's lifetime
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                scrape(metrics_port)
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"the controller exited: see {tmp / 'controller.log'}") from None
                time.sleep(0.2)
        synced_s = time.monotonic() - t0 - setup_s
        made: list[tuple[str, float]] = []
        bound: set[str] = set()
        used: set[str] = set()
        for b in range(args.bursts):
            made += burst(server, b, args.burst_size)
            end = time.monotonic() + args.gap
            while time.monotonic() < end:  # the scheduler: bind pods as their nodes appear
                time.sleep(0.25)
                bind_new_nodes(server, bound, used)
        for _ in range(12):
            time.sleep(0.25)
            bind_new_nodes(server, bound, used)
        latencies, missing = launch_latencies(server, made)
        metrics = scrape(metrics_port)
        rss = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        server.close()
    rounds = metrics.get("gpuscale_reconcile_seconds_count", 0.0)
    report: dict[str, Any] = {
        "nodes": args.nodes,
        "running_pods": args.pods,
        "burst_pods": len(made),
        "setup_s": round(setup_s, 1),
        "controller_ready_s": round(synced_s, 1),
        "launch_latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "launch_latency_p99_s": round(sorted(latencies)[max(0, int(0.99 * len(latencies)) - 1)], 3)
        if latencies
        else None,
        "pods_without_launch": missing,  # none expected: each pod needs a node of its own
        "pods_bound": len(bound),
        "rounds": int(rounds),
        "round_mean_s": round(metrics.get("gpuscale_reconcile_seconds_sum", 0.0) / rounds, 4) if rounds else None,
        "round_p50_le_s": _quantile_from_buckets(metrics, 0.5),
        "round_p99_le_s": _quantile_from_buckets(metrics, 0.99),
        "peak_rss_mb": round(rss, 1),
        "targets": {"launch_latency_p99_s": 2.0, "peak_rss_mb": 150.0},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for k, v in report.items():
            print(f"{k:24} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
