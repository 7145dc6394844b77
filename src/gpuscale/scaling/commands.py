"""``gpuscale scaler replay`` (and the ``scaler`` group)."""

from __future__ import annotations

import datetime as dt
import json

import click

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
