"""The job runner inside the app: failing batches and records, out of memory, stop and resume, model checks."""

from __future__ import annotations

import functools
import json
import shutil
import threading
import time

from sqlalchemy import text

from app.jobs.store import JobStore, NewJob
from app.device.engine import load_summarizer
from bart_opt.pipeline.data import Record, load_records
from bart_opt.demo import build_checkpoint
from tests.app.helpers import FAST, serving
from tests.app.jobs.helpers import Stepper, cnn_rows, evaluate_directly, prediction_rows, wait_for_job


class FakeOOM(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError on CPU."""


def failing_loader(fail, **options):
    """A loader whose Summarizer calls `fail(positions)` before each model call; counts the calls."""
    calls = []

    def hook(positions):
        calls.append(len(positions))
        fail(positions)

    return functools.partial(load_summarizer, before_model_call=hook, **options), calls


def submit_file(client, name: str, **body) -> str:
    response = client.post("/evaluate", json={"dataset": {"file": name}, "generation": FAST, **body})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_a_failing_batch_is_retried_record_by_record(make_jobs_app, write_jsonl, direct):
    path = write_jsonl("four.jsonl", cnn_rows(4, seed=10))

    def fail_batches(positions):
        if len(positions) > 1:
            raise RuntimeError("this batch is cursed")

    load, calls = failing_loader(fail_batches)
    with serving(make_jobs_app(load=load, max_batch_size=2)) as client:
        view = wait_for_job(client, submit_file(client, "four.jsonl"))
    assert view["status"] == "succeeded" and view["progress"]["failed"] == 0
    assert [batch["size"] for batch in view["memory"]["batches"]] == [1, 1, 1, 1]
    assert calls == [2, 1, 1, 2, 1, 1]
    _, metrics = evaluate_directly(direct, load_records(file=path), FAST)
    assert view["rouge"] == metrics["rouge"]


def test_records_that_fail_alone_are_stored_with_the_reason_and_a_run_of_them_fails_the_job(make_jobs_app, write_jsonl):
    write_jsonl("nine.jsonl", cnn_rows(9, seed=11))

    def always(positions):
        raise ValueError("the device is on fire")

    load, calls = failing_loader(always)
    with serving(make_jobs_app(load=load, max_batch_size=2)) as client:
        job_id = submit_file(client, "nine.jsonl")
        view = wait_for_job(client, job_id)
        rows = prediction_rows(client, job_id)
    assert view["status"] == "failed"
    assert view["error"].startswith("5 examples in a row failed on the model; the last one: the model failed on "
                                    "this example (internal error; the server log has the details)")
    assert view["progress"]["done"] == view["progress"]["failed"] == 5 and view["rouge"] is None
    assert len(calls) <= 2 * 5  # each record tried at most once in its batch and once alone
    assert len(rows) == 5 and all(row["prediction"] == "" and "internal error" in row["error"] for row in rows)
    assert "on fire" not in view["error"] + "".join(row["error"] for row in rows)  # the log has it, not the client


def test_an_input_out_of_memory_even_alone_is_a_failed_record_not_a_loop(make_jobs_app, write_jsonl):
    write_jsonl("three.jsonl", cnn_rows(3, seed=12))

    def out_of_memory(positions):
        raise FakeOOM("CUDA out of memory (simulated)")

    load, calls = failing_loader(out_of_memory, oom_errors=(FakeOOM,))
    with serving(make_jobs_app(load=load, max_batch_size=4)) as client:
        job_id = submit_file(client, "three.jsonl")
        view = wait_for_job(client, job_id)
        rows = prediction_rows(client, job_id)
    # Every example failed: the job failed, with the first reasons, and ROUGE over nothing is not claimed.
    assert view["status"] == "failed" and view["progress"]["failed"] == 3 and view["rouge"] is None
    assert view["error"].startswith("all 3 examples failed; the first: 'doc-")
    assert view["error"].count("even in a batch of one") == 3
    assert all(row["error"] and "out of memory" in row["error"] for row in rows)
    assert max(calls) == 3 and calls.count(1) == 3  # halved down to one input, each tried once alone


def test_a_stopped_service_resumes_its_job_where_it_stopped(make_jobs_app, write_jsonl, direct):
    path = write_jsonl("six.jsonl", cnn_rows(6, seed=13))
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), max_batch_size=2)
    with serving(app) as client:
        try:
            job_id = submit_file(client, "six.jsonl")
            stepper.allow(1)
            wait_for_job(client, job_id, until=lambda view: view["progress"]["done"] == 2)
            stepper.wait_arrived(2)
            app.state.jobs.runner.stop(timeout=0)  # stopping begins while batch 2 is on the device
        finally:
            stepper.allow(100)
        app.state.jobs.runner.stop(timeout=60)
        stopped = client.get(f"/evaluate/{job_id}").json()
    assert stopped["status"] == "queued" and stopped["progress"]["done"] == 4  # batch 2 was kept, the job handed back
    with serving(make_jobs_app(max_batch_size=2)) as client:
        view = wait_for_job(client, job_id)
        rows = prediction_rows(client, job_id)
    assert view["status"] == "succeeded" and view["runs"] == 2
    assert [(batch["run"], batch["size"]) for batch in view["memory"]["batches"]] == [(1, 2), (1, 2), (2, 2)]
    expected_rows, metrics = evaluate_directly(direct, load_records(file=path), FAST)
    assert [row["id"] for row in rows] == [f"doc-{i}" for i in range(6)]
    assert {row["id"]: row["prediction"] for row in rows} == {k: v["prediction"] for k, v in expected_rows.items()}
    assert view["rouge"] == metrics["rouge"]


def test_the_next_batch_is_on_the_device_while_the_last_one_is_written(make_jobs_app, write_jsonl, direct,
                                                                        monkeypatch):
    path = write_jsonl("six.jsonl", cnn_rows(6, seed=14))
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), max_batch_size=2)
    arrived_during_write = []
    write_batch = JobStore.write_batch

    def slow_write(store, job_id, owner, write):
        # Serially, the next batch would reach the model only after this write: the wait would time out. It may
        # also have reached it before the write began (scoring the rows took longer than the hook): as good.
        if write.model_call and len(arrived_during_write) < 2:
            expected = len(arrived_during_write) + 2  # the k-th model write (from 1) waits for model call k + 1
            stepper.allow(1)
            deadline = time.monotonic() + 30
            while len(stepper.sizes) < expected and time.monotonic() < deadline:
                time.sleep(0.01)
            arrived_during_write.append(len(stepper.sizes) >= expected)
        return write_batch(store, job_id, owner, write)

    monkeypatch.setattr(JobStore, "write_batch", slow_write)
    with serving(app) as client:
        job_id = submit_file(client, "six.jsonl")
        stepper.allow(1)
        view = wait_for_job(client, job_id)
        rows = prediction_rows(client, job_id)
    assert arrived_during_write == [True, True]
    assert view["status"] == "succeeded" and view["progress"]["done"] == 6
    expected_rows, metrics = evaluate_directly(direct, load_records(file=path), FAST)
    assert {row["id"]: row["prediction"] for row in rows} == {k: v["prediction"] for k, v in expected_rows.items()}
    assert view["rouge"] == metrics["rouge"]


def test_a_job_for_another_model_is_failed_on_resume(make_jobs_app, tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    store.initialize()
    store.create(NewJob(id="old", request_hash="h", model="some/other-model", dataset={"records": 1},
                        columns={"text": "text", "summary": "reference", "id": "id"}, limit=None,
                        generation={"num_beams": 1}), [Record("1", "a text", "a summary")])
    with serving(make_jobs_app()) as client:
        view = wait_for_job(client, "old")
    assert view["status"] == "failed" and "some/other-model" in view["error"] and view["progress"]["done"] == 0
    assert "/" not in view["error"].split("server now runs")[1]  # the server's own model folder by name only


def _half_run(make_jobs_app, model: str, records: str) -> tuple[str, dict, list[dict]]:
    """A job on `records` stopped after two of its three batches (as the service stops); its id, view and rows."""
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), model=model, max_batch_size=2)
    with serving(app) as client:
        try:
            job_id = submit_file(client, records)
            stepper.allow(1)
            wait_for_job(client, job_id, until=lambda view: view["progress"]["done"] == 2)
            stepper.wait_arrived(2)
            app.state.jobs.runner.stop(timeout=0)
        finally:
            stepper.allow(100)
        app.state.jobs.runner.stop(timeout=60)
        view = client.get(f"/evaluate/{job_id}").json()
        assert view["fingerprint"] == client.get("/ready").json()["fingerprint"]
        rows = prediction_rows(client, job_id)
    assert view["status"] == "queued" and view["progress"]["done"] == 4
    return job_id, view, rows


def test_a_job_is_failed_not_mixed_when_its_model_folder_now_holds_another_checkpoint(make_jobs_app, write_jsonl,
                                                                                      tmp_path):
    """Issue 25, finding 1: stopped midway, the folder refilled with other weights, the service restarted."""
    write_jsonl("six.jsonl", cnn_rows(6, seed=15))
    model = tmp_path / "model"
    build_checkpoint(model, seed=1)
    job_id, stopped, rows_before = _half_run(make_jobs_app, str(model), "six.jsonl")
    shutil.rmtree(model)
    build_checkpoint(model, seed=2)  # same path, same config and tokenizer, other weights
    with serving(make_jobs_app(model=str(model), max_batch_size=2)) as client:
        view = wait_for_job(client, job_id)
        now = client.get("/ready").json()["fingerprint"]
        rows = prediction_rows(client, job_id)
    assert now != stopped["fingerprint"]
    assert view["status"] == "failed" and view["fingerprint"] == stopped["fingerprint"]
    assert f"submitted to checkpoint {stopped['fingerprint']}" in view["error"] and now in view["error"]
    assert "submit it again" in view["error"] and str(tmp_path) not in view["error"]
    assert view["progress"]["done"] == 4 and rows == rows_before  # nothing written by the second checkpoint
    assert view["rouge"] is None


def test_a_job_from_before_fingerprints_takes_the_checkpoint_only_if_nothing_is_stored(make_jobs_app, write_jsonl,
                                                                                      demo_checkpoint, tmp_path):
    write_jsonl("six.jsonl", cnn_rows(6, seed=16))
    job_id, stopped, _ = _half_run(make_jobs_app, demo_checkpoint, "six.jsonl")
    store = JobStore(tmp_path / "jobs.db")
    store.create(NewJob(id="fresh", request_hash="h", model=demo_checkpoint, dataset={"records": 1},
                        columns={"text": "text", "summary": "reference", "id": "id"}, limit=None,
                        generation=stopped["generation"]), [Record("1", "a text", "a summary")])
    with store.engine.begin() as connection:  # as schema 6 finds jobs made before it
        connection.execute(text("UPDATE jobs SET fingerprint = NULL"))
    with serving(make_jobs_app(max_batch_size=2)) as client:
        half, fresh = wait_for_job(client, job_id), wait_for_job(client, "fresh")
        ready = client.get("/ready").json()["fingerprint"]
    store.close()
    assert half["status"] == "failed" and "predates checkpoint fingerprints" in half["error"]
    assert half["progress"]["done"] == 4 and half["fingerprint"] is None
    assert fresh["status"] == "succeeded" and fresh["fingerprint"] == ready


def test_an_unexpected_error_reading_the_queue_is_retried_and_the_runner_lives_on(make_jobs_app, write_jsonl, caplog):
    write_jsonl("two.jsonl", cnn_rows(2, seed=12))
    with serving(make_jobs_app()) as client:
        store = client.app.state.jobs.store
        real, raised = store.claim_next, []

        def flaky(owner, lease_s, engine_key=None):
            if len(raised) < 2:
                raised.append(owner)
                raise RuntimeError("a bug in reading the queue")
            return real(owner, lease_s, engine_key)

        store.claim_next = flaky
        view = wait_for_job(client, submit_file(client, "two.jsonl"))
    assert len(raised) == 2 and view["status"] == "succeeded" and view["progress"]["done"] == 2
    assert sum("reading the job queue failed unexpectedly" in r.getMessage() for r in caplog.records) == 2


def test_ready_reads_degraded_while_the_runner_cannot_read_its_queue_and_ready_once_it_can(make_jobs_app):
    with serving(make_jobs_app()) as client:
        store = client.app.state.jobs.store
        real, broken = store.claim_next, threading.Event()
        broken.set()

        def failing(owner, lease_s, engine_key=None):
            if broken.is_set():
                raise RuntimeError("/secret/path: a bug in reading the queue")
            return real(owner, lease_s, engine_key)

        store.claim_next = failing
        deadline = time.monotonic() + 30
        while (ready := client.get("/ready").json())["status"] != "degraded":
            assert time.monotonic() < deadline, ready
            time.sleep(0.05)
        [warning] = [w for w in ready["warnings"] if w["code"] == "jobs_queue_unreadable"]
        assert "failed to read the job queue" in warning["message"] and "the server log has the cause" in warning["message"]
        assert "/secret/path" not in json.dumps(ready)  # the cause stays in the log
        broken.clear()
        while (ready := client.get("/ready").json())["status"] != "ready":
            assert time.monotonic() < deadline + 30, ready
            time.sleep(0.05)
    assert all(w["code"] != "jobs_queue_unreadable" for w in ready["warnings"])
