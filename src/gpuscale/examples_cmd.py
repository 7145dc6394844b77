"""``gpuscale examples``: list, show and copy the example files shipped inside the package.

They let a fresh install be tried from an empty directory: ``gpuscale examples copy`` writes them out, then
``gpuscale plan snapshot.yaml`` and the other commands in each file's description run on them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from gpuscale.errors import InputError
from gpuscale.resources import EXAMPLES, example


def _fail(exc: InputError) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


@click.group("examples", invoke_without_command=True)
@click.pass_context
def examples_group(ctx: click.Context) -> None:
    """The example files shipped with gpuscale (list them; `show NAME`; `copy [DIR]`)."""
    if ctx.invoked_subcommand is None:
        list_command.invoke(ctx)


@examples_group.command("list")
def list_command() -> None:
    """List the shipped example files, one line each."""
    width = max(map(len, EXAMPLES))
    for name, description in EXAMPLES.items():
        click.echo(f"{name:<{width}}  {description}")


@examples_group.command("show")
@click.argument("name")
def show_command(name: str) -> None:
    """Print one shipped example (NAME as listed, the .yaml may be left out)."""
    try:
        path = example(name)
    except InputError as exc:
        _fail(exc)
    click.echo(path.read_text(encoding="utf-8"), nl=False)


@examples_group.command("copy")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=".")
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
def copy_command(directory: Path, force: bool) -> None:
    """Write every shipped example into DIRECTORY (default: here). Refuses to overwrite unless --force."""
    targets = {name: directory / name for name in EXAMPLES}
    existing = sorted(name for name, target in targets.items() if target.exists())
    if existing and not force:
        _fail(
            InputError(
                f"{len(existing)} example file(s) already exist, nothing written",
                where=str(directory)[:200],
                value=", ".join(existing),
                fix="use --force to overwrite them, or copy into another directory",
            )
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, target in targets.items():
            target.write_bytes(example(name).read_bytes())
    except OSError as exc:
        _fail(InputError(f"cannot write the examples: {exc.strerror}", where=str(directory)[:200]))
    for target in targets.values():
        click.echo(f"wrote {target}")
    click.echo("try: gpuscale plan " + str(targets["snapshot.yaml"]) + " --catalog linode")
