"""ASGI middleware: request ids and HTTP metrics, and the request-body size limit."""

from __future__ import annotations

import re
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import REQUEST_ID_HEADER, error_response
from app.metrics import Metrics

_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestContextMiddleware:
    """Gives each request an id (the client's ``X-Request-ID`` when sane, else a new one),
    echoes it in the response header, and counts the request in the HTTP metrics by route
    template (``/summarize``; ``unmatched`` for paths no route knows)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get(REQUEST_ID_HEADER, "")
        request_id = given if _CLIENT_REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500  # what the client gets if the app raises before answering
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                if REQUEST_ID_HEADER not in headers:
                    headers.append(REQUEST_ID_HEADER, request_id)
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.in_flight.dec()
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route=route, method=scope["method"], status=str(status)).inc()
            self.metrics.latency.labels(route=route).observe(time.perf_counter() - started)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body passes the limit (rendered as a 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {limit} bytes (MAX_REQUEST_BYTES)")


class BodyLimitMiddleware:
    """Refuses request bodies over `max_bytes` with 413.

    A ``Content-Length`` over the limit is answered before the app runs; a body sent without
    one (chunked) is counted as it streams in and refused as soon as it passes the limit,
    before the rest is read.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            error = BodyTooLarge(self.max_bytes)
            response = error_response(Request(scope), 413, "payload_too_large", error.detail)
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counting_receive, send)
