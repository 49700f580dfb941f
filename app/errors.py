"""One error body for every 4xx and 5xx the service sends.

::

    {"error": {"code": "invalid_request", "message": "texts: must contain at least one text",
               "field": "texts", "request_id": "3f2c..."}}

``code`` is a stable machine-readable string, ``message`` a sentence for people, ``field``
(only when one input is at fault) the path of that input (``texts[2]``,
``generation.num_beams``) and ``request_id`` the id echoed in the ``X-Request-ID`` header.
Validation errors add ``details``: every problem found, each ``{"field", "message"}``.
Nothing else is ever sent to the client: an unexpected exception becomes a 500 with
code ``internal_error`` and the traceback goes to the server log only.

Codes: 400 ``bad_request``, 401 ``unauthorized``, 404 ``not_found``, 405
``method_not_allowed``, 413 ``payload_too_large``, 422 ``invalid_request``, 429
``queue_full`` (with ``Retry-After``), 500 ``internal_error``, 503 ``not_ready`` /
``model_load_failed`` / ``shutting_down`` (with ``Retry-After``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bart_opt.errors import InvalidRequest

logger = logging.getLogger("app")

REQUEST_ID_HEADER = "X-Request-ID"

# Codes for the HTTPExceptions that FastAPI/Starlette and the body limit raise themselves;
# the service's own errors are ApiErrors that carry their code.
_CODES_BY_STATUS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


class ApiError(Exception):
    """An error the service answers on purpose, rendered in the shared error shape."""

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
    if kind == "extra_forbidden":
        return {"field": field_path(loc), "message": "unknown field"}
    if loc == ("body",) and kind in ("model_attributes_type", "dict_type"):
        return {"field": "body", "message": "must be a JSON object sent with Content-Type: application/json"}
    return {"field": field_path(loc), "message": str(error.get("msg", "invalid value")).removeprefix("Value error, ")}


async def _on_api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(request, exc.status, exc.code, exc.message, field=exc.field, headers=exc.headers)


async def _on_invalid_request(request: Request, exc: InvalidRequest) -> JSONResponse:
    details = [{"field": exc.field, "message": exc.message}]
    return error_response(request, 422, "invalid_request", str(exc), field=exc.field, details=details)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    details = [_validation_problem(error) for error in exc.errors()]
    first = details[0] if details else {"field": "body", "message": "invalid request"}
    return error_response(
        request, 422, "invalid_request", f"{first['field']}: {first['message']}", field=first["field"], details=details
    )


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _CODES_BY_STATUS.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 404:
        message = f"no route for {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return error_response(request, exc.status_code, code, message, headers=exc.headers)


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    message = "internal server error; the server log has the details under this request id"
    return error_response(request, 500, "internal_error", message)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI or the service raises through :func:`error_response`."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(InvalidRequest, _on_invalid_request)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)
