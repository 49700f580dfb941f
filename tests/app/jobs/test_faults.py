"""Faults never strand a job: a read-only or full database mid-job, a database that cannot be opened yet."""

from __future__ import annotations

import json
import time

from tests.app.helpers import FAST, serving
from tests.app.jobs.helpers import Stepper, cnn_rows, prediction_rows, wait_for_job

FAULT_SETTINGS = {"max_batch_size": 2, "store_retry_s": 0.5, "job_lease_s": 1}


def submit(client, name: str) -> str:
    response = client.post("/evaluate", json={"dataset": {"file": name}, "generation": FAST})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def refused_submission(client, name: str) -> dict:
    response = client.post("/evaluate", json={"dataset": {"file": name}, "generation": FAST})
    assert response.status_code == 503 and response.headers["retry-after"] == "5", response.text
    return response.json()["error"]


def test_a_database_made_read_only_mid_job_holds_the_job_which_resumes_once_writable(
    make_jobs_app, write_jsonl, faulty_store, tmp_path, caplog
):
    write_jsonl("six.jsonl", cnn_rows(6, seed=30))
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), **FAULT_SETTINGS)
    with serving(app) as client:
        try:
            job_id = submit(client, "six.jsonl")
            stepper.allow(1)
            wait_for_job(client, job_id, until=lambda view: view["progress"]["done"] == 2)
            faulty_store.fault = "read-only"
            stepper.allow(1)  # batch 2 is computed but cannot be written; nor can the job be failed
            stepper.wait_arrived(2)
            gave_up = f"job {job_id}: the jobs database (BART_OPT_DB) is read-only; it stays claimed"
            deadline = time.monotonic() + 30
            while gave_up not in caplog.text:  # the runner is past its retries (0.5 s) and holds the job
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.02)
            during = client.get(f"/evaluate/{job_id}").json()  # reads still work
            error = refused_submission(client, "six.jsonl")
            faulty_store.fault = None  # writable again: the job is claimed again, no restart
            stepper.allow(100)
            view = wait_for_job(client, job_id)
        finally:
            stepper.allow(100)
        rows = prediction_rows(client, job_id)
    assert during["status"] == "running" and during["progress"]["done"] == 2
    assert error["code"] == "jobs_store_unavailable"
    assert error["message"] == "the jobs database (BART_OPT_DB) is read-only; retry later"
    assert view["status"] == "succeeded" and view["runs"] == 2 and view["progress"]["done"] == 6
    assert [row["id"] for row in rows] == [f"doc-{i}" for i in range(6)]  # each example exactly once
    assert [(batch["run"], batch["size"]) for batch in view["memory"]["batches"]] == [(1, 2), (2, 2), (2, 2)]


def test_a_full_disk_mid_job_fails_it_with_the_reason_and_submissions_get_503(make_jobs_app, data_dir, faulty_store):
    rows = cnn_rows(4, seed=31)
    for row in rows:
        row["highlights"] = "A long reference sentence. " * 300  # 8 KB: every prediction row needs new pages
    (data_dir / "four.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), **FAULT_SETTINGS)
    with serving(app) as client:
        try:
            job_id = submit(client, "four.jsonl")
            stepper.allow(1)
            wait_for_job(client, job_id, until=lambda view: view["progress"]["done"] == 2)
            faulty_store.fault = "full"
            stepper.allow(100)
            view = wait_for_job(client, job_id)
            error = refused_submission(client, "four.jsonl")
        finally:
            stepper.allow(100)
        faulty_store.fault = None
        again = client.post("/evaluate", json={"dataset": {"file": "four.jsonl"}, "generation": FAST})
    assert view["status"] == "failed" and view["progress"]["done"] == 2
    assert view["error"] == ("the jobs database (BART_OPT_DB) is full (no space left on its disk) for more than "
                             "0.5 s while the job ran; submit it again once the database works")
    assert error["message"] == "the jobs database (BART_OPT_DB) is full (no space left on its disk); retry later"
    assert again.status_code == 202, again.text


def test_a_database_that_cannot_be_opened_yet_comes_back_without_a_restart(make_jobs_app, tmp_path, write_jsonl):
    write_jsonl("two.jsonl", cnn_rows(2, seed=32))
    blocker = tmp_path / "volume"
    blocker.write_text("not a folder yet")  # the database's folder cannot be created
    with serving(make_jobs_app(db=str(blocker / "jobs.db"))) as client:
        refused = client.post("/evaluate", json={"dataset": {"file": "two.jsonl"}, "generation": FAST})
        blocker.unlink()  # the volume is mounted
        deadline = time.monotonic() + 30
        while (listed := client.get("/evaluate")).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        view = wait_for_job(client, submit(client, "two.jsonl"))
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "jobs_unavailable"
    assert str(tmp_path) not in refused.text
    assert listed.status_code == 200 and view["status"] == "succeeded"


def test_a_damaged_database_reads_as_damaged_not_as_retry_later(make_jobs_app, write_jsonl, tmp_path, caplog):
    rows = cnn_rows(300, seed=33)
    write_jsonl("many.jsonl", rows)
    with serving(make_jobs_app()) as client:
        job_id = client.post("/evaluate", json={"dataset": {"file": "many.jsonl"}, "generation": FAST,
                                                "limit": 2}).json()["id"]
        wait_for_job(client, job_id)
        assert client.post("/evaluate", json={"dataset": {"file": "many.jsonl"}, "generation": FAST,
                                              "limit": 300}).status_code == 202  # pages of records to damage
    path = tmp_path / "jobs.db"
    with path.open("r+b") as handle:  # pages 3 to 60 overwritten, as a failing disk or a bad copy leaves them
        handle.seek(2 * 4096)
        handle.write(b"\xa5" * (58 * 4096))
    with serving(make_jobs_app()) as client:
        deadline = time.monotonic() + 30
        # The store's check runs once it is open (before it, the runner's failed reads may read degraded already).
        while True:
            ready = client.get("/ready")
            if any(w["code"] == "jobs_store_damaged" for w in ready.json()["warnings"]):
                break
            assert time.monotonic() < deadline, "the damage was never found"
            time.sleep(0.05)
        view = client.get(f"/evaluate/{job_id}")
        submitted = client.post("/evaluate", json={"dataset": {"file": "many.jsonl"}, "generation": FAST})
        health = client.get("/health")
        summarized = client.post("/summarize", json={"texts": ["A text to summarize."], "generation": FAST})
    errors = [answer.json()["error"] for answer in (view, submitted)]
    for answer in (view, submitted):
        assert answer.status_code == 503 and "retry-after" not in answer.headers, answer.text
    # /ready: degraded, with the reason, the same words as the routes' 503s
    assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
    [warning] = [w for w in ready.json()["warnings"] if w["code"] == "jobs_store_damaged"]
    assert all(w["code"] != "jobs_queue_unreadable" for w in ready.json()["warnings"])  # the damage says why
    for error in (*errors, warning):
        assert error["code"] == "jobs_store_damaged", error
        assert error["message"].startswith("the jobs database (BART_OPT_DB) is damaged") and "retry" not in error[
            "message"] and "restore" in error["message"]
    assert health.status_code == 200  # /summarize still works: the process need not be restarted for it
    assert summarized.status_code == 200, summarized.text
    assert "is damaged" in caplog.text and str(tmp_path) not in view.text


def test_a_database_that_goes_away_mid_job_gives_503s_and_the_job_resumes_once_it_is_back(
    make_jobs_app, write_jsonl, faulty_store, backend, caplog
):
    write_jsonl("six.jsonl", cnn_rows(6, seed=34))
    stepper = Stepper()
    app = make_jobs_app(load=stepper.loader(), db=backend.url, **FAULT_SETTINGS)
    with serving(app) as client:
        try:
            job_id = submit(client, "six.jsonl")
            stepper.allow(1)
            wait_for_job(client, job_id, until=lambda view: view["progress"]["done"] == 2)
            backend.go_away()  # PostgreSQL: the server stopped as by a crash; SQLite: its volume gone
            try:
                stepper.allow(1)  # batch 2 is computed but can be neither written nor failed
                stepper.wait_arrived(2)
                deadline = time.monotonic() + 30
                while "it stays claimed and resumes when the database works again" not in caplog.text:
                    assert time.monotonic() < deadline, caplog.text
                    time.sleep(0.05)
                view_during = client.get(f"/evaluate/{job_id}")
                post_during = client.post("/evaluate", json={"dataset": {"file": "six.jsonl"}, "generation": FAST})
            finally:
                backend.come_back()
            stepper.allow(100)
            view = wait_for_job(client, job_id)
        finally:
            stepper.allow(100)
        rows = prediction_rows(client, job_id)
    for answer in (view_during, post_during):
        assert answer.status_code == 503 and answer.headers["retry-after"] == "5", answer.text
        assert answer.json()["error"]["code"] == "jobs_store_unavailable"
    assert view["status"] == "succeeded" and view["runs"] == 2 and view["progress"]["done"] == 6
    assert [row["id"] for row in rows] == [f"doc-{i}" for i in range(6)]  # nothing lost, nothing doubled
    assert [(batch["run"], batch["size"]) for batch in view["memory"]["batches"]] == [(1, 2), (2, 2), (2, 2)]


def test_nul_characters_and_hostile_ids_are_refused_alike_on_both_backends(make_jobs_app, backend):
    records = [{"id": "a", "text": "The city voted.", "reference": "A vote."},
               {"id": "b", "text": "Nul \x00 inside.", "reference": "x"}]
    with serving(make_jobs_app(db=backend.url, max_batch_size=2)) as client:
        accepted = client.post("/evaluate", json={"dataset": {"records": records}, "generation": FAST})
        view = wait_for_job(client, accepted.json()["id"])
        rows = prediction_rows(client, view["id"])
        bad_id = client.post("/evaluate", json={"dataset": {"records": [{"id": "x\x00", "text": "t", "reference": "r"}]}})
        lookups = [client.get(path).status_code for path in
                   ("/evaluate/%00", "/evaluate/a%00b", f"/evaluate/{view['id']}/examples/%00", "/evaluate/%ED%A0%80")]
    assert view["status"] == "succeeded" and view["progress"]["failed"] == 1
    assert rows[1]["error"] == "the text holds a NUL character (U+0000), which the jobs database cannot store"
    assert bad_id.status_code == 422 and "NUL" in bad_id.json()["error"]["message"]
    assert lookups == [404, 404, 404, 404]
