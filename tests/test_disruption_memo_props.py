"""The disruption pass's memo (:mod:`gpuscale.core.disruption.passmemo`) as property tests: over random sequences of
node and pod changes (nodes joining, leaving, reordered, replaced by equal objects or with other allocatable,
cordoned, moved to another pool, launching; pods arriving, leaving, moving, resized, replaced by equal objects; the
nodes being disrupted), the destinations and counts it keeps and the rows it reuses are those computed from scratch,
every row whose room differs from the last pass's is reported changed, the incremental total is the recomputed one,
and a pass given the memo (and the caller's pods by node) decides exactly as one without it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from operator import is_

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.disruption import DisruptionPlan, plan_disruption
from gpuscale.core.disruption.passmemo import PassMemo, Row, rows_of
from gpuscale.core.disruption.plan import destinations
from gpuscale.core.model import Disruption, DisruptionBudget, Node, NodePool, Pod
from gpuscale.core.resources import Request
from test_disruption_passmemo import CATALOG, T0, _node, _pod

POOLS = {
    "a": NodePool("a", disruption=Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),))),
    "b": NodePool("b", disruption=Disruption(consolidate_after_s=0.0, budgets=(DisruptionBudget("1"),))),
}
TYPES = ("g1", "g2", "g4", "c4")
PROPS = settings(max_examples=150, derandomize=True, deadline=None, database=None)
STEPS = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 10**6)), min_size=1, max_size=40)


@dataclass
class _Cluster:
    """Nodes (in order) and pods changed one step at a time; unchanged ones keep their objects."""

    nodes: list[Node] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)
    disrupting: set[str] = field(default_factory=set)
    made: int = 0

    def _new_node(self, x: int) -> Node:
        self.made += 1
        pool = ("a", "b", None)[x % 3]
        n = _node(f"n{self.made}", TYPES[x // 3 % len(TYPES)], POOLS.get(pool or "a", POOLS["a"]))
        return replace(n, pool=pool, launching=x % 7 == 0)

    def _new_pod(self, x: int, on: str) -> Pod:
        self.made += 1
        gpus, milli = ((1, 0), (0, 500), (0, 250), (0, 0))[x % 4]
        return _pod(f"p{self.made}", on, gpus=gpus, milli=milli, cpu=(250, 500, 2000)[x // 4 % 3])

    def step(self, op: int, x: int) -> None:
        nodes, pods = self.nodes, self.pods
        i = x % len(nodes) if nodes else 0
        j = x % len(pods) if pods else 0
        if op == 0 or not nodes:
            nodes.insert(x % (len(nodes) + 1), self._new_node(x))
        elif op == 1:
            gone = nodes.pop(i).name
            self.pods = [p for p in pods if p.node_name != gone]
        elif op == 2:
            nodes[i] = replace(nodes[i])
        elif op == 3:
            nodes[i] = replace(nodes[i], unschedulable=not nodes[i].unschedulable)
        elif op == 4:
            nodes[i] = replace(nodes[i], pool=("a", "b", None)[x // 7 % 3])
        elif op == 5:
            nodes[i] = replace(nodes[i], launching=not nodes[i].launching)
        elif op in (6, 7):
            pods.insert(x % (len(pods) + 1), self._new_pod(x, nodes[i].name))
        elif op == 8 and pods:
            pods.pop(j)
        elif op == 9 and pods:
            pods[j] = replace(pods[j], node_name=nodes[x // 5 % len(nodes)].name)
        elif op == 10 and pods:
            pods[j] = replace(pods[j])
        elif op == 11 and pods:
            pods[j] = replace(pods[j], request=Request(cpu_milli=x % 3000, memory_mib=512, gpus=x % 2))
        elif op == 12:
            self.disrupting = {nodes[i].name} if x % 3 else set()
        elif op == 13:
            k = x // 11 % len(nodes)
            nodes[i], nodes[k] = nodes[k], nodes[i]
        elif op == 15:  # one node remade with more or fewer GPUs, in its place (a device plugin ready or failed)
            a = nodes[i].allocatable
            nodes[i] = replace(nodes[i], allocatable=replace(a, gpus=a.gpus + 1 if x % 2 else max(0, a.gpus - 1)))
        # op 14 (or a step without its object): the same inputs again

    def by_node(self) -> dict[str, list[Pod]]:
        out: dict[str, list[Pod]] = {}
        for p in self.pods:
            if p.node_name is not None:
                out.setdefault(p.node_name, []).append(p)
        return out


def _destinations_by_loop(
    nodes: list[Node], disrupting: set[str]
) -> tuple[list[Node], dict[str, int], dict[str, int], dict[str, int]]:
    """:func:`destinations` as one plain loop over the nodes, kept apart from the code (the reference the answers
    with and without the memo must equal, maps in the same order)."""
    dest: list[Node] = []
    counts: dict[str, int] = {}
    totals: dict[str, int] = {}
    leaving_by_pool: dict[str, int] = {}
    for n in nodes:
        if n.launching:
            continue
        leaving = n.name in disrupting
        if n.pool is not None:
            totals[n.pool] = totals.get(n.pool, 0) + 1
            if leaving:
                leaving_by_pool[n.pool] = leaving_by_pool.get(n.pool, 0) + 1
            else:
                counts[n.pool] = counts.get(n.pool, 0) + 1
        if not leaving and not n.unschedulable:
            dest.append(n)
    return dest, counts, totals, leaving_by_pool


def _fields(r: Row) -> tuple[object, ...]:
    return (id(r.node), list(r.pods), r.cpu, r.mem, r.gpu, r.slots, r.g_row, r.full, r.top, r.pos, r.recv)


@PROPS
@given(STEPS)
def test_kept_destinations_and_rows_are_those_computed_from_scratch(steps: list[tuple[int, int]]) -> None:
    c = _Cluster()
    memo = PassMemo()
    for op, x in [(0, 1), (0, 5), (6, 2), *steps]:
        c.step(op, x)
        by_node = c.by_node()
        got = destinations(list(c.nodes), set(c.disrupting), memo)
        want = destinations(c.nodes, c.disrupting, None)
        assert len(got[0]) == len(want[0]) and all(map(is_, got[0], want[0])) and got[1:] == want[1:]
        ref = _destinations_by_loop(c.nodes, c.disrupting)
        assert len(ref[0]) == len(want[0]) and all(map(is_, ref[0], want[0]))
        assert [list(m.items()) for m in want[1:]] == [list(m.items()) for m in ref[1:]]
        assert all(type(m) is dict for m in want[1:])
        last = dict(memo.rows)
        rows, changed, total = rows_of(got[0], by_node, memo)
        fresh, _, fresh_total = rows_of(want[0], by_node, None)
        assert list(rows) == list(fresh) and total == fresh_total
        assert all(_fields(rows[k]) == _fields(fresh[k]) for k in fresh)
        differ = {k for k in rows.keys() | last.keys() if k not in rows or k not in last or rows[k] is not last[k]}
        assert changed == differ  # a row not reported changed is the very row of the last pass
        got[1].clear()  # a pass changes its counts: the memo's stay as they were
        got[3].clear()
        memo.rows, memo.total = rows, total  # what the pass keeps (PassMemo.remember)


def _plan(c: _Cluster, now: float, memo: PassMemo | None) -> DisruptionPlan:
    names = [n.name for n in c.nodes]
    return plan_disruption(
        list(c.nodes),
        c.pods,
        list(POOLS.values()),
        CATALOG,
        now,
        since={n: T0 - 100.0 * (k % 3) for k, n in enumerate(names)},
        candidates=set(names[::2]),
        disrupting=c.disrupting,
        protected=set(names[1:2]),
        memo=memo,
        by_node=c.by_node(),
    )


@PROPS
@given(STEPS)
def test_a_pass_with_the_memo_decides_as_one_without_it(steps: list[tuple[int, int]]) -> None:
    c = _Cluster()
    memo = PassMemo()
    now = T0
    for op, x in [(0, 1), (0, 5), (6, 2), *steps]:
        c.step(op, x)
        now += x % 40
        assert _plan(c, now, memo) == _plan(c, now, None)


def test_a_name_seen_twice_decides_as_without_a_memo() -> None:
    """Two nodes of one name (rows by name collide): the memo's pass still decides as one without it, and so do
    the passes after it."""
    c = _Cluster()
    for op, x in [(0, 1), (0, 5), (0, 8), (6, 2), (6, 3)]:
        c.step(op, x)
    memo = PassMemo()
    assert _plan(c, T0, memo) == _plan(c, T0, None)
    c.nodes.append(replace(c.nodes[0], labels={**c.nodes[0].labels}))
    assert _plan(c, T0, memo) == _plan(c, T0, None)
    c.nodes.pop()
    c.step(8, 0)
    assert _plan(c, T0 + 5, memo) == _plan(c, T0 + 5, None)
