"""Resource amounts and the fractional-GPU convention.

Fractional GPUs (the one place this convention is defined)
----------------------------------------------------------
A pod asks for whole GPUs with the extended resource ``nvidia.com/gpu`` (an integer count). A pod may instead ask for
a *fraction of one physical GPU* with the extended resource ``gpuscale.io/gpu-milli``: an integer 1..999, in
thousandths of a GPU. A fractional request must fit on a single physical GPU of the node: gpuscale tracks the free
milli-GPU of every GPU of every node, not only a node total, so a 600-milli pod never lands "across" two GPUs with
500 free each. A request of 1000 or more milli-GPU is not a fraction: ask for whole GPUs instead. A pod may not ask
for both resources. Whole-GPU requests take GPUs that are entirely free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource name for whole GPUs."""

GPU_MILLI_RESOURCE = "gpuscale.io/gpu-milli"
"""Extended resource name for a fraction of one GPU, in milli-GPU (1..999)."""

MILLI_PER_GPU = 1000
"""Milli-GPU in one physical GPU."""

DEFAULT_MAX_PODS = 110
"""Kubernetes' default pod capacity of a node."""


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of node capacity: CPU millicores, memory MiB, whole GPUs and pod slots."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    pods: int = DEFAULT_MAX_PODS

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory_mib + other.memory_mib,
            self.gpus + other.gpus,
            self.pods + other.pods,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli - other.cpu_milli,
            self.memory_mib - other.memory_mib,
            self.gpus - other.gpus,
            self.pods - other.pods,
        )

    def scaled(self, n: int) -> Resources:
        """``n`` times this amount."""
        return Resources(self.cpu_milli * n, self.memory_mib * n, self.gpus * n, self.pods * n)


@dataclass(frozen=True, slots=True)
class Request:
    """What one pod needs from a node.

    ``gpus`` whole GPUs, or ``gpu_milli`` (1..999) of a single GPU; never both. ``gpu_models`` optionally restricts
    the GPU product (as in the openb trace's ``gpu_spec``); Kubernetes pods express that with node selectors instead.
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] | None = None
    gpu_demand_milli: int = field(init=False, repr=False, compare=False)
    """Total GPU demand in milli-GPU (whole GPUs count 1000 each; derived)."""
    wants_gpu: bool = field(init=False, repr=False, compare=False)
    """True if the pod needs any GPU (derived). The derived fields are stored rather than properties: planners and
    the simulator read them hundreds of thousands of times per replay; they take no part in equality or hashing."""
    _hash: int = field(init=False, repr=False, compare=False)
    """The hash the dataclass would compute from the compared fields, computed once (requests key many memo and
    index tables); not pickled (:meth:`__reduce__`), since string hashes differ between processes."""

    def __post_init__(self) -> None:
        if self.gpus and self.gpu_milli:
            raise ValueError("a request asks for whole GPUs or for a fraction of one GPU, not both")
        if not 0 <= self.gpu_milli < MILLI_PER_GPU:
            raise ValueError(f"gpu_milli must be in 0..{MILLI_PER_GPU - 1}, got {self.gpu_milli}")
        if self.gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("requests must not be negative")
        object.__setattr__(self, "gpu_demand_milli", self.gpus * MILLI_PER_GPU + self.gpu_milli)
        object.__setattr__(self, "wants_gpu", self.gpus > 0 or self.gpu_milli > 0)
        object.__setattr__(self, "_hash", hash(self._values()))

    def _values(self) -> tuple[int, int, int, int, frozenset[str] | None]:
        return (self.cpu_milli, self.memory_mib, self.gpus, self.gpu_milli, self.gpu_models)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Request], tuple[int, int, int, int, frozenset[str] | None]]:
        return (Request, self._values())
