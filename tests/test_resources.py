"""Shipped files (price catalogs, examples) found through importlib.resources, the data-directory overrides, the
missing-trace message, and ``gpuscale examples``."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuscale import resources
from gpuscale.catalogs import aws, linode, load_catalog
from gpuscale.cli import main
from gpuscale.errors import InputError
from gpuscale.resources import (
    DATA_DIR_ENV,
    EXAMPLES,
    UNSET_DATA_DIR,
    data_dir,
    example,
    missing_trace,
    prices_dir,
    shipped,
)
from gpuscale.sim.workloads import openb_arrivals, openb_file
from gpuscale.traces.openb import load_nodes, load_pods

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gpuscale"
SHARED_PRICES = ROOT.parent / "shared" / "data" / "prices"


@pytest.fixture
def no_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As in an installed wheel: no ``$GPUSCALE_DATA_DIR`` and no source checkout around the package."""
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(resources, "_REPO_ROOT", tmp_path / "site-packages")


def test_shipped_prices_are_the_package_copy_and_every_catalog_loads(no_data_dir: None) -> None:
    path = prices_dir()
    assert path == shipped("data", "prices") and path.resolve().is_relative_to(PACKAGE.resolve())
    for name in ("linode", "aws", "alibaba"):
        assert load_catalog(name).instance_types, name
    assert "g1-gpu-rtx6000-1" in {it.name for it in load_catalog("linode").instance_types}
    notice = (path / "NOTICE").read_text()
    for csv_file in sorted(path.glob("*.csv")):
        assert csv_file.name in notice, f"{csv_file.name} has no source/licence line in NOTICE"


@pytest.mark.skipif(not SHARED_PRICES.is_dir(), reason="shared price data not available")
def test_shipped_prices_match_the_shared_data() -> None:
    for f in sorted(shipped("data", "prices").glob("*.csv")):
        assert filecmp.cmp(f, SHARED_PRICES / f.name, shallow=False), f.name


def test_data_dir_env_overrides_the_shipped_prices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "prices").mkdir()
    src = shipped("data", "prices", linode.FILE_NAME)
    lines = src.read_text().splitlines()
    (tmp_path / "prices" / linode.FILE_NAME).write_text("\n".join(lines[:2]) + "\n")  # header + one plan
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert prices_dir() == tmp_path / "prices"
    assert len(load_catalog("linode").instance_types) == 1
    # an explicit directory beats the variable
    other = tmp_path / "other"
    shutil.copytree(shipped("data", "prices"), other / "prices")
    assert prices_dir(other) == other / "prices"
    assert len(linode.load(data_dir=other).instance_types) > 1


def test_data_dir_without_prices_falls_back_to_the_shipped_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "openb").mkdir()  # a data directory for the traces only
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert prices_dir() == shipped("data", "prices")
    assert aws.load().instance_types


def test_missing_configured_data_dir_is_one_line_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "typo"))
    with pytest.raises(InputError, match=DATA_DIR_ENV) as exc:
        load_catalog("linode")
    assert "\n" not in str(exc.value) and "unset" in str(exc.value)
    with pytest.raises(InputError, match="argument"):
        prices_dir(tmp_path / "typo")


def test_data_dir_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_data_dir: None) -> None:
    assert data_dir() == UNSET_DATA_DIR and not UNSET_DATA_DIR.exists()
    assert openb_file() == UNSET_DATA_DIR / "openb" / "openb_pod_list_default.csv.gz"
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert data_dir() == tmp_path
    assert openb_file("cpu050") == tmp_path / "openb" / "openb_pod_list_cpu050.csv.gz"
    monkeypatch.setenv(DATA_DIR_ENV, "  ")
    assert data_dir() == UNSET_DATA_DIR


def test_source_checkout_finds_the_shared_data_next_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.setattr(resources, "_REPO_ROOT", repo)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert data_dir() == UNSET_DATA_DIR  # no pyproject.toml: not a checkout
    (repo / "pyproject.toml").write_text("")
    assert data_dir() == tmp_path / "shared" / "data"


def _assert_missing_trace_message(text: str) -> None:
    assert len(text.strip().splitlines()) == 1, text
    for part in ("alibaba/clusterdata", "cluster-trace-gpu-v2023", DATA_DIR_ENV, "not shipped"):
        assert part in text, (part, text)


def test_missing_openb_trace_says_where_to_get_it(no_data_dir: None, tmp_path: Path) -> None:
    with pytest.raises(InputError) as exc:
        openb_arrivals()
    _assert_missing_trace_message(str(exc.value))
    assert "openb_pod_list_default.csv.gz" in str(exc.value)
    with pytest.raises(InputError) as exc:
        load_nodes(tmp_path / "openb" / "openb_node_list_gpu_node.csv.gz")
    _assert_missing_trace_message(str(exc.value))
    assert str(missing_trace(tmp_path / "x.csv")) != ""
    # a missing file that is not the trace is a plain "file not found"
    with pytest.raises(InputError, match="cannot read file") as exc:
        load_pods(tmp_path / "my-pods.csv")
    assert "clusterdata" not in str(exc.value)


def test_bench_openb_without_the_trace_exits_2_with_one_line(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "openb_node_list_gpu_node.csv.gz", tmp_path / "openb_pod_list_default.csv.gz"
    result = CliRunner().invoke(
        main, ["bench", "openb", "--nodes", str(nodes), "--pods", str(pods), "--scorer", "fgd", "--seeds", "42"]
    )
    assert result.exit_code == 2, result.output
    _assert_missing_trace_message(result.output)


def test_simulate_an_openb_scenario_without_the_trace_exits_2(no_data_dir: None, tmp_path: Path) -> None:
    text = example("demo.yaml").read_text()
    head = text[: text.index("workload:")]
    scenario = tmp_path / "openb.yaml"
    scenario.write_text(head + "workload:\n  - source: openb\n    limit: 50\npolicy:\n  name: gpuscale\n")
    result = CliRunner().invoke(main, ["simulate", str(scenario)])
    assert result.exit_code == 2, result.output
    assert "alibaba/clusterdata" in result.output and DATA_DIR_ENV in result.output, result.output


def test_examples_are_shipped_once_and_listed() -> None:
    shipped_dir = shipped("examples")
    assert {p.name for p in shipped_dir.glob("*.yaml")} == set(EXAMPLES)
    for name in EXAMPLES:
        assert example(name).is_file() and example(name.removesuffix(".yaml")) == example(name)
    link = ROOT / "examples"
    assert link.is_symlink() and link.resolve() == PACKAGE.resolve() / "examples"
    with pytest.raises(InputError, match="no such shipped example"):
        example("x" * 5000)


def test_examples_command_lists_shows_and_copies_without_overwriting(tmp_path: Path) -> None:
    runner = CliRunner()
    listing = runner.invoke(main, ["examples"])
    assert listing.exit_code == 0 and all(name in listing.output for name in EXAMPLES)
    assert runner.invoke(main, ["examples", "list"]).output == listing.output
    shown = runner.invoke(main, ["examples", "show", "gpr"])
    assert shown.exit_code == 0 and shown.output == example("gpr.yaml").read_text()
    unknown = runner.invoke(main, ["examples", "show", "nope"])
    assert unknown.exit_code == 2 and "snapshot.yaml" in unknown.output

    target = tmp_path / "new" / "dir"
    copied = runner.invoke(main, ["examples", "copy", str(target)])
    assert copied.exit_code == 0, copied.output
    assert sorted(p.name for p in target.iterdir()) == sorted(EXAMPLES)
    (target / "snapshot.yaml").write_text("mine\n")
    refused = runner.invoke(main, ["examples", "copy", str(target)])
    assert refused.exit_code == 2 and "--force" in refused.output
    assert (target / "snapshot.yaml").read_text() == "mine\n"
    forced = runner.invoke(main, ["examples", "copy", str(target), "--force"])
    assert forced.exit_code == 0
    assert (target / "snapshot.yaml").read_bytes() == example("snapshot.yaml").read_bytes()


def test_copied_examples_plan_and_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["examples", "copy"]).exit_code == 0
    planned = runner.invoke(main, ["plan", "snapshot.yaml", "--catalog", "linode"])
    assert planned.exit_code == 0, planned.output
    assert load_catalog("catalog-custom.yaml").instance_types  # relative to the working directory


def test_every_shipped_example_passes_its_own_loader() -> None:
    """The examples ship in the wheel: each must stay valid as the input checks tighten."""
    from gpuscale.manifests import load_snapshot
    from gpuscale.sim.commands import DEMO_SCENARIO
    from gpuscale.sim.gpr import DEFAULT_SCENARIO, load_gpr_scenario
    from gpuscale.sim.scenario import load_scenario

    linode_catalog = load_catalog("linode")
    assert load_snapshot(example("snapshot.yaml"), catalog=linode_catalog, now=0.0).pods
    assert example("demo.yaml") == DEMO_SCENARIO and load_scenario(DEMO_SCENARIO).name == "demo-bursty-day"
    assert example("gpr-scenario.yaml") == DEFAULT_SCENARIO and load_gpr_scenario(DEFAULT_SCENARIO).name == "gpr-week"
    assert load_catalog(str(example("catalog-custom.yaml"))).instance_types
