"""Connections that never finish their headers: a deadline for them, and a cap on open connections.

Uvicorn (0.54) bounds a request's body only through the app (``BART_OPT_BODY_TIMEOUT_S``) and an
idle keep-alive connection (``timeout_keep_alive``, 5 s), but nothing bounds the headers: its
keep-alive timer is armed only after a response and cancelled by the next byte, so a client that
sends one header byte every few seconds holds its connection, and a descriptor, forever. Its
``limit_concurrency`` does not help: once that many connections are open it answers 503 to every
new request, ``/health`` included, so a few hundred such clients would still fail the probes.

`GuardedH11Protocol` is uvicorn's h11 protocol with both bounds added (``bart-opt serve`` runs it;
`app.server.server_config`). h11 because it exposes its parser's state (``their_state``):

- **header deadline** (``BART_OPT_HEADER_TIMEOUT_S``, 10 s): a connection's request must have
  all its headers within that time of the connection opening, or of the first byte of the next
  request on a kept-alive connection. Past it the connection is closed, after a 408 in the
  service's error shape when some bytes had come (none came: it is only closed). Headers are also
  bounded in size (h11's 16 KiB, uvicorn's ``h11_max_incomplete_event_size``).
- **connection cap** (``BART_OPT_MAX_CONNECTIONS``, 512): a connection beyond the cap closes the
  oldest connection that is not a request in progress (still waiting for its headers, or idle
  between requests), so a flood of slow clients cannot keep a prompt one (a probe) out; when every
  open connection is a request in progress, the new connection itself is closed. Below the
  descriptor limit, ``/health`` never reads ``descriptors_exhausted`` because of connections.

Under plain uvicorn, ``uvicorn app.main:app --http app.connections:GuardedH11Protocol`` runs it with
the defaults above; or put a proxy with its own header timeout in front.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.errors import REQUEST_ID_HEADER
from app.middleware import NO_STORE, SECURITY_HEADERS
from app.settings import Settings

logger = logging.getLogger("app.connections")

_LOG_EVERY_S = 60.0


class GuardedH11Protocol(H11Protocol):
    """Uvicorn's h11 protocol with a header deadline and a connection cap (see the module docstring).
    `configured` makes the class with other values than the settings' defaults."""

    header_timeout_s: float = Settings.model_fields["header_timeout_s"].default
    max_connections: int = Settings.model_fields["max_connections"].default
    _closed = {"late": 0, "evicted": 0, "refused": 0}  # since the last log line, for every connection of the class
    _logged_at = 0.0

    @classmethod
    def configured(cls, header_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
        """A subclass with these bounds, for ``uvicorn.Config(http=...)``."""
        return type(cls.__name__, (cls,), {"header_timeout_s": header_timeout_s, "max_connections": max_connections,
                                           "_closed": dict.fromkeys(cls._closed, 0)})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._since = self.loop.time()
        self._partial = False
        self._arm()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._waiting():  # part of a request's headers: the clock runs from its first byte
            if self._deadline is None:
                self._since = self.loop.time()
                self._arm()
            self._partial = True
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # ---- the deadline ------------------------------------------------------------------------

    def _waiting(self) -> bool:
        """Whether no request is in progress here: its headers are still to come (or the connection idles)."""
        return self.conn.their_state is h11.IDLE

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self._waiting():
            return
        if self._partial:
            self.transport.write(self._timeout_response())
        self._close("late")

    def _timeout_response(self) -> bytes:
        request_id = uuid.uuid4().hex
        message = (f"the request headers did not arrive within {self.header_timeout_s:g} s "
                   "(BART_OPT_HEADER_TIMEOUT_S); the connection is closed")
        body = json.dumps({"error": {"code": "request_timeout", "message": message, "request_id": request_id}})
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close",
                   REQUEST_ID_HEADER: request_id, **SECURITY_HEADERS, "Cache-Control": NO_STORE}
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        return f"HTTP/1.1 408 Request Timeout\r\n{head}\r\n{body}".encode()

    # ---- the cap -----------------------------------------------------------------------------

    def _make_room(self) -> None:
        """Close the oldest connection without a request in progress, else this new one."""
        others = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)
                  and not c.transport.is_closing() and c._waiting()]
        if not others:
            self._close("refused")
            return
        oldest = min(others, key=lambda c: (c._deadline is None, c._since))  # slow headers first, then idle ones
        oldest._close("evicted")

    def _close(self, why: str) -> None:
        self._disarm()
        self.transport.close()
        counts = type(self)._closed
        counts[why] += 1
        now = self.loop.time()
        if now - type(self)._logged_at >= _LOG_EVERY_S:
            type(self)._logged_at = now
            logger.warning(
                "closed %d connection(s) that sent no complete headers within %g s (BART_OPT_HEADER_TIMEOUT_S), "
                "%d to make room and refused %d beyond BART_OPT_MAX_CONNECTIONS=%d (counts since the last such line)",
                counts["late"], self.header_timeout_s, counts["evicted"], counts["refused"], self.max_connections)
            for key in counts:
                counts[key] = 0
