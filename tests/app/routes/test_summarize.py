"""POST /summarize on the demo model: answers, every error, queueing, disconnects, concurrency."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import pytest

from app.device.engine import load_summarizer
from app.settings import Settings, get_settings
from tests.app.helpers import FAST, Gate, articles, async_serving, samples, serving, until, value


def summarize(client, texts, references=None, generation=FAST, **kwargs):
    body = {"texts": texts, "generation": generation}
    if references is not None:
        body["references"] = references
    return client.post("/summarize", json=body, **kwargs)


# ---- answers ---------------------------------------------------------------------------


def test_summaries_rouge_items_memory_and_timing_match_the_pipeline(client, direct):
    texts = articles(3, seed=1)
    references = ["police said the city was on fire", "the team lost at home", "officials found water"]
    response = summarize(client, texts, references)
    assert response.status_code == 200, response.text
    body = response.json()
    expected = direct.summarize(texts, references, **FAST)
    assert body["summaries"] == expected.summaries
    assert len(set(body["summaries"])) == 3
    assert body["rouge"] == expected.rouge
    for item, want in zip(body["items"], expected.items):
        assert item["input_tokens"] == want["input_tokens"] > 0
        assert item["output_tokens"] == want["output_tokens"] > 0
        assert item["rouge"] == want["rouge"]
        assert item["truncated"] is False and item["error"] is None
    memory = body["memory"]
    assert memory["device"] == "cpu" and memory["peak_source"] == "live_tensors"
    assert memory["peak_bytes"] > 0 and memory["rss_bytes"] > 0
    assert memory["share"] == 1.0 and memory["batch"]["requests"] == 1 and memory["batch"]["texts"] == 3
    assert memory["batch"]["peak_bytes"] == memory["peak_bytes"]
    assert {phase["name"] for phase in memory["phases"]} >= {"encode"}
    timing = body["timing"]
    assert set(timing) == {"queue", "tokenize", "generate", "decode", "score", "total"}
    assert all(value >= 0 for value in timing.values())
    assert timing["generate"] > 0 and timing["total"] >= timing["generate"]
    assert body["model"] == Path(client.app.state.settings.model).name  # no server path in answers
    assert body["request_id"] == response.headers["x-request-id"]


def test_without_references_there_is_no_rouge(client):
    body = summarize(client, articles(1, seed=2)).json()
    assert body["rouge"] is None and body["items"][0]["rouge"] is None


@pytest.mark.parametrize("blank", ["", "   ", "\n\t"])
def test_an_empty_reference_is_refused_naming_it_as_jobs_and_the_cli_refuse_it(client, blank):
    texts = articles(2, seed=5)
    refused = summarize(client, texts, ["the city voted on its budget", blank])
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["field"] == "references[1]" and error["code"] == "invalid_request"
    assert error["message"].startswith("references[1]: reference is empty (or only white space)")
    assert summarize(client, texts, ["the city voted on its budget", "the team lost"]).status_code == 200


def test_generation_overrides_reach_the_model(client, direct):
    text = articles(1, seed=3)
    short = {"num_beams": 1, "max_length": 4, "min_length": 1}
    body = summarize(client, text, generation=short).json()
    assert body["summaries"] == direct.summarize(text, **short).summaries
    assert body["items"][0]["output_tokens"] <= 3


def test_client_request_id_is_echoed(client):
    response = summarize(client, articles(1, seed=4), headers={"X-Request-ID": "my-id-1"})
    assert response.headers["x-request-id"] == "my-id-1"
    assert response.json()["request_id"] == "my-id-1"


# ---- validation errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"texts": []}, "texts", "at least one text"),
        ({"texts": ["an article", "   "]}, "texts[1]", "empty"),
        ({"texts": ["a", "b"], "references": ["only one"]}, "references", "1 references for 2 texts"),
        ({"texts": ["a"], "generation": {"top_k": 5}}, "generation.top_k", "unknown field"),
        ({"texts": ["a"], "generation": {"num_beams": 0}}, "generation.num_beams", "must be >= 1, got 0"),
        ({"texts": ["a"], "generation": {"num_beams": 17}}, "generation.num_beams", "above the limit of 16"),
        ({"texts": ["a"], "generation": {"num_beams": "4"}}, "generation.num_beams", "valid integer"),
        ({"texts": ["a"], "generation": {"num_beams": True}}, "generation.num_beams", "valid integer"),
        ({"texts": ["a"], "generation": {"min_length": 9, "max_length": 3}}, "generation.min_length",
         "min_length 9 is above max_length 3"),
        # The demo checkpoint's own defaults are min_length 8 and max_length 40.
        ({"texts": ["a"], "generation": {"max_length": 5}}, "generation.max_length",
         "min_length 8 is above max_length 5"),
        ({"texts": ["a"], "generation": {"min_length": 41}}, "generation.min_length",
         "min_length 41 is above max_length 40"),
        ({"texts": ["a"], "generation": {"max_length": 1, "min_length": 0}}, "generation.max_length",
         "leaves no room for a summary"),
        ({"texts": ["a"], "generation": {"max_new_tokens": 2000}}, "generation.max_new_tokens",
         "the model has 1024 (max_position_embeddings)"),
        ({"texts": ["a"], "generation": {"length_penalty": 200}}, "generation.length_penalty",
         "outside [-10, 10]"),
        ({"texts": ["a"] * 65}, "texts", "more than MAX_TEXTS (64)"),
        # The request that held the device for minutes: over the cost budget, refused up front.
        ({"texts": ["word " * 2000] * 64, "generation": {"num_beams": 16, "min_length": 1024, "max_length": 1024}},
         "generation", "64 texts x 16 beams x 1023 new tokens = 1047552 is more than MAX_REQUEST_COST (65536)"),
        ({"text": ["a"]}, "texts", "Field required"),
        ({"texts": "just one string"}, "texts", "valid list"),
        # Strict types: nothing is coerced.
        ({"texts": [1]}, "texts[0]", "valid string"),
        ({"texts": ["a"], "references": [None]}, "references[0]", "valid string"),
        ({"texts": ["a"], "generation": []}, "generation", "must be a JSON object"),
        ({"texts": ["a"], "generation": {"early_stopping": "yes"}}, "generation.early_stopping",
         'must be true, false or "never"'),
        ({"texts": ["a"], "generation": {"length_penalty": "2"}}, "generation.length_penalty", "valid number"),
        ({"texts": ["a"], "generation": {"num_beams": 4.0}}, "generation.num_beams", "valid integer"),
    ],
)
def test_invalid_requests_get_422_naming_the_field(client, body, field, words):
    response = client.post("/summarize", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["field"] == field
    assert words in error["message"]
    assert error["request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize(
    ("content", "field"),
    [(b'{"texts": ["fine", "b \\ud800 c"]}', "texts[1]"),
     (b'{"texts": ["fine"], "references": ["\\udfff"]}', "references[0]")],
)  # fmt: skip
def test_a_lone_surrogate_is_a_422_naming_the_text(client, content, field):
    # JSON may escape a lone surrogate; it is not Unicode text and no tokenizer can take it.
    response = client.post("/summarize", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["field"] == field and ") is a lone surrogate" in error["message"], error
    assert client.post("/summarize", json={"texts": ["fine"], "generation": FAST}).status_code == 200


@pytest.mark.parametrize(
    ("content", "content_type", "status", "words"),
    [(b'{"texts": [', "application/json", 400, "body: not valid JSON (Expecting value at character 11)"),
     (b'\xff\xfe{', "application/json", 400, "error parsing the body"),
     (b'{"texts": ["a"]}', "text/plain", 415, "body: send it as JSON with Content-Type: application/json"),
     (b'{"texts": ["a"]}', None, 415, "Content-Type: application/json"),
     (b'[{"texts": ["a"]}]', "application/json", 422, "body: must be a JSON object"),
     (b'', "application/json", 422, "body: is empty; send a JSON object"),
     (b'[' * 100_000 + b']' * 100_000, "application/json", 400, "error parsing the body"),
     (b'{"texts": ["a"], "generation": {"num_beams": ' + b'9' * 5000 + b'}}', "application/json", 400,
      "error parsing the body"),
     (b'{"texts": ["a"], "generation": {"length_penalty": NaN}}', "application/json", 422, "finite number")],
)  # fmt: skip
def test_body_that_is_not_a_json_object_is_a_4xx(client, content, content_type, status, words):
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post("/summarize", content=content, headers=headers)
    assert response.status_code == status
    assert words in response.json()["error"]["message"]


def test_settings_dependency_override_applies_per_request_limits(make_app, demo_checkpoint):
    app = make_app()
    app.dependency_overrides[get_settings] = lambda: Settings(model=demo_checkpoint, max_texts=1)
    with serving(app) as client:
        response = summarize(client, articles(2))
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "texts: 2 texts is more than MAX_TEXTS (1)"


def test_input_tokens_over_the_budget_are_refused_before_queueing(make_app):
    app = make_app(max_input_tokens=100)
    with serving(app) as client:
        refused = summarize(client, ["many words " * 30, "more words " * 30])
        fine = summarize(client, ["a few words"])
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["field"] == "texts" and "is more than MAX_INPUT_TOKENS (100)" in error["message"]
    assert fine.status_code == 200
    assert value(samples(app.state.metrics.exposition().decode()), "bart_opt_batch_requests_count") == 1  # only the fine one ran


def test_a_checkpoint_without_num_beams_serves_with_transformers_defaults(make_app, demo_checkpoint, tmp_path):
    folder = tmp_path / "no-beams"
    shutil.copytree(demo_checkpoint, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    del config["num_beams"]
    (folder / "generation_config.json").write_text(json.dumps(config))
    with serving(make_app(model=str(folder))) as client:
        response = client.post("/summarize", json={"texts": articles(1, seed=9)})
        ready = client.get("/ready")
    assert response.status_code == 200 and ready.status_code == 200
    assert response.json()["generation"]["num_beams"] == 1 and response.json()["summaries"][0]


# ---- size limit, readiness, internal errors -------------------------------------------


def test_body_over_the_limit_is_413_by_content_length_and_by_streamed_bytes(make_app):
    app = make_app(max_request_bytes=300)
    big = json.dumps({"texts": ["word " * 100]}).encode()
    with serving(app) as client:
        declared = client.post("/summarize", content=big, headers={"Content-Type": "application/json"})
        streamed = client.post(
            "/summarize",
            content=(big[i : i + 64] for i in range(0, len(big), 64)),  # chunked: no Content-Length
            headers={"Content-Type": "application/json"},
        )
        small = summarize(client, ["a short text"])
    for response in (declared, streamed):
        assert response.status_code == 413
        error = response.json()["error"]
        assert error["code"] == "payload_too_large" and "300 bytes" in error["message"]
    assert small.status_code == 200


def test_before_the_model_is_loaded_summarize_and_ready_are_503(make_app, demo_checkpoint):
    release = threading.Event()

    def held_load(settings):
        assert release.wait(60)
        return load_summarizer(settings)

    app = make_app(load=held_load)
    with serving(app, wait_ready=False) as client:
        early = summarize(client, ["too early"])
        ready_early = client.get("/ready")
        release.set()
        assert app.state.engine.worker.wait_ready(60)
        late = summarize(client, ["in time"])
    assert early.status_code == 503 and ready_early.status_code == 503
    assert early.json()["error"]["code"] == "not_ready" and early.headers["retry-after"]
    assert "loading" in ready_early.json()["error"]["message"]
    assert late.status_code == 200


def test_unexpected_failure_is_a_500_without_details(client, monkeypatch):
    summarizer = client.app.state.engine.summarizer

    def explode(*args, **kwargs):
        raise RuntimeError("secret detail in /srv/private/path")

    monkeypatch.setattr(summarizer, "summarize_groups", explode)
    response = summarize(client, ["anything"])
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal_error"
    assert "secret" not in response.text and "Traceback" not in response.text
    assert error["request_id"] == response.headers["x-request-id"]


# ---- queueing: 429, micro-batch shares, disconnects, concurrency ------------------------


def test_full_queue_is_429_with_retry_after_and_queued_requests_are_merged(make_app, direct):
    gate = Gate()
    app = make_app(queue_size=2, load=gate.loader())
    texts = articles(3, seed=5)

    async def scenario():
        async with async_serving(app) as client:
            first = asyncio.create_task(client.post("/summarize", json={"texts": [texts[0]], "generation": FAST}))
            await asyncio.to_thread(gate.entered.wait, 30)
            queued = [
                asyncio.create_task(client.post("/summarize", json={"texts": [text], "generation": FAST}))
                for text in texts[1:]
            ]
            await until(lambda: app.state.engine.worker.queue_length() == 2)
            refused = await client.post("/summarize", json={"texts": ["no room"], "generation": FAST})
            gate.open()
            return refused, await first, await asyncio.gather(*queued)

    refused, first, queued = asyncio.run(scenario())
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    assert first.status_code == 200 and first.json()["memory"]["batch"]["requests"] == 1
    bodies = [response.json() for response in queued]
    for text, body in zip(texts[1:], bodies):
        assert body["summaries"] == direct.summarize([text], **FAST).summaries
        assert body["memory"]["batch"]["requests"] == 2 and body["memory"]["batch"]["texts"] == 2
    assert sum(body["memory"]["share"] for body in bodies) == pytest.approx(1.0)
    batch_peak = bodies[0]["memory"]["batch"]["peak_bytes"]
    assert sum(body["memory"]["peak_bytes"] for body in bodies) == pytest.approx(batch_peak, abs=2)
    assert len(gate.calls) == 2  # the two queued requests shared one model call


async def disconnecting_request(app, body: dict, gone: asyncio.Event, sent: list) -> None:
    """POST /summarize straight to the ASGI app from a client that disconnects once `gone` is set."""
    payload = json.dumps(body).encode()
    messages = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/summarize", "raw_path": b"/summarize", "root_path": "",
        "query_string": b"", "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
    }  # fmt: skip
    await app(scope, receive, send)


def test_client_disconnect_drops_its_queued_work(make_app):
    gate = Gate()
    app = make_app(load=gate.loader())

    async def scenario():
        async with async_serving(app) as client:
            busy = asyncio.create_task(client.post("/summarize", json={"texts": ["kept text"], "generation": FAST}))
            await asyncio.to_thread(gate.entered.wait, 30)
            gone, sent = asyncio.Event(), []
            body = {"texts": ["dropped text"], "generation": FAST}
            dropped = asyncio.create_task(disconnecting_request(app, body, gone, sent))
            await until(lambda: app.state.engine.worker.queue_length() == 1)
            gone.set()
            await dropped
            queue_after = app.state.engine.worker.queue_length()
            gate.open()
            kept = await busy
            metrics = (await client.get("/metrics", params={"format": "json"})).json()
            return queue_after, kept, sent, metrics

    queue_after, kept, sent, metrics = asyncio.run(scenario())
    assert queue_after == 0
    assert kept.status_code == 200
    assert sent[0]["status"] == 499
    assert len(gate.calls) == 1  # only the kept request ever reached the model
    assert [log["texts"] for log in metrics["recent"]] == [1]
    prometheus = app.state.metrics.exposition().decode()
    assert "bart_opt_cancelled_requests_total 1.0" in prometheus


class StepPause:
    """A decode_step wrapper for the service's model: records the working rows of every decoder step
    and, at the `pause_at`-th step with `rows` rows (if given), holds the device thread until `resume()`."""

    def __init__(self, model, rows: int | None = None, pause_at: int = 1) -> None:
        self.model, self.original = model, model.decode_step
        self.rows, self.pause_at = rows, pause_at
        self.steps: list[int] = []
        self.paused, self._resume = threading.Event(), threading.Event()
        model.decode_step = self

    def __call__(self, tokens, *args, **kwargs):
        self.steps.append(tokens.shape[0])
        if self.steps.count(self.rows) == self.pause_at and not self.paused.is_set():
            self.paused.set()
            assert self._resume.wait(30)
        return self.original(tokens, *args, **kwargs)

    def resume(self) -> None:
        self._resume.set()

    def remove(self) -> None:
        del self.model.decode_step


def test_a_disconnected_client_s_running_work_stops_within_a_step_and_its_batch_mate_is_unharmed(make_app, direct):
    gate = Gate()
    app = make_app(load=gate.loader())
    long = {"num_beams": 2, "min_length": 20, "max_length": 20}  # 19 decoder steps unless withdrawn
    kept_text, dropped_text = articles(2, seed=41)

    async def scenario():
        async with async_serving(app) as client:
            pause = StepPause(app.state.engine.summarizer.model, rows=2 * 2, pause_at=3)
            first = asyncio.create_task(client.post("/summarize", json={"texts": ["first"], "generation": long}))
            await asyncio.to_thread(gate.entered.wait, 30)
            kept = asyncio.create_task(client.post("/summarize", json={"texts": [kept_text], "generation": long}))
            gone, sent = asyncio.Event(), []
            body = {"texts": [dropped_text], "generation": long}
            dropped = asyncio.create_task(disconnecting_request(app, body, gone, sent))
            await until(lambda: app.state.engine.worker.queue_length() == 2)
            gate.open()  # "first" runs alone, then kept + dropped share one call
            await asyncio.to_thread(pause.paused.wait, 30)
            gone.set()  # the client leaves while its text is on the device, three steps in
            await dropped
            pause.resume()
            results = await first, await kept
            pause.remove()
            return results, sent, pause.steps

    (first, kept), sent, steps = asyncio.run(scenario())
    assert sent[0]["status"] == 499
    assert first.status_code == 200 and kept.status_code == 200
    body = kept.json()
    assert body["summaries"] == direct.summarize([kept_text], **long).summaries
    assert body["memory"]["batch"]["requests"] == 2  # it did share the call with the withdrawn request
    shared = steps[19:]  # the first request's call had 19 steps of 2 rows
    assert shared[:3] == [4, 4, 4] and shared[3:] == [2] * 16, steps


def test_the_deadline_answers_504_and_cancels_queued_and_running_work(make_app):
    gate = Gate()
    app = make_app(load=gate.loader(), request_timeout_s=1.5)

    async def scenario():
        async with async_serving(app) as client:
            pause = StepPause(app.state.engine.summarizer.model)  # records the steps, never pauses
            started = asyncio.get_running_loop().time()
            three = {"num_beams": 3, "min_length": 20, "max_length": 20}
            running = asyncio.create_task(client.post("/summarize", json={"texts": ["held"], "generation": three}))
            await asyncio.to_thread(gate.entered.wait, 30)
            queued = asyncio.create_task(client.post("/summarize", json={"texts": ["waits"], "generation": FAST}))
            answers = await running, await queued
            waited = asyncio.get_running_loop().time() - started
            gate.open()  # the held call now starts with its only request already gone
            after = await client.post("/summarize", json={"texts": ["in time"], "generation": FAST})
            pause.remove()
            return answers, waited, after, pause.steps

    (running, queued), waited, after, steps = asyncio.run(scenario())
    for response in (running, queued):
        assert response.status_code == 504
        error = response.json()["error"]
        assert error["code"] == "timeout" and "REQUEST_TIMEOUT_S" in error["message"]
    assert 1.5 <= waited < 10
    assert after.status_code == 200
    assert steps[0] == 3 and steps[1] == 2  # the held call ran one decoder step; the queued one never ran
    assert len(gate.calls) == 2
    prometheus = app.state.metrics.exposition().decode()
    assert "bart_opt_cancelled_requests_total 2.0" in prometheus


def test_32_simultaneous_requests_get_200_or_429_and_their_own_summaries(make_app, direct):
    gate = Gate()
    app = make_app(queue_size=4, load=gate.loader())
    texts = articles(32, seed=6)
    generations = [FAST if i % 4 else {**FAST, "max_length": 6} for i in range(32)]

    async def scenario():
        async with async_serving(app) as client:
            def post(text, generation):
                return asyncio.create_task(client.post("/summarize", json={"texts": [text], "generation": generation}))

            # The first request holds the device before the other 31 arrive at once, and the device stays
            # held until one of them is answered, which can only be a refusal: so the queue limit is hit
            # whatever the speed of the machine. (Sent all together, on a loaded machine the 32 could
            # reach the queue before the device thread woke, leaving 4 served rather than 1 + 4.)
            held = post(texts[0], generations[0])
            await asyncio.to_thread(gate.entered.wait, 30)
            rest = [post(t, g) for t, g in zip(texts[1:], generations[1:])]
            await asyncio.wait(rest, return_when=asyncio.FIRST_COMPLETED)
            gate.open()
            return await asyncio.gather(held, *rest)

    responses = asyncio.run(scenario())
    statuses = [response.status_code for response in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= 5 and statuses.count(429) >= 1
    for text, generation, response in zip(texts, generations, responses):
        if response.status_code == 200:
            assert response.json()["summaries"] == direct.summarize([text], **generation).summaries
        else:
            assert response.json()["error"]["code"] == "queue_full" and response.headers["retry-after"]


def test_a_text_spelling_a_token_past_the_embedding_is_a_422_and_fails_alone_in_a_job(make_checkpoint, tmp_path):
    """facebook/bart-large-cnn's layout: its tokenizer's <mask> (id 50264) has no row among its 50,264."""
    from transformers import AutoTokenizer

    from app.main import create_app
    from tests.app.jobs.helpers import prediction_rows, wait_for_job

    folder = Path(shutil.copytree(make_checkpoint(vocab_size=300), tmp_path / "extra"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    tokenizer.save_pretrained(str(folder))
    app = create_app(Settings(model=str(folder), db=str(tmp_path / "jobs.db"), data_dir=str(tmp_path)))
    with serving(app) as client:
        refused = summarize(client, ["A fine text.", "A text with <extra> in it."])
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["field"] == "texts[1]" and "'<extra>' (id 300)" in error["message"]
        assert summarize(client, ["A fine text."]).status_code == 200
        records = [{"id": "fine", "text": "The council met."}, {"id": "bad", "text": "It said <extra> twice."}]
        job = client.post("/evaluate", json={"dataset": {"records": records}, "summary_column": None,
                                             "generation": FAST}).json()  # fmt: skip
        assert wait_for_job(client, job["id"])["status"] == "succeeded"
        rows = {row["id"]: row for row in prediction_rows(client, job["id"])}
        assert rows["fine"]["error"] is None and "'<extra>'" in rows["bad"]["error"]
