"""The drain grace period (``spec.disruption.terminationGracePeriod``): the pure decision (table), the pool reader and
CRD field, and a simulated cluster whose evicted pod never goes away (stuck Terminating)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from builders import node
from gpuscale.controller.loop import EventKind
from gpuscale.core.disruption import PodDisruptionBudget
from gpuscale.core.labels import DO_NOT_DISRUPT_ANNOTATION
from gpuscale.core.model import INVOLUNTARY_GRACE_S, CapacityType, Disruption, DisruptionBudget, Node, Pod
from gpuscale.core.nodeclaim import ClaimEvent, ClaimPhase, NodeClaim, new_claim, transition
from gpuscale.core.reconcile import DeleteNode, Evict, EvictBlocked, Note, SetClaim, drain_grace_s, drain_step
from gpuscale.core.resources import Request
from gpuscale.errors import InputError
from gpuscale.manifests import crds, parse_documents
from test_controller import CATALOG, Harness, gpod, gpu_pool


def test_grace_defaults() -> None:
    assert drain_grace_s(None, involuntary=False) is None
    assert drain_grace_s(None, involuntary=True) == INVOLUNTARY_GRACE_S == 120.0
    assert drain_grace_s(600.0, involuntary=False) == 600.0
    assert drain_grace_s(30.0, involuntary=True) == 30.0
    assert Disruption().termination_grace_period_s is None


def _draining(key: str = "d") -> NodeClaim:
    c = new_claim(key, "gpu", "g1", "z1", CapacityType.ON_DEMAND, 0.0)
    for ev, kw in (
        (ClaimEvent.LAUNCHED, {"node_id": "n1", "node_name": "node-1"}),
        (ClaimEvent.REGISTERED, {}),
        (ClaimEvent.INITIALIZED, {}),
        (ClaimEvent.DISRUPT, {"reason": "Underutilized"}),
    ):
        c = transition(c, ev, 0.0, **kw)
    assert c.phase is ClaimPhase.DRAINING
    return c


def _pod(name: str, *, pinned: bool = False, web: bool = False) -> Pod:
    return Pod(
        name,
        request=Request(cpu_milli=1000, memory_mib=1024, gpus=1),
        node_name="node-1",
        phase="Running",
        labels={"app": "web"} if web else {},
        annotations={DO_NOT_DISRUPT_ANNOTATION: "true"} if pinned else {},
    )


K8S_NODE: Node = node("node-1", 8000, 32768, 4, "A10", pool="gpu")

# (pods, involuntary, pool grace, first accepted eviction, now) -> forced delete?
TABLE = [
    ("free", False, None, 0.0, 10_000.0, False),  # voluntary, no grace: waits as long as it takes
    ("free", False, 300.0, None, 10_000.0, False),  # no eviction accepted yet: the clock has not started
    ("free", False, 300.0, 100.0, 399.0, False),  # within the grace period
    ("free", False, 300.0, 100.0, 400.0, True),  # grace passed
    ("pinned", False, 300.0, 100.0, 10_000.0, False),  # do-not-disrupt holds a voluntary drain
    ("pinned", True, 300.0, 100.0, 400.0, True),  # ...not an involuntary one
    ("free", True, None, 100.0, 219.0, False),  # involuntary default bound: 120 s
    ("free", True, None, 100.0, 220.0, True),
    ("web", False, 300.0, 100.0, 400.0, True),  # a PDB-held pod goes with its node once the grace passed
]


@pytest.mark.parametrize(("pods", "involuntary", "grace", "first", "now", "forced"), TABLE)
def test_drain_grace_table(
    pods: str, involuntary: bool, grace: float | None, first: float | None, now: float, forced: bool
) -> None:
    c = _draining()
    left = [_pod("a"), _pod("b", pinned=pods == "pinned", web=pods == "web")]
    pdb = PodDisruptionBudget("web", "default", {"app": "web"}, max_unavailable=0)
    d = drain_step(
        [("d", c)],
        {"node-1": left},
        {"node-1": K8S_NODE},
        left,
        [pdb],
        {"d"} if involuntary else set(),
        {},
        now,
        evicting_since={} if first is None else {"d": first},
        pool_grace_s={"gpu": grace},
    )
    deleted = [a for a in d.actions if isinstance(a, DeleteNode)]
    if forced:
        assert deleted == [DeleteNode("d")]
        (set_claim,) = [a for a in d.actions if isinstance(a, SetClaim)]
        assert set_claim.claim.phase is ClaimPhase.DELETING
        (note,) = [a for a in d.actions if isinstance(a, Note)]
        assert note.reason == "TerminationGracePeriod" and "2 pod(s) left" in note.message
        assert not [a for a in d.actions if isinstance(a, Evict | EvictBlocked)]
    else:
        assert deleted == [] and not [a for a in d.actions if isinstance(a, SetClaim)]
        # evictions go on, PDBs and do-not-disrupt honoured
        evicted = {a.pod for a in d.actions if isinstance(a, Evict)}
        assert "default/a" in evicted
        assert ("default/b" in evicted) == (pods == "free" or (pods == "pinned" and involuntary))


POOL = """
apiVersion: gpuscale.io/v1alpha1
kind: GPUNodePool
metadata: {name: gpu}
spec:
  disruption: {terminationGracePeriod: 10m}
"""


def test_reader_and_crd_field() -> None:
    snap = parse_documents([yaml.safe_load(POOL)], source="pools.yaml", catalog=CATALOG, now=0.0)
    assert snap.pools[0].disruption.termination_grace_period_s == 600.0
    bad = yaml.safe_load(POOL.replace("10m", "soon"))
    with pytest.raises(InputError, match=r"spec\.disruption\.terminationGracePeriod: not a valid duration"):
        parse_documents([bad], source="pools.yaml", catalog=CATALOG, now=0.0)
    disruption = crds.pool_schema()["properties"]["spec"]["properties"]["disruption"]["properties"]
    assert disruption["terminationGracePeriod"]["type"] == "string"


# --- a simulated cluster whose evicted pods never leave ---------------------------------------------------------------
class StuckTerminating:
    """The simulator's cluster, except that an eviction is refused once (a 429) and then accepted while the pod stays
    on its node, as a pod stuck Terminating does; every call is counted."""

    def __init__(self, cluster: object) -> None:
        self._cluster = cluster
        self.calls: dict[str, list[float]] = {}
        self.refused: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def evict(self, pod_key: str) -> bool:
        self.calls.setdefault(pod_key, []).append(self._cluster.engine.now())  # type: ignore[attr-defined]
        if pod_key not in self.refused:
            self.refused.add(pod_key)
            return False
        return True


def _stuck_run(grace: float | None) -> tuple[Harness, StuckTerminating]:
    d = Disruption(consolidate_after_s=30.0, budgets=(DisruptionBudget("100%"),), termination_grace_period_s=grace)
    h = Harness([gpu_pool(instance_types=("g4",), disruption=d)])
    stuck = StuckTerminating(h.cluster)
    h.backend = stuck
    h.ctrl = h.new_controller()
    for n, at in enumerate((0.0, 100.0)):
        h.engine.at(at, h.cluster.add_pod, gpod(f"long{n}"), 10_000.0)
        for i in range(3):
            h.engine.at(at, h.cluster.add_pod, gpod(f"short{n}-{i}"), 400.0)
    h.run(1500.0)
    return h, stuck


def test_a_stuck_pod_holds_a_voluntary_drain_without_a_grace_period() -> None:
    h, stuck = _stuck_run(None)
    assert len(stuck.calls) == 1
    assert len(h.alive()) == 2  # one node drains forever, paid for
    assert not [e for e in h.events(EventKind.DELETE) if e.reason == "TerminationGracePeriod"]


def test_the_grace_period_deletes_the_node_from_the_first_accepted_eviction() -> None:
    h, stuck = _stuck_run(120.0)
    ((pod, times),) = stuck.calls.items()
    assert len(times) >= 3 and times[1] > times[0]  # refused (429), retried in a later round, then accepted
    (forced,) = [e for e in h.events(EventKind.DELETE) if e.reason == "TerminationGracePeriod"]
    assert forced.at == times[1] + 120.0
    assert len(h.alive()) == 1
    assert h.cluster.running_count() == 2  # the pod came back elsewhere
    assert pod.startswith("default/long")
