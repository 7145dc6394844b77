"""Catalog loaders (Linode, AWS, Alibaba, custom YAML) and GPU model normalisation."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from gpuscale.catalogs import (
    KNOWN_CATALOGS,
    KNOWN_GPU_MODELS,
    alibaba,
    aws,
    custom,
    gpu_model_variants,
    linode,
    load_catalog,
    normalize_gpu_model,
)
from gpuscale.catalogs._util import DATA_DIR_ENV
from gpuscale.core.gpus import per_gpu_memory_gb
from gpuscale.core.model import CapacityType, Catalog, InstanceType
from gpuscale.errors import InputError

REPO = Path(__file__).resolve().parents[1]
PRICES = REPO / ".." / "shared" / "data" / "prices"
EXAMPLE = REPO / "examples" / "catalog-custom.yaml"

pytestmark = pytest.mark.skipif(not PRICES.is_dir(), reason="shared price data not present")


def _types(cat: Catalog) -> dict[str, InstanceType]:
    return cat.by_name()


# --- GPU model normalisation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "memory_gb", "canonical"),
    [
        ("NVIDIA Quadro RTX 6000", None, "RTX6000"),
        ("Quadro-RTX-6000", None, "RTX6000"),
        ("rtx6000", None, "RTX6000"),
        ("RTX 4000 Ada", None, "RTX4000-Ada"),
        ("NVIDIA-RTX-4000-Ada-Generation", None, "RTX4000-Ada"),
        ("NVIDIA RTX PRO 6000 Blackwell", None, "RTXPRO6000-Blackwell"),
        ("A100 80GB", None, "A100-80GB"),
        ("A100 80G", None, "A100-80GB"),
        ("NVIDIA-A100-SXM4-80GB", None, "A100-80GB"),
        ("a100_40gb", None, "A100-40GB"),
        ("NVIDIA A100", 40, "A100-40GB"),
        ("NVIDIA A100", None, "A100"),
        ("V100M32", None, "V100-32GB"),
        ("V100M16", None, "V100-16GB"),
        ("Nvidia Tesla V100 16GB", None, "V100-16GB"),
        ("Tesla-T4", None, "T4"),
        ("T4 16GB", None, "T4"),
        ("NVIDIA A10G", None, "A10G"),
        ("A10", None, "A10"),
        ("NVIDIA-H100-80GB-HBM3", None, "H100"),
        ("NVIDIA B200 Blackwell", 179, "B200"),
        ("NVIDIA GRID K520", None, "K520"),
        ("RTX A6000", None, "A6000"),
        ("G2", None, "G2"),
        ("G49E 48GB", None, "G49E"),
        ("some new gpu x", None, "SOME-NEW-X"),
    ],
)
def test_normalize_gpu_model(raw: str, memory_gb: float | None, canonical: str) -> None:
    assert normalize_gpu_model(raw, memory_gb=memory_gb) == canonical


def test_normalize_is_idempotent_on_canonical_names() -> None:
    assert "RTX6000" in KNOWN_GPU_MODELS and "A100-80GB" in KNOWN_GPU_MODELS
    for name in KNOWN_GPU_MODELS:
        assert normalize_gpu_model(name) == name


@pytest.mark.parametrize("bad", ["", "   ", "A100!", "80GB", "NVIDIA"])
def test_normalize_rejects_bad_input(bad: str) -> None:
    with pytest.raises(InputError):
        normalize_gpu_model(bad)


def test_gpu_model_variants() -> None:
    assert gpu_model_variants("nvidia a100") == ("A100-40GB", "A100-80GB")
    assert gpu_model_variants("V100") == ("V100-16GB", "V100-32GB")
    assert gpu_model_variants("A100 80GB") == ("A100-80GB",)
    assert gpu_model_variants("Tesla T4") == ("T4",)


@pytest.mark.parametrize(
    ("listed", "count", "model", "per_gpu"),
    [
        (320, 8, "NVIDIA A100", 40),  # p4d: total
        (640, 8, "NVIDIA A100", 80),  # p4de: total
        (80, 8, "NVIDIA A100", 80),  # already per GPU
        (24, 4, "NVIDIA A10G", 24),
        (1432, 8, "NVIDIA B200 Blackwell", 179),
        (262, 8, "NVIDIA B300 Blackwell", 262),  # per GPU despite being large
        (500, 4, "Unknown Thing", 500),  # unknown product: taken as given
    ],
)
def test_per_gpu_memory(listed: float, count: int, model: str, per_gpu: float) -> None:
    assert per_gpu_memory_gb(listed, count, model) == pytest.approx(per_gpu)


# --- Linode ------------------------------------------------------------------------------------------------------


def test_linode_catalog() -> None:
    cat = load_catalog("linode")
    assert cat.name == "linode:us-ord"
    types = _types(cat)
    assert len(types) == 13  # 14 plans, the Blackwell one has no vCPU/RAM
    assert len(cat.warnings) == 1 and "g3-gpu-rtxpro6000-blackwell-1" in cat.warnings[0]
    rtx = types["g1-gpu-rtx6000-1"]
    assert (rtx.gpu_model, rtx.gpu_count, rtx.gpu_memory_mib) == ("RTX6000", 1, 24 * 1024)
    assert (rtx.vcpus, rtx.memory_mib, rtx.provider, rtx.family, rtx.arch) == (8, 32768, "linode", "g1-gpu", "amd64")
    assert len(rtx.offerings) == 1
    off = rtx.offerings[0]
    assert (off.zone, off.capacity_type, off.hourly_price, off.available) == ("us-ord", "on-demand", 1.50, True)
    ada4 = types["g2-gpu-rtx4000a4-m"]
    assert (ada4.gpu_model, ada4.gpu_count, ada4.gpu_memory_mib, ada4.vcpus) == ("RTX4000-Ada", 4, 20480, 48)
    assert all(o.capacity_type is CapacityType.ON_DEMAND for it in cat.instance_types for o in it.offerings)


def test_linode_region_forms_are_equivalent() -> None:
    a, b = load_catalog("linode:us-sea"), load_catalog("linode", region="us-sea")
    assert a == b and a.name == "linode:us-sea"
    assert {o.zone for it in a.instance_types for o in it.offerings} == {"us-sea"}
    assert {it.region for it in a.instance_types} == {"us-sea"}
    with pytest.raises(InputError, match="two different regions"):
        load_catalog("linode:us-sea", region="us-ord")
    with pytest.raises(InputError, match="invalid linode region"):
        load_catalog("linode:US SEA")
    with pytest.raises(InputError, match="empty region"):
        load_catalog("linode:")


# --- AWS ---------------------------------------------------------------------------------------------------------


def test_aws_catalog_us_east_1() -> None:
    cat = load_catalog("aws")
    assert cat.name == "aws:us-east-1"
    types = _types(cat)
    assert 40 <= len(types) <= 85
    assert {it.region for it in cat.instance_types} == {"us-east-1"}
    # total GPU memory in the file divided into per-GPU memory, in MiB
    assert (types["p4d.24xlarge"].gpu_model, types["p4d.24xlarge"].gpu_memory_mib) == ("A100-40GB", 40 * 1024)
    assert (types["p4de.24xlarge"].gpu_model, types["p4de.24xlarge"].gpu_memory_mib) == ("A100-80GB", 80 * 1024)
    assert types["p5.48xlarge"].gpu_memory_mib == types["p5.4xlarge"].gpu_memory_mib == 80 * 1024
    assert types["p5en.48xlarge"].gpu_memory_mib == 141 * 1024
    assert types["g5.12xlarge"].gpu_memory_mib == 24 * 1024  # per GPU already
    assert (types["p3.2xlarge"].gpu_model, types["p3dn.24xlarge"].gpu_model) == ("V100-16GB", "V100-32GB")
    # "Unknown" memory filled from the product's single size
    assert types["gr6.4xlarge"].gpu_memory_mib == 24 * 1024
    g4 = types["g4dn.xlarge"]
    assert (g4.gpu_model, g4.gpu_count, g4.vcpus, g4.memory_mib, g4.family) == ("T4", 1, 4, 16 * 1024, "g4dn")
    assert [(o.zone, o.capacity_type, o.hourly_price) for o in g4.offerings] == [("us-east-1", "on-demand", 0.526)]
    assert types["g3s.xlarge"].memory_mib == round(30.5 * 1024)
    assert types["p5.48xlarge"].memory_mib == 2048 * 1024  # "2048 GiB"


def test_aws_excludes_non_nvidia_and_fractional() -> None:
    cat = load_catalog("aws", region="us-west-2")
    names = set(_types(cat))
    for excluded in ("inf1.xlarge", "inf2.xlarge", "trn1.2xlarge", "g4ad.xlarge", "dl2q.24xlarge", "g6f.large"):
        assert excluded not in names
        assert any(excluded in w for w in cat.warnings)
    assert all(it.gpu_count >= 1 and it.gpu_model for it in cat.instance_types)
    assert not any("Inferentia" in (it.gpu_model or "") for it in cat.instance_types)


def test_aws_unknown_region_names_the_default_and_where_to_look() -> None:
    with pytest.raises(InputError, match="us-east-1") as exc:
        load_catalog("aws:zz-nowhere-9")
    assert "not in the aws price data" in str(exc.value) and "gpuscale catalog list" in str(exc.value)
    assert len(str(exc.value)) < 300


def test_unknown_region_suggests_close_names() -> None:
    with pytest.raises(InputError, match="did you mean eu-west-1"):
        load_catalog("aws:eu-wset-1")
    with pytest.raises(InputError, match=r"use one of: ap-northeast-1, .*us-east-1"):
        load_catalog("alibaba:zz-nowhere-9")


def test_arch_and_family() -> None:
    assert aws.arch_of("g5g.xlarge") == "arm64"
    assert aws.arch_of("g4dn.xlarge") == aws.arch_of("p6-b200.48xlarge") == aws.arch_of("gr6.4xlarge") == "amd64"
    assert aws.family_of("p6-b200.48xlarge") == "p6-b200"
    assert linode.family_of("g2-gpu-rtx4000a1-s") == "g2-gpu"


# --- Alibaba -----------------------------------------------------------------------------------------------------


def test_alibaba_spot_and_zones() -> None:
    cat = load_catalog("alibaba")
    assert cat.name == f"alibaba:{alibaba.DEFAULT_REGION}"
    types = _types(cat)
    assert len(types) == 29 and not cat.warnings
    a10 = types["ecs.gn7i-c8g1.2xlarge"]
    assert (a10.gpu_model, a10.gpu_count, a10.gpu_memory_mib, a10.family) == ("A10", 1, 24 * 1024, "ecs.gn7i")
    offers = {(o.zone, o.capacity_type): o.hourly_price for o in a10.offerings}
    assert offers[("us-east-1a", CapacityType.SPOT)] < offers[("us-east-1a", CapacityType.ON_DEMAND)]
    assert {z for z, _ in offers} == {"us-east-1a", "us-east-1b"}
    assert sum(1 for it in cat.instance_types for o in it.offerings if o.capacity_type is CapacityType.SPOT) >= 29
    assert {types["ecs.gn6e-c12g1.3xlarge"].gpu_model, types["ecs.gn6v-c8g1.2xlarge"].gpu_model} == {
        "V100-32GB",
        "V100-16GB",
    }


def test_alibaba_other_region() -> None:
    cat = load_catalog("alibaba:ap-northeast-1")
    a100 = _types(cat)["ecs.gn7e-c16g1.32xlarge"]
    assert (a100.gpu_model, a100.gpu_count, a100.gpu_memory_mib) == ("A100-80GB", 8, 80 * 1024)
    assert {o.zone for o in a100.offerings} == {"ap-northeast-1b"}


# --- skipping and data location ----------------------------------------------------------------------------------


def _copy_prices(tmp_path: Path) -> Path:
    dst = tmp_path / "data" / "prices"
    shutil.copytree(PRICES, dst)
    return tmp_path / "data"


def _rewrite(path: Path, edit: dict[str, dict[str, str]], key: str) -> None:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = list(reader.fieldnames or ()), list(reader)
    for row in rows:
        row.update(edit.get(row[key], {}))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def test_unknown_prices_are_skipped_with_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _copy_prices(tmp_path)
    _rewrite(data / "prices" / linode.FILE_NAME, {"g1-gpu-rtx6000-2": {"hourly_usd": ""}}, "instance_type")
    _rewrite(data / "prices" / aws.FILE_NAME, {"g4dn.xlarge": {"on_demand_usd_hr": "0"}}, "instance_type")
    _rewrite(
        data / "prices" / alibaba.FILE_NAME, {"ecs.gn6i-c4g1.xlarge": {"Price": "", "SpotPrice": ""}}, "InstanceType"
    )
    _rewrite(data / "prices" / alibaba.FILE_NAME, {"ecs.gn6i-c8g1.2xlarge": {"SpotPrice": "0"}}, "InstanceType")
    monkeypatch.setenv(DATA_DIR_ENV, str(data))

    lin = load_catalog("linode")
    assert "g1-gpu-rtx6000-2" not in _types(lin) and len(lin.instance_types) == 12
    assert any("g1-gpu-rtx6000-2" in w and "hourly_usd" in w for w in lin.warnings)

    aw = load_catalog("aws")
    assert "g4dn.xlarge" not in _types(aw) and "g4dn.2xlarge" in _types(aw)
    assert any("g4dn.xlarge" in w and "on_demand_usd_hr" in w for w in aw.warnings)

    ali = load_catalog("alibaba")
    assert "ecs.gn6i-c4g1.xlarge" not in _types(ali)
    assert any("ecs.gn6i-c4g1.xlarge" in w for w in ali.warnings)
    spotless = _types(ali)["ecs.gn6i-c8g1.2xlarge"]  # on-demand only now, not skipped
    assert {o.capacity_type for o in spotless.offerings} == {CapacityType.ON_DEMAND}


def test_missing_data_dir_is_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match=DATA_DIR_ENV):
        load_catalog("linode")


def test_missing_column_is_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prices = tmp_path / "prices"
    prices.mkdir()
    (prices / linode.FILE_NAME).write_text("instance_type,vcpus\ng1,8\n")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(InputError, match="lacks columns"):
        load_catalog("linode")


def test_unknown_catalog_name() -> None:
    assert set(KNOWN_CATALOGS) == {"alibaba", "aws", "gcp", "linode"}
    with pytest.raises(InputError, match="unknown catalog") as exc:
        load_catalog("azure")
    assert "linode" in str(exc.value)


def test_catalogs_are_sorted_and_deterministic() -> None:
    for name in KNOWN_CATALOGS:
        cat = load_catalog(name)
        keys = [(it.provider, it.region, it.name) for it in cat.instance_types]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        for it in cat.instance_types:
            assert [(o.zone, str(o.capacity_type)) for o in it.offerings] == sorted(
                (o.zone, str(o.capacity_type)) for o in it.offerings
            )
            assert it.cheapest() is not None and all(o.hourly_price > 0 for o in it.offerings)
        assert load_catalog(name) == cat


# --- custom YAML -------------------------------------------------------------------------------------------------


def test_custom_example_loads() -> None:
    cat = load_catalog(str(EXAMPLE))
    assert cat.name == "onprem-lab" and not cat.warnings
    types = _types(cat)
    assert list(types) == ["a100-8", "cpu-16", "t4-1"]
    a100 = types["a100-8"]
    assert (a100.gpu_model, a100.gpu_count, a100.gpu_memory_mib, a100.memory_mib) == ("A100-80GB", 8, 81920, 1179648)
    assert a100.offerings[0].available is False and a100.cheapest() is None
    t4 = types["t4-1"]
    assert (t4.gpu_model, t4.gpu_memory_mib, t4.provider, t4.region) == ("T4", 16384, "onprem", "lab-1")
    assert {o.capacity_type for o in t4.offerings} == {CapacityType.ON_DEMAND, CapacityType.SPOT}
    cpu = types["cpu-16"]
    assert (cpu.gpu_count, cpu.gpu_model) == (0, None)
    assert load_catalog(str(EXAMPLE), region="lab-1") == cat


def test_custom_region_filter() -> None:
    text = EXAMPLE.read_text().replace("    family: cpu\n", "    family: cpu\n    region: lab-2\n    arch: arm64\n")
    cat = custom.parse(text, "cat.yaml", region="lab-2")
    assert [(it.name, it.region, it.arch) for it in cat.instance_types] == [("cpu-16", "lab-2", "arm64")]
    with pytest.raises(InputError, match="lab-1, lab-2"):
        custom.parse(text, "cat.yaml", region="lab-9")


BAD_EDITS = [
    (
        "    family: cpu\n",
        "    family: cpu\n    colour: red\n",
        r"cat\.yaml:\d+: instanceTypes\[0\]\.colour: unknown field",
    ),
    ("price: 0.55", "price: -0.55", r"instanceTypes\[1\]\.offerings\[0\]\.price: negative price \(got -0\.55\)"),
    ("vcpus: 16", "vcpus: sixteen", r"instanceTypes\[0\]\.vcpus: must be an integer \(got 'sixteen'\)"),
    ("vcpus: 16", "vcpus: 0", r"instanceTypes\[0\]\.vcpus: must be a positive integer"),
    ("count: 1", "count: true", r"gpu\.count: must be an integer"),
    ("memory: 64Gi", "memory: 64", r"instanceTypes\[0\]\.memory: must be a memory quantity.*64Gi"),
    ("memory: 64Gi", "memory: 64GB", r"instanceTypes\[0\]\.memory: must be a memory quantity"),
    (
        "price: 0.40\n      - zone: lab-1b",
        "price: '0.40'\n      - zone: lab-1b",
        r"offerings\[0\]\.price: must be a number",
    ),
    ("capacityType: spot", "capacityType: preemptible", r"capacityType: unknown capacity type.*on-demand, spot"),
    ("    vcpus: 8\n", "", r"instanceTypes\[1\]\.vcpus: missing required field"),
    ("name: t4-1", "name: cpu-16", r"duplicate instance type name"),
    ("gpuscale.io/v1alpha1", "v1", r"apiVersion: must be gpuscale\.io/v1alpha1"),
    ("model: A100 ", "model: 'A100!' ", r"gpu\.model: invalid GPU model name"),
    ("    family: cpu\n", "    family: cpu\n    arch: x86\n", r"arch: unknown architecture"),
    ("    family: cpu\n", "    family: cpu\n    family: x\n", r"cat\.yaml:\d+: duplicate field \(got 'family'\)"),
    ("  - name: cpu-16", "  - name: [cpu-16", r"cat\.yaml:\d+: not valid YAML"),
    ("        price: 24.00\n", "        price: .nan\n", r"price: must be a number"),
    (
        "      - zone: lab-1b\n        capacityType: on-demand",
        "      - zone: 7\n        capacityType: on-demand",
        r"zone: must be a string",
    ),
    (
        "\n      - zone: lab-1a\n        capacityType: spot",
        "\n      - zone: lab-1a\n        capacityType: on-demand",
        r"duplicate offering",
    ),
]


@pytest.mark.parametrize(("old", "new", "error"), BAD_EDITS)
def test_custom_bad_input(old: str, new: str, error: str) -> None:
    base = EXAMPLE.read_text()
    assert old in base
    text = base.replace(old, new, 1)
    with pytest.raises(InputError, match=error) as exc:
        custom.parse(text, "cat.yaml")
    assert exc.value.where.startswith("cat.yaml:")
    assert exc.value.fix


def test_custom_error_line_numbers() -> None:
    text = EXAMPLE.read_text().replace("price: 0.55", "price: -0.55")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "-0.55" in ln)
    with pytest.raises(InputError) as exc:
        custom.parse(text, "cat.yaml")
    assert exc.value.where.startswith(f"cat.yaml:{line}:")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "must be a mapping"),
        ("- a\n", "must be a mapping"),
        ("apiVersion: gpuscale.io/v1alpha1\nkind: InstanceCatalog\nname: x\ninstanceTypes: []\n", "non-empty list"),
        ("apiVersion: gpuscale.io/v1alpha1\nkind: InstanceCatalog\ninstanceTypes: []\n", "name: missing required"),
    ],
)
def test_custom_bad_documents(text: str, error: str) -> None:
    with pytest.raises(InputError, match=error):
        custom.parse(text, "cat.yaml")


def test_custom_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="catalog file not found"):
        load_catalog(str(tmp_path / "missing.yaml"))
