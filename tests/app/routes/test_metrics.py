"""GET /metrics: Prometheus series and the JSON view."""

from __future__ import annotations

import functools

from app.device.engine import load_summarizer
from tests.app.helpers import FAST, articles, samples, serving, value


def test_prometheus_series_follow_the_requests(make_app):
    app = make_app()
    texts = articles(3, seed=10)
    with serving(app) as client:
        body = client.post("/summarize", json={"texts": texts, "generation": FAST}).json()
        client.get("/does-not-exist")
        response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    m = samples(response.text)
    assert value(m, "bart_opt_requests_total", route="/summarize", method="POST", status="200") == 1
    assert value(m, "bart_opt_requests_total", route="unmatched", method="GET", status="404") == 1
    assert value(m, "bart_opt_request_seconds_count", route="/summarize") == 1
    assert value(m, "bart_opt_request_peak_memory_bytes_count") == 1
    assert value(m, "bart_opt_request_peak_memory_bytes_sum") == body["memory"]["peak_bytes"]
    assert value(m, "bart_opt_batch_requests_count") == 1
    assert value(m, "bart_opt_batch_texts_sum") == 3
    assert value(m, "bart_opt_input_tokens_total") == sum(item["input_tokens"] for item in body["items"])
    assert value(m, "bart_opt_output_tokens_total") == sum(item["output_tokens"] for item in body["items"])
    assert value(m, "bart_opt_padding_avoided_tokens_total") > 0
    assert value(m, "bart_opt_oom_splits_total") == 0
    assert value(m, "bart_opt_queue_size", kind="interactive") == 0
    assert value(m, "bart_opt_queue_size", kind="job") == 0
    allocated = value(m, "bart_opt_device_memory_allocated_bytes")
    assert allocated > 0
    assert value(m, "bart_opt_device_memory_peak_bytes") == allocated + body["memory"]["batch"]["peak_bytes"]
    assert value(m, "bart_opt_process_rss_bytes") > 0
    assert value(m, "bart_opt_requests_in_flight") == 1  # the scrape itself


def test_out_of_memory_splits_are_counted(make_app):
    def oom_on_pairs(positions):
        if len(positions) > 1:
            raise MemoryError("simulated device OOM")

    load = functools.partial(load_summarizer, oom_errors=(MemoryError,), before_model_call=oom_on_pairs)
    app = make_app(load=load)
    with serving(app) as client:
        response = client.post("/summarize", json={"texts": articles(2, seed=11), "generation": FAST})
        m = samples(client.get("/metrics").text)
    assert response.status_code == 200 and all(response.json()["summaries"])
    assert value(m, "bart_opt_oom_splits_total") == 1


def test_json_view_has_memory_stats_queue_and_a_bounded_request_log(make_app):
    app = make_app(recent_logs=2, queue_size=5)
    with serving(app) as client:
        ids = [client.post("/summarize", json={"texts": [t], "generation": FAST}).json()["request_id"]
               for t in articles(3, seed=12)]  # fmt: skip
        snapshot = client.get("/metrics", params={"format": "json"}).json()
        bad_format = client.get("/metrics", params={"format": "xml"})
    memory = snapshot["memory"]
    assert memory["device"] == "cpu"
    assert 0 < memory["allocated_bytes"] < memory["peak_bytes"] and memory["rss_bytes"] > 0
    assert memory["weights_bytes"] == app.state.engine.summarizer.model.weights_bytes() == memory["allocated_bytes"]
    assert snapshot["queue"] == {"waiting": {"interactive": 0, "job": 0}, "capacity": 5, "state": "ready"}
    assert snapshot["requests"] == {"in_flight": 1}  # the scrape itself
    summarize = snapshot["latency"]["/summarize"]
    assert summarize["count"] == 3 and 0 < summarize["p50"] <= summarize["p90"] <= summarize["p99"]
    assert [log["request_id"] for log in snapshot["recent"]] == ids[1:]
    for log in snapshot["recent"]:
        assert log["memory"]["peak_bytes"] > 0 and log["timing"]["total"] > 0 and log["texts"] == 1
    assert bad_format.status_code == 422 and bad_format.json()["error"]["field"] == "format"


def test_the_json_view_has_the_documented_shape(client):
    from app.schemas import MetricsSnapshot

    client.post("/summarize", json={"texts": ["a text"], "generation": FAST})
    body = client.get("/metrics", params={"format": "json"}).json()
    assert MetricsSnapshot.model_validate(body).model_dump() == body
