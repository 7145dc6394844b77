"""The ``gpuscale`` command line.

Exit codes, for every command: 0 success, 2 bad input (an :class:`InputError`, a usage error, a missing extra),
1 an internal error (one line; the traceback only with ``gpuscale --debug`` or ``GPUSCALE_DEBUG=1``), 130 on Ctrl-C
and 141 when the reader of a pipe goes away (quietly). Commands living in optional layers are loaded when invoked,
so ``gpuscale --help`` lists them all even when an extra they need is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from gpuscale.catalogs.skips import summarise
from gpuscale.clock import SystemClock
from gpuscale.core.model import Catalog, InstanceType, Snapshot
from gpuscale.core.plan import PlannerConfig, ScaleUpPlan
from gpuscale.core.planner import plan as run_plan
from gpuscale.core.scoring import SCORERS
from gpuscale.errors import GpuscaleError, InputError

DEBUG_ENV = "GPUSCALE_DEBUG"
MAX_ERROR_CHARS = 4000
"""An error report longer than this is cut (with the count of characters left out)."""
EXTRAS: dict[str, str] = {
    "fastapi": "server",
    "starlette": "server",
    "pydantic": "server",
    "uvicorn": "server",
    "httpx": "server",
    "matplotlib": "sim",
    "scipy": "solver",
    "linode_api4": "linode",
    "requests": "linode",
    "lightkube": "kube",
    "httpx2": "kube",
    "pynvml": "agent",
    "prometheus_client": "agent",
}
"""Third-party modules of the optional extras and the extra that installs each."""
_SECRET_ENVS = ("LINODE_TOKEN", "GPUSCALE_API_TOKEN")


def extra_hint(module: str) -> str | None:
    """``pip install 'gpuscale[EXTRA]'`` for a missing third-party ``module`` of an extra, else None."""
    extra = EXTRAS.get(module.split(".", 1)[0])
    return f"pip install 'gpuscale[{extra}]'" if extra else None


def _scrub(text: str) -> str:
    for env in _SECRET_ENVS:
        secret = os.environ.get(env, "")
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.find_root().params.get("debug")) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush stays silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (e.g. under a test runner)
        pass


@dataclass(frozen=True, slots=True)
class Lazy:
    """A command imported from ``target`` (``module:attribute``) only when it is used."""

    target: str
    help: str
    needs: tuple[str, ...] = ()
    """Third-party modules it cannot run without (checked without importing, for ``--help``)."""

    def missing(self) -> str | None:
        """The first needed module that is not installed, or None."""
        return next((m for m in self.needs if importlib.util.find_spec(m) is None), None)


def _needs_extra(name: str, module: str) -> click.Command:
    hint = extra_hint(module) or f"pip install {module}"

    @click.command(
        name,
        help=f"(needs {hint})",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    @click.pass_context
    def stand_in(ctx: click.Context) -> NoReturn:
        click.echo(f"error: '{name}' needs {module}, which is not installed: {hint}", err=True)
        ctx.exit(2)
        raise AssertionError("unreachable")  # pragma: no cover

    return stand_in


class LazyGroup(click.Group):
    """A group whose ``lazy`` commands are imported when invoked; a missing extra gives a stand-in naming it."""

    def __init__(self, *args: Any, lazy: dict[str, Lazy] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lazy.get(cmd_name)
        if spec is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attr = spec.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing.split(".", 1)[0] == "gpuscale" or extra_hint(missing) is None:
                raise  # gpuscale's own code, or an undeclared dependency: a real bug, never hidden
            return _needs_extra(cmd_name, missing)
        cmd = getattr(module, attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: list[tuple[str, str]] = []
        for name in self.list_commands(ctx):
            spec = self.lazy.get(name)
            if spec is not None:
                missing = spec.missing()
                hint = f" (needs {extra_hint(missing) or missing})" if missing else ""
                rows.append((name, spec.help + hint))
                continue
            cmd = super().get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(formatter.width - 6 - max(len(n) for n in self.commands))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class RootGroup(LazyGroup):
    """The top-level group: maps every way a command can end to an exit code and at most one line of stderr."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a broken pipe shows here, inside the handlers below
            return result
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except InputError as exc:
            if _debug(ctx):
                raise
            click.echo(f"error: {_clip(_scrub(str(exc)))}", err=True)
            ctx.exit(2)
        except ModuleNotFoundError as exc:
            hint = extra_hint(exc.name or "")
            if hint is None or _debug(ctx):
                return self._internal(ctx, exc)
            click.echo(f"error: this needs {exc.name}, which is not installed: {hint}", err=True)
            ctx.exit(2)
        except BrokenPipeError:
            _quiet_stdout()
            ctx.exit(141)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except GpuscaleError as exc:
            if _debug(ctx):
                raise
            click.echo(f"error: {_clip(_scrub(str(exc)), 500)}", err=True)
            ctx.exit(1)
        except Exception as exc:
            return self._internal(ctx, exc)

    def _internal(self, ctx: click.Context, exc: BaseException) -> NoReturn:
        if _debug(ctx):
            raise exc
        first = (str(exc).strip().splitlines() or [""])[0]
        message = _scrub(_clip(first, 200))
        click.echo(
            f"internal error: {type(exc).__name__}{': ' + message if message else ''}. This is a bug in gpuscale: "
            f"re-run with --debug (or {DEBUG_ENV}=1) and open an issue with the output.",
            err=True,
        )
        ctx.exit(1)
        raise AssertionError("unreachable")  # pragma: no cover


_ROOT_LAZY = {
    "agent": Lazy(
        "gpuscale.metrics.agent:agent_command",
        "Export GPU metrics in the DCGM exporter's format (NVML or --simulate).",
        ("prometheus_client",),
    ),
    "compare": Lazy("gpuscale.sim.commands:compare_command", "Run a scenario under gpuscale and baseline policies."),
    "controller": Lazy(
        "gpuscale.kube.command:controller_command", "Run the controller against a Kubernetes cluster.", ("lightkube",)
    ),
    "crds": Lazy("gpuscale.manifests.crds:crds_command", "Print, write or check gpuscale's CRDs."),
    "demo": Lazy("gpuscale.sim.commands:demo_command", "A simulated day of bursty GPU work autoscaled by gpuscale."),
    "examples": Lazy("gpuscale.examples_cmd:examples_group", "The example files shipped with gpuscale."),
    "gpr": Lazy("gpuscale.gpr.cli:gpr_group", "GPU Provisioning Requests through the REST API.", ("httpx",)),
    "rightsize": Lazy(
        "gpuscale.scaling.rightsize_cmd:rightsize_command", "Recommend CPU/memory requests and GPU sizes from usage."
    ),
    "scaler": Lazy("gpuscale.scaling.commands:scaler_group", "Workload scalers offline: replay, budget arbitration."),
    "serve": Lazy(
        "gpuscale.gpr.cli:serve_command",
        "Serve the GPR REST API.",
        ("fastapi", "pydantic", "uvicorn", "httpx"),
    ),
    "simulate": Lazy("gpuscale.sim.commands:simulate_command", "Replay a scenario in the simulator."),
    "simulate-gpr": Lazy("gpuscale.sim.gpr:gpr_sim_command", "GPR workloads on the simulated cloud."),
}


@click.group(cls=RootGroup, lazy=_ROOT_LAZY)
@click.option("--debug", is_flag=True, help=f"Show the traceback of an internal error (or set {DEBUG_ENV}=1).")
@click.version_option(package_name="gpuscale")
def main(debug: bool) -> None:
    """gpuscale: dynamic GPU node allocation for Kubernetes."""


def _load_catalog(catalog: str, region: str | None, verbose: bool) -> Catalog:
    from gpuscale.catalogs import load_catalog

    cat = load_catalog(catalog, region=region)
    skips = summarise(cat.name, cat.warnings)
    for warning in skips.others:
        click.echo(f"warning: {warning}", err=True)
    line = skips.line()
    if line:
        click.echo(f"note: {line if not verbose else line.removesuffix('; -v for details')}", err=True)
    if verbose:
        for detail in skips.details:
            click.echo(f"  {detail}", err=True)
    return cat


def _load(snapshot: str, catalog: str, region: str | None, verbose: bool = False) -> Snapshot:
    from gpuscale.manifests import load_snapshot

    cat = _load_catalog(catalog, region, verbose)
    notes: list[str] = []
    snap = load_snapshot(snapshot, catalog=cat, now=SystemClock().now(), notes=notes)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    return snap


_catalog_opt = click.option(
    "--catalog", default="linode", show_default=True, help="Catalog name (linode, aws, gcp, alibaba) or a YAML file."
)
_region_opt = click.option("--region", default=None, help="Catalog region (default: the catalog's own).")
_scorer_opt = click.option(
    "--scorer", type=click.Choice(sorted(SCORERS)), default="fill-frag", show_default=True, help="Placement scorer."
)
_solver_opt = click.option(
    "--solver/--no-solver", default=True, show_default=True, help="Improve the greedy plan with an integer program."
)
_verbose_opt = click.option("-v", "--verbose", is_flag=True, help="Details of skipped catalog rows.")
_snapshot_arg = click.argument("snapshot", type=click.Path(exists=False))


@main.command("plan", short_help="Plan new GPU nodes for the pending pods of a cluster snapshot.")
@_snapshot_arg
@_catalog_opt
@_region_opt
@_scorer_opt
@_solver_opt
@_verbose_opt
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--provider", default=None, help="Cloud of the nodes (linode, aws, gcp, alibaba): plan on its catalog.")
@click.pass_context
def plan_cmd(
    ctx: click.Context,
    snapshot: str,
    catalog: str,
    region: str | None,
    scorer: str,
    solver: bool,
    verbose: bool,
    as_json: bool,
    provider: str | None,
) -> None:
    """Plan new GPU nodes for the pending pods of SNAPSHOT (a YAML file, or a directory of them, holding Pods,
    Nodes and GPUNodePools)."""
    if provider is not None:
        catalog = _provider_catalog(provider, catalog, ctx.get_parameter_source("catalog"))
    snap = _load(snapshot, catalog, region, verbose)
    if solver and importlib.util.find_spec("scipy") is None:
        click.echo(f"note: greedy plan only; the integer-program solver needs {extra_hint('scipy')}", err=True)
    result = run_plan(snap, PlannerConfig(scorer=scorer, exact_solver=solver), SystemClock().now())
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    print_plan(result, snap)


def _provider_catalog(provider: str, catalog: str, source: click.core.ParameterSource | None) -> str:
    """The catalog to plan on for ``--provider``: its own shipped catalog unless ``--catalog`` names one (which must
    then be that provider's, e.g. ``aws:eu-west-1``, or a custom YAML file)."""
    from gpuscale.catalogs import KNOWN_CATALOGS

    name = provider.strip().lower()
    if name not in KNOWN_CATALOGS:
        raise InputError(
            "unknown provider", where="--provider", value=provider, fix=f"use one of {', '.join(KNOWN_CATALOGS)}"
        )
    if source is click.core.ParameterSource.DEFAULT:
        return name
    given = catalog.partition(":")[0].lower()
    if given in KNOWN_CATALOGS and given != name:
        raise InputError(
            f"catalog {catalog!r} is not provider {name!r}'s", where="--catalog", fix=f"use {name} or {name}:REGION"
        )
    return catalog


def print_plan(result: ScaleUpPlan, snap: Snapshot) -> None:
    """Human tables of launches and blocked pods."""
    from rich.console import Console
    from rich.table import Table

    out = Console(highlight=False, soft_wrap=True)
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
            out.print(f"  [bold]{b.pod}[/bold]  [yellow]{b.reason}[/yellow]", markup=True)
            out.print(f"    {b.message}", markup=False)


def pod_suggestions(snap: Snapshot, pod: str, n: int = 3) -> list[str]:
    """Up to ``n`` pod keys whose name looks like ``pod``'s name (any namespace, case-insensitive), best first."""
    import difflib

    want = pod.rsplit("/", 1)[-1].lower()
    by_name: dict[str, list[str]] = {}
    for p in snap.pods:
        by_name.setdefault(p.name.lower(), []).append(p.key)
    names = difflib.get_close_matches(want, list(by_name), n=n, cutoff=0.5)
    return [key for name in names for key in sorted(by_name[name])][:n]


@main.command("explain", short_help="Say why a pod of a snapshot triggers a scale-up or stays pending.")
@_snapshot_arg
@click.argument("pod")
@_catalog_opt
@_region_opt
@_verbose_opt
def explain_cmd(snapshot: str, pod: str, catalog: str, region: str | None, verbose: bool) -> None:
    """Say what happens to POD (``name`` or ``namespace/name``) of SNAPSHOT (a file or directory) and why."""
    snap = _load(snapshot, catalog, region, verbose)
    key = pod if "/" in pod else f"default/{pod}"
    matches = [p for p in snap.pods if p.key == key] or [p for p in snap.pods if p.name == pod and "/" not in pod]
    if not matches:
        hits = pod_suggestions(snap, pod)
        fix = f"did you mean {' or '.join(hits)}?" if hits else "give name or namespace/name of a pod in the snapshot"
        raise InputError("no such pod in the snapshot", where=snapshot, value=pod[:60], fix=fix)
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
        if snap.workloads:  # the nodes of active GPRs it may not use
            from gpuscale.core.planner.explain import gpr_refusals

            for why in gpr_refusals(snap, target):
                click.echo(f"not on existing nodes: {why}")
    else:
        click.echo(f"{target.key} fits the existing node {where}; no scale-up needed.")


@main.group(
    "bench",
    cls=LazyGroup,
    short_help="Benchmarks: planner speed, packing quality on openb.",
    lazy={
        "planner": Lazy("gpuscale.bench.planner:planner_command", "Planner speed on a large synthetic cluster."),
        "openb": Lazy("gpuscale.bench.openb:openb_command", "Packing quality on the Alibaba openb trace."),
    },
)
def bench_group() -> None:
    """Benchmarks (speed and quality), printed with the figures they measure."""


@main.group("catalog", short_help="List the instance catalogs and show their instance types.")
def catalog_group() -> None:
    """The instance catalogs plans are made from: `list` them, `show NAME[:REGION]` (or a YAML file)."""


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """Plain aligned columns (two spaces apart), the header first: readable in a terminal, a pipe or a file."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]
    align = right or [False] * len(headers)
    lines = []
    for row in (headers, *rows):
        cells = [f"{c:>{w}}" if r else f"{c:<{w}}" for c, w, r in zip(row, widths, align, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


@catalog_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def catalog_list(as_json: bool) -> None:
    """The shipped catalogs: name, default region, regions and instance types (in the default region)."""
    from gpuscale.catalogs import KNOWN_CATALOGS, catalog_info

    infos = [catalog_info(name) for name in KNOWN_CATALOGS]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": i.name,
                        "description": i.description,
                        "defaultRegion": i.default_region,
                        "regions": None if i.regions is None else list(i.regions),
                        "instanceTypes": i.instance_types,
                    }
                    for i in infos
                ],
                indent=2,
            )
        )
        return
    rows = [
        (i.name, i.default_region, "any" if i.regions is None else str(len(i.regions)), str(i.instance_types))
        for i in infos
    ]
    click.echo(text_table(("name", "default region", "regions", "types"), rows, (False, False, True, True)))
    click.echo("\n" + "\n".join(f"{i.name}: {i.description}" for i in infos))
    click.echo("\ngpuscale catalog show NAME[:REGION] lists a catalog's instance types; --catalog FILE.yaml for yours.")


def _type_json(it: InstanceType) -> dict[str, Any]:
    return {
        "name": it.name,
        "provider": it.provider,
        "region": it.region,
        "gpuCount": it.gpu_count,
        "gpuModel": it.gpu_model,
        "gpuMemoryMiB": it.gpu_memory_mib,
        "vcpus": it.vcpus,
        "memoryMiB": it.memory_mib,
        "arch": it.arch,
        "offerings": [
            {"zone": o.zone, "capacityType": str(o.capacity_type), "hourlyUsd": o.hourly_price} for o in it.offerings
        ],
    }


def _min_price(it: InstanceType, capacity: str) -> str:
    prices = [o.hourly_price for o in it.offerings if str(o.capacity_type) == capacity]
    return f"{min(prices):.3f}" if prices else "-"


def _zones(it: InstanceType) -> str:
    zones = sorted({o.zone for o in it.offerings})
    return ",".join(zones) if len(zones) <= 2 else f"{zones[0]},… ({len(zones)})"


def _gpu_matches(model: str, want: str) -> bool:
    """``a100`` matches A100, A100-40GB and A100-80GB; ``a10`` matches A10 only (case-insensitive)."""
    model = model.lower()
    return model == want or model.startswith(want + "-")


def _gib(mib: int) -> str:
    return f"{mib / 1024:g}" if mib else "?"


@catalog_group.command("show")
@click.argument("name")
@_region_opt
@click.option("--gpu", default=None, help="Only instance types with this GPU model (e.g. A100, L4; case-insensitive).")
@_verbose_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def catalog_show(name: str, region: str | None, gpu: str | None, verbose: bool, as_json: bool) -> None:
    """The instance types of catalog NAME (``linode``, ``aws:eu-west-1``, ``alibaba`` or a YAML file): GPUs, GPU
    memory, vCPUs, memory, cheapest on-demand and spot $/h, zones."""
    cat = _load_catalog(name, region, verbose)
    types = list(cat.instance_types)
    if gpu:
        want = gpu.strip().lower()
        models = sorted({it.gpu_model for it in types if it.gpu_model})
        types = [it for it in types if it.gpu_model and _gpu_matches(it.gpu_model, want)]
        if not types:
            from gpuscale.manifests.problems import did_you_mean

            fix = did_you_mean(gpu, models)
            raise InputError(f"no instance type with this GPU in {cat.name}", where="--gpu", value=gpu[:60], fix=fix)
    if as_json:
        click.echo(json.dumps({"catalog": cat.name, "instanceTypes": [_type_json(it) for it in types]}, indent=2))
        return
    rows = [
        (
            it.name,
            f"{it.gpu_count}× {it.gpu_model}" if it.gpu_count else "-",
            _gib(it.gpu_memory_mib) if it.gpu_count else "-",
            str(it.vcpus),
            _gib(it.memory_mib),
            _min_price(it, "on-demand"),
            _min_price(it, "spot"),
            _zones(it),
        )
        for it in types
    ]
    click.echo(f"{cat.name}: {len(rows)} instance types (GPU memory per GPU and memory in GiB; cheapest $/h)")
    headers = ("type", "GPUs", "GPU GiB", "vCPU", "GiB", "$/h", "spot $/h", "zones")
    click.echo(text_table(headers, rows, (False, False, True, True, True, True, True, False)))


if __name__ == "__main__":  # pragma: no cover
    main()
