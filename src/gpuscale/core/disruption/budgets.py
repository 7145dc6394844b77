"""Disruption budgets (cron windows, node counts and percentages) and PodDisruptionBudget allowances.

Budget schedules are 5-field cron expressions evaluated in UTC on the caller's clock (seconds since the Unix epoch):
a budget with ``schedule`` and ``duration_s`` is active during ``[hit, hit + duration)`` for every schedule hit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpuscale.core.cron import parse_cron, window_open
from gpuscale.core.disruption.values import BudgetVerdict, DisruptionReason, PodDisruptionBudget
from gpuscale.core.model import (
    DisruptionBudget,
    NodePool,
    Pod,
)
from gpuscale.errors import InputError


def budget_limit(budget: DisruptionBudget, total_nodes: int, where: str = "budget.nodes") -> int:
    """How many of ``total_nodes`` the budget lets be disrupted at once (a percentage rounds up)."""
    text = str(budget.nodes).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return math.ceil(total_nodes * pct / 100.0 - 1e-9)
        n = int(text)
        if n < 0:
            raise ValueError
        return n
    except ValueError:
        raise InputError(
            "disruption budget nodes must be a non-negative integer or a percentage 0-100%",
            where=where,
            value=budget.nodes,
            fix='write e.g. nodes: "2" or nodes: "10%"',
        ) from None


def budget_active(budget: DisruptionBudget, now: float, where: str = "budget") -> bool:
    """True if the budget applies at ``now``: always without a schedule, else within ``duration_s`` of a hit."""
    if budget.schedule is None:
        return True
    if budget.duration_s is None or budget.duration_s <= 0:
        raise InputError(
            "a disruption budget with a schedule needs a positive duration",
            where=f"{where}.duration",
            value=budget.duration_s,
            fix='add e.g. duration: "8h"',
        )
    return window_open(parse_cron(budget.schedule, f"{where}.schedule"), budget.duration_s, now)


def allowed_disruptions(
    pool: NodePool, reason: DisruptionReason, total_nodes: int, disrupting: int, now: float
) -> BudgetVerdict:
    """The most restrictive active budget of ``pool`` for ``reason`` minus nodes already being disrupted."""
    best: BudgetVerdict = BudgetVerdict(None)
    for i, b in enumerate(pool.disruption.budgets):
        where = f"pool {pool.name}: disruption.budgets[{i}]"
        if b.reasons and str(reason) not in b.reasons:
            continue
        if not budget_active(b, now, where):
            continue
        left = max(0, budget_limit(b, total_nodes, f"{where}.nodes") - disrupting)
        if best.allowed is None or left < best.allowed:
            best = BudgetVerdict(left, b)
    return best


def pdb_allowances(pdbs: Iterable[PodDisruptionBudget], pods: Iterable[Pod]) -> dict[str, int]:
    """Evictions each PDB (``namespace/name``) still allows: ``max_unavailable`` minus its pods not running now."""
    pods = tuple(pods)
    out: dict[str, int] = {}
    for pdb in pdbs:
        down = sum(1 for p in pods if pdb.matches(p) and p.node_name is None and p.phase == "Pending")
        out[f"{pdb.namespace}/{pdb.name}"] = max(0, pdb.max_unavailable - down)
    return out
