"""Leader election, ``/healthz``, ``/readyz`` and ``/metrics`` around one controller process.

The ``controller`` command builds one :class:`ProcessEndpoints` next to its cache, then per round::

    if endpoints.may_act():                     # leader (or leader election off)
        result = controller.reconcile()
    endpoints.after_round(controller.claims.values(), backend.list_pods(), result, seconds)

and :meth:`ProcessEndpoints.close` on shutdown (which releases the Lease, so a standby takes over at once). The
elector runs on the Kubernetes client's event loop; the HTTP servers run in their own threads, so probes are answered
while a round is in progress.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from gpuscale.clock import Clock
from gpuscale.core.leader import ElectionConfig
from gpuscale.core.model import Pod
from gpuscale.core.nodeclaim import NodeClaim
from gpuscale.kube.client import KubeClient
from gpuscale.kube.health import EndpointServer, Health, cache_check, leader_check
from gpuscale.kube.leader import DEFAULT_LEASE, LeaderElector
from gpuscale.kube.metrics import ControllerMetrics, Measurement, QueuedGpr, RoundResult

__all__ = ["ProcessEndpoints"]

log = logging.getLogger(__name__)


class ProcessEndpoints:
    """See the module docstring. ``cache`` is the process's :class:`~gpuscale.kube.cache.KubeCache`."""

    def __init__(
        self,
        client: KubeClient,
        cache: Any,
        clock: Clock,
        *,
        namespace: str,
        leader_elect: bool,
        metrics_port: int,
        health_port: int,
        host: str = "0.0.0.0",
        identity: str | None = None,
        lease_name: str = DEFAULT_LEASE,
        election: ElectionConfig | None = None,
        stall_after_s: float = 300.0,
    ) -> None:
        self.client = client
        self.metrics = ControllerMetrics()
        self.health = Health(clock, stall_after_s=stall_after_s)
        self.health.add("cache", cache_check(cache))
        self.elector: LeaderElector | None = None
        if leader_elect:
            self.elector = LeaderElector(
                client.api, clock, namespace=namespace, name=lease_name, identity=identity, config=election
            )
            self.health.add("leader-election", leader_check(self.elector))
        if metrics_port == health_port != 0:  # one port for all three (port 0: two ephemeral ports)
            self.servers = [EndpointServer(health_port, health=self.health, registry=self.metrics.registry, host=host)]
        else:
            self.servers = [
                EndpointServer(metrics_port, registry=self.metrics.registry, host=host),
                EndpointServer(health_port, health=self.health, host=host),
            ]
        self._stop: asyncio.Event | None = None
        self._election: Future[Any] | None = None

    def start(self) -> ProcessEndpoints:
        """Serve the endpoints and, with leader election, take part in it on the client's loop."""
        for server in self.servers:
            server.start()
        if self.elector is not None:
            elector = self.elector

            async def make() -> asyncio.Event:
                return asyncio.Event()

            self._stop = self.client.run(make())
            self._election = self.client.spawn(elector.run(self._stop))
        return self

    @property
    def ports(self) -> list[int]:
        """The bound ports (metrics first when they differ)."""
        return [s.port for s in self.servers]

    def may_act(self) -> bool:
        """True if this replica may reconcile: leader election is off, or it holds the Lease."""
        return self.elector is None or self.elector.is_leader()

    def after_round(
        self,
        claims: Iterable[NodeClaim],
        pods: Iterable[Pod],
        result: RoundResult | None,
        seconds: float | None,
        *,
        gprs: Iterable[QueuedGpr] = (),
    ) -> Measurement:
        """Heartbeat for ``/healthz`` and the metrics of the round (a standby reports with ``result`` None)."""
        self.health.beat()
        return self.metrics.observe(
            claims, pods, self.health.clock.now(), gprs=gprs, result=result, round_seconds=seconds
        )

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the election (releasing the Lease if held) and the HTTP servers."""
        if self._stop is not None and self._election is not None:
            self.client.loop.call_soon_threadsafe(self._stop.set)
            try:
                self._election.result(timeout_s)
            except Exception as exc:  # shutting down: report, do not raise
                log.warning("leader election did not stop cleanly: %s", exc)
            self._stop = self._election = None
        for server in self.servers:
            server.close()
