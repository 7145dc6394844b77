"""``gpuscale catalog list`` and ``gpuscale catalog show``."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from gpuscale.catalogs import KNOWN_CATALOGS, load_catalog
from gpuscale.cli import main
from gpuscale.resources import example


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_list_names_every_shipped_catalog_with_counts() -> None:
    res = invoke("catalog", "list", "--json")
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert set(rows) == set(KNOWN_CATALOGS)
    for name, row in rows.items():
        assert row["instanceTypes"] == len(load_catalog(name).instance_types) > 0
        assert row["regions"] is None or row["defaultRegion"] in row["regions"]
    assert rows["linode"]["regions"] is None and len(rows["alibaba"]["regions"]) > 1
    text = invoke("catalog", "list")
    assert text.exit_code == 0
    for name, row in rows.items():
        line = next(ln for ln in text.stdout.splitlines() if ln.startswith(name + " "))
        assert line.split()[-1] == str(row["instanceTypes"])


def test_show_json_matches_the_loaded_catalog() -> None:
    res = invoke("catalog", "show", "alibaba:cn-wulanchabu", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    cat = load_catalog("alibaba", region="cn-wulanchabu")
    assert doc["catalog"] == cat.name and [t["name"] for t in doc["instanceTypes"]] == [
        it.name for it in cat.instance_types
    ]
    first = doc["instanceTypes"][0]
    assert {o["capacityType"] for t in doc["instanceTypes"] for o in t["offerings"]} == {"on-demand", "spot"}
    assert first["gpuCount"] == cat.instance_types[0].gpu_count


def test_show_table_has_one_row_per_type_with_prices() -> None:
    cat = load_catalog("linode")
    res = invoke("catalog", "show", "linode")
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[1].split()[:3] == ["type", "GPUs", "GPU"]
    body = lines[2:]
    assert len(body) == len(cat.instance_types)
    for it, line in zip(cat.instance_types, body, strict=True):
        assert line.startswith(it.name + " ") and f"{it.offerings[0].hourly_price:.3f}" in line
        assert f"{it.gpu_count}× {it.gpu_model}" in line


def test_show_filters_by_gpu_and_region() -> None:
    res = invoke("catalog", "show", "aws", "--region", "eu-west-1", "--gpu", "a100", "--json")
    assert res.exit_code == 0, res.output
    types = json.loads(res.stdout)["instanceTypes"]
    assert types and all(t["gpuModel"].startswith("A100") and t["region"] == "eu-west-1" for t in types)
    l4 = json.loads(invoke("catalog", "show", "aws", "--gpu", "L4", "--json").stdout)["instanceTypes"]
    assert l4 and {t["gpuModel"] for t in l4} == {"L4"}


def test_show_unknown_gpu_suggests_models() -> None:
    res = invoke("catalog", "show", "linode", "--gpu", "rtx400")
    assert res.exit_code == 2
    assert "--gpu" in res.stderr and "RTX4000-Ada" in res.stderr and "Traceback" not in res.output


def test_show_custom_yaml_catalog(tmp_path: Path) -> None:
    res = invoke("catalog", "show", str(example("catalog-custom.yaml")), "--json")
    assert res.exit_code == 0, res.output
    cat = load_catalog(str(example("catalog-custom.yaml")))
    assert len(json.loads(res.stdout)["instanceTypes"]) == len(cat.instance_types) > 0


def test_unknown_catalog_and_region_are_input_errors() -> None:
    for args in (["nope"], ["aws:mars-1"], ["alibaba", "--region", "xx-1"]):
        res = invoke("catalog", "show", *args)
        assert res.exit_code == 2 and res.stderr.startswith("error:") and "Traceback" not in res.output


def test_messages_name_the_catalog_command_correctly() -> None:
    root = Path(__file__).resolve().parents[1]
    for path in (root / "src" / "gpuscale").rglob("*.py"):
        text = path.read_text()
        at = text.find("gpuscale catalog")
        while at != -1:
            rest = text[at + len("gpuscale catalog") :]
            assert rest.startswith((" list", " show")), (path, text[at : at + 40])
            at = text.find("gpuscale catalog", at + 1)
