"""A node registering in the simulated cluster takes the template the redundant-launch check made for it while it
was in flight (``SimCluster._templates``) instead of making it again: over the demo run, every registered node's
labels, taints and allocatable equal a template made afresh, and kept templates were used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.commands import simulate_policy
from gpuscale.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_registered_nodes_equal_fresh_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    register = SimCluster.node_registered
    kept: list[bool] = []

    def checked(self: SimCluster, node: Any, itype: Any, taints: Any, price: float, delay: float | None) -> None:
        had = node.node_name in self._templates
        fresh = self._template(node, itype, taints, price)
        register(self, node, itype, taints, price, delay)
        sn = self._nodes[node.node_name]
        assert (sn.labels, sn.taints, sn.allocatable) == (fresh.labels, fresh.taints, fresh.allocatable)
        kept.append(had)

    monkeypatch.setattr(SimCluster, "node_registered", checked)
    simulate_policy(load_scenario(ROOT / "examples" / "demo.yaml"), "gpuscale")
    assert kept.count(True) > 0 and kept.count(False) > 0  # both ways taken
