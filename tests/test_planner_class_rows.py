"""A planning run's per-run caches equal what they stand for: the class of a pending pod (kept per pod by
``_Classifier.classify``) is the class of its key, and a class's rows on existing and launching nodes (one shared split
of all rows when every node passes the class's predicates) are the rows whose node passes them."""

from __future__ import annotations

from dataclasses import replace
from types import MethodType

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.model import Snapshot
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner.context import Context
from gpuscale.core.planner.driver import Planner
from gpuscale.core.planner.options import Option
from gpuscale.core.predicates import static_failure
from gpuscale.core.resources import Resources
from test_planner_properties import snapshots


@st.composite
def _mixed(draw: st.DrawFn) -> Snapshot:
    """A random snapshot whose nodes are also launching or cordoned at random."""
    s = draw(snapshots())
    nodes = tuple(
        replace(n, launching=draw(st.booleans()), unschedulable=draw(st.sampled_from((False, False, True))))
        for n in s.nodes
    )
    return replace(s, nodes=nodes)


@settings(max_examples=80, deadline=None)
@given(_mixed())
def test_class_of_and_rows_equal_recomputed(s: Snapshot) -> None:
    planner = Planner(s, PlannerConfig(), 0.0)
    planner.run()
    existing = planner.existing
    pending = [p for p in s.pods if p.node_name is None and p.phase == "Pending" and not p.is_daemonset]
    for p in pending:
        assert planner.class_of(p) is planner._classifier._by_key[planner._classifier._key(p)]
        assert planner.class_of(replace(p)) is planner.class_of(p)  # an equal pod, another object: by its key
    for cls in planner.classes:
        ok = np.array(
            [
                static_failure(cls.example, n.labels, n.taints, n.unschedulable, existing.workloads) is None
                for n in existing.nodes
            ],
            dtype=bool,
        )
        launching = np.array([n.launching for n in existing.nodes], dtype=bool)
        rows, rows_launching = existing._rows(cls)
        assert rows.tolist() == np.flatnonzero(ok & ~launching).tolist()
        assert rows_launching.tolist() == np.flatnonzero(ok & launching).tolist()


def _place_per_phase(self, ctx, pods, class_of):  # type: ignore[no-untyped-def]
    """ExistingNodes.place as it was before the one-fits-per-pod shortcut: a fits per phase on the class's rows."""
    from gpuscale.core.scoring import select

    left = []
    exhausted: set[tuple[int, int]] = set()
    for pod in pods:
        cls = class_of(pod)
        placed = False
        for phase, rows in enumerate(self._rows(cls)):
            if (cls.index, phase) in exhausted or rows.size == 0:
                continue
            cand = rows[ctx.state.fits(pod.request, rows)]
            if cand.size == 0:
                exhausted.add((cls.index, phase))
                continue
            if cand.size == 1 and self._pure_scores:
                i = int(cand[0])
            else:
                if not self._scorer_ready:
                    self._prepare_scorer(ctx.state)
                got = select(self.scorer, ctx.state, pod.request, cand)
                assert got is not None
                i = got
            ctx.state.place(pod.request, i)
            ctx.placements[pod.key] = self.nodes[i].name
            placed = True
            break
        if not placed:
            left.append(pod)
    return left


@settings(max_examples=60, deadline=None)
@given(_mixed(), st.sampled_from(("fill-frag", "best-fit")))
def test_placing_with_one_fits_per_pod_equals_a_fits_per_phase(s: Snapshot, scorer: str) -> None:
    """ExistingNodes.place asks which rows have room once per pod (skipping the class's label/taint rows when none
    has): the same plan as asking per phase on the class's rows."""
    config = PlannerConfig(scorer=scorer)
    got = Planner(s, config, 0.0).run()
    reference = Planner(s, config, 0.0)
    reference.existing.place = MethodType(_place_per_phase, reference.existing)  # type: ignore[method-assign]
    assert got == reference.run()


def _add_nodes_to_every_pool(self: Context, opt: Option, count: int) -> None:
    """Context.add_nodes as it was: every pool's totals, unbounded pools too."""
    pool = opt.pool.name
    self.pool_nodes[pool] = self.pool_nodes.get(pool, 0) + count
    cap = Resources(opt.itype.vcpus * 1000, opt.itype.memory_mib, opt.itype.gpu_count, 0).scaled(count)
    self.pool_usage[pool] = self.pool_usage.get(pool, Resources(pods=0)) + cap


@settings(max_examples=60, deadline=None)
@given(_mixed(), st.booleans())
def test_keeping_no_totals_for_unbounded_pools_changes_no_plan(s: Snapshot, exact: bool) -> None:
    """Context.add_nodes keeps the totals of pools with maxNodes or limits only: the same plan as keeping every
    pool's (the greedy packer, the integer program and explain read only those)."""
    config = PlannerConfig(exact_solver=exact)
    got = Planner(s, config, 0.0).run()
    kept = Context.add_nodes
    Context.add_nodes = _add_nodes_to_every_pool  # type: ignore[method-assign]
    try:
        reference = Planner(s, config, 0.0).run()
    finally:
        Context.add_nodes = kept  # type: ignore[method-assign]
    assert got == reference
