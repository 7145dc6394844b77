"""Embedded mode: the GPR REST API (uvicorn) plus a background thread reconciling GPRs through a provider.

``serve(db, host, port)`` reads the API token from ``GPUSCALE_API_TOKEN`` (refuses to start without one), the
planner settings from the environment (:func:`gpuscale.gpr.manager.config_from_env`) and picks the provider:
any provider of :mod:`gpuscale.providers.registry` by name: ``sim`` (the simulated cloud on wall-clock time, for
demos and tests; the server never imports the simulator) or ``linode``
(:class:`~gpuscale.providers.linode.LinodeProvider` from ``LINODE_TOKEN``, ``LINODE_CLUSTER_ID``, ``LINODE_REGION``;
a missing token is reported on the GPRs, never raised) or ``aws`` (:mod:`gpuscale.providers.aws_factory` from
``GPUSCALE_AWS_*``, ``AWS_REGION`` and boto3's credential chain; a bad setting is reported on the GPRs the same way).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuscale.clock import Clock, SystemClock
from gpuscale.controller.availability import Availability, SqliteStore
from gpuscale.core.durations import parse_egs_duration
from gpuscale.core.gpr import DEFAULT_MAX_EXIT_S, MAX_EXIT_CEILING_S
from gpuscale.errors import InputError
from gpuscale.gpr.manager import GprManager, Inventory, config_from_env
from gpuscale.gpr.store import GprStore
from gpuscale.providers.registry import ProviderSettings, provider_factory, provider_names

log = logging.getLogger("gpuscale.gpr.server")

TOKEN_ENV = "GPUSCALE_API_TOKEN"
MAX_EXIT_ENV = "GPUSCALE_MAX_EXIT_DURATION"
PROVIDERS = provider_names()
"""Provider names ``--provider`` accepts (:mod:`gpuscale.providers.registry`)."""


@dataclass(slots=True)
class ReconcileLoop:
    """Runs ``manager.reconcile()`` every ``interval_s`` seconds in a daemon thread until :meth:`stop`."""

    manager: GprManager
    interval_s: float = 5.0
    secrets: tuple[str, ...] = ()
    """Strings (the Linode token) replaced by ``***`` in everything the loop logs, tracebacks included."""
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpr-reconcile", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._stop is not None
        while not self._stop.is_set():
            try:
                report = self.manager.reconcile()
                for err in report.errors:
                    log.warning("reconcile: %s", self._scrub(str(err)))
            except Exception as exc:  # the loop must survive any single failed pass
                text = "".join(traceback.format_exception(exc))
                log.error("reconcile pass failed: %s", self._scrub(text))
            self._stop.wait(self.interval_s)

    def _scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "***")
        return text

    def stop(self, timeout: float = 10.0) -> None:
        """Stop and join the thread."""
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def build_manager(
    db: str | Path,
    *,
    provider: str = "sim",
    catalog: str = "linode",
    env: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    inventory: Inventory | None = None,
    sim_latency_s: float = 5.0,
) -> GprManager:
    """A :class:`GprManager` on the SQLite file ``db`` with the chosen provider and catalog."""
    env = os.environ if env is None else env
    clock = clock or SystemClock()
    if provider not in PROVIDERS:
        raise InputError("unknown provider", where="--provider", value=provider, fix=f"use one of {PROVIDERS}")
    from gpuscale.catalogs import load_catalog

    region = (env.get("LINODE_REGION") or None) if provider == "linode" else None
    if provider == "aws" and ":" not in catalog:
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    if provider == "gcp" and ":" not in catalog and env.get("GKE_LOCATION"):
        region = "-".join(env["GKE_LOCATION"].split("-")[:2])  # us-central1-a -> us-central1
    if provider == "alibaba" and ":" not in catalog:
        region = env.get("ACK_REGION") or None
    cat = load_catalog(catalog, region=region)
    cluster_env = {"aws": "GPUSCALE_AWS_CLUSTER", "gcp": "GKE_CLUSTER", "alibaba": "ACK_CLUSTER_ID"}
    cluster = env.get(cluster_env.get(provider, "LINODE_CLUSTER_ID"), "")
    config = config_from_env(env, provider=provider, cluster=cluster)
    max_exit = max_exit_from_env(env)
    store = GprStore(db)
    factory = provider_factory(provider, ProviderSettings(env, clock, cat, sim_latency_s=sim_latency_s))
    availability = Availability(SqliteStore(db))  # capacity marks survive a restart, in the same file
    return GprManager(
        store,
        cat,
        config=config,
        provider_factory=factory,
        inventory=inventory,
        clock=clock,
        max_exit_s=max_exit,
        availability=availability,
    )


def max_exit_from_env(env: Mapping[str, str]) -> int:
    """``GPUSCALE_MAX_EXIT_DURATION`` in seconds (a duration such as ``30d``; default 365 days, at most 100 years)."""
    raw = env.get(MAX_EXIT_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_EXIT_S
    seconds = parse_egs_duration(raw, where=f"environment variable {MAX_EXIT_ENV}")
    if not 0 < seconds <= MAX_EXIT_CEILING_S:
        raise InputError(
            "is out of range", where=f"environment variable {MAX_EXIT_ENV}", value=raw[:20], fix="use 1m to 36500d"
        )
    return seconds


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name the server binds to) is a loopback address."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts_for(host: str, extra: Sequence[str] = ()) -> frozenset[str] | None:
    """The ``Host`` names the API accepts when bound to ``host``: loopback names (plus ``extra``) for a loopback
    bind, which stops DNS-rebinding attacks from a browser; None (any) otherwise."""
    if not is_loopback(host):
        return None
    from gpuscale.gpr.api import LOOPBACK_HOSTS

    return frozenset(LOOPBACK_HOSTS) | {h.strip().lower() for h in extra if h.strip()}


def serve(
    db: str | Path,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    provider: str = "sim",
    catalog: str = "linode",
    interval_s: float = 5.0,
    env: Mapping[str, str] | None = None,
    log_level: str = "info",
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Run the API and the reconcile loop until interrupted."""
    import uvicorn

    from gpuscale.gpr.api import create_app

    env = os.environ if env is None else env
    token = env.get(TOKEN_ENV, "")
    if not token:
        raise InputError("is not set", where=f"environment variable {TOKEN_ENV}", fix="export a long random secret")
    manager = build_manager(db, provider=provider, catalog=catalog, env=env)
    aws_secrets = tuple(env.get(k, "") for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"))
    loop = ReconcileLoop(manager, interval_s, secrets=(env.get("LINODE_TOKEN", ""), token, *aws_secrets))
    loop.start()
    try:
        app = create_app(manager, token=token, allowed_hosts=allowed_hosts_for(host, allowed_hosts))
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        loop.stop()
        manager.store.close()
