"""GPU model names: one canonical short product name for every spelling.

Catalog files, GPU Feature Discovery labels, GPU Provisioning Requests (``gpuShape``) and traces all spell the same
GPU differently ("NVIDIA Quadro RTX 6000", "Quadro-RTX-6000", "RTX6000"). :func:`normalize_gpu_model` maps all of
them to one canonical name, used as ``InstanceType.gpu_model`` and as the ``nvidia.com/gpu.product`` label value of
the nodes gpuscale creates. The rules (see ``docs/catalogs.md``):

1. Upper-case; ``-``, ``_`` and blanks separate tokens.
2. Drop vendor and brand words (NVIDIA, Tesla, Quadro, GeForce, GRID, GPU, ...), form factors (SXM4, PCIe, ...),
   memory technologies (HBM3, GDDR6, ...) and filler (Generation, Server, Edition).
3. A token such as ``80GB``/``80G`` is the per-GPU memory; so is the ``M32`` of a trace name like ``V100M32``.
4. The remaining tokens, joined, are looked up in the alias table: ``RTX6000``, ``RTX4000-Ada``, ``A10G``, ...
5. Products sold in several memory sizes (A100, V100) get a ``-<N>GB`` suffix when the memory is known
   (``A100-80GB``); without it the bare family name (``A100``) is returned. Other products never carry a memory
   suffix: memory is a separate label (``nvidia.com/gpu.memory``).
6. Unknown names pass through: the kept tokens, upper-case, joined with ``-`` (``"G49E 48GB"`` -> ``G49E``).

This module is pure (standard library only) so it can move into the core unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuscale.errors import InputError


@dataclass(frozen=True, slots=True)
class GpuProduct:
    """A known GPU product: canonical base name, per-GPU memory sizes (GB as marketed), memory-variant flag."""

    name: str
    memory_gb: tuple[int, ...]
    variants: bool = False
    """True if the canonical name carries a ``-<N>GB`` suffix (the product exists in several memory sizes)."""


_PRODUCTS: tuple[GpuProduct, ...] = (
    GpuProduct("K520", (4,)),
    GpuProduct("K80", (12,)),
    GpuProduct("M60", (8,)),
    GpuProduct("P100", (16,)),
    GpuProduct("V100", (16, 32), variants=True),
    GpuProduct("T4", (16,)),
    GpuProduct("T4G", (16,)),
    GpuProduct("A10", (24,)),
    GpuProduct("A10G", (24,)),
    GpuProduct("A30", (24,)),
    GpuProduct("A40", (48,)),
    GpuProduct("A100", (40, 80), variants=True),
    GpuProduct("A6000", (48,)),
    GpuProduct("L4", (24,)),
    GpuProduct("L20", (48,)),
    GpuProduct("L40", (48,)),
    GpuProduct("L40S", (48,)),
    GpuProduct("H20", (96,)),
    GpuProduct("H100", (80,)),
    GpuProduct("H800", (80,)),
    GpuProduct("H200", (141,)),
    GpuProduct("B200", (180,)),
    GpuProduct("B300", (288,)),
    GpuProduct("RTX6000", (24,)),
    GpuProduct("RTX4000-Ada", (20,)),
    GpuProduct("RTX6000-Ada", (48,)),
    GpuProduct("RTXPRO6000-Blackwell", (96,)),
)
PRODUCTS: dict[str, GpuProduct] = {p.name: p for p in _PRODUCTS}
"""Known products by canonical base name."""

_ALIASES: dict[str, str] = {
    "RTX4000ADA": "RTX4000-Ada",
    "RTX6000ADA": "RTX6000-Ada",
    "RTXPRO6000": "RTXPRO6000-Blackwell",
    "RTXPRO6000BLACKWELL": "RTXPRO6000-Blackwell",
    "RTXA6000": "A6000",
    "B200BLACKWELL": "B200",
    "B300BLACKWELL": "B300",
}
"""Joined-token keys that differ from the canonical name (keys of ``PRODUCTS`` map to themselves)."""

_DROP = frozenset(
    {
        "NVIDIA",
        "TESLA",
        "QUADRO",
        "GEFORCE",
        "GRID",
        "GPU",
        "TENSOR",
        "CORE",
        "GENERATION",
        "SERVER",
        "EDITION",
        "SXM",
        "SXM2",
        "SXM3",
        "SXM4",
        "SXM5",
        "PCIE",
        "HBM",
        "HBM2",
        "HBM2E",
        "HBM3",
        "HBM3E",
        "GDDR5",
        "GDDR6",
        "GDDR6X",
        "GDDR7",
    }
)
_MEMORY_TOKEN = re.compile(r"^(\d+(?:\.\d+)?)(?:GB|G|GIB)$")
_TRACE_MEMORY = re.compile(r"^([A-Z]\d+)M(\d+)$")
_SEPARATORS = re.compile(r"[\s_\-/]+")
_VALID = re.compile(r"^[A-Z0-9.]+$")
MEMORY_TOLERANCE = 0.10
"""Relative tolerance when matching a memory size to a product's known sizes (AWS lists B200 as 179 GB)."""


_BY_KEY: dict[str, GpuProduct] = {
    **{p.name.upper().replace("-", ""): p for p in _PRODUCTS},
    **{alias: PRODUCTS[target] for alias, target in _ALIASES.items()},
}


def _match_size(sizes: tuple[int, ...], memory_gb: float) -> int | None:
    for size in sizes:
        if abs(memory_gb - size) <= MEMORY_TOLERANCE * size:
            return size
    return None


def normalize_gpu_model(name: str, memory_gb: float | None = None) -> str:
    """The canonical GPU model name for any spelling of ``name``.

    ``memory_gb`` (per GPU) picks the memory variant of products sold in several sizes when ``name`` itself does not
    say it. Raises :class:`InputError` for an empty name or one with characters other than letters, digits and
    separators.
    """
    if not isinstance(name, str) or not name.strip():
        raise InputError("empty GPU model name", value=name, fix="give a GPU model such as T4, A100-80GB or RTX6000")
    tokens = [t for t in _SEPARATORS.split(name.strip().upper()) if t]
    kept: list[str] = []
    for tok in tokens:
        mem = _MEMORY_TOKEN.match(tok)
        if mem:
            memory_gb = float(mem.group(1))
            continue
        if tok in _DROP:
            continue
        if not _VALID.match(tok):
            raise InputError(
                "invalid GPU model name",
                value=name,
                fix="use letters, digits, blanks, '-' or '_' only, e.g. 'A100 80GB'",
            )
        kept.append(tok)
    if not kept:
        raise InputError("GPU model name names no product", value=name, fix="give a model such as T4 or A100-80GB")
    key = "".join(kept)
    trace = _TRACE_MEMORY.match(key)
    if trace and (p := _BY_KEY.get(trace.group(1))) is not None and p.variants:
        key, memory_gb = trace.group(1), float(trace.group(2))
    product = _BY_KEY.get(key)
    if product is None:
        return "-".join(kept)
    if not product.variants or memory_gb is None:
        return product.name
    size = _match_size(product.memory_gb, memory_gb)
    return f"{product.name}-{size if size is not None else round(memory_gb)}GB"


def gpu_model_variants(name: str) -> tuple[str, ...]:
    """Every canonical name ``name`` stands for: ``A100`` -> ``(A100-40GB, A100-80GB)``; ``T4`` -> ``(T4,)``.

    Use it to turn a family name from user input into the values of an ``In`` requirement on
    ``nvidia.com/gpu.product``.
    """
    canonical = normalize_gpu_model(name)
    product = PRODUCTS.get(canonical)
    if product is not None and product.variants:
        return tuple(f"{product.name}-{size}GB" for size in product.memory_gb)
    return (canonical,)


def known_memory_gb(canonical: str) -> tuple[int, ...]:
    """Per-GPU memory sizes (GB as marketed) of a canonical model; empty if unknown."""
    base, _, suffix = canonical.rpartition("-")
    if base and suffix.endswith("GB") and base in PRODUCTS and PRODUCTS[base].variants:
        return (int(suffix[:-2]),) if suffix[:-2].isdigit() else ()
    product = PRODUCTS.get(canonical)
    return product.memory_gb if product is not None else ()


def per_gpu_memory_gb(listed_gb: float, gpu_count: int, model: str) -> float:
    """Per-GPU memory from a listed value that is either per GPU or the total of all ``gpu_count`` GPUs.

    The value is taken as the total when it divided by the count matches a known size of ``model`` (any spelling,
    e.g. ``NVIDIA A100``) and the value itself does not; otherwise it is taken as per GPU.
    """
    sizes = known_memory_gb(normalize_gpu_model(model))
    if gpu_count <= 1 or not sizes:
        return listed_gb
    if _match_size(sizes, listed_gb) is None and _match_size(sizes, listed_gb / gpu_count) is not None:
        return listed_gb / gpu_count
    return listed_gb


KNOWN_GPU_MODELS: tuple[str, ...] = tuple(
    sorted(name for p in _PRODUCTS for name in ([f"{p.name}-{s}GB" for s in p.memory_gb] if p.variants else [p.name]))
)
"""Every canonical name of a known product (memory variants spelled out)."""
