"""Scheduling predicates with kube-scheduler semantics (label and taint side; resources live in ``state``).

* ``nodeSelector``: every key/value must be a node label.
* Required node affinity: terms are ORed, the expressions of a term ANDed; an empty term matches nothing.
  ``In``/``NotIn`` compare label values (``NotIn`` also matches when the label is absent), ``Exists``/``DoesNotExist``
  test the key, ``Gt``/``Lt`` compare the label's integer value with the single integer given.
* Taints: a pod must tolerate every ``NoSchedule`` and ``NoExecute`` taint; ``PreferNoSchedule`` never blocks.
  A toleration with an empty key and ``Exists`` tolerates everything; an empty effect matches every effect.
* Unschedulable (cordoned) nodes take no new pods.
* GPR workloads (gpuscale's own rule): given ``workloads`` (gprId -> ``workloadSelector``), a node labelled
  ``gpuscale.io/gpr=<gprId>`` of a GPR listed there takes only pods whose labels match that selector (an empty
  selector matches no pod), even a pod that tolerates the GPR's taint. Without ``workloads`` the rule is off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpuscale.core.gpr.spec import GPR_LABEL
from gpuscale.core.model import (
    Pod,
    Requirement,
    SelectorOperator,
    SelectorTerm,
    Taint,
    TaintEffect,
    Toleration,
)


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def match_requirement(req: Requirement, labels: Mapping[str, str]) -> bool:
    """True if ``labels`` satisfy one node selector requirement."""
    op = req.operator
    present = req.key in labels
    if op is SelectorOperator.EXISTS:
        return present
    if op is SelectorOperator.DOES_NOT_EXIST:
        return not present
    if op is SelectorOperator.IN:
        return present and labels[req.key] in req.values
    if op is SelectorOperator.NOT_IN:
        return not present or labels[req.key] not in req.values
    if not present or len(req.values) != 1:
        return False
    have, want = _as_int(labels[req.key]), _as_int(req.values[0])
    if have is None or want is None:
        return False
    return have > want if op is SelectorOperator.GT else have < want


def match_term(term: SelectorTerm, labels: Mapping[str, str]) -> bool:
    """True if every requirement of the term holds (an empty term matches nothing)."""
    return bool(term.requirements) and all(match_requirement(r, labels) for r in term.requirements)


def match_affinity(terms: Iterable[SelectorTerm], labels: Mapping[str, str]) -> bool:
    """True if there is no required affinity, or any of its terms matches."""
    terms = tuple(terms)
    return not terms or any(match_term(t, labels) for t in terms)


def match_node_selector(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """True if every ``nodeSelector`` entry is a node label with that value."""
    return all(labels.get(k) == v for k, v in selector.items())


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """True if ``toleration`` tolerates ``taint``."""
    if toleration.effect is not None and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return toleration.key in ("", taint.key)
    return toleration.key == taint.key and toleration.value == taint.value


BLOCKING_EFFECTS = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})


def untolerated(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> list[Taint]:
    """The blocking taints (NoSchedule, NoExecute) that no toleration tolerates."""
    tols = tuple(tolerations)
    return [t for t in taints if t.effect in BLOCKING_EFFECTS and not any(tolerates(x, t) for x in tols)]


class FitFailureKind(StrEnum):
    """Which label/taint predicate failed."""

    UNSCHEDULABLE = "Unschedulable"
    NODE_SELECTOR = "NodeSelector"
    AFFINITY = "NodeAffinity"
    TAINT = "Taint"
    GPR_WORKLOAD = "GprWorkload"


@dataclass(frozen=True, slots=True)
class FitFailure:
    """A failed predicate, with the blocking key or taint in ``detail``."""

    kind: FitFailureKind
    detail: str
    key: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def first_failing_requirement(terms: Iterable[SelectorTerm], labels: Mapping[str, str]) -> Requirement | None:
    """For a non-matching affinity: the first failing requirement of its first term (for explanations)."""
    for term in terms:
        for req in term.requirements:
            if not match_requirement(req, labels):
                return req
    return None


def gpr_workload_failure(
    pod: Pod, labels: Mapping[str, str], workloads: Mapping[str, Mapping[str, str]] | None
) -> FitFailure | None:
    """Why ``pod`` may not run on a node an active GPR holds (its labels miss the GPR's ``workloadSelector``), or
    None (no such GPR, or the pod is its workload)."""
    if not workloads:
        return None
    gpr_id = labels.get(GPR_LABEL)
    if gpr_id is None or gpr_id not in workloads:
        return None
    selector = workloads[gpr_id]
    if selector and all(pod.labels.get(k) == v for k, v in selector.items()):
        return None
    want = ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "(empty: no pod)"
    return FitFailure(
        FitFailureKind.GPR_WORKLOAD,
        f"node is held by GPR {gpr_id}; pod labels do not match its workloadSelector {want}",
        key=GPR_LABEL,
    )


def matching_gprs(pod: Pod, workloads: Mapping[str, Mapping[str, str]]) -> tuple[str, ...]:
    """The GPRs of ``workloads`` whose nodes ``pod`` may use (its labels match their selector), sorted: pods with the
    same answer are alike for the GPR workload rule."""
    return tuple(
        sorted(g for g, sel in workloads.items() if sel and all(pod.labels.get(k) == v for k, v in sel.items()))
    )


def static_failure(
    pod: Pod,
    labels: Mapping[str, str],
    taints: Iterable[Taint],
    unschedulable: bool = False,
    workloads: Mapping[str, Mapping[str, str]] | None = None,
) -> FitFailure | None:
    """The first label/taint predicate ``pod`` fails on a node with these labels and taints, or None if it passes
    (``workloads``: the active GPRs' workload selectors, see the module docstring)."""
    if unschedulable:
        return FitFailure(FitFailureKind.UNSCHEDULABLE, "node is cordoned (unschedulable)")
    for k, v in pod.node_selector.items():
        if labels.get(k) != v:
            have = labels.get(k)
            detail = f"nodeSelector {k}={v} (node has {k}={have})" if have is not None else f"nodeSelector {k}={v}"
            return FitFailure(FitFailureKind.NODE_SELECTOR, detail, key=k)
    if pod.affinity and not match_affinity(pod.affinity, labels):  # no required affinity matches every node
        req = first_failing_requirement(pod.affinity, labels)
        detail = f"required node affinity {req}" if req else "required node affinity (empty term)"
        return FitFailure(FitFailureKind.AFFINITY, detail, key=req.key if req else "")
    if taints:  # an empty collection of taints blocks nothing (any other iterable is looked at)
        bad = untolerated(pod.tolerations, taints)
        if bad:
            return FitFailure(FitFailureKind.TAINT, f"taint {bad[0]} not tolerated", key=bad[0].key)
    return gpr_workload_failure(pod, labels, workloads) if workloads else None


def static_fit(
    pod: Pod,
    labels: Mapping[str, str],
    taints: Iterable[Taint],
    unschedulable: bool = False,
    workloads: Mapping[str, Mapping[str, str]] | None = None,
) -> str | None:
    """None if the pod passes every label/taint predicate on such a node, else a sentence saying which failed."""
    failure = static_failure(pod, labels, taints, unschedulable, workloads)
    return None if failure is None else str(failure)
