"""Leader election over a ``coordination.k8s.io/v1`` Lease: the Kubernetes side of :mod:`gpuscale.core.leader`.

:class:`LeaderElector` reads the Lease, asks the core what to do and writes the result with the ``resourceVersion``
it read (a conflict means another replica won the round). :meth:`LeaderElector.run` repeats that every retry period
on lightkube's async client until stopped, then releases the Lease so a standby takes over at once. The controller
asks :meth:`LeaderElector.is_leader` before each reconcile: it turns False within the renew deadline of the last
successful renewal, so a replica that loses the API server or the Lease stops acting before anyone else may start.

RBAC: ``get``, ``create`` and ``update`` on ``leases`` in the controller's namespace (:data:`PERMISSIONS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from gpuscale.clock import Clock
from gpuscale.core.leader import (
    ElectionConfig,
    LeaseRecord,
    LeaseStep,
    Observation,
    desired,
    next_step,
    observe,
    released,
    should_act,
)

__all__ = ["PERMISSIONS", "LeaderElector", "LeaderStatus", "default_identity"]

log = logging.getLogger(__name__)

LEASES = "leases.coordination.k8s.io"
PERMISSIONS: frozenset[tuple[str, str]] = frozenset({("get", LEASES), ("create", LEASES), ("update", LEASES)})
"""The (verb, resource) pairs leader election uses, in the controller's own namespace."""
DEFAULT_LEASE = "gpuscale-controller"


def default_identity(env: Mapping[str, str] | None = None) -> str:
    """``$POD_NAME`` (the Deployment sets it), else the host name, plus a random suffix unique to this process."""
    env = os.environ if env is None else env
    base = env.get("POD_NAME") or socket.gethostname() or "gpuscale"
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _time(value: dt.datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def _stamp(t: float | None) -> dt.datetime | None:
    return None if t is None else dt.datetime.fromtimestamp(t, tz=dt.UTC)


def to_record(lease: Lease) -> LeaseRecord:
    """The core's view of a Lease object."""
    spec = lease.spec or LeaseSpec()
    return LeaseRecord(
        holder=spec.holderIdentity or "",
        duration_s=float(spec.leaseDurationSeconds or 0),
        acquired_at=_time(spec.acquireTime),
        renewed_at=_time(spec.renewTime),
        transitions=int(spec.leaseTransitions or 0),
    )


def to_spec(record: LeaseRecord) -> LeaseSpec:
    """A Lease ``spec`` from a core record (durations in whole seconds, at least 1)."""
    return LeaseSpec(
        holderIdentity=record.holder or None,
        leaseDurationSeconds=max(1, round(record.duration_s)),
        acquireTime=_stamp(record.acquired_at),
        renewTime=_stamp(record.renewed_at),
        leaseTransitions=record.transitions,
    )


@dataclass(frozen=True, slots=True)
class LeaderStatus:
    """What ``/readyz`` shows about the election."""

    identity: str
    leading: bool
    holder: str
    last_error: str


class LeaderElector:
    """Leader election for one replica (see the module docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        clock: Clock,
        *,
        namespace: str,
        name: str = DEFAULT_LEASE,
        identity: str | None = None,
        config: ElectionConfig | None = None,
    ) -> None:
        self.client = client
        self.clock = clock
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.config = config or ElectionConfig()
        problem = self.config.problem()
        if problem:
            raise ValueError(f"leader election timing: {problem}")
        self._obs: Observation | None = None
        self._lease: Lease | None = None
        self._last_renewed: float | None = None
        self.last_error = ""
        self.transitions = 0
        """How many times this replica became the leader."""

    # ------------------------------------------------------------------------------------------------ public
    def is_leader(self) -> bool:
        """True while this replica may act (its last renewal is younger than the renew deadline)."""
        return should_act(self._last_renewed, self.clock.now(), self.config)

    def status(self) -> LeaderStatus:
        """Whether this replica leads, who holds the Lease as last read, and the last failure (if any)."""
        holder = self._obs.record.holder if self._obs is not None else ""
        return LeaderStatus(self.identity, self.is_leader(), holder, self.last_error)

    async def try_once(self) -> bool:
        """One round: read the Lease, decide, write. True if this replica holds the Lease afterwards."""
        now = self.clock.now()
        try:
            lease = await self._get()
        except Exception as exc:  # the API server is unreachable or refused: leadership lapses on its own
            self._failed("read", exc)
            return False
        self._lease = lease
        self._obs = observe(self._obs, to_record(lease) if lease is not None else None, now)
        step = next_step(self._obs, self.identity, now)
        record = desired(self._obs, step, self.identity, now, self.config)
        if record is None:
            if self._last_renewed is not None:
                log.info("lease %s/%s is held by %s: standing by", self.namespace, self.name, self._obs_holder())
            self._last_renewed = None
            self.last_error = ""
            return False
        try:
            written = await self._write(step, record)
        except ApiError as exc:
            if exc.status.code == 409:
                self._obs = None  # another replica wrote first: read again next round
                self._last_renewed = None
                self.last_error = ""
                return False
            self._failed(str(step).lower(), exc)
            return False
        except Exception as exc:
            self._failed(str(step).lower(), exc)
            return False
        if step is not LeaseStep.RENEW or self._last_renewed is None:
            self.transitions += 1
            log.info("became the leader (lease %s/%s, %s)", self.namespace, self.name, step)
        self._lease = written
        self._obs = Observation(to_record(written), now)
        self._last_renewed = now
        self.last_error = ""
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Take part in the election every retry period until ``stop`` is set, then release the Lease."""
        while not stop.is_set():
            await self.try_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.retry_period_s)
        await self.release()

    async def release(self) -> bool:
        """Give the Lease up if this replica holds it (a standby takes over without waiting); True if released."""
        self._last_renewed = None
        lease = self._lease
        if lease is None:
            return False
        record = released(to_record(lease), self.identity)
        if record is None:
            return False
        try:
            self._lease = await self.client.replace(self._object(record, lease))
        except Exception as exc:
            self._failed("release", exc)
            return False
        log.info("released lease %s/%s", self.namespace, self.name)
        return True

    # ------------------------------------------------------------------------------------------------ private
    async def _get(self) -> Lease | None:
        try:
            return await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    async def _write(self, step: LeaseStep, record: LeaseRecord) -> Lease:
        if step is LeaseStep.CREATE:
            return await self.client.create(self._object(record, None))
        return await self.client.replace(self._object(record, self._lease))

    def _object(self, record: LeaseRecord, current: Lease | None) -> Lease:
        version = current.metadata.resourceVersion if current is not None and current.metadata else None
        meta = ObjectMeta(name=self.name, namespace=self.namespace, resourceVersion=version)
        return Lease(metadata=meta, spec=to_spec(record))

    def _obs_holder(self) -> str:
        return self._obs.record.holder if self._obs is not None else ""

    def _failed(self, what: str, exc: Exception) -> None:
        code = f"HTTP {exc.status.code} " if isinstance(exc, ApiError) else ""
        self.last_error = f"cannot {what} lease {self.namespace}/{self.name}: {code}{type(exc).__name__}: {exc}"
        log.warning("%s", self.last_error)
