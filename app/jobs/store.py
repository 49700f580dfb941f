"""Persistence of evaluation jobs, on SQLite or PostgreSQL: the job, its records, its predictions and its batches.

One database (``BART_OPT_DB``, see `app.jobs.database`) shared by every service process (replica)
that points at it. The tables (see `app.jobs.migrations`, which versions and migrates them):

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
loading leaves a ``loading`` job whose lease runs out; `discard_stale` takes it from its
loader (so a late chunk is refused) and removes it.

**Claiming by lease.** `claim_next` gives the oldest queued job (or a running one whose lease
expired: its owner died) to one owner, in one write transaction, so several processes never
run the same job. The owner renews the lease while it runs (`renew`); every write of the
runner (`write_batch`, `finish`, `fail` with an owner) checks that the job is still running
*and still its own*, so a process that lost its lease (cancelled, or taken over after a
stall) cannot add rows. `release` hands a job back cleanly on shutdown (not a stall).

**One code path, two kinds of locking.** Every statement is the same SQL on both backends
(SQLAlchemy Core, text statements); what makes a check-then-write safe differs:

- SQLite: a write transaction starts with ``BEGIN IMMEDIATE``, which takes the database's one
  write lock, so nothing changes between a check and the write that follows it.
- PostgreSQL (READ COMMITTED): a job row that is checked and then written is locked first
  (``SELECT ... FOR UPDATE``: a cancel from another replica waits for the batch's commit and
  sees it), and the queue is read with ``FOR UPDATE SKIP LOCKED``, so two replicas claiming at
  once take two different jobs. Single-statement updates (``UPDATE ... WHERE owner = ...``)
  re-check their condition on the row they lock, on both.

A failed insert that should not end its transaction runs in a savepoint (PostgreSQL aborts a
transaction at its first error). Each finished batch is one transaction (predictions, batch
row, counters); a batch whose commit was sent but not acknowledged (the server went away) is
recognized when it is written again and not doubled. SQLite runs in WAL mode with
``synchronous=FULL``, PostgreSQL with its defaults (``fsync``, ``synchronous_commit``): a
committed batch survives a kill -9 and a power cut. Connections come from a bounded pool
(`app.jobs.database.PoolLimits`). Errors are `StoreError`s; `describe_store_error` gives their
words for a client.
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

from sqlalchemy import bindparam, exc, text
from sqlalchemy.engine import Connection

from app.jobs.database import (
    PoolLimits, StoreConflict, StoreError, database_url, make_engine, shown_url, store_error, translated,
)
from app.jobs.job import ACTIVE, Job
from app.jobs.migrations import migrate
from app.jobs.queries import JobQueries, StoredRecord, job_of
from bart_opt.evaluate.record import engine_key
from bart_opt.pipeline.data import Record

ERROR_FILTERS = ("include", "only", "exclude")

# A job restarted this many times in a row without finishing a batch is failed, not resumed again
# (an input that crashes the process would otherwise crash every restart).
MAX_STALLED_RUNS = 3

_DISCARD_CHUNK = 5000


def describe_store_error(error: BaseException) -> str:
    """A sentence about a database failure that is safe to show a client (no path, no SQL)."""
    return error.reason if isinstance(error, StoreError) else "the jobs database (BART_OPT_DB) cannot be used"


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
    fingerprint: str | None = None  # the checkpoint's content digest (`bart_opt.engine.fingerprint`)
    system: str = "bart"  # or "external": the records carry the predictions (see `app.jobs.job.Job`)
    engine: dict | None = None  # the submitting server's engine (`bart_opt.evaluate.record.engine_record`)
    rouge_settings: dict | None = None  # `bart_opt.pipeline.rouge.RougeSettings.to_dict`
    record: dict | None = None  # versions, processor, start, signature


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


class JobStore(JobQueries):
    """The jobs database at `location` (``BART_OPT_DB``: a file path or a URL, see `app.jobs.database`):
    its reads (`app.jobs.queries.JobQueries`) and its writes.

    `pool` bounds its connections. On SQLite, `connection_factory` is the `sqlite3.Connection`
    class connections are made from (tests pass a subclass that injects faults), and
    `busy_timeout` how long a write waits for another writer before failing as busy.
    """

    def __init__(self, location: str | Path, *, pool: PoolLimits = PoolLimits(),
                 connection_factory: type[sqlite3.Connection] = sqlite3.Connection, busy_timeout: float = 15.0):
        url = database_url(location)
        self.sqlite = url.get_backend_name() == "sqlite"
        if self.sqlite:
            url = url.set(database=str(Path(url.database).expanduser().absolute()))
        self.url = url
        self.shown = shown_url(url)  # for the log: no password
        self._busy_timeout = busy_timeout
        self.engine = make_engine(url, pool, sqlite_factory=connection_factory, busy_timeout=busy_timeout)
        # On PostgreSQL a checked row is locked until the write that follows it commits (see the module docstring).
        self._locked = "" if self.sqlite else " FOR UPDATE"
        self._skip_locked = "" if self.sqlite else " FOR UPDATE SKIP LOCKED"

    @property
    def location(self) -> str:
        """`BART_OPT_DB` for another `JobStore` on the same database, from any folder (with its password)."""
        return self.url.render_as_string(hide_password=False)

    # ---- connections -------------------------------------------------------------------

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with translated(), self.engine.connect() as connection:
            yield connection

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction: the write lock up front on SQLite, commit at the end, rollback on any error."""
        with translated(), self.engine.connect().execution_options(write=True) as connection, connection.begin():
            yield connection

    def initialize(self) -> None:
        """Create the folder of a SQLite file and enable WAL mode, then migrate the schema to the
        current version."""
        if self.sqlite:
            Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
            self._enable_wal()
        with translated():
            migrate(self.engine)

    def _enable_wal(self) -> None:
        """Switch the database to WAL mode, waiting up to the busy timeout for other connections.

        While another process or thread is opening a database in rollback-journal mode (a new
        file, or one from before WAL), the switch can fail with "database is locked" at once:
        SQLite does not run the busy handler there (it measured 7 of 300 four-way races). So the
        switch is retried, with a growing pause, until it succeeds or the timeout passes. It runs
        outside any transaction, on the pooled connection's driver.
        """
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.005
        with translated():
            pooled = self.engine.raw_connection()
        try:
            while True:
                try:
                    pooled.driver_connection.execute("PRAGMA journal_mode=WAL")
                    return
                except sqlite3.Error as error:
                    busy = (getattr(error, "sqlite_errorname", None) or "").startswith("SQLITE_BUSY")
                    left = deadline - time.monotonic()
                    if not busy or left <= 0:
                        raise store_error(error) from error
                time.sleep(min(pause, left))
                pause = min(2 * pause, 0.25)
        finally:
            pooled.close()

    def verify(self) -> None:
        """Raise a damaged `StoreError` when a SQLite file's pages are corrupt: ``PRAGMA quick_check``
        reads every page once (about 3 s for 200 MB; writers go on meanwhile). A PostgreSQL server
        checks its own pages as it reads them (its damage shows as errors), so nothing runs there."""
        if not self.sqlite:
            return
        with self._read() as connection:
            found = connection.exec_driver_sql("PRAGMA quick_check(1)").scalar_one()
        if found != "ok":
            raise StoreError("the jobs database (BART_OPT_DB) is damaged (its integrity check failed)", damaged=True)

    def close(self) -> None:
        """Close every pooled connection (call once no thread uses the store any more)."""
        self.engine.dispose()

    # ---- submitting ----------------------------------------------------------------------

    def begin(self, job: NewJob, owner: str, lease_s: float) -> tuple[Job, bool]:
        """Insert `job` as ``loading``, owned by `owner`; returns ``(job, True)``.

        When `job.idempotency_key` is already taken, nothing is inserted and the existing job
        comes back as ``(existing, False)`` (possibly still ``loading``). Concurrent submissions
        with one key, on any replicas, make one job: the key is unique in the database.
        """
        now = time.time()
        try:
            with self._write() as connection:
                connection.execute(text(
                    "INSERT INTO jobs (id, idempotency_key, request_hash, status, model, fingerprint, dataset,"
                    " columns, record_limit, generation, baselines, total, created_at, owner, lease_until, system,"
                    " engine, engine_key, rouge_settings, record)"
                    " VALUES (:id, :key, :hash, 'loading', :model, :fingerprint, :dataset, :columns, :limit,"
                    " :generation, :baselines, 0, :now, :owner, :lease, :system, :engine, :engine_key, :rouge, :record)"
                ), {"id": job.id, "key": job.idempotency_key, "hash": job.request_hash, "model": job.model,
                    "fingerprint": job.fingerprint,
                    "dataset": _dumps(job.dataset), "columns": _dumps(job.columns), "limit": job.limit,
                    "generation": _dumps(job.generation), "baselines": _dumps(list(job.baselines)), "now": now,
                    "owner": owner, "lease": now + lease_s, "system": job.system,
                    "engine": None if job.engine is None else _dumps(job.engine), "engine_key": engine_key(job.engine),
                    "rouge": None if job.rouge_settings is None else _dumps(job.rouge_settings),
                    "record": None if job.record is None else _dumps(job.record)})
        except StoreConflict:
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
            if not self._renew(connection, job_id, owner, lease_s, ("loading",)):
                return False
            try:
                with _savepoint(connection):
                    connection.execute(text(
                        "INSERT INTO records (job_id, position, example_id, text, reference, error)"
                        " VALUES (:job, :position, :id, :text, :reference, :error)"
                    ), [{"job": job_id, "position": r.position, "id": r.record.id, "text": r.record.text,
                         "reference": r.record.reference, "error": r.error} for r in records])
            except exc.IntegrityError:
                raise self._duplicate(connection, job_id, records) from None
        return True

    @staticmethod
    def _duplicate(connection: Connection, job_id: str, records: Sequence[StoredRecord]) -> DuplicateId:
        """The first repeated id of `records` (in order), against earlier chunks and within this one
        (this chunk's rows were rolled back with their savepoint)."""
        seen: dict[str, int] = {}
        for stored in records:
            example_id = stored.record.id
            first = connection.execute(
                text("SELECT position FROM records WHERE job_id = :job AND example_id = :id"),
                {"job": job_id, "id": example_id},
            ).scalar()
            first = first if first is not None else seen.get(example_id)
            if first is not None:
                return DuplicateId(example_id, first, stored.position)
            seen[example_id] = stored.position
        return DuplicateId("?", -1, -1)

    def seal(self, job_id: str, owner: str, total: int, dataset: dict | None = None) -> Job | None:
        """Make a ``loading`` job of `owner` ``queued`` with `total` records (None if it is not), its
        dataset description replaced by `dataset` when given (what intake learnt: a file's fingerprint).

        The submission time becomes the moment it was sealed, so it queues after jobs that were
        ready before it.
        """
        described = "" if dataset is None else ", dataset = :dataset"
        with self._write() as connection:
            changed = connection.execute(text(
                "UPDATE jobs SET status = 'queued', total = :total, owner = NULL, lease_until = NULL, created_at = :now,"
                " waiting_since = :now"
                f"{described} WHERE id = :job AND status = 'loading' AND owner = :owner"
            ), {"total": total, "now": time.time(), "job": job_id, "owner": owner,
                "dataset": None if dataset is None else _dumps(dataset)}).rowcount
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
                deleted = connection.execute(text(
                    "DELETE FROM records WHERE job_id = :job AND position IN"
                    " (SELECT position FROM records WHERE job_id = :job ORDER BY position LIMIT :n)"
                ), {"job": job_id, "n": _DISCARD_CHUNK}).rowcount
            if deleted < _DISCARD_CHUNK:
                break
        with self._write() as connection:
            for table in ("predictions", "batches", "jobs"):
                column = "id" if table == "jobs" else "job_id"
                connection.execute(text(f"DELETE FROM {table} WHERE {column} = :job"), {"job": job_id})

    def discard_stale(self) -> list[str]:
        """Discard ``loading`` jobs whose loader died (lease expired); returns their ids.

        The jobs are taken from their loaders first (owner cleared, in one statement), so a
        loader that was only slow gets its next chunk refused instead of writing into a job
        being deleted; the lease stays expired, so a replica that dies half-way through the
        deletion leaves a job the next one removes.
        """
        with self._write() as connection:
            ids = list(connection.execute(text(
                "UPDATE jobs SET owner = NULL WHERE status = 'loading' AND lease_until < :now RETURNING id"
            ), {"now": time.time()}).scalars())
        for job_id in ids:
            self.discard(job_id)
        return ids

    # ---- the runner's transitions ------------------------------------------------------

    def claim_next(self, owner: str, lease_s: float, engine_key: str | None = None) -> Job | None:
        """Give `owner` the oldest claimable job, marked ``running`` under its lease (None when none).

        Claimable: queued, or running under a lease that expired (its owner stopped renewing:
        it died) or under `owner`'s own (a job this process dropped while the store was down);
        with `engine_key` (the claiming replica's, `bart_opt.evaluate.record.engine_key`), only a job
        of that engine, an external one, or one that records no engine (from before schema 7).
        A job whose previous runs finished no batch `MAX_STALLED_RUNS` times in a row is failed
        instead, and the next one is tried. A run that was released cleanly is no stall. On
        PostgreSQL a job another replica is claiming is skipped (``SKIP LOCKED``), not waited for.
        """
        now = time.time()
        engine_clause = "" if engine_key is None else \
            " AND (system = 'external' OR engine_key IS NULL OR engine_key = :engine)"
        with self._write() as connection:
            while True:
                row = connection.execute(text(
                    "SELECT * FROM jobs WHERE (status = 'queued' OR (status = 'running' AND"
                    " (lease_until IS NULL OR lease_until < :now OR owner = :owner)))" + engine_clause +
                    " ORDER BY created_at, id LIMIT 1" + self._skip_locked
                ), {"now": now, "owner": owner, "engine": engine_key}).first()
                if row is None:
                    return None
                job = row._mapping
                resumed, at_start = job["runs"] > 0, job["done_at_start"]
                if not resumed or (at_start is not None and job["done"] > at_start):
                    stalled = 0
                elif at_start is None:
                    stalled = job["stalled_runs"]
                else:
                    stalled = job["stalled_runs"] + 1
                if stalled >= MAX_STALLED_RUNS:
                    reason = (f"the server stopped {stalled} times in a row while running this job without "
                              "finishing a batch; not resuming it again")
                    connection.execute(text(
                        "UPDATE jobs SET status = 'failed', error = :reason, finished_at = :now, owner = NULL,"
                        " lease_until = NULL WHERE id = :job"
                    ), {"reason": reason, "now": now, "job": job["id"]})
                    continue
                connection.execute(text(
                    "UPDATE jobs SET status = 'running', runs = runs + 1, stalled_runs = :stalled, done_at_start = done,"
                    " started_at = COALESCE(started_at, :now), owner = :owner, lease_until = :lease,"
                    " status_detail = NULL WHERE id = :job"
                ), {"stalled": stalled, "now": now, "owner": owner, "lease": now + lease_s, "job": job["id"]})
                return job_of(connection.execute(text("SELECT * FROM jobs WHERE id = :job"), {"job": job["id"]}).first())

    def fail_foreign(self, engine_key: str, wait_s: float) -> list[str]:
        """Fail the model jobs of another engine than `engine_key` that no replica of theirs has claimed for
        `wait_s` seconds (queued that long, or running under a lease that ran out that long ago), each
        with a reason naming both engines; returns their ids."""
        now = time.time()
        with self._write() as connection:
            return list(connection.execute(text(
                "UPDATE jobs SET status = 'failed', finished_at = :now, owner = NULL, lease_until = NULL,"
                " status_detail = NULL, error = 'the job was submitted to engine ' || engine_key || ' and no replica"
                " with that engine took it within ' || :wait || ' s (this one runs ' || :engine || '); nothing was"
                " mixed: start a replica with the job''s engine, or submit it again to run it on this one'"
                " WHERE system = 'bart' AND engine_key IS NOT NULL AND engine_key != :engine AND"
                " ((status = 'queued' AND COALESCE(waiting_since, created_at) < :cutoff) OR"
                " (status = 'running' AND lease_until < :cutoff)) RETURNING id"
            ), {"now": now, "cutoff": now - wait_s, "wait": f"{wait_s:g}", "engine": engine_key}).scalars())

    def adopt_engine(self, job_id: str, owner: str, engine: dict) -> bool:
        """Record `engine` for a running model job of `owner` that has none and no stored row yet (a job from
        before schema 7); False otherwise, when nothing is written."""
        with self._write() as connection:
            return connection.execute(text(
                "UPDATE jobs SET engine = :engine, engine_key = :key WHERE id = :job AND owner = :owner AND"
                " status = 'running' AND engine_key IS NULL AND done = 0"
            ), {"engine": _dumps(engine), "key": engine_key(engine), "job": job_id, "owner": owner}).rowcount == 1

    def renew(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Extend `owner`'s lease on a running or loading job; False when it is no longer its own."""
        with self._write() as connection:
            return self._renew(connection, job_id, owner, lease_s, ("running", "loading"))

    @staticmethod
    def _renew(connection: Connection, job_id: str, owner: str, lease_s: float, statuses: tuple[str, ...]) -> bool:
        statement = text("UPDATE jobs SET lease_until = :lease WHERE id = :job AND owner = :owner AND status IN :statuses")
        return connection.execute(statement.bindparams(bindparam("statuses", expanding=True)), {
            "lease": time.time() + lease_s, "job": job_id, "owner": owner, "statuses": list(statuses)}).rowcount == 1

    def set_detail(self, job_id: str, owner: str, detail: str | None) -> bool:
        """Say what a running job of `owner` waits for or runs on (``status_detail``); False if it is not."""
        with self._write() as connection:
            return connection.execute(text(
                "UPDATE jobs SET status_detail = :detail WHERE id = :job AND owner = :owner AND status = 'running'"
            ), {"detail": detail, "job": job_id, "owner": owner}).rowcount == 1

    def adopt_fingerprint(self, job_id: str, owner: str, fingerprint: str) -> bool:
        """Record `fingerprint` for a running job of `owner` that has none and no stored row yet (a job
        from before schema 6); False otherwise, when nothing is written."""
        with self._write() as connection:
            return connection.execute(text(
                "UPDATE jobs SET fingerprint = :fingerprint WHERE id = :job AND owner = :owner AND status = 'running'"
                " AND fingerprint IS NULL AND done = 0"
            ), {"fingerprint": fingerprint, "job": job_id, "owner": owner}).rowcount == 1

    def release(self, job_id: str, owner: str) -> bool:
        """Hand a running job of `owner` back to the queue on a clean stop (no stall is counted)."""
        with self._write() as connection:
            return connection.execute(text(
                "UPDATE jobs SET status = 'queued', owner = NULL, lease_until = NULL, status_detail = NULL,"
                " stalled_runs = CASE WHEN done > COALESCE(done_at_start, done) THEN 0 ELSE stalled_runs END,"
                " done_at_start = NULL, waiting_since = :now WHERE id = :job AND owner = :owner AND status = 'running'"
            ), {"job": job_id, "owner": owner, "now": time.time()}).rowcount == 1

    def write_batch(self, job_id: str, owner: str, batch: BatchWrite) -> bool:
        """Store prediction rows in one transaction; False (nothing written) unless the job is
        running under `owner`.

        A batch this run already stored whole (its commit went through, but the answer was lost
        with the connection, and the runner wrote it again) is recognized and not written twice;
        any other row that already exists raises `StoreConflict`, and nothing is written.
        """
        with self._write() as connection:
            found = connection.execute(text("SELECT status, owner FROM jobs WHERE id = :job" + self._locked),
                                       {"job": job_id}).first()
            if found is None or found.status != "running" or found.owner != owner:
                return False
            try:
                with _savepoint(connection):
                    self._insert_batch(connection, job_id, batch)
            except exc.IntegrityError as error:
                if not self._written_before(connection, job_id, batch):
                    raise store_error(error) from error
        return True

    def _insert_batch(self, connection: Connection, job_id: str, batch: BatchWrite) -> None:
        rows, number = batch.rows, -1
        if batch.model_call:
            number = connection.execute(text("SELECT COALESCE(MAX(batch), -1) + 1 FROM batches WHERE job_id = :job"),
                                        {"job": job_id}).scalar_one()
            connection.execute(text(
                "INSERT INTO batches (job_id, batch, run, size, peak_bytes, seconds, queue_s, finished_at)"
                " VALUES (:job, :batch, :run, :size, :peak, :seconds, :queue, :now)"
            ), {"job": job_id, "batch": number, "run": batch.run, "size": len(rows), "peak": batch.peak_bytes,
                "seconds": batch.seconds, "queue": batch.queue_s, "now": time.time()})
        connection.execute(text(
            "INSERT INTO predictions (job_id, example_id, position, batch, run, row, failed)"
            " VALUES (:job, :id, :position, :batch, :run, :row, :failed)"
        ), [{"job": job_id, "id": row["id"], "position": position, "batch": number, "run": batch.run,
             "row": _dumps(row), "failed": int(row["error"] is not None)} for row, position in zip(rows, batch.positions)])
        connection.execute(text(
            "UPDATE jobs SET done = done + :n, failed = failed + :failed, work_s = work_s + :work,"
            " active_s = active_s + :active,"
            " peak_bytes = CASE WHEN peak_bytes > :peak THEN peak_bytes ELSE :peak END WHERE id = :job"
        ), {"n": len(rows), "failed": sum(row["error"] is not None for row in rows),
            "work": sum(row["seconds"] for row in rows), "active": batch.active_s, "peak": batch.peak_bytes,
            "job": job_id})

    @staticmethod
    def _written_before(connection: Connection, job_id: str, batch: BatchWrite) -> bool:
        """Whether every row of `batch` is already stored, by the same run (a batch written twice)."""
        statement = text("SELECT COUNT(*) FROM predictions WHERE job_id = :job AND run = :run AND example_id IN :ids")
        ids = [row["id"] for row in batch.rows]
        found = connection.execute(statement.bindparams(bindparam("ids", expanding=True)),
                                   {"job": job_id, "run": batch.run, "ids": ids}).scalar_one()
        return found == len(set(ids))

    def finish(self, job_id: str, owner: str, metrics: dict) -> bool:
        """Mark a running job of `owner` ``succeeded`` with its final metrics; False if it is not."""
        return self._transition(job_id, ("running",), "succeeded", owner=owner, metrics=_dumps(metrics))

    def fail(self, job_id: str, reason: str, owner: str | None = None) -> bool:
        """Mark a queued or running job ``failed`` with `reason` (only while `owner` holds it, when
        given); False if it had already ended."""
        return self._transition(job_id, ACTIVE, "failed", owner=owner, error=reason)

    def cancel(self, job_id: str) -> bool:
        """Mark a queued or running job ``cancelled``; False if it had already ended. Its owner, on
        any replica, stops at its next write or lease renewal, which are refused from now on."""
        return self._transition(job_id, ACTIVE, "cancelled")

    def _transition(self, job_id: str, allowed: Sequence[str], status: str, owner: str | None = None,
                    **columns: Any) -> bool:
        assignments = "".join(f", {name} = :{name}" for name in columns)
        mine = " AND owner = :owner" if owner is not None else ""
        statement = text(
            "UPDATE jobs SET status = :status, finished_at = :now, owner = NULL, lease_until = NULL,"
            f" status_detail = NULL{assignments} WHERE id = :job AND status IN :allowed{mine}"
        ).bindparams(bindparam("allowed", expanding=True))
        with self._write() as connection:
            changed = connection.execute(statement, {"status": status, "now": time.time(), **columns, "job": job_id,
                                                     "allowed": list(allowed), "owner": owner}).rowcount
        return changed == 1


@contextmanager
def _savepoint(connection: Connection) -> Iterator[None]:
    """Inserts that a constraint may refuse without ending the transaction: on a violation, what they
    wrote is undone and the transaction goes on (on PostgreSQL it would otherwise be aborted).
    Any other error is left to the transaction's rollback (SQLite may have rolled it back itself)."""
    connection.exec_driver_sql("SAVEPOINT inserts")
    try:
        yield
    except exc.IntegrityError:
        connection.exec_driver_sql("ROLLBACK TO SAVEPOINT inserts")
        raise
    connection.exec_driver_sql("RELEASE SAVEPOINT inserts")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
