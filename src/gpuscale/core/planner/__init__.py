"""The scale-up planner: ``plan(snapshot, config, now) -> ScaleUpPlan``.

Pending pods are placed, in priority order, on existing nodes first, then on nodes already being launched, then on
new nodes. New nodes are chosen by a greedy, cost-aware packer over equivalence classes of identical pods:

1. Every (pool, instance type, zone, capacity type) the catalog offers is an *option* with a node template (labels,
   taints, allocatable). A class's feasible options are those whose template passes the class's label and taint
   predicates and whose allocatable holds one pod.
2. Repeatedly take the first class with pods left; for each of its feasible options (only pools with the highest
   weight that still have headroom) fill one fresh node with that class first, then with every other class that fits
   (per-GPU milli accounting for fractions). Score = $/h ÷ value packed, where a class's value is its cheapest
   stand-alone cost per pod; the lowest score wins. The winning pattern is repeated while the pods last, within the
   pool's ``maxNodes`` and ``limits``.
3. Optionally an integer program over the patterns (HiGHS via SciPy, wall-clock limited) re-optimises the new nodes;
   its plan is used only when it is cheaper, so the plan never costs more than the greedy one.

Gangs (``gpuscale.io/gang`` + ``gpuscale.io/gang-size``) are planned first, all-or-nothing, in a transaction. Every
pending pod left without a node gets a :class:`~gpuscale.core.plan.Blocked` reason naming the blocking requirement.

Modules, value types first: ``options`` (the option table), ``bins`` (a new node being filled), ``classes`` (pod
classes and order), ``context`` (mutable planning state), ``feasible`` (options per class), ``existing`` (placement
on existing and in-flight nodes), ``packer`` (greedy packer), ``milp`` (integer program), ``smallip`` (a tiny
program's clear optimum without the solver), ``explain`` (Blocked reasons), ``driver`` (:class:`Planner` and
:func:`plan`).
"""

from __future__ import annotations

from gpuscale.core.planner.bins import Bin
from gpuscale.core.planner.classes import PodClass, class_key, pod_order, referenced_keys
from gpuscale.core.planner.context import Context, NewNodes
from gpuscale.core.planner.driver import Planner, plan
from gpuscale.core.planner.existing import ExistingNodes
from gpuscale.core.planner.explain import explain
from gpuscale.core.planner.feasible import ClassOptions
from gpuscale.core.planner.milp import improve_with_milp
from gpuscale.core.planner.options import Option, build_options, option_table, solo_count
from gpuscale.core.planner.packer import EPS, GreedyPacker

__all__ = [
    "EPS",
    "Bin",
    "ClassOptions",
    "Context",
    "ExistingNodes",
    "GreedyPacker",
    "NewNodes",
    "Option",
    "Planner",
    "PodClass",
    "build_options",
    "class_key",
    "explain",
    "improve_with_milp",
    "option_table",
    "plan",
    "pod_order",
    "referenced_keys",
    "solo_count",
]
