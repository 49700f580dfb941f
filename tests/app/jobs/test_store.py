"""`JobStore` on SQLite and on PostgreSQL: streamed submissions, exactly-once predictions, leases, kept counts.

Every test that takes the `store` fixture runs on both backends (PostgreSQL: a fresh database
on the session's throwaway cluster). The migrations are in test_migrations.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import text

from app.jobs.store import MAX_STALLED_RUNS, BatchWrite, DuplicateId, JobStore, NewJob, StoreConflict, StoredRecord
from bart_opt.pipeline.data import Record
from tests.app.jobs.helpers import sql

RECORDS = [Record(f"id-{i}", f"text {i}", f"reference {i}") for i in range(5)]
A, B = "host:1:a", "host:2:b"


@pytest.fixture
def store(backend, tmp_path) -> JobStore:
    store = JobStore(tmp_path / "nested" / "jobs.db" if backend.name == "sqlite" else backend.url)
    store.initialize()
    yield store
    store.close()


@pytest.fixture
def replicas(store):
    """`replicas(n)`: n more stores on the same database, as other processes have (own pools)."""
    made = []

    def _make(n: int) -> list[JobStore]:
        made.extend(JobStore(store.location) for _ in range(n))
        return made[-n:]

    yield _make
    for other in made:
        other.close()


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


def pending_ids(store, job_id="job-1", after=-1, records=100, chars=10**9) -> list[str]:
    return [stored.record.id for stored in store.pending(job_id, after, records, chars)]


def test_create_keeps_the_records_and_starts_queued(store):
    job, created = store.create(new_job(), RECORDS)
    assert created and job.status == "queued" and job.total == 5 and job.done == 0
    assert job.generation == {"num_beams": 2} and job.dataset == {"file": "x.jsonl"}
    assert [stored.record for stored in store.pending("job-1", -1, 100, 10**9)] == RECORDS
    assert store.get("nope") is None and store.counts()["queued"] == 1


def test_a_submission_streams_in_chunks_and_stays_invisible_until_sealed(store):
    job, created = store.begin(new_job(key="k"), A, lease_s=30)
    assert created and job.status == "loading"
    assert store.add_records("job-1", A, 30, [StoredRecord(i, r) for i, r in enumerate(RECORDS[:3])])
    assert not store.add_records("job-1", B, 30, [StoredRecord(3, RECORDS[3])])  # not B's
    assert store.list() == [] and store.counts() == dict.fromkeys(("queued", "running", "succeeded", "failed",
                                                                   "cancelled"), 0)
    assert store.claim_next(B, 30) is None  # nobody runs a job that is still loading
    again, new = store.begin(new_job("job-2", key="k"), B, lease_s=30)
    assert not new and again.id == "job-1" and again.status == "loading"
    with pytest.raises(DuplicateId, match=r"duplicate id 'id-1' at rows 1 and 4"):
        store.add_records("job-1", A, 30, [StoredRecord(3, RECORDS[3]), StoredRecord(4, RECORDS[1])])
    with pytest.raises(DuplicateId, match=r"duplicate id 'id-3' at rows 3 and 4"):
        store.add_records("job-1", A, 30, [StoredRecord(3, RECORDS[3]), StoredRecord(4, RECORDS[3])])
    assert pending_ids(store) == ["id-0", "id-1", "id-2"]  # the refused chunks left nothing
    sealed = store.seal("job-1", A, 3)
    assert sealed.status == "queued" and sealed.total == 3 and sealed.owner is None
    assert [job.id for job in store.list()] == ["job-1"] and store.counts()["queued"] == 1


def test_discard_removes_a_job_and_a_dead_loaders_job_is_discarded(store):
    store.begin(new_job("dead"), A, lease_s=0.01)
    store.add_records("dead", A, 0.01, [StoredRecord(i, r) for i, r in enumerate(RECORDS)])
    store.begin(new_job("alive"), B, lease_s=30)
    time.sleep(0.05)
    assert store.discard_stale() == ["dead"]
    assert store.get("dead") is None and pending_ids(store, "dead") == [] and store.get("alive") is not None
    store.discard("alive")
    assert sql(store, "SELECT COUNT(*) FROM records") == [(0,)]


def test_a_job_loading_while_its_replica_dies_is_cleaned_up_by_another_and_a_late_chunk_is_refused(store, replicas):
    (other,) = replicas(1)
    store.begin(new_job("orphan"), A, lease_s=0.2)
    store.add_records("orphan", A, 0.2, [StoredRecord(i, r) for i, r in enumerate(RECORDS[:2])])
    assert other.discard_stale() == []  # the loader's lease still holds
    time.sleep(0.3)  # A stopped renewing: it died, or stalled past its lease
    assert other.discard_stale() == ["orphan"] and other.discard_stale() == []
    assert not store.add_records("orphan", A, 30, [StoredRecord(2, RECORDS[2])])  # a late chunk of A: refused
    assert store.seal("orphan", A, 3) is None and store.get("orphan") is None
    assert sql(store, "SELECT COUNT(*) FROM records WHERE job_id = 'orphan'") == [(0,)]
    assert store.counts() == dict.fromkeys(("queued", "running", "succeeded", "failed", "cancelled"), 0)


def test_same_idempotency_key_gives_one_job_across_replicas_submitting_at_once(store, replicas):
    results = []
    stores = [store, *replicas(3)]
    start = threading.Barrier(len(stores))

    def submit(i: int) -> None:
        start.wait()
        results.append(stores[i].create(new_job(f"job-{i}", key="k"), RECORDS))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1
    assert len(store.list()) == 1 and store.find_by_key("k").id == results[0][0].id
    assert sql(store, "SELECT COUNT(*) FROM records") == [(len(RECORDS),)]  # the losers left no records behind


def test_batches_are_written_once_per_example_and_only_by_the_running_owner(store):
    store.create(new_job(), RECORDS)
    assert not store.write_batch("job-1", A, rows_for(RECORDS[:2]))  # still queued
    assert store.claim_next(A, 30).status == "running"
    assert not store.write_batch("job-1", B, rows_for(RECORDS[:2]))  # not B's job
    assert store.write_batch("job-1", A, rows_for(RECORDS[:2]))
    assert pending_ids(store) == ["id-2", "id-3", "id-4"]
    with pytest.raises(StoreConflict):
        store.write_batch("job-1", A, rows_for(RECORDS[1:3]))  # id-1 again: the whole batch is refused
    with pytest.raises(StoreConflict):
        store.write_batch("job-1", A, rows_for(RECORDS[:2], run=2))  # written by another run: refused
    assert store.write_batch("job-1", A, rows_for(RECORDS[:2]))  # the same batch again (a lost commit): once
    assert pending_ids(store) == ["id-2", "id-3", "id-4"]
    job = store.get("job-1")
    assert job.done == 2 and job.work_s == 1.0 and job.active_s == 2.0 and job.peak_bytes == 2000
    assert [b["size"] for b in store.batches("job-1")] == [2]
    refused = BatchWrite(rows=rows_for(RECORDS[2:3], error="too long").rows, positions=[2], run=1, model_call=False)
    assert store.write_batch("job-1", A, refused)
    assert [b["size"] for b in store.batches("job-1")] == [2]  # error rows without a model call: no batch
    assert store.cancel("job-1") and not store.write_batch("job-1", A, rows_for(RECORDS[3:4]))
    assert store.get("job-1").done == 3 and not store.cancel("job-1")


def test_prediction_lines_come_in_record_order_across_pages_and_filter_errors(store):
    store.create(new_job(), RECORDS)
    store.claim_next(A, 30)
    store.write_batch("job-1", A, rows_for([RECORDS[4], RECORDS[1]]))
    store.write_batch("job-1", A, rows_for([RECORDS[3], RECORDS[0], RECORDS[2]], error="boom"))
    lines = list(store.prediction_lines("job-1", page=2))
    assert [json.loads(line)["id"] for line in lines] == [r.id for r in RECORDS]
    assert all(line.endswith("\n") for line in lines)
    only = [json.loads(line)["id"] for line in store.prediction_lines("job-1", "only", page=2)]
    without = [json.loads(line)["id"] for line in store.prediction_lines("job-1", "exclude", page=2)]
    assert only == ["id-0", "id-2", "id-3"] and without == ["id-1", "id-4"]
    assert store.first_failures("job-1", 2) == [("id-0", "boom"), ("id-2", "boom")]
    assert [row["id"] for row in store.iter_rows("job-1", page=2)] == [r.id for r in RECORDS]
    job = store.get("job-1")
    assert job.done == 5 and job.failed == 3


def test_pending_windows_stop_at_records_or_characters(store):
    records = [Record(f"id-{i}", "x" * (10 * (i + 1))) for i in range(6)]  # 10, 20, ... 60 characters
    store.create(new_job(), records)
    assert pending_ids(store, records=4) == ["id-0", "id-1", "id-2", "id-3"]
    assert pending_ids(store, chars=35) == ["id-0", "id-1", "id-2"]  # 10 + 20 + 30 reaches 35
    assert pending_ids(store, after=4, chars=1) == ["id-5"]  # at least one
    store.claim_next(A, 30)
    store.write_batch("job-1", A, rows_for(records[1:3]))
    assert pending_ids(store) == ["id-0", "id-3", "id-4", "id-5"]


def test_a_lease_keeps_others_out_until_it_expires_then_the_job_is_taken_over(store):
    store.create(new_job(), RECORDS)
    first = store.claim_next(A, lease_s=0.3)
    assert first.owner == A and first.runs == 1
    assert store.claim_next(B, 30) is None  # A's lease holds
    assert store.renew("job-1", A, 0.3) and not store.renew("job-1", B, 0.3)
    store.write_batch("job-1", A, rows_for(RECORDS[:1]))
    time.sleep(0.4)  # A stops renewing: it died
    taken = store.claim_next(B, 30)
    assert taken.id == "job-1" and taken.owner == B and taken.runs == 2 and taken.stalled_runs == 0
    assert not store.renew("job-1", A, 30) and not store.write_batch("job-1", A, rows_for(RECORDS[1:2]))
    assert not store.finish("job-1", A, {}) and not store.fail("job-1", "A's late verdict", A)
    assert store.write_batch("job-1", B, rows_for(RECORDS[1:2], run=2))
    assert store.finish("job-1", B, {"rouge": None}) and store.get("job-1").status == "succeeded"


def test_an_owner_takes_its_own_job_back_at_once(store):
    store.create(new_job(), RECORDS)
    store.claim_next(A, 30)
    again = store.claim_next(A, 30)  # A dropped it while the database was down, and claims again
    assert again.id == "job-1" and again.runs == 2


def test_a_clean_release_is_no_stall(store):
    store.create(new_job(), RECORDS)
    for _ in range(MAX_STALLED_RUNS + 2):  # deploys while the first batch runs: never a failure
        job = store.claim_next(A, 30)
        assert job.status == "running" and job.stalled_runs == 0
        assert store.release("job-1", A) and store.get("job-1").status == "queued"
    assert not store.release("job-1", A)  # not running any more


def test_a_job_that_never_finishes_a_batch_is_failed_after_repeated_takeovers(store):
    store.create(new_job(), RECORDS)
    store.claim_next(A, 0)
    store.write_batch("job-1", A, rows_for(RECORDS[:1]))  # progress in run 1
    for i in range(MAX_STALLED_RUNS):  # the first takeover follows progress, the others none
        assert store.claim_next(f"owner-{i}", 0).status == "running"
    assert store.claim_next("last", 0) is None
    job = store.get("job-1")
    assert job.status == "failed" and f"stopped {MAX_STALLED_RUNS} times" in job.error


def test_progress_resets_the_stall_count(store):
    store.create(new_job(), RECORDS)
    store.claim_next(A, 0)
    store.write_batch("job-1", A, rows_for(RECORDS[:1]))
    for i in range(1, MAX_STALLED_RUNS + 2):
        job = store.claim_next(f"owner-{i}", 0)
        assert job.stalled_runs == 0
        store.write_batch("job-1", f"owner-{i}", rows_for(RECORDS[i : i + 1], run=job.runs))
    assert store.get("job-1").status == "running"


def test_counts_are_kept_by_triggers_not_counted(store):
    for i in range(3):
        store.create(new_job(f"job-{i}"), RECORDS)
    store.claim_next(A, 30)
    store.cancel("job-1")
    store.begin(new_job("loading"), B, 30)
    expected = {"queued": 1, "running": 1, "succeeded": 0, "failed": 0, "cancelled": 1}
    assert store.counts() == expected
    kept = dict(sql(store, "SELECT status, n FROM job_counts WHERE n > 0"))
    explain = "EXPLAIN QUERY PLAN" if store.sqlite else "EXPLAIN"
    plan = " ".join(str(row) for row in sql(store, f"{explain} SELECT status, n FROM job_counts"))
    assert kept == {**{k: v for k, v in expected.items() if v}, "loading": 1}
    assert "jobs" not in plan.replace("job_counts", "")


def test_a_job_is_claimed_by_one_replica_only_when_all_claim_at_once(store, replicas):
    for i in range(6):
        store.create(new_job(f"job-{i}"), RECORDS)
    stores = [store, *replicas(5)]
    claims: list[tuple[str, str]] = []
    start = threading.Barrier(len(stores))

    def claim(k: int) -> None:
        start.wait()
        while (job := stores[k].claim_next(f"replica-{k}", 30)) is not None:
            claims.append((job.id, f"replica-{k}"))
            time.sleep(0.01)  # running it, as a runner does, while the others claim
            assert stores[k].finish(job.id, f"replica-{k}", {})

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(job_id for job_id, _ in claims) == [f"job-{i}" for i in range(6)]  # each job once
    assert all(store.get(job_id).runs == 1 for job_id, _ in claims) and store.counts()["succeeded"] == 6


def test_a_cancel_on_another_replica_stops_the_owner_at_its_next_write(store, replicas):
    (other,) = replicas(1)
    store.create(new_job(), RECORDS)
    store.claim_next(A, 30)
    assert store.write_batch("job-1", A, rows_for(RECORDS[:1]))
    assert other.cancel("job-1")
    assert not store.renew("job-1", A, 30)  # what the owner's heartbeat sees: not ours any more
    assert not store.write_batch("job-1", A, rows_for(RECORDS[1:2]))
    assert not store.finish("job-1", A, {}) and other.get("job-1").status == "cancelled"
    assert [row["id"] for row in other.iter_rows("job-1")] == ["id-0"]


def test_the_pool_is_bounded_by_its_settings(store):
    from app.jobs.database import PoolLimits, StoreError

    bounded = JobStore(store.location, pool=PoolLimits(size=1, overflow=1, timeout_s=0.3))
    bounded.initialize()
    hold, holding = threading.Event(), threading.Semaphore(0)

    def reader() -> None:
        with bounded._read() as connection:
            connection.exec_driver_sql("SELECT 1")
            holding.release()
            hold.wait(10)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for _ in threads:
            assert holding.acquire(timeout=10)
        started = time.monotonic()
        with pytest.raises(StoreError, match="busy .every pooled connection is in use"):
            bounded.get("job-1")
        assert time.monotonic() - started >= 0.3  # it waited for a connection first
        assert bounded.engine.pool.checkedout() == 2
    finally:
        hold.set()
        for thread in threads:
            thread.join()
    assert bounded.get("nope") is None and bounded.engine.pool.checkedout() == 0
    bounded.close()


def test_listing_reaches_every_one_of_2500_jobs_page_by_page_both_ways(store):
    jobs = [{"id": f"job-{i:04d}", "created_at": 1000.0 + i // 25} for i in range(2500)]  # 25 share each time
    insert = ("INSERT INTO jobs (id, request_hash, status, model, dataset, columns, generation, total, created_at)"
              " VALUES (:id, 'h', :status, 'demo', '{}', '{}', '{}', 1, :created_at)")
    with store.engine.begin() as connection:
        connection.execute(text(insert), [{**job, "status": "succeeded" if i % 3 else "failed"}
                                          for i, job in enumerate(jobs)])
    newest_first = [job["id"] for job in sorted(jobs, key=lambda job: (job["created_at"], job["id"]), reverse=True)]
    seen, before = [], None
    while page := store.list(limit=300, before=before):
        seen += [job.id for job in page]
        before = store.key(page[-1])
    assert seen == newest_first  # every job once, in order
    back, after = [], store.key(store.get(newest_first[-1]))
    while page := store.list(limit=300, after=after):
        back = [job.id for job in page] + back
        after = store.key(page[0])
    assert back == newest_first[:-1]
    failed = [job.id for job in store.list("failed", limit=5000)]
    assert failed == [job_id for job_id in newest_first if int(job_id[4:]) % 3 == 0]
    tied = store.list("failed", limit=2, before=store.key(store.get("job-0003")))  # same time: the id decides
    assert [job.id for job in tied] == ["job-0000"]
