"""SQLite persistence of evaluation jobs: the job, its records, its predictions and its batches.

One file (``BART_OPT_DB``), four tables:

- ``jobs``: one row per job: status, model, dataset, columns, effective generation settings,
  counters (``done``, ``failed``, ``total``), the idempotency key, run bookkeeping and, once
  finished, the final metrics (JSON).
- ``records``: the job's input records, copied at submission so that a resume reads exactly
  what was submitted (a file edited or a hub dataset updated later changes nothing).
- ``predictions``: one row per example, primary key ``(job_id, example_id)``: an example can
  be written at most once, and a resume skips the ids already there, so each is written exactly once.
- ``batches``: one row per finished batch (size, memory peak, seconds).

Each finished batch is one transaction (``write_batch``): its predictions, its batch row and
the job's counters commit together or not at all, and only while the job is still
``running``, so a cancelled job never gains rows. The database runs in WAL mode with
``synchronous=FULL``: a committed batch survives a kill -9 (and a power cut). Every method opens
its own short-lived connection, so the store is safe to use from any thread.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bart_opt.data import Record

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
ACTIVE = ("queued", "running")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    idempotency_key TEXT UNIQUE,
    request_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    model TEXT NOT NULL,
    dataset TEXT NOT NULL,
    columns TEXT NOT NULL,
    record_limit INTEGER,
    generation TEXT NOT NULL,
    total INTEGER NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    work_s REAL NOT NULL DEFAULT 0,
    active_s REAL NOT NULL DEFAULT 0,
    runs INTEGER NOT NULL DEFAULT 0,
    stalled_runs INTEGER NOT NULL DEFAULT 0,
    done_at_start INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    error TEXT,
    metrics TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, created_at);
CREATE TABLE IF NOT EXISTS records (
    job_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    example_id TEXT NOT NULL,
    text TEXT NOT NULL,
    reference TEXT,
    PRIMARY KEY (job_id, position)
);
CREATE TABLE IF NOT EXISTS predictions (
    job_id TEXT NOT NULL,
    example_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    batch INTEGER NOT NULL,
    run INTEGER NOT NULL,
    row TEXT NOT NULL,
    PRIMARY KEY (job_id, example_id)
);
CREATE INDEX IF NOT EXISTS predictions_in_order ON predictions (job_id, position);
CREATE TABLE IF NOT EXISTS batches (
    job_id TEXT NOT NULL,
    batch INTEGER NOT NULL,
    run INTEGER NOT NULL,
    size INTEGER NOT NULL,
    peak_bytes INTEGER NOT NULL,
    seconds REAL NOT NULL,
    queue_s REAL NOT NULL,
    finished_at REAL NOT NULL,
    PRIMARY KEY (job_id, batch)
);
"""

# A job restarted this many times in a row without finishing a batch is failed, not resumed again
# (an input that crashes the process would otherwise crash every restart).
MAX_STALLED_RUNS = 3

_JSON_COLUMNS = ("dataset", "columns", "generation", "metrics")
# A job row plus the largest memory peak of its batches.
_SELECT_JOBS = (
    "SELECT jobs.*, (SELECT COALESCE(MAX(peak_bytes), 0) FROM batches WHERE batches.job_id = jobs.id) AS peak_bytes"
    " FROM jobs"
)


@dataclass
class NewJob:
    """What a job is created with (everything but its records and counters)."""

    id: str
    request_hash: str
    model: str
    dataset: dict
    columns: dict
    limit: int | None
    generation: dict
    idempotency_key: str | None = None


@dataclass
class BatchWrite:
    """One finished batch for `JobStore.write_batch`: its prediction rows and stats.

    ``rows`` are prediction rows as `bart_opt.evaluate` writes them (``id`` first);
    ``positions`` the records' positions in the job; ``seconds`` the batch's device time,
    ``queue_s`` how long it waited for the device, ``active_s`` the wall time since the
    previous batch of this run (or its start).
    """

    rows: list[dict]
    positions: list[int]
    run: int
    peak_bytes: int
    seconds: float
    queue_s: float
    active_s: float


class JobStore:
    """The jobs database at `path` (created with its folder on `initialize`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @contextmanager
    def _connect(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection for one operation; `write` takes the write lock up front and commits at the end."""
        connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA synchronous=FULL")
            if not write:
                yield connection
                return
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        finally:
            connection.close()

    def initialize(self) -> None:
        """Create the folder, the tables and WAL mode (idempotent)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as connection:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.executescript(_SCHEMA)

    # ---- creating and finding ----------------------------------------------------------

    def create(self, job: NewJob, records: Sequence[Record]) -> tuple[dict, bool]:
        """Insert a queued job with its records; returns ``(job, True)``.

        When `job.idempotency_key` is already taken (a concurrent twin), nothing is inserted
        and the existing job comes back as ``(existing, False)``.
        """
        try:
            with self._connect(write=True) as connection:
                connection.execute(
                    "INSERT INTO jobs (id, idempotency_key, request_hash, status, model, dataset, columns,"
                    " record_limit, generation, total, created_at) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
                    (job.id, job.idempotency_key, job.request_hash, job.model, _dumps(job.dataset),
                     _dumps(job.columns), job.limit, _dumps(job.generation), len(records), time.time()),
                )
                connection.executemany(
                    "INSERT INTO records (job_id, position, example_id, text, reference) VALUES (?, ?, ?, ?, ?)",
                    ((job.id, i, r.id, r.text, r.reference) for i, r in enumerate(records)),
                )
        except sqlite3.IntegrityError:
            existing = self.find_by_key(job.idempotency_key) if job.idempotency_key else None
            if existing is None:
                raise
            return existing, False
        return self.get(job.id), True

    def get(self, job_id: str) -> dict | None:
        """The job as a dict (JSON columns decoded), or None."""
        with self._connect() as connection:
            row = connection.execute(f"{_SELECT_JOBS} WHERE id = ?", (job_id,)).fetchone()
        return _job(row)

    def find_by_key(self, key: str) -> dict | None:
        """The job created with idempotency key `key`, or None."""
        with self._connect() as connection:
            row = connection.execute(f"{_SELECT_JOBS} WHERE idempotency_key = ?", (key,)).fetchone()
        return _job(row)

    def list(self, status: str | None = None, limit: int = 100, offset: int = 0) -> list[dict]:
        """Jobs, newest first, optionally only those with `status`."""
        where, args = ("WHERE status = ?", [status]) if status else ("", [])
        with self._connect() as connection:
            rows = connection.execute(
                f"{_SELECT_JOBS} {where} ORDER BY created_at DESC, id LIMIT ? OFFSET ?", (*args, limit, offset)
            ).fetchall()
        return [_job(row) for row in rows]

    def counts(self) -> dict[str, int]:
        """Number of jobs per status (every status present, 0 when none)."""
        with self._connect() as connection:
            rows = connection.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall()
        return {**dict.fromkeys(STATUSES, 0), **{status: n for status, n in rows}}

    def records(self, job_id: str) -> list[Record]:
        """The job's records in submission order."""
        with self._connect() as connection:
            rows = connection.execute(
                "SELECT example_id, text, reference FROM records WHERE job_id = ? ORDER BY position", (job_id,)
            ).fetchall()
        return [Record(row[0], row[1], row[2]) for row in rows]

    def done_ids(self, job_id: str) -> set[str]:
        """Ids of the examples that already have a prediction row."""
        with self._connect() as connection:
            rows = connection.execute("SELECT example_id FROM predictions WHERE job_id = ?", (job_id,)).fetchall()
        return {row[0] for row in rows}

    def rows(self, job_id: str) -> dict[str, dict]:
        """Every prediction row of the job, by example id."""
        with self._connect() as connection:
            rows = connection.execute("SELECT example_id, row FROM predictions WHERE job_id = ?", (job_id,)).fetchall()
        return {row[0]: json.loads(row[1]) for row in rows}

    def example(self, job_id: str, example_id: str) -> tuple[Record | None, dict | None]:
        """One example of the job: its record and its prediction row (each None when absent)."""
        with self._connect() as connection:
            record = connection.execute(
                "SELECT example_id, text, reference FROM records WHERE job_id = ? AND example_id = ?",
                (job_id, example_id),
            ).fetchone()
            row = connection.execute(
                "SELECT row FROM predictions WHERE job_id = ? AND example_id = ?", (job_id, example_id)
            ).fetchone()
        return (Record(*record) if record else None), (json.loads(row[0]) if row else None)

    def prediction_lines(self, job_id: str, page: int = 500) -> Iterator[str]:
        """The job's prediction rows as JSON lines, in record order, read a page at a time."""
        after = -1
        while True:
            with self._connect() as connection:
                rows = connection.execute(
                    "SELECT position, row FROM predictions WHERE job_id = ? AND position > ? ORDER BY position LIMIT ?",
                    (job_id, after, page),
                ).fetchall()
            for _, row in rows:
                yield row + "\n"
            if len(rows) < page:
                return
            after = rows[-1][0]

    def batches(self, job_id: str) -> list[dict]:
        """The job's finished batches in order: batch, run, size, peak_bytes, seconds, queue_s."""
        with self._connect() as connection:
            rows = connection.execute(
                "SELECT batch, run, size, peak_bytes, seconds, queue_s FROM batches WHERE job_id = ? ORDER BY batch",
                (job_id,),
            ).fetchall()
        return [dict(row) for row in rows]

    # ---- the runner's transitions ------------------------------------------------------

    def requeue_interrupted(self) -> list[str]:
        """Put jobs left ``running`` by a stopped or killed process back in the queue; returns their ids."""
        with self._connect(write=True) as connection:
            ids = [row[0] for row in connection.execute("SELECT id FROM jobs WHERE status = 'running'")]
            connection.execute("UPDATE jobs SET status = 'queued' WHERE status = 'running'")
        return ids

    def claim_next(self) -> dict | None:
        """Mark the oldest queued job ``running`` and return it (None when none is queued).

        A job whose previous runs finished no batch `MAX_STALLED_RUNS` times in a row is
        failed instead, and the next one is tried.
        """
        while True:
            with self._connect(write=True) as connection:
                row = connection.execute(
                    "SELECT * FROM jobs WHERE status = 'queued' ORDER BY created_at, id LIMIT 1"
                ).fetchone()
                if row is None:
                    return None
                resumed = row["runs"] > 0
                stalled = row["stalled_runs"] + 1 if resumed and row["done"] == row["done_at_start"] else 0
                if stalled >= MAX_STALLED_RUNS:
                    reason = (f"the server stopped {stalled} times in a row while running this job without "
                              "finishing a batch; not resuming it again")
                    connection.execute(
                        "UPDATE jobs SET status = 'failed', error = ?, finished_at = ? WHERE id = ?",
                        (reason, time.time(), row["id"]),
                    )
                    continue
                connection.execute(
                    "UPDATE jobs SET status = 'running', runs = runs + 1, stalled_runs = ?, done_at_start = done,"
                    " started_at = COALESCE(started_at, ?) WHERE id = ?",
                    (stalled, time.time(), row["id"]),
                )
            return self.get(row["id"])

    def write_batch(self, job_id: str, batch: BatchWrite) -> bool:
        """Store one finished batch in one transaction; False (nothing written) unless the job is running."""
        rows = batch.rows
        with self._connect(write=True) as connection:
            status = connection.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if status is None or status[0] != "running":
                return False
            number = connection.execute(
                "SELECT COALESCE(MAX(batch), -1) + 1 FROM batches WHERE job_id = ?", (job_id,)
            ).fetchone()[0]
            connection.executemany(
                "INSERT INTO predictions (job_id, example_id, position, batch, run, row) VALUES (?, ?, ?, ?, ?, ?)",
                ((job_id, row["id"], position, number, batch.run, _dumps(row))
                 for row, position in zip(rows, batch.positions)),
            )
            connection.execute(
                "INSERT INTO batches (job_id, batch, run, size, peak_bytes, seconds, queue_s, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, number, batch.run, len(rows), batch.peak_bytes, batch.seconds, batch.queue_s, time.time()),
            )
            connection.execute(
                "UPDATE jobs SET done = done + ?, failed = failed + ?, work_s = work_s + ?, active_s = active_s + ?"
                " WHERE id = ?",
                (len(rows), sum(row["error"] is not None for row in rows), sum(row["seconds"] for row in rows),
                 batch.active_s, job_id),
            )
        return True

    def finish(self, job_id: str, metrics: dict) -> bool:
        """Mark a running job ``succeeded`` with its final metrics; False if it was not running."""
        return self._transition(job_id, ("running",), "succeeded", metrics=_dumps(metrics))

    def fail(self, job_id: str, reason: str) -> bool:
        """Mark a queued or running job ``failed`` with `reason`; False if it had already ended."""
        return self._transition(job_id, ACTIVE, "failed", error=reason)

    def cancel(self, job_id: str) -> bool:
        """Mark a queued or running job ``cancelled``; False if it had already ended."""
        return self._transition(job_id, ACTIVE, "cancelled")

    def _transition(self, job_id: str, allowed: Sequence[str], status: str, **columns: Any) -> bool:
        assignments = "".join(f", {name} = ?" for name in columns)
        marks = ", ".join("?" * len(allowed))
        with self._connect(write=True) as connection:
            changed = connection.execute(
                f"UPDATE jobs SET status = ?, finished_at = ?{assignments} WHERE id = ? AND status IN ({marks})",
                (status, time.time(), *columns.values(), job_id, *allowed),
            ).rowcount
        return changed == 1


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _job(row: sqlite3.Row | None) -> dict | None:
    if row is None:
        return None
    job = dict(row)
    for column in _JSON_COLUMNS:
        if job[column] is not None:
            job[column] = json.loads(job[column])
    return job
