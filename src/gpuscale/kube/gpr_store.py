"""GPRs as GPUProvisioningRequest custom resources: the GPR manager's store in ``gpuscale controller``.

:class:`KubeGprStore` implements :class:`~gpuscale.gpr.ports.GprStorePort` on the GPR objects of the cluster, so
the same :class:`~gpuscale.gpr.manager.GprManager` (and the same core planner) serves GPRs applied with ``kubectl``
as ``gpuscale serve`` serves REST-created ones from SQLite.

* **Ids.** A GPR's ``gprId`` is ``gpr-`` and the first 12 hex digits of the object's ``metadata.uid`` (unique,
  stable, a valid label value: it is the ``gpuscale.io/gpr`` node label and taint). It is written to
  ``status.gprId`` at admission and read from there afterwards; the object is found by its namespace and name.
* **Spec.** :meth:`KubeGprStore.sync` reads each new object's ``spec`` with the core reader against the catalog. A
  valid spec is admitted: ``status`` gets the ``Queued`` state and ``status.gpuscale`` the accepted spec. An invalid
  one gets the condition ``Invalid`` (reason ``InvalidSpec``, the message naming each field and its problem) and a
  Warning Event, once per change of the spec; fixing the spec admits it. Spec edits after admission are not
  applied, except ``priority`` of a GPR that is not final (as the REST API's priority update).
* **Status.** Written only through the status subresource, as a JSON merge patch carrying
  ``metadata.resourceVersion``: a 409 Conflict means someone changed the object since it was read. A plan
  (:meth:`apply`) then raises :class:`~gpuscale.gpr.store.StaleWrite` and is planned again next round; a single
  GPR change (:meth:`modify`) re-reads the object and retries. Objects are read from the controller's watch cache or,
  when newer, from this store's own last write. ``status`` holds the EGS fields (printer columns), ``conditions``
  (``Ready``, ``Queued``) and ``gpuscale``: the lossless record, the accepted spec, the admission time and the
  pending journal entries.
* **Journal.** The manager's write-ahead entries of a GPR (launch, delete, assign) are kept in its
  ``status.gpuscale.journal`` until done, so a restarted controller lists them as in doubt; launches are redone
  idempotently under the same deterministic request id, so a restart neither leaks nor doubles a node. A plan
  touching several GPRs is written object by object: a conflict part-way leaves the earlier objects written, which
  is the same as a crash after those writes (write-ahead: nothing acted yet) and is recovered the same way.
* **Deletion.** Deleting the object drops the GPR: its launched nodes are deleted by the next round (the planner
  deletes launched nodes no GPR holds).
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lightkube.types import PatchType

from gpuscale.clock import Clock
from gpuscale.core.gpr import (
    DEFAULT_MAX_EXIT_S,
    FINAL_STATES,
    Gpr,
    GprState,
    GprValidationError,
    TransitionRecord,
    Trigger,
    new_gpr,
    parse_gpr_spec,
    spec_from_dict,
    spec_to_dict,
    status_from_record,
    status_to_dict,
    status_to_record,
    with_priority,
)
from gpuscale.core.model import Catalog
from gpuscale.errors import GpuscaleError, InputError, shorten
from gpuscale.gpr.store import CorruptGpr, GprNotFound, JournalEntry, StaleWrite, Stored
from gpuscale.kube.cache import GPUProvisioningRequest, KubeCache, raw
from gpuscale.kube.client import KubeClient, KubeError
from gpuscale.kube.events import EventRecorder

__all__ = ["RECORD_FIELD", "KubeGprStore", "event_reason", "gpr_id_for"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RESOURCE = "gpuprovisioningrequests"
RECORD_FIELD = "gpuscale"
"""``status.gpuscale``: the manager's record (``record``, ``spec``, ``createdAt``, ``journal``)."""
MODIFY_ATTEMPTS = 3


def gpr_id_for(obj: Obj) -> str:
    """The gprId of a GPR object: ``status.gprId`` once admitted, else ``gpr-`` + 12 hex digits of its uid."""
    st = obj.get("status") or {}
    if st.get("gprId"):
        return str(st["gprId"])
    uid = str((obj.get("metadata") or {}).get("uid", "")).replace("-", "").lower()
    return f"gpr-{uid[:12]}"


def event_reason(t: TransitionRecord) -> tuple[str, str]:
    """(reason, type) of the Event for a GPR transition."""
    if t.trigger is Trigger.EXIT_DURATION:
        return "Expired", "Normal"
    if t.to_state is GprState.FAILED:
        return "Failed", "Warning"
    if t.to_state is GprState.EVICTED:
        return "Evicted", "Warning"
    return t.to_state.value, "Normal"


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _version(rv: str) -> int:
    """An int for a resourceVersion (etcd revisions are decimal; anything else is hashed)."""
    return int(rv) if rv.isdigit() else zlib.crc32(rv.encode())


def _ts(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(gpr: Gpr, old: Sequence[Obj], now: float) -> list[Obj]:
    """``Ready`` (nodes reserved and ready) and ``Queued`` (waiting), keeping transition times of unchanged ones."""
    st = gpr.status
    ready = gpr.state is GprState.PROVISIONED
    queued = gpr.state is GprState.QUEUED
    wanted = [
        ("Ready", ready, "NodesReady" if ready else gpr.state.value, st.failure_reason or f"GPR is {gpr.state}"),
        ("Queued", queued, "Waiting" if queued else gpr.state.value, st.failure_reason or f"GPR is {gpr.state}"),
    ]
    before = {c.get("type"): c for c in old}
    out = []
    for ctype, flag, reason, message in wanted:
        status = "True" if flag else "False"
        prev = before.get(ctype) or {}
        since = prev.get("lastTransitionTime") if prev.get("status") == status else None
        out.append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or _ts(now),
            }
        )
    return out


class KubeGprStore:
    """The GPR manager's store on GPUProvisioningRequest objects (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        cache: KubeCache,
        catalog: Catalog,
        clock: Clock,
        *,
        events: EventRecorder | None = None,
        max_exit_s: int = DEFAULT_MAX_EXIT_S,
    ) -> None:
        self.client = client
        self.cache = cache
        self.catalog = catalog
        self.clock = clock
        self.events = events
        self.max_exit_s = max_exit_s
        self._lock = threading.RLock()
        self._written: dict[str, Obj] = {}
        """Our last write of each object (newer than the cache until the watch delivers it)."""
        self._keys: dict[str, str] = {}
        """gprId -> ``namespace/name``."""
        self._pending: dict[int, JournalEntry] = {}
        self._done: list[JournalEntry] = []
        self._next_id = 1
        self._checked: dict[str, str] = {}
        """``namespace/name`` -> the uid and spec found invalid (not read again until they change)."""

    def close(self) -> None:
        """Nothing to release: the client and cache belong to the controller process."""

    # ------------------------------------------------------------------------------------------------ objects
    def _objects(self) -> dict[str, Obj]:
        """Every GPR object, the freshest of the cache's copy and our own last write."""
        out = {_key(o): o for o in self.cache.objects(RESOURCE)}
        with self._lock:
            for key, mine in list(self._written.items()):
                cached = out.get(key)
                if cached is None:
                    self._written.pop(key)  # deleted (or not yet seen: then it reappears from the cache)
                elif _version(_rv(mine)) > _version(_rv(cached)):
                    out[key] = mine
        return out

    def _fresh(self, key: str) -> Obj:
        """The object read from the API server (after a conflict)."""
        ns, name = key.split("/", 1)
        try:
            got = self.client.run(
                self.client.api.get(GPUProvisioningRequest, name, namespace=ns), verb="get", resource=RESOURCE
            )
        except KubeError as exc:
            if exc.status == 404:
                raise GprNotFound(f"GPR object {key} is gone") from exc
            raise
        obj = raw(got)
        with self._lock:
            self._written[key] = obj
        return obj

    def _patch_status(self, obj: Obj, status: Obj) -> Obj:
        """Merge-patch ``status`` with the object's resourceVersion as precondition; raises :class:`KubeError`."""
        meta = obj["metadata"]
        body = {"metadata": {"resourceVersion": _rv(obj)}, "status": status}
        got = self.client.run(
            self.client.api.patch(
                GPUProvisioningRequest.Status, meta["name"], body, namespace=meta["namespace"],
                patch_type=PatchType.MERGE,
            ),
            verb="patch",
            resource=f"{RESOURCE}/status",
        )  # fmt: skip
        new = raw(got)
        with self._lock:
            self._written[_key(new)] = new
        return new

    def _decode(self, obj: Obj) -> Stored:
        rec = (obj.get("status") or {}).get(RECORD_FIELD) or {}
        gpr_id = gpr_id_for(obj)
        try:
            spec = spec_from_dict(rec["spec"], max_exit_s=self.max_exit_s)
            status = status_from_record(rec["record"])
            gpr = Gpr(gpr_id, spec, status, float(rec["createdAt"]))
        except (ValueError, TypeError, KeyError, AttributeError, GpuscaleError) as exc:
            raise CorruptGpr(gpr_id, shorten(f"{type(exc).__name__}: {exc}", 300)) from None
        with self._lock:
            self._keys[gpr_id] = _key(obj)
        return Stored(gpr, _version(_rv(obj)))

    def _status_for(self, gpr: Gpr, obj: Obj, journal: list[Obj]) -> Obj:
        now = self.clock.now()
        st = gpr.status
        remaining = None
        if gpr.state is GprState.PROVISIONED and st.start_timestamp is not None:
            remaining = max(0.0, st.start_timestamp + gpr.spec.exit_duration_s - now)
        out = status_to_dict(st, remaining_s=remaining)
        old = obj.get("status") or {}
        out["gprId"] = gpr.gpr_id
        out["conditions"] = _conditions(
            gpr, [c for c in old.get("conditions") or [] if c.get("type") != "Invalid"], now
        )
        out[RECORD_FIELD] = {
            "spec": spec_to_dict(gpr.spec),
            "record": status_to_record(st),
            "createdAt": gpr.created_at,
            "journal": journal,
        }
        return out

    @staticmethod
    def _journal_of(obj: Obj) -> list[Obj]:
        return list(((obj.get("status") or {}).get(RECORD_FIELD) or {}).get("journal") or [])

    def _record_events(self, obj: Obj, transitions: Iterable[TransitionRecord]) -> None:
        if self.events is None:
            return
        for t in transitions:
            reason, etype = event_reason(t)
            message = f"{t.from_state} -> {t.to_state} ({t.trigger})" + (f": {t.reason}" if t.reason else "")
            self.events.object_event(obj, reason, etype, message)

    # ------------------------------------------------------------------------------------------------ admission
    def sync(self) -> list[str]:
        """Admit new GPR objects (``Queued``) and mark invalid ones; returns the gprIds admitted."""
        admitted = []
        for key, obj in sorted(self._objects().items()):
            st = obj.get("status") or {}
            if st.get(RECORD_FIELD):
                self._follow_priority(obj)
                continue
            meta = obj.get("metadata") or {}
            gen = int(meta.get("generation") or 0)
            seen = json.dumps([meta.get("uid"), obj.get("spec")], sort_keys=True, default=str)
            if self._checked.get(key) == seen:
                continue  # found invalid before and not changed since
            self._checked[key] = seen
            gpr_id = gpr_id_for(obj)
            try:
                spec = parse_gpr_spec(obj.get("spec") or {}, self.catalog, max_exit_s=self.max_exit_s)
            except GprValidationError as exc:
                self._invalid(obj, "; ".join(f"spec.{e.field}: {e.message}" for e in exc.errors), gen)
                continue
            except InputError as exc:
                self._invalid(obj, str(exc), gen)
                continue
            gpr = new_gpr(gpr_id, spec, self.catalog, self.clock.now())
            try:
                new = self._patch_status(obj, self._status_for(gpr, obj, []))
            except KubeError as exc:
                log.info("GPR %s not admitted this round: %s", key, exc.describe())
                continue
            with self._lock:
                self._keys[gpr_id] = key
            admitted.append(gpr_id)
            log.info("GPR %s (%s) queued with priority %d", gpr_id, key, spec.priority)
            if self.events is not None:
                self.events.object_event(new, "Queued", "Normal", f"queued as {gpr_id} with priority {spec.priority}")
        return admitted

    def _follow_priority(self, obj: Obj) -> None:
        """Apply an edit of ``spec.priority`` to an admitted GPR that is not final (as the REST API's priority
        update does); other spec edits are not applied."""
        wanted = (obj.get("spec") or {}).get("priority")
        accepted = (((obj.get("status") or {}).get(RECORD_FIELD) or {}).get("spec") or {}).get("priority")
        if wanted is None or wanted == accepted:
            return
        gpr_id = gpr_id_for(obj)
        try:
            cur = self._decode(obj).gpr
            if cur.state in FINAL_STATES:
                return
            self.modify(gpr_id, lambda g: with_priority(g, wanted), now=self.clock.now())
        except (GpuscaleError, KubeError) as exc:
            log.info("priority of GPR %s not changed: %s", _key(obj), exc)
            return
        log.info("GPR %s: priority %s -> %s", gpr_id, accepted, wanted)

    def _invalid(self, obj: Obj, message: str, generation: int) -> None:
        message = shorten(message + " (fix the spec and apply it again)", 1000)
        cond: dict[str, Any] = {
            "type": "Invalid",
            "status": "True",
            "reason": "InvalidSpec",
            "message": message,
            "lastTransitionTime": _ts(self.clock.now()),
        }
        if generation:
            cond["observedGeneration"] = generation
        try:
            new = self._patch_status(obj, {"provisioningStatus": None, "conditions": [cond]})
        except KubeError as exc:
            log.info("cannot mark GPR %s invalid: %s", _key(obj), exc.describe())
            return
        log.warning("GPR %s is invalid: %s", _key(obj), message)
        if self.events is not None:
            self.events.object_event(new, "InvalidSpec", "Warning", message)

    # ------------------------------------------------------------------------------------------------ reads
    def list_checked(self, states: Iterable[GprState] | None = None) -> tuple[list[Stored], list[CorruptGpr]]:
        """Admitted GPRs in admission order (optionally only in ``states``) and the records that do not decode."""
        wanted = None if states is None else set(states)
        good: list[tuple[float, str, Stored]] = []
        bad: list[CorruptGpr] = []
        for key, obj in self._objects().items():
            if not (obj.get("status") or {}).get(RECORD_FIELD):
                continue
            try:
                s = self._decode(obj)
            except CorruptGpr as exc:
                bad.append(exc)
                continue
            if wanted is None or s.gpr.state in wanted:
                good.append((s.gpr.created_at, key, s))
        good.sort(key=lambda x: (x[0], x[1]))
        return [s for _, _, s in good], bad

    def list_gprs(self, states: Iterable[GprState] | None = None) -> list[Stored]:
        """Admitted GPRs in admission order; undecodable records are logged and skipped."""
        good, bad = self.list_checked(states)
        for err in bad:
            log.error("%s", err)
        return good

    def _obj_of(self, gpr_id: str) -> Obj:
        with self._lock:
            key = self._keys.get(gpr_id)
        objs = self._objects()
        if key is None or key not in objs:
            found = [k for k, o in objs.items() if gpr_id_for(o) == gpr_id]
            if not found:
                raise GprNotFound(f"no GPR with gprId {gpr_id!r}")
            key = found[0]
        return objs[key]

    def get(self, gpr_id: str) -> Stored:
        """The GPR ``gpr_id``; raises :class:`GprNotFound`."""
        obj = self._obj_of(gpr_id)
        if not (obj.get("status") or {}).get(RECORD_FIELD):
            raise GprNotFound(f"GPR {gpr_id!r} is not admitted yet")
        return self._decode(obj)

    def journal(self, *, pending_only: bool = False) -> list[JournalEntry]:
        """Journal entries: those pending in the GPR objects (in doubt after a restart) and, unless
        ``pending_only``, those this process finished."""
        with self._lock:
            known = {(e.gpr_id, e.kind, e.key, e.created_at) for e in self._pending.values()}
        for obj in self._objects().values():
            if not (obj.get("status") or {}).get(RECORD_FIELD):
                continue
            gpr_id = gpr_id_for(obj)
            for e in self._journal_of(obj):
                ident = (gpr_id, str(e.get("kind")), str(e.get("key")), float(e.get("createdAt", 0.0)))
                if ident not in known:
                    self._remember(gpr_id, e)
                    known.add(ident)
        with self._lock:
            pending = sorted(self._pending.values(), key=lambda e: e.id)
            return pending if pending_only else [*self._done, *pending]

    # ------------------------------------------------------------------------------------------------ writes
    def insert(self, gpr: Gpr) -> Stored:
        """Not served: in the cluster a GPR is created as an object."""
        raise InputError(
            "in the cluster GPRs are GPUProvisioningRequest objects",
            where="GPR create",
            fix="kubectl apply -f a GPUProvisioningRequest manifest (or use gpuscale serve for the REST API)",
        )

    def _remember(self, gpr_id: str, e: Obj) -> JournalEntry:
        with self._lock:
            entry = JournalEntry(
                self._next_id,
                str(e.get("kind")),
                str(e.get("key")),
                gpr_id,
                dict(e.get("payload") or {}),
                float(e.get("createdAt", 0.0)),
                None,
                None,
            )
            self._next_id += 1
            self._pending[entry.id] = entry
            return entry

    def modify(
        self, gpr_id: str, fn: Callable[[Gpr], Gpr], *, now: float, transitions: Sequence[TransitionRecord] = ()
    ) -> Stored:
        """Read GPR ``gpr_id``, apply ``fn``, write the status; a conflict re-reads and retries (3 attempts)."""
        obj = self._obj_of(gpr_id)
        for attempt in range(MODIFY_ATTEMPTS):
            cur = self._decode(obj)
            new = fn(cur.gpr)
            if new == cur.gpr:
                return cur
            try:
                written = self._patch_status(obj, self._status_for(new, obj, self._journal_of(obj)))
            except KubeError as exc:
                if exc.status == 409 and attempt + 1 < MODIFY_ATTEMPTS:
                    obj = self._fresh(_key(obj))
                    continue
                if exc.status == 404:
                    raise GprNotFound(f"GPR object {_key(obj)} is gone") from exc
                raise StaleWrite(f"GPR {gpr_id}: {exc.describe()}") from exc
            done = list(transitions)
            if new.state is not cur.gpr.state and not done and new.status.last_trigger:
                trig = Trigger(new.status.last_trigger)
                done = [TransitionRecord(gpr_id, cur.gpr.state, new.state, trig, new.status.failure_reason)]
            self._record_events(written, done)
            return self._decode(written)
        raise StaleWrite(f"GPR {gpr_id} kept changing")  # pragma: no cover - the loop returns or raises

    def apply(
        self,
        updates: Sequence[tuple[Gpr, int]],
        transitions: Sequence[TransitionRecord],
        journal: Sequence[tuple[str, str, str, dict[str, Any]]],
        *,
        now: float,
    ) -> list[int]:
        """Write a plan object by object, each on the resourceVersion its GPR was read at. Raises
        :class:`StaleWrite` on a conflict (see the module docstring); returns the journal ids."""
        objs = self._objects()
        by_id = {gpr_id_for(o): o for o in objs.values() if (o.get("status") or {}).get(RECORD_FIELD)}
        new_gprs = {g.gpr_id: (g, v) for g, v in updates}
        for gpr_id, (_, version) in new_gprs.items():
            obj = by_id.get(gpr_id)
            if obj is None or _version(_rv(obj)) != version:
                raise StaleWrite(f"GPR {gpr_id} changed since version {version}")
        entries: dict[str, list[Obj]] = {}
        ids: list[int] = []
        for kind, key, gpr_id, payload in journal:
            e = {"kind": kind, "key": key, "payload": payload, "createdAt": now}
            entries.setdefault(gpr_id, []).append(e)
            ids.append(self._remember(gpr_id, e).id)
        for gpr_id in sorted(set(new_gprs) | set(entries)):
            obj = by_id.get(gpr_id)
            if obj is None:
                continue  # e.g. deleting a node whose GPR object is gone: journalled in memory only
            gpr = new_gprs[gpr_id][0] if gpr_id in new_gprs else self._decode(obj).gpr
            status = self._status_for(gpr, obj, [*self._journal_of(obj), *entries.get(gpr_id, [])])
            try:
                written = self._patch_status(obj, status)
            except KubeError as exc:
                raise StaleWrite(f"GPR {gpr_id}: {exc.describe()}") from exc
            self._record_events(written, [t for t in transitions if t.gpr_id == gpr_id])
        return ids

    def finish(self, journal_id: int, outcome: str, *, now: float) -> None:
        """Mark a journal entry done: drop it from its GPR's status (best effort: a failure leaves it in doubt)."""
        with self._lock:
            entry = self._pending.pop(journal_id, None)
            if entry is None:
                return
            self._done = [*self._done[-999:], JournalEntry(**{**_fields(entry), "done_at": now, "outcome": outcome})]
        try:
            obj = self._obj_of(entry.gpr_id)
        except GprNotFound:
            return
        for attempt in range(MODIFY_ATTEMPTS):
            kept = [
                e
                for e in self._journal_of(obj)
                if (str(e.get("kind")), str(e.get("key")), float(e.get("createdAt", 0.0)))
                != (entry.kind, entry.key, entry.created_at)
            ]
            if len(kept) == len(self._journal_of(obj)):
                return
            try:
                self._patch_status(obj, {RECORD_FIELD: {"journal": kept}})
                return
            except KubeError as exc:
                if exc.status == 409 and attempt + 1 < MODIFY_ATTEMPTS:
                    try:
                        obj = self._fresh(_key(obj))
                    except (GprNotFound, KubeError):
                        return
                    continue
                log.info("journal entry %s %s left in doubt: %s", entry.kind, entry.key, exc.describe())
                return


def _fields(e: JournalEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "kind": e.kind,
        "key": e.key,
        "gpr_id": e.gpr_id,
        "payload": e.payload,
        "created_at": e.created_at,
        "done_at": e.done_at,
        "outcome": e.outcome,
    }
