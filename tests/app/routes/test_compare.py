"""GET /compare and GET /evaluate/{id}/examples/{example_id} on real jobs of the demo model."""

from __future__ import annotations

import json

import pytest

from bart_opt.compare import Run, compare_runs
from bart_opt.pipeline.data import load_records
from tests.app.helpers import FAST, serving
from tests.app.jobs.helpers import (  # noqa: F401 - fixtures
    Stepper,
    cnn_rows,
    data_dir,
    make_jobs_app,
    prediction_rows,
    wait_for_job,
    write_jsonl,
)


def run_job(client, file: str, **generation) -> dict:
    response = client.post("/evaluate", json={"dataset": {"file": file}, "generation": {**FAST, **generation}})
    assert response.status_code == 202, response.text
    view = wait_for_job(client, response.json()["id"])
    assert view["status"] == "succeeded", view["error"]
    return view


def test_compare_answers_the_library_comparison_of_the_jobs_rows(make_jobs_app, write_jsonl):
    write_jsonl("a.jsonl", cnn_rows(6, seed=3))
    write_jsonl("b.jsonl", cnn_rows(4, seed=3))  # the first 4 records of a.jsonl
    with serving(make_jobs_app()) as client:
        one, two = run_job(client, "a.jsonl", num_beams=1), run_job(client, "a.jsonl", num_beams=2, max_length=12)
        other = run_job(client, "b.jsonl")
        response = client.get("/compare", params={"jobs": f"{one['id']}, {two['id']}", "seed": 5, "metric": "rouge1"})
        rows = {view["id"]: prediction_rows(client, view["id"]) for view in (one, two)}
        mismatch = client.get("/compare", params={"jobs": f"{one['id']},{other['id']}"})
        unknown = client.get("/compare", params={"jobs": f"{one['id']},nope"})
        single = client.get("/compare", params={"jobs": one["id"]})
        missing = client.get("/compare")
    assert response.status_code == 200, response.text
    result = response.json()
    keys = ("system", "model", "dataset", "generation", "rouge", "rouge_settings", "signature", "warnings", "created_at")
    info = {view["id"]: {key: view[key] for key in keys} for view in (one, two)}
    expected = compare_runs([Run(job_id, rows[job_id], info[job_id]) for job_id in (one["id"], two["id"])],
                            seed=5, metric="rouge1")  # fmt: skip
    assert result == json.loads(json.dumps(expected))  # the same numbers: JSON carries floats exactly
    assert [run["name"] for run in result["runs"]] == [one["id"], two["id"]] and result["examples"] == 6
    assert result["runs"][1]["info"]["generation"]["max_length"] == 12
    assert mismatch.status_code == 422 and mismatch.json()["error"]["code"] == "datasets_differ"
    assert f"2 examples only in {one['id']} (first: 'doc-4')" in mismatch.json()["error"]["message"]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "job_not_found"
    assert single.status_code == 422 and single.json()["error"]["field"] == "jobs"
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "jobs"


def test_compare_refuses_a_job_that_is_still_running(make_jobs_app, write_jsonl):
    write_jsonl("a.jsonl", cnn_rows(3, seed=3))
    stepper = Stepper()
    with serving(make_jobs_app(load=stepper.loader())) as client:
        stepper.allow(3)
        done = client.post("/evaluate", json={"dataset": {"file": "a.jsonl"}, "generation": FAST}).json()
        wait_for_job(client, done["id"])
        stepper.revoke()
        arrived = len(stepper.sizes)
        running = client.post("/evaluate", json={"dataset": {"file": "a.jsonl"}, "generation": FAST}).json()
        stepper.wait_arrived(arrived + 1)
        response = client.get("/compare", params={"jobs": f"{done['id']},{running['id']}"})
        stepper.allow(10)
    assert response.status_code == 409
    assert response.json()["error"] == {**response.json()["error"], "code": "job_not_finished", "field": "jobs"}
    assert f"job {running['id']} is running" in response.json()["error"]["message"]


def test_compare_refuses_jobs_over_the_example_cap_before_reading_their_rows(make_jobs_app, write_jsonl,
                                                                           monkeypatch):
    write_jsonl("a.jsonl", cnn_rows(3, seed=4))
    with serving(make_jobs_app(max_compare_examples=2)) as client:
        one, two = run_job(client, "a.jsonl"), run_job(client, "a.jsonl", num_beams=2)
        read = []
        jobs = client.app.state.jobs
        monkeypatch.setattr(jobs, "prediction_rows", lambda job_id: read.append(job_id) or [])
        response = client.get("/compare", params={"jobs": f"{one['id']},{two['id']}"})
    assert response.status_code == 422 and response.json()["error"]["field"] == "jobs"
    assert f"job {one['id']} has 3 examples" in response.json()["error"]["message"]
    assert "BART_OPT_MAX_COMPARE_EXAMPLES" in response.json()["error"]["message"] and read == []


def test_an_example_comes_with_its_article_and_its_prediction(make_jobs_app, write_jsonl):
    path = write_jsonl("a.jsonl", cnn_rows(3, seed=6))
    with serving(make_jobs_app()) as client:
        view = run_job(client, "a.jsonl")
        rows = prediction_rows(client, view["id"])
        example = client.get(f"/evaluate/{view['id']}/examples/doc-1")
        unknown_example = client.get(f"/evaluate/{view['id']}/examples/doc-9")
        unknown_job = client.get("/evaluate/nope/examples/doc-1")
    record = load_records(file=path)[1]
    assert example.status_code == 200, example.text
    assert example.json() == {"id": "doc-1", "text": record.text, "reference": record.reference,
                              "prediction": next(r for r in rows if r["id"] == "doc-1")}  # fmt: skip
    assert unknown_example.status_code == 404 and unknown_example.json()["error"]["code"] == "example_not_found"
    assert unknown_job.status_code == 404 and unknown_job.json()["error"]["code"] == "job_not_found"


def test_compare_and_examples_need_the_api_key(make_jobs_app):
    with serving(make_jobs_app(api_key="secret")) as client:
        refused = [client.get("/compare", params={"jobs": "a,b"}), client.get("/evaluate/a/examples/b")]
        allowed = client.get("/compare", params={"jobs": "a,b"}, headers={"Authorization": "Bearer secret"})
    assert [r.status_code for r in refused] == [401, 401]
    assert allowed.status_code == 404  # past the key check: job a does not exist
