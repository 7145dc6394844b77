"""``v1/Pod`` -> :class:`gpuscale.core.model.Pod`, with kube-scheduler's effective-request rules.

Effective request, per resource (as kube-scheduler computes it)::

    max(sum(containers) + sum(sidecars), max over init containers i of (init_i + sidecars started before i))
    + spec.overhead

where sidecars are init containers with ``restartPolicy: Always``. A container (or the pod, via ``spec.resources``)
that gives only ``limits`` for a resource requests that limit. Whole GPUs (``nvidia.com/gpu``) and fractions of one
GPU (``gpuscale.io/gpu-milli``) follow :mod:`gpuscale.core.resources`: one pod asks for one or the other; the
fractions of all its containers share one physical GPU, so their sum must stay below 1000.

Resources other than cpu, memory and the two GPU resources (``ephemeral-storage``, hugepages, other extended
resources) are not modelled: they are reported as notes, not errors.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from gpuscale.core import labels as L
from gpuscale.core.model import Pod, Requirement, SelectorOperator, SelectorTerm, Toleration
from gpuscale.core.resources import GPU_MILLI_RESOURCE, GPU_RESOURCE, MILLI_PER_GPU, Request
from gpuscale.manifests.fields import (
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_fields,
    choice,
    requirement,
    str_map,
    toleration,
)
from gpuscale.manifests.problems import Doc, FieldError, Notes
from gpuscale.manifests.quantity import (
    MAX_COUNT,
    MAX_CPU_CORES,
    MAX_QUANTITY,
    QUANTITY_HELP,
    parse_quantity,
    to_cpu_milli,
    to_memory_mib,
    whole_count,
)

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
COMPLETED_PHASES = ("Succeeded", "Failed")
RESOURCES = ("cpu", "memory", GPU_RESOURCE, GPU_MILLI_RESOURCE)
EXTENDED = (GPU_RESOURCE, GPU_MILLI_RESOURCE)
RESOURCE_FIELDS = ("requests", "limits", "claims")

Vec = dict[str, Fraction]


def _zero() -> Vec:
    return dict.fromkeys(RESOURCES, Fraction(0))


def _add(a: Vec, b: Vec) -> Vec:
    return {r: a[r] + b[r] for r in RESOURCES}


def _max(a: Vec, b: Vec) -> Vec:
    return {r: max(a[r], b[r]) for r in RESOURCES}


def read_pod(doc: Doc, obj: dict[str, Any], notes: Notes) -> Pod | None:
    """The core Pod of a ``v1/Pod`` document; None if it is completed, gated, or has problems (reported to doc)."""
    meta = _section(doc, obj, "metadata")
    spec = _section(doc, obj, "spec")
    status = _section(doc, obj, "status")

    name, namespace = "", "default"
    with doc.field():
        name = as_str(meta.get("name"), "metadata.name", required=True)
    with doc.field():
        namespace = as_str(meta.get("namespace"), "metadata.namespace") or "default"
    doc.name = f"{namespace}/{name}" if name else ""

    phase = "Pending"
    with doc.field():
        if status.get("phase") is not None:
            phase = choice(status.get("phase"), "status.phase", PHASES)
    if phase in COMPLETED_PHASES:
        notes.add(f"ignored completed pods (phase {phase})")
        return None

    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    with doc.field():
        labels = str_map(meta.get("labels"), "metadata.labels")
    with doc.field():
        annotations = str_map(meta.get("annotations"), "metadata.annotations")
    is_daemonset = False
    with doc.field():
        for i, ref in enumerate(as_list(meta.get("ownerReferences"), "metadata.ownerReferences")):
            if as_mapping(ref, f"metadata.ownerReferences[{i}]").get("kind") == "DaemonSet":
                is_daemonset = True

    request = _effective_request(doc, spec, notes)
    node_selector: dict[str, str] = {}
    with doc.field():
        node_selector = str_map(spec.get("nodeSelector"), "spec.nodeSelector")
    affinity = _affinity(doc, spec.get("affinity"), notes)
    tolerations: list[Toleration] = []
    with doc.field():
        for i, t in enumerate(as_list(spec.get("tolerations"), "spec.tolerations")):
            tol = toleration(doc, t, f"spec.tolerations[{i}]")
            if tol is not None:
                tolerations.append(tol)
    priority = 0
    with doc.field():
        if spec.get("priority") is not None:
            priority = as_int(spec.get("priority"), "spec.priority")
    node_name: str | None = None
    with doc.field():
        node_name = as_str(spec.get("nodeName"), "spec.nodeName") or None
    gang, gang_size = _gang(doc, annotations)

    if doc.failed or request is None:
        return None
    if node_name is None and spec.get("schedulingGates"):
        notes.add("ignored pending pods with spec.schedulingGates (not ready for scheduling)")
        return None
    return Pod(
        name=name,
        namespace=namespace,
        request=request,
        node_selector=node_selector,
        affinity=affinity,
        tolerations=tuple(tolerations),
        priority=priority,
        node_name=node_name,
        phase=phase,
        labels=labels,
        annotations=annotations,
        gang=gang,
        gang_size=gang_size,
        is_daemonset=is_daemonset,
    )


def _section(doc: Doc, obj: dict[str, Any], key: str) -> dict[str, Any]:
    try:
        return as_mapping(obj.get(key), key)
    except FieldError as err:
        doc.report(err)
        return {}


def _effective_request(doc: Doc, spec: dict[str, Any], notes: Notes) -> Request | None:
    containers: list[Any] = []
    inits: list[Any] = []
    with doc.field():
        containers = as_list(spec.get("containers"), "spec.containers")
        if not containers:
            raise FieldError("spec.containers", "a pod needs at least one container", fix="add spec.containers")
    with doc.field():
        inits = as_list(spec.get("initContainers"), "spec.initContainers")

    total = _zero()
    one_too_big = False  # a container asking for >= 1000 milli-GPU is reported on its own
    for i, c in enumerate(containers):
        req = _container(doc, c, f"spec.containers[{i}]", notes)
        one_too_big |= req[GPU_MILLI_RESOURCE] >= MILLI_PER_GPU
        total = _add(total, req)
    sidecars, init_peak = _zero(), _zero()
    for i, c in enumerate(inits):
        path = f"spec.initContainers[{i}]"
        req = _container(doc, c, path, notes)
        one_too_big |= req[GPU_MILLI_RESOURCE] >= MILLI_PER_GPU
        restart = c.get("restartPolicy") if isinstance(c, dict) else None
        if restart == "Always":
            sidecars = _add(sidecars, req)
            init_peak = _max(init_peak, sidecars)
        else:
            if restart is not None:
                doc.error(f"{path}.restartPolicy", "must be Always (a sidecar) or absent", restart)
            init_peak = _max(init_peak, _add(req, sidecars))
    eff = _max(_add(total, sidecars), init_peak)

    pod_level = _pod_level(doc, spec, notes)
    for r, v in pod_level.items():
        eff[r] = v
    with doc.field():
        overhead = as_mapping(spec.get("overhead"), "spec.overhead")
        eff = _add(eff, _read_resources(doc, overhead, "spec.overhead", notes))

    gpus, milli = int(eff[GPU_RESOURCE]), int(eff[GPU_MILLI_RESOURCE])
    if gpus and milli:
        doc.error(
            "spec.containers",
            f"asks for whole GPUs ({GPU_RESOURCE}: {gpus}) and a GPU fraction ({GPU_MILLI_RESOURCE}: {milli})",
            fix=f"a pod uses either {GPU_RESOURCE} (whole GPUs) or {GPU_MILLI_RESOURCE} (a fraction of one GPU)",
        )
    elif milli >= MILLI_PER_GPU and not one_too_big:
        doc.error(
            "spec.containers",
            f"the {GPU_MILLI_RESOURCE} of all containers share one GPU and must add up to less than {MILLI_PER_GPU}",
            milli,
            fix=f"use {GPU_RESOURCE} for whole GPUs",
        )
    for res, bound in (("cpu", MAX_CPU_CORES), ("memory", int(MAX_QUANTITY)), (GPU_RESOURCE, MAX_COUNT)):
        if eff[res] > bound:
            doc.error("spec.containers", f"the pod's {res} request adds up to more than {bound:,}",
                      fix="ask for what one node can give")  # fmt: skip
    if doc.failed:
        return None
    return Request(
        cpu_milli=to_cpu_milli(eff["cpu"]),
        memory_mib=to_memory_mib(eff["memory"]),
        gpus=gpus,
        gpu_milli=milli,
    )


def _pod_level(doc: Doc, spec: dict[str, Any], notes: Notes) -> Vec:
    """Pod-level ``spec.resources`` (cpu and memory), which replace the container sums when given."""
    out: Vec = {}
    try:
        res = as_mapping(spec.get("resources"), "spec.resources")
    except FieldError as err:
        doc.report(err)
        return out
    if not res:
        return out
    check_fields(doc, res, "spec.resources", RESOURCE_FIELDS)
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    with doc.field():
        requests = as_mapping(res.get("requests"), "spec.resources.requests")
    with doc.field():
        limits = as_mapping(res.get("limits"), "spec.resources.limits")
    req = _read_resources(doc, requests, "spec.resources.requests", notes)
    lim = _read_resources(doc, limits, "spec.resources.limits", notes)
    for r in ("cpu", "memory"):
        if r in requests:
            out[r] = req[r]
        elif r in limits:
            out[r] = lim[r]
    return out


def _container(doc: Doc, c: object, path: str, notes: Notes) -> Vec:
    try:
        container = as_mapping(c, path)
        res = as_mapping(container.get("resources"), f"{path}.resources")
    except FieldError as err:
        doc.report(err)
        return _zero()
    check_fields(doc, res, f"{path}.resources", RESOURCE_FIELDS)
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    with doc.field():
        requests = as_mapping(res.get("requests"), f"{path}.resources.requests")
    with doc.field():
        limits = as_mapping(res.get("limits"), f"{path}.resources.limits")
    req = _read_resources(doc, requests, f"{path}.resources.requests", notes)
    lim = _read_resources(doc, limits, f"{path}.resources.limits", notes)
    out = _zero()
    for r in RESOURCES:
        if r in requests:
            out[r] = req[r]
            if r in limits and r in EXTENDED and req[r] != lim[r]:
                doc.error(
                    f"{path}.resources.requests.{r}",
                    f"requests and limits of {r} must be equal (got limit {limits[r]!r})",
                    requests[r],
                    fix="set both to the same value, or give only limits",
                )
            elif r in limits and req[r] > lim[r]:
                doc.error(f"{path}.resources.requests.{r}", f"exceeds the limit {limits[r]!r}", requests[r])
        elif r in limits:
            out[r] = lim[r]
    milli = out[GPU_MILLI_RESOURCE]
    if milli >= MILLI_PER_GPU:
        whole = milli / MILLI_PER_GPU
        hint = f" ({GPU_RESOURCE}: {int(whole)})" if whole.denominator == 1 else ""
        doc.error(
            f"{path}.resources",
            f"{GPU_MILLI_RESOURCE} is a fraction of one GPU and must be 1..{MILLI_PER_GPU - 1}",
            int(milli),
            fix=f"use {GPU_RESOURCE} for whole GPUs{hint}",
        )
    return out


def _read_resources(doc: Doc, m: dict[str, Any], path: str, notes: Notes) -> Vec:
    """Parse the known resources of a requests/limits/overhead mapping (exact: cores, bytes, GPUs, milli-GPU)."""
    out = _zero()
    for key, raw in m.items():
        where = f"{path}.{key}"
        if key not in RESOURCES:
            notes.add(f"resource {key!r} is not modelled; ignored")
            continue
        with doc.field():
            try:
                if key in EXTENDED:
                    out[key] = Fraction(whole_count(raw))
                else:
                    out[key] = parse_quantity(raw)
                    if out[key] < 0:
                        raise ValueError("must not be negative")
            except ValueError as exc:
                raise FieldError(where, str(exc), raw, fix=_fix_for(key, raw)) from None
    return out


def _fix_for(resource: str, raw: object) -> str:
    if resource == GPU_RESOURCE:
        return f"whole GPUs only; for a fraction of one GPU use {GPU_MILLI_RESOURCE} (e.g. 500 for half a GPU)"
    if resource == GPU_MILLI_RESOURCE:
        return "an integer 1..999 (thousandths of one GPU)"
    return QUANTITY_HELP


NODE_AFFINITY_FIELDS = (
    "requiredDuringSchedulingIgnoredDuringExecution",
    "preferredDuringSchedulingIgnoredDuringExecution",
)


def _affinity(doc: Doc, raw: object, notes: Notes) -> tuple[SelectorTerm, ...]:
    """Terms of required node affinity (ORed). ``matchFields`` on ``metadata.name`` become hostname requirements."""
    try:
        aff = as_mapping(raw, "spec.affinity")
    except FieldError as err:
        doc.report(err)
        return ()
    check_fields(doc, aff, "spec.affinity", ("nodeAffinity", "podAffinity", "podAntiAffinity"))
    for kind in ("podAffinity", "podAntiAffinity"):
        if aff.get(kind):
            notes.add(f"spec.affinity.{kind} is not modelled; ignored")
    try:
        node_aff = as_mapping(aff.get("nodeAffinity"), "spec.affinity.nodeAffinity")
        check_fields(doc, node_aff, "spec.affinity.nodeAffinity", NODE_AFFINITY_FIELDS)
        base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        required = as_mapping(node_aff.get(NODE_AFFINITY_FIELDS[0]), base)
        check_fields(doc, required, base, ("nodeSelectorTerms",))
        terms_raw = as_list(required.get("nodeSelectorTerms"), f"{base}.nodeSelectorTerms")
        if required and not terms_raw:
            raise FieldError(f"{base}.nodeSelectorTerms", "needs at least one term", fix="add a term or remove it")
    except FieldError as err:
        doc.report(err)
        return ()
    terms: list[SelectorTerm] = []
    for i, t in enumerate(terms_raw):
        path = f"{base}.nodeSelectorTerms[{i}]"
        reqs: list[Requirement] = []
        try:
            term = as_mapping(t, path)
            check_fields(doc, term, path, ("matchExpressions", "matchFields"))
            exprs = as_list(term.get("matchExpressions"), f"{path}.matchExpressions")
            fields = as_list(term.get("matchFields"), f"{path}.matchFields")
        except FieldError as err:
            doc.report(err)
            continue
        for j, e in enumerate(exprs):
            r = requirement(doc, e, f"{path}.matchExpressions[{j}]")
            if r is not None:
                reqs.append(r)
        for j, f in enumerate(fields):
            r = _match_field(doc, f, f"{path}.matchFields[{j}]")
            if r is not None:
                reqs.append(r)
        terms.append(SelectorTerm(tuple(reqs)))
    return tuple(terms)


def _match_field(doc: Doc, raw: object, path: str) -> Requirement | None:
    """``matchFields`` supports only ``metadata.name`` In/NotIn; it is read as the ``kubernetes.io/hostname`` label."""
    r = requirement(doc, raw, path)
    if r is None:
        return None
    if r.key != "metadata.name":
        doc.error(f"{path}.key", "matchFields supports only metadata.name", r.key, fix="use matchExpressions on labels")
        return None
    if r.operator not in (SelectorOperator.IN, SelectorOperator.NOT_IN):
        doc.error(f"{path}.operator", "matchFields supports only In and NotIn", str(r.operator))
        return None
    return Requirement(L.HOSTNAME, r.operator, r.values)


def _gang(doc: Doc, annotations: dict[str, str]) -> tuple[str | None, int]:
    gang = annotations.get(L.GANG_ANNOTATION) or None
    size_raw = annotations.get(L.GANG_SIZE_ANNOTATION)
    path = f"metadata.annotations.{L.GANG_SIZE_ANNOTATION}"
    if gang is None:
        if size_raw is not None:
            doc.error(path, f"is set but {L.GANG_ANNOTATION} is not", size_raw, fix=f"add {L.GANG_ANNOTATION}: <name>")
        return None, 0
    if size_raw is None:
        doc.error(path, f"is required with {L.GANG_ANNOTATION}", fix=f'add {L.GANG_SIZE_ANNOTATION}: "<pods in gang>"')
        return gang, 0
    size = int(size_raw) if isinstance(size_raw, str) and re.fullmatch(r"[0-9]{1,6}", size_raw) else 0
    if size < 1:
        doc.error(path, "must be a positive integer", size_raw, fix='e.g. "4"')
    return gang, size
