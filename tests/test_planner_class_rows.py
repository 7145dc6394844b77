"""A planning run's per-run caches equal what they stand for: the class of a pending pod (kept per pod by
``_Classifier.classify``) is the class of its key, and a class's rows on existing and launching nodes (one shared split
of all rows when every node passes the class's predicates) are the rows whose node passes them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.core.model import Snapshot
from gpuscale.core.plan import PlannerConfig
from gpuscale.core.planner.driver import Planner
from gpuscale.core.predicates import static_failure
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
