"""Values kept instead of recomputed. Derived fields stored at construction (``Pod.pending``,
``Request.gpu_demand_milli``/``wants_gpu`` and the cached ``Request`` hash): the same values the former properties and
the generated ``__hash__`` gave, however the object was made (constructor, ``dataclasses.replace``, pickle, copy, the
simulator's ``placed``), and no part of equality. The simulated cluster's node list, kept per node between listings:
equal to one made afresh before every round of a run with failures, interruptions and removals."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from gpuscale.controller.loop import Controller
from gpuscale.core.model import Node, Pod
from gpuscale.core.resources import MILLI_PER_GPU, Request
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.cluster_records import placed
from gpuscale.sim.runner import run_simulation
from test_round_bookkeeping import _factory, _scenario

REQUESTS = [
    Request(),
    Request(cpu_milli=500, memory_mib=1024),
    Request(cpu_milli=8000, memory_mib=65536, gpus=2),
    Request(cpu_milli=1000, memory_mib=2048, gpu_milli=250),
    Request(gpu_milli=999, gpu_models=frozenset({"A100", "V100M16"})),
    Request(gpus=1, gpu_models=frozenset()),
]


def _hash_of_fields(r: Request) -> int:
    """What the dataclass-generated ``__hash__`` computes: the compared fields in order."""
    return hash((r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli, r.gpu_models))


def _id(r: Request) -> str:
    """A test id that is the same in every process (a frozenset's repr follows the string hash seed, and xdist workers
    must collect the same ids)."""
    models = "none" if r.gpu_models is None else "+".join(sorted(r.gpu_models)) or "empty"
    return f"{r.cpu_milli}m-{r.memory_mib}Mi-{r.gpus}g-{r.gpu_milli}mg-{models}"


@pytest.mark.parametrize("r", REQUESTS, ids=_id)
def test_request_derived_fields_match_their_formulas(r: Request) -> None:
    assert r.gpu_demand_milli == r.gpus * MILLI_PER_GPU + r.gpu_milli
    assert r.wants_gpu is (r.gpus > 0 or r.gpu_milli > 0)
    assert hash(r) == _hash_of_fields(r)
    for made in (replace(r), pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert made == r and hash(made) == hash(r)
        assert (made.gpu_demand_milli, made.wants_gpu) == (r.gpu_demand_milli, r.wants_gpu)
    changed = replace(r, gpus=r.gpus + 3, gpu_milli=0)
    assert changed.gpu_demand_milli == (r.gpus + 3) * MILLI_PER_GPU and changed.wants_gpu
    assert hash(changed) == _hash_of_fields(changed)


def test_request_equality_repr_and_sets_ignore_the_derived_fields() -> None:
    a, b = Request(100, 200, 1), Request(100, 200, 1)
    assert a == b and a is not b and len({a, b}) == 1 and {a: 1}[b] == 1
    assert a != Request(100, 200, 2)
    assert repr(a) == "Request(cpu_milli=100, memory_mib=200, gpus=1, gpu_milli=0, gpu_models=None)"


def test_a_pickled_request_hashes_as_one_made_in_the_loading_process() -> None:
    """String hashes differ between processes: the cached hash must not travel in a pickle."""
    r = Request(gpu_milli=500, gpu_models=frozenset({"A10", "T4"}))
    code = (
        "import pickle, sys\n"
        "from gpuscale.core.resources import Request\n"
        "r = pickle.loads(sys.stdin.buffer.read())\n"
        "fresh = Request(gpu_milli=500, gpu_models=frozenset({'A10', 'T4'}))\n"
        "print(hash(r) == hash(fresh) == hash((0, 0, 0, 500, fresh.gpu_models)), r in {fresh})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(r), capture_output=True, check=True)
    assert out.stdout.decode().split() == ["True", "True"]


@pytest.mark.parametrize(
    ("node_name", "phase", "pending"),
    [(None, "Pending", True), ("n1", "Pending", False), (None, "Running", False), ("n1", "Running", False)],
)
def test_pod_pending_is_derived_from_node_and_phase(node_name: str | None, phase: str, pending: bool) -> None:
    pod = Pod("p", "ns", Request(cpu_milli=100), node_name=node_name, phase=phase)
    assert pod.pending is pending
    assert placed(pod, node_name, phase).pending is pending
    assert replace(Pod("p", "ns"), node_name=node_name, phase=phase).pending is pending
    assert pickle.loads(pickle.dumps(pod)).pending is pending
    assert pod == Pod("p", "ns", Request(cpu_milli=100), node_name=node_name, phase=phase)


def test_placed_moves_pending_with_the_binding() -> None:
    pod = Pod("p", request=Request(gpus=1))
    bound = placed(pod, "node-1", "Running")
    assert not bound.pending and placed(bound, None, "Pending").pending
    assert bound == replace(pod, node_name="node-1", phase="Running") and bound.key == pod.key


class ListingChecked(Controller):
    """The controller, checking before each round that the simulated cluster's kept node list equals one made afresh
    from its nodes (the list is kept per node and remade only for the nodes changed since the last listing)."""

    listings = 0

    def reconcile(self) -> Any:
        cluster = self.backend
        assert isinstance(cluster, SimCluster)
        fresh = tuple(
            Node(
                sn.name,
                sn.allocatable if sn.gpu_ready else replace(sn.allocatable, gpus=0),
                dict(sn.labels),
                sn.taints,
                sn.unschedulable,
                sn.pool,
                False,
                sn.price,
            )
            for sn in cluster._nodes.values()
        )
        assert tuple(cluster.list_nodes()) == fresh
        ListingChecked.listings += 1
        return super().reconcile()


def test_the_kept_node_list_equals_one_made_afresh() -> None:
    ListingChecked.listings = 0
    res = run_simulation(_scenario(), _factory(ListingChecked))
    c = res.cluster.counters
    assert ListingChecked.listings > 50 and c.nodes_registered > 10 and c.nodes_removed > 5 and c.nodes_gpu_ready > 5
    assert c.evictions > 0  # nodes were drained (cordoned first)
    plain = run_simulation(_scenario(), _factory(Controller))
    assert res.cluster.events == plain.cluster.events
