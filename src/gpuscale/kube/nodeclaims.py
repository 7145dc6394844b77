"""GPUNodeClaim objects: the cluster's record of every claim in the controller's claim table.

:class:`NodeClaimWriter` follows the claim table's change feed (:attr:`ClaimTable.listener
<gpuscale.controller.claims.ClaimTable.listener>`) and keeps one cluster-scoped ``GPUNodeClaim`` per claim, the
nodes launched for GPRs included, named after the claim's key (:func:`~gpuscale.manifests.nodeclaims.object_name`:
the request id, ``<request id>.<node id>`` for a second node of one request; :mod:`gpuscale.manifests.nodeclaims`
is the codec):

- a new claim's object is created at once (a Requested one before the launch call of the same round is made, so a
  controller that dies between the call and the node's listing leaves a record naming the request id; a GPR node's
  as soon as its launch returned);
- every later change (phase, provider id, node name, reason, since, launch attempts) is one JSON merge patch of the
  status subresource, of the claim's latest state only (changes made meanwhile are coalesced);
- a claim that leaves the table (its node is gone) has its object deleted;
- an object deleted by someone else (``kubectl delete``) while its claim lives is created again at the next
  :meth:`NodeClaimWriter.flush` after the cache's watch showed the delete.

Writes never block a round: they run on the client's loop (as Events do), at most :data:`WRITES` at a time, one at a
time per object; a failed write is retried in a later round once its due time has come (1 s, doubling up to 60 s),
never slept on.

A restarted controller calls :meth:`NodeClaimWriter.restore` before its first round: the cached objects are read
(one that cannot be read is logged, reported as a Warning Event and ignored), matched with the provider's node list
by :func:`gpuscale.core.reconcile.claims.restore_claims`, the table is seeded, and records of nodes that are gone are
deleted. Records of GPR nodes are restored only when this controller serves GPRs (else they are another
engine's and left alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from lightkube.types import PatchType

from gpuscale.clock import Clock
from gpuscale.controller.backend import Event
from gpuscale.core.nodeclaim import ClaimPhase, NodeClaim
from gpuscale.core.reconcile.claims import Restored, restore_claims
from gpuscale.core.reconcile.launching import capped_backoff_s
from gpuscale.core.reconcile.records import Fleet
from gpuscale.errors import ProviderError
from gpuscale.kube.cache import GPUNodeClaim, KubeCache
from gpuscale.kube.client import KubeClient, as_kube_error
from gpuscale.kube.events import EventRecorder
from gpuscale.manifests.nodeclaims import STATUS_FIELDS, claim_object, object_name, read_record, recordable_key
from gpuscale.manifests.problems import Doc
from gpuscale.providers.base import CloudNodeState

if TYPE_CHECKING:
    from gpuscale.controller.claims import ClaimTable
    from gpuscale.controller.loop import Controller
    from gpuscale.core.model import Node

__all__ = ["RESOURCE", "WRITES", "NodeClaimWriter", "recordable"]

log = logging.getLogger(__name__)

RESOURCE = "gpunodeclaims.gpuscale.io"
CACHED = "gpunodeclaims"
"""The records' name in the cache."""
WRITES = 2
"""GPUNodeClaim writes in flight at once (they queue behind nothing a round waits for)."""
RETRY_MIN_S = 1.0
RETRY_MAX_S = 60.0
Obj = dict[str, Any]


def recordable(key: str) -> bool:
    """True if the claim ``key`` gets a GPUNodeClaim: gpuscale's request id, with ``#<node id>`` for a second node
    of one request (:data:`~gpuscale.manifests.nodeclaims.KEY_PATTERN`), at most 253 characters."""
    return recordable_key(key)


def _implied(obj: Obj) -> Obj:
    """The status an object without one stands for: Requested since its request."""
    return {"phase": str(ClaimPhase.REQUESTED), "phaseSince": obj["spec"]["requestedAt"]}


def _merge(old: Obj | None, new: Obj) -> Obj:
    """The merge patch turning status ``old`` (None: unknown) into ``new`` (fields left out are removed)."""
    patch: Obj = {k: v for k, v in new.items() if old is None or old.get(k) != v}
    for k in STATUS_FIELDS if old is None else old:
        if k not in new:
            patch[k] = None
    return patch


class NodeClaimWriter:
    """Keeps a GPUNodeClaim per recordable claim of a claim table (see the module docstring). ``attempts`` gives a
    claim's failed launch attempts (the launcher's count); ``cache`` (watching the records) shows deletes made by
    others."""

    def __init__(
        self,
        client: KubeClient,
        clock: Clock,
        *,
        events: EventRecorder | None = None,
        attempts: Callable[[str], int] | None = None,
        cache: KubeCache | None = None,
    ) -> None:
        self.client = client
        self.clock = clock
        self.events = events
        self.attempts = attempts or (lambda key: 0)
        self.cache = cache
        self._cache_version = -1
        self._seen: set[str] = set()
        """Keys whose object the cache has shown since it was last written (gone from it: deleted by someone)."""
        self.recreated = 0
        """Objects created again after someone else deleted them."""
        self.table: ClaimTable | None = None
        self.restored = False
        """True once :meth:`restore` ran."""
        self._lock = threading.Lock()
        self._want: dict[str, Obj | None] = {}
        """Key -> the object to have (None: no object), until a worker has written it."""
        self._have: dict[str, Obj] = {}
        """Key -> the status the server's object has (as last read or written)."""
        self._bad: set[str] = set()
        """Names of objects that could not be read: replaced (deleted, then created) when their key is written."""
        self._dirty: set[str] = set()
        self._running: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._gate: asyncio.Semaphore | None = None
        self._tries: dict[str, int] = {}
        """Key -> the launch attempts last recorded (kept by the controller's thread only)."""
        self.pending: list[Future[Any]] = []
        self.writes = 0
        """API calls made (creates, status patches, deletes)."""
        self.failed = 0
        self.warnings: list[str] = []
        """Every record :meth:`load` could not read (also logged and sent as Events)."""

    # ------------------------------------------------------------------------------------------------ the feed
    def attach(self, table: ClaimTable) -> None:
        """Follow ``table``'s changes."""
        self.table = table
        table.listener = self.changed

    def changed(self, key: str, claim: NodeClaim | None) -> None:
        """The claim table's listener: ``claim`` is ``key``'s new claim, None when it left the table. A new
        Requested claim is written at once; anything else on the next :meth:`flush`."""
        if not recordable(key):
            return
        tries = 0 if claim is None else self.attempts(key)
        want = None if claim is None else claim_object(claim, tries, key)
        if tries:
            self._tries[key] = tries
        else:
            self._tries.pop(key, None)
        with self._lock:
            self._want[key] = want
            start = claim is not None and key not in self._have  # a new claim: created at once
            start = start and key not in self._running and key not in self._retry_at
            if not start:
                self._dirty.add(key)
                return
            self._running.add(key)
        self._spawn(key)

    def forget(self, key: str) -> None:
        """Delete ``key``'s object (on the next :meth:`flush`)."""
        self.changed(key, None)

    def flush(self) -> int:
        """Start the writes that are due (changes since the last flush, failed writes whose retry time has come, and
        launch attempts that changed); returns how many were started. Never waits for them."""
        now = self.clock.now()
        if self.cache is not None and self.cache.versions[CACHED] != self._cache_version:
            self._deleted_by_others()
        if self.table is not None:
            for key, c in self.table.in_phases((ClaimPhase.REQUESTED,)):
                if self.attempts(key) != self._tries.get(key, 0):
                    self.changed(key, c)
        started: list[str] = []
        with self._lock:
            for k in [k for k in self._dirty if k not in self._running]:
                if self._retry_at.get(k, -float("inf")) > now:
                    continue
                self._dirty.discard(k)
                if k not in self._want:
                    continue  # written meanwhile
                want = self._want[k]
                bad = object_name(k) in self._bad
                if want is None and k not in self._have and not bad:
                    del self._want[k]  # never written: nothing to delete
                    self._retry_at.pop(k, None)
                    self._failures.pop(k, None)
                    continue
                if want is not None and self._have.get(k) == want["status"] and not bad:
                    del self._want[k]  # the server has it already
                    continue
                self._running.add(k)
                started.append(k)
        for k in started:
            self._spawn(k)
        return len(started)

    def _deleted_by_others(self) -> None:
        """Objects the cache showed and no longer shows while no write of this writer is in flight for them: deleted
        by someone else. A live claim's object is written again (created) on this flush."""
        assert self.cache is not None
        self._cache_version = self.cache.versions[CACHED]
        names = {str((o.get("metadata") or {}).get("name", "")) for o in self.cache.objects(CACHED)}
        gone: list[str] = []
        with self._lock:
            for key in self._have:
                if object_name(key) in names:
                    self._seen.add(key)
                elif key in self._seen:
                    if key in self._running:
                        self._cache_version = -1  # a write in flight: looked at again on the next flush
                    else:
                        gone.append(key)
            for key in gone:
                self._seen.discard(key)
                del self._have[key]
        for key in gone:
            claim = self.table.get(key) if self.table is not None else None
            if claim is None:
                continue
            log.info("GPUNodeClaim %s was deleted by someone else: created again", object_name(key))
            self.recreated += 1
            with self._lock:
                self._want[key] = claim_object(claim, self.attempts(key), key)
                self._dirty.add(key)

    @property
    def busy(self) -> bool:
        """Writes in flight or waiting."""
        with self._lock:
            return bool(self._running or self._dirty)

    def settle(self, timeout: float = 5.0) -> None:
        """Wait for the writes in flight (tests and shutdown)."""
        for f in list(self.pending):
            with contextlib.suppress(Exception):  # failures are logged by the worker
                f.result(timeout)
        self.pending = [f for f in self.pending if not f.done()]

    # ------------------------------------------------------------------------------------------------ writing
    def _spawn(self, key: str) -> None:
        self.pending = [f for f in self.pending if not f.done()]
        self.pending.append(self.client.spawn(self._sync(key)))

    async def _sync(self, key: str) -> None:
        """Write ``key``'s latest wanted state, then any state wanted meanwhile, one call at a time."""
        if self._gate is None:  # made on the client's loop, where it is used
            self._gate = asyncio.Semaphore(WRITES)
        verb = "create"
        vanished = False
        try:
            async with self._gate:
                while True:
                    with self._lock:
                        if key not in self._want:
                            self._running.discard(key)
                            return
                        want = self._want[key]
                        have = self._have.get(key)
                        bad = object_name(key) in self._bad
                    if want is None:
                        if have is not None or bad:
                            verb = "delete"
                            await self._delete(key)
                    elif have is None or bad:
                        if bad:
                            verb = "delete"
                            await self._delete(key)
                        verb = "create"
                        have = await self._create(key, want)
                    if want is not None and have != want["status"]:
                        verb = "patch"
                        have = await self._patch(key, have, want["status"])
                        if have is None:  # deleted by someone else: created again, once per call
                            if vanished:
                                raise LookupError(f"{object_name(key)} is not found for its status patch")
                            vanished = True
                            continue
                    with self._lock:
                        if self._want.get(key, self) is want:
                            self._want.pop(key)
                            self._running.discard(key)
                            self._retry_at.pop(key, None)
                            self._failures.pop(key, None)
                            return
        except asyncio.CancelledError:
            with self._lock:
                self._running.discard(key)
            raise
        except Exception as exc:  # the server refused or cannot be reached: a later round retries
            err = as_kube_error(exc, verb, RESOURCE + ("/status" if verb == "patch" else ""))
            with self._lock:
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                self._retry_at[key] = self.clock.now() + capped_backoff_s(n, RETRY_MIN_S, RETRY_MAX_S)
                self._running.discard(key)
                self._dirty.add(key)
                self.failed += 1
            log.info("GPUNodeClaim %s not written (retried later): %s", key, err.describe())

    async def _create(self, key: str, want: Obj) -> Obj | None:
        """Create the object; the status it stands for afterwards (None: an object that was there already, whose
        status is unknown)."""
        self.writes += 1
        try:
            await self.client.api.create(GPUNodeClaim.from_dict(want))
        except Exception as exc:
            if as_kube_error(exc, "create", RESOURCE).status != 409:
                raise
            with self._lock:
                self._have.pop(key, None)
            return None
        status = _implied(want)
        with self._lock:
            self._have[key] = status
            self._seen.discard(key)
            self._bad.discard(object_name(key))
        return status

    async def _patch(self, key: str, have: Obj | None, status: Obj) -> Obj | None:
        self.writes += 1
        body = {"status": _merge(have, status)}
        try:
            await self.client.api.patch(GPUNodeClaim.Status, object_name(key), body, patch_type=PatchType.MERGE)
        except Exception as exc:
            if as_kube_error(exc, "patch", RESOURCE + "/status").status != 404:
                raise
            with self._lock:  # deleted by someone else: created again by the caller
                self._have.pop(key, None)
                self._seen.discard(key)
            return None
        with self._lock:
            self._have[key] = status
        return status

    async def _delete(self, key: str) -> None:
        self.writes += 1
        try:
            await self.client.api.delete(GPUNodeClaim, object_name(key))
        except Exception as exc:
            if as_kube_error(exc, "delete", RESOURCE).status != 404:
                raise
        with self._lock:
            self._have.pop(key, None)
            self._seen.discard(key)
            self._bad.discard(object_name(key))

    # ------------------------------------------------------------------------------------------------ reading
    def load(self, objects: Iterable[Obj]) -> tuple[dict[str, NodeClaim], dict[str, int]]:
        """The claims (by key) and failed launch attempts the ``objects`` record; remembers what the server has. An
        object that cannot be read is logged, reported as a Warning Event and left out."""
        claims: dict[str, NodeClaim] = {}
        attempts: dict[str, int] = {}
        for obj in objects:
            name = str((obj.get("metadata") or {}).get("name", ""))
            doc = Doc(source=f"GPUNodeClaim {name}", index=1, line=None, problems=[])
            got = read_record(doc, obj)
            if got is None:
                text = "; ".join(str(p) for p in doc.problems) or "unreadable"
                self.warnings.append(f"GPUNodeClaim {name}: {text}")
                log.warning("GPUNodeClaim %s ignored: %s", name, text)
                if self.events is not None:
                    self.events.object_event(obj, "BadNodeClaim", "Warning", f"ignored by the controller: {text}")
                with self._lock:
                    self._bad.add(name)
                continue
            claim, n = got
            key = claim.request_id
            claims[key] = claim
            attempts[key] = n
            with self._lock:
                self._have[key] = dict(obj.get("status") or _implied(obj))
        return claims, attempts

    def restore(self, controller: Controller, objects: Iterable[Obj], nodes: Mapping[str, Node]) -> Restored | None:
        """Seed ``controller``'s empty claim table from the GPUNodeClaim ``objects`` and the provider's node list,
        delete the records of nodes that are gone, and follow the table from now on. None (nothing done; call again
        next round) when the provider cannot list its nodes."""
        now = self.clock.now()
        try:
            cloud = [c for c in controller.provider.list_nodes() if c.state is not CloudNodeState.GONE]
        except ProviderError as exc:
            log.warning("claims not restored yet (the provider's node list failed): %s", exc)
            return None
        records, attempts = self.load(objects)
        fleet = Fleet(controller.pools, controller.catalog.by_name())
        rules = controller.config.rules()
        restored = restore_claims(records, cloud, nodes, fleet, rules, now, foreign=controller.gpr.foreign)
        self.attach(controller.claims)
        for key, claim in restored.claims.items():
            if attempts.get(key):
                controller.launcher.attempts[key] = attempts[key]
            controller.claims[key] = claim
        for key in restored.stale:
            self.forget(key)
        for note in restored.notes:
            controller.backend.record(Event(now, str(note.kind), note.object, note.reason, note.message, note.data))
        self.restored = True
        log.info("claims restored from %d GPUNodeClaim(s): %d kept, %d stale", len(records), len(restored.claims),
                 len(restored.stale))  # fmt: skip
        return restored
