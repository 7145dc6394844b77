"""``/healthz``, ``/readyz`` and ``/metrics`` over HTTP for the controller process.

* ``/healthz`` (liveness): 200 while the controller loop has beaten within ``stall_after_s`` (:meth:`Health.beat`
  each round, leader or not); 500 with the age of the last beat otherwise, so a hung process is restarted.
* ``/readyz`` (readiness): 200 when every check passes, else 503. The checks: the cache has listed every resource
  and its watches are running, the API server answers (:func:`cache_check`), and leader election works — the
  replica is the leader or a standby that can read the Lease (:func:`leader_check`). The body names each check,
  ``[+]name ok`` or ``[-]name failed: why``, like the API server's own ``/readyz?verbose``.
* ``/metrics``: the Prometheus text exposition of a registry (:class:`gpuscale.kube.metrics.ControllerMetrics`).

:class:`EndpointServer` serves any of them from a stdlib threading HTTP server in a daemon thread, so a busy or
blocked reconcile never delays a probe. The deployment runs metrics on 8080 and health on 8081.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuscale.clock import Clock

__all__ = ["EndpointServer", "Health", "cache_check", "leader_check"]

Check = Callable[[], str | None]
"""A readiness check: None when it passes, else why not (one line)."""


class _Cache(Protocol):
    @property
    def healthy(self) -> bool: ...
    def errors(self) -> dict[str, Any]: ...


class _Elector(Protocol):
    def is_leader(self) -> bool: ...
    @property
    def last_error(self) -> str: ...


def cache_check(cache: _Cache) -> Check:
    """Ready when the cache is synced and watching, which also means the API server answers."""

    def check() -> str | None:
        if cache.healthy:
            return None
        errors = cache.errors()
        if not errors:
            return "the cache has not listed every resource yet"
        parts = []
        for name, err in sorted(errors.items()):
            describe = getattr(err, "describe", None)
            parts.append(f"{name}: {describe() if callable(describe) else err}")
        return "; ".join(parts)

    return check


def leader_check(elector: _Elector) -> Check:
    """Ready as leader, or as a standby that reads the Lease; not ready when the Lease cannot be read or written."""

    def check() -> str | None:
        if elector.is_leader():
            return None
        return elector.last_error or None

    return check


@dataclass
class Health:
    """Liveness heartbeat and named readiness checks."""

    clock: Clock
    stall_after_s: float = 300.0
    checks: dict[str, Check] = field(default_factory=dict)
    _beat: float | None = None

    def beat(self) -> None:
        """The controller loop is alive (call once per round)."""
        self._beat = self.clock.now()

    def add(self, name: str, check: Check) -> None:
        """Add a readiness check."""
        self.checks[name] = check

    def live(self) -> tuple[bool, str]:
        """(alive, text) for ``/healthz``."""
        if self._beat is None:
            return True, "ok (starting)\n"
        age = self.clock.now() - self._beat
        if age > self.stall_after_s:
            return False, f"the controller loop has not run for {age:.0f}s (limit {self.stall_after_s:.0f}s)\n"
        return True, "ok\n"

    def ready(self) -> tuple[bool, str]:
        """(ready, text) for ``/readyz``: one line per check."""
        lines, ok = [], True
        for name, check in self.checks.items():
            try:
                why = check()
            except Exception as exc:  # a failing check is a reason, not a crash of the probe
                why = f"{type(exc).__name__}: {exc}"
            if why is None:
                lines.append(f"[+]{name} ok")
            else:
                ok = False
                lines.append(f"[-]{name} failed: {why}")
        lines.append("readyz check passed" if ok else "readyz check failed")
        return ok, "\n".join(lines) + "\n"


class EndpointServer:
    """Serves ``/healthz`` and ``/readyz`` (when given ``health``) and ``/metrics`` (when given ``registry``)."""

    def __init__(
        self,
        port: int,
        *,
        health: Health | None = None,
        registry: CollectorRegistry | None = None,
        host: str = "0.0.0.0",
    ) -> None:
        self.health = health
        self.registry = registry
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: not logged
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"gpuscale-http-{port}", daemon=True)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._httpd.server_address[1])

    def start(self) -> EndpointServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> EndpointServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics" and self.registry is not None:
            self._send(req, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz" and self.health is not None:
            alive, text = self.health.live()
            self._send(req, 200 if alive else 500, text.encode())
        elif path == "/readyz" and self.health is not None:
            ready, text = self.health.ready()
            self._send(req, 200 if ready else 503, text.encode())
        else:
            self._send(req, 404, b"not found\n")

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
