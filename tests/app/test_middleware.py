"""Request ids, security headers and the body limit, for requests that never reach a route too."""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import time

from app.middleware import SECURITY_HEADERS
from tests.app.helpers import FAST, live_server, serving


def test_each_request_gets_an_id_and_odd_client_ids_are_replaced(client):
    first = client.get("/health").headers["x-request-id"]
    second = client.get("/health").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", first) and first != second
    assert client.get("/health", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    odd = client.get("/health", headers={"X-Request-ID": "x" * 65}).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", odd)


def test_declared_oversize_body_is_refused_before_routing(make_app):
    app = make_app(max_request_bytes=10)
    with serving(app, wait_ready=False) as client:
        response = client.post("/nowhere", content=b"x" * 11)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert response.json()["error"]["request_id"] == response.headers["x-request-id"]


# ---- on a real server: the connection after a 500, slow bodies ----------------------------


def test_an_unexpected_error_is_one_500_logged_once_and_the_connection_stays_usable(make_app, caplog):
    app = make_app()
    with live_server(app) as (host, port), caplog.at_level(logging.INFO):
        def explode(*args, **kwargs):
            raise RuntimeError("secret detail in /srv/private/path")

        app.state.engine.summarizer.summarize_groups = explode
        connection = http.client.HTTPConnection(host, port, timeout=60)
        body = json.dumps({"texts": ["anything"], "generation": FAST})
        connection.request("POST", "/summarize", body, {"Content-Type": "application/json"})
        failed = connection.getresponse()
        failed_body = failed.read().decode()
        socket_used = connection.sock
        connection.request("GET", "/health")  # the same pooled connection, at once
        after = connection.getresponse()
        after.read()
        reused = connection.sock is socket_used
        connection.close()
    assert failed.status == 500 and failed.getheader("connection") != "close"
    error = json.loads(failed_body)["error"]
    assert error["code"] == "internal_error" and error["request_id"] == failed.getheader("x-request-id")
    for secret in ("secret", "/srv", "RuntimeError", "Traceback"):
        assert secret not in failed_body
    assert after.status == 200 and reused
    logged = [record for record in caplog.records if record.exc_info or "Exception in ASGI" in record.getMessage()]
    assert len(logged) == 1 and error["request_id"] in logged[0].getMessage()
    assert "secret detail" in str(logged[0].exc_info[1])


def test_a_body_sent_too_slowly_is_a_408_and_the_connection_is_closed(make_app):
    app = make_app(body_timeout_s=0.5)
    with live_server(app) as (host, port), socket.create_connection((host, port), timeout=30) as client:
        started = time.monotonic()
        client.sendall(b"POST /summarize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 100\r\n\r\n{\"texts\": [")  # and then nothing more
        answer = b""
        while chunk := client.recv(65536):  # until the server closes the connection
            answer += chunk
        waited = time.monotonic() - started
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert 0.5 <= waited < 10


def test_made_up_methods_share_one_metric_label(client):
    for method in ("BREW", "PROPFIND", "X-ANYTHING"):
        assert client.request(method, "/summarize").status_code == 405
    exposition = client.app.state.metrics.exposition().decode()
    assert 'method="other",route="/summarize",status="405"} 3.0' in exposition
    assert "BREW" not in exposition


def test_every_answer_carries_the_security_headers_and_data_is_not_stored(client):
    job = client.post("/evaluate", json={"dataset": {"records": [{"text": "one two three", "reference": "one"}]},
                                         "generation": FAST})
    answers = {
        "JSON": client.get("/health"),
        "job JSON": client.get(job.headers["location"]),
        "NDJSON": client.get(job.headers["location"] + "/predictions"),
        "404": client.get("/nowhere"),
        "unknown asset": client.get("/dashboard/nope.js"),
        "405": client.put("/summarize"),
        "400": client.post("/summarize", content=b"{", headers={"Content-Type": "application/json"}),
        "422": client.post("/summarize", json={"texts": []}),
    }
    assert answers["NDJSON"].headers["content-type"] == "application/x-ndjson"
    for kind, response in answers.items():
        headers = response.headers
        assert "frame-ancestors 'none'" in headers.get("content-security-policy", ""), kind
        assert headers.get("x-content-type-options") == "nosniff", kind
        for name, value in SECURITY_HEADERS.items():
            assert headers.get(name) == value, (kind, name)
        assert headers.get("cache-control") == "no-store", kind
    page, script = client.get("/"), client.get("/dashboard/main.js")
    for response in (page, script):  # the page and its files hold no data: cacheable, revalidated
        assert response.status_code == 200 and response.headers["cache-control"] == "no-cache"
        assert response.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]


def test_the_uniform_500_carries_the_security_headers_too(make_app):
    app = make_app()
    with serving(app) as client:
        def explode(*args, **kwargs):
            raise RuntimeError("boom")

        app.state.engine.summarizer.summarize_groups = explode
        failed = client.post("/summarize", json={"texts": ["anything"], "generation": FAST})
    assert failed.status_code == 500
    assert failed.headers["x-content-type-options"] == "nosniff" and failed.headers["cache-control"] == "no-store"
