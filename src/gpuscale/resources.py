"""Where gpuscale finds its files: the ones shipped inside the package, and the external data directory.

Shipped (read with :mod:`importlib.resources`, so they work from a wheel, an editable install or a checkout):

* ``gpuscale/data/prices/*.csv``: the price catalogs (sources and licences in ``data/prices/NOTICE``);
* ``gpuscale/examples/*.yaml``: the example snapshot, scenarios, GPR and custom catalog (:data:`EXAMPLES`).

Not shipped: the Alibaba cluster traces (their publishers allow research and study use). They are read from the data
directory: ``$GPUSCALE_DATA_DIR``, else, in a source checkout only, ``../shared/data`` next to the repository.
Override order everywhere: an explicit path, then ``$GPUSCALE_DATA_DIR``, then the shipped copy.
"""

from __future__ import annotations

import atexit
import os
from contextlib import ExitStack
from importlib.resources import as_file, files
from pathlib import Path

from gpuscale.errors import InputError

DATA_DIR_ENV = "GPUSCALE_DATA_DIR"
"""Environment variable naming the data directory (holding ``prices/``, ``openb/``, ``alibaba-misc/``)."""

UNSET_DATA_DIR = Path(f"${DATA_DIR_ENV}")
"""Stands for the data directory when none is configured (a path that does not exist, shown as such in help)."""

TRACE_SOURCE = "the alibaba/clusterdata repository (github.com/alibaba/clusterdata), folder cluster-trace-gpu-v2023"
"""Where to get the openb trace, which is not redistributed with gpuscale."""

EXAMPLES: dict[str, str] = {
    "snapshot.yaml": "a small Linode GPU cluster (nodes, pods, GPUNodePools) to plan: gpuscale plan snapshot.yaml",
    "demo.yaml": "the simulator demo, a bursty day on Linode: gpuscale simulate demo.yaml (or gpuscale demo)",
    "gpr-scenario.yaml": "a week of GPU Provisioning Requests: gpuscale simulate-gpr gpr-scenario.yaml",
    "gpr.yaml": "one GPUProvisioningRequest: gpuscale gpr create -f gpr.yaml",
    "catalog-custom.yaml": "a custom on-premises catalog (docs/catalogs.md): gpuscale plan SNAPSHOT --catalog FILE",
    "crs.yaml": "gpuscale's own objects (GPUNodePool, OfferingAvailability, GPUNodeClaim): kubectl apply -f crs.yaml",
    "scaler.yaml": "a GPUWorkloadScaler on DCGM metrics: gpuscale scaler replay scaler.yaml scaler-history.yaml",
    "scaler-history.yaml": "a metric history to replay through scaler.yaml (gpuscale scaler replay)",
    "keda-scaledobject.yaml": "a KEDA ScaledObject, read as is: gpuscale scaler replay keda-scaledobject.yaml HISTORY",
    "gpubudget.yaml": "a GPUBudget shared by two models (the arbiter's input): kubectl apply -f gpubudget.yaml",
    "usage.yaml": "three days of container and GPU memory usage: gpuscale rightsize usage.yaml",
    "gpubudget-scalers.yaml": "another scaler in the budget: gpuscale scaler arbitrate gpubudget.yaml scaler.yaml FILE",
    "inference-budget.yaml": "three inference models sharing a GPU budget: gpuscale compare inference-budget.yaml",
}
"""The shipped example files, each with a one-line description."""

_REPO_ROOT = Path(__file__).resolve().parents[2]
_extracted = ExitStack()
atexit.register(_extracted.close)


def shipped(*parts: str) -> Path:
    """A file or directory shipped inside the package, e.g. ``shipped("examples", "demo.yaml")``, as a real path
    (extracted to a temporary file for the life of the process if the package is zipped)."""
    res = files("gpuscale").joinpath(*parts)
    if isinstance(res, Path):
        return res
    return _extracted.enter_context(as_file(res))  # pragma: no cover - zipped installs only


def example(name: str) -> Path:
    """A shipped example file by name (``demo.yaml``; the ``.yaml`` may be left out)."""
    key = name if name.endswith(".yaml") else f"{name}.yaml"
    if key not in EXAMPLES:
        raise InputError("no such shipped example", value=name[:60], fix=f"use one of {', '.join(sorted(EXAMPLES))}")
    return shipped("examples", key)


def env_data_dir() -> Path | None:
    """``$GPUSCALE_DATA_DIR`` if it is set and not empty."""
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(env) if env else None


def checkout_data_dir() -> Path | None:
    """``../shared/data`` next to a source checkout of gpuscale, if this runs from one and it exists."""
    shared = _REPO_ROOT.parent / "shared" / "data"
    return shared if (_REPO_ROOT / "pyproject.toml").is_file() and shared.is_dir() else None


def data_dir() -> Path:
    """The data directory holding the traces: ``$GPUSCALE_DATA_DIR``, else ``../shared/data`` of a checkout, else
    :data:`UNSET_DATA_DIR` (which does not exist, so reading from it ends in :func:`missing_trace`)."""
    return env_data_dir() or checkout_data_dir() or UNSET_DATA_DIR


def prices_dir(explicit: Path | None = None) -> Path:
    """The directory of the price CSV files: ``explicit/prices``, else ``$GPUSCALE_DATA_DIR/prices`` when that
    directory has one, else the shipped copy. An explicit or configured directory that does not exist is an error."""
    chosen, source = (explicit, "argument") if explicit is not None else (env_data_dir(), DATA_DIR_ENV)
    if chosen is None:
        return shipped("data", "prices")
    path = chosen / "prices"
    if path.is_dir():
        return path
    if explicit is None and chosen.is_dir():
        return shipped("data", "prices")  # a data directory for the traces only: the shipped prices apply
    raise InputError(
        "catalog price data not found",
        where=str(path)[:200],
        fix=f"the data directory ({source}) must exist and contain prices/; unset {DATA_DIR_ENV} to use the "
        "price data shipped with gpuscale, or use a custom YAML catalog (--catalog my-catalog.yaml)",
    )


def missing_trace(path: Path) -> InputError:
    """The one-line error for a trace file that is not there: where to get it and what to set."""
    return InputError(
        "trace file not found; the Alibaba traces are not shipped with gpuscale",
        where=str(path)[:200],
        fix=f"get {path.name} from {TRACE_SOURCE} (csv/), then set {DATA_DIR_ENV} to the directory holding "
        f"{path.parent.name}/ or give the file's path",
    )
