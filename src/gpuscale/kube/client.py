"""The one Kubernetes client: lightkube's AsyncClient on a private event loop, with a synchronous face.

The controller's reconcile loop is synchronous; the watches that feed the cache are asynchronous. :class:`KubeClient`
runs lightkube's ``AsyncClient`` on an event loop in a daemon thread: watches live there for good, and the
controller's writes (patch, evict, delete, events) are submitted to it and awaited with a timeout. Errors come back
as :class:`KubeError` (HTTP status, Kubernetes reason, the verb and resource), never as lightkube or httpx exceptions.

Configuration follows kubectl: inside a pod the service account; else ``--kubeconfig``, ``KUBECONFIG`` or
``~/.kube/config`` with ``--context``. Every problem reading it is an :class:`~gpuscale.errors.InputError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ApiError, ConfigError

from gpuscale.errors import InputError

__all__ = ["KubeClient", "KubeError", "load_config"]

T = TypeVar("T")

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class KubeError(Exception):
    """A failed Kubernetes request: ``status`` (0 when the server could not be reached), ``reason``, and what was
    asked (``verb`` on ``resource``)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "", verb: str = "", resource: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.verb = verb
        self.resource = resource

    @property
    def unreachable(self) -> bool:
        """The API server did not answer (refused, reset, timed out)."""
        return self.status == 0

    def describe(self) -> str:
        """One line: what was refused and why."""
        what = f"{self.verb} {self.resource}".strip()
        if self.status in (401,):
            return f"the API server rejected the credentials ({what}): {self}"
        if self.status == 403:
            return f"forbidden: the service account may not {what} (grant it in the ClusterRole): {self}"
        if self.unreachable:
            return f"the API server is unreachable ({what}): {self}"
        return f"{what} failed with HTTP {self.status} {self.reason}: {self}"


def load_config(
    kubeconfig: str | None = None, context: str | None = None, env: Mapping[str, str] | None = None
) -> SingleConfig:
    """The cluster to talk to: in a pod its service account (unless ``kubeconfig`` is given), else the kubeconfig
    file (``kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``) at ``context`` (default: its current context)."""
    env = os.environ if env is None else env
    if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT_TOKEN).exists():
        try:
            in_pod = KubeConfig.from_service_account().get()
        except (ConfigError, OSError) as exc:
            raise InputError(f"cannot read the pod's service account: {exc}", where=SERVICE_ACCOUNT_TOKEN) from exc
        if in_pod is not None:
            return in_pod
    path = kubeconfig or (env.get("KUBECONFIG", "").split(os.pathsep)[0] or None)
    where = path or str(Path.home() / ".kube" / "config")
    if not Path(where).is_file():
        raise InputError(
            "kubeconfig file not found",
            where=where,
            fix="pass --kubeconfig PATH, set KUBECONFIG, or run inside the cluster with a service account",
        )
    try:
        config = KubeConfig.from_file(where)
        if context is not None and context not in config.contexts:
            raise InputError(
                f"context {context!r} is not in the kubeconfig",
                where=where,
                fix=f"use one of: {', '.join(sorted(config.contexts)) or '(none)'}",
            )
        single = config.get(context_name=context)
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"unreadable kubeconfig: {exc}", where=where, fix="check it with kubectl config view") from exc
    if single is None or single.cluster is None or not single.cluster.server:  # pragma: no cover - lightkube raises
        raise InputError("the kubeconfig names no cluster server", where=where, fix="set a current-context")
    out: SingleConfig = single
    return out


def as_kube_error(exc: BaseException, verb: str, resource: str) -> KubeError:
    """The :class:`KubeError` for a lightkube/httpx exception."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiError):
        st = exc.status
        return KubeError(
            st.message or str(exc), status=int(st.code or 0), reason=st.reason or "", verb=verb, resource=resource
        )
    if isinstance(exc, httpx2.HTTPStatusError):
        code = exc.response.status_code
        return KubeError(str(exc), status=code, reason=exc.response.reason_phrase, verb=verb, resource=resource)
    if isinstance(exc, (httpx2.HTTPError, OSError, asyncio.TimeoutError, TimeoutError)):
        return KubeError(f"{type(exc).__name__}: {exc}".rstrip(": "), verb=verb, resource=resource)
    return KubeError(f"{type(exc).__name__}: {exc}", status=-1, verb=verb, resource=resource)


class KubeClient:
    """lightkube's AsyncClient on its own loop thread. ``run`` waits for a coroutine; ``spawn`` does not."""

    def __init__(self, config: SingleConfig, *, timeout_s: float = 10.0) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gpuscale-kube", daemon=True)
        self._thread.start()

        async def make() -> AsyncClient:
            return AsyncClient(config, timeout=httpx2.Timeout(timeout_s), field_manager="gpuscale")

        self.api: Any = asyncio.run_coroutine_threadsafe(make(), self.loop).result(timeout_s)
        """The lightkube AsyncClient (typed loosely: its overloads do not cover generic resources)."""

    def run(
        self, coro: Coroutine[Any, Any, T], *, verb: str = "", resource: str = "", timeout: float | None = None
    ) -> T:
        """Run ``coro`` on the client's loop and return its result; failures raise :class:`KubeError`."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout or self.timeout_s + 5)
        except Exception as exc:
            fut.cancel()
            raise as_kube_error(exc, verb, resource) from exc

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Start ``coro`` on the client's loop without waiting."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Close the HTTP client and stop the loop."""
        with contextlib.suppress(Exception):  # closing is best effort
            asyncio.run_coroutine_threadsafe(self.api.close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
