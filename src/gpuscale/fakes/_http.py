"""The HTTP scaffold the cloud fakes share: a WSGI app served on an ephemeral port of 127.0.0.1 in a thread."""

from __future__ import annotations

import threading
from typing import Any, Self

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler


class QuietServer(ThreadedWSGIServer):
    """Daemon request threads; a client that went away (closed its socket) is not an error of the fake."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is not an error of the fake."""


class QuietHandler(WSGIRequestHandler):
    """No per-request access log line (errors are still logged)."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class LocalServer:
    """Serves ``app`` on 127.0.0.1 (ephemeral port) in a daemon thread named ``name``; start/stop are idempotent."""

    def __init__(self, app: Any, *, name: str, handler: type[WSGIRequestHandler] = QuietHandler) -> None:
        self._app = app
        self._name = name
        self._handler = handler
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve in a background thread (nothing if already serving)."""
        if self._server is None:
            self._server = QuietServer("127.0.0.1", 0, self._app, handler=self._handler)
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=self._name, daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop serving and join the thread (nothing if not serving)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def port(self, what: str) -> int:
        """The bound port; RuntimeError ``the <what> is not started`` when not serving."""
        if self._server is None:
            raise RuntimeError(f"the {what} is not started")
        return self._server.server_port


class ServedFake:
    """Base of a fake served by a :class:`LocalServer` in ``self._http``: ``start()`` (returns the fake), ``stop()``,
    and use as a context manager."""

    _http: LocalServer

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Serve on an ephemeral port of 127.0.0.1 in a background thread."""
        self._http.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._http.stop()
