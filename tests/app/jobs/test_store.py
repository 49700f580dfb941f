"""`JobStore`: jobs, records, exactly-once predictions, one transaction per batch, resume bookkeeping."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

from app.jobs.store import MAX_STALLED_RUNS, BatchWrite, JobStore, NewJob
from bart_opt.data import Record

RECORDS = [Record(f"id-{i}", f"text {i}", f"reference {i}") for i in range(5)]


@pytest.fixture
def store(tmp_path) -> JobStore:
    store = JobStore(tmp_path / "nested" / "jobs.db")
    store.initialize()
    return store


def new_job(job_id: str = "job-1", key: str | None = None, model: str = "demo") -> NewJob:
    return NewJob(id=job_id, request_hash="h", model=model, dataset={"file": "x.jsonl"},
                  columns={"text": "article", "summary": "highlights", "id": "id"}, limit=None,
                  generation={"num_beams": 2}, idempotency_key=key)


def rows_for(records, run=1, error=None) -> BatchWrite:
    rows = [{"id": r.id, "prediction": f"summary of {r.id}", "reference": r.reference, "rouge": None,
             "error": error, "seconds": 0.5} for r in records]
    positions = [int(r.id.split("-")[1]) for r in records]
    return BatchWrite(rows=rows, positions=positions, run=run, peak_bytes=1000 * len(rows), seconds=1.0,
                      queue_s=0.1, active_s=2.0)


def test_create_keeps_the_records_and_starts_queued(store):
    job, created = store.create(new_job(), RECORDS)
    assert created and job["status"] == "queued" and job["total"] == 5 and job["done"] == 0
    assert job["generation"] == {"num_beams": 2} and job["dataset"] == {"file": "x.jsonl"}
    assert store.records("job-1") == RECORDS
    assert store.get("nope") is None and store.counts()["queued"] == 1


def test_same_idempotency_key_gives_the_existing_job_even_when_racing(store):
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(store.create(new_job(f"job-{i}", key="k"), RECORDS)))
               for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(created for _, created in results) == 1
    assert len({job["id"] for job, _ in results}) == 1
    assert len(store.list()) == 1 and store.find_by_key("k")["id"] == results[0][0]["id"]
    with sqlite3.connect(store.path) as connection:  # the losers left no records behind
        assert connection.execute("SELECT COUNT(*) FROM records").fetchone()[0] == len(RECORDS)


def test_batches_are_written_once_per_example_and_only_while_running(store):
    store.create(new_job(), RECORDS)
    assert not store.write_batch("job-1", rows_for(RECORDS[:2]))  # still queued
    assert store.claim_next()["status"] == "running"
    assert store.write_batch("job-1", rows_for(RECORDS[:2]))
    assert store.done_ids("job-1") == {"id-0", "id-1"}
    with pytest.raises(sqlite3.IntegrityError):
        store.write_batch("job-1", rows_for(RECORDS[1:3]))  # id-1 again: the whole batch is refused
    assert store.done_ids("job-1") == {"id-0", "id-1"}
    job = store.get("job-1")
    assert job["done"] == 2 and job["work_s"] == 1.0 and job["active_s"] == 2.0 and job["peak_bytes"] == 2000
    assert [b["size"] for b in store.batches("job-1")] == [2]
    assert store.cancel("job-1") and not store.write_batch("job-1", rows_for(RECORDS[2:3]))
    assert store.get("job-1")["done"] == 2 and not store.cancel("job-1")


def test_prediction_lines_come_in_record_order_across_pages(store):
    store.create(new_job(), RECORDS)
    store.claim_next()
    store.write_batch("job-1", rows_for([RECORDS[4], RECORDS[1]]))
    store.write_batch("job-1", rows_for([RECORDS[3], RECORDS[0], RECORDS[2]], error="boom"))
    lines = list(store.prediction_lines("job-1", page=2))
    assert [json.loads(line)["id"] for line in lines] == [r.id for r in RECORDS]
    assert all(line.endswith("\n") for line in lines)
    job = store.get("job-1")
    assert job["done"] == 5 and job["failed"] == 3
    assert set(store.rows("job-1")) == {r.id for r in RECORDS}


def test_claim_is_oldest_first_and_interrupted_jobs_are_requeued(store):
    store.create(new_job("a"), RECORDS)
    store.create(new_job("b"), RECORDS)
    assert store.claim_next()["id"] == "a"
    assert store.requeue_interrupted() == ["a"]
    first = store.claim_next()
    assert first["id"] == "a" and first["runs"] == 2 and first["stalled_runs"] == 1
    assert store.finish("a", {"rouge": None}) and store.get("a")["metrics"] == {"rouge": None}
    assert not store.fail("a", "too late")
    assert store.claim_next()["id"] == "b" and store.claim_next() is None
    assert store.counts() == {"queued": 0, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 0}


def test_a_job_that_never_finishes_a_batch_is_failed_after_repeated_restarts(store):
    store.create(new_job(), RECORDS)
    store.claim_next()
    store.write_batch("job-1", rows_for(RECORDS[:1]))  # progress in run 1
    for _ in range(MAX_STALLED_RUNS):  # the first restart follows progress, the others none
        store.requeue_interrupted()
        assert store.claim_next()["status"] == "running"
    store.requeue_interrupted()
    assert store.claim_next() is None
    job = store.get("job-1")
    assert job["status"] == "failed" and f"stopped {MAX_STALLED_RUNS} times" in job["error"]


def test_progress_resets_the_stall_count(store):
    store.create(new_job(), RECORDS)
    store.claim_next()
    store.write_batch("job-1", rows_for(RECORDS[:1]))
    for i in range(1, MAX_STALLED_RUNS + 2):
        store.requeue_interrupted()
        job = store.claim_next()
        assert job["stalled_runs"] == 0
        store.write_batch("job-1", rows_for(RECORDS[i : i + 1], run=job["runs"]))
    assert store.get("job-1")["status"] == "running"
