"""Table-driven tests of the label and taint predicates (kube-scheduler semantics)."""

from __future__ import annotations

import pytest

from builders import pod, req, taint, term, tol
from gpuscale.core.model import Taint, Toleration
from gpuscale.core.predicates import (
    FitFailureKind,
    match_affinity,
    match_node_selector,
    match_requirement,
    static_failure,
    tolerates,
    untolerated,
)

LABELS = {"zone": "a", "gpu": "T4", "count": "4", "empty": ""}


@pytest.mark.parametrize(
    ("key", "op", "values", "expected"),
    [
        ("zone", "In", ("a", "b"), True),
        ("zone", "In", ("b",), False),
        ("missing", "In", ("a",), False),
        ("zone", "NotIn", ("b",), True),
        ("zone", "NotIn", ("a",), False),
        ("missing", "NotIn", ("a",), True),  # NotIn matches an absent label
        ("zone", "Exists", (), True),
        ("empty", "Exists", (), True),
        ("missing", "Exists", (), False),
        ("missing", "DoesNotExist", (), True),
        ("zone", "DoesNotExist", (), False),
        ("count", "Gt", ("3",), True),
        ("count", "Gt", ("4",), False),
        ("count", "Lt", ("5",), True),
        ("count", "Lt", ("4",), False),
        ("zone", "Gt", ("1",), False),  # non-integer label value
        ("count", "Gt", ("x",), False),  # non-integer operand
        ("missing", "Lt", ("9",), False),
        ("count", "Gt", ("1", "2"), False),  # Gt needs exactly one value
    ],
)
def test_requirement_operators(key: str, op: str, values: tuple[str, ...], expected: bool) -> None:
    assert match_requirement(req(key, op, *values), LABELS) is expected


def test_affinity_terms_are_ored_and_expressions_anded() -> None:
    both = term(req("zone", "In", "a"), req("gpu", "In", "T4"))
    one_bad = term(req("zone", "In", "a"), req("gpu", "In", "A100"))
    assert match_affinity((both,), LABELS)
    assert not match_affinity((one_bad,), LABELS)
    assert match_affinity((one_bad, both), LABELS)
    assert match_affinity((), LABELS)  # no affinity: anything goes
    assert not match_affinity((term(),), LABELS)  # an empty term matches nothing


@pytest.mark.parametrize(
    ("selector", "expected"),
    [({}, True), ({"zone": "a"}, True), ({"zone": "b"}, False), ({"zone": "a", "gpu": "T4"}, True), ({"x": ""}, False)],
)
def test_node_selector(selector: dict[str, str], expected: bool) -> None:
    assert match_node_selector(selector, LABELS) is expected


@pytest.mark.parametrize(
    ("toleration", "the_taint", "expected"),
    [
        (tol("gpu", "Equal", "yes"), taint("gpu", "yes"), True),
        (tol("gpu", "Equal", "no"), taint("gpu", "yes"), False),
        (tol("gpu", "Exists"), taint("gpu", "anything"), True),
        (tol("other", "Exists"), taint("gpu", "yes"), False),
        (tol("", "Exists"), taint("gpu", "yes", "NoExecute"), True),  # empty key + Exists tolerates all
        (tol("gpu", "Exists", effect="NoSchedule"), taint("gpu", "", "NoExecute"), False),
        (tol("gpu", "Exists", effect="NoExecute"), taint("gpu", "", "NoExecute"), True),
        (tol("gpu", "Equal", "", effect=None), taint("gpu", ""), True),
        (tol("gpu", "Equal", "yes", effect="PreferNoSchedule"), taint("gpu", "yes", "PreferNoSchedule"), True),
    ],
)
def test_tolerations(toleration: Toleration, the_taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, the_taint) is expected


def test_prefer_no_schedule_never_blocks() -> None:
    assert untolerated((), (taint("soft", "", "PreferNoSchedule"),)) == []
    assert len(untolerated((), (taint("hard", "", "NoSchedule"), taint("x", "", "NoExecute")))) == 2


def test_static_failure_names_the_blocker() -> None:
    p = pod("p", selector={"gpu": "A100"})
    f = static_failure(p, LABELS, ())
    assert f is not None and f.kind is FitFailureKind.NODE_SELECTOR and f.key == "gpu"
    assert "gpu=A100" in f.detail and "T4" in f.detail
    p = pod("p", affinity=(term(req("zone", "NotIn", "a")),))
    f = static_failure(p, LABELS, ())
    assert f is not None and f.kind is FitFailureKind.AFFINITY and "zone NotIn [a]" in f.detail
    f = static_failure(pod("p"), LABELS, (taint("nvidia.com/gpu", "present"),))
    assert f is not None and f.kind is FitFailureKind.TAINT and "nvidia.com/gpu=present:NoSchedule" in f.detail
    f = static_failure(pod("p"), LABELS, (), unschedulable=True)
    assert f is not None and f.kind is FitFailureKind.UNSCHEDULABLE
    assert (
        static_failure(pod("p", tolerations=(tol("nvidia.com/gpu", "Exists"),)), LABELS, (taint("nvidia.com/gpu"),))
        is None
    )
