"""`JobStore`: streamed submissions, exactly-once predictions, leases, kept counts, schema migrations."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from app.jobs.schema import VERSION, SchemaTooNew, migrate, version
from app.jobs.store import MAX_STALLED_RUNS, BatchWrite, DuplicateId, JobStore, NewJob, StoredRecord
from bart_opt.data import Record

RECORDS = [Record(f"id-{i}", f"text {i}", f"reference {i}") for i in range(5)]
A, B = "host:1:a", "host:2:b"


@pytest.fixture
def store(tmp_path) -> JobStore:
    store = JobStore(tmp_path / "nested" / "jobs.db")
    store.initialize()
    yield store
    store.close()


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
    with sqlite3.connect(store.path) as connection:
        assert connection.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 0


def test_same_idempotency_key_gives_the_existing_job_even_when_racing(store):
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(store.create(new_job(f"job-{i}", key="k"), RECORDS)))
               for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1
    assert len(store.list()) == 1 and store.find_by_key("k").id == results[0][0].id
    with sqlite3.connect(store.path) as connection:  # the losers left no records behind
        assert connection.execute("SELECT COUNT(*) FROM records").fetchone()[0] == len(RECORDS)


def test_batches_are_written_once_per_example_and_only_by_the_running_owner(store):
    store.create(new_job(), RECORDS)
    assert not store.write_batch("job-1", A, rows_for(RECORDS[:2]))  # still queued
    assert store.claim_next(A, 30).status == "running"
    assert not store.write_batch("job-1", B, rows_for(RECORDS[:2]))  # not B's job
    assert store.write_batch("job-1", A, rows_for(RECORDS[:2]))
    assert pending_ids(store) == ["id-2", "id-3", "id-4"]
    with pytest.raises(sqlite3.IntegrityError):
        store.write_batch("job-1", A, rows_for(RECORDS[1:3]))  # id-1 again: the whole batch is refused
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
    with sqlite3.connect(store.path) as connection:
        kept = dict(connection.execute("SELECT status, n FROM job_counts WHERE n > 0"))
        plan = " ".join(row[3] for row in connection.execute("EXPLAIN QUERY PLAN SELECT status, n FROM job_counts"))
    assert kept == {**{k: v for k, v in expected.items() if v}, "loading": 1}
    assert "jobs" not in plan.replace("job_counts", "")


def v1_database(path) -> None:
    """A database as the first version of the store left it: no schema version, a job mid-run."""
    with sqlite3.connect(path, isolation_level=None) as connection:
        migrate(connection, target=1)
        connection.execute("PRAGMA user_version = 0")  # the first schema carried no version
        connection.execute(
            "INSERT INTO jobs (id, request_hash, status, model, dataset, columns, generation, total, done, failed,"
            " runs, done_at_start, created_at) VALUES ('old', 'h', 'running', 'demo', '{}', '{}', '{}', 3, 2, 1,"
            " 1, 0, 1.0)")
        connection.execute("INSERT INTO jobs (id, request_hash, status, model, dataset, columns, generation, total,"
                           " created_at) VALUES ('done', 'h', 'succeeded', 'demo', '{}', '{}', '{}', 1, 2.0)")
        connection.executemany("INSERT INTO records VALUES ('old', ?, ?, ?, NULL)",
                               [(i, f"id-{i}", f"text {i}") for i in range(3)])
        connection.executemany("INSERT INTO predictions VALUES ('old', ?, ?, 0, 1, ?)", [
            ("id-0", 0, json.dumps({"id": "id-0", "error": None})),
            ("id-1", 1, json.dumps({"id": "id-1", "error": "too long"}))])
        connection.executemany("INSERT INTO batches VALUES ('old', ?, 1, 1, ?, 1.0, 0.0, 1.0)", [(0, 700), (1, 900)])


def test_a_database_of_the_first_schema_migrates_forward_keeping_its_jobs(tmp_path):
    path = tmp_path / "jobs.db"
    v1_database(path)
    store = JobStore(path)
    store.initialize()
    with sqlite3.connect(path) as connection:
        assert version(connection) == VERSION == 4
    old = store.get("old")
    assert old.baselines == ()  # jobs from before baselines asked for none
    assert (old.status, old.done, old.failed, old.peak_bytes, old.owner) == ("running", 2, 1, 900, None)
    assert store.counts() == {"queued": 0, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 0}
    assert [row["id"] for row in map(json.loads, store.prediction_lines("old", "only"))] == ["id-1"]
    claimed = store.claim_next(A, 30)  # left running by the old server: no lease, so claimable
    assert claimed.id == "old" and claimed.runs == 2 and pending_ids(store, "old") == ["id-2"]
    with pytest.raises(DuplicateId):  # the id index exists
        store.begin(new_job("n"), A, 30)
        store.add_records("n", A, 30, [StoredRecord(0, RECORDS[0]), StoredRecord(1, RECORDS[0])])
    store.close()
    again = JobStore(path)
    again.initialize()  # opening a migrated database again changes nothing
    assert again.get("old").runs == 2
    again.close()


@pytest.mark.parametrize("held_s", [0.3, None])
def test_opening_waits_for_a_writer_of_a_rollback_journal_database_up_to_the_busy_timeout(tmp_path, held_s):
    # SQLite refuses the switch to WAL at once, without its busy handler, while another
    # connection holds the write lock of a database still in rollback-journal mode.
    path = tmp_path / "jobs.db"
    v1_database(path)
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    release = threading.Timer(held_s or 30, writer.execute, args=("ROLLBACK",))
    store = JobStore(path, busy_timeout=1.0)
    started = time.monotonic()
    release.start()
    try:
        if held_s is None:
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                store.initialize()
            assert 1.0 <= time.monotonic() - started < 5  # bounded by the busy timeout
        else:
            store.initialize()
            assert time.monotonic() - started >= held_s  # it waited for the writer
            assert store.counts()["running"] == 1
    finally:
        release.cancel()
        store.close()
        writer.close()


def test_migrating_processes_race_safely_and_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "jobs.db"
    v1_database(path)
    stores = [JobStore(path) for _ in range(4)]
    errors = []

    def open_store(store):
        try:
            store.initialize()
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=open_store, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and stores[0].counts()["running"] == 1
    for store in stores:
        store.close()
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA user_version = {VERSION + 1}")
    with pytest.raises(SchemaTooNew, match=f"schema version {VERSION + 1}"):
        JobStore(path).initialize()
