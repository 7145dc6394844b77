"""Fuzz every file-reading command with hostile inputs, in-process, through the real ``gpuscale`` CLI.

Hypothesis drives a mutation fuzzer (seeded: ``derandomize=True``, a fixed number of examples): it takes a real
example file and replaces a random value with a hostile one, renames, deletes or duplicates a key, truncates the file,
inserts binary garbage, or substitutes a whole hostile file (YAML bombs, recursive aliases, deep nesting, odd
encodings). For each input: exit code 0 or 2, nothing but SystemExit escapes, no traceback, stderr bounded, time
bounded; the process's peak memory is checked after each command's run.
"""

from __future__ import annotations

import functools
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscale.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_PER_COMMAND = 500
MAX_STDERR = 8 * 1024
MAX_SECONDS = 5.0
MAX_RSS_GROWTH_MB = 400


def example(name: str) -> Path:
    """A shipped example file, wherever this checkout keeps it."""
    for folder in (ROOT / "src" / "gpuscale" / "examples", ROOT / "examples"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(name)


def _tiny_scenario() -> str:
    """demo.yaml shrunk to a couple of simulated hours, so that a valid mutant simulates in milliseconds."""
    text = example("demo.yaml").read_text()
    for old, new in (
        ("duration: 1d", "duration: 2h"), ("peakPerHour: 30", "peakPerHour: 3"),
        ("troughPerHour: 2", "troughPerHour: 1"), ("count: 24", "count: 3"), ("at: 10h", "at: 10m"),
        ("sizes: [2, 4]", "sizes: [2]"),
    ):  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    return text


def _tiny_gpr_scenario() -> str:
    text = example("gpr-scenario.yaml").read_text()
    for old, new in (("duration: 7d", "duration: 6h"), ("until: 6d12h", "until: 4h")):
        assert old in text, old
        text = text.replace(old, new)
    return text


BIG_INT = "9" * 6000
WRONG_TYPES = ["[burst]", "{a: 1}", "null", "true", '""', "[]", "{}", "x", "-1", "1.5", "[1, [2]]", "0"]
HOSTILE_VALUES = [
    *WRONG_TYPES,
    "9999999999Ei", "1e30", "-1e30", '"1e400"', "1e400", ".nan", ".inf", "-.inf", BIG_INT, f'"{BIG_INT}"', "-1", "0",
    "1.5", "2147483648", "18446744073709551616", "0x7fffffffffffffffffff", "1:30:00", '"٣"', "٣", '"３"', "1e-30",
    "99999999999d", '"99999999999d"', '"1h" ', '"-5m"', "[burst]", "{a: 1}", "[]", "{}", "true", "false", "null", "~",
    '""', '" "', '"\\0"', '"a\\x00b"', '"\\u202eevil"', '"\\u200b"', '"\\ud800"', '"\\U0001F600"', "'x' ",
    "x" * 100_000, '"' + "y" * 3000 + '"', "[" * 300 + "]" * 300, "&r [*r]", "*undefined", "!!binary AAAA",
    "!!python/object/apply:os.system [echo]", "2024-02-30", "2024-01-01T25:00:00Z", "!!float nan", "!!int 1e3",
    "[1, [2, [3, {a: [4]}]]]", "{cpu: 1e30}", "- - - x", "? [a]\n: b", "0o777", "+.5", "1_000_000", "9" * 40 + "Gi",
    "1" * 18 + "E", "1E+99", "gpuscale", "default", "WhenEmpty", "lognormal", "RTX4000-Ada", "linode", "\t",
]  # fmt: skip
HOSTILE_KEYS = ["numberOfGpus", "Name", "nam\u0435", "x" * 5000, "1", "null", "true", "[a]", "spec ", "ratePerhour"]


def _bomb(levels: int, width: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


WHOLE_FILES: list[bytes] = [
    _bomb(9).encode(), _bomb(10).encode(), ("kind: Pod\n" + _bomb(8)).encode(),
    b"a: &a [*a]\n", b"a: &a {b: *a}\n", b"&a [*a, *a]", b"[" * 20_000 + b"]" * 20_000, b"[" * 300_000,
    b"{a: " * 5000 + b"1" + b"}" * 5000, ("- " * 5000 + "x").encode(), b"", b"\n\n", b"---\n---\n", b"~",
    b"\x00\x01\x02\x03", b"\xff\xfe\xfd", "\ufeffname: x\n".encode(), "name: caf\u00e9\n".encode("latin-1"),
    b"\xef\xbb\xbf" * 3, b"a: b\n" * 50_000, b"- x\n" * 50_000, b"%YAML 9.9\n--- x", b"!!python/name:os.system",
    b"key: 'unterminated", b"a:\n\tb: 1", b"items: [" + b"{kind: Pod}, " * 2000 + b"]",
    b"apiVersion: v1\nkind: List\nitems: " + b"[" * 250 + b"]" * 250, ("x" * 2_000_000).encode(),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: " + "p" * 2_000_000 + "}\n").encode(),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n---\n" * 3000).encode(),
]  # fmt: skip


@functools.cache
def _spans(text: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(value spans, key spans) of every node of ``text``, as character offsets."""
    values: list[tuple[int, int]] = []
    keys: list[tuple[int, int]] = []
    todo = [n for n in yaml.compose_all(text, Loader=yaml.CSafeLoader) if n is not None]
    while todo:
        node = todo.pop()
        values.append((node.start_mark.index, node.end_mark.index))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                keys.append((k.start_mark.index, k.end_mark.index))
                todo.append(v)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
    return values, keys


@functools.cache
def _leaves(text: str) -> list[tuple[int, int]]:
    """Spans of the single-line values of ``text`` (scalars and flow collections), in file order."""
    return sorted((a, b) for a, b in _spans(text)[0] if "\n" not in text[a:b] and b > a)


@st.composite
def hostile_inputs(draw: st.DrawFn, base: str) -> bytes:
    """One hostile file derived from ``base`` (or a whole hostile file)."""
    values, keys = _spans(base)
    leaves = _leaves(base)
    op = draw(st.sampled_from(["leaf", "leaf", "leaf", "value", "key", "delete", "dup", "cut", "bytes", "whole"]))
    text = base
    for _ in range(draw(st.integers(1, 2)) if op != "whole" else 1):
        if op == "leaf":  # a scalar or flow value: a wrong type half of the time
            start, end = draw(st.sampled_from(leaves))
            pool = draw(st.sampled_from([WRONG_TYPES, HOSTILE_VALUES]))
            text = base[:start] + draw(st.sampled_from(pool)) + base[end:]
        elif op == "value":
            start, end = draw(st.sampled_from(values))
            if "\n" in base[start:end]:  # a block collection: keep the line structure after it
                end = base.rfind("\n", start, end)
            text = base[:start] + draw(st.sampled_from(HOSTILE_VALUES)) + base[end:]
        elif op == "key":
            start, end = draw(st.sampled_from(keys))
            text = base[:start] + draw(st.sampled_from(HOSTILE_KEYS)) + base[end:]
        elif op == "delete":
            start, _ = draw(st.sampled_from(keys))
            line_start = base.rfind("\n", 0, start) + 1
            line_end = base.find("\n", start)
            text = base[:line_start] + base[line_end + 1 if line_end >= 0 else len(base) :]
        elif op == "dup":
            start, _ = draw(st.sampled_from(keys))
            line_start = base.rfind("\n", 0, start) + 1
            line_end = base.find("\n", start) + 1 or len(base)
            text = base[:line_end] + base[line_start:line_end] + base[line_end:]
        elif op == "cut":
            text = base[: draw(st.integers(0, len(base)))]
        elif op == "bytes":
            data = base.encode()
            at = draw(st.integers(0, len(data)))
            return data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:]
        else:
            return draw(st.sampled_from(WHOLE_FILES))
        base = text
    return text.encode("utf-8", "surrogatepass")


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES_PER_COMMAND,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _max_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def _fuzz(command: str, base: str, args: Callable[[str], list[str]], suffix: str = ".yaml") -> Counter[str]:
    """Run ``command`` on hostile variants of ``base``; return outcome counts (``tried``, ``exit 0``, ``exit 2``)."""
    runner = CliRunner()
    counts: Counter[str] = Counter()
    rss0 = _max_rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"input{suffix}"

        @FUZZ_SETTINGS
        @given(data=hostile_inputs(base))
        def run(data: bytes) -> None:
            path.write_bytes(data)
            t0 = time.perf_counter()
            result = runner.invoke(main, args(str(path)))
            elapsed = time.perf_counter() - t0
            shown = data[:120]
            exc = result.exception
            assert exc is None or isinstance(exc, SystemExit), f"{command} raised {exc!r} on {shown!r}"
            assert result.exit_code in (0, 2), f"{command} exit {result.exit_code} on {shown!r}: {result.stderr[:500]}"
            assert "Traceback" not in result.output, f"{command} printed a traceback on {shown!r}"
            assert len(result.stderr) < MAX_STDERR, f"{command}: {len(result.stderr)} chars of stderr on {shown!r}"
            assert elapsed < MAX_SECONDS, f"{command} took {elapsed:.1f}s on {shown!r}"
            if result.exit_code == 2:
                assert result.stderr.strip(), f"{command} exit 2 without a message on {shown!r}"
            counts["tried"] += 1
            counts[f"exit {result.exit_code}"] += 1

        run()
    growth = _max_rss_mb() - rss0
    assert growth < MAX_RSS_GROWTH_MB, f"{command}: peak memory grew by {growth:.0f} MB"
    assert counts["tried"] >= EXAMPLES_PER_COMMAND, counts
    print(f"\nfuzz {command}: {dict(counts)}")
    return counts


def _sweep(command: str, base: str, args: Callable[[str], list[str]], every_type: bool) -> Counter[str]:
    """Put a wrong type at every single-line value of ``base`` (each of :data:`WRONG_TYPES`, or one per value)."""
    runner = CliRunner()
    counts: Counter[str] = Counter()
    leaves = _leaves(base)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.yaml"
        for i, (start, end) in enumerate(leaves):
            for value in WRONG_TYPES if every_type else [WRONG_TYPES[i % len(WRONG_TYPES)]]:
                text = base[:start] + value + base[end:]
                path.write_text(text)
                result = runner.invoke(main, args(str(path)))
                what = f"{command}: {base[start:end]!r} -> {value!r} at offset {start}"
                exc = result.exception
                assert exc is None or isinstance(exc, SystemExit), f"{what} raised {exc!r}"
                assert result.exit_code in (0, 2), f"{what}: exit {result.exit_code}: {result.stderr[:500]}"
                assert "Traceback" not in result.output, what
                assert len(result.stderr) < MAX_STDERR, what
                counts["tried"] += 1
                counts[f"exit {result.exit_code}"] += 1
    print(f"\nsweep {command}: {dict(counts)}")
    return counts


@pytest.mark.parametrize(
    ("command", "every_type"),
    [("plan", False), ("simulate", True), ("simulate-gpr", True), ("catalog", True), ("scaler", True)],
)
def test_a_wrong_type_at_every_field(command: str, every_type: bool) -> None:
    snapshot = str(example("snapshot.yaml"))
    base, args = {
        "plan": (example("snapshot.yaml").read_text(), lambda p: ["plan", "--no-solver", p]),
        "simulate": (_tiny_scenario(), lambda p: ["simulate", p]),
        "simulate-gpr": (_tiny_gpr_scenario(), lambda p: ["simulate-gpr", p]),
        "catalog": (example("catalog-custom.yaml").read_text(), lambda p: ["plan", "--catalog", p, snapshot]),
        "scaler": (
            example("scaler.yaml").read_text(),
            lambda p: ["scaler", "replay", p, str(example("scaler-history.yaml"))],
        ),
    }[command]
    counts = _sweep(command, base, args, every_type)
    assert counts["exit 2"] > counts["exit 0"]


def test_fuzz_plan() -> None:
    counts = _fuzz("plan", example("snapshot.yaml").read_text(), lambda p: ["plan", "--no-solver", p])
    assert counts["exit 0"] > 0 and counts["exit 2"] > counts["exit 0"]


def test_fuzz_explain() -> None:
    counts = _fuzz("explain", example("snapshot.yaml").read_text(), lambda p: ["explain", p, "ml/train-8gpu"])
    assert counts["exit 2"] > 0


def test_fuzz_simulate() -> None:
    counts = _fuzz("simulate", _tiny_scenario(), lambda p: ["simulate", p])
    assert counts["exit 0"] > 0 and counts["exit 2"] > counts["exit 0"]


def test_fuzz_compare() -> None:
    counts = _fuzz("compare", _tiny_scenario(), lambda p: ["compare", p])
    assert counts["exit 2"] > 0


def test_fuzz_simulate_gpr() -> None:
    counts = _fuzz("simulate-gpr", _tiny_gpr_scenario(), lambda p: ["simulate-gpr", p])
    assert counts["exit 0"] > 0 and counts["exit 2"] > counts["exit 0"]


def test_fuzz_custom_catalog() -> None:
    """Catalog files are read by every command that takes ``--catalog``: fuzz them through ``plan``."""
    snapshot = example("snapshot.yaml")
    base = example("catalog-custom.yaml").read_text()
    counts = _fuzz("plan --catalog", base, lambda p: ["plan", "--no-solver", "--catalog", p, str(snapshot)])
    assert counts["exit 2"] > 0


@pytest.mark.parametrize("name", ["demo.yaml", "gpr-scenario.yaml", "snapshot.yaml", "catalog-custom.yaml"])
def test_the_base_files_are_valid(name: str) -> None:
    """The fuzzer's bases must parse: mutations of a file that fails anyway would test little."""
    assert _spans(example(name).read_text())[0]


def test_fuzz_scaler_replay() -> None:
    """Both files of ``scaler replay``: hostile scalers against the shipped history, hostile histories."""
    scaler, history = str(example("scaler.yaml")), str(example("scaler-history.yaml"))
    counts = _fuzz("scaler replay", example("scaler.yaml").read_text(), lambda p: ["scaler", "replay", p, history])
    assert counts["exit 0"] > 0 and counts["exit 2"] > counts["exit 0"]
    base = example("scaler-history.yaml").read_text()
    counts = _fuzz("scaler replay (history)", base, lambda p: ["scaler", "replay", "--json", scaler, p])
    assert counts["exit 0"] > 0 and counts["exit 2"] > 0


def test_fuzz_rightsize() -> None:
    counts = _fuzz("rightsize", example("usage.yaml").read_text(), lambda p: ["rightsize", "--json", p])
    assert counts["exit 0"] > 0 and counts["exit 2"] > 0


def test_fuzz_scaler_arbitrate() -> None:
    scalers = [str(example("scaler.yaml")), str(example("gpubudget-scalers.yaml"))]
    base = example("gpubudget.yaml").read_text()
    counts = _fuzz(
        "scaler arbitrate", base, lambda p: ["scaler", "arbitrate", p, *scalers, "--desired", "mistral-7b=6"]
    )
    assert counts["exit 0"] > 0 and counts["exit 2"] > 0
