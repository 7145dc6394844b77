"""A new node being filled: free CPU, memory, pod slots and milli-GPU per physical GPU."""

from __future__ import annotations

from gpuscale.core.resources import MILLI_PER_GPU, Request, Resources


class Bin:
    """Free capacity of one new node while it is being filled (per-GPU milli-GPU)."""

    __slots__ = ("cpu", "full", "gpus", "mem", "model", "pods", "room")

    def __init__(self, alloc: Resources, model: str | None) -> None:
        self.cpu = alloc.cpu_milli
        self.mem = alloc.memory_mib
        self.pods = alloc.pods
        self.gpus = [MILLI_PER_GPU] * alloc.gpus
        self.full = alloc.gpus
        """Entirely free GPUs."""
        self.room = alloc.gpus * MILLI_PER_GPU
        """Free milli-GPU over all GPUs."""
        self.model = model

    def has_gpu_room(self) -> bool:
        """True if any GPU has free milli-GPU."""
        return self.room > 0

    def fit_count(self, req: Request, limit: int) -> int:
        """How many pods of ``req`` fit (at most ``limit``)."""
        if req.wants_gpu and req.gpu_models is not None and self.model not in req.gpu_models:
            return 0
        n = min(limit, self.pods)
        if req.cpu_milli:
            n = min(n, self.cpu // req.cpu_milli)
        if req.memory_mib:
            n = min(n, self.mem // req.memory_mib)
        if req.gpus:
            n = min(n, self.full // req.gpus)
        elif req.gpu_milli and n > 0:
            n = min(n, sum(g // req.gpu_milli for g in self.gpus))
        return max(0, n)

    def add(self, req: Request, n: int) -> None:
        """Place ``n`` pods of ``req`` (the caller checked ``fit_count``)."""
        self.cpu -= req.cpu_milli * n
        self.mem -= req.memory_mib * n
        self.pods -= n
        if req.gpus:
            need = req.gpus * n
            for i, g in enumerate(self.gpus):
                if not need:
                    break
                if g == MILLI_PER_GPU:
                    self.gpus[i] = 0
                    need -= 1
            self.full -= req.gpus * n
            self.room -= req.gpus * n * MILLI_PER_GPU
        elif req.gpu_milli:
            left = n
            for i in sorted(range(len(self.gpus)), key=lambda j: (self.gpus[j], j)):
                take = min(left, self.gpus[i] // req.gpu_milli)
                if take:
                    if self.gpus[i] == MILLI_PER_GPU:
                        self.full -= 1
                    self.gpus[i] -= take * req.gpu_milli
                    left -= take
                if not left:
                    break
            self.room -= req.gpu_milli * n
