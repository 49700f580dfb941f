"""The header deadline and the connection cap (`app.connections`), on a real uvicorn server."""

from __future__ import annotations

import json
import socket
import time

import httpx

from tests.app.helpers import live_server


def _open(host: str, port: int, first: bytes = b"") -> socket.socket:
    connection = socket.create_connection((host, port), timeout=30)
    if first:
        connection.sendall(first)
    return connection


def _closed_within(connection: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed `connection` within `seconds`, what it sent before)."""
    connection.settimeout(seconds)
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except TimeoutError:
        return False, received
    except ConnectionResetError:
        pass
    return True, received


def test_connections_that_do_not_finish_their_headers_are_closed_by_the_deadline(make_app):
    app = make_app(header_timeout_s=1.0)
    with live_server(app) as (host, port):
        silent = [_open(host, port) for _ in range(5)]
        trickling = [_open(host, port, b"GET /health HTTP/1.1\r\nHo") for _ in range(5)]
        started = time.monotonic()
        with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:
            while time.monotonic() - started < 1.5:  # one byte every 0.25 s: never a complete header
                for connection in trickling:
                    try:
                        connection.sendall(b"s")
                    except OSError:
                        pass
                assert client.get("/health").status_code == 200
                time.sleep(0.25)
        results = [_closed_within(connection, 10) for connection in silent + trickling]
        waited = time.monotonic() - started
        for connection in silent + trickling:
            connection.close()
    assert all(closed for closed, _ in results) and waited < 12
    assert all(received == b"" for _, received in results[:5])  # nothing came: only closed
    for _, received in results[5:]:  # part of a request came: a 408 in the service's error shape, then closed
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower(), head
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert b"x-content-type-options: nosniff" in head.lower()


def test_past_the_cap_slow_connections_make_room_and_health_stays_200(make_app):
    app = make_app(header_timeout_s=60.0, max_connections=20)
    with live_server(app) as (host, port):
        # A request in progress (its body still to come) is never closed to make room.
        body_pending = _open(host, port, b"POST /summarize HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                         b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n")
        slow = [_open(host, port, b"GET /health HTTP/1.1\r\n") for _ in range(60)]
        with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:
            statuses = [client.get("/health").status_code for _ in range(10)]
            client.headers["Connection"] = "close"
            fresh = [httpx.get(f"http://{host}:{port}/health", timeout=30).status_code for _ in range(10)]
        still_open = sum(not _closed_within(connection, 0.05)[0] for connection in slow)
        body_pending.sendall(b"{}")
        answer = body_pending.recv(65536)
        for connection in slow + [body_pending]:
            connection.close()
    assert statuses == [200] * 10 and fresh == [200] * 10
    assert still_open <= 20  # the cap held: the oldest slow connections were closed for the newcomers
    assert answer.startswith(b"HTTP/1.1 422")  # the request in progress was kept, and answered
