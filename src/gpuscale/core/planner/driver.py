"""One planning run: classify the pending pods, plan gangs (all or nothing), place the rest on existing and
in-flight nodes, pack what is left onto new nodes, optionally re-optimise them exactly, and explain the rest."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from gpuscale.core.model import Pod, Snapshot
from gpuscale.core.plan import Blocked, BlockReason, Launch, PlannerConfig, ScaleUpPlan
from gpuscale.core.planner.classes import PodClass, class_key, pod_order
from gpuscale.core.planner.context import Context, NewNodes, unbounded
from gpuscale.core.planner.existing import ExistingNodes
from gpuscale.core.planner.explain import explain
from gpuscale.core.planner.feasible import ClassOptions
from gpuscale.core.planner.milp import improve_with_milp
from gpuscale.core.planner.options import option_table
from gpuscale.core.planner.packer import GreedyPacker
from gpuscale.core.predicates import matching_gprs
from gpuscale.core.templates import pool_totals


class _PodIndex(Mapping[str, Pod]):
    """The snapshot's pods by key, indexed on first use (only a plan the integer program improves reads it)."""

    __slots__ = ("_index", "_pods")

    def __init__(self, pods: Sequence[Pod]) -> None:
        self._pods = pods
        self._index: dict[str, Pod] | None = None

    def _get(self) -> dict[str, Pod]:
        if self._index is None:
            self._index = {p.key: p for p in self._pods}
        return self._index

    def __getitem__(self, key: str) -> Pod:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class _Classifier:
    """The pod classes of one planning run. Kept apart from :class:`Planner` so that the packer's reference to
    :meth:`class_of` makes no reference cycle: a finished plan is freed at once, not by the garbage collector."""

    __slots__ = ("_by_key", "_pod_class", "_workloads", "classes")

    def __init__(self, workloads: Mapping[str, Mapping[str, str]]) -> None:
        self._workloads = workloads
        self.classes: list[PodClass] = []
        self._by_key: dict[tuple[object, ...], PodClass] = {}
        self._pod_class: dict[str, tuple[Pod, PodClass]] = {}
        """Pod key -> (the pod, its class) for the pods classified (:meth:`class_of` asks again and again)."""

    def _key(self, pod: Pod) -> tuple[object, ...]:
        """The pod's class key; while a GPR is active, also which GPRs' nodes the pod may use."""
        key = class_key(pod)
        return (*key, matching_gprs(pod, self._workloads)) if self._workloads else key

    def classify(self, pods: Iterable[Pod]) -> None:
        by_pod = self._pod_class
        for pod in pods:
            key = self._key(pod)
            cls = self._by_key.get(key)
            if cls is None:
                cls = PodClass(len(self.classes), pod, key=key)
                self.classes.append(cls)
                self._by_key[key] = cls
            cls.pods.append(pod)
            by_pod[pod.key] = (pod, cls)

    def class_of(self, pod: Pod) -> PodClass:
        got = self._pod_class.get(pod.key)
        if got is not None and got[0] is pod:  # the class found by classify (the same pod object)
            return got[1]
        return self._by_key[self._key(pod)]


class Planner:
    """One planning run. Use :func:`plan`."""

    def __init__(self, snapshot: Snapshot, config: PlannerConfig, now: float) -> None:
        self.snapshot = snapshot
        self.config = config
        self.now = now
        table = option_table(snapshot, now)
        self.choices = ClassOptions(table)
        self.existing = ExistingNodes(snapshot, config.scorer)
        self._classifier = _Classifier(snapshot.workloads)
        self.classes = self._classifier.classes
        self.class_of = self._classifier.class_of
        self.packer = GreedyPacker(self.choices, self.class_of, config.candidate_types, table)
        self.pods_by_key: Mapping[str, Pod] = _PodIndex(snapshot.pods)

    # -- setup
    def _initial_context(self) -> Context:
        state = self.existing.initial_state()
        # only the pools with maxNodes or limits read their totals (Context.headroom, the integer program, explain)
        bounded = {p.name for p in self.snapshot.pools if not unbounded(p)}
        nodes = [n for n in self.existing.nodes if n.pool in bounded] if bounded else []
        pool_nodes, pool_usage = pool_totals(nodes, self.snapshot.catalog)
        return Context(state, pool_nodes, pool_usage, [], {}, [])

    def explain(self, ctx: Context, pod: Pod) -> Blocked:
        """Why ``pod`` got no node: the most specific reason across all pools."""
        return explain(self.snapshot, self.choices, ctx, self.class_of(pod), pod)

    def _place_existing(self, ctx: Context, pods: list[Pod]) -> list[Pod]:
        return self.existing.place(ctx, pods, self.class_of)

    def _pack_new(self, ctx: Context, pods: list[Pod]) -> list[Pod]:
        return self.packer.pack(ctx, pods)

    # -- driver
    def run(self) -> ScaleUpPlan:
        pending: list[Pod] = []
        bound_members: dict[str, int] = {}  # per gang, its members bound to a node
        for p in self.snapshot.pods:
            if p.node_name is None:
                if p.phase == "Pending" and not p.is_daemonset:
                    pending.append(p)
            elif p.gang and p.phase in ("Pending", "Running"):
                bound_members[p.gang] = bound_members.get(p.gang, 0) + 1
        pending.sort(key=pod_order)
        self._classifier.classify(pending)
        ctx = self._initial_context()
        gangs: dict[str, list[Pod]] = {}
        singles: list[Pod] = []
        for p in pending:
            if p.gang:
                gangs.setdefault(p.gang, []).append(p)
            else:
                singles.append(p)
        for name in sorted(gangs):
            ctx = self._plan_gang(ctx, name, gangs[name], bound_members.get(name, 0))
        # the gangs' nodes, when packed onto few nodes on purpose, are kept out of the integer program's re-packing
        kept = len(ctx.groups) if self.config.gang_tolerance is not None else 0
        left = self._place_existing(ctx, singles)
        left = self._pack_new(ctx, left)
        for pod in left:
            ctx.blocked.append(self.explain(ctx, pod))
        groups = ctx.groups
        solver = "greedy"
        if self.config.exact_solver and len(groups) > kept:
            rest = Context(ctx.state, ctx.pool_nodes, ctx.pool_usage, groups[kept:], ctx.placements, ctx.blocked)
            improved = improve_with_milp(self.choices, self.classes, self.class_of, self.pods_by_key, rest, self.config)
            if improved is not None:
                groups, solver = groups[:kept] + improved, "milp"
        return self._result(ctx, groups, solver)

    def _plan_gang(self, ctx: Context, name: str, members: list[Pod], bound: int) -> Context:
        size = max(p.gang_size for p in members)
        if size and len(members) + bound < size:
            for p in members:
                ctx.blocked.append(
                    Blocked(
                        p.key,
                        BlockReason.GANG_INCOMPLETE,
                        f"gang {name} has {len(members) + bound} of {size} members; waiting for the rest",
                    )
                )
            return ctx
        trial = ctx.copy()
        left = self._place_existing(trial, members)
        left = self.packer.pack(trial, left, self.config.gang_tolerance)
        if not left:
            return trial
        why = self.explain(trial, left[0])
        for p in members:
            ctx.blocked.append(
                Blocked(
                    p.key,
                    BlockReason.GANG_INCOMPLETE,
                    f"gang {name} ({size or len(members)} pods) cannot be placed all together: {left[0].key}: "
                    f"{why.message}",
                )
            )
        return ctx

    def _result(self, ctx: Context, groups: list[NewNodes], solver: str) -> ScaleUpPlan:
        merged: dict[tuple[str, str, str, str], list[NewNodes]] = {}
        for g in groups:
            o = g.option
            merged.setdefault((o.pool.name, o.itype.name, o.offering.zone, str(o.offering.capacity_type)), []).append(g)
        launches: list[Launch] = []
        placements = dict(ctx.placements)
        for n, key in enumerate(sorted(merged, key=lambda k: (merged[k][0].option.sort_key, k))):
            parts = merged[key]
            opt = parts[0].option
            lid = f"{self.config.launch_id_prefix}-{n + 1}"
            node_pods = [pods for g in parts for pods in g.pods]
            count = sum(g.count for g in parts)
            all_pods: list[str] = []
            for idx, pods in enumerate(node_pods):
                for pk in pods:
                    placements[pk] = f"{lid}/{idx}"
                    all_pods.append(pk)
            launches.append(
                Launch(
                    lid,
                    opt.pool.name,
                    opt.itype.name,
                    opt.offering.capacity_type,
                    opt.offering.zone,
                    count,
                    opt.price * count,
                    tuple(all_pods),
                )
            )
        blocked = tuple(sorted(ctx.blocked, key=lambda b: b.pod))
        return ScaleUpPlan(tuple(launches), placements, blocked, solver)


def plan(snapshot: Snapshot, config: PlannerConfig | None = None, now: float = 0.0) -> ScaleUpPlan:
    """Plan placements and new nodes for every pending pod of ``snapshot`` (pure; deterministic)."""
    return Planner(snapshot, config or PlannerConfig(), now).run()
