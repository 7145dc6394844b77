"""The README and docs/ cannot name what does not exist.

Checked mechanically, against the code and the tree (never against a list kept here): every ``gpuscale ...``
command line shown names real commands and options; every ``$ gpuscale ...`` console block shows that command's
current output; every relative link resolves; docs/architecture.md's layer list is ``.importlinter``'s, and its
module table names every package and only files that exist.
"""

from __future__ import annotations

import configparser
import dataclasses
import importlib
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from gpuscale.cli import main
from gpuscale.sim.scenario import parse_scenario

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gpuscale"
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ARCH = ROOT / "docs" / "architecture.md"


def _command_lines(text: str) -> Iterator[tuple[int, str]]:
    """``gpuscale ...`` lines of code blocks, and inline code spans starting with ``gpuscale ``."""
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            in_code = not in_code
        elif in_code:
            m = re.match(r"\s*(?:\$ )?(?:\S*/)?gpuscale\s+(\S.*)$", line)
            if m:
                yield n, m.group(1)
        else:
            for span in re.findall(r"`([^`]+)`", line):
                m = re.match(r"(?:\.venv/bin/)?gpuscale\s+(.+)$", span)
                if m:
                    yield n, m.group(1)


def _problems(args: str) -> list[str]:
    """What in ``gpuscale ARGS`` (up to a comment or pipe) is not a command or option of the CLI."""
    line = re.split(r"\s#|\||&&|;|>", args)[0]
    try:
        tokens = shlex.split(line)
    except ValueError:
        tokens = line.split()
    ctx = click.Context(main)
    cmd: click.Command = main
    path = ["gpuscale"]
    options = {o for p in main.params for o in (*p.opts, *p.secondary_opts)}
    problems = []
    for tok in tokens:
        if tok.startswith("--") or re.fullmatch(r"-[a-zA-Z]", tok):
            name = tok.split("=", 1)[0]
            if name not in options | {"--help"}:
                problems.append(f"no option {name} for {' '.join(path)}")
        elif isinstance(cmd, click.Group) and re.fullmatch(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*", tok):
            subs = [cmd.get_command(ctx, name) for name in tok.split("|")]
            if any(s is None for s in subs):
                problems.append(f"no command {tok} in {' '.join(path)}")
                break
            cmd = subs[0]  # type: ignore[assignment]
            path.append(tok.split("|")[0])
            options |= {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        elif isinstance(cmd, click.Group):
            break  # prose after the command name ("gpuscale (no cluster...)")
    return problems


def test_every_command_line_shown_names_real_commands_and_options() -> None:
    shown, wrong = 0, []
    for doc in DOCS:
        for n, args in _command_lines(doc.read_text(encoding="utf-8")):
            shown += 1
            wrong += [f"{doc.relative_to(ROOT)}:{n}: gpuscale {args.strip()}: {p}" for p in _problems(args)]
    assert shown > 100, "the command lines of the docs were not found"
    assert not wrong, "\n".join(wrong)


def _console_blocks() -> Iterator[tuple[str, str, str]]:
    for doc in DOCS:
        for block in re.findall(r"```console\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.DOTALL):
            first, _, output = block.partition("\n")
            if first.startswith("$ gpuscale "):
                yield f"{doc.relative_to(ROOT)}: {first}", first.removeprefix("$ gpuscale "), output


@pytest.mark.parametrize(("where", "args", "shown"), list(_console_blocks()), ids=lambda v: str(v)[:60])
def test_console_blocks_show_the_commands_current_output(where: str, args: str, shown: str) -> None:
    result = CliRunner().invoke(main, shlex.split(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == shown.strip(), f"{where}: the output shown is stale; now:\n{result.stdout}"


def test_relative_links_resolve() -> None:
    broken = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                local = not target.startswith(("http:", "https:", "#", "mailto:"))
                if local and not (doc.parent / target.split("#", 1)[0]).exists():
                    broken.append(f"{doc.relative_to(ROOT)}:{n}: {target}")
    assert not broken, broken


def _importlinter_layers() -> list[set[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    lines = cfg["importlinter:contract:layers"]["layers"].split("\n")
    return [{m.strip() for m in line.split("|")} for line in lines if line.strip()]


def _documented_layers() -> list[set[str]]:
    """The layers of architecture.md's first code block: a line indented 3 spaces starts a layer (the leaf modules'
    line, a list with commas, does not); the names on the adapters line and its continuations form one layer."""
    block = ARCH.read_text(encoding="utf-8").split("```", 2)[1]
    layers: list[set[str]] = []
    in_group = False
    for line in block.splitlines():
        names = re.findall(r"\bgpuscale\.\w+", line)
        if re.match(r"   \S", line):
            in_group = line.strip().startswith("adapters")
            if in_group:
                layers.append(set(names))
            elif names and not re.match(r"\s*gpuscale\.\w+,", line):
                layers.append({names[0]})
        elif in_group and names:
            layers[-1] |= set(names)
    return layers


def test_architecture_layer_list_is_the_importlinter_one() -> None:
    assert _documented_layers() == _importlinter_layers()


def _module_table() -> list[str]:
    table = ARCH.read_text(encoding="utf-8").split("## Where things are", 1)[1]
    return [row.split("|")[2] for row in table.splitlines()[2:] if row.startswith("|")]


def test_architecture_module_table_names_existing_files_and_every_package() -> None:
    cells = " ".join(_module_table())
    spans = re.findall(r"`([^`]+)`", cells)
    missing = []
    for span in spans:
        bases = (SRC, ROOT, SRC / "providers", SRC / "kube")
        if re.fullmatch(r"[\w/]+(\.py)?/?", span) and "/" in span and not any((b / span).exists() for b in bases):
            missing.append(span)
        if re.fullmatch(r"\w+\.py", span) and not any(SRC.rglob(span)):
            missing.append(span)
    assert not missing, f"named in docs/architecture.md but not in the tree: {missing}"
    packages = {p.parent.relative_to(SRC).as_posix() for p in SRC.rglob("__init__.py")} - {"."}
    unnamed = {p for p in packages if f"{p}/" not in cells and f"{p}/" not in " ".join(spans)}
    assert not unnamed, f"packages the module table does not name: {sorted(unnamed)}"


def test_install_extras_table_lists_each_extras_packages() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = {"(none)": project["dependencies"], **project["optional-dependencies"]}
    table = (ROOT / "docs" / "install.md").read_text(encoding="utf-8").split("## Extras", 1)[1].split("\n## ", 1)[0]
    documented = {}
    for row in table.splitlines()[4:]:
        if row.startswith("|"):
            extra, packages = (c.strip().strip("`") for c in row.split("|")[1:3])
            documented[extra] = packages
    assert set(documented) == set(wanted), "docs/install.md's extras are not pyproject.toml's"
    for extra, requirements in wanted.items():
        if extra != "dev":
            names = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}
            shown = {n.strip().lower() for n in documented[extra].split(",")}
            assert shown == names, f"docs/install.md, extra {extra}: {sorted(shown)}, pyproject.toml: {sorted(names)}"


SIMULATOR = ROOT / "docs" / "simulator.md"
COMPARED = ("cloud", "cluster", "pdbs", "seed", "description", "policy")
"""The Scenario fields a documented default may affect."""
BASE_SCENARIO = {
    "name": "defaults",
    "catalog": "linode",
    "pools": [{"name": "gpu"}],
    "workload": {"source": "burst", "count": 1, "shape": {"cpu": 1, "memory": "1Gi", "gpus": 1}, "runtime": "1m"},
}


def _documented_defaults(table: str) -> Iterator[tuple[str, object]]:
    """(key, value) of each row of ``table`` in simulator.md whose default is a YAML value or a lognormal."""
    body = SIMULATOR.read_text(encoding="utf-8").split(f"<!-- {table}:begin", 1)[1].split(f"<!-- {table}:end", 1)[0]
    for row in body.splitlines()[3:]:
        key, default = (c.strip() for c in row.split("|")[1:3])
        lognormal = re.fullmatch(r"lognormal, median (\S+), sigma (\S+)", default)
        if lognormal:
            yield key.strip("`"), {"distribution": "lognormal", "median": lognormal[1], "sigma": float(lognormal[2])}
        elif re.fullmatch(r"`[^`]+`", default):
            yield key.strip("`"), yaml.safe_load(default.strip("`"))


@pytest.mark.parametrize(("table", "section"), [("cloud-keys", ("cloud",)), ("fault-keys", ("cloud", "faults")),
                                                ("cluster-keys", ("cluster",)), ("scenario-keys", ())])  # fmt: skip
def test_documented_scenario_defaults_are_the_readers_defaults(table: str, section: tuple[str, ...]) -> None:
    """Writing a key with its documented default gives the same scenario as leaving it out."""
    base = parse_scenario(yaml.safe_dump(BASE_SCENARIO))
    defaults = list(_documented_defaults(table))
    assert defaults, f"{table}: no documented defaults found"
    for key, value in defaults:
        doc = yaml.safe_load(yaml.safe_dump(BASE_SCENARIO))
        target = doc
        for part in section:
            target = target.setdefault(part, {})
        target[key] = value
        got = parse_scenario(yaml.safe_dump(doc))
        wrong = [f for f in COMPARED if getattr(got, f) != getattr(base, f)]
        assert not wrong, f"docs/simulator.md {table}: {key}: {value!r} is not the default (changes {wrong})"


def _shipped_scenarios() -> dict[str, Path]:
    """Shipped scenario files by their ``name``."""
    out: dict[str, Path] = {}
    for folder in (ROOT / "benchmarks" / "scenarios", SRC / "examples"):
        for path in sorted(folder.glob("*.yaml")):
            doc = next(yaml.safe_load_all(path.read_text(encoding="utf-8")), None)
            if isinstance(doc, dict) and isinstance(doc.get("name"), str) and "workload" in doc:
                out.setdefault(doc["name"], path)
    return out


def test_scenarios_shown_in_the_docs_are_the_shipped_files_or_parse() -> None:
    """A scenario block named like a shipped scenario is that file; any other scenario block is a valid scenario."""
    shipped = _shipped_scenarios()
    checked = 0
    for doc in DOCS:
        for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.DOTALL):
            data = yaml.safe_load(block)
            if not (isinstance(data, dict) and "workload" in data and "pools" in data):
                continue
            checked += 1
            if data.get("name") in shipped:
                path = shipped[data["name"]]
                assert data == yaml.safe_load(path.read_text(encoding="utf-8")), f"{doc.name}: stale copy of {path}"
            else:
                parse_scenario(block, source=f"{doc.name} scenario {data.get('name')}")
    assert checked >= 3


@pytest.mark.parametrize(
    ("doc", "module", "config"), [("gcp.md", "gpuscale.providers.gcp", "GcpConfig"),
                                  ("alibaba.md", "gpuscale.providers.alibaba", "AlibabaConfig")],
)  # fmt: skip
def test_provider_config_defaults_shown_are_the_dataclass_defaults(doc: str, module: str, config: str) -> None:
    """Each "`field` (default" of a provider page's configuration is that field's default in the config class."""
    cls = getattr(pytest.importorskip(module), config)
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    text = (ROOT / "docs" / "providers" / doc).read_text(encoding="utf-8")
    shown = {k: v for k, v in re.findall(r"`(\w+)`\s+\(`?([\w.]+)`?[,)]", text) if k in defaults}
    assert shown, f"{doc}: no configuration defaults found"
    for name, value in shown.items():
        assert str(defaults[name]) in {value, f"{value}.0"}, f"docs/providers/{doc}: {name} is {defaults[name]}"


def test_benchmark_command_lines_use_existing_scripts_and_flags() -> None:
    """``benchmarks/NAME.py ARGS`` shown anywhere: the script exists and defines every ``--flag`` shown."""
    wrong, shown = [], 0
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for script, args in re.findall(r"benchmarks/(\w+\.py)((?:\s+[^\s`#|)]+)*)", line):
                path = ROOT / "benchmarks" / script
                shown += 1
                if not path.is_file():
                    wrong.append(f"{doc.name}:{n}: no {script}")
                    continue
                source = path.read_text(encoding="utf-8")
                for sibling in re.findall(r"^(?:from|import) (\w+)", source, flags=re.MULTILINE):
                    if (ROOT / "benchmarks" / f"{sibling}.py").is_file():  # flags it imports (add_option_args)
                        source += (ROOT / "benchmarks" / f"{sibling}.py").read_text(encoding="utf-8")
                flags = re.findall(r"(?<![\w-])--[a-z][\w-]*", args)
                wrong += [f"{doc.name}:{n}: {script} has no {f}" for f in flags if f'"{f}"' not in source]
    assert shown > 10
    assert not wrong, wrong


def test_controller_md_names_the_static_block_reasons_and_gate_verdicts() -> None:
    """The reasons of pods never planned again (``STATIC_BLOCKS``) and the scale-up gate's verdicts (``Gate``)."""
    from gpuscale.core.reconcile.scaleup import STATIC_BLOCKS, Gate

    text = " ".join((ROOT / "docs" / "controller.md").read_text(encoding="utf-8").split())
    blocked = text.split("Some pods are blocked for a reason no cluster change can lift:", 1)[1].split(".", 1)[0]
    assert set(re.findall(r"`(\w+)`", blocked)) == {r.value for r in STATIC_BLOCKS}
    verdicts = text.split("`gate_scale_up` (", 1)[1].split("(the rules above)", 1)[0].split("→", 1)[1]
    assert set(re.findall(r"\w+", verdicts)) - {"or"} == {g.value for g in Gate}


def test_gpr_spec_table_lists_the_schema_fields_and_their_defaults() -> None:
    """docs/gpr.md's Spec table: the fields of ``SPEC_SCHEMA`` (bar the EGS ones only accepted), and writing a field's
    documented default gives the same spec as leaving it out."""
    from gpuscale.core.gpr.schema import SPEC_SCHEMA
    from gpuscale.core.gpr.spec import spec_from_dict

    section = (ROOT / "docs" / "gpr.md").read_text(encoding="utf-8").split("## Spec\n", 1)[1].strip().splitlines()
    table = section[: next(i for i, line in enumerate(section) if not line.startswith("|"))]
    rows = [[c.strip() for c in row.split("|")[1:-1]] for row in table[2:]]
    assert {r[0].strip("`") for r in rows} == {f.name for f in SPEC_SCHEMA if not f.rest_only}
    base = {"requestName": "r", "exitDuration": "1h", "gpuShape": "RTX4000-Ada"}
    checked = 0
    for field, _, default, _ in rows:
        if re.fullmatch(r"`[^`]*`", default) and field.strip("`") not in base:
            value = yaml.safe_load(default.strip("`"))
            with_default = spec_from_dict({**base, field.strip("`"): "" if value is None else value})
            assert with_default == spec_from_dict(base), f"docs/gpr.md: {field} defaults to {default}?"
            checked += 1
    assert checked >= 8


def test_architecture_lists_every_command_of_the_cli() -> None:
    block = ARCH.read_text(encoding="utf-8").split("```", 2)[1]
    listed = " ".join(block.split("entry points:", 1)[1].split("(most loaded lazily)", 1)[0].split())
    assert {c.strip() for c in listed.split(",")} == set(main.list_commands(click.Context(main)))


def test_repository_paths_named_in_the_docs_exist() -> None:
    """Every backticked path under a top-level folder of the repository (``tests/x.py``, ``deploy/...``) or a package
    of ``src/gpuscale`` (``controller/loop.py``)."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"docs"}
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}  # controller/loop.py and the like
    missing, named = [], 0
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for span in re.findall(r"`([\w.-]+/[\w./-]*)(?:::\w+)?`", line):
                top = span.split("/", 1)[0]
                base = ROOT if top in tops else SRC if top in packages else None
                if base is not None:
                    named += 1
                    if not (base / span).exists():
                        missing.append(f"{doc.relative_to(ROOT)}:{n}: {span}")
    assert named > 50
    assert not missing, missing


def _resolves(dotted: str) -> bool:
    """``gpuscale.pkg.module.Name.attr`` names a module and then attributes (or dataclass fields) of it."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if name in fields:
                return True
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_dotted_gpuscale_names_in_the_docs_resolve() -> None:
    wrong, named = [], 0
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for dotted in re.findall(r"`(gpuscale(?:\.\w+)+)(?:\(\))?`", line):
                top = dotted.split(".")[1]
                if not ((SRC / top).is_dir() or (SRC / f"{top}.py").is_file()):
                    continue  # not a module path (a tag such as gpuscale.ledger.0)
                named += 1
                if not _resolves(dotted):
                    wrong.append(f"{doc.relative_to(ROOT)}:{n}: {dotted}")
    assert named > 50
    assert not wrong, wrong
