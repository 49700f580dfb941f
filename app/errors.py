"""One error body for every 4xx and 5xx the service sends.

::

    {"error": {"code": "invalid_request", "message": "texts: must contain at least one text",
               "field": "texts", "request_id": "3f2c..."}}

``code`` is a stable machine-readable string, ``message`` a sentence for people, ``field``
(only when one input is at fault) the path of that input (``texts[2]``,
``generation.num_beams``) and ``request_id`` the id echoed in the ``X-Request-ID`` header.
Validation errors add ``details``: every problem found, each ``{"field", "message"}``.
Nothing else is ever sent to the client: an unexpected exception becomes a 500 with
code ``internal_error`` (see `app.middleware.CatchAllMiddleware`) and the traceback goes to
the server log only, once; no message carries a server path or an exception class name.

Codes: 400 ``bad_request`` (a body that is not JSON), 400 ``host_not_allowed`` (`app.hosts`), 401
``unauthorized``, 404 ``not_found``, 405 ``method_not_allowed`` (with ``Allow``), 408
``request_timeout`` (the body, or the headers, `app.connections`, were not sent in time; the
connection is closed), 413 ``payload_too_large``, 415 ``unsupported_media_type`` (a
body not sent as ``application/json``), 422 ``invalid_request``, 429 ``queue_full`` (with
``Retry-After``), 500 ``internal_error``, 503 ``not_ready`` / ``model_load_failed`` /
``shutting_down`` (with ``Retry-After``) / ``worker_dead``, 504 ``timeout`` (the request's
deadline passed; its work was cancelled).

The domain's errors (`app.domain_errors`: jobs and summarize speak no HTTP) get their status here
and only here, in `STATUS_OF`; their ``retry_after`` becomes the ``Retry-After`` header.

`document_errors` puts the same shape, and the statuses every operation can answer, into the
OpenAPI document.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.domain_errors import (Busy, ClientGone, Conflict, NotFound, Refused, ServiceError, SourceUnavailable,
                               Unavailable)
from bart_opt.errors import InvalidRequest

logger = logging.getLogger("app")

REQUEST_ID_HEADER = "X-Request-ID"

# Codes for the HTTPExceptions that FastAPI/Starlette and the middleware raise themselves;
# the domain's errors carry their code (`STATUS_OF`), the routes' own are ApiErrors that carry theirs.
_CODES_BY_STATUS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
                    413: "payload_too_large"}


STATUS_OF: dict[type[ServiceError], int] = {
    NotFound: 404,
    Conflict: 409,
    Refused: 422,
    Busy: 429,
    ClientGone: 499,  # nginx's "client closed request": nobody reads it, the log does
    SourceUnavailable: 502,
    Unavailable: 503,  # DamagedStore too, without Retry-After
}
"""The status of each kind of domain error (a subclass takes its nearest listed ancestor's)."""


def status_of(error: ServiceError) -> int:
    """The status code `error` is answered with (`STATUS_OF`)."""
    return next(STATUS_OF[kind] for kind in type(error).__mro__ if kind in STATUS_OF)


class Problem(BaseModel):
    """One problem with the request."""

    field: str
    message: str


class ErrorInfo(BaseModel):
    """What went wrong (see the module docstring of `app.errors` for the codes)."""

    code: str
    message: str
    field: str | None = None
    details: list[Problem] | None = None
    request_id: str


class ErrorBody(BaseModel):
    """The body of every 4xx and 5xx answer."""

    error: ErrorInfo


class ApiError(Exception):
    """An error the HTTP layer (routes, security) answers on purpose with its own status, rendered in the
    shared error shape; the domain raises `app.domain_errors` instead."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def request_id_of(request: Request) -> str:
    """The id given to this request by the request-context middleware ('' outside it)."""
    return getattr(request.state, "request_id", "")


def error_response(
    request: Request,
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    details: Sequence[dict] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """Build the JSON error response (body shape in the module docstring)."""
    request_id = request_id_of(request)
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    if details:
        error["details"] = list(details)
    error["request_id"] = request_id
    all_headers = {REQUEST_ID_HEADER: request_id, **(headers or {})}
    return JSONResponse({"error": error}, status_code=status, headers=all_headers)


def field_path(loc: Sequence[str | int]) -> str:
    """``("body", "texts", 2)`` -> ``"texts[2]"``; ``("body", "generation", "top_k")`` -> ``"generation.top_k"``."""
    path = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def _validation_problem(error: dict) -> dict:
    """One pydantic/FastAPI validation error as ``{"field", "message"}``."""
    loc, kind = tuple(error.get("loc", ())), error.get("type")
    if kind == "json_invalid":
        position = f" at character {loc[1]}" if len(loc) > 1 else ""
        reason = error.get("ctx", {}).get("error", "decode error")
        return {"field": "body", "message": f"not valid JSON ({reason}{position})"}
    if loc == ("body",) and kind == "missing":
        return {"field": "body", "message": "is empty; send a JSON object"}
    if kind == "extra_forbidden":
        return {"field": field_path(loc), "message": "unknown field"}
    if kind in ("model_type", "model_attributes_type", "dict_type"):  # pydantic names the model class here
        return {"field": field_path(loc), "message": "must be a JSON object"}
    return {"field": field_path(loc), "message": str(error.get("msg", "invalid value")).removeprefix("Value error, ")}


async def _on_api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(request, exc.status, exc.code, exc.message, field=exc.field, headers=exc.headers)


async def _on_service_error(request: Request, exc: ServiceError) -> JSONResponse:
    headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    return error_response(request, status_of(exc), exc.code, exc.message, field=exc.field, headers=headers)


async def _on_invalid_request(request: Request, exc: InvalidRequest) -> JSONResponse:
    details = [{"field": exc.field, "message": exc.message}]
    return error_response(request, 422, "invalid_request", str(exc), field=exc.field, details=details)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(error.get("type") == "json_invalid" for error in errors):
        problem = _validation_problem(next(error for error in errors if error.get("type") == "json_invalid"))
        return error_response(request, 400, "bad_request", f"body: {problem['message']}", field="body")
    if isinstance(exc.body, (bytes, bytearray)):  # FastAPI parses JSON only when the Content-Type says so
        message = "body: send it as JSON with Content-Type: application/json"
        return error_response(request, 415, "unsupported_media_type", message, field="body")
    details = [_validation_problem(error) for error in errors]
    first = details[0] if details else {"field": "body", "message": "invalid request"}
    return error_response(
        request, 422, "invalid_request", f"{first['field']}: {first['message']}", field=first["field"], details=details
    )


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _CODES_BY_STATUS.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        message = f"no route for {request.url.path}"
    elif exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
        message = f"method {request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
    return error_response(request, exc.status_code, code, message, headers=headers)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this request's path, found by asking the routes (Starlette's
    own 405 names only the first route that matched the path: ``PUT /evaluate`` listed POST, not GET)."""
    routes = request.app.router.routes
    return [
        method for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]  # fmt: skip


def internal_error(request: Request) -> JSONResponse:
    """The 500 answered for an unexpected exception (logged by the caller, never shown)."""
    message = "internal server error; the server log has the details under this request id"
    return error_response(request, 500, "internal_error", message)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI or the service raises on purpose through :func:`error_response`.

    Unexpected exceptions are not handled here: Starlette's handler for ``Exception`` answers and
    then re-raises, so the server logged them a second time and dropped the connection.
    `app.middleware.CatchAllMiddleware` answers them instead.
    """
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(InvalidRequest, _on_invalid_request)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)


# ---- the OpenAPI document --------------------------------------------------------------

_DESCRIPTIONS = {
    "400": "Body is not valid JSON",
    "401": "BART_OPT_API_KEY is set and the bearer token is missing or wrong",
    "408": "Body not received within BODY_TIMEOUT_S; the connection is closed",
    "413": "Body larger than MAX_REQUEST_BYTES",
    "415": "Body not sent as application/json",
    "422": "Invalid request; `error.field` names the input",
    "500": "Unexpected server error (details only in the server log)",
    "503": "Cannot serve now: model loading or failed to load, device worker dead, shutting down",
    "504": "Deadline REQUEST_TIMEOUT_S passed before the answer; the request's work was cancelled",
}


def document_errors(app: FastAPI) -> None:
    """Make ``app.openapi()`` describe the errors as they are sent.

    Every operation gets the statuses any request may meet (500, 503, 504; 401 when it declares
    security; 422 when it takes parameters; 400, 408, 413, 415 and 422 when it takes a body), and
    every 4xx/5xx response, FastAPI's default 422 included, the `ErrorBody` schema.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                                 description=app.description, routes=app.routes)
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            _, definitions = models_json_schema([(ErrorBody, "serialization")],
                                                ref_template="#/components/schemas/{model}")
            schemas.update(definitions["$defs"])
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    _document_operation(operation)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _document_operation(operation: dict[str, Any]) -> None:
    statuses = ["500", "503", "504"]
    if operation.get("security"):
        statuses.append("401")
    if operation.get("parameters"):
        statuses.append("422")
    if "requestBody" in operation:
        statuses += ["400", "408", "413", "415", "422"]
    responses = operation.setdefault("responses", {})
    for status in statuses:
        responses.setdefault(status, {"description": _DESCRIPTIONS[status]})
    if responses.get("422", {}).get("description") == "Validation Error":  # FastAPI's default
        responses["422"]["description"] = _DESCRIPTIONS["422"]
    for status, response in responses.items():
        if status[0] in "45":
            response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
