"""The GPU-budget arbiter, pure: scalers sharing a ``GPUBudget`` get whole replicas of GPUs when their desired
replicas do not all fit.

1. **Guarantees.** Each model's scalers are served from its ``guaranteedGPUs`` first (higher priority first, then
   larger unmet demand, then name): a model never gets less than ``min(its demand, its guarantee)`` (in whole
   replicas) while the guarantees fit the total.
2. **Lending.** The part of a guarantee its model does not use is idle; ``elasticShare`` of it (rounded down) is lent
   to the shared pool, with the GPUs no model guarantees. The owner reclaims it at the next arbitration simply by
   asking: step 1 serves it before anything is lent.
3. **Elastic grants.** The pool goes by priority tier (highest first); inside a tier one replica at a time to the
   scaler with the largest unmet demand in GPUs (then name), while a replica fits.

Every grant and refusal carries its explanation; :func:`arbitrate` also takes the previous arbitration so that a
reclaim is named as such.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ModelShare:
    name: str
    guaranteed_gpus: int


@dataclass(frozen=True, slots=True)
class Budget:
    name: str
    total_gpus: int
    elastic_share: float = 1.0
    """Fraction (0..1) of a model's idle guaranteed GPUs that may be lent to other models."""
    models: tuple[ModelShare, ...] = ()

    def guarantee(self, model: str) -> int:
        return next((m.guaranteed_gpus for m in self.models if m.name == model), 0)


@dataclass(frozen=True, slots=True)
class Demand:
    scaler: str
    model: str
    desired: int
    """Replicas the scaler wants."""
    priority: int = 0
    gpus_per_replica: int = 1


@dataclass(frozen=True, slots=True)
class Grant:
    scaler: str
    model: str
    desired: int
    granted: int
    """Replicas granted (<= desired)."""
    gpus: int
    guaranteed_gpus: int
    """GPUs of ``gpus`` that came from the model's own guarantee."""
    borrowed: Mapping[str, int] = field(default_factory=dict)
    """Idle guaranteed GPUs of other models used by this grant, by model."""
    reasons: tuple[str, ...] = ()

    @property
    def refused(self) -> int:
        return self.desired - self.granted


@dataclass(frozen=True, slots=True)
class Arbitration:
    budget: str
    grants: tuple[Grant, ...]
    used_gpus: int
    free_gpus: int
    """GPUs left unassigned (including idle guarantees that are not lendable)."""
    lent: Mapping[str, int] = field(default_factory=dict)
    """Idle guaranteed GPUs of each model lent to others."""
    notes: tuple[str, ...] = ()

    def by_scaler(self) -> dict[str, Grant]:
        return {g.scaler: g for g in self.grants}

    def status(self) -> dict[str, object]:
        """The GPUBudget's ``status`` (``deploy/crds/gpubudget.yaml``): usage, loans, GPUs granted per model, notes
        and every grant explained (the controller adds ``conditions`` when the budget itself is invalid)."""
        models: dict[str, int] = {}
        for g in self.grants:
            models[g.model] = models.get(g.model, 0) + g.gpus
        return {
            "usedGPUs": self.used_gpus,
            "freeGPUs": self.free_gpus,
            "lent": dict(self.lent),
            "grants": [
                {"scaler": g.scaler, "model": g.model, "desired": g.desired, "granted": g.granted, "gpus": g.gpus,
                 "borrowed": dict(g.borrowed), "reasons": list(g.reasons)}
                for g in self.grants
            ],
            "models": {m: {"grantedGPUs": n} for m, n in sorted(models.items())},
            "notes": list(self.notes),
        }  # fmt: skip


@dataclass(slots=True)
class _Acc:
    d: Demand
    granted: int = 0
    own: int = 0
    borrowed: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    @property
    def unmet_gpus(self) -> int:
        return (self.d.desired - self.granted) * self.d.gpus_per_replica


def arbitrate(budget: Budget, demands: Sequence[Demand], previous: Arbitration | None = None) -> Arbitration:
    """Grant replicas to ``demands`` within ``budget`` (see the module docstring)."""
    accs = {d.scaler: _Acc(d) for d in demands}
    notes: list[str] = []
    guarantees = {m.name: m.guaranteed_gpus for m in budget.models}
    if sum(guarantees.values()) > budget.total_gpus:  # they do not fit: serve the highest-priority models' first
        room = budget.total_gpus
        ranked = sorted(guarantees, key=lambda m: (-max((d.priority for d in demands if d.model == m), default=0), m))
        for m in ranked:
            guarantees[m], room = min(guarantees[m], room), room - min(guarantees[m], room)
        notes.append(f"guarantees exceed the {budget.total_gpus} GPUs of the budget: honoured by priority")

    # 1. guarantees
    used_own: dict[str, int] = {}
    for model, g in guarantees.items():
        left = g
        for a in sorted((a for a in accs.values() if a.d.model == model), key=_order):
            n = min(a.d.desired, left // a.d.gpus_per_replica)
            if n > 0:
                a.granted, a.own = n, n * a.d.gpus_per_replica
                left -= a.own
                a.reasons.append(f"{n} from {model}'s guarantee ({a.own} of {g} GPUs)")
        used_own[model] = g - left

    # 2. lending
    pool_sources: list[tuple[str, int]] = [("", budget.total_gpus - sum(guarantees.values()))]
    lent_capacity: dict[str, int] = {}
    for model, g in guarantees.items():
        idle = g - used_own[model]
        lendable = int(idle * budget.elastic_share)
        if lendable > 0:
            lent_capacity[model] = lendable
            pool_sources.append((model, lendable))
        if idle - lendable > 0:
            notes.append(f"{idle - lendable} idle GPUs of {model}'s guarantee kept in reserve (elasticShare)")

    # 3. elastic grants, by priority tier, largest unmet demand first
    def take(n: int) -> dict[str, int]:
        got: dict[str, int] = {}
        for i, (src, left) in enumerate(pool_sources):
            use = min(left, n)
            if use:
                got[src] = got.get(src, 0) + use
                pool_sources[i] = (src, left - use)
                n -= use
        return got

    pool = sum(left for _, left in pool_sources)
    for prio in sorted({a.d.priority for a in accs.values()}, reverse=True):
        tier = [a for a in accs.values() if a.d.priority == prio and a.unmet_gpus > 0]
        extra: dict[str, int] = {}
        while True:
            fits = [a for a in tier if a.unmet_gpus > 0 and a.d.gpus_per_replica <= pool]
            if not fits:
                break
            a = min(fits, key=lambda x: (-x.unmet_gpus, x.d.scaler))
            for src, n in take(a.d.gpus_per_replica).items():
                if src and src != a.d.model:
                    a.borrowed[src] = a.borrowed.get(src, 0) + n
                elif src == a.d.model:
                    a.own += n
            pool -= a.d.gpus_per_replica
            a.granted += 1
            extra[a.d.scaler] = extra.get(a.d.scaler, 0) + 1
        for a in tier:
            if extra.get(a.d.scaler):
                a.reasons.append(f"{extra[a.d.scaler]} from the shared pool at priority {prio}")
            if a.d.desired > a.granted:
                a.reasons.append(_refusal(a, accs, pool))

    lent = {m: sum(a.borrowed.get(m, 0) for a in accs.values()) for m in guarantees}
    for a in accs.values():
        for m, n in sorted(a.borrowed.items()):
            a.reasons.append(f"{n} GPUs borrowed from {m}'s idle guarantee (reclaimed when {m} needs them)")
    if previous is not None:
        _reclaims(previous, accs)
    grants = tuple(
        Grant(a.d.scaler, a.d.model, a.d.desired, a.granted, a.granted * a.d.gpus_per_replica,
              min(a.own, a.granted * a.d.gpus_per_replica), dict(a.borrowed), tuple(a.reasons) or ("nothing wanted",))
        for a in accs.values()
    )  # fmt: skip
    used = sum(g.gpus for g in grants)
    for m, n in sorted(lent.items()):
        if n:
            notes.append(f"{m} lends {n} idle guaranteed GPUs")
    return Arbitration(budget.name, grants, used, budget.total_gpus - used, {m: n for m, n in lent.items() if n},
                       tuple(notes))  # fmt: skip


def _order(a: _Acc) -> tuple[int, int, str]:
    return (-a.d.priority, -a.unmet_gpus, a.d.scaler)


def _refusal(a: _Acc, accs: Mapping[str, _Acc], pool: int) -> str:
    above = sorted(x.d.scaler for x in accs.values() if x.d.priority > a.d.priority and x.granted > 0)
    same = sorted(x.d.scaler for x in accs.values() if x.d.priority == a.d.priority and x is not a and x.granted > 0)
    who = ""
    if above:
        who = f"; higher priority first: {', '.join(above)}"
    elif same:
        who = f"; shared with equal priority by unmet demand: {', '.join(same)}"
    return (f"refused {a.d.desired - a.granted} replicas ({a.unmet_gpus} GPUs): {pool} GPUs left in the budget, "
            f"{a.d.gpus_per_replica} needed per replica{who}")  # fmt: skip


def _reclaims(previous: Arbitration, accs: Mapping[str, _Acc]) -> None:
    before = previous.by_scaler()
    for a in accs.values():
        old = before.get(a.d.scaler)
        if old is None:
            continue
        for m, n in old.borrowed.items():
            lost = n - a.borrowed.get(m, 0)
            if lost > 0:
                a.reasons.append(f"{lost} GPUs reclaimed by {m}")
