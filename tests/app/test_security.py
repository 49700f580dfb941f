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


# ---- GET /auth: the sign-in check that needs neither the model nor the jobs database ---------


def test_auth_answers_204_for_the_right_token_and_401_otherwise(keyed, client):
    assert keyed.get("/auth").status_code == 401
    assert keyed.get("/auth", headers={"Authorization": "Bearer wrong"}).status_code == 401
    right = keyed.get("/auth", headers={"Authorization": "Bearer s3cret"})
    assert right.status_code == 204 and right.content == b""
    assert client.get("/auth").status_code == 204  # no key configured: everyone may


def test_auth_works_while_the_jobs_database_and_the_model_are_down(make_app, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    app = make_app(api_key="s3cret", db=str(blocker / "jobs.db"), model=str(tmp_path / "no-model"))
    with serving(app, wait_ready=False) as client:
        assert not app.state.engine.wait_ready(60)
        auth = {"Authorization": "Bearer s3cret"}
        assert client.get("/evaluate", params={"limit": 1}, headers=auth).status_code == 503
        assert client.get("/ready").status_code == 503
        assert client.get("/auth", headers=auth).status_code == 204
        assert client.get("/auth", headers={"Authorization": "Bearer s3cre"}).status_code == 401


# ---- an API key the operator mistyped is refused at start ---------------------------------


@pytest.mark.parametrize("key", ["s3cret\n", " s3cret", "s3cret\t", "\u00a0s3cret", "  "])
def test_an_api_key_with_white_space_at_either_end_is_refused_without_showing_it(key):
    from pydantic import ValidationError

    from app.settings import Settings

    with pytest.raises(ValidationError) as caught:
        Settings(api_key=key)
    assert "BART_OPT_API_KEY has white space at its start or end" in str(caught.value)
    assert "s3cret" not in str(caught.value) and repr(key) not in str(caught.value)


def test_the_service_does_not_start_on_such_a_key_and_says_why(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "BART_OPT_API_KEY": "s3cret-value\n", "BART_OPT_MODEL": str(tmp_path / "unused")}
    run = subprocess.run([sys.executable, "-m", "bart_opt.cli", "serve", "--port", "0"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "BART_OPT_API_KEY has white space" in run.stderr and "s3cret-value" not in run.stderr + run.stdout
