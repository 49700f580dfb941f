"""GET /health and GET /ready."""

from __future__ import annotations

from tests.app.helpers import serving


def test_health_and_ready_once_loaded(client):
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "model": client.app.state.settings.model, "device": "cpu"}


def test_model_that_fails_to_load_keeps_ready_at_503_with_the_reason(make_app, tmp_path):
    app = make_app(model=str(tmp_path / "no-such-checkpoint"))
    with serving(app, wait_ready=False) as client:
        assert not app.state.service.worker.wait_ready(60)
        health = client.get("/health")
        ready = client.get("/ready")
        summarize = client.post("/summarize", json={"texts": ["a"]})
    assert health.status_code == 200
    assert ready.status_code == 503 and summarize.status_code == 503
    error = ready.json()["error"]
    assert error["code"] == "model_load_failed"
    assert "no-such-checkpoint" in error["message"]
    assert ready.headers["retry-after"]


def test_ready_is_503_after_shutdown_began(make_app):
    app = make_app()
    with serving(app) as client:
        app.state.service.worker.stop(10)
        ready = client.get("/ready")
        summarize = client.post("/summarize", json={"texts": ["a"]})
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "shutting_down"
    assert summarize.status_code == 503
