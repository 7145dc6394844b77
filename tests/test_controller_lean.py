"""What keeps the live controller small and quick (issue 12's benchmark): its command imports neither SciPy nor
httpx, the planner loads SciPy only when an integer program must be solved, and a pods-only round runs no GPR manager
pass."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuscale.core.gpr import GPR_LABEL
from gpuscale.fakes.kube_api import KubeAPIServer

pytest.importorskip("lightkube")

from test_kube_e2e import POOL, World, gpu_pod  # the e2e world: emulator, scheduler, manual clock
from test_kube_gpr import gpr

TESTS = Path(__file__).parent


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter (tests/ importable); its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=TESTS, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_controller_command_and_its_warm_up_import_no_scipy_nor_httpx() -> None:
    out = _run(
        "import sys\n"
        "from gpuscale.cli import main\n"
        "import gpuscale.kube.command as command\n"
        "command._warm_up()\n"
        "print('gpuscale.core.planner' in sys.modules, sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'),\n"
        "      [m for m in ('httpx', 'rich') if m in sys.modules])"
    )
    assert out == "True [] []"  # nor httpx (and rich): the Prometheus client loads with the first scaler trigger


def test_scipy_loads_only_when_an_integer_program_is_solved() -> None:
    """Pods of one kind on one-GPU nodes: the greedy plan is provably optimal, the exact solver is neither imported
    nor run (same plan as with it off). Pods of two kinds the greedy plan packs dearly, with two equally good nodes
    for both (a tie only the solver may break, see core/planner/smallip.py): SciPy is loaded and solves."""
    out = _run(
        "import sys\n"
        "from builders import catalog, itype, pod, pool\n"
        "from gpuscale.core.model import Snapshot\n"
        "from gpuscale.core.plan import PlannerConfig\n"
        "from gpuscale.core.planner import plan\n"
        "cat = catalog(itype('g1', 8, 32, 1, 'T4', price=0.7), itype('g4', 48, 192, 4, 'T4', price=2.4))\n"
        "one = Snapshot(tuple(pod(f't{i}', 1000, 4096, gpus=1) for i in range(20)), (), (pool(),), cat, {})\n"
        "exact, greedy = plan(one, PlannerConfig()), plan(one, PlannerConfig(exact_solver=False))\n"
        "print(exact.solver, exact == greedy, exact.total_hourly_cost, 'scipy' in sys.modules)\n"
        "mix = catalog(itype('g0', 16, 64, 1, 'T4', price=1.0), itype('g1', 8, 16, 1, 'T4', price=1.5),\n"
        "              itype('g2', 4, 64, 4, 'T4', price=1.5), itype('g3', 4, 64, 4, 'T4', price=1.5))\n"
        "two = Snapshot((pod('a', 3000, 1024, gpus=1), pod('b', 1000, 1024, gpus=1)), (), (pool(),), mix, {})\n"
        "got = plan(two, PlannerConfig())\n"
        "print('scipy.optimize' in sys.modules, got.solver, got.total_hourly_cost)\n"
    )
    first, second = out.splitlines()
    assert first == "greedy True 12.0 False"  # 5 g4 nodes: 20 pods at the cheapest price per pod, $0.60
    assert second == "True milp 1.5"  # greedy buys two g0 ($2.00); one g2 or g3 holds both


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as srv:
        srv.create("gpunodepools", POOL)
        yield srv


@pytest.fixture
def world(server: KubeAPIServer) -> Iterator[World]:
    w = World(server)
    yield w
    w.close()


def _count_passes(world: World) -> list[int]:
    """Wrap the GPR manager's reconcile to count its passes (the real pass still runs)."""
    manager = world.proc.gpr_manager
    assert manager is not None
    passes = [0]
    real: Callable[[], Any] = manager.reconcile

    def counted() -> Any:
        passes[0] += 1
        return real()

    manager.reconcile = counted  # type: ignore[method-assign]
    return passes


def test_pods_only_rounds_run_no_gpr_pass_until_a_gpr_appears(world: World, server: KubeAPIServer) -> None:
    passes = _count_passes(world)
    world.round()  # the first round always runs one pass (a restart may find GPR nodes to clean up)
    assert passes == [1]
    server.create("pods", gpu_pod("train-0"), namespace="ml")
    world.scheduler.step()  # Unschedulable
    world.until(lambda: bool(world.kwok_nodes()))
    rounds = world.proc.rounds
    assert rounds >= 2 and passes == [1]  # launched for the pod without a GPR pass
    server.create("gpuprovisioningrequests", gpr("g1", numberOfGPUNodes=1), namespace="ml")
    world.settle()
    world.until(lambda: any(GPR_LABEL in str(n["metadata"]) for n in world.kwok_nodes()))
    assert passes[0] > 1
