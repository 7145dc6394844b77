"""Offering availability and back-offs kept in the cluster, on one ``OfferingAvailability`` object.

:class:`KubeAvailabilityStore` is the controller's :class:`~gpuscale.controller.availability.AvailabilityStore` in a
cluster. It owns one cluster-scoped object (``gpuscale-controller``, labelled ``app.kubernetes.io/managed-by:
gpuscale``):

- offering marks are ``spec.unavailable`` entries with an RFC 3339 ``until``, so ``kubectl get -o yaml`` shows
  them and a user can edit them (entries a user wrote are kept as written);
- back-off, fallback and retry marks are ``status.marks`` (``{kind, key, until, failures, reason}``).

``put`` and ``drop`` only change memory and a dirty set; :meth:`flush` (once per round) writes the changes as one
merge patch of the spec and one of the status, each on the resourceVersion last seen. A 409 Conflict re-reads the
object and leaves the changes dirty for the next round (never a sleep or a loop). Expired offering and fallback marks
are pruned on flush (back-offs and retries keep their failure counts until cleared, as in ``Availability``).
``load`` reads the object; an entry it cannot read is logged, reported as a Warning Event and skipped.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from lightkube.types import PatchType

from gpuscale.clock import Clock
from gpuscale.controller.availability import Mark, MarkKind, offering_key_text, parse_offering_key
from gpuscale.core.model import CapacityType, Catalog, OfferingKey
from gpuscale.kube.cache import OfferingAvailability, raw, slim
from gpuscale.kube.client import KubeClient, KubeError
from gpuscale.kube.events import EventRecorder
from gpuscale.manifests.availability import read_availability
from gpuscale.manifests.problems import Doc

__all__ = ["OBJECT_NAME", "KubeAvailabilityStore"]

log = logging.getLogger(__name__)

OBJECT_NAME = "gpuscale-controller"
RESOURCE = "offeringavailabilities.gpuscale.io"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuscale"}
Obj = dict[str, Any]
_Key = tuple[MarkKind, str]


def rfc3339(t: float) -> str:
    """``t`` (epoch seconds) as an RFC 3339 UTC time, to the second (rounded up: a mark never ends early)."""
    whole = int(-(-t // 1))
    return dt.datetime.fromtimestamp(whole, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: object) -> float | None:
    if isinstance(value, dt.datetime):
        return value.timestamp() if value.tzinfo is not None else None
    if not isinstance(value, str):
        return None
    try:
        stamp = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp.timestamp() if stamp.tzinfo is not None else None


def _exact_key(entry: object) -> OfferingKey | None:
    """The offering an entry names exactly (instance type, zone and capacity type all given), else None."""
    if not isinstance(entry, dict):
        return None
    it, zone, ct = entry.get("instanceType"), entry.get("zone"), entry.get("capacityType")
    if not (isinstance(it, str) and it and isinstance(zone, str) and zone and ct in {str(c) for c in CapacityType}):
        return None
    return OfferingKey(it, zone, CapacityType(str(ct)))


class KubeAvailabilityStore:
    """An :class:`~gpuscale.controller.availability.AvailabilityStore` on one OfferingAvailability object."""

    def __init__(
        self,
        client: KubeClient,
        catalog: Catalog,
        clock: Clock,
        *,
        name: str = OBJECT_NAME,
        events: EventRecorder | None = None,
    ) -> None:
        self.client = client
        self.catalog = catalog
        self.clock = clock
        self.name = name
        self.events = events
        self._marks: dict[_Key, Mark] = {}
        self._dirty: set[_Key] = set()
        self._obj: Obj | None = None
        """The object as last read or written (None: absent, or to be re-read)."""
        self._read = False
        self._versions: dict[str, str] = {}
        """Object name -> the resourceVersion :meth:`edited` last read."""
        self.conflicts = 0
        self.warnings: list[str] = []
        """Every problem ``load`` skipped (also logged and sent as Events)."""

    # ------------------------------------------------------------------------------------------------ protocol
    def load(self) -> list[Mark]:
        """Read the object: its exact-key spec entries and status marks (a bad entry is reported and skipped)."""
        self._obj = self._get()
        self._read = True
        self._marks = {}
        self._dirty.clear()
        if self._obj is None:
            return []
        for key, until in self._spec_marks(self._obj).items():
            text = offering_key_text(key)
            self._marks[MarkKind.OFFERING, text] = Mark(MarkKind.OFFERING, text, until)
        for i, raw_mark in enumerate((self._obj.get("status") or {}).get("marks") or []):
            m = self._status_mark(raw_mark, f"status.marks[{i}]")
            if m is not None:
                self._marks[m.kind, m.key] = m
        return list(self._marks.values())

    def put(self, mark: Mark) -> None:
        """Store ``mark`` (written on the next :meth:`flush`)."""
        self._marks[mark.kind, mark.key] = mark
        self._dirty.add((mark.kind, mark.key))

    def drop(self, kind: MarkKind, key: str) -> None:
        """Remove a mark (written on the next :meth:`flush`)."""
        self._marks.pop((kind, key), None)
        self._dirty.add((kind, key))

    # ------------------------------------------------------------------------------------------------ writing
    @property
    def dirty(self) -> bool:
        """Changes not yet written."""
        return bool(self._dirty)

    def flush(self) -> bool:
        """Write the changes since the last flush (one or two API calls); True when nothing is left to write. A
        conflict or an unreachable server leaves them for the next round."""
        now = self.clock.now()
        for k, m in list(self._marks.items()):
            if m.kind in (MarkKind.OFFERING, MarkKind.FALLBACK) and m.until <= now:
                self.drop(*k)
        if not self._dirty:
            return True
        try:
            if not self._read:
                self._obj = self._get()
                self._read = True
            if self._obj is None:
                self._obj = self._create()
            dirty, self._dirty = self._dirty, set()
            try:
                self._write(dirty, now)
            except BaseException:
                self._dirty |= dirty
                raise
        except KubeError as exc:
            if exc.status == 409:
                self.conflicts += 1
                self._read = False  # re-read on the next flush, then write again
            log.info("offering availability not written (next round retries): %s", exc.describe())
            return False
        return True

    def _write(self, dirty: set[_Key], now: float) -> None:
        assert self._obj is not None
        offerings = {k for k in dirty if k[0] is MarkKind.OFFERING}
        if offerings:
            entries = self._merged_entries(offerings, now)
            if entries != ((self._obj.get("spec") or {}).get("unavailable") or []):
                self._obj = self._patch(OfferingAvailability, {"spec": {"unavailable": entries}}, "")
        if len(offerings) < len(dirty):
            marks = [
                {"kind": str(m.kind), "key": m.key, "until": rfc3339(m.until), "failures": m.failures,
                 "reason": m.reason[:256]}
                for (kind, _), m in sorted(self._marks.items()) if kind is not MarkKind.OFFERING
            ]  # fmt: skip
            if marks != (self._obj.get("status") or {}).get("marks"):
                self._obj = self._patch(OfferingAvailability.Status, {"status": {"marks": marks}}, "/status")

    def _merged_entries(self, dirty: set[_Key], now: float) -> list[Any]:
        """The new ``spec.unavailable``: entries a user wrote kept as written, exact-key entries of changed marks
        replaced, entries whose RFC 3339 ``until`` has passed dropped, new marks appended."""
        assert self._obj is not None
        out: list[Any] = []
        written: set[str] = set()
        for entry in (self._obj.get("spec") or {}).get("unavailable") or []:
            key = _exact_key(entry)
            text = offering_key_text(key) if key is not None else None
            if text is not None and (MarkKind.OFFERING, text) in dirty:
                mark = self._marks.get((MarkKind.OFFERING, text))
                if mark is not None and text not in written:
                    out.append({**entry, "until": rfc3339(mark.until)})
                    written.add(text)
                continue
            until = _parse_time(entry.get("until")) if isinstance(entry, dict) else None
            if until is not None and until <= now:
                continue  # an RFC 3339 time in the past: expired, whoever wrote it
            out.append(entry)
        for kind, text in sorted(dirty):
            mark = self._marks.get((kind, text))
            if mark is None or text in written:
                continue
            k = parse_offering_key(text)
            out.append(
                {"instanceType": k.instance_type, "zone": k.zone, "capacityType": str(k.capacity_type),
                 "until": rfc3339(mark.until)}
            )  # fmt: skip
        return out

    # ------------------------------------------------------------------------------------------------ API calls
    def _get(self) -> Obj | None:
        try:
            got = self.client.run(self.client.api.get(OfferingAvailability, self.name), verb="get", resource=RESOURCE)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return slim(raw(got))

    def _create(self) -> Obj:
        body = {
            "apiVersion": "gpuscale.io/v1alpha1",
            "kind": "OfferingAvailability",
            "metadata": {"name": self.name, "labels": dict(MANAGED_BY)},
            "spec": {"unavailable": []},
        }
        got = self.client.run(
            self.client.api.create(OfferingAvailability.from_dict(body)), verb="create", resource=RESOURCE
        )
        return slim(raw(got))

    def _patch(self, res: Any, body: Obj, sub: str) -> Obj:
        assert self._obj is not None
        rv = str((self._obj.get("metadata") or {}).get("resourceVersion", ""))
        got = self.client.run(
            self.client.api.patch(res, self.name, {"metadata": {"resourceVersion": rv}, **body},
                                  patch_type=PatchType.MERGE),
            verb="patch", resource=RESOURCE + sub,
        )  # fmt: skip
        return slim(raw(got))

    # ------------------------------------------------------------------------------------------------ reading
    def edited(self, objects: list[Obj]) -> dict[OfferingKey, float]:
        """The offering marks of the OfferingAvailability objects (``objects``, from the watch) that changed since
        last seen, other than by this store's own writes: what users wrote while the controller runs. Bad entries are
        reported as in :meth:`load`."""
        out: dict[OfferingKey, float] = {}
        seen: dict[str, str] = {}
        mine = str(((self._obj or {}).get("metadata") or {}).get("resourceVersion", ""))
        for obj in objects:
            meta = obj.get("metadata") or {}
            name, rv = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
            seen[name] = rv
            if self._versions.get(name) == rv or (name == self.name and rv == mine):
                continue
            for key, until in self._spec_marks(obj, name).items():
                out[key] = max(until, out.get(key, until))
        self._versions = seen
        return out

    def _spec_marks(self, obj: Obj, name: str | None = None) -> dict[OfferingKey, float]:
        """Every readable ``spec.unavailable`` entry (each read on its own, so one bad entry skips only itself)."""
        out: dict[OfferingKey, float] = {}
        entries = (obj.get("spec") or {}).get("unavailable")
        if not isinstance(entries, list):
            if entries is not None:
                self._warn("spec.unavailable is not a list", obj)
            return out
        types = self.catalog.by_name()
        now = self.clock.now()
        for i, entry in enumerate(entries):
            doc = Doc(source=f"OfferingAvailability {name or self.name}", index=1, line=None, problems=[])
            one = {"metadata": {"name": name or self.name}, "spec": {"unavailable": [entry]}}
            got = read_availability(doc, one, types, now)
            if got is None:
                for p in doc.problems:
                    self._warn(str(p).replace("spec.unavailable[0]", f"spec.unavailable[{i}]"), obj)
                continue
            for key, until in got.items():
                out[key] = max(until, out.get(key, until))
        return out

    def _status_mark(self, value: object, path: str) -> Mark | None:
        if not isinstance(value, dict):
            self._warn(f"{path} is not a mapping: skipped")
            return None
        try:
            kind = MarkKind(str(value.get("kind")))
            if kind is MarkKind.OFFERING:
                raise ValueError("offering marks belong in spec.unavailable")
            key = value.get("key")
            if not isinstance(key, str) or not key:
                raise ValueError("key must be a non-empty string")
            until = _parse_time(value.get("until"))
            if until is None:
                raise ValueError("until must be an RFC 3339 time with a zone")
            failures = value.get("failures", 0)
            if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
                raise ValueError("failures must be a non-negative integer")
        except ValueError as exc:
            self._warn(f"{path}: {exc}: skipped")
            return None
        return Mark(kind, key, until, failures, str(value.get("reason") or ""))

    def _warn(self, message: str, obj: Obj | None = None) -> None:
        about = obj if obj is not None else self._obj
        name = str(((about or {}).get("metadata") or {}).get("name") or self.name)
        where = f"OfferingAvailability {name}"
        text = message if message.startswith(where) else f"{where}: {message}"
        self.warnings.append(text)
        log.warning("%s", text)
        if self.events is not None and about is not None:
            self.events.object_event(about, "BadAvailabilityEntry", "Warning", message)
