"""GPR validation against a catalog: which instance types and offerings can serve a spec, the catalog checks and the
cost estimate."""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from typing import Any

from gpuscale.core.gpr.spec import DEFAULT_MAX_EXIT_S, FieldError, GprSpec, GprValidationError, spec_from_dict
from gpuscale.core.gpus import gpu_model_variants, normalize_gpu_model
from gpuscale.core.model import (
    CapacityType,
    Catalog,
    InstanceType,
    Offering,
    OfferingKey,
)
from gpuscale.errors import InputError


def allowed_models(spec: GprSpec) -> frozenset[str] | None:
    """Canonical GPU models the spec accepts (None: any model)."""
    if spec.gpu_shape and not spec.enable_auto_gpu_selection:
        return frozenset(gpu_model_variants(spec.gpu_shape))
    return None


def memory_ok(spec: GprSpec, gpu_memory_mib: int) -> bool:
    return spec.memory_per_gpu is None or gpu_memory_mib >= spec.memory_per_gpu * 1024 * 0.95


def on_demand_price(it: InstanceType) -> float:
    o = _on_demand(it)
    return o.hourly_price if o is not None else math.inf


def _on_demand(it: InstanceType) -> Offering | None:
    avail = [o for o in it.offerings if o.available and o.capacity_type is CapacityType.ON_DEMAND]
    if avail:
        return min(avail, key=lambda o: (o.hourly_price, o.zone))
    return it.cheapest()


def candidate_types(spec: GprSpec, catalog: Catalog) -> tuple[InstanceType, ...]:
    """Catalog instance types that can serve one node of ``spec``, best first (preferred shape, price, GPUs, name).

    With ``instanceType`` only that type; with ``gpuShape`` the types of that model (its memory variants too); with
    ``enableAutoGpuSelection`` every GPU type with enough GPUs and memory, the ``gpuShape`` ones first.
    """
    if spec.instance_type:
        it = catalog.by_name().get(spec.instance_type)
        ok = it is not None and it.gpu_count >= spec.number_of_gpus and memory_ok(spec, it.gpu_memory_mib)
        return (it,) if ok and it is not None else ()
    preferred = _preferred_models(spec)
    allowed = allowed_models(spec)
    if allowed is None and not spec.enable_auto_gpu_selection:
        return ()
    out = [
        it
        for it in catalog.instance_types
        if it.gpu_count >= spec.number_of_gpus
        and it.gpu_model
        and (allowed is None or it.gpu_model in allowed)
        and memory_ok(spec, it.gpu_memory_mib)
        and _on_demand(it) is not None
    ]
    out.sort(key=lambda it: (it.gpu_model not in preferred, on_demand_price(it), it.gpu_count, it.name))
    return tuple(out)


def _preferred_models(spec: GprSpec) -> frozenset[str]:
    if not spec.gpu_shape:
        return frozenset()
    try:
        return frozenset(gpu_model_variants(spec.gpu_shape))
    except InputError:
        return frozenset()


def offering_key(it: InstanceType, o: Offering) -> OfferingKey:
    return OfferingKey(it.name, o.zone, o.capacity_type)


def candidate_offerings(
    spec: GprSpec, catalog: Catalog, skip: Collection[OfferingKey] = frozenset()
) -> tuple[tuple[InstanceType, Offering], ...]:
    """Every (instance type, on-demand offering) that can serve one node of ``spec``, best first, without the
    offerings in ``skip`` (those that recently reported insufficient capacity).

    The order is that of :func:`candidate_types` (preferred shape, price, GPUs, name) applied per offering, with the
    zone last, so after a capacity error the next entry is the next zone of the same type or the next type. A type
    without an available on-demand offering contributes its cheapest offering, as the launch would use it.
    """
    preferred = _preferred_models(spec)
    rows: list[tuple[tuple[bool, float, int, str, str], InstanceType, Offering]] = []
    for it in candidate_types(spec, catalog):
        offers = [o for o in it.offerings if o.available and o.capacity_type is CapacityType.ON_DEMAND]
        if not offers:
            cheapest = it.cheapest()
            offers = [cheapest] if cheapest is not None else []
        for o in offers:
            if offering_key(it, o) not in skip:
                rows.append(((it.gpu_model not in preferred, o.hourly_price, it.gpu_count, it.name, o.zone), it, o))
    rows.sort(key=lambda r: r[0])
    return tuple((it, o) for _, it, o in rows)


def validate_spec(spec: GprSpec, catalog: Catalog) -> list[FieldError]:
    """Field errors of ``spec`` against ``catalog``: unknown instance type or GPU shape, too many GPUs per node,
    too much memory per GPU, or no shape given at all. Empty when the spec can be served by the catalog."""
    errors: list[FieldError] = []
    models = sorted({it.gpu_model for it in catalog.instance_types if it.gpu_model})
    types = catalog.by_name()
    if spec.instance_type:
        it = types.get(spec.instance_type)
        if it is None:
            close = difflib.get_close_matches(spec.instance_type, list(types), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            errors.append(FieldError("instanceType", f"unknown instance type {spec.instance_type!r}{hint}"))
            return errors
        if not it.gpu_count:
            errors.append(FieldError("instanceType", f"{it.name} has no GPUs"))
        elif it.gpu_count < spec.number_of_gpus:
            errors.append(FieldError("numberOfGPUs", f"{it.name} has only {it.gpu_count} GPUs per node"))
        if spec.gpu_shape:
            try:
                if it.gpu_model not in gpu_model_variants(spec.gpu_shape):
                    errors.append(
                        FieldError("gpuShape", f"{spec.gpu_shape!r} does not match {it.name} ({it.gpu_model})")
                    )
            except InputError as exc:
                errors.append(FieldError("gpuShape", str(exc)))
        if not memory_ok(spec, it.gpu_memory_mib):
            errors.append(
                FieldError("memoryPerGpu", f"{it.name} has {it.gpu_memory_mib // 1024} GB per GPU, asked for more")
            )
        return errors
    if not spec.gpu_shape and not spec.enable_auto_gpu_selection:
        errors.append(FieldError("gpuShape", "give gpuShape or instanceType, or set enableAutoGpuSelection: true"))
        return errors
    if spec.gpu_shape:
        try:
            variants = gpu_model_variants(spec.gpu_shape)
        except InputError as exc:
            errors.append(FieldError("gpuShape", str(exc)))
            return errors
        shape_types = [it for it in catalog.instance_types if it.gpu_model in variants]
        if not shape_types and not spec.enable_auto_gpu_selection:
            known = ", ".join(models) or "none"
            errors.append(
                FieldError(
                    "gpuShape",
                    f"unknown GPU shape {spec.gpu_shape!r} ({normalize_gpu_model(spec.gpu_shape)}) in catalog "
                    f"{catalog.name}; available shapes: {known}",
                )
            )
            return errors
    if candidate_types(spec, catalog):
        return errors
    scope = [
        it
        for it in catalog.instance_types
        if it.gpu_model and (allowed_models(spec) is None or it.gpu_model in (allowed_models(spec) or ()))
    ]
    max_gpus = max((it.gpu_count for it in scope), default=0)
    if spec.number_of_gpus > max_gpus:
        errors.append(FieldError("numberOfGPUs", f"at most {max_gpus} GPUs per node are available for this shape"))
    else:
        max_mem = max((it.gpu_memory_mib for it in scope), default=0) // 1024
        errors.append(FieldError("memoryPerGpu", f"at most {max_mem} GB per GPU are available for this shape"))
    return errors


def parse_gpr_spec(data: Mapping[str, Any], catalog: Catalog, *, max_exit_s: int = DEFAULT_MAX_EXIT_S) -> GprSpec:
    """Parse and validate an EGS spec dict against ``catalog`` (``exitDuration`` at most ``max_exit_s``); raises
    :class:`GprValidationError` with every field-level problem."""
    spec = spec_from_dict(data, max_exit_s=max_exit_s)
    errors = validate_spec(spec, catalog)
    if errors:
        raise GprValidationError(errors)
    return spec


def estimate_cost(spec: GprSpec, catalog: Catalog) -> float:
    """Estimated cost (currency of the catalog) of ``spec`` on its cheapest candidate type for the full exit
    duration; 0.0 when the catalog has no candidate."""
    cands = candidate_types(spec, catalog)
    if not cands:
        return 0.0
    return round(on_demand_price(cands[0]) * spec.number_of_gpu_nodes * spec.exit_duration_s / 3600.0, 4)
