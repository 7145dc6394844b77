"""The ``gpuscale`` command line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from gpuscale.clock import SystemClock
from gpuscale.core.model import Snapshot
from gpuscale.core.plan import PlannerConfig, ScaleUpPlan
from gpuscale.core.planner import plan as run_plan
from gpuscale.core.scoring import SCORERS
from gpuscale.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])

EXAMPLES = Path(__file__).resolve().parent / "examples"


def console(stderr: bool = False) -> Console:
    """A rich console (plain when not a terminal)."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def input_errors(fn: F) -> F:
    """Turn :class:`InputError` into a one-paragraph message on stderr and exit code 2 (no traceback)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


@click.group()
@click.version_option(package_name="gpuscale")
def main() -> None:
    """gpuscale: dynamic GPU node allocation for Kubernetes."""


def _load(snapshot: str, catalog: str, region: str | None) -> Snapshot:
    from gpuscale.catalogs import load_catalog
    from gpuscale.manifests import load_snapshot

    cat = load_catalog(catalog, region=region)
    for warning in cat.warnings:
        click.echo(f"warning: {warning}", err=True)
    notes: list[str] = []
    snap = load_snapshot(snapshot, catalog=cat, now=SystemClock().now(), notes=notes)
    for note in notes:
        console(stderr=True).print(f"note: {note}", style="dim", markup=False)
    return snap


_catalog_opt = click.option(
    "--catalog", default="linode", show_default=True, help="Catalog name (linode, aws, alibaba) or a YAML file."
)
_region_opt = click.option("--region", default=None, help="Catalog region (default: the catalog's own).")
_scorer_opt = click.option(
    "--scorer", type=click.Choice(sorted(SCORERS)), default="fill-frag", show_default=True, help="Placement scorer."
)
_solver_opt = click.option(
    "--solver/--no-solver", default=True, show_default=True, help="Improve the greedy plan with an integer program."
)


@main.command("plan")
@click.argument("snapshot", type=click.Path(dir_okay=False))
@_catalog_opt
@_region_opt
@_scorer_opt
@_solver_opt
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@input_errors
def plan_cmd(snapshot: str, catalog: str, region: str | None, scorer: str, solver: bool, as_json: bool) -> None:
    """Plan new GPU nodes for the pending pods of SNAPSHOT (Pods, Nodes, GPUNodePools as YAML)."""
    snap = _load(snapshot, catalog, region)
    result = run_plan(snap, PlannerConfig(scorer=scorer, exact_solver=solver), SystemClock().now())
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    print_plan(result, snap)


def print_plan(result: ScaleUpPlan, snap: Snapshot) -> None:
    """Human tables of launches and blocked pods."""
    out = console()
    pending = sum(1 for p in snap.pods if p.pending and not p.is_daemonset)
    on_existing = sum(1 for v in result.placements.values() if "/" not in v)
    out.print(
        f"{pending} pending pod(s): {on_existing} fit existing nodes, "
        f"{len(result.placements) - on_existing} go to new nodes, {len(result.blocked)} blocked"
    )
    if result.launches:
        t = Table(title="Launches", title_justify="left")
        for col in ("pool", "instance type", "capacity", "zone", "count", "$/h", "pods"):
            t.add_column(col, justify="right" if col in ("count", "$/h", "pods") else "left")
        for launch in result.launches:
            t.add_row(
                launch.pool,
                launch.instance_type,
                str(launch.capacity_type),
                launch.zone,
                str(launch.count),
                f"{launch.hourly_cost:.2f}",
                str(len(launch.pods)),
            )
        out.print(t)
        out.print(f"Total: ${result.total_hourly_cost:.2f}/h (solver: {result.solver})")
    else:
        out.print("No new nodes needed.")
    if result.blocked:
        out.print("\n[bold]Blocked pods (no scale-up)[/bold]")
        for b in result.blocked:
            out.print(f"  [bold]{b.pod}[/bold]  [yellow]{b.reason}[/yellow]")
            out.print(f"    {b.message}", markup=False)


@main.command("explain")
@click.argument("snapshot", type=click.Path(dir_okay=False))
@click.argument("pod")
@_catalog_opt
@_region_opt
@input_errors
def explain_cmd(snapshot: str, pod: str, catalog: str, region: str | None) -> None:
    """Say what happens to POD (``name`` or ``namespace/name``) of SNAPSHOT and why."""
    snap = _load(snapshot, catalog, region)
    key = pod if "/" in pod else f"default/{pod}"
    matches = [p for p in snap.pods if p.key == key or (p.name == pod and "/" not in pod)]
    if not matches:
        raise InputError(f"no pod {pod!r} in the snapshot", where=snapshot, fix="give name or namespace/name")
    target = matches[0]
    if not target.pending:
        click.echo(f"{target.key} is not pending (phase {target.phase}, node {target.node_name or '-'}).")
        return
    result = run_plan(snap, PlannerConfig(), SystemClock().now())
    for b in result.blocked:
        if b.pod == target.key:
            click.echo(f"{target.key} stays pending and triggers no scale-up.\nreason: {b.reason}\n{b.message}")
            return
    where = result.placements.get(target.key, "?")
    if "/" in where:
        launch = next(x for x in result.launches if where.startswith(x.id + "/"))
        click.echo(
            f"{target.key} triggers a scale-up: pool {launch.pool}, {launch.instance_type} "
            f"({launch.capacity_type}, {launch.zone}), node {where}, ${launch.hourly_cost / launch.count:.2f}/h."
        )
    else:
        click.echo(f"{target.key} fits the existing node {where}; no scale-up needed.")


@main.group("bench")
def bench_group() -> None:
    """Benchmarks (speed and quality), printed with the figures they measure."""


def _register_optional() -> None:
    """Attach commands whose modules live in optional layers (they import lazily heavy dependencies)."""
    from gpuscale.bench.planner import planner_command

    bench_group.add_command(planner_command, "planner")
    try:
        from gpuscale.bench.openb import openb_command
    except ImportError:  # pragma: no cover - module not present in a partial install
        return
    bench_group.add_command(openb_command, "openb")


def _register_server() -> None:
    """GPR commands need the ``server`` extra (fastapi, uvicorn, httpx)."""
    try:
        from gpuscale.gpr.cli import gpr_group, serve_command
    except ImportError:  # pragma: no cover - extra not installed
        return
    main.add_command(gpr_group, "gpr")
    main.add_command(serve_command, "serve")


def _register_gpr_sim() -> None:
    """``gpuscale simulate-gpr``: GPR workloads on the simulated cloud."""
    from gpuscale.gpr.sim import gpr_sim_command

    main.add_command(gpr_sim_command, "simulate-gpr")


def _register_sim() -> None:
    """Simulator commands: ``simulate``, ``compare``, ``demo``."""
    from gpuscale.sim.commands import compare_command, demo_command, simulate_command

    main.add_command(simulate_command, "simulate")
    main.add_command(compare_command, "compare")
    main.add_command(demo_command, "demo")


_register_optional()
_register_sim()
_register_server()
_register_gpr_sim()


if __name__ == "__main__":  # pragma: no cover
    main()
