"""Why a pending pod got no node: a :class:`~gpuscale.core.plan.Blocked` reason naming the blocking requirement, and
the nodes of active GPRs that refused it (:func:`gpr_refusals`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuscale.core.model import Pod, Snapshot
from gpuscale.core.plan import Blocked, BlockReason
from gpuscale.core.planner.classes import PodClass
from gpuscale.core.planner.context import Context
from gpuscale.core.planner.feasible import ClassOptions
from gpuscale.core.planner.options import Option
from gpuscale.core.predicates import FitFailure, FitFailureKind, gpr_workload_failure, static_failure
from gpuscale.core.resources import Request, Resources

MAX_REFUSALS = 3
"""GPR nodes named in a reason; more are counted."""


def explain(snapshot: Snapshot, choices: ClassOptions, ctx: Context, cls: PodClass, pod: Pod) -> Blocked:
    """Why ``pod`` (of class ``cls``) got no node: the most specific reason across all pools, followed by the
    existing nodes of active GPRs that would pass every other label and taint predicate but refuse the pod."""
    b = _explain(snapshot, choices, ctx, cls, pod)
    refused = gpr_refusals(snapshot, pod) if snapshot.workloads else ()
    return b if not refused else Blocked(b.pod, b.reason, f"{b.message}; {'; '.join(refused)}")


def gpr_refusals(snapshot: Snapshot, pod: Pod) -> tuple[str, ...]:
    """Why the existing nodes of active GPRs refuse ``pod`` (their ``workloadSelector`` does not match it), one
    sentence per node that passes the pod's other label and taint predicates (at most :data:`MAX_REFUSALS`, then a
    count); () when no GPR is active."""
    out: list[str] = []
    for n in sorted(snapshot.nodes, key=lambda n: n.name):
        f = gpr_workload_failure(pod, n.labels, snapshot.workloads)
        if f is not None and static_failure(pod, n.labels, n.taints, n.unschedulable) is None:
            out.append(f"node {n.name}{f.detail.removeprefix('node')}")
    if len(out) > MAX_REFUSALS:
        out[MAX_REFUSALS:] = [f"{len(out) - MAX_REFUSALS} more GPR node(s) refuse it likewise"]
    return tuple(out)


def _explain(snapshot: Snapshot, choices: ClassOptions, ctx: Context, cls: PodClass, pod: Pod) -> Blocked:
    req = pod.request
    if not snapshot.pools:
        return Blocked(pod.key, BlockReason.NO_POOLS, "no GPUNodePool is configured, so no node can be added")
    feasible = choices.feasible(cls)
    if not feasible:
        return _explain_infeasible(snapshot, choices.options, pod)
    available = [o for o in feasible if o.unavailable_until is None]
    if not available:
        until = min(o.unavailable_until or math.inf for o in feasible)
        names = sorted({f"{o.itype.name}/{o.offering.zone}/{o.offering.capacity_type}" for o in feasible})
        when = "until further notice" if math.isinf(until) else f"until t={until:.0f}"
        return Blocked(
            pod.key,
            BlockReason.NO_OFFERING_AVAILABLE,
            f"every offering that fits is unavailable {when}: {', '.join(names[:6])}"
            + (" ..." if len(names) > 6 else ""),
        )
    pools = sorted({o.pool.name: o.pool for o in available}.values(), key=lambda p: p.name)
    at_max = [p for p in pools if p.max_nodes is not None and ctx.pool_nodes.get(p.name, 0) >= p.max_nodes]
    if len(at_max) == len(pools):
        detail = ", ".join(f"{p.name} ({ctx.pool_nodes.get(p.name, 0)}/{p.max_nodes} nodes)" for p in at_max)
        return Blocked(pod.key, BlockReason.POOL_AT_MAX_NODES, f"every pool that fits is at maxNodes: {detail}")
    blocked_by_limits = all(ctx.headroom(o.pool, o.itype) == 0 for o in available if o.pool not in at_max)
    if blocked_by_limits:
        limited = ", ".join(p.name for p in pools if p not in at_max)
        return Blocked(
            pod.key, BlockReason.POOL_AT_LIMITS, f"adding a node would exceed the limits of pool(s) {limited}"
        )
    return Blocked(
        pod.key,
        BlockReason.GANG_INCOMPLETE if pod.gang else BlockReason.POOL_AT_LIMITS,
        f"not enough capacity left in pools for {_fmt_request(req)}",
    )


def _explain_infeasible(snapshot: Snapshot, options: Sequence[Option], pod: Pod) -> Blocked:
    """No option passes the pod's predicates and holds it: the first test every pool fails (labels, taints, size)."""
    req = pod.request
    label_fail: dict[str, FitFailure] = {}
    taint_fail: dict[str, FitFailure] = {}
    size_fail: dict[str, Option] = {}
    pools_without_types = []
    by_pool: dict[str, list[Option]] = {}
    for o in options:
        by_pool.setdefault(o.pool.name, []).append(o)
    for pool in sorted(snapshot.pools, key=lambda p: p.name):
        opts = by_pool.get(pool.name, [])
        if not opts:
            pools_without_types.append(pool.name)
            continue
        label_ok = []
        for o in opts:
            f = static_failure(pod, o.labels, ())
            if f is None:
                label_ok.append(o)
            else:
                label_fail.setdefault(pool.name, f)
        if not label_ok:
            continue
        label_fail.pop(pool.name, None)
        taint_ok = []
        for o in label_ok:
            f = static_failure(pod, o.labels, o.taints)
            if f is None:
                taint_ok.append(o)
            else:
                taint_fail.setdefault(pool.name, f)
        if not taint_ok:
            continue
        taint_fail.pop(pool.name, None)
        biggest = max(taint_ok, key=lambda o: (o.alloc.gpus, o.alloc.cpu_milli, o.alloc.memory_mib, -o.index))
        size_fail[pool.name] = biggest
    if size_fail:
        sizes = "; ".join(
            f"pool {p}: largest {o.itype.name} has {_fmt_resources(o.alloc, o.itype.gpu_model)}"
            for p, o in sorted(size_fail.items())
        )
        model = f" on GPU model {'|'.join(sorted(req.gpu_models))}" if req.gpu_models and req.wants_gpu else ""
        return Blocked(
            pod.key,
            BlockReason.TOO_LARGE,
            f"request {_fmt_request(req)}{model} is larger than the biggest instance type of every matching "
            f"pool ({sizes})",
        )
    if taint_fail:
        detail = "; ".join(f"pool {p}: {f.detail}" for p, f in sorted(taint_fail.items()))
        return Blocked(pod.key, BlockReason.TAINT_NOT_TOLERATED, f"matching pools taint their nodes: {detail}")
    if label_fail:
        keys = sorted({f.key for f in label_fail.values() if f.key})
        detail = "; ".join(
            f"pool {p}: {_requirement_text(pod, f)}{_offered(by_pool[p], f.key)}" for p, f in sorted(label_fail.items())
        )
        return Blocked(
            pod.key,
            BlockReason.NO_MATCHING_POOL,
            f"no pool matches the pod's node selector/affinity on {', '.join(keys) or 'labels'} ({detail})",
        )
    return Blocked(
        pod.key,
        BlockReason.NO_MATCHING_POOL,
        f"no pool has instance types in the catalog ({', '.join(pools_without_types)})",
    )


def _requirement_text(pod: Pod, f: FitFailure) -> str:
    """The pod's own requirement that failed, without the node's side (the options are listed separately)."""
    if f.kind is FitFailureKind.NODE_SELECTOR and f.key in pod.node_selector:
        return f"nodeSelector {f.key}={pod.node_selector[f.key]}"
    return f.detail


def _offered(opts: Sequence[Option], key: str) -> str:
    values = sorted({o.labels[key] for o in opts if key in o.labels})
    if not key:
        return ""
    if not values:
        return f"; its nodes have no {key} label"
    shown = ", ".join(values[:8]) + (" ..." if len(values) > 8 else "")
    return f"; its nodes offer {key} in [{shown}]"


def _fmt_request(r: Request) -> str:
    parts = [f"cpu={r.cpu_milli}m", f"memory={r.memory_mib}Mi"]
    if r.gpus:
        parts.append(f"nvidia.com/gpu={r.gpus}")
    if r.gpu_milli:
        parts.append(f"gpuscale.io/gpu-milli={r.gpu_milli}")
    return ", ".join(parts)


def _fmt_resources(a: Resources, model: str | None) -> str:
    gpu = f", {a.gpus}x {model or 'GPU'}" if a.gpus else ", no GPU"
    return f"cpu={a.cpu_milli}m, memory={a.memory_mib}Mi{gpu}"
