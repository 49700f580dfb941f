"""The shared error body: field paths, and FastAPI's own 404/405 in the same shape."""

from __future__ import annotations

import pytest

from app.errors import field_path


@pytest.mark.parametrize(
    ("loc", "path"),
    [(("body", "texts", 2), "texts[2]"), (("body", "generation", "num_beams"), "generation.num_beams"),
     (("query", "format"), "format"), (("body",), "body"), ((), "body")],
)  # fmt: skip
def test_field_path(loc, path):
    assert field_path(loc) == path


def test_unknown_route_and_wrong_method_use_the_error_shape(client):
    missing = client.get("/summarise")
    wrong = client.get("/summarize")
    assert missing.status_code == 404 and wrong.status_code == 405
    assert missing.json()["error"] == {
        "code": "not_found", "message": "no route for /summarise", "request_id": missing.headers["x-request-id"],
    }  # fmt: skip
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert "GET" in wrong.json()["error"]["message"]
