"""The pure right-sizing updater (core/autoscale/rightsize_update.py): the band rule, the rate limit, the disruption
budget, updateMode Off, the JSON patch, PDB selectors and quantities, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from gpuscale.core.autoscale.rightsize import Bounds, Limits, Recommendation
from gpuscale.core.autoscale.rightsize_update import (
    PDB,
    RightsizePolicy,
    TemplateContainer,
    UpdateMode,
    Verdict,
    blocking_budget,
    decide,
    json_patch,
    out_of_band,
)

REC = Recommendation("ml/llm", "main", Bounds(400, 500, 700), Bounds(900, 1000, 1500), Limits(), 3.0)
RECREATE = RightsizePolicy(UpdateMode.RECREATE, update_interval_s=600)
NOW = 10_000.0


def box(cpu: str | None = "2", memory: str | None = "1Gi", limits: dict[str, str] | None = None) -> TemplateContainer:
    req = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    res: dict[str, Any] = {"requests": req}
    if limits:
        res["limits"] = limits
    return TemplateContainer(0, "main", res)


@pytest.mark.parametrize(
    ("container", "controlled", "expected"),
    [
        (box("2", "4Gi"), ("cpu", "memory"), [("cpu", 2000, 500), ("memory", 4096, 1000)]),
        (box("500m", "1000Mi"), ("cpu", "memory"), []),  # inside both bands
        (box("0.4", "1500Mi"), ("cpu", "memory"), []),  # on the band's edges: inside
        (box("399m", "1Gi"), ("cpu", "memory"), [("cpu", 399, 500)]),  # just below the lower bound
        (box("2", "4Gi"), ("memory",), [("memory", 4096, 1000)]),  # cpu not controlled
        (box(None, "1Gi"), ("cpu",), [("cpu", None, 500)]),  # a request not set is outside
        (box("2", "4Gi", {"cpu": "300m"}), ("cpu",), [("cpu", 2000, 300)]),  # capped at the limit
        (TemplateContainer(0, "other", {"requests": {"cpu": "9"}}), ("cpu",), []),  # no recommendation for it
    ],
)
def test_the_band_rule(container: TemplateContainer, controlled: tuple[str, ...], expected: list[Any]) -> None:
    got = out_of_band([REC], [container], RightsizePolicy(controlled=controlled))
    assert [(c.resource, c.current, c.target) for c in got] == expected


@pytest.mark.parametrize(
    ("policy", "container", "last", "blocked", "verdict"),
    [
        (RECREATE, box("2", "4Gi"), None, None, Verdict.APPLY),
        (RECREATE, box("2", "4Gi"), NOW - 600, None, Verdict.APPLY),  # exactly one interval later
        (RECREATE, box("2", "4Gi"), NOW - 599, None, Verdict.RATE_LIMITED),
        (RECREATE, box("2", "4Gi"), None, "llm-pdb", Verdict.BLOCKED),
        (RECREATE, box("500m", "1Gi"), None, "llm-pdb", Verdict.IN_BAND),  # nothing to do: not blocked
        (RightsizePolicy(), box("2", "4Gi"), None, None, Verdict.OFF),  # the default mode only recommends
    ],
)
def test_decide(policy: RightsizePolicy, container: TemplateContainer, last: float | None, blocked: str | None,
                verdict: Verdict) -> None:  # fmt: skip
    d = decide(policy, [REC], [container], last_update=last, blocked_by=blocked, now=NOW)
    assert d.verdict is verdict, d.message
    assert bool(d.patch) == (verdict is Verdict.APPLY)
    if verdict is Verdict.BLOCKED:
        assert "llm-pdb" in d.message
    if verdict is Verdict.OFF:
        assert "main cpu 2000m -> 500m (bounds 400m..700m)" in d.message


def test_no_history_is_no_recommendation() -> None:
    d = decide(RECREATE, [], [box()], last_update=None, blocked_by=None, now=NOW)
    assert d.verdict is Verdict.NO_CHANGE and not d.patch


@pytest.mark.parametrize(
    ("resources", "ops"),
    [
        ({"requests": {"cpu": "2", "nvidia.com/gpu": "1"}},
         [("add", "/spec/template/spec/containers/1/resources/requests/cpu", "500m")]),
        ({"limits": {"nvidia.com/gpu": "1"}},
         [("add", "/spec/template/spec/containers/1/resources/requests", {"cpu": "500m"})]),
        (None, [("add", "/spec/template/spec/containers/1/resources", {"requests": {"cpu": "500m"}})]),
    ],
)  # fmt: skip
def test_the_json_patch_tests_the_name_and_touches_only_the_changed_requests(
    resources: dict[str, Any] | None, ops: list[Any]
) -> None:
    c = TemplateContainer(1, "main", resources)
    changes = out_of_band([REC], [c], RightsizePolicy(controlled=("cpu",)))
    patch = json_patch(changes, [TemplateContainer(0, "sidecar", {}), c])
    assert patch[0] == {"op": "test", "path": "/spec/template/spec/containers/1/name", "value": "main"}
    assert [(o["op"], o["path"], o["value"]) for o in patch[1:]] == ops
    assert "nvidia.com/gpu" not in str(patch), "GPU requests are never changed"


@pytest.mark.parametrize(
    ("pdb", "blocks"),
    [
        (PDB("a", {"app": "llm"}, (), 0), True),
        (PDB("a", {"app": "llm"}, (), 1), False),  # allows one disruption
        (PDB("a", {"app": "db"}, (), 0), False),  # selects other pods
        (PDB("a", {}, (), 0), True),  # an empty selector selects every pod
        (PDB("a", {}, (("tier", "In", ("gpu", "cpu")),), 0), True),
        (PDB("a", {}, (("tier", "NotIn", ("gpu",)),), 0), False),
        (PDB("a", {}, (("zone", "Exists", ()),), 0), False),
        (PDB("a", {}, (("zone", "DoesNotExist", ()),), 0), True),
    ],
)
def test_blocking_budget(pdb: PDB, blocks: bool) -> None:
    assert (blocking_budget([pdb], {"app": "llm", "tier": "gpu"}) == "a") is blocks
