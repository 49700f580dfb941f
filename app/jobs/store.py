"""SQLite persistence of evaluation jobs: the job, its records, its predictions and its batches.

One file (``BART_OPT_DB``) shared by every service process that points at it. The tables (see
`app.jobs.schema`, which versions and migrates them):

- ``jobs``: one row per job: status, model, dataset, columns, effective generation settings,
  counters (``done``, ``failed``, ``total``, ``peak_bytes``), the idempotency key, run
  bookkeeping, the lease (``owner``, ``lease_until``), what a running job waits for
  (``status_detail``) and, once finished, the final metrics.
- ``records``: the job's input records, copied at submission so that a resume reads exactly
  what was submitted; ``error`` marks a record that cannot run (it gets an error row, no model call).
- ``predictions``: one row per example, primary key ``(job_id, example_id)``.
- ``batches``: one row per finished model batch (size, memory peak, seconds).
- ``job_counts``: jobs per status, kept by triggers.

**Submitting streams.** `begin` inserts the job as ``loading`` (owned by the submitting process,
with a lease), `add_records` appends a chunk of records per transaction, `seal` makes it
``queued``; `discard` removes a job whose records turned out bad. A process that dies while
loading leaves a ``loading`` job whose lease runs out; `discard_stale` removes it.

**Claiming by lease.** `claim_next` gives the oldest queued job (or a running one whose lease
expired: its owner died) to one owner, in one write transaction, so several processes never
run the same job. The owner renews the lease while it runs (`renew`); every write of the
runner (`write_batch`, `finish`, `fail` with an owner) checks that the job is still running
*and still its own*, so a process that lost its lease (cancelled, or taken over after a
stall) cannot add rows. `release` hands a job back cleanly on shutdown (not a stall).

Each finished batch is one transaction (predictions, batch row, counters). The database runs
in WAL mode with ``synchronous=FULL``: a committed batch survives a kill -9 and a power cut.
Each thread has its own connection (opened on first use, replaced after an error that may
have broken it). Errors are `sqlite3.Error`s; `describe_store_error` turns one into words
a client may see.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.jobs.job import ACTIVE, STATUSES, Job
from app.jobs.schema import migrate
from bart_opt.data import Record

ERROR_FILTERS = ("include", "only", "exclude")

# A job restarted this many times in a row without finishing a batch is failed, not resumed again
# (an input that crashes the process would otherwise crash every restart).
MAX_STALLED_RUNS = 3

_JSON_COLUMNS = ("dataset", "columns", "generation", "baselines", "metrics")
_DISCARD_CHUNK = 5000
_ERROR_PHRASES = {
    "SQLITE_READONLY": "is read-only",
    "SQLITE_FULL": "is full (no space left on its disk)",
    "SQLITE_BUSY": "is busy (locked by another writer)",
    "SQLITE_LOCKED": "is busy (locked by another writer)",
    "SQLITE_CANTOPEN": "cannot be opened",
    "SQLITE_IOERR": "cannot be read or written (an I/O error)",
    "SQLITE_CORRUPT": "is damaged",
    "SQLITE_NOTADB": "is not a database",
    "SQLITE_PERM": "cannot be accessed (permission denied)",
}


def describe_store_error(error: BaseException) -> str:
    """A sentence about a database failure that is safe to show a client (no path, no SQL)."""
    extended = getattr(error, "sqlite_errorname", None) or ""
    primary = "_".join(extended.split("_")[:2])  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
    return f"the jobs database (BART_OPT_DB) {_ERROR_PHRASES.get(primary, 'cannot be used')}"


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
    baselines: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoredRecord:
    """One record as stored: its position in the job, the record, and why it cannot run (or None)."""

    position: int
    record: Record
    error: str | None = None


class DuplicateId(ValueError):
    """A record id that the job already has."""

    def __init__(self, example_id: str, first: int, again: int):
        super().__init__(f"duplicate id {example_id!r} at rows {first} and {again}; ids must be unique")


@dataclass
class BatchWrite:
    """Prediction rows to store in one transaction, with the stats of the batch they came from.

    ``rows`` are prediction rows as `bart_opt.evaluate` writes them (``id`` first);
    ``positions`` the records' positions in the job. A model batch (``model_call``) also gets a
    ``batches`` row: ``seconds`` its device time, ``queue_s`` how long it waited for the device.
    ``active_s`` is the wall time since the previous write of this run (or its start).
    """

    rows: list[dict]
    positions: list[int]
    run: int
    peak_bytes: int = 0
    seconds: float = 0.0
    queue_s: float = 0.0
    active_s: float = 0.0
    model_call: bool = True


class JobStore:
    """The jobs database at `path` (created with its folder on `initialize`).

    `connection_factory` is the `sqlite3.Connection` class connections are made from (tests
    pass a subclass that injects faults); `busy_timeout` is how long a write waits for
    another writer before failing with SQLITE_BUSY.
    """

    def __init__(self, path: str | Path, *, connection_factory: type[sqlite3.Connection] = sqlite3.Connection,
                 busy_timeout: float = 15.0):
        self.path = Path(path)
        self._factory = connection_factory
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._open: set[sqlite3.Connection] = set()
        self._open_lock = threading.Lock()

    # ---- connections -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                         check_same_thread=False, factory=self._factory)
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA synchronous=FULL")
            self._local.connection = connection
            with self._open_lock:
                self._open.add(connection)
        return connection

    def _drop(self, connection: sqlite3.Connection) -> None:
        """Forget a connection that failed mid-transaction; the thread's next call opens a new one."""
        self._local.connection = None
        with self._open_lock:
            self._open.discard(connection)
        try:
            connection.close()
        except sqlite3.Error:
            pass

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        yield self._connection()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: the write lock up front, commit at the end, rollback on any error."""
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
            connection.execute("COMMIT")
        except BaseException:
            try:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
            except sqlite3.Error:
                self._drop(connection)
            raise

    def initialize(self) -> None:
        """Create the folder, enable WAL mode and migrate the schema to the current version."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = self._connection()
        self._enable_wal(connection)
        migrate(connection)

    def _enable_wal(self, connection: sqlite3.Connection) -> None:
        """Switch the database to WAL mode, waiting up to the busy timeout for other connections.

        While another process or thread is opening a database in rollback-journal mode (a new
        file, or one from before WAL), the switch can fail with "database is locked" at once:
        SQLite does not run the busy handler there (it measured 7 of 300 four-way races). So the
        switch is retried, with a growing pause, until it succeeds or the timeout passes.
        """
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.005
        while True:
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                busy = (getattr(error, "sqlite_errorname", None) or "").startswith("SQLITE_BUSY")  # another process
                left = deadline - time.monotonic()
                if not busy or left <= 0:
                    raise
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.25)

    def close(self) -> None:
        """Close every connection this store opened (call once no thread uses it any more)."""
        with self._open_lock:
            connections, self._open = self._open, set()
        for connection in connections:
            connection.close()
        self._local = threading.local()

    # ---- submitting ----------------------------------------------------------------------

    def begin(self, job: NewJob, owner: str, lease_s: float) -> tuple[Job, bool]:
        """Insert `job` as ``loading``, owned by `owner`; returns ``(job, True)``.

        When `job.idempotency_key` is already taken, nothing is inserted and the existing job
        comes back as ``(existing, False)`` (possibly still ``loading``).
        """
        try:
            with self._write() as connection:
                connection.execute(
                    "INSERT INTO jobs (id, idempotency_key, request_hash, status, model, dataset, columns,"
                    " record_limit, generation, baselines, total, created_at, owner, lease_until)"
                    " VALUES (?, ?, ?, 'loading', ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
                    (job.id, job.idempotency_key, job.request_hash, job.model, _dumps(job.dataset),
                     _dumps(job.columns), job.limit, _dumps(job.generation), _dumps(list(job.baselines)),
                     time.time(), owner, time.time() + lease_s),
                )
        except sqlite3.IntegrityError:
            existing = self.find_by_key(job.idempotency_key) if job.idempotency_key else None
            if existing is None:
                raise
            return existing, False
        return self.get(job.id), True

    def add_records(self, job_id: str, owner: str, lease_s: float, records: Sequence[StoredRecord]) -> bool:
        """Append records to a ``loading`` job of `owner` in one transaction, renewing its lease.

        Returns False (nothing written) when the job is no longer loading under `owner`.
        Raises `DuplicateId` for an id the job already has or that repeats within `records`.
        """
        with self._write() as connection:
            if not self._renew(connection, job_id, owner, lease_s, "loading"):
                return False
            try:
                connection.executemany(
                    "INSERT INTO records (job_id, position, example_id, text, reference, error)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    ((job_id, r.position, r.record.id, r.record.text, r.record.reference, r.error) for r in records),
                )
            except sqlite3.IntegrityError:
                raise self._duplicate(connection, job_id, records) from None
        return True

    @staticmethod
    def _duplicate(connection: sqlite3.Connection, job_id: str, records: Sequence[StoredRecord]) -> DuplicateId:
        """The first repeated id of `records` (in order), against earlier chunks and within this one."""
        seen: dict[str, int] = {}
        for stored in records:
            example_id = stored.record.id
            row = connection.execute(  # earlier chunks only: this one's rows are not rolled back yet
                "SELECT position FROM records WHERE job_id = ? AND example_id = ? AND position < ?",
                (job_id, example_id, records[0].position),
            ).fetchone()
            first = row[0] if row is not None else seen.get(example_id)
            if first is not None:
                return DuplicateId(example_id, first, stored.position)
            seen[example_id] = stored.position
        return DuplicateId("?", -1, -1)

    def seal(self, job_id: str, owner: str, total: int) -> Job | None:
        """Make a ``loading`` job of `owner` ``queued`` with `total` records (None if it is not).

        The submission time becomes the moment it was sealed, so it queues after jobs that were
        ready before it.
        """
        with self._write() as connection:
            changed = connection.execute(
                "UPDATE jobs SET status = 'queued', total = ?, owner = NULL, lease_until = NULL, created_at = ?"
                " WHERE id = ? AND status = 'loading' AND owner = ?",
                (total, time.time(), job_id, owner),
            ).rowcount
        return self.get(job_id) if changed else None

    def create(self, job: NewJob, records: Sequence[Record]) -> tuple[Job, bool]:
        """`begin`, `add_records` and `seal` at once: a queued job with `records` (small jobs, tests)."""
        owner = f"create:{job.id}"
        created, new = self.begin(job, owner, lease_s=60)
        if not new:
            return created, False
        self.add_records(job.id, owner, 60, [StoredRecord(i, r) for i, r in enumerate(records)])
        return self.seal(job.id, owner, len(records)), True

    def discard(self, job_id: str) -> None:
        """Delete a job, its records and anything else it has, a chunk of records per transaction."""
        while True:
            with self._write() as connection:
                deleted = connection.execute(
                    "DELETE FROM records WHERE rowid IN (SELECT rowid FROM records WHERE job_id = ? LIMIT ?)",
                    (job_id, _DISCARD_CHUNK),
                ).rowcount
            if deleted < _DISCARD_CHUNK:
                break
        with self._write() as connection:
            for table in ("predictions", "batches", "jobs"):
                column = "id" if table == "jobs" else "job_id"
                connection.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))

    def discard_stale(self) -> list[str]:
        """Discard ``loading`` jobs whose loader died (lease expired); returns their ids."""
        with self._read() as connection:
            ids = [row[0] for row in connection.execute(
                "SELECT id FROM jobs WHERE status = 'loading' AND lease_until < ?", (time.time(),))]
        for job_id in ids:
            self.discard(job_id)
        return ids

    # ---- finding ---------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        """The job, or None."""
        with self._read() as connection:
            row = connection.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row)

    def find_by_key(self, key: str) -> Job | None:
        """The job created with idempotency key `key`, or None."""
        with self._read() as connection:
            row = connection.execute("SELECT * FROM jobs WHERE idempotency_key = ?", (key,)).fetchone()
        return _job(row)

    def list(self, status: str | None = None, limit: int = 100, offset: int = 0) -> list[Job]:
        """Jobs, newest first, optionally only those with `status` (``loading`` ones never)."""
        where, args = ("status = ?", [status]) if status else ("status != 'loading'", [])
        with self._read() as connection:
            rows = connection.execute(
                f"SELECT * FROM jobs WHERE {where} ORDER BY created_at DESC, id LIMIT ? OFFSET ?",
                (*args, limit, offset),
            ).fetchall()
        return [_job(row) for row in rows]

    def counts(self) -> dict[str, int]:
        """Number of jobs per status (every status present, 0 when none), from the kept counts."""
        with self._read() as connection:
            rows = connection.execute("SELECT status, n FROM job_counts").fetchall()
        found = {status: n for status, n in rows if status in STATUSES}
        return {**dict.fromkeys(STATUSES, 0), **found}

    def prediction_lines(self, job_id: str, errors: str = "include", page: int = 500) -> Iterator[str]:
        """The job's prediction rows as JSON lines, in record order, read a page at a time.

        `errors`: ``include`` every row, ``only`` the rows of failed examples, ``exclude`` the others.
        """
        condition = {"include": "", "only": " AND failed = 1", "exclude": " AND failed = 0"}[errors]
        for _, row in self._pages(job_id, condition, page):
            yield row + "\n"

    def iter_rows(self, job_id: str, page: int = 500) -> Iterator[dict]:
        """Every prediction row of the job, decoded, in record order, read a page at a time."""
        for _, row in self._pages(job_id, "", page):
            yield json.loads(row)

    def example(self, job_id: str, example_id: str) -> tuple[Record | None, dict | None]:
        """One example of the job: its record and its prediction row (each None when absent)."""
        with self._read() as connection:
            record = connection.execute(
                "SELECT example_id, text, reference FROM records WHERE job_id = ? AND example_id = ?",
                (job_id, example_id),
            ).fetchone()
            row = connection.execute(
                "SELECT row FROM predictions WHERE job_id = ? AND example_id = ?", (job_id, example_id)
            ).fetchone()
        return (Record(*record) if record else None), (json.loads(row[0]) if row else None)

    def iter_records(self, job_id: str, page: int = 500) -> Iterator[Record]:
        """Every record of the job, in order, read a page at a time."""
        query = "SELECT position, example_id, text, reference FROM records WHERE job_id = ? AND position > ?"
        for _, example_id, text, reference in self._paged(query, job_id, page):
            yield Record(example_id, text, reference)

    def _pages(self, job_id: str, condition: str, page: int) -> Iterator[tuple[int, str]]:
        query = f"SELECT position, row FROM predictions WHERE job_id = ? AND position > ?{condition}"
        yield from self._paged(query, job_id, page)

    def _paged(self, query: str, job_id: str, page: int) -> Iterator[tuple]:
        """The rows of `query` (position first; filtered on ``job_id = ? AND position > ?``) in
        position order, `page` rows per read transaction."""
        after = -1
        while True:
            with self._read() as connection:
                rows = connection.execute(f"{query} ORDER BY position LIMIT ?", (job_id, after, page)).fetchall()
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1][0]

    def first_failures(self, job_id: str, n: int) -> list[tuple[str, str]]:
        """``(example id, error)`` of the job's first `n` failed examples, in record order."""
        with self._read() as connection:
            rows = connection.execute(
                "SELECT example_id, json_extract(row, '$.error') FROM predictions WHERE job_id = ? AND failed = 1"
                " ORDER BY position LIMIT ?",
                (job_id, n),
            ).fetchall()
        return [(row[0], row[1]) for row in rows]

    def batches(self, job_id: str) -> list[dict]:
        """The job's finished batches in order: batch, run, size, peak_bytes, seconds, queue_s."""
        with self._read() as connection:
            rows = connection.execute(
                "SELECT batch, run, size, peak_bytes, seconds, queue_s FROM batches WHERE job_id = ? ORDER BY batch",
                (job_id,),
            ).fetchall()
        return [dict(row) for row in rows]

    def pending(self, job_id: str, after: int, max_records: int, max_chars: int) -> list[StoredRecord]:
        """The next records after position `after` without a prediction, in order: at most
        `max_records`, and no more once their texts reach `max_chars` characters (at least one)."""
        found: list[StoredRecord] = []
        chars = 0
        with self._read() as connection:
            cursor = connection.execute(
                "SELECT position, example_id, text, reference, error FROM records AS r"
                " WHERE job_id = ? AND position > ? AND NOT EXISTS"
                " (SELECT 1 FROM predictions AS p WHERE p.job_id = r.job_id AND p.example_id = r.example_id)"
                " ORDER BY position",
                (job_id, after),
            )
            try:
                for position, example_id, text, reference, error in cursor:
                    found.append(StoredRecord(position, Record(example_id, text, reference), error))
                    chars += len(text)
                    if len(found) >= max_records or chars >= max_chars:
                        break
            finally:
                cursor.close()
        return found

    # ---- the runner's transitions ------------------------------------------------------

    def claim_next(self, owner: str, lease_s: float) -> Job | None:
        """Give `owner` the oldest claimable job, marked ``running`` under its lease (None when none).

        Claimable: queued, or running under a lease that expired (its owner stopped renewing:
        it died) or under `owner`'s own (a job this process dropped while the store was down).
        A job whose previous runs finished no batch `MAX_STALLED_RUNS` times in a row is failed
        instead, and the next one is tried. A run that was released cleanly is no stall.
        """
        now = time.time()
        with self._write() as connection:
            while True:
                row = connection.execute(
                    "SELECT * FROM jobs WHERE status = 'queued' OR (status = 'running' AND"
                    " (lease_until IS NULL OR lease_until < ? OR owner = ?)) ORDER BY created_at, id LIMIT 1",
                    (now, owner),
                ).fetchone()
                if row is None:
                    return None
                resumed, at_start = row["runs"] > 0, row["done_at_start"]
                if not resumed or (at_start is not None and row["done"] > at_start):
                    stalled = 0
                elif at_start is None:
                    stalled = row["stalled_runs"]
                else:
                    stalled = row["stalled_runs"] + 1
                if stalled >= MAX_STALLED_RUNS:
                    reason = (f"the server stopped {stalled} times in a row while running this job without "
                              "finishing a batch; not resuming it again")
                    connection.execute(
                        "UPDATE jobs SET status = 'failed', error = ?, finished_at = ?, owner = NULL,"
                        " lease_until = NULL WHERE id = ?",
                        (reason, now, row["id"]),
                    )
                    continue
                connection.execute(
                    "UPDATE jobs SET status = 'running', runs = runs + 1, stalled_runs = ?, done_at_start = done,"
                    " started_at = COALESCE(started_at, ?), owner = ?, lease_until = ?, status_detail = NULL"
                    " WHERE id = ?",
                    (stalled, now, owner, now + lease_s, row["id"]),
                )
                job = _job(connection.execute("SELECT * FROM jobs WHERE id = ?", (row["id"],)).fetchone())
                return job

    def renew(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Extend `owner`'s lease on a running or loading job; False when it is no longer its own."""
        with self._write() as connection:
            return self._renew(connection, job_id, owner, lease_s, "running", "loading")

    @staticmethod
    def _renew(connection: sqlite3.Connection, job_id: str, owner: str, lease_s: float, *statuses: str) -> bool:
        marks = ", ".join("?" * len(statuses))
        return connection.execute(
            f"UPDATE jobs SET lease_until = ? WHERE id = ? AND owner = ? AND status IN ({marks})",
            (time.time() + lease_s, job_id, owner, *statuses),
        ).rowcount == 1

    def set_detail(self, job_id: str, owner: str, detail: str | None) -> bool:
        """Say what a running job of `owner` waits for or runs on (``status_detail``); False if it is not."""
        with self._write() as connection:
            return connection.execute(
                "UPDATE jobs SET status_detail = ? WHERE id = ? AND owner = ? AND status = 'running'",
                (detail, job_id, owner),
            ).rowcount == 1

    def release(self, job_id: str, owner: str) -> bool:
        """Hand a running job of `owner` back to the queue on a clean stop (no stall is counted)."""
        with self._write() as connection:
            return connection.execute(
                "UPDATE jobs SET status = 'queued', owner = NULL, lease_until = NULL, status_detail = NULL,"
                " stalled_runs = CASE WHEN done > COALESCE(done_at_start, done) THEN 0 ELSE stalled_runs END,"
                " done_at_start = NULL WHERE id = ? AND owner = ? AND status = 'running'",
                (job_id, owner),
            ).rowcount == 1

    def write_batch(self, job_id: str, owner: str, batch: BatchWrite) -> bool:
        """Store prediction rows in one transaction; False (nothing written) unless the job is
        running under `owner`."""
        rows = batch.rows
        with self._write() as connection:
            found = connection.execute("SELECT status, owner FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if found is None or found["status"] != "running" or found["owner"] != owner:
                return False
            number = -1
            if batch.model_call:
                number = connection.execute(
                    "SELECT COALESCE(MAX(batch), -1) + 1 FROM batches WHERE job_id = ?", (job_id,)
                ).fetchone()[0]
                connection.execute(
                    "INSERT INTO batches (job_id, batch, run, size, peak_bytes, seconds, queue_s, finished_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (job_id, number, batch.run, len(rows), batch.peak_bytes, batch.seconds, batch.queue_s,
                     time.time()),
                )
            connection.executemany(
                "INSERT INTO predictions (job_id, example_id, position, batch, run, row, failed)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                ((job_id, row["id"], position, number, batch.run, _dumps(row), int(row["error"] is not None))
                 for row, position in zip(rows, batch.positions)),
            )
            connection.execute(
                "UPDATE jobs SET done = done + ?, failed = failed + ?, work_s = work_s + ?, active_s = active_s + ?,"
                " peak_bytes = MAX(peak_bytes, ?) WHERE id = ?",
                (len(rows), sum(row["error"] is not None for row in rows), sum(row["seconds"] for row in rows),
                 batch.active_s, batch.peak_bytes, job_id),
            )
        return True

    def finish(self, job_id: str, owner: str, metrics: dict) -> bool:
        """Mark a running job of `owner` ``succeeded`` with its final metrics; False if it is not."""
        return self._transition(job_id, ("running",), "succeeded", owner=owner, metrics=_dumps(metrics))

    def fail(self, job_id: str, reason: str, owner: str | None = None) -> bool:
        """Mark a queued or running job ``failed`` with `reason` (only while `owner` holds it, when
        given); False if it had already ended."""
        return self._transition(job_id, ACTIVE, "failed", owner=owner, error=reason)

    def cancel(self, job_id: str) -> bool:
        """Mark a queued or running job ``cancelled``; False if it had already ended."""
        return self._transition(job_id, ACTIVE, "cancelled")

    def _transition(self, job_id: str, allowed: Sequence[str], status: str, owner: str | None = None,
                    **columns: Any) -> bool:
        assignments = "".join(f", {name} = ?" for name in columns)
        marks = ", ".join("?" * len(allowed))
        mine = " AND owner = ?" if owner is not None else ""
        with self._write() as connection:
            changed = connection.execute(
                f"UPDATE jobs SET status = ?, finished_at = ?, owner = NULL, lease_until = NULL, status_detail = NULL"
                f"{assignments}"
                f" WHERE id = ? AND status IN ({marks}){mine}",
                (status, time.time(), *columns.values(), job_id, *allowed, *([owner] if owner is not None else [])),
            ).rowcount
        return changed == 1


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _job(row: sqlite3.Row | None) -> Job | None:
    if row is None:
        return None
    job = dict(row)
    for column in _JSON_COLUMNS:
        if job[column] is not None:
            job[column] = json.loads(job[column])
    return Job.from_row(job)
