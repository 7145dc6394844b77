"""Loaders for the Alibaba ``cluster-trace-gpu-v2023`` ("openb") CSV files.

Node lists (``sn,cpu_milli,memory_mib,gpu,model``) become :class:`~gpuscale.core.state.NodeShape` rows; pod lists
(``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time]``)
become :class:`TracePod` records carrying a core :class:`~gpuscale.core.resources.Request` plus the trace's
timestamps, so that a simulator can replay arrivals and departures later.

GPU mapping: ``num_gpu`` = 1 with ``gpu_milli`` < 1000 is a fraction of one GPU (``Request.gpu_milli``);
``num_gpu`` >= 1 with ``gpu_milli`` = 1000 is whole GPUs; ``num_gpu`` = 0 is a CPU-only pod. ``gpu_spec`` ``A|B``
is the set of allowed GPU models. Files may be plain or gzip-compressed (by content, not by name). Every bad row
raises :class:`~gpuscale.errors.InputError` naming the file, the line and the column. The trace is not shipped with
gpuscale: a missing ``openb_*`` file is one line saying where to get it.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources
from gpuscale.core.state import NodeShape
from gpuscale.errors import InputError
from gpuscale.resources import missing_trace

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
"""Columns of an openb node list."""

POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""Columns every openb pod list has (the ``multigpu`` files have only these)."""

POD_OPTIONAL_COLUMNS = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
"""Columns the full pod lists add."""


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of a trace: its request and, when the file has them, its QoS class, phase and timestamps (seconds)."""

    name: str
    request: Request
    qos: str | None = None
    phase: str | None = None
    creation_time: float | None = None
    deletion_time: float | None = None
    scheduled_time: float | None = None


def _open_text(path: Path) -> io.TextIOBase:
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and path.name.startswith("openb_"):
            raise missing_trace(path) from exc
        raise InputError(f"cannot read file: {exc.strerror}", where=str(path), fix="check the path") from exc
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return io.TextIOWrapper(path.open("rb"), encoding="utf-8", newline="")


def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) for every data row; checks the header has the ``required`` columns."""
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise InputError("empty file, expected a CSV header", where=str(path)) from None
        except (UnicodeDecodeError, OSError, EOFError) as exc:
            raise InputError(f"not a readable CSV file ({exc})", where=str(path)) from exc
        names = [h.strip() for h in header]
        missing = [c for c in required if c not in names]
        if missing:
            raise InputError(
                f"missing column(s) {', '.join(missing)}",
                where=f"{path}:1",
                value=",".join(names),
                fix=f"the header must contain {','.join(required)}",
            )
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(names):
                    raise InputError(
                        f"expected {len(names)} fields, found {len(row)}",
                        where=f"{path}:{line}",
                        value=",".join(row),
                        fix="every row needs one value per header column",
                    )
                yield line, {k: v.strip() for k, v in zip(names, row, strict=True)}
        except (UnicodeDecodeError, OSError, EOFError, csv.Error) as exc:
            raise InputError(f"unreadable content ({exc})", where=f"{path}:{reader.line_num + 1}") from exc


def _int(row: dict[str, str], col: str, where: str, lo: int = 0, hi: int | None = None) -> int:
    raw = row[col]
    try:
        val = int(raw)
    except ValueError:
        raise InputError(f"column {col!r} must be an integer", where=where, value=raw) from None
    if val < lo or (hi is not None and val > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise InputError(f"column {col!r} out of range {rng}", where=where, value=val)
    return val


def _time(row: dict[str, str], col: str, where: str) -> float | None:
    raw = row.get(col, "")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise InputError(f"column {col!r} must be a number of seconds or empty", where=where, value=raw) from None


def _models(spec: str) -> frozenset[str] | None:
    models = frozenset(m.strip() for m in spec.split("|") if m.strip())
    return models or None


def load_nodes(path: str | Path) -> list[NodeShape]:
    """Read an openb node list into node shapes, in file order."""
    p = Path(path)
    shapes: list[NodeShape] = []
    seen: set[str] = set()
    for line, row in _rows(p, NODE_COLUMNS):
        where = f"{p}:{line}"
        name = row["sn"]
        if not name:
            raise InputError("column 'sn' (node name) is empty", where=where)
        if name in seen:
            raise InputError("duplicate node name", where=where, value=name, fix="node names must be unique")
        seen.add(name)
        cpu = _int(row, "cpu_milli", where, lo=1)
        mem = _int(row, "memory_mib", where, lo=1)
        gpus = _int(row, "gpu", where)
        model = row["model"] or None
        if gpus and model is None:
            raise InputError("a node with GPUs needs a GPU model", where=where, fix="fill the 'model' column")
        shapes.append(NodeShape(name, Resources(cpu_milli=cpu, memory_mib=mem, gpus=gpus), model if gpus else None))
    if not shapes:
        raise InputError("no nodes in file", where=str(p))
    return shapes


def pod_request(row: dict[str, str], where: str) -> Request:
    """The core request of one pod-list row (see the module docstring for the GPU mapping)."""
    cpu = _int(row, "cpu_milli", where)
    mem = _int(row, "memory_mib", where)
    num_gpu = _int(row, "num_gpu", where)
    milli = _int(row, "gpu_milli", where, hi=MILLI_PER_GPU)
    models = _models(row.get("gpu_spec", ""))
    if num_gpu == 0:
        if milli:
            raise InputError(
                "gpu_milli must be 0 when num_gpu is 0",
                where=where,
                value=milli,
                fix="set num_gpu to 1 for a fractional GPU",
            )
        return Request(cpu_milli=cpu, memory_mib=mem)
    if milli == MILLI_PER_GPU:
        return Request(cpu_milli=cpu, memory_mib=mem, gpus=num_gpu, gpu_models=models)
    if num_gpu == 1 and milli > 0:
        return Request(cpu_milli=cpu, memory_mib=mem, gpu_milli=milli, gpu_models=models)
    raise InputError(
        f"num_gpu={num_gpu} with gpu_milli={milli} is not a valid GPU request",
        where=where,
        fix="use num_gpu=1 with gpu_milli 1..999 for a fraction of one GPU, or gpu_milli=1000 for whole GPUs",
    )


def load_pods(path: str | Path) -> list[TracePod]:
    """Read an openb pod list (either column set) into trace pods, in file order."""
    p = Path(path)
    pods: list[TracePod] = []
    for line, row in _rows(p, POD_COLUMNS):
        where = f"{p}:{line}"
        name = row["name"]
        if not name:
            raise InputError("column 'name' is empty", where=where)
        pods.append(
            TracePod(
                name=name,
                request=pod_request(row, where),
                qos=row.get("qos") or None,
                phase=row.get("pod_phase") or None,
                creation_time=_time(row, "creation_time", where),
                deletion_time=_time(row, "deletion_time", where),
                scheduled_time=_time(row, "scheduled_time", where),
            )
        )
    if not pods:
        raise InputError("no pods in file", where=str(p))
    return pods
