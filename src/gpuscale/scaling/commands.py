"""``gpuscale scaler replay`` and ``gpuscale scaler arbitrate`` (the ``scaler`` group)."""

from __future__ import annotations

import datetime as dt
import json

import click

from gpuscale.core.autoscale.budget import Budget, Demand, arbitrate
from gpuscale.core.autoscale.replay import replay
from gpuscale.errors import InputError
from gpuscale.manifests.scaler import ScalerManifest, load_scalers
from gpuscale.scaling.history import load_history


@click.group("scaler")
def scaler_group() -> None:
    """GPUWorkloadScalers (and KEDA ScaledObjects) without a cluster."""


def _parse_start(text: str | None) -> float:
    if text is None:
        return 0.0
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError("is not an ISO 8601 time", where="--start", value=text,
                         fix="e.g. 2026-01-05T08:00:00Z") from None  # fmt: skip
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def pick_scaler(scalers: tuple[ScalerManifest, ...], name: str | None, source: str) -> ScalerManifest:
    """The scaler named ``name``, or the only one of the file."""
    if name is not None:
        for s in scalers:
            if s.name == name:
                return s
        names = ", ".join(s.name for s in scalers) or "none"
        raise InputError(f"no scaler named {name!r}", where=source, fix=f"scalers in the file: {names}")
    if len(scalers) != 1:
        names = ", ".join(s.name for s in scalers) or "none"
        raise InputError(f"holds {len(scalers)} scalers ({names})", where=source, fix="choose one with --scaler NAME")
    return scalers[0]


@scaler_group.command("replay")
@click.argument("scaler_file", metavar="SCALER.yaml", type=click.Path(dir_okay=False))
@click.argument("history_file", metavar="HISTORY.yaml", type=click.Path(dir_okay=False))
@click.option("--scaler", "name", default=None, help="The scaler to replay when the file holds several.")
@click.option("--replicas", type=click.IntRange(0, 100_000), default=None,
              help="Replicas before the first step (default: minReplicaCount).")  # fmt: skip
@click.option("--start", default=None, help="Wall-clock time of t=0, ISO 8601 (for schedules; default 1970-01-01Z).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON list of {t, currentReplicas, desiredReplicas, reason}."
)
def replay_command(scaler_file: str, history_file: str, name: str | None, replicas: int | None, start: str | None,
                   as_json: bool) -> None:  # fmt: skip
    """Replay HISTORY.yaml (steps {t, metrics: {TRIGGER: value}, readyPods, unreadyPods, missingMetricPods})
    through one scaler and print the desired replicas at each step with the reason."""
    t0 = _parse_start(start)
    scaler = pick_scaler(load_scalers(scaler_file).scalers, name, scaler_file)
    steps = load_history(history_file, [t.name for t in scaler.spec.triggers])
    rows = replay(scaler.spec, steps, start=t0, initial=replicas)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=1))
        return
    spec = scaler.spec
    click.echo(
        f"{scaler.kind} {scaler.namespace}/{scaler.name} -> {scaler.target_kind}/{scaler.target_name}: "
        f"{len(spec.triggers)} trigger(s), replicas {spec.min_replicas}..{spec.max_replicas}"
    )
    click.echo(f"{'t':>8} {'current':>7} {'desired':>7}  reason")
    for r in rows:
        click.echo(f"{r.t:>8g} {r.current:>7} {r.desired:>7}  {r.reason}")


def _desired(pairs: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value.strip().isdigit() or len(value.strip()) > 6:
            raise InputError("must be NAME=REPLICAS", where="--desired", value=pair, fix="e.g. --desired llama-70b=6")
        out[name.strip()] = int(value)
    return out


@scaler_group.command("arbitrate")
@click.argument("files", metavar="FILE...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--desired", "pairs", multiple=True, metavar="SCALER=N",
              help="Replicas a scaler wants (repeat; default: its maxReplicaCount).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print each budget's status as JSON.")
def arbitrate_command(files: tuple[str, ...], pairs: tuple[str, ...], as_json: bool) -> None:
    """Share each GPUBudget among its scalers (spec.gpuBudget) for the given desired replicas, and explain every
    grant and refusal. FILE... hold the GPUBudgets and the GPUWorkloadScalers."""
    scalers: list[ScalerManifest] = []
    budgets: list[Budget] = []
    for f in files:
        got = load_scalers(f)
        scalers.extend(got.scalers)
        budgets.extend(got.budgets)
    wanted = _desired(pairs)
    known = {s.name for s in scalers}
    for name in wanted:
        if name not in known:
            raise InputError(f"no scaler named {name!r}", where="--desired", fix=f"scalers: {', '.join(sorted(known))}")
    if not budgets:
        raise InputError("no GPUBudget in the files", where=", ".join(files), fix="add the GPUBudget's file")
    names = {b.name for b in budgets}
    for s in scalers:
        if s.budget is not None and s.budget.name not in names:
            raise InputError(f"scaler {s.name!r} names GPUBudget {s.budget.name!r}, which is not in the files",
                             where="spec.gpuBudget.name", fix=f"budgets: {', '.join(sorted(names))}")  # fmt: skip
    statuses: dict[str, object] = {}
    for b in budgets:
        members = [s for s in scalers if s.budget is not None and s.budget.name == b.name]
        demands = [
            Demand(s.name, s.budget.model, wanted.get(s.name, s.spec.max_replicas), s.priority,
                   s.budget.gpus_per_replica)
            for s in members
            if s.budget is not None
        ]  # fmt: skip
        result = arbitrate(b, demands)
        statuses[b.name] = result.status()
        if as_json:
            continue
        click.echo(f"GPUBudget {b.name}: {result.used_gpus} of {b.total_gpus} GPUs granted, {result.free_gpus} free")
        for g in result.grants:
            click.echo(f"  {g.scaler} ({g.model}): {g.granted} of {g.desired} replicas, {g.gpus} GPUs")
            for reason in g.reasons:
                click.echo(f"    - {reason}")
        for note in result.notes:
            click.echo(f"  note: {note}")
    if as_json:
        click.echo(json.dumps(statuses, indent=1))
