"""The greedy, cost-aware packer of the pods left onto new nodes.

For the first class with pods left, each of its feasible options (highest pool weight with headroom) fills one fresh
node with that class first, then every other class that fits; score = $/h ÷ value packed (a class's value is its
reference cost per pod); the lowest score wins and its pattern repeats while the pods last, within the pool's room.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter

from gpuscale.core.memo import Memo
from gpuscale.core.model import InstanceType, NodePool, Pod
from gpuscale.core.planner.bins import Bin
from gpuscale.core.planner.classes import PodClass
from gpuscale.core.planner.context import Context, NewNodes, unbounded
from gpuscale.core.planner.feasible import ClassOptions
from gpuscale.core.planner.gangs import fewest_nodes
from gpuscale.core.planner.options import Option

EPS = 1e-9
_RANK = itemgetter(0, 1, 2)
"""Options ranked by price per value, then price, then option index (unique: a total order)."""

_Candidate = tuple[Option, int, tuple[str, str], NodePool, InstanceType, int, float, bool]
"""An option a class may buy now: (option, its pods per empty node, (pool, type), pool, type, pool weight, price,
whether the pool has neither maxNodes nor limits: then it always has room)."""

_CANDIDATES: Memo[tuple[list[_Candidate], bool]] = Memo(4096)
"""Per (class key, option table): the class's available options, in table order, with what ranking reads of them
(the same for every plan on that table; the table marks what is unavailable), and whether all their pools are
unbounded."""

_ALONE: Memo[tuple[Option, int] | None] = Memo(4096)
"""Per (class key, option table, pods left, candidate types): :meth:`GreedyPacker._best_pattern`'s choice (option,
pods of the class per node) when no other class has pods left and every pool the class may use is unbounded. The
choice then reads nothing else: no headroom, and the fill of a node finds no other class to add."""


class _Compatible:
    """Per (option index, wants a GPU): the classes of one pack that may use the option, in pack order; built on first
    use (a class alone whose choice is memoised never reads it)."""

    def __init__(self, order: Sequence[PodClass], choices: ClassOptions) -> None:
        self._order = order
        self._choices = choices
        self._table: dict[tuple[int, bool], list[PodClass]] | None = None

    def table(self) -> dict[tuple[int, bool], list[PodClass]]:
        if self._table is None:
            self._table = {}
            for c in self._order:
                wants_gpu = c.request.wants_gpu
                for o in self._choices.feasible(c):
                    self._table.setdefault((o.index, wants_gpu), []).append(c)
        return self._table


class GreedyPacker:
    """Packs pods onto new nodes of the options ``choices`` offers, trying ``candidate_types`` types per class."""

    def __init__(
        self,
        choices: ClassOptions,
        class_of: Callable[[Pod], PodClass],
        candidate_types: int,
        table: tuple[Option, ...] | None = None,
    ) -> None:
        self.choices = choices
        self.class_of = class_of
        self.candidate_types = candidate_types
        self.table = table
        """The option table ``choices`` was built on (its identity keys the per-class candidates across plans)."""

    def _candidates(self, cls: PodClass) -> tuple[list[_Candidate], bool]:
        """The class's candidates and whether every one of them is in an unbounded pool."""

        def make() -> tuple[list[_Candidate], bool]:
            got = [
                (o, solo, (o.pool.name, o.itype.name), o.pool, o.itype, o.pool.weight, o.price, unbounded(o.pool))
                for o, solo in zip(self.choices.feasible(cls), self.choices.solo(cls), strict=True)
                if o.unavailable_until is None
            ]
            return got, all(c[7] for c in got)

        if self.table is None:
            return make()
        return _CANDIDATES.get(make, cls.key, objects=(self.table,))

    def pack(self, ctx: Context, pods: Sequence[Pod], gang_tolerance: float | None = None) -> list[Pod]:
        """Greedy pattern packing of ``pods`` onto new nodes. Returns the pods left without a node.

        ``gang_tolerance`` (a gang's members only): prefer the options holding the most members per node within that
        fraction of the cheapest price per member (:mod:`~gpuscale.core.planner.gangs`)."""
        order: list[PodClass] = []
        remaining: dict[int, list[Pod]] = {}
        for pod in pods:
            cls = self.class_of(pod)
            if cls.index not in remaining:
                remaining[cls.index] = []
                order.append(cls)
            remaining[cls.index].append(pod)
        compatible = _Compatible(order, self.choices)
        left: list[Pod] = []
        for cls in order:
            while remaining[cls.index]:
                choice = self._best_pattern(ctx, cls, remaining, compatible, gang_tolerance)
                if choice is None:
                    left.extend(remaining[cls.index])
                    remaining[cls.index] = []
                    break
                opt, pattern = choice
                reps = min(len(remaining[k]) // n for k, n in pattern.items())
                reps = max(1, min(reps, ctx.headroom(opt.pool, opt.itype)))
                group = NewNodes(opt, pattern, reps)
                for _ in range(reps):
                    node_pods: list[str] = []
                    for k, n in pattern.items():
                        take, remaining[k] = remaining[k][:n], remaining[k][n:]
                        node_pods.extend(p.key for p in take)
                    group.pods.append(node_pods)
                ctx.add_nodes(opt, reps)
                ctx.groups.append(group)
        return left

    def _best_pattern(
        self,
        ctx: Context,
        cls: PodClass,
        remaining: Mapping[int, list[Pod]],
        compatible: _Compatible,
        gang_tolerance: float | None = None,
    ) -> tuple[Option, dict[int, int]] | None:
        """The cheapest-per-value way to open one node for ``cls`` (filled with whatever else fits)."""
        candidates, unbounded_only = self._candidates(cls)
        n_left = len(remaining[cls.index])
        if gang_tolerance is not None:
            few = fewest_nodes(candidates, [(c[6], c[1]) for c in candidates], n_left, gang_tolerance)
            if len(few) < len(candidates):
                found = self._search(ctx, cls, few, remaining, compatible.table())
                if found is not None:
                    return found[0], found[2]
        if unbounded_only and self.table is not None and not any(v for k, v in remaining.items() if k != cls.index):

            def search() -> tuple[Option, int] | None:
                found = self._search(ctx, cls, candidates, remaining, compatible.table())
                return None if found is None else found[:2]

            got = _ALONE.get(search, (cls.key, n_left, self.candidate_types), objects=(self.table,))
            return None if got is None else (got[0], {cls.index: got[1]})
        choice = self._search(ctx, cls, candidates, remaining, compatible.table())
        return None if choice is None else (choice[0], choice[2])

    def _search(
        self,
        ctx: Context,
        cls: PodClass,
        candidates: list[_Candidate],
        remaining: Mapping[int, list[Pod]],
        compatible: dict[tuple[int, bool], list[PodClass]],
    ) -> tuple[Option, int, dict[int, int]] | None:
        """:meth:`_best_pattern`'s search: (option, pods of ``cls`` per node, pattern)."""
        n_left = len(remaining[cls.index])
        ref = self.choices.ref_cost(cls)
        ranked: list[tuple[float, float, int, Option]] = []
        top_weight: int | None = None
        room: dict[tuple[str, str], int] = {}
        headroom = ctx.headroom
        for o, solo_max, rk, pool, itype, weight, price, free in candidates:
            if not free:
                r = room.get(rk)
                if r is None:
                    r = room[rk] = headroom(pool, itype)
                if r <= 0:
                    continue
            if top_weight is None or weight > top_weight:
                top_weight, ranked = weight, []
            elif weight < top_weight:
                continue
            solo = min(n_left, solo_max)
            ranked.append((price / (solo * ref) if ref > 0 else price, price, o.index, o))
        if not ranked:
            return None
        ranked.sort(key=_RANK)
        best: tuple[float, float, float, int] | None = None
        chosen: tuple[Option, int, dict[int, int]] | None = None
        seen_types: set[tuple[str, str]] = set()
        for _, _, _, o in ranked:
            if (o.pool.name, o.itype.name) in seen_types:
                continue
            seen_types.add((o.pool.name, o.itype.name))
            pattern, value = self._fill(o, cls, remaining, compatible)
            score = o.price / value if value > EPS else math.inf
            key = (round(score, 9), -round(value, 9), o.price, o.index)
            if best is None or key < best:
                best, chosen = key, (o, pattern[cls.index], pattern)
            if len(seen_types) >= self.candidate_types:
                break
        return chosen

    def _fill(
        self,
        o: Option,
        first: PodClass,
        remaining: Mapping[int, list[Pod]],
        compatible: dict[tuple[int, bool], list[PodClass]],
    ) -> tuple[dict[int, int], float]:
        """Fill one empty node of ``o`` with ``first``, then every compatible class in order; (pattern, value)."""
        b = Bin(o.alloc, o.itype.gpu_model)
        n = b.fit_count(first.request, len(remaining[first.index]))
        b.add(first.request, n)
        pattern = {first.index: n}
        value = n * self.choices.ref_cost(first)
        for wants_gpu in (True, False):
            key = (o.index, wants_gpu)
            classes = compatible.get(key, [])
            exhausted = 0
            for k in classes:
                if b.pods <= 0 or b.cpu <= 0 or (wants_gpu and b.room <= 0):
                    break
                left = len(remaining[k.index])
                if not left:
                    exhausted += 1
                    continue
                if k.index == first.index:
                    continue
                n = b.fit_count(k.request, left)
                if n:
                    b.add(k.request, n)
                    pattern[k.index] = n
                    value += n * self.choices.ref_cost(k)
            if exhausted > 16 and exhausted * 4 > len(classes):  # compact: exhausted classes never come back
                compatible[key] = [k for k in classes if remaining[k.index]]
        return pattern, value
