"""The simulated cloud on wall-clock time: a provider for demos and tests of the GPR server (``--provider sim``).

Registered as ``sim`` in :mod:`gpuscale.providers.registry`, which reaches it by name, so the server never imports
the simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from gpuscale.clock import Clock
from gpuscale.core.model import Catalog
from gpuscale.providers.base import CloudNode, LaunchRequest, ProviderCapabilities, ProviderEvent
from gpuscale.providers.registry import ProviderSettings
from gpuscale.sim.cloud import CloudBehaviour, SimCloud
from gpuscale.sim.engine import Dist, Engine


class WallClockSimCloud:
    """A :class:`~gpuscale.sim.cloud.SimCloud` whose virtual time follows ``clock``: every call first runs the
    simulation up to now. Launch and registration take ``latency_s`` each."""

    name = "sim"

    def __init__(self, catalog: Catalog, clock: Clock, *, latency_s: float = 5.0, seed: int = 0) -> None:
        self.clock = clock
        self.engine = Engine(start=clock.now())
        d = Dist.const(latency_s)
        behaviour = CloudBehaviour(
            launch_latency=d, registration_latency=d, device_plugin_delay=Dist.const(0.0), deletion_latency=d
        )
        self.cloud = SimCloud(self.engine, catalog, behaviour, seed=seed)
        self._lock = threading.Lock()

    def _sync(self) -> None:
        self.engine.run_until(max(self.engine.now(), self.clock.now()))

    @property
    def capabilities(self) -> ProviderCapabilities:
        """The simulated cloud's capabilities."""
        return self.cloud.capabilities

    def launch(self, request: LaunchRequest) -> Sequence[CloudNode]:
        """Launch (idempotent by request id)."""
        with self._lock:
            self._sync()
            return self.cloud.launch(request)

    def delete_node(self, node_id: str) -> None:
        """Delete one node."""
        with self._lock:
            self._sync()
            self.cloud.delete_node(node_id)

    def list_nodes(self) -> Sequence[CloudNode]:
        """Nodes not gone."""
        with self._lock:
            self._sync()
            return self.cloud.list_nodes()

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Events since the last call."""
        with self._lock:
            self._sync()
            return self.cloud.poll_errors()


def wall_clock_sim_provider(settings: ProviderSettings) -> WallClockSimCloud:
    """The registry's ``sim`` factory: the simulated cloud on ``settings.clock`` for ``settings.catalog``."""
    return WallClockSimCloud(settings.catalog, settings.clock, latency_s=settings.sim_latency_s)
