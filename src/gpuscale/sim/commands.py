"""``gpuscale simulate``, ``gpuscale compare`` and ``gpuscale demo``."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gpuscale.errors import InputError
from gpuscale.resources import example
from gpuscale.sim.compare_providers import format_providers, parse_providers, provider_rows, providers_csv
from gpuscale.sim.policies import POLICIES, factory_for, lower_bound
from gpuscale.sim.report import format_report, write_outputs
from gpuscale.sim.runner import SimResult, run_simulation
from gpuscale.sim.scenario import Scenario, load_scenario
from gpuscale.sim.workloads import Arrival

DEMO_SCENARIO = example("demo.yaml")
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
    scenario = load_scenario(path)
    if seed is not None:
        scenario = dataclasses.replace(scenario, seed=seed)
    if scenario.inference is not None:  # inference models and scalers: gpuscale with its budgets
        from gpuscale.sim.scalers import simulate_inference

        simulate_inference(scenario, policy, as_json, out)
        return
    name = _policy_name(scenario, policy)
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


def gpr_report_keys(report: Mapping[str, Any]) -> dict[str, Any]:
    """The GPR figures of a report of a scenario with GPRs (none otherwise)."""
    from gpuscale.sim.gpr.mixed import gpr_report_keys as keys

    return keys(report)


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
        rows.append({k: (name if k == "policy" else res.report[k]) for k in COMPARE_KEYS} | gpr_report_keys(res.report))
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


_COST_COLUMNS = (
    ("policy", "policy", ""),
    ("cost $", "costUsd", ",.2f"),
    ("vs bound", "vsBound", ""),
    ("GPU-h bought", "gpuHoursBought", ",.1f"),
    ("GPU-h asked", "gpuHoursRequested", ",.1f"),
    ("nodes", "nodesLaunched", "d"),
)
_WAIT_COLUMNS = (
    ("policy", "policy", ""),
    ("p50 wait s", "pendingP50s", ".0f"),
    ("p95 wait s", "pendingP95s", ".0f"),
    ("p99 wait s", "pendingP99s", ".0f"),
    ("dup", "duplicateLaunches", "d"),
    ("failed", "failedLaunches", "d"),
    ("disruptions", "disruptions", "d"),
)


def _cells(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]) -> list[list[str]]:
    bound = next((r["costUsd"] for r in rows if r["policy"] == "lower-bound"), None)
    out = []
    for r in rows:
        cells = []
        for _, key, fmt in columns:
            if key == "vsBound":
                cost = r["costUsd"]
                cells.append(f"{(cost / bound - 1) * 100:+.1f}%" if bound and r["policy"] != "lower-bound" else "")
            elif key not in r:
                cells.append("")
            elif key == "policy":
                cells.append("lower bound" if r[key] == "lower-bound" else str(r[key]))
            else:
                cells.append(format(r[key], fmt))
        out.append(cells)
    return out


def _aligned(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(headers, *cells, strict=True)]
    lines = []
    for row in (list(headers), *cells):
        parts = [f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return lines


def format_compare(rows: Sequence[Mapping[str, Any]], title: str, width: int = 80) -> str:
    """The ``compare`` report as plain text no wider than ``width``: two tables (cost, then waiting and events),
    or, when even those do not fit, one block per policy. Numbers are never cut."""
    text = [f"{title}: policies on the same workload (cost in USD, waits in seconds)", ""]
    policies = [r for r in rows if r["policy"] != "lower-bound"]
    tables = []
    for columns, subset in ((_COST_COLUMNS, rows), (_WAIT_COLUMNS, policies)):
        tables.append(_aligned([h for h, _, _ in columns], _cells(subset, columns)))
    if max(len(line) for table in tables for line in table) <= width:
        return "\n".join(text + tables[0] + [""] + tables[1])
    labels = [(h, k, f) for h, k, f in (*_COST_COLUMNS[1:], *_WAIT_COLUMNS[1:])]
    pad = max(len(h) for h, _, _ in labels)
    for cells in _cells(rows, (("policy", "policy", ""), *labels)):
        text.append(cells[0])
        text.extend(f"  {h:<{pad}}  {c}" for (h, _, _), c in zip(labels, cells[1:], strict=True) if c)
    return "\n".join(text)


def compare_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """``compare --csv``: the ``--json`` keys as a header, one row per policy and the lower bound (plain numbers)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COMPARE_KEYS, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


@click.command("compare")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--policies", default=None, help=f"Comma-separated policies to compare [default: {','.join(POLICIES)}].")
@click.option(
    "--providers", default=None, help="Instead of policies: gpuscale on each provider profile (e.g. lke,eks,gke,ack)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per policy (or provider).")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV: a header, one row per policy (or provider).")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write compare.json (and compare.png).")
@_seed_opt
def compare_command(
    scenario: str,
    policies: str | None,
    providers: str | None,
    as_json: bool,
    as_csv: bool,
    out: str | None,
    seed: int | None,
) -> None:
    """Run SCENARIO under gpuscale and baseline policies on the same workload; one table, one plot.

    With --providers, run it under gpuscale on each provider profile instead (see docs/simulator.md)."""
    if as_json and as_csv:
        raise InputError("--json and --csv both given", where="compare", fix="choose one output format")
    if providers is not None:
        if policies is not None:
            raise InputError("--policies and --providers both given", where="compare", fix="choose one")
        _compare_providers(scenario, providers, as_json, as_csv, out, seed)
        return
    from gpuscale.sim.scalers import compare_inference_file  # a scenario with inference models and scalers

    inference_policies = None if policies == ",".join(POLICIES) else policies
    if compare_inference_file(scenario, inference_policies, as_json, as_csv, out, seed):
        return
    policies = policies or ",".join(POLICIES)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        value = unknown[0][:60] if unknown else policies[:60]
        raise InputError("unknown policy", where="--policies", value=value, fix=f"use {', '.join(POLICIES)}")
    scen = load_scenario(scenario)
    if seed is not None:
        scen = dataclasses.replace(scen, seed=seed)
    quiet = as_json or as_csv
    rows, _ = compare_rows(scen, names, show_progress=not quiet and sys.stderr.isatty())
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "compare.json").write_text(json.dumps(rows, indent=2))
        plot_compare(rows, Path(out) / "compare.png", scen.name)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if as_csv:
        click.echo(compare_csv(rows), nl=False)
        return
    click.echo(format_compare(rows, scen.name, shutil.get_terminal_size().columns))
    if out:
        click.echo(f"wrote {Path(out) / 'compare.json'}, {Path(out) / 'compare.png'}")


def _compare_providers(
    scenario: str, providers: str, as_json: bool, as_csv: bool, out: str | None, seed: int | None
) -> None:
    profiles = parse_providers(providers)
    progress = not (as_json or as_csv) and sys.stderr.isatty()
    rows, scenarios = provider_rows(
        scenario, profiles, lambda scen: simulate_policy(scen, "gpuscale", show_progress=progress), seed
    )
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "compare.json").write_text(json.dumps(rows, indent=2))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif as_csv:
        click.echo(providers_csv(rows), nl=False)
    else:
        title = next(iter(scenarios.values())).name
        click.echo(format_providers(rows, title, shutil.get_terminal_size().columns))
        if out:
            click.echo(f"wrote {Path(out) / 'compare.json'}")
