"""The reads of the jobs database: `JobQueries`, which `app.jobs.store.JobStore` extends with its writes.

Jobs (`get`, `find_by_key`, the keyset pages of `list`, `counts`), a job's records and rows in
record order a page at a time (`iter_records`, `iter_rows`, `prediction_lines`), one example, the
first failures, the batches, and the pending records a run reads a window at a time (`pending`).
Each read is its own read transaction; no connection is held between pages. The tables are
described in `app.jobs.store`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from app.jobs.job import STATUSES, Job
from bart_opt.pipeline.data import Record

_JSON_COLUMNS = ("dataset", "columns", "generation", "baselines", "metrics", "engine", "rouge_settings", "record")


@dataclass(frozen=True)
class StoredRecord:
    """One record as stored: its position in the job, the record, and why it cannot run (or None)."""

    position: int
    record: Record
    error: str | None = None


class JobQueries:
    """The jobs database's reads (see the module docstring), for a class with ``_read()``: a read
    transaction's connection (`app.jobs.store.JobStore`)."""

    def get(self, job_id: str) -> Job | None:
        """The job, or None."""
        if not storable(job_id):
            return None
        with self._read() as connection:
            row = connection.execute(text("SELECT * FROM jobs WHERE id = :job"), {"job": job_id}).first()
        return job_of(row)

    def find_by_key(self, key: str) -> Job | None:
        """The job created with idempotency key `key`, or None."""
        with self._read() as connection:
            row = connection.execute(text("SELECT * FROM jobs WHERE idempotency_key = :key"), {"key": key}).first()
        return job_of(row)

    def list(self, status: str | None = None, limit: int = 100, before: tuple[float, str] | None = None,
             after: tuple[float, str] | None = None) -> list[Job]:
        """Jobs newest first (by ``(created_at, id)``), optionally only those with `status` (``loading``
        ones never): the first `limit` older than the key `before`, or, with `after` alone, the
        `limit` just newer than `after` (still newest first). Keys come from `JobStore.key`."""
        where = ["status = :status" if status else "status != 'loading'"]
        params: dict[str, Any] = {"status": status, "limit": limit}
        if before is not None:
            where.append("(created_at < :b_at OR (created_at = :b_at AND id < :b_id))")
            params.update(b_at=before[0], b_id=before[1])
        if after is not None:
            where.append("(created_at > :a_at OR (created_at = :a_at AND id > :a_id))")
            params.update(a_at=after[0], a_id=after[1])
        order = "ASC" if after is not None and before is None else "DESC"
        with self._read() as connection:
            rows = connection.execute(text(
                f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY created_at {order}, id {order} LIMIT :limit"
            ), params).all()
        jobs = [job_of(row) for row in rows]
        return jobs[::-1] if order == "ASC" else jobs

    @staticmethod
    def key(job: Job) -> tuple[float, str]:
        """The job's place in the listing's order, for `list`'s `before` and `after`."""
        return job.created_at, job.id

    def counts(self) -> dict[str, int]:
        """Number of jobs per status (every status present, 0 when none), from the kept counts."""
        with self._read() as connection:
            rows = connection.execute(text("SELECT status, n FROM job_counts")).all()
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
        if not (storable(job_id) and storable(example_id)):
            return None, None
        ids = {"job": job_id, "id": example_id}
        with self._read() as connection:
            record = connection.execute(text(
                "SELECT example_id, text, reference FROM records WHERE job_id = :job AND example_id = :id"), ids).first()
            row = connection.execute(text(
                "SELECT row FROM predictions WHERE job_id = :job AND example_id = :id"), ids).scalar()
        return (Record(*record) if record else None), (json.loads(row) if row else None)

    def iter_records(self, job_id: str, page: int = 500) -> Iterator[Record]:
        """Every record of the job, in order, read a page at a time."""
        query = "SELECT position, example_id, text, reference FROM records WHERE job_id = :job AND position > :after"
        for _, example_id, text_, reference in self._paged(query, job_id, page):
            yield Record(example_id, text_, reference)

    def _pages(self, job_id: str, condition: str, page: int) -> Iterator[tuple[int, str]]:
        query = f"SELECT position, row FROM predictions WHERE job_id = :job AND position > :after{condition}"
        yield from self._paged(query, job_id, page)

    def _paged(self, query: str, job_id: str, page: int) -> Iterator[Row]:
        """The rows of `query` (position first; filtered on ``job_id = :job AND position > :after``)
        in position order, `page` rows per read transaction (no connection is held between pages)."""
        after = -1
        while True:
            with self._read() as connection:
                rows = connection.execute(text(f"{query} ORDER BY position LIMIT :page"),
                                          {"job": job_id, "after": after, "page": page}).all()
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1][0]

    def first_failures(self, job_id: str, n: int) -> list[tuple[str, str]]:
        """``(example id, error)`` of the job's first `n` failed examples, in record order."""
        with self._read() as connection:
            rows = connection.execute(text(
                "SELECT example_id, row FROM predictions WHERE job_id = :job AND failed = 1 ORDER BY position LIMIT :n"
            ), {"job": job_id, "n": n}).all()
        return [(example_id, json.loads(row)["error"]) for example_id, row in rows]

    def batches(self, job_id: str) -> list[dict]:
        """The job's finished batches in order: batch, run, size, peak_bytes, seconds, queue_s."""
        with self._read() as connection:
            rows = connection.execute(text(
                "SELECT batch, run, size, peak_bytes, seconds, queue_s FROM batches WHERE job_id = :job ORDER BY batch"
            ), {"job": job_id}).all()
        return [dict(row._mapping) for row in rows]

    def pending(self, job_id: str, after: int, max_records: int, max_chars: int) -> list[StoredRecord]:
        """The next records after position `after` without a prediction, in order: at most
        `max_records`, and no more once their texts reach `max_chars` characters (at least one).
        Rows are fetched a few at a time (a server-side cursor on PostgreSQL)."""
        found: list[StoredRecord] = []
        chars = 0
        with self._read() as connection:
            result = connection.execution_options(stream_results=True, yield_per=16).execute(text(
                "SELECT position, example_id, text, reference, error FROM records AS r"
                " WHERE job_id = :job AND position > :after AND NOT EXISTS"
                " (SELECT 1 FROM predictions AS p WHERE p.job_id = r.job_id AND p.example_id = r.example_id)"
                " ORDER BY position LIMIT :n"
            ), {"job": job_id, "after": after, "n": max_records})
            try:
                for position, example_id, text_, reference, error in result:
                    found.append(StoredRecord(position, Record(example_id, text_, reference), error))
                    chars += len(text_)
                    if chars >= max_chars:
                        break
            finally:
                result.close()
        return found


def storable(value: str) -> bool:
    """Whether `value` could be stored at all: valid Unicode without NUL (which PostgreSQL's text cannot
    hold), so that looking up a hostile id finds nothing instead of failing."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def job_of(row: Row | None) -> Job | None:
    """The `Job` of a ``jobs`` row (its JSON columns decoded), None for no row."""
    if row is None:
        return None
    job = dict(row._mapping)
    for column in _JSON_COLUMNS:
        if job[column] is not None:
            job[column] = json.loads(job[column])
    return Job.from_row(job)


__all__ = ["JobQueries", "StoredRecord", "job_of", "storable"]
