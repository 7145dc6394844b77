"""``gpuscale gpr ...`` (an HTTP client of the GPR API) and ``gpuscale serve`` (the embedded server).

The client finds the server with ``--url`` (or ``GPUSCALE_URL``, default ``http://127.0.0.1:8080``) and
authenticates with the token in ``GPUSCALE_API_TOKEN``. Field errors from the server (HTTP 422) are printed one per
line and exit with code 2; other HTTP errors exit with code 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import httpx

DEFAULT_URL = "http://127.0.0.1:8080"
TOKEN_ENV = "GPUSCALE_API_TOKEN"
URL_ENV = "GPUSCALE_URL"


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class _Client:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        token = os.environ.get(TOKEN_ENV, "")
        if not token:
            _fail(f"{TOKEN_ENV} is not set; export the server's API token", 2)
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self.http.request(method, f"/api/v1{path}", **kw)
        except httpx.HTTPError as exc:
            _fail(f"cannot reach the gpuscale server at {self.http.base_url}: {exc}")
        if resp.status_code == 422:
            detail = resp.json().get("detail", [])
            lines = [
                f"  {'.'.join(str(x) for x in d.get('loc', [])[1:]) or 'body'}: {d.get('msg')}" for d in detail
            ] or [f"  {detail}"]
            _fail("the server rejected the request:\n" + "\n".join(lines), 2)
        if resp.status_code == 401:
            _fail(f"unauthorized: check {TOKEN_ENV}", 2)
        if resp.status_code >= 400:
            try:
                text = resp.json().get("detail", resp.text)
            except ValueError:
                text = resp.text
            _fail(f"HTTP {resp.status_code}: {text}")
        return resp.json()


def _print(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


_COLUMNS = ("gprId", "name", "priority", "status", "nodes", "GPUs", "wait", "remaining", "reason")


def _row(g: dict[str, Any]) -> list[str]:
    spec, st = g["spec"], g["status"]
    return [
        g["gprId"],
        spec["requestName"],
        str(spec["priority"]),
        st["provisioningStatus"],
        str(spec["numberOfGPUNodes"]),
        str(st["numGPUsAllocated"]),
        st["estimatedWaitTime"] or "",
        st["remainingDuration"] or "",
        st["failureReason"],
    ]


def _table(items: list[dict[str, Any]]) -> None:
    """A rich table on a terminal, tab-separated lines otherwise (for scripts)."""
    if not sys.stdout.isatty():
        click.echo("\t".join(_COLUMNS))
        for g in items:
            click.echo("\t".join(_row(g)))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title_justify="left")
    for col in _COLUMNS:
        t.add_column(col)
    for g in items:
        t.add_row(*_row(g))
    Console(highlight=False, soft_wrap=True).print(t)


_url = click.option("--url", envvar=URL_ENV, default=DEFAULT_URL, show_default=True, help="Server URL.")


def _spec_options(fn: Any) -> Any:
    opts = [
        click.option("--file", "-f", "file", type=click.Path(dir_okay=False, exists=True), help="Spec (YAML/JSON)."),
        click.option("--name", help="requestName."),
        click.option("--cluster", help="clusterName."),
        click.option("--shape", help="gpuShape, e.g. RTX4000-Ada."),
        click.option("--instance-type", help="instanceType, e.g. g2-gpu-rtx4000a4-s."),
        click.option("--auto-gpu", is_flag=True, default=None, help="enableAutoGpuSelection."),
        click.option("--gpus", type=int, help="numberOfGPUs per node."),
        click.option("--nodes", type=int, help="numberOfGPUNodes."),
        click.option("--memory", type=int, help="memoryPerGpu (GB)."),
        click.option("--priority", type=int, help="1-300 (default 101)."),
        click.option("--exit", "exit_", help="exitDuration, e.g. 0d8h0m."),
        click.option("--idle-timeout", help="idleTimeOutDuration, e.g. 30m."),
        click.option("--eviction/--no-eviction", default=None, help="enableEviction."),
        click.option("--requeue/--no-requeue", default=None, help="requeueOnFailure."),
        click.option("--dynamic/--no-dynamic", default=None, help="enableDynamicNodePool."),
        click.option("--selector", multiple=True, help="workloadSelector label KEY=VALUE (repeatable)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _spec_from_options(kw: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if kw.get("file"):
        import yaml

        text = Path(kw["file"]).read_text(encoding="utf-8")
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            _fail(f"{kw['file']}: not valid YAML/JSON: {exc}", 2)
        if isinstance(loaded, dict) and isinstance(loaded.get("spec"), dict):
            loaded = loaded["spec"]
        if not isinstance(loaded, dict):
            _fail(f"{kw['file']}: expected a mapping of GPR spec fields", 2)
        data.update(loaded)
    mapping = {
        "name": "requestName",
        "cluster": "clusterName",
        "shape": "gpuShape",
        "instance_type": "instanceType",
        "auto_gpu": "enableAutoGpuSelection",
        "gpus": "numberOfGPUs",
        "nodes": "numberOfGPUNodes",
        "memory": "memoryPerGpu",
        "priority": "priority",
        "exit_": "exitDuration",
        "idle_timeout": "idleTimeOutDuration",
        "eviction": "enableEviction",
        "requeue": "requeueOnFailure",
        "dynamic": "enableDynamicNodePool",
    }
    for opt, fieldname in mapping.items():
        if kw.get(opt) is not None:
            data[fieldname] = kw[opt]
    if kw.get("selector"):
        labels: dict[str, str] = {}
        for item in kw["selector"]:
            key, sep, value = item.partition("=")
            if not sep or not key:
                _fail(f"--selector {item!r}: write KEY=VALUE", 2)
            labels[key] = value
        data["workloadSelector"] = {"matchLabels": labels}
    return data


@click.group("gpr")
def gpr_group() -> None:
    """GPU Provisioning Requests on a gpuscale server (token from GPUSCALE_API_TOKEN)."""


@gpr_group.command("create")
@_url
@_spec_options
def create_cmd(url: str, **kw: Any) -> None:
    """Create a GPR from --file and/or options; prints it as JSON."""
    _print(_Client(url).call("POST", "/gpr", json=_spec_from_options(kw)))


@gpr_group.command("list")
@_url
@click.option("--status", help="Only GPRs in this provisioningStatus (Queued, Provisioned, ...).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_cmd(url: str, status: str | None, as_json: bool) -> None:
    """List GPRs."""
    data = _Client(url).call("GET", "/gpr/list", params={"status": status} if status else None)
    if as_json:
        _print(data)
    else:
        _table(data["items"])


@gpr_group.command("get")
@_url
@click.argument("gpr_id")
def get_cmd(url: str, gpr_id: str) -> None:
    """Show one GPR as JSON."""
    _print(_Client(url).call("GET", "/gpr", params={"gprId": gpr_id}))


@gpr_group.command("release")
@_url
@click.argument("gpr_id")
def release_cmd(url: str, gpr_id: str) -> None:
    """Release a provisioning or provisioned GPR early."""
    _print(_Client(url).call("PUT", "/gpr", json={"gprId": gpr_id, "earlyRelease": True}))


@gpr_group.command("priority")
@_url
@click.argument("gpr_id")
@click.argument("priority", type=int)
def priority_cmd(url: str, gpr_id: str, priority: int) -> None:
    """Change the priority of a GPR (1-300)."""
    _print(_Client(url).call("PUT", "/gpr", json={"gprId": gpr_id, "priority": priority}))


@gpr_group.command("cancel")
@_url
@click.argument("gpr_id")
def cancel_cmd(url: str, gpr_id: str) -> None:
    """Cancel a queued GPR."""
    _print(_Client(url).call("DELETE", "/gpr", params={"gprId": gpr_id}))


@gpr_group.command("wait-time")
@_url
@click.option("--id", "gpr_id", help="An existing GPR; otherwise the spec options describe a hypothetical one.")
@_spec_options
def wait_time_cmd(url: str, gpr_id: str | None, **kw: Any) -> None:
    """Estimate how long until a GPR's nodes would be ready."""
    body = {"gprId": gpr_id} if gpr_id else _spec_from_options(kw)
    _print(_Client(url).call("POST", "/gpr/waittime", json=body))


@click.command("serve")
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="SQLite database file for GPRs.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--provider", type=click.Choice(["sim", "linode"]), default="sim", show_default=True)
@click.option("--catalog", default="linode", show_default=True, help="Catalog for validation, cost and launches.")
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(min=0.1), help="Reconcile period.")
def serve_command(db: str, host: str, port: int, provider: str, catalog: str, interval: float) -> None:
    """Run the GPR API and controller (token from GPUSCALE_API_TOKEN; Linode settings from LINODE_*)."""
    import logging

    from gpuscale.errors import InputError
    from gpuscale.gpr.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(db, host, port, provider=provider, catalog=catalog, interval_s=interval)
    except InputError as exc:
        _fail(str(exc), 2)
