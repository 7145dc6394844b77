"""``spec.rightsizing`` of a GPUWorkloadScaler into the core's
:class:`~gpuscale.core.autoscale.rightsize_update.RightsizePolicy`::

    rightsizing:
      updateMode: Recreate          # Off (the default): recommend only
      controlledResources: [cpu, memory]
      minAllowed: {cpu: 250m, memory: 512Mi}
      maxAllowed: {cpu: "8", memory: 32Gi}
      updateInterval: 3600          # seconds: at most one change per interval
      historyWindow: 691200         # seconds of usage history read (8 days)
      serverAddress: http://prometheus.monitoring:9090   # default: the first trigger's

The field tables are those ``deploy/crds/gpuworkloadscaler.yaml`` is tested against.
"""

from __future__ import annotations

from typing import Any

from gpuscale.core.autoscale.rightsize import Limits
from gpuscale.core.autoscale.rightsize_update import RESOURCES, RightsizePolicy, UpdateMode
from gpuscale.manifests.fields import as_int, as_list, as_mapping, as_str, check_fields, choice, fields_of
from gpuscale.manifests.problems import Doc, FieldError
from gpuscale.manifests.quantity import QUANTITY_HELP, cpu_milli, memory_mib

RIGHTSIZING_FIELDS = ("updateMode", "controlledResources", "minAllowed", "maxAllowed", "updateInterval",
                      "historyWindow", "serverAddress")  # fmt: skip
RESOURCE_FIELDS = RESOURCES
UPDATE_MODES = tuple(str(m) for m in UpdateMode)
DEFAULT_UPDATE_INTERVAL_S = 3600
DEFAULT_HISTORY_S = 8 * 86_400
MAX_SECONDS = 86_400 * 365
PATH = "spec.rightsizing"


def read_rightsizing(doc: Doc, raw: object, default_server: str) -> RightsizePolicy | None:
    """The policy (None when the field is absent or has problems, which are reported to ``doc``)."""
    if raw is None:
        return None
    before = len(doc.problems)
    m = fields_of(doc, raw, PATH, RIGHTSIZING_FIELDS)
    if m is None:
        return None
    mode, controlled = UpdateMode.OFF, tuple[str, ...](RESOURCES)
    with doc.field():
        if m.get("updateMode") is not None:
            mode = UpdateMode(choice(m["updateMode"], f"{PATH}.updateMode", UPDATE_MODES))
    with doc.field():
        if m.get("controlledResources") is not None:
            items = as_list(m["controlledResources"], f"{PATH}.controlledResources")
            controlled = tuple(choice(v, f"{PATH}.controlledResources[{i}]", RESOURCES) for i, v in enumerate(items))
            if not controlled:
                raise FieldError(f"{PATH}.controlledResources", "must name cpu, memory or both",
                                 fix="remove the field to control both")  # fmt: skip
    lo, hi = _limits(doc, m.get("minAllowed"), "minAllowed"), _limits(doc, m.get("maxAllowed"), "maxAllowed")
    for res in ("cpu_milli", "memory_mib"):
        a, b = getattr(lo, res), getattr(hi, res)
        if a is not None and b is not None and a > b:
            doc.error(f"{PATH}.maxAllowed.{res.split('_')[0]}", "is below minAllowed", fix="swap or widen them")
    seconds = {"updateInterval": DEFAULT_UPDATE_INTERVAL_S, "historyWindow": DEFAULT_HISTORY_S}
    for key in seconds:
        with doc.field():
            if m.get(key) is not None:
                seconds[key] = as_int(m[key], f"{PATH}.{key}", minimum=60 if key == "historyWindow" else 0,
                                      maximum=MAX_SECONDS)  # fmt: skip
    server = default_server
    with doc.field():
        if m.get("serverAddress") is not None:
            server = as_str(m["serverAddress"], f"{PATH}.serverAddress", required=True)
            if not server.startswith(("http://", "https://")):
                raise FieldError(f"{PATH}.serverAddress", "must be an http(s) URL", server,
                                 fix="e.g. http://prometheus.monitoring:9090")  # fmt: skip
    if len(doc.problems) > before:
        return None
    return RightsizePolicy(mode, lo, hi, tuple(dict.fromkeys(controlled)), float(seconds["updateInterval"]),
                           float(seconds["historyWindow"]), server)  # fmt: skip


def _limits(doc: Doc, raw: object, key: str) -> Limits:
    path = f"{PATH}.{key}"
    try:
        m: dict[str, Any] = as_mapping(raw, path)
    except FieldError as err:
        doc.report(err)
        return Limits()
    check_fields(doc, m, path, RESOURCE_FIELDS)
    got: dict[str, float] = {}
    for res, reader in (("cpu", cpu_milli), ("memory", memory_mib)):
        if m.get(res) is None:
            continue
        with doc.field():
            try:
                got[res] = float(reader(m[res]))
            except ValueError as exc:
                raise FieldError(f"{path}.{res}", str(exc), m[res], fix=QUANTITY_HELP) from None
    return Limits(got.get("cpu"), got.get("memory"))
