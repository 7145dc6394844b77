"""What the node-pool providers that never wait on the cloud (GKE, ACK) share.

A launch there reserves *slots* in the offering's pool and returns them at once as provisioning nodes (node id
``<pool name>/<request key>/<slot>``); the cloud's work moves on each time the provider reads it, so ``list_nodes``
and ``poll_errors`` both observe first. A slot the cloud could not fill becomes a ``LAUNCH_FAILED`` event, and an
offering that ran out of stock is refused at once until its mark expires. :class:`SlotProvider` holds that part;
each provider keeps its pools, its calls and its error mapping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Generic, TypeVar

from gpuscale.clock import Clock, SystemClock
from gpuscale.core.model import CapacityType
from gpuscale.errors import InsufficientCapacity, ProviderError
from gpuscale.providers.base import CloudNode, CloudNodeState, LaunchRequest, ProviderEvent, ProviderEventKind

PoolT = TypeVar("PoolT")
Offering = tuple[str, str, CapacityType]
"""(instance type, zone, capacity type)."""


def slot_id(pool: str, key: str, slot: int) -> str:
    """The node id of a launch's slot: ``<pool name>/<request key>/<slot>``."""
    return f"{pool}/{key}/{slot}"


class SlotProvider(Generic[PoolT]):
    """The shared part of a slot-reserving pool provider. A subclass sets ``name``, calls ``__init__`` and
    defines ``_observe`` (read the pools, move pending work on) and ``_nodes`` (the pools' nodes and open slots)."""

    name: str

    def __init__(self, clock: Clock | None, unavailable_ttl_s: float) -> None:
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._events: list[ProviderEvent] = []
        self._unavailable: dict[Offering, float] = {}
        self._unavailable_ttl_s = unavailable_ttl_s

    def _observe(self) -> Mapping[str, PoolT]:
        raise NotImplementedError

    def _nodes(self, pools: Mapping[str, PoolT]) -> list[CloudNode]:
        raise NotImplementedError

    def list_nodes(self) -> Sequence[CloudNode]:
        """gpuscale's nodes: those of its pools, and the slots still waiting for one."""
        with self._lock:
            return self._nodes(self._observe())

    def poll_errors(self) -> Sequence[ProviderEvent]:
        """Carry pending work on and return the asynchronous failures found since the last call."""
        with self._lock:
            self._observe()
            events, self._events = self._events, []
            return events

    # --- offerings out of stock ------------------------------------------------------------------------------------
    def unavailable_offerings(self) -> dict[Offering, float]:
        """(instance type, zone, capacity type) -> until when it is marked unavailable after a stockout."""
        now = self.clock.now()
        with self._lock:
            return {k: t for k, t in self._unavailable.items() if t > now}

    def _mark_unavailable(self, instance_type: str, zone: str, capacity_type: CapacityType) -> None:
        self._unavailable[(instance_type, zone, capacity_type)] = self.clock.now() + self._unavailable_ttl_s

    def _mark_request_unavailable(self, request: LaunchRequest) -> None:
        self._mark_unavailable(request.instance_type, request.zone, request.capacity_type)

    def _refuse_if_out_of_stock(self, request: LaunchRequest, why: str) -> None:
        """Raise :class:`InsufficientCapacity` (``why``: how the cloud said so) while the offering is marked."""
        offering = (request.instance_type, request.zone, request.capacity_type)
        if self._unavailable.get(offering, -1.0) > self.clock.now():
            raise InsufficientCapacity(
                f"{self.name}: {request.instance_type} {request.capacity_type} in {request.zone} {why}",
                provider=self.name,
            )

    # --- slots -----------------------------------------------------------------------------------------------------
    @staticmethod
    def _open_slots(request: LaunchRequest, pool: str, key: str, slots: Iterable[int], at: float) -> list[CloudNode]:
        """A launch's open slots as provisioning nodes (reserved at ``at``)."""
        return [
            CloudNode(
                slot_id(pool, key, i),
                request.request_id,
                request.pool,
                request.instance_type,
                request.zone,
                request.capacity_type,
                CloudNodeState.PROVISIONING,
                created_at=at,
                labels=dict(request.labels),
            )
            for i in slots
        ]

    def _launch_failed(self, pool: str, key: str, request_id: str, slots: Iterable[int], err: ProviderError) -> None:
        """Report each of these slots as a ``LAUNCH_FAILED`` event (with ``err`` as its message)."""
        for i in slots:
            self._events.append(
                ProviderEvent(
                    ProviderEventKind.LAUNCH_FAILED,
                    node_id=slot_id(pool, key, i),
                    request_id=request_id,
                    message=str(err),
                    at=self.clock.now(),
                )
            )
