"""An ASGI app served by a real uvicorn on 127.0.0.1 (a free port), in a daemon thread, for tests over real HTTP."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn


@dataclass
class Running:
    """A started server: its base ``url`` and ``port``; :meth:`stop` ends it."""

    url: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: Any, log_level: str = "warning") -> Running:
    """Serve ``app`` (lifespan off) and return once uvicorn has started (at most 10 s)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    return Running(f"http://127.0.0.1:{port}", port, server, thread)
