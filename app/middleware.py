"""ASGI middleware: security headers, the Host check, request ids and HTTP metrics, the catch-all 500,
time limits, the body size limit.

Order, outermost first (``app.main``): `SecurityHeadersMiddleware` (every answer the app sends carries
them, 500s included), `RequestContextMiddleware` (every answer, 500s included, has an id and is counted),
`app.hosts.HostCheckMiddleware` (a refused Host reaches nothing further), `CatchAllMiddleware`,
`TimeLimitMiddleware`, `BodyLimitMiddleware`.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid

import anyio
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import REQUEST_ID_HEADER, error_response, internal_error
from app.metrics import Metrics

logger = logging.getLogger("app")

_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Metric labels take these methods as they are and any other as "other": a client must not be able
# to create a new time series (memory that is never freed) with every made-up method name.
_METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# One policy for every answer: the dashboard's page needs no more than its own scripts, styles and API,
# and a JSON or NDJSON answer needs nothing at all. Nothing may frame any of it.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}
NO_STORE = "no-store"  # the default Cache-Control: answers carry data that may be private (jobs, summaries)


class SecurityHeadersMiddleware:
    """Puts `SECURITY_HEADERS` on every answer, and ``Cache-Control: no-store`` unless the route chose
    another (the dashboard's files, which hold no data, say ``no-cache``). JSON and NDJSON bodies,
    errors, 404s for unknown paths and assets: all of them, in this one place."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                headers.setdefault("Cache-Control", NO_STORE)
            await send(message)

        await self.app(scope, receive, send_with_headers)


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
            method = scope["method"] if scope["method"] in _METHOD_LABELS else "other"
            self.metrics.requests.labels(route=route, method=method, status=str(status)).inc()
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


class CatchAllMiddleware:
    """Answers any unexpected exception with the uniform 500 and logs it once, with its traceback.

    Starlette's own handler answers and then re-raises, so the server logged the error a second
    time and dropped the connection without ``Connection: close``: a pooled client's next request
    failed. Here the exception stops, and the connection stays usable. An exception after the
    response has started cannot be answered any more; it goes on to the server, which logs it and
    closes the connection (the only way left to tell the client that the body is incomplete).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as error:
            if started:
                raise
            request = Request(scope)
            logger.error("unhandled error in %s %s (request %s)", request.method, request.url.path,
                         request.state.request_id, exc_info=error)
            await internal_error(request)(scope, receive, send)


class BodyTimeout(HTTPException):
    """Raised from ``receive`` when the body is not complete in time (a 408 that closes the connection)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"the request body did not arrive within {seconds:g} s (BODY_TIMEOUT_S)",
                         headers={"Connection": "close"})


class TimeLimitMiddleware:
    """Two clocks per request, both from its arrival.

    - The body must be complete within `body_timeout` seconds, else 408 and the connection is
      closed (a client trickling its body in cannot hold a connection and a handler for long).
    - The answer must start within `request_timeout` seconds, else the handler is cancelled
      (which cancels the request's work: see `app.summarize.service`) and the answer is 504. Once the
      answer has started (a streamed body), the deadline no longer applies.

    An answer that starts before the body was read completely says ``Connection: close``, so the
    server does not wait for the rest of it.
    """

    def __init__(self, app: ASGIApp, request_timeout: float, body_timeout: float) -> None:
        self.app = app
        self.request_timeout = request_timeout
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrived = anyio.current_time()
        headers = Headers(scope=scope)
        body_done = headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers
        started = False
        deadline = anyio.CancelScope(deadline=arrived + self.request_timeout)

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            with anyio.move_on_after(arrived + self.body_timeout - anyio.current_time()) as wait:
                message = await receive()
            if wait.cancelled_caught:
                raise BodyTimeout(self.body_timeout)
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                deadline.deadline = math.inf
                if not body_done:
                    MutableHeaders(scope=message)["Connection"] = "close"
            await send(message)

        with deadline:
            await self.app(scope, timed_receive, tracking_send)
        if deadline.cancelled_caught and not started:
            request = Request(scope)
            logger.warning("%s %s (request %s) passed its deadline of %g s; its work was cancelled",
                           request.method, request.url.path, request.state.request_id, self.request_timeout)
            message = (f"the request did not complete within {self.request_timeout:g} s (REQUEST_TIMEOUT_S); "
                       "its work was cancelled")
            closing = {} if body_done else {"Connection": "close"}
            await error_response(request, 504, "timeout", message, headers=closing)(scope, receive, send)
