"""Submitting a job: its records streamed from the source into the store, a chunk per transaction.

`Intake.load` inserts the job as ``loading``, copies records as the source yields them in
chunks of at most `IntakeLimits.chunk_records` records or `chunk_chars` characters (one short
write transaction each, renewing the loader's lease, so a big submission never locks out the
running job's writes and a reader never holds the dataset), then seals it ``queued``. Any
error on the way discards what was copied and propagates; the job never becomes visible.

A file source is watched while it is read (`bart_opt.engine.fingerprint.FileWatch`, begun before the
file is opened): at the end of intake it is hashed and checked unchanged, and a file that was
written, replaced or removed meanwhile refuses the job (`FileChanged`: its records may mix two
versions of the file). The job records the file's fingerprint (size, mtime, sha256) in its
dataset: ``{"file": "d.jsonl", "fingerprint": {...}}``.

Each record is checked as it passes: a text or reference longer than `max_record_chars`, or
one that is not valid Unicode (a lone surrogate, which neither the tokenizer nor SQLite can
take) or holds a NUL character (which PostgreSQL cannot store), marks *that record* failed
with the reason (it gets an error row when the job runs, and no model call); a source with more than `max_records` records is refused.

`BoundedPool` is where submissions run: a few threads of their own, apart from the request
threads that ``/summarize`` needs, with a bounded number waiting (`PoolBusy` beyond).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

from app.jobs.job import Job
from app.jobs.store import JobStore, NewJob, StoredRecord, StoreError
from bart_opt.pipeline.data import Record, RecordStream
from bart_opt.errors import InvalidRequest
from bart_opt.engine.fingerprint import FileWatch
from bart_opt.pipeline.summarizer import check_text
from bart_opt.surfaces import surfaced

logger = logging.getLogger("app.jobs")


@dataclass(frozen=True)
class IntakeLimits:
    """What one submission may hold (the settings ``BART_OPT_MAX_JOB_RECORDS``, ``BART_OPT_MAX_RECORD_CHARS``:
    `bart_opt.surfaces`) and how records are grouped into write transactions."""

    max_records: int = surfaced(1_000_000, "most records one evaluation job may hold", setting="max_job_records", ge=1)
    max_record_chars: int = surfaced(200_000, "longest text or reference of a job's record; a longer record fails, "
                                              "the job goes on", setting="max_record_chars", ge=1)
    chunk_records: int = 1000
    chunk_chars: int = 4_000_000


class TooManyRecords(ValueError):
    """A source with more records than a job may hold."""


class LoadAbandoned(RuntimeError):
    """The loading job was taken away (its lease ran out) before its records were all copied."""


class LoadCancelled(Exception):
    """The submission was withdrawn (its request's deadline passed, or its client left) while loading."""


class Intake:
    """Copies a submission's records into `store` under `owner`'s lease (see the module docstring)."""

    def __init__(self, store: JobStore, limits: IntakeLimits, owner: str, lease_s: float):
        self.store = store
        self.limits = limits
        self.owner = owner
        self.lease_s = lease_s

    def load(self, job: NewJob, records: RecordStream, cancelled: threading.Event | None = None,
             watch: FileWatch | None = None) -> tuple[Job, bool]:
        """Create `job` with the records of `records`; ``(queued job, True)``, or ``(existing, False)``
        when its idempotency key is taken (nothing is read then). `watch` watches the file `records`
        come from (see the module docstring).

        Raises ValueError for bad records (a duplicate id, too many records, what the source
        raises; `bart_opt.engine.fingerprint.FileChanged` for a file that changed while it was read),
        `StoreError` when the store fails, `LoadCancelled` once `cancelled` is set (checked at
        every record); nothing of the job is left behind.
        """
        created, new = self.store.begin(job, self.owner, self.lease_s)
        if not new:
            return created, False
        try:
            try:
                total = self._copy(job.id, records, cancelled or threading.Event())
            except (ValueError, OSError):
                if watch is not None:  # a line torn by a rewrite: the cause is the change, not the data
                    watch.check()
                raise
            dataset = None if watch is None else {**job.dataset, "fingerprint": watch.fingerprint().to_dict()}
            sealed = self.store.seal(job.id, self.owner, total, dataset)
            if sealed is None:
                raise LoadAbandoned(f"job {job.id} was discarded while loading (its loader's lease ran out)")
        except BaseException:
            self._discard(job.id)
            raise
        logger.info("job %s queued: %d examples from %s", job.id, total, records.source)
        return sealed, True

    def _copy(self, job_id: str, records: RecordStream, cancelled: threading.Event) -> int:
        limits = self.limits
        chunk: list[StoredRecord] = []
        chars, total = 0, 0
        flushed = time.monotonic()
        for position, record in enumerate(islice(records, limits.max_records + 1)):
            if position == limits.max_records:
                raise TooManyRecords(f"{records.source} holds more than {limits.max_records:,} records, the most one "
                                     "job may hold (BART_OPT_MAX_JOB_RECORDS); give a limit")
            stored = self.check(position, record)
            chunk.append(stored)
            chars += len(stored.record.text)
            if cancelled.is_set():
                raise LoadCancelled(job_id)
            if (len(chunk) >= limits.chunk_records or chars >= limits.chunk_chars
                    or time.monotonic() - flushed > self.lease_s / 3):
                total += self._flush(job_id, chunk)
                chunk, chars, flushed = [], 0, time.monotonic()
        total += self._flush(job_id, chunk)
        if total == 0:
            raise ValueError(f"no records in {records.source}")
        return total

    def _flush(self, job_id: str, chunk: list[StoredRecord]) -> int:
        if chunk and not self.store.add_records(job_id, self.owner, self.lease_s, chunk):
            raise LoadAbandoned(f"job {job_id} was discarded while loading (its loader's lease ran out)")
        return len(chunk)

    def check(self, position: int, record: Record) -> StoredRecord:
        """The record as stored: failed with a reason when it is too long or not valid Unicode.

        Raises ValueError for an id that is not valid Unicode or holds a NUL character (the record
        cannot even be named, nor stored: PostgreSQL's text has no NUL).
        """
        try:
            record.id.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"record at row {position}: its id is not valid Unicode text") from None
        if "\x00" in record.id:
            raise ValueError(f"record at row {position}: its id holds a NUL character (U+0000)")
        text, reference = record.text, record.reference
        error = self._problem(text, "text")
        if error is not None:
            text = ""
        if reference is not None:
            reference_error = self._problem(reference, "reference")
            if reference_error is not None:
                error, reference = error or reference_error, None
        return StoredRecord(position, Record(record.id, text, reference), error)

    def _problem(self, value: str, field: str) -> str | None:
        limit = self.limits.max_record_chars
        if len(value) > limit:
            return (f"the {field} has {len(value):,} characters, more than the {limit:,} a record may have "
                    "(BART_OPT_MAX_RECORD_CHARS)")
        try:
            check_text(value, field)
        except InvalidRequest as error:
            return str(error)
        if "\x00" in value:  # one rule on every backend: PostgreSQL's text cannot hold it
            return f"the {field} holds a NUL character (U+0000), which the jobs database cannot store"
        return None

    def _discard(self, job_id: str) -> None:
        try:
            self.store.discard(job_id)
        except StoreError:
            logger.warning("could not discard the partly loaded job %s; it is removed once its lease runs out",
                           job_id, exc_info=True)


class PoolBusy(Exception):
    """Every thread of a `BoundedPool` is busy and its waiting places are taken."""


class BoundedPool:
    """`workers` threads named `name` with at most `waiting` calls queued behind them.

    `run` awaits a blocking call on one of its threads without holding the event loop or any
    request thread; a call beyond the bound raises `PoolBusy` at once.
    """

    def __init__(self, name: str, workers: int, waiting: int):
        self.name = name
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._slots = threading.BoundedSemaphore(workers + waiting)

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        if not self._slots.acquire(blocking=False):
            raise PoolBusy(self.name)
        try:
            future = self._executor.submit(function, *args)
        except RuntimeError:  # shut down: the service is stopping
            self._slots.release()
            raise PoolBusy(self.name) from None
        future.add_done_callback(lambda _: self._slots.release())
        return await asyncio.wrap_future(future)

    def shutdown(self) -> None:
        """Refuse new calls and drop queued ones; calls already running finish on their own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
