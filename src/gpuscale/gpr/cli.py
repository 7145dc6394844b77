"""``gpuscale gpr ...`` (an HTTP client of the GPR API) and ``gpuscale serve`` (the embedded server).

The client finds the server with ``--url`` (or ``GPUSCALE_URL``, default ``http://127.0.0.1:8080``) and
authenticates with the token in ``GPUSCALE_API_TOKEN``. Field errors from the server (HTTP 422) are printed one per
line and exit with code 2; other HTTP errors exit with code 1.
"""

from __future__ import annotations

import json
import os
import re
import sys
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
            _fail(f"cannot reach the gpuscale server at {self.http.base_url}: {_cell(str(exc), 200)}")
        try:
            data = resp.json()
        except ValueError:
            data = None
        detail = data.get("detail") if isinstance(data, dict) else _cell(resp.text, 200)
        if resp.status_code == 422:
            items = detail if isinstance(detail, list) else [{"msg": detail}]
            lines = [
                f"  {_cell('.'.join(str(x) for x in d.get('loc', [])[1:]) or 'body', 60)}: {_cell(str(d.get('msg')))}"
                for d in items[:20]
                if isinstance(d, dict)
            ]
            more = [f"  ... and {len(items) - 20} more"] if len(items) > 20 else []
            _fail("the server rejected the request:\n" + "\n".join(lines + more), 2)
        if resp.status_code == 401:
            _fail(f"unauthorized: check {TOKEN_ENV}", 2)
        if resp.status_code >= 400:
            _fail(f"HTTP {resp.status_code}: {_cell(str(detail), 300)}")
        if data is None:
            _fail(f"the server at {self.http.base_url} answered HTTP {resp.status_code} without JSON")
        return data


def _print(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))  # ensure_ascii: any string, even a lone surrogate, prints


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")


def _cell(value: object, limit: int = 80) -> str:
    """``value`` as one printable line: control, bidi and surrogate characters become ``?``, long text is cut."""
    text = _UNPRINTABLE.sub("?", "" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


_COLUMNS = ("gprId", "name", "priority", "status", "nodes", "GPUs", "wait", "remaining", "reason")


def _row(g: Any) -> list[str]:
    """One table row; a malformed item gives a row of ``?`` rather than an error."""
    spec = g.get("spec") if isinstance(g, dict) else None
    st = g.get("status") if isinstance(g, dict) else None
    spec = spec if isinstance(spec, dict) else {}
    st = st if isinstance(st, dict) else {}
    raw = [
        g.get("gprId", "?") if isinstance(g, dict) else "?",
        spec.get("requestName", "?"),
        spec.get("priority", "?"),
        st.get("provisioningStatus", "?"),
        spec.get("numberOfGPUNodes", "?"),
        st.get("numGPUsAllocated", "?"),
        st.get("estimatedWaitTime") or "",
        st.get("remainingDuration") or "",
        st.get("failureReason") or "",
    ]
    return [_cell(v).replace("\t", " ") for v in raw]


def _table(items: list[dict[str, Any]]) -> None:
    """A rich table on a terminal, tab-separated lines otherwise (for scripts)."""
    if not sys.stdout.isatty():
        click.echo("\t".join(_COLUMNS))
        for g in items:
            click.echo("\t".join(_row(g)))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(title_justify="left")
    for col in _COLUMNS:
        t.add_column(col)
    for g in items:
        t.add_row(*(Text(c) for c in _row(g)))  # Text: a name like "[bold]" is shown, not interpreted
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
        from gpuscale.errors import InputError
        from gpuscale.inputs import load_yaml_file

        try:
            loaded = load_yaml_file(kw["file"], what="GPR spec")
        except InputError as exc:
            _fail(str(exc), 2)
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


def _json_body(data: dict[str, Any]) -> bytes:
    """``data`` as a JSON request body; values YAML can hold but JSON cannot (dates, sets) are a clear error."""
    try:
        return json.dumps(data, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        _fail(f"the spec holds a value JSON cannot carry: {_cell(str(exc))}; quote it as text", 2)


@click.group("gpr")
def gpr_group() -> None:
    """GPU Provisioning Requests on a gpuscale server (token from GPUSCALE_API_TOKEN)."""


@gpr_group.command("create")
@_url
@_spec_options
def create_cmd(url: str, **kw: Any) -> None:
    """Create a GPR from --file and/or options; prints it as JSON (unknown fields are refused by the server)."""
    _print(_Client(url).call("POST", "/gpr", content=_json_body(_spec_from_options(kw))))


@gpr_group.command("list")
@_url
@click.option("--status", help="Only GPRs in this provisioningStatus (Queued, Provisioned, ...).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_cmd(url: str, status: str | None, as_json: bool) -> None:
    """List GPRs."""
    data = _Client(url).call("GET", "/gpr/list", params={"status": status} if status else None)
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        _fail("the server's list answer has no items")
    if as_json:
        _print(data)
    else:
        _table(data["items"])
    for err in (data.get("errors") or [])[:20]:
        if isinstance(err, dict):
            click.echo(
                f"warning: stored GPR {_cell(err.get('gprId'), 40)} unreadable: {_cell(err.get('error'))}", err=True
            )


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
    _print(_Client(url).call("POST", "/gpr/waittime", content=_json_body(body)))


@click.command("serve")
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="SQLite database file for GPRs.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--provider", type=click.Choice(["sim", "linode", "aws", "gcp", "alibaba"]), default="sim", show_default=True
)
@click.option("--catalog", default="linode", show_default=True, help="Catalog for validation, cost and launches.")
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(min=0.1), help="Reconcile period.")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    envvar="GPUSCALE_ALLOWED_HOSTS",
    help="Extra Host name accepted when bound to a loopback address (repeatable; e.g. behind a reverse proxy).",
)
def serve_command(
    db: str, host: str, port: int, provider: str, catalog: str, interval: float, allowed_hosts: tuple[str, ...]
) -> None:
    """Run the GPR API and controller (token from GPUSCALE_API_TOKEN; Linode settings from LINODE_*)."""
    import logging

    from gpuscale.errors import InputError
    from gpuscale.gpr.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(db, host, port, provider=provider, catalog=catalog, interval_s=interval, allowed_hosts=allowed_hosts)
    except InputError as exc:
        _fail(str(exc), 2)
