"""``gpuscale simulate``, ``gpuscale compare`` and ``gpuscale demo``."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuscale.errors import InputError
from gpuscale.sim.policies import POLICIES, factory_for, lower_bound
from gpuscale.sim.report import format_report, write_outputs
from gpuscale.sim.runner import SimResult, run_simulation
from gpuscale.sim.scenario import Scenario, load_scenario
from gpuscale.sim.workloads import Arrival

DEMO_SCENARIO = Path(__file__).resolve().parent.parent / "examples" / "demo.yaml"
COMPARE_KEYS = (
    "policy",
    "costUsd",
    "gpuHoursBought",
    "gpuHoursRequested",
    "pendingP50s",
    "pendingP95s",
    "pendingP99s",
    "nodesLaunched",
    "duplicateLaunches",
    "failedLaunches",
    "disruptions",
)


def _fail(exc: InputError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


@contextmanager
def _progress(enabled: bool, label: str) -> Iterator[Callable[[float], None] | None]:
    if not enabled:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}% of simulated time"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=1.0)
        yield lambda fraction: bar.update(task, completed=fraction)


def simulate_policy(
    scenario: Scenario, policy: str, arrivals: Sequence[Arrival] | None = None, show_progress: bool = False
) -> SimResult:
    """Run ``scenario`` under ``policy`` (one of :data:`POLICIES`)."""
    work = list(arrivals) if arrivals is not None else scenario.arrivals()
    with _progress(show_progress, f"{scenario.name} · {policy}") as progress:
        return run_simulation(scenario, factory_for(policy, work), arrivals=work, progress=progress, policy_name=policy)


def _policy_name(scenario: Scenario, override: str | None) -> str:
    name = override or str(scenario.policy.get("name", "gpuscale"))
    if name not in POLICIES:
        raise InputError(f"unknown policy {name!r}", where="policy.name", fix=f"use one of {', '.join(POLICIES)}")
    return name


def run_and_report(path: str | Path, policy: str | None, as_json: bool, out: str | None, seed: int | None) -> None:
    """Shared body of ``simulate`` and ``demo``."""
    try:
        scenario = load_scenario(path)
        if seed is not None:
            scenario = dataclasses.replace(scenario, seed=seed)
        name = _policy_name(scenario, policy)
    except InputError as exc:
        _fail(exc)
        return
    result = simulate_policy(scenario, name, show_progress=not as_json and sys.stderr.isatty())
    report = result.report
    if out:
        paths = write_outputs(report, result.series, out)
        if not as_json:
            click.echo("wrote " + ", ".join(str(p) for p in paths.values()))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_report(report))


_seed_opt = click.option("--seed", type=int, default=None, help="Override the scenario's seed.")


@click.command("simulate")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--policy", type=click.Choice(POLICIES), default=None, help="Override the scenario's policy.name.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write report.json, CSV and PNG here.")
@_seed_opt
def simulate_command(scenario: str, policy: str | None, as_json: bool, out: str | None, seed: int | None) -> None:
    """Replay SCENARIO (YAML) against the simulated cluster and cloud and print the report."""
    run_and_report(scenario, policy, as_json, out, seed)


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write report.json, CSV and PNG here.")
def demo_command(as_json: bool, out: str | None) -> None:
    """A day of bursty GPU work on the Linode catalog, autoscaled by gpuscale in the simulator."""
    if not as_json:
        click.echo(f"scenario: {DEMO_SCENARIO}")
    run_and_report(DEMO_SCENARIO, None, as_json, out, None)


def compare_rows(
    scenario: Scenario, policies: Sequence[str], show_progress: bool = False
) -> tuple[list[dict[str, Any]], dict[str, SimResult]]:
    """Run every policy on the same arrivals; rows in the documented ``--json`` shape plus the lower bound."""
    work = scenario.arrivals()
    rows: list[dict[str, Any]] = []
    results: dict[str, SimResult] = {}
    for name in policies:
        res = simulate_policy(scenario, name, work, show_progress)
        results[name] = res
        rows.append({k: (name if k == "policy" else res.report[k]) for k in COMPARE_KEYS})
    rows.append({"policy": "lower-bound", "costUsd": round(lower_bound(work, scenario.pools, scenario.catalog), 6)})
    return rows, results


def plot_compare(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """Cost per policy (bars) with the lower bound (line), and p95 pending time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = [r for r in rows if r["policy"] != "lower-bound"]
    bound = next((r["costUsd"] for r in rows if r["policy"] == "lower-bound"), None)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["policy"] for r in policies]
    ax1.bar(names, [r["costUsd"] for r in policies], color="#4C72B0")
    if bound is not None:
        ax1.axhline(bound, color="#C44E52", linestyle="--", label=f"offline lower bound ${bound:,.0f}")
        ax1.legend()
    ax1.set_ylabel("cost (USD)")
    ax1.set_title("total cost")
    ax2.bar(names, [r["pendingP95s"] for r in policies], color="#55A868")
    ax2.set_ylabel("seconds")
    ax2.set_title("p95 pending time")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command("compare")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--policies", default=",".join(POLICIES), show_default=True, help="Comma-separated policies to compare.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per policy and the lower bound.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write compare.json and compare.png here.")
@_seed_opt
def compare_command(scenario: str, policies: str, as_json: bool, out: str | None, seed: int | None) -> None:
    """Run SCENARIO under gpuscale and baseline policies on the same workload; one table, one plot."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    try:
        unknown = [p for p in names if p not in POLICIES]
        if unknown:
            raise InputError(f"unknown policy {unknown[0]!r}", where="--policies", fix=f"use {', '.join(POLICIES)}")
        scen = load_scenario(scenario)
        if seed is not None:
            scen = dataclasses.replace(scen, seed=seed)
    except InputError as exc:
        _fail(exc)
        return
    rows, _ = compare_rows(scen, names, show_progress=not as_json and sys.stderr.isatty())
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "compare.json").write_text(json.dumps(rows, indent=2))
        plot_compare(rows, Path(out) / "compare.png", scen.name)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{scen.name}: policies on the same workload", title_justify="left")
    for col in (
        "policy",
        "cost $",
        "GPU-h bought",
        "GPU-h requested",
        "p50 s",
        "p95 s",
        "p99 s",
        "nodes",
        "dup",
        "failed",
        "disruptions",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        if r["policy"] == "lower-bound":
            table.add_row("offline lower bound", f"{r['costUsd']:,.2f}", *[""] * 9)
            continue
        table.add_row(
            r["policy"],
            f"{r['costUsd']:,.2f}",
            f"{r['gpuHoursBought']:,.1f}",
            f"{r['gpuHoursRequested']:,.1f}",
            f"{r['pendingP50s']:.0f}",
            f"{r['pendingP95s']:.0f}",
            f"{r['pendingP99s']:.0f}",
            str(r["nodesLaunched"]),
            str(r["duplicateLaunches"]),
            str(r["failedLaunches"]),
            str(r["disruptions"]),
        )
    Console().print(table)
    if out:
        click.echo(f"wrote {Path(out) / 'compare.json'}, {Path(out) / 'compare.png'}")
