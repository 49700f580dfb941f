"""Request ids and the body limit for requests that never reach a route."""

from __future__ import annotations

import re

from tests.app.helpers import serving


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
