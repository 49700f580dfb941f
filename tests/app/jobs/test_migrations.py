"""The jobs database's schema under Alembic: new databases, files from before it, racing openers, newer schemas."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.jobs.database import StoreError
from app.jobs.migrations import HEAD, SchemaTooNew, legacy
from app.jobs.store import DuplicateId, JobStore, NewJob, StoredRecord
from bart_opt.pipeline.data import Record
from tests.app.jobs.helpers import at_once, sql

V4_FIXTURE = Path(__file__).parent / "fixtures" / "jobs-v4.db"  # made by the store of commit 9a82d87 (make_v4_db.py)
A = "host:1:a"


def new_job(job_id: str) -> NewJob:
    return NewJob(id=job_id, request_hash="h", model="demo", dataset={"file": "x.jsonl"},
                  columns={"text": "article", "summary": "highlights", "id": "id"}, limit=None,
                  generation={"num_beams": 2})


def test_the_version_is_the_newest_revision_file_and_the_command_prints_both(tmp_path):
    revisions = sorted(Path("app/jobs/migrations/versions").glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert HEAD == int(revisions[-1].name[:4]) >= 5
    store = JobStore(tmp_path / "jobs.db")
    store.initialize()
    store.close()
    shown = subprocess.run([sys.executable, "-m", "app.jobs.migrations", str(tmp_path / "jobs.db")],
                           capture_output=True, text=True, check=True).stdout
    assert f"code: schema version {HEAD}" in shown and f": schema version {HEAD}" in shown.splitlines()[1]


def test_a_v4_file_made_by_the_store_before_alembic_is_upgraded_in_place_keeping_everything(tmp_path):
    path = tmp_path / "jobs.db"
    shutil.copy(V4_FIXTURE, path)
    tables = ("jobs", "records", "predictions", "batches", "job_counts")
    with sqlite3.connect(path) as connection:
        columns = {table: [row[1] for row in connection.execute(f"PRAGMA table_info({table})")] for table in tables}
        before = {table: connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in tables}
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 4
    store = JobStore(path)
    store.initialize()
    with sqlite3.connect(path) as connection:
        after = {table: connection.execute(f"SELECT {', '.join(columns[table])} FROM {table} ORDER BY 1, 2").fetchall()
                 for table in tables}  # the v4 columns; later versions add some (schema 6: jobs.fingerprint)
        added = connection.execute("SELECT DISTINCT fingerprint FROM jobs").fetchall()
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [(f"{HEAD:04d}",)]
        assert connection.execute("PRAGMA user_version").fetchone()[0] == HEAD  # older servers now refuse it
        indexes = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert after == before and len(before["predictions"]) == 5  # no row lost or changed
    assert added == [(None,)]  # a job from before fingerprints has none (see the runner for what that means)
    assert {"jobs_listed", "jobs_by_status"} <= indexes
    done = store.get("done")
    assert (done.status, done.done, done.failed, done.baselines) == ("succeeded", 3, 1, ("lead-3",))
    assert store.find_by_key("key-done").id == "done"
    assert [row["id"] for row in store.iter_rows("done")] == ["done-0", "done-1", "done-2"]
    assert store.first_failures("done", 5) == [("done-2", "too long")]
    assert store.counts() == {"queued": 1, "running": 1, "succeeded": 1, "failed": 1, "cancelled": 1}
    assert [job.id for job in store.list(limit=2)] == ["broken", "stopped"]  # loading ones are not listed
    assert store.discard_stale() == ["partial"]
    claimed = store.claim_next(A, 30)  # the old server's lease on "half" ran out long ago: it resumes
    assert (claimed.id, claimed.runs, claimed.done) == ("half", 2, 2)
    assert [s.record.id for s in store.pending("half", -1, 10, 10**6)] == ["half-2", "half-3"]
    store.close()


def test_a_database_newer_than_the_code_is_refused_with_its_version(backend, tmp_path):
    store = JobStore(backend.url)
    store.initialize()
    with store.engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{HEAD + 1:04d}'")
    store.close()
    with pytest.raises(SchemaTooNew, match=f"schema version {HEAD + 1}; this server knows up to {HEAD}"):
        JobStore(backend.url).initialize()


def test_a_sqlite_file_newer_than_alembic_knows_is_refused_too(tmp_path):
    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA user_version = 99")
    with pytest.raises(SchemaTooNew, match="schema version 99"):
        JobStore(path).initialize()


def test_replicas_opening_a_new_database_at_once_migrate_it_once(backend):
    stores = [JobStore(backend.url) for _ in range(4)]
    assert at_once(*(store.initialize for store in stores)) == [None] * 4
    assert sql(stores[0], "SELECT version_num FROM alembic_version") == [(f"{HEAD:04d}",)]
    stores[0].create(new_job("j"), [Record("a", "text")])
    assert all(store.counts()["queued"] == 1 for store in stores)
    for store in stores:
        store.close()


def v1_database(path) -> None:
    """A database as the first version of the store left it: no schema version, a job mid-run."""
    with sqlite3.connect(path, isolation_level=None) as connection:
        connection.executescript(legacy.STEPS[0])
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
    assert sql(store, "SELECT version_num FROM alembic_version") == [(f"{HEAD:04d}",)]
    old = store.get("old")
    assert old.baselines == ()  # jobs from before baselines asked for none
    assert (old.status, old.done, old.failed, old.peak_bytes, old.owner) == ("running", 2, 1, 900, None)
    assert store.counts() == {"queued": 0, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 0}
    assert [row["id"] for row in map(json.loads, store.prediction_lines("old", "only"))] == ["id-1"]
    claimed = store.claim_next(A, 30)  # left running by the old server: no lease, so claimable
    assert claimed.id == "old" and claimed.runs == 2
    assert [s.record.id for s in store.pending("old", -1, 10, 10**6)] == ["id-2"]
    with pytest.raises(DuplicateId):  # the id index exists
        store.begin(new_job("n"), A, 30)
        store.add_records("n", A, 30, [StoredRecord(0, Record("a", "x")), StoredRecord(1, Record("a", "y"))])
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
            with pytest.raises(StoreError, match="is busy"):
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


def test_migrating_processes_race_safely_on_a_file_from_before_alembic(tmp_path):
    path = tmp_path / "jobs.db"
    v1_database(path)
    stores = [JobStore(path) for _ in range(4)]
    assert at_once(*(store.initialize for store in stores)) == [None] * 4
    assert stores[0].counts()["running"] == 1
    for store in stores:
        store.close()
