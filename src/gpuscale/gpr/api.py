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
``/docs`` and ``/healthz`` are public. Bodies are read and checked here, completely, before anything is stored
(:func:`gpuscale.core.gpr.parse_gpr_spec`: unknown fields, types, Unicode, lengths, bounds, catalog); every error
is JSON, ``{"detail": [{"loc": ["body", field], "msg": ...}]}`` for 422, ``{"detail": text}`` otherwise, and
responses are ASCII-escaped JSON. With ``allowed_hosts`` set, a request whose ``Host`` is not in it gets 421.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from gpuscale.core.gpr import (
    CLUSTER_NAME_MAX,
    IGNORED_EGS_FIELDS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    SPEC_ALIASES,
    SPEC_FIELDS,
    FieldError,
    GprState,
    GprValidationError,
    IllegalTransition,
    clean_text,
    format_duration,
    gpr_to_dict,
    parse_gpr_spec,
    spec_json_schema,
    unknown_field_errors,
)
from gpuscale.errors import InputError, short_repr
from gpuscale.gpr.manager import GprManager
from gpuscale.gpr.spec_model import GprSpecIn as GprSpecIn
from gpuscale.gpr.store import CorruptGpr, GprNotFound

API_PREFIX = "/api/v1"
MAX_BODY_BYTES = 1024 * 1024
"""Largest accepted request body (413 beyond)."""
GPR_ID_MAX = 64
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""``Host`` names accepted when the server is bound to a loopback address."""
_BEARER = HTTPBearer(auto_error=False, description="GPUSCALE_API_TOKEN")
log = logging.getLogger("gpuscale.gpr.api")

Scope = MutableMapping[str, Any]
AsgiMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[AsgiMessage]]
Send = Callable[[AsgiMessage], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SPEC_SCHEMA: dict[str, Any] = spec_json_schema("openapi31", rest=True)
"""OpenAPI schema of a create body, from the one GPR spec schema (what the parser enforces; catalog checks come on
top). :data:`GprSpecIn` is the same schema as a pydantic model."""
_SPEC_PROPERTIES: dict[str, Any] = SPEC_SCHEMA["properties"]
UPDATE_FIELDS = ("gprId", "priority", "earlyRelease")
_GPR_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": GPR_ID_MAX}
UPDATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["gprId"],
    "additionalProperties": False,
    "properties": {
        "gprId": _GPR_ID_SCHEMA,
        "priority": {"type": "integer", "minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX},
        "earlyRelease": {"type": "boolean"},
    },
}
WAITTIME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"gprId": _GPR_ID_SCHEMA, **_SPEC_PROPERTIES},
}


class ProblemOut(BaseModel):
    """One field-level problem."""

    loc: list[str]
    msg: str
    type: str = "value_error"


class ProblemsOut(BaseModel):
    """A 422 answer: every problem found."""

    detail: list[ProblemOut]


class MessageOut(BaseModel):
    """Any other error answer."""

    detail: str


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": MessageOut, "description": "Missing or invalid bearer token"},
    421: {"model": MessageOut, "description": "Host header not allowed (loopback bind)"},
    422: {"model": ProblemsOut, "description": "Invalid input, one entry per field"},
    500: {"model": MessageOut, "description": "Internal error (logged), or a stored row that cannot be decoded"},
}
"""Error shapes, documented on every ``/api`` route of the OpenAPI document."""


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: any Python string, even one holding a lone surrogate, encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _problems(errors: list[tuple[str, str]], status: int = 422) -> JSONResponse:
    return AsciiJSONResponse(
        {"detail": [{"loc": ["body", f] if f else ["body"], "msg": m, "type": "value_error"} for f, m in errors]},
        status_code=status,
    )


def _message(status: int, text: str) -> JSONResponse:
    return AsciiJSONResponse({"detail": text}, status_code=status)


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def _read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; :class:`GprValidationError` for anything else."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise GprValidationError([FieldError("", f"body is {len(raw):,} bytes; at most {MAX_BODY_BYTES:,}")])
    try:
        data = json.loads(raw)
    except RecursionError:
        raise GprValidationError([FieldError("", "JSON is nested too deeply")]) from None
    except ValueError as exc:  # bad JSON, bad UTF-8, or an integer too long to convert
        raise GprValidationError([FieldError("", f"not valid JSON: {str(exc)[:120]}")]) from None
    if not isinstance(data, dict):
        raise GprValidationError([FieldError("", f"must be a JSON object, got {type(data).__name__}")])
    return data


def _gpr_id(value: object, field: str = "gprId") -> str:
    if not isinstance(value, str) or not value:
        raise GprValidationError([FieldError(field, f"must be a non-empty string, got {short_repr(value, 30)}")])
    bad = clean_text(value)
    if bad or len(value) > GPR_ID_MAX:
        reason = bad or f"must be at most {GPR_ID_MAX} characters, got {len(value):,}"
        raise GprValidationError([FieldError(field, reason)])
    return value


def _host_name(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` -> ``::1``), lower-cased."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class _Guard:
    """Outermost ASGI layer: refuses foreign ``Host`` headers (421) and turns any unhandled exception into a JSON
    500 that keeps the connection open (the exception is logged, never sent)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Collection[str] | None) -> None:
        self.app = app
        self.allowed = None if allowed_hosts is None else frozenset(_host_name(h) for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.allowed is not None:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if _host_name(host) not in self.allowed:
                resp = _message(421, f"Host {short_repr(host, 40)} is not allowed; see --allowed-host")
                await resp(scope, receive, send)
                return
        started = False

        async def tracking_send(message: AsgiMessage) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # the last line of defence: one JSON 500, logged without the request body
            log.error("%s %s failed: %s", scope.get("method"), scope.get("path"), type(exc).__name__, exc_info=exc)
            if not started:
                await _message(500, "internal error; the server log has details")(scope, receive, send)


def create_app(manager: GprManager, *, token: str, allowed_hosts: Collection[str] | None = None) -> FastAPI:
    """The FastAPI application serving ``manager``; every ``/api`` route requires bearer ``token``.

    ``allowed_hosts``: when given, requests whose ``Host`` header names another host are refused with 421 (the
    server passes :data:`LOOPBACK_HOSTS` plus any ``--allowed-host`` when bound to a loopback address).
    """
    if not token:
        raise InputError("empty API token", where="GPUSCALE_API_TOKEN", fix="set a long random secret")
    app = FastAPI(
        title="gpuscale GPU Provisioning Requests",
        version="v1",
        description="EGS-compatible GPU Provisioning Request API of gpuscale.",
        default_response_class=AsciiJSONResponse,
    )
    expected = token.encode()

    def authorize(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        if creds is None or not hmac.compare_digest(creds.credentials.encode("utf-8", "replace"), expected):
            raise HTTPException(401, "missing or invalid bearer token", headers={"WWW-Authenticate": "Bearer"})

    router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(authorize)], responses=ERROR_RESPONSES)
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

    @app.exception_handler(CorruptGpr)
    def _corrupt(_: Request, exc: CorruptGpr) -> JSONResponse:
        log.error("%s", exc)
        return _message(500, str(exc))

    @app.exception_handler(InputError)
    def _bad(_: Request, exc: InputError) -> JSONResponse:
        return _problems([(exc.where, str(exc))])

    @app.exception_handler(RequestValidationError)
    def _params(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [(str(e.get("loc", ["", ""])[-1])[:40], str(e.get("msg", ""))[:200]) for e in exc.errors()[:10]]
        return AsciiJSONResponse(
            {"detail": [{"loc": ["query", f], "msg": m, "type": "value_error"} for f, m in errors]}, status_code=422
        )

    @app.exception_handler(HTTPException)
    def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return AsciiJSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.post("/gpr", status_code=201, summary="Create a GPR", openapi_extra=_body(SPEC_SCHEMA))
    async def create(request: Request) -> dict[str, Any]:
        data = await _read_json(request)
        gpr = await run_in_threadpool(manager.create, data)
        return gpr_to_dict(gpr, now=now())

    @router.get("/gpr", summary="Get one GPR")
    def get(gprId: Annotated[str, Query(min_length=1, max_length=GPR_ID_MAX)]) -> dict[str, Any]:
        return gpr_to_dict(manager.get(_gpr_id(gprId)), now=now())

    @router.get("/gpr/list", summary="List GPRs")
    def list_(
        status: Annotated[GprState | None, Query()] = None,
        clusterName: Annotated[str | None, Query(max_length=CLUSTER_NAME_MAX)] = None,
    ) -> dict[str, Any]:
        stored, bad = manager.store.list_checked([status] if status else None)
        for err in bad:
            log.error("%s", err)
        gprs = [s.gpr for s in stored]
        if clusterName:
            gprs = [g for g in gprs if g.spec.cluster_name == clusterName]
        t = now()
        return {
            "items": [gpr_to_dict(g, now=t) for g in gprs],
            "count": len(gprs),
            "errors": [{"gprId": e.gpr_id, "error": e.reason} for e in bad],
        }

    @router.put("/gpr", summary="Change priority or release early", openapi_extra=_body(UPDATE_SCHEMA))
    async def update(request: Request) -> dict[str, Any]:
        data = await _read_json(request)
        errors = unknown_field_errors(data, UPDATE_FIELDS)
        gpr_id = data.get("gprId")
        priority, early = data.get("priority"), data.get("earlyRelease")
        if priority is not None and (
            isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX
        ):
            errors.append(
                FieldError("priority", f"must be an integer {PRIORITY_MIN}-{PRIORITY_MAX}, got {short_repr(priority)}")
            )
        if early is not None and not isinstance(early, bool):
            errors.append(FieldError("earlyRelease", f"must be true or false, got {short_repr(early, 30)}"))
        if errors:
            raise GprValidationError(errors)
        gid = _gpr_id(gpr_id)
        if priority is None and not early:
            raise GprValidationError([FieldError("priority", "give priority and/or earlyRelease: true")])
        return await run_in_threadpool(_update, gid, priority, bool(early))

    def _update(gpr_id: str, priority: int | None, early: bool) -> dict[str, Any]:
        gpr = manager.get(gpr_id)
        if priority is not None:
            gpr = manager.set_priority(gpr_id, priority)
        if early:
            gpr = manager.release(gpr_id)
        return gpr_to_dict(gpr, now=now())

    @router.delete("/gpr", summary="Cancel a queued GPR")
    def delete(gprId: Annotated[str, Query(min_length=1, max_length=GPR_ID_MAX)]) -> dict[str, Any]:
        return gpr_to_dict(manager.cancel(_gpr_id(gprId)), now=now())

    @router.post("/gpr/waittime", summary="Estimate the wait time", openapi_extra=_body(WAITTIME_SCHEMA))
    async def waittime(request: Request) -> dict[str, Any]:
        data = await _read_json(request)
        gpr_id = data.pop("gprId", None)
        if gpr_id is not None:
            errors = unknown_field_errors(data, (*SPEC_FIELDS, *SPEC_ALIASES, *IGNORED_EGS_FIELDS))
            if errors:
                raise GprValidationError(errors)
            return await run_in_threadpool(_wait_for, _gpr_id(gpr_id))
        if "requestName" not in data and "gprName" not in data:
            data["requestName"] = "wait-time-probe"
        data.setdefault("exitDuration", "1h")
        spec = parse_gpr_spec(data, manager.catalog, max_exit_s=manager.max_exit_s)
        seconds = await run_in_threadpool(manager.estimate_wait, spec)
        return _wait_body(None, None, seconds)

    def _wait_for(gpr_id: str) -> dict[str, Any]:
        gpr = manager.get(gpr_id)
        return _wait_body(gpr.gpr_id, gpr.state.value, manager.wait_for(gpr_id))

    app.include_router(router)
    return _wrap(app, allowed_hosts)


def _wrap(app: FastAPI, allowed_hosts: Collection[str] | None) -> FastAPI:
    """Install :class:`_Guard` as the outermost layer (``app`` stays a FastAPI for ``openapi()`` and tests)."""
    app.add_middleware(_Guard, allowed_hosts=allowed_hosts)
    return app


def _wait_body(gpr_id: str | None, state: str | None, seconds: float | None) -> dict[str, Any]:
    return {
        "gprId": gpr_id,
        "provisioningStatus": state,
        "estimatedWaitTime": None if seconds is None else format_duration(seconds),
        "estimatedWaitTimeSeconds": seconds,
        "servable": seconds is not None,
    }
