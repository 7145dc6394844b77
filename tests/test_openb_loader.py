"""The openb CSV loaders: both pod-list column sets, gzip or plain, GPU mapping and clear errors on bad rows."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from gpuscale.core.resources import Request
from gpuscale.errors import InputError
from gpuscale.traces.openb import load_nodes, load_pods

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb"

FULL_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)


def write(path: Path, text: str, gz: bool = False) -> Path:
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_full_pod_list_maps_gpu_requests_models_and_times(tmp_path: Path) -> None:
    p = write(
        tmp_path / "pods.csv.gz",
        FULL_HEADER + "\n"
        "p0,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
        "p1,6000,12288,1,460,,LS,Running,427061,12902960,427061\n"
        "p2,32000,65536,0,0,,BE,Pending,10,20,\n"
        "p3,88000,327680,8,1000,V100M32|G2,LS,Running,5,6,5\n",
        gz=True,
    )
    pods = load_pods(p)
    assert [x.name for x in pods] == ["p0", "p1", "p2", "p3"]
    assert pods[0].request == Request(cpu_milli=12000, memory_mib=16384, gpus=1)
    assert pods[1].request == Request(cpu_milli=6000, memory_mib=12288, gpu_milli=460)
    assert pods[2].request == Request(cpu_milli=32000, memory_mib=65536)
    assert pods[3].request.gpus == 8 and pods[3].request.gpu_models == frozenset({"V100M32", "G2"})
    assert (pods[1].creation_time, pods[1].deletion_time, pods[1].scheduled_time) == (427061.0, 12902960.0, 427061.0)
    assert pods[2].scheduled_time is None and pods[2].phase == "Pending" and pods[2].qos == "BE"


def test_five_column_multigpu_list_has_no_times(tmp_path: Path) -> None:
    p = write(tmp_path / "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,8000,100,4,1000\nb,100,10,1,50\n")
    a, b = load_pods(p)
    assert a.request.gpus == 4 and a.creation_time is None and a.qos is None
    assert b.request.gpu_milli == 50 and b.request.gpus == 0


def test_node_list(tmp_path: Path) -> None:
    p = write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,1024,0,\n")
    n0, n1 = load_nodes(p)
    assert (n0.capacity.cpu_milli, n0.capacity.memory_mib, n0.capacity.gpus, n0.gpu_model) == (64000, 262144, 2, "P100")
    assert n1.capacity.gpus == 0 and n1.gpu_model is None


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("bad,abc,1,0,0", "'cpu_milli' must be an integer"),
        ("bad,1,1,2,500", "num_gpu=2 with gpu_milli=500"),
        ("bad,1,1,0,300", "gpu_milli must be 0 when num_gpu is 0"),
        ("bad,1,1,1,0", "num_gpu=1 with gpu_milli=0"),
        ("bad,1,1,1,1200", "out of range"),
        ("bad,-5,1,0,0", "out of range"),
        ("bad,1,1,0", "expected 5 fields, found 4"),
    ],
)
def test_bad_pod_rows_name_file_and_line(tmp_path: Path, row: str, needle: str) -> None:
    p = write(tmp_path / "bad.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nok,1,1,1,1000\n" + row + "\n")
    with pytest.raises(InputError) as exc:
        load_pods(p)
    assert f"{p}:3" in str(exc.value)
    assert needle in str(exc.value)


def test_bad_times_and_headers(tmp_path: Path) -> None:
    p = write(tmp_path / "t.csv", FULL_HEADER + "\np,1,1,0,0,,LS,Running,soon,,\n")
    with pytest.raises(InputError, match=r"t\.csv:2.*creation_time"):
        load_pods(p)
    p = write(tmp_path / "h.csv", "name,cpu,memory_mib\nx,1,1\n")
    with pytest.raises(InputError, match="missing column"):
        load_pods(p)
    p = write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n")
    with pytest.raises(InputError, match=r"n\.csv:2.*GPU model"):
        load_nodes(p)
    with pytest.raises(InputError, match="cannot read"):
        load_nodes(tmp_path / "missing.csv")
    with pytest.raises(InputError, match="no pods"):
        load_pods(write(tmp_path / "e.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"))


@pytest.mark.skipif(not DATA.is_dir(), reason="shared openb data not present")
def test_real_trace_files_load() -> None:
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv.gz")
    assert len(nodes) == 1213 and sum(n.capacity.gpus for n in nodes) == 6212
    pods = load_pods(DATA / "openb_pod_list_default.csv.gz")
    assert len(pods) == 8152
    assert sum(p.request.gpu_milli > 0 for p in pods) == 3078
    multi = load_pods(DATA / "openb_pod_list_multigpu20.csv.gz")
    assert all(p.creation_time is None for p in multi)
    spec = load_pods(DATA / "openb_pod_list_gpuspec10.csv.gz")
    assert any(p.request.gpu_models == frozenset({"T4"}) for p in spec)
