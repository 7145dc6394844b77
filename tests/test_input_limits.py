"""The one input loader (:mod:`gpuscale.inputs`), bounded numbers and short echoes.

Each class of hostile input reported in issue 10 ("YAML bombs and huge values") has a regression test here that runs
the real command and expects exit 2 with one clear line, quickly and within a small memory budget.
"""

from __future__ import annotations

import time
import tracemalloc
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuscale.catalogs.custom import parse as parse_catalog
from gpuscale.cli import main
from gpuscale.errors import InputError, short_repr
from gpuscale.inputs import (
    DEFAULT_MAX_YAML_DEPTH,
    GuardedLoader,
    Limits,
    compose_documents,
    load_yaml_file,
    load_yaml_text,
    read_text,
)
from gpuscale.manifests.problems import MAX_SHOWN, ManifestError
from gpuscale.manifests.quantity import cpu_milli, memory_mib, parse_duration, parse_quantity, whole_count

ROOT = Path(__file__).resolve().parents[1]


def example(name: str) -> Path:
    for folder in (ROOT / "src" / "gpuscale" / "examples", ROOT / "examples"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(name)


def bomb(levels: int) -> str:
    """Nested anchors: each level aliases the previous one nine times (9**levels leaves when expanded)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


POD = """apiVersion: v1
kind: Pod
metadata: {name: p, namespace: default}
spec:
  containers:
    - name: c
      resources:
        requests: {REQUESTS}
"""


def run(tmp_path: Path, args: list[str], text: str | bytes, name: str = "input.yaml") -> tuple[Result, float, int]:
    """Run the CLI on a file holding ``text``; return the result, seconds taken and peak traced memory (bytes)."""
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    runner = CliRunner()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        result = runner.invoke(main, [a.replace("FILE", str(path)) for a in args])
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, elapsed, peak


def assert_refused(result: Result, *fragments: str) -> str:
    """Exit 2, no traceback, one short error line on stderr holding every fragment (notes may precede it)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith(("note:", "warning:"))]
    assert len(lines) == 1, result.stderr
    err = lines[0]
    assert len(err) < 600, err
    for fragment in fragments:
        assert fragment in err, err
    return err


# -------------------------------------------------------------------------------------------- YAML structure
@pytest.mark.parametrize("levels", [9, 10, 30])
def test_a_billion_laughs_snapshot_is_refused_at_once(tmp_path: Path, levels: int) -> None:
    text = bomb(levels)
    assert len(text) < 1000 + 50 * levels
    _, _, baseline = run(tmp_path, ["plan", "FILE"], "kind: Pod\n")  # the catalog and the command themselves
    result, elapsed, peak = run(tmp_path, ["plan", "FILE"], text)
    assert_refused(result, "aliases expand to more than 100,000 nodes", "GPUSCALE_MAX_YAML_NODES", "input.yaml:")
    assert elapsed < 2.0
    assert peak < baseline + 5 * 2**20
    tracemalloc.start()
    with pytest.raises(InputError, match="aliases expand"):
        load_yaml_text(text, source="bomb.yaml")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * 2**20


def test_a_billion_laughs_scenario_is_refused(tmp_path: Path) -> None:
    text = bomb(9) + "name: x\n"
    for command in ("simulate", "compare", "simulate-gpr"):
        result, elapsed, _ = run(tmp_path, [command, "FILE"], text)
        assert_refused(result, "aliases expand to more than")
        assert elapsed < 2.0


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {b: *a}\n", "&x [1, *x]\n"])
def test_a_recursive_alias_is_refused(tmp_path: Path, text: str) -> None:
    for command in ("plan", "simulate", "simulate-gpr"):
        result, _, _ = run(tmp_path, [command, "FILE"], text)
        assert_refused(result, "recursive alias")


@pytest.mark.parametrize("text", ["[" * 20_000 + "]" * 20_000, "[" * 300_000, "- " * 5000 + "x", "{a: " * 3000])
def test_deep_nesting_is_refused_without_recursion_error(tmp_path: Path, text: str) -> None:
    for command in ("plan", "simulate", "simulate-gpr"):
        result, elapsed, _ = run(tmp_path, [command, "FILE"], text)
        assert_refused(result, f"nesting deeper than {DEFAULT_MAX_YAML_DEPTH} levels", "GPUSCALE_MAX_YAML_DEPTH")
        assert elapsed < 2.0


def test_an_alias_deepening_a_structure_counts_towards_the_depth() -> None:
    deep = "[" * 150 + "1" + "]" * 150
    text = f"a: &a {deep}\nb: " + "[" * 60 + "*a" + "]" * 60 + "\n"
    with pytest.raises(InputError, match="aliases nest deeper than 200 levels"):
        load_yaml_text(text, source="f.yaml")


def test_each_limit_can_be_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    deep = "[" * 300 + "]" * 300
    with pytest.raises(InputError, match="nesting deeper"):
        load_yaml_text(deep, source="f.yaml")
    monkeypatch.setenv("GPUSCALE_MAX_YAML_DEPTH", "400")
    assert load_yaml_text(deep, source="f.yaml")[0] is not None
    with pytest.raises(InputError, match="aliases expand"):
        load_yaml_text(bomb(7), source="f.yaml")  # 9**6 + ... nodes
    monkeypatch.setenv("GPUSCALE_MAX_YAML_NODES", "10000000")
    assert load_yaml_text(bomb(7), source="f.yaml")[0]["a6"][0][0][0][0][0][0][0] == "lol"


def test_a_malformed_limit_setting_is_an_input_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUSCALE_MAX_INPUT_BYTES", "٣٣")
    result, _, _ = run(tmp_path, ["plan", "FILE"], "a: 1\n")
    assert_refused(result, "GPUSCALE_MAX_INPUT_BYTES", "positive whole number")


def test_a_file_beyond_the_size_limit_is_refused_before_it_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUSCALE_MAX_INPUT_BYTES", "1000")
    for command in ("plan", "simulate", "simulate-gpr"):
        result, _, _ = run(tmp_path, [command, "FILE"], "# " + "x" * 2000 + "\n")
        assert_refused(result, "larger than the limit of 1,000 bytes", "GPUSCALE_MAX_INPUT_BYTES")
    assert read_text(tmp_path / "input.yaml", limits=Limits(max_bytes=10_000)).startswith("# x")


def test_duplicate_keys_stay_refused() -> None:
    with pytest.raises(InputError, match="duplicate key 'a'"):
        load_yaml_text("a: 1\nb: 2\na: 3\n", source="f.yaml")


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(InputError, match=r"bad\.yaml:2: .*not UTF-8"):
        load_yaml_file(path)


def test_load_yaml_file_reads_one_document(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("a: [1, 2]\nb: {c: x}\n")
    assert load_yaml_file(path) == {"a": [1, 2], "b": {"c": "x"}}
    path.write_text("a: 1\n---\nb: 2\n")
    with pytest.raises(InputError, match="more than one YAML document"):
        load_yaml_file(path, source="request body")
    with pytest.raises(InputError, match="not found"):
        load_yaml_file(tmp_path / "missing.yaml")


def test_the_composer_matches_libyaml_on_the_examples() -> None:
    import yaml

    def shape(node: yaml.Node) -> object:
        if isinstance(node, yaml.ScalarNode):
            return (node.tag, node.value, node.start_mark.line)
        if isinstance(node, yaml.SequenceNode):
            return (node.tag, [shape(n) for n in node.value])
        return (node.tag, [(shape(k), shape(v)) for k, v in node.value])

    for name in ("snapshot.yaml", "demo.yaml", "gpr-scenario.yaml", "catalog-custom.yaml"):
        text = example(name).read_text()
        loader = GuardedLoader(text)
        mine = [shape(n) for n in compose_documents(loader, source=name) if n is not None]
        loader.dispose()
        ref = [shape(n) for n in yaml.compose_all(text, Loader=yaml.SafeLoader) if n is not None]
        assert mine == ref, name


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("9" * 6000, "integer of 6,000 characters"),
        ("2024-02-30", "not a valid timestamp"),
        ('"a\\0b"', "NUL character"),
        ('"\\ud800"', "escape"),
    ],
)
def test_scalars_python_cannot_hold_are_yaml_errors(value: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        load_yaml_text(f"x: 1\ny: {value}\n", source="f.yaml")


# ---------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize(
    ("requests", "fragment"),
    [
        ("{memory: 9999999999Ei}", "too large"),
        ("{cpu: 1e30}", "too large"),
        ('{cpu: "1e31"}', "exponent out of range"),
        ('{cpu: "1e30"}', "too large"),
        ("{cpu: 2000000000}", "cpu request adds up to more than 1,000,000,000"),
        ("{cpu: .inf}", "not a finite quantity"),
        ("{cpu: .nan}", "not a finite quantity"),
        ('{cpu: "٣"}', "not a valid quantity"),
        ('{memory: "١Gi"}', "not a valid quantity"),
        ("{nvidia.com/gpu: 10000000000}", "more than 1,000,000,000"),
        ("{cpu: " + "9" * 6000 + "}", "integer of 6,000 characters"),
        ('{cpu: "' + "9" * 6000 + '"}', "longer than 40 characters"),
    ],
)
def test_huge_and_foreign_numbers_are_field_errors(tmp_path: Path, requests: str, fragment: str) -> None:
    result, _, _ = run(tmp_path, ["plan", "FILE"], POD.replace("{REQUESTS}", requests))
    assert_refused(result, fragment, "input.yaml:")


def test_quantity_and_duration_parsers_take_ascii_digits_only() -> None:
    assert parse_quantity("3") == 3 and cpu_milli("500m") == 500 and memory_mib("1Gi") == 1024
    for text in ("٣", "３", "٣m", "1٣Gi", "1e٣"):
        with pytest.raises(ValueError):
            parse_quantity(text)
    for text in ("٣s", "1h٣m", "９m"):
        with pytest.raises(ValueError):
            parse_duration(text)
    assert parse_duration("1h30m") == 5400


def test_numbers_are_bounded_before_conversion() -> None:
    assert parse_quantity("1Ei") == Fraction(2**60)
    with pytest.raises(ValueError, match="too large"):
        parse_quantity("2Ei")
    with pytest.raises(ValueError, match="longer than 40"):
        parse_quantity("1" * 41)
    with pytest.raises(ValueError, match="more than"):
        whole_count(10**10)
    with pytest.raises(ValueError, match="10 years"):
        parse_duration("100000h")
    with pytest.raises(ValueError, match="longer than 40"):
        parse_duration("1h" * 30)


SCENARIO = """name: s
duration: 2h
catalog: linode
pools:
  - name: gpu
workload:
  - source: burst
    count: 2
    shape: {cpu: 1, memory: 1Gi, gpus: 1}
"""


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("source: burst", "source: [burst]", "input.yaml:7 workload[0].source: unknown or missing workload source"),
        ("count: 2", "count: true", "workload[0].count: must be an integer, not a boolean"),
        ("count: 2", "count: 99999999999", "workload[0].count: must be <= 1,000,000"),
        ("count: 2", "count: {a: 1}", "must be an integer, not a mapping"),
        ("duration: 2h", "duration: 99999999999d", "duration: "),
        ("duration: 2h", "duration: 1.0e+300", "from 0 to 10 years"),
        ("duration: 2h", 'duration: "٣h"', "duration: not a valid duration"),
        ("name: s", "name: {a: 1}", "name: must be a non-empty string, not a mapping"),
        ("name: s", "name: " + "n" * 5000, "name: must be at most 253 characters"),
        ("catalog: linode", "catalog: [linode]", "catalog: must be a non-empty string, not a list"),
        ("cpu: 1,", "cpu: [1],", "shape.cpu"),
        ("  - name: gpu", "  - name: gpu\n    maxNodes: 1e30", "maxNodes"),
        ("count: 2", "count: 2\n    runtime: {distribution: [lognormal]}", "unknown or missing distribution"),
    ],
)
def test_every_scenario_field_is_type_checked(tmp_path: Path, old: str, new: str, fragment: str) -> None:
    assert old in SCENARIO
    result, _, _ = run(tmp_path, ["simulate", "FILE"], SCENARIO.replace(old, new, 1))
    assert_refused(result, fragment)


def test_a_steady_source_of_billions_of_pods_is_refused(tmp_path: Path) -> None:
    text = SCENARIO.replace("source: burst\n    count: 2", "source: steady\n    ratePerHour: 100000000", 1)
    text = text.replace("shape: {", "duration: 3650d\n    shapes:\n      - {")
    result, _, _ = run(tmp_path, ["simulate", "FILE"], text)
    assert_refused(result, "would generate about", "lower the rate or the duration")


def test_a_gpr_scenario_of_billions_of_requests_is_refused(tmp_path: Path) -> None:
    text = example("gpr-scenario.yaml").read_text().replace("ratePerHour: 1.8", "ratePerHour: 900000000", 1)
    result, _, _ = run(tmp_path, ["simulate-gpr", "FILE"], text)
    assert_refused(result, "would generate about", "requests.ratePerHour")


def test_custom_catalog_numbers_are_ascii_and_bounded() -> None:
    base = example("catalog-custom.yaml").read_text()
    assert "memory: " in base and "vcpus: " in base
    import re

    memory = re.search(r"memory: (\S+)", base)
    vcpus = re.search(r"vcpus: (\S+)", base)
    assert memory is not None and vcpus is not None
    for old, new, fragment in (
        (memory.group(0), "memory: ٣Gi", "memory quantity"),
        (vcpus.group(0), "vcpus: 100000000000", "positive integer up to 1,000,000"),
        (vcpus.group(0), "vcpus: " + "9" * 6000, "integer of 6,000 characters"),
    ):
        with pytest.raises(InputError, match=fragment):
            parse_catalog(base.replace(old, new, 1), "cat.yaml")


# ------------------------------------------------------------------------------------------------ echoes
def test_a_huge_pod_name_is_not_echoed_whole(tmp_path: Path) -> None:
    text = "apiVersion: v1\nkind: Pod\nmetadata: {name: " + "p" * 2_000_000 + ", namespace: 1}\n"
    result, _, _ = run(tmp_path, ["plan", "FILE"], text)
    assert result.exit_code == 2
    assert len(result.stderr) < 2000, len(result.stderr)
    assert "chars)" in result.stderr


def test_short_repr_cuts_and_counts() -> None:
    assert short_repr("abc") == "'abc'"
    cut = short_repr("a" * 2_000_000)
    assert cut.endswith("… (2,000,000 chars)") and len(cut) < 100
    assert short_repr(list(range(10_000))) == "list of 10,000 items"
    assert len(str(InputError("bad", where="w" * 10_000, value="v" * 10_000, fix="f" * 10_000))) < 1600


def test_a_report_of_many_problems_shows_the_first_ones_and_a_count() -> None:
    err = ManifestError("s.yaml", [InputError(f"problem {i}", where=f"s.yaml:{i}") for i in range(250)])
    text = str(err)
    assert "250 problems in s.yaml" in text
    assert f"problem {MAX_SHOWN - 1}" in text and f"problem {MAX_SHOWN}\n" not in text
    assert text.rstrip().endswith(f"... and {250 - MAX_SHOWN} more")
    assert len(err.problems) == 250


def test_many_bad_pods_give_a_bounded_report(tmp_path: Path) -> None:
    doc = POD.replace("{REQUESTS}", "{cpu: -1}")
    text = "---\n".join(doc.replace("name: p,", f"name: p{i},") for i in range(500))
    result, _, _ = run(tmp_path, ["plan", "FILE"], text)
    assert result.exit_code == 2
    assert "500 problems" in result.stderr and "... and 490 more" in result.stderr
    assert len(result.stderr) < 8192
