"""The /evaluate routes on the demo model: jobs from files and records, cancel, idempotency, refusals."""

from __future__ import annotations

import threading
from pathlib import Path
import time

import pytest

from app.jobs.bodies import EvaluateRequest
from app.jobs.database import StoreError
from app.jobs.service import _hash
from app.jobs.store import NewJob
from app.device.worker import Kind
from bart_opt.evaluate import score_baselines
from bart_opt.pipeline.data import iter_records, load_records
from bart_opt.scoring.registry import MetricSettings, build_metrics, intervals
from tests.app.helpers import FAST, articles, serving
from tests.app.jobs.helpers import (  # noqa: F401 - fixtures
    Stepper,
    cnn_rows,
    data_dir,
    evaluate_directly,
    make_jobs_app,
    prediction_rows,
    wait_for_job,
    write_jsonl,
)
from tests.app.routes.test_metrics import samples, value


@pytest.fixture
def app_client(make_jobs_app):
    with serving(make_jobs_app()) as client:
        yield client


# ---- jobs that run to the end ---------------------------------------------------------------


def test_job_over_a_jsonl_file_succeeds_with_the_rouge_of_the_evaluate_command(app_client, write_jsonl, direct):
    path = write_jsonl("cnn.jsonl", cnn_rows(5, seed=1))
    response = app_client.post("/evaluate", json={"dataset": {"file": "cnn.jsonl"}, "limit": 4, "generation": FAST})
    assert response.status_code == 202, response.text
    queued = response.json()
    assert response.headers["location"] == f"/evaluate/{queued['id']}"
    assert queued["status"] == "queued" and queued["progress"]["total"] == 4 and queued["progress"]["done"] == 0
    assert queued["dataset"]["file"] == "cnn.jsonl" and queued["limit"] == 4
    assert queued["dataset"]["fingerprint"]["size"] == path.stat().st_size  # the file as read (app.jobs.intake)
    assert queued["columns"] == {"text": "article", "summary": "highlights", "id": "id"}

    view = wait_for_job(app_client, queued["id"])
    assert view["status"] == "succeeded", view["error"]
    records = load_records(file=path, limit=4)
    rows, metrics = evaluate_directly(direct, records, FAST)
    assert view["rouge"] == metrics["rouge"]
    assert set(view["rouge"]["rougeLsum"]) == {"low", "mid", "high"}
    assert view["progress"]["done"] == 4 and view["progress"]["failed"] == 0 and view["progress"]["rate"] > 0
    assert view["tokens"] == metrics["tokens"] and view["padding"] == metrics["padding"]
    assert view["generation"] == metrics["generation"] and view["generation"]["max_length"] == 8
    assert view["model"] == Path(app_client.app.state.settings.model).name  # no server path in answers
    memory = view["memory"]
    assert memory["device"] == "cpu" and memory["peak_source"] == "live_tensors"
    assert sum(batch["size"] for batch in memory["batches"]) == 4



def test_a_job_with_a_baseline_reports_the_model_and_the_baseline_on_the_same_records(app_client, write_jsonl,
                                                                                     direct):
    path = write_jsonl("cnn-base.jsonl", cnn_rows(5, seed=2))
    body = {"dataset": {"file": "cnn-base.jsonl"}, "generation": FAST, "baselines": ["lead-3", "lead-3"]}
    response = app_client.post("/evaluate", json=body)
    assert response.status_code == 202, response.text
    assert response.json()["baselines"] == [{"name": "lead-3", "rouge": None, "n_scored": None, "scores": {}}]
    view = wait_for_job(app_client, response.json()["id"])
    assert view["status"] == "succeeded", view["error"]
    records = load_records(file=path)
    _, metrics = evaluate_directly(direct, records, FAST)
    assert view["rouge"] == metrics["rouge"]
    (baseline,) = view["baselines"]
    settings = MetricSettings()  # the server's default metrics (BART_OPT_METRICS)
    built = build_metrics(settings, direct.scorer.settings)
    expected = score_baselines(["lead-3"], records, direct.scorer, built, settings.record(built))["lead-3"]
    assert baseline == {"name": "lead-3", "rouge": expected["rouge"], "n_scored": 5, "scores": intervals(expected)}
    assert set(baseline["scores"]) == {"rouge", "extractive", "length"}
    assert set(baseline["rouge"]["rouge1"]) == {"low", "mid", "high"}
    assert baseline["rouge"] != view["rouge"]  # lead-3 is not what the model wrote
    listed = app_client.get("/evaluate").json()["jobs"]
    assert [job["baselines"] for job in listed if job["id"] == view["id"]] == [view["baselines"]]


@pytest.mark.parametrize("baselines", [["lead-4"], ["lead-3", 3], "lead-3"])
def test_an_unknown_baseline_is_refused_naming_it(app_client, write_jsonl, baselines):
    write_jsonl("cnn-bad.jsonl", cnn_rows(2, seed=3))
    response = app_client.post("/evaluate", json={"dataset": {"file": "cnn-bad.jsonl"}, "baselines": baselines})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"].startswith("baselines")
    assert app_client.get("/evaluate").json()["jobs"] == []

def test_job_over_inline_records_with_and_without_references(app_client, direct):
    texts = articles(3, seed=2)
    references = ["police said the city was on fire.", "the team lost at home.", "officials found water."]
    records = [{"id": f"r{i}", "text": t, "reference": r} for i, (t, r) in enumerate(zip(texts, references))]
    scored = app_client.post("/evaluate", json={"dataset": {"records": records}, "generation": FAST})
    plain = app_client.post(
        "/evaluate", json={"dataset": {"records": [{"body": t} for t in texts]}, "text_column": "body",
                           "summary_column": None, "generation": FAST},
    )  # fmt: skip
    assert scored.status_code == plain.status_code == 202, (scored.text, plain.text)
    assert scored.json()["dataset"] == {"records": 3}

    with_refs = wait_for_job(app_client, scored.json()["id"])
    without = wait_for_job(app_client, plain.json()["id"])
    expected = direct.summarize(texts, references, **FAST)
    assert with_refs["status"] == without["status"] == "succeeded"
    assert with_refs["rouge"] == expected.rouge
    assert without["rouge"] is None and without["columns"] == {"text": "body", "summary": None, "id": "id"}
    assert [row["prediction"] for row in prediction_rows(app_client, scored.json()["id"])] == expected.summaries
    plain_rows = prediction_rows(app_client, plain.json()["id"])
    assert [row["id"] for row in plain_rows] == ["0", "1", "2"]  # no id column: row numbers
    assert [row["prediction"] for row in plain_rows] == expected.summaries
    assert all(row["rouge"] is None and row["reference"] is None for row in plain_rows)


def test_list_is_newest_first_and_filters_by_status(app_client):
    ids = []
    for seed in (3, 4):
        body = {"dataset": {"records": [{"text": articles(1, seed=seed)[0], "reference": "a summary."}]},
                "generation": FAST}
        ids.append(app_client.post("/evaluate", json=body).json()["id"])
        wait_for_job(app_client, ids[-1])
    listed = app_client.get("/evaluate").json()["jobs"]
    assert [job["id"] for job in listed] == ids[::-1]
    assert all(job["memory"]["batches"] is None for job in listed)
    newest = app_client.get("/evaluate", params={"status": "succeeded", "limit": 1}).json()["jobs"]
    assert [job["id"] for job in newest] == ids[1:]
    assert app_client.get("/evaluate", params={"status": "running"}).json()["jobs"] == []
    bad = app_client.get("/evaluate", params={"status": "done"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "status"


# ---- cancel, streaming, interleaving, gauges -----------------------------------------------------


def until_scraped(client, check, timeout: float = 10.0) -> dict:
    """Scrape /metrics until `check(samples)` holds (job counts are cached, refreshed within a second)."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = samples(client.get("/metrics").text)
        if check(gauges) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.05)


def test_predictions_stream_what_is_done_and_cancel_keeps_it(make_jobs_app, write_jsonl):
    write_jsonl("six.jsonl", cnn_rows(6, seed=5))
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), max_batch_size=2)
    with serving(app) as client:
        try:
            first = client.post("/evaluate", json={"dataset": {"file": "six.jsonl"}, "generation": FAST}).json()
            two = {"dataset": {"file": "six.jsonl"}, "limit": 2, "generation": FAST}
            second = client.post("/evaluate", json=two).json()
            stepper.wait_arrived(1)
            assert client.get(f"/evaluate/{first['id']}").json()["status"] == "running"
            assert client.get(f"/evaluate/{second['id']}").json()["status"] == "queued"
            assert prediction_rows(client, first["id"]) == []
            stepper.allow(1)
            wait_for_job(client, first["id"], until=lambda view: view["progress"]["done"] == 2)
            so_far = prediction_rows(client, first["id"])
            assert len(so_far) == 2 and all(row["prediction"] for row in so_far)

            stepper.wait_arrived(2)  # the job's second batch is on the device
            cancelled = client.delete(f"/evaluate/{first['id']}")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
            stepper.allow(10)
            after = wait_for_job(client, second["id"])  # the runner went on to the next job
            assert after["status"] == "succeeded"
        finally:
            stepper.allow(100)
        view = client.get(f"/evaluate/{first['id']}").json()
        assert view["status"] == "cancelled" and view["progress"]["done"] == 2 and view["finished_at"]
        assert prediction_rows(client, first["id"]) == so_far  # kept; the abandoned batch was not written
        again = client.delete(f"/evaluate/{first['id']}")
        assert again.status_code == 200 and again.json()["status"] == "cancelled"
        finished = client.delete(f"/evaluate/{second['id']}")
        assert finished.status_code == 409 and finished.json()["error"]["code"] == "job_finished"


def test_interactive_requests_run_between_job_batches_and_gauges_follow_the_job(make_jobs_app, write_jsonl):
    write_jsonl("eight.jsonl", cnn_rows(8, seed=6))
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), max_batch_size=2)
    answers = []
    with serving(app) as client:
        try:
            job = client.post("/evaluate", json={"dataset": {"file": "eight.jsonl"}, "generation": FAST}).json()
            stepper.wait_arrived(1)  # job batch 1 (2 texts) holds the device
            replica = {"replica": app.state.jobs.owner}  # the job gauges are labelled with the replica
            gauges = until_scraped(client, lambda gauges: value(gauges, "bart_opt_jobs_running", **replica) == 1)
            assert value(gauges, "bart_opt_jobs_queued", **replica) == 0
            asking = threading.Thread(target=lambda: answers.append(
                client.post("/summarize", json={"texts": articles(1, seed=7), "generation": FAST})))
            asking.start()
            worker = app.state.engine.worker
            deadline = time.monotonic() + 30
            while worker.queue_length(Kind.INTERACTIVE) != 1:
                assert time.monotonic() < deadline, "the request never reached the queue"
                threading.Event().wait(0.01)
            stepper.allow(100)
            asking.join(60)
            view = wait_for_job(client, job["id"])
            # The rate gauge drops once the runner leaves the job, just after it is marked succeeded.
            gauges = until_scraped(client, lambda gauges: value(gauges, "bart_opt_job_examples_per_second",
                                                                **replica) == 0)
            rate = value(gauges, "bart_opt_job_examples_per_second", **replica)
        finally:
            stepper.allow(100)
    assert answers and answers[0].status_code == 200, answers
    # Calls in order: job batch 1, the request (1 text), then the rest of the job.
    assert stepper.sizes[:3] == [2, 1, 2], stepper.sizes
    assert view["status"] == "succeeded" and len(view["memory"]["batches"]) == 4
    assert rate == 0  # no job running any more


# ---- idempotency ---------------------------------------------------------------------------


def test_idempotency_key_returns_the_existing_job(app_client):
    body = {"dataset": {"records": [{"text": articles(1, seed=8)[0], "reference": "the summary."}]}, "generation": FAST}
    first = app_client.post("/evaluate", json=body, headers={"Idempotency-Key": "run-42"})
    again = app_client.post("/evaluate", json=body, headers={"Idempotency-Key": "run-42"})
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"] and again.headers["idempotent-replayed"] == "true"
    other = app_client.post("/evaluate", json={**body, "limit": 1}, headers={"Idempotency-Key": "run-42"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    bad = app_client.post("/evaluate", json=body, headers={"Idempotency-Key": "has space"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "Idempotency-Key"
    fresh = app_client.post("/evaluate", json=body)
    assert fresh.status_code == 202 and fresh.json()["id"] != first.json()["id"]
    assert len(app_client.get("/evaluate").json()["jobs"]) == 2
    wait_for_job(app_client, first.json()["id"])
    wait_for_job(app_client, fresh.json()["id"])


def test_a_key_whose_first_request_is_still_loading_its_dataset_is_409_retry(app_client):
    body = {"dataset": {"records": [{"text": articles(1, seed=8)[0], "reference": "the summary."}]}, "generation": FAST}
    hashed = _hash(EvaluateRequest.model_validate(body))
    loading = NewJob(id="loading", request_hash=hashed, model="demo", dataset={}, columns={}, limit=None,
                     generation={}, idempotency_key="slow-1")
    app_client.app.state.jobs.store.begin(loading, "another-process", lease_s=30)
    response = app_client.post("/evaluate", json=body, headers={"Idempotency-Key": "slow-1"})
    assert response.status_code == 409 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "idempotency_key_in_progress"
    assert app_client.get("/evaluate/loading").status_code == 404  # not a job until its records are in


def test_a_metrics_scrape_runs_no_sql(app_client):
    """Job counts come from a cache the upkeep thread refreshes; a scrape never touches the database."""
    store = app_client.app.state.jobs.store
    touched = []

    def no_sql():
        name = threading.current_thread().name
        touched.append(name)
        if name.startswith("bart-opt-jobs"):  # a background thread: the database "unavailable", which it retries
            raise StoreError("the database is unavailable (test)")
        raise AssertionError("no SQL in a scrape")

    store._read = store._write = no_sql  # every statement of the store starts with one of these
    try:
        scraped = app_client.get("/metrics")
    finally:
        del store._read, store._write
    assert scraped.status_code == 200 and "bart_opt_jobs_queued" in scraped.text
    assert set(touched) <= {"bart-opt-jobs-upkeep", "bart-opt-jobs"}  # background threads only, never the scrape


# ---- refusals --------------------------------------------------------------------------------


@pytest.fixture
def opened(monkeypatch):
    """Every `iter_records` call the job service makes (the records still load)."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return iter_records(*args, **kwargs)

    monkeypatch.setattr("app.jobs.service.iter_records", spy)
    return calls


def test_paths_leading_out_of_the_data_dir_are_refused_before_anything_is_opened(
    app_client, data_dir, tmp_path, opened
):
    outside = tmp_path / "secret.jsonl"
    outside.write_text('{"id": "1", "article": "secret text", "highlights": "secret"}\n')
    (data_dir / "sub").mkdir()
    (data_dir / "link.jsonl").symlink_to(outside)
    (data_dir / "sub" / "up").symlink_to(tmp_path)
    for name in ("../secret.jsonl", "sub/../../secret.jsonl", str(outside), "/etc/passwd", "link.jsonl",
                 "sub/up/secret.jsonl"):
        response = app_client.post("/evaluate", json={"dataset": {"file": name}})
        assert response.status_code == 422, (name, response.text)
        error = response.json()["error"]
        assert error["code"] == "path_not_allowed" and error["field"] == "dataset.file", name
    assert opened == []
    assert app_client.get("/evaluate").json()["jobs"] == []


def test_missing_file_and_missing_columns_are_422_listing_what_exists(app_client, write_jsonl, opened):
    write_jsonl("cnn.jsonl", cnn_rows(2))
    missing = app_client.post("/evaluate", json={"dataset": {"file": "nope.jsonl"}})
    assert missing.status_code == 422 and missing.json()["error"]["code"] == "dataset_not_found"
    text = app_client.post("/evaluate", json={"dataset": {"file": "cnn.jsonl"}, "text_column": "story"})
    summary = app_client.post(
        "/evaluate", json={"dataset": {"records": [{"id": 1, "text": "a text"}]}, "summary_column": "gold"}
    )
    for response, field, column, available in (
        (text, "text_column", "story", "article, highlights, id"),
        (summary, "summary_column", "gold", "id, text"),
    ):
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "missing_column" and error["field"] == field
        assert repr(column) in error["message"] and f"available columns: {available}" in error["message"]
    assert app_client.get("/evaluate").json()["jobs"] == []


ONE = {"records": [{"text": "a"}]}
TWINS = {"records": [{"id": "x", "text": "a"}, {"id": "x", "text": "b"}]}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"dataset": ONE, "generation": {"top_k": 5}}, "generation.top_k", "unknown field"),
        ({"dataset": ONE, "generation": {"min_length": 9, "max_length": 3}}, "generation.min_length",
         "min_length 9 is above max_length 3"),
        ({"dataset": ONE, "generation": {"max_length": 5}}, "generation.max_length", "min_length 8 is above"),
        ({"dataset": ONE, "generation": {"length_penalty": 200}}, "generation.length_penalty", "outside [-10, 10]"),
        ({"dataset": {"file": "a.jsonl", **ONE}}, "dataset", "exactly one of hub, file or records"),
        ({"dataset": {}}, "dataset", "exactly one of hub, file or records"),
        ({"dataset": {"file": "a.jsonl", "split": "train"}}, "dataset", "hub datasets only"),
        ({"dataset": {"records": []}}, "dataset.records", "at least 1 item"),
        ({"dataset": ONE, "limit": 0}, "limit", "greater than or equal to 1"),
        ({"dataset": TWINS, "summary_column": None}, "dataset.records", "duplicate id 'x'"),
        ({"dataset": {"records": [{"text": "  "}]}, "summary_column": None}, "dataset.records", "is empty"),
        ({"dataset": ONE, "colour": "red"}, "colour", "unknown field"),
    ],
)
def test_invalid_requests_are_422_naming_the_field(app_client, body, field, words):
    response = app_client.post("/evaluate", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error


def test_unknown_job_is_404_on_every_route(app_client):
    for method, path in (("get", "/evaluate/nope"), ("get", "/evaluate/nope/predictions"),
                         ("delete", "/evaluate/nope")):
        response = getattr(app_client, method)(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "job_not_found"


def test_job_routes_need_the_api_key_when_one_is_set(make_jobs_app):
    with serving(make_jobs_app(api_key="s3cret")) as client:
        for method, path in (("get", "/evaluate"), ("post", "/evaluate"), ("get", "/evaluate/x"),
                             ("delete", "/evaluate/x"), ("get", "/evaluate/x/predictions")):
            assert getattr(client, method)(path).status_code == 401, path
        assert client.get("/evaluate", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_hub_datasets_stream_and_an_unreachable_hub_is_a_clean_502(app_client, monkeypatch):
    calls = []

    def offline(*args, **kwargs):
        calls.append((args, kwargs))
        raise ConnectionError("no network here")

    monkeypatch.setattr("datasets.load_dataset", offline)
    body = {"dataset": {"hub": "abisee/cnn_dailymail", "config": "3.0.0", "split": "test"}, "limit": 10}
    response = app_client.post("/evaluate", json=body)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "dataset_unavailable" and error["field"] == "dataset.hub"
    assert error["message"] == "dataset.hub: could not reach the hub to load 'abisee/cnn_dailymail'; retry later"
    assert calls == [(("abisee/cnn_dailymail", "3.0.0"), {"split": "test", "streaming": True})]
    assert app_client.get("/evaluate").json()["jobs"] == []


def test_a_jobs_database_that_cannot_be_opened_disables_only_the_job_routes(make_jobs_app, tmp_path):
    (tmp_path / "a-file").write_text("")
    with serving(make_jobs_app(db=str(tmp_path / "a-file" / "jobs.db"))) as client:
        summarized = client.post("/summarize", json={"texts": articles(1, seed=9), "generation": FAST})
        submitted = client.post("/evaluate", json={"dataset": {"records": [{"text": "a text"}]}})
        listed = client.get("/evaluate")
        scraped = client.get("/metrics")
    assert summarized.status_code == 200 and scraped.status_code == 200
    for response in (submitted, listed):
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        error = response.json()["error"]
        assert error["code"] == "jobs_unavailable" and "BART_OPT_DB" in error["message"]
        assert str(tmp_path) not in error["message"]
