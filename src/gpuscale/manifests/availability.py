"""``gpuscale.io/v1alpha1`` ``OfferingAvailability``: offerings that must not be used until a time.

``spec.unavailable`` lists ``{instanceType, zone, capacityType, until}``. ``zone`` and ``capacityType`` are optional
(absent means every offering of the instance type in the catalog). ``until`` is an RFC 3339 timestamp with a time
zone, a Go duration from ``now`` (``"15m"``), or a number of seconds from ``now``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpuscale.core.model import CapacityType, InstanceType, OfferingKey
from gpuscale.manifests.fields import as_list, as_mapping, as_str, check_fields, choice, fields_of
from gpuscale.manifests.pools import TOP_FIELDS
from gpuscale.manifests.problems import Doc, FieldError, close_matches
from gpuscale.manifests.quantity import MAX_DURATION_S, parse_duration

SPEC_FIELDS = ("unavailable",)
ENTRY_FIELDS = ("instanceType", "zone", "capacityType", "until")
UNTIL_HELP = 'use an RFC 3339 time with a zone ("2025-06-01T12:00:00Z"), a duration ("15m") or seconds from now'


def read_availability(
    doc: Doc, obj: dict[str, Any], types: Mapping[str, InstanceType], now: float
) -> dict[OfferingKey, float] | None:
    """Unavailable offerings -> until (epoch seconds); None if the document has problems (reported to ``doc``)."""
    check_fields(doc, obj, "", TOP_FIELDS)
    out: dict[OfferingKey, float] = {}
    entries: list[Any] = []
    with doc.field():
        meta = as_mapping(obj.get("metadata"), "metadata")
        doc.name = as_str(meta.get("name"), "metadata.name")
    with doc.field():
        spec = as_mapping(obj.get("spec"), "spec")
        check_fields(doc, spec, "spec", SPEC_FIELDS)
        entries = as_list(spec.get("unavailable"), "spec.unavailable")
    for i, raw in enumerate(entries):
        path = f"spec.unavailable[{i}]"
        for key, until in _entry(doc, raw, path, types, now):
            out[key] = max(until, out.get(key, until))
    return None if doc.failed else out


def _entry(
    doc: Doc, raw: object, path: str, types: Mapping[str, InstanceType], now: float
) -> list[tuple[OfferingKey, float]]:
    before = len(doc.problems)
    m = fields_of(doc, raw, path, ENTRY_FIELDS)
    if m is None:
        return []
    itype: InstanceType | None = None
    zone = ""
    cap: CapacityType | None = None
    until = now
    with doc.field():
        name = as_str(m.get("instanceType"), f"{path}.instanceType", required=True)
        itype = types.get(name)
        if itype is None:
            hits = close_matches(name, types, n=5)
            fix = f"close matches: {', '.join(hits)}" if hits else "use an instance type of the catalog"
            raise FieldError(f"{path}.instanceType", "is not an instance type of the catalog", name, fix)
    with doc.field():
        zone = as_str(m.get("zone"), f"{path}.zone")
    with doc.field():
        if m.get("capacityType") is not None:
            cap = CapacityType(choice(m["capacityType"], f"{path}.capacityType", [str(c) for c in CapacityType]))
    with doc.field():
        until = _until(m.get("until"), f"{path}.until", now)
    if len(doc.problems) > before or itype is None:
        return []
    if zone and cap is not None:
        return [(OfferingKey(itype.name, zone, cap), until)]
    keys = sorted(
        {
            OfferingKey(itype.name, o.zone, o.capacity_type)
            for o in itype.offerings
            if (not zone or o.zone == zone) and (cap is None or o.capacity_type == cap)
        },
        key=lambda k: (k.zone, str(k.capacity_type)),
    )
    if not keys:
        doc.error(path, f"matches no offering of {itype.name} in the catalog", fix="give zone and capacityType")
    return [(k, until) for k in keys]


def _until(value: object, path: str, now: float) -> float:
    if isinstance(value, bool) or value is None:
        raise FieldError(path, "is required" if value is None else "is not a time", value, fix=UNTIL_HELP)
    if isinstance(value, int | float):
        if not 0 <= value <= MAX_DURATION_S:
            problem = "must not be negative" if value < 0 else "must be at most 10 years of seconds"
            raise FieldError(path, problem, value, fix=UNTIL_HELP)
        return now + float(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise FieldError(path, "has no time zone", str(value), fix='append "Z" for UTC')
        return value.timestamp()
    if not isinstance(value, str):
        raise FieldError(path, "is not a time", str(value), fix=UNTIL_HELP)
    try:
        return now + parse_duration(value)
    except ValueError:
        pass
    try:
        stamp = dt.datetime.fromisoformat(value)
    except ValueError:
        raise FieldError(path, "is neither an RFC 3339 time nor a duration", value, fix=UNTIL_HELP) from None
    if stamp.tzinfo is None:
        raise FieldError(path, "has no time zone", value, fix='append "Z" for UTC')
    return stamp.timestamp()
