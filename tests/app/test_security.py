"""API key: 401 on every route but /health and /ready when BART_OPT_API_KEY is set."""

from __future__ import annotations

import pytest

from tests.app.helpers import FAST, serving


@pytest.fixture(scope="module")
def keyed(demo_checkpoint):
    from app.main import create_app
    from app.settings import Settings

    with serving(create_app(Settings(model=demo_checkpoint, api_key="s3cret"))) as client:
        yield client


@pytest.mark.parametrize(
    ("headers", "words"),
    [({}, "missing bearer token"), ({"Authorization": "Basic s3cret"}, "missing bearer token"),
     ({"Authorization": "Bearer wrong"}, "wrong bearer token")],
)  # fmt: skip
@pytest.mark.parametrize(("method", "path"), [("post", "/summarize"), ("get", "/metrics")])
def test_protected_routes_need_the_bearer_token(keyed, headers, words, method, path):
    response = getattr(keyed, method)(path, headers=headers, **({"json": {"texts": ["a"]}} if method == "post" else {}))
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "unauthorized" and words in error["message"]


def test_right_token_passes(keyed):
    auth = {"Authorization": "Bearer s3cret"}
    assert keyed.post("/summarize", json={"texts": ["a text"], "generation": FAST}, headers=auth).status_code == 200
    assert keyed.get("/metrics", headers=auth).status_code == 200


def test_health_and_ready_stay_open(keyed):
    assert keyed.get("/health").status_code == 200
    assert keyed.get("/ready").status_code == 200


def test_no_key_configured_means_no_check(client):
    assert client.get("/metrics").status_code == 200
