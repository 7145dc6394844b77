"""REST API for GPRs, mirroring Avesha EGS (FastAPI).

===========================  ===================================================================
``POST /api/v1/gpr``         create a GPR from an EGS spec (201; 422 with field-level messages)
``GET /api/v1/gpr?gprId=``   one GPR (404 if unknown)
``GET /api/v1/gpr/list``     every GPR (``?status=Queued`` and ``?clusterName=`` filter)
``PUT /api/v1/gpr``          ``{"gprId", "priority"?, "earlyRelease"?: true}`` (409 when not allowed)
``DELETE /api/v1/gpr?gprId=`` cancel a queued GPR (409 otherwise)
``POST /api/v1/gpr/waittime`` ``{"gprId"}`` or an EGS spec: estimated wait before nodes are ready
===========================  ===================================================================

Every ``/api`` route needs ``Authorization: Bearer <GPUSCALE_API_TOKEN>`` (401 otherwise). ``/openapi.json``,
``/docs`` and ``/healthz`` are public. Bad input never reaches the queue: types are checked by the request models
and everything else (durations, ranges, GPU shape against the catalog) by :func:`gpuscale.core.gpr.parse_gpr_spec`;
both answer 422 in FastAPI's ``{"detail": [{"loc": ["body", field], "msg": ...}]}`` form.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from gpuscale.core.gpr import (
    FieldError,
    GprState,
    GprValidationError,
    IllegalTransition,
    format_duration,
    gpr_to_dict,
    parse_gpr_spec,
)
from gpuscale.errors import InputError
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.store import GprNotFound

API_PREFIX = "/api/v1"
_BEARER = HTTPBearer(auto_error=False, description="GPUSCALE_API_TOKEN")


class WorkloadSelector(BaseModel):
    """Pods whose labels match ``matchLabels`` are the GPR's workloads."""

    model_config = ConfigDict(strict=True, extra="forbid")
    matchLabels: dict[str, str] = Field(default_factory=dict)


class GprSpecIn(BaseModel):
    """A GPU Provisioning Request (EGS field names). Durations like ``0d8h0m``, ``8h`` or ``30m``."""

    model_config = ConfigDict(strict=True, extra="allow")
    requestName: str = Field(description="A name for the request")
    clusterName: str | None = None
    instanceType: str | None = Field(None, description="A catalog instance type, e.g. g2-gpu-rtx4000a4-s")
    gpuShape: str | None = Field(None, description="GPU model, e.g. RTX4000-Ada (any spelling)")
    enableAutoGpuSelection: bool | None = None
    numberOfGPUs: int | None = Field(None, description="GPUs per node (default 1)")
    numberOfGPUNodes: int | None = Field(None, description="Nodes (default 1)")
    memoryPerGpu: int | None = Field(None, description="Minimum GPU memory per GPU, GB")
    priority: int | None = Field(None, description="1-300, default 101; low 1-100, medium 101-200, high 201-300")
    exitDuration: str = Field(description="How long the nodes are held once ready, e.g. 0d8h0m")
    idleTimeOutDuration: str | None = None
    enforceIdleTimeOut: bool | None = None
    earlyRelease: bool | None = None
    enableEviction: bool | None = Field(None, description="Higher-priority GPRs may evict this one")
    requeueOnFailure: bool | None = None
    enableDynamicNodePool: bool | None = None
    workloadSelector: WorkloadSelector | dict[str, str] | None = None


class GprUpdateIn(BaseModel):
    """Change a GPR's priority and/or release it early."""

    model_config = ConfigDict(strict=True)
    gprId: str
    priority: int | None = None
    earlyRelease: bool | None = None


class WaitTimeIn(GprSpecIn):
    """Either ``gprId`` of an existing GPR, or a spec to estimate for."""

    requestName: str = "wait-time-probe"
    exitDuration: str = "1h"
    gprId: str | None = None


def _problems(errors: list[tuple[str, str]], status: int = 422) -> JSONResponse:
    return JSONResponse(
        {"detail": [{"loc": ["body", f] if f else ["body"], "msg": m, "type": "value_error"} for f, m in errors]},
        status_code=status,
    )


def _message(status: int, text: str) -> JSONResponse:
    return JSONResponse({"detail": text}, status_code=status)


def _dump(model: BaseModel) -> dict[str, Any]:
    data = model.model_dump(exclude_unset=True)
    if isinstance(data.get("workloadSelector"), dict) and "matchLabels" in data["workloadSelector"]:
        data["workloadSelector"] = {"matchLabels": data["workloadSelector"]["matchLabels"]}
    return data


def create_app(manager: GprManager, *, token: str) -> FastAPI:
    """The FastAPI application serving ``manager``; every ``/api`` route requires bearer ``token``."""
    if not token:
        raise InputError("empty API token", where="GPUSCALE_API_TOKEN", fix="set a long random secret")
    app = FastAPI(
        title="gpuscale GPU Provisioning Requests",
        version="v1",
        description="EGS-compatible GPU Provisioning Request API of gpuscale.",
    )
    expected = token.encode()

    def authorize(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        if creds is None or not hmac.compare_digest(creds.credentials.encode(), expected):
            raise HTTPException(401, "missing or invalid bearer token", headers={"WWW-Authenticate": "Bearer"})

    router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(authorize)])
    now = manager.clock.now

    @app.exception_handler(GprValidationError)
    def _invalid(_: Request, exc: GprValidationError) -> JSONResponse:
        return _problems([(e.field, e.message) for e in exc.errors])

    @app.exception_handler(IllegalTransition)
    def _conflict(_: Request, exc: IllegalTransition) -> JSONResponse:
        return _message(409, str(exc))

    @app.exception_handler(GprNotFound)
    def _missing(_: Request, exc: GprNotFound) -> JSONResponse:
        return _message(404, str(exc))

    @app.exception_handler(InputError)
    def _bad(_: Request, exc: InputError) -> JSONResponse:
        return _problems([(exc.where, str(exc))])

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.post("/gpr", status_code=201, summary="Create a GPR")
    def create(body: GprSpecIn) -> dict[str, Any]:
        return gpr_to_dict(manager.create(_dump(body)), now=now())

    @router.get("/gpr", summary="Get one GPR")
    def get(gprId: Annotated[str, Query(min_length=1)]) -> dict[str, Any]:
        return gpr_to_dict(manager.get(gprId), now=now())

    @router.get("/gpr/list", summary="List GPRs")
    def list_(
        status: Annotated[GprState | None, Query()] = None,
        clusterName: Annotated[str | None, Query()] = None,
    ) -> dict[str, Any]:
        gprs = manager.list_gprs([status] if status else None)
        if clusterName:
            gprs = [g for g in gprs if g.spec.cluster_name == clusterName]
        t = now()
        return {"items": [gpr_to_dict(g, now=t) for g in gprs], "count": len(gprs)}

    @router.put("/gpr", summary="Change priority or release early")
    def update(body: GprUpdateIn) -> dict[str, Any]:
        if body.priority is None and not body.earlyRelease:
            raise GprValidationError([FieldError("priority", "give priority and/or earlyRelease: true")])
        gpr = manager.get(body.gprId)
        if body.priority is not None:
            gpr = manager.set_priority(body.gprId, body.priority)
        if body.earlyRelease:
            gpr = manager.release(body.gprId)
        return gpr_to_dict(gpr, now=now())

    @router.delete("/gpr", summary="Cancel a queued GPR")
    def delete(gprId: Annotated[str, Query(min_length=1)]) -> dict[str, Any]:
        return gpr_to_dict(manager.cancel(gprId), now=now())

    @router.post("/gpr/waittime", summary="Estimate the wait time")
    def waittime(body: WaitTimeIn) -> dict[str, Any]:
        data = _dump(body)
        gpr_id = data.pop("gprId", None)
        if gpr_id:
            gpr = manager.get(gpr_id)
            seconds = manager.wait_for(gpr_id)
        else:
            data.setdefault("requestName", "wait-time-probe")
            data.setdefault("exitDuration", "1h")
            seconds = manager.estimate_wait(parse_gpr_spec(data, manager.catalog))
            gpr = None
        return {
            "gprId": gpr.gpr_id if gpr else None,
            "provisioningStatus": gpr.state.value if gpr else None,
            "estimatedWaitTime": None if seconds is None else format_duration(seconds),
            "estimatedWaitTimeSeconds": seconds,
            "servable": seconds is not None,
        }

    app.include_router(router)
    return app
