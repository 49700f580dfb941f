"""The jobs database as the evaluation core's source and sink (`bart_opt.evaluate.core`).

- `StoreSource`: a job's records without a prediction (this is the whole resume), a window at a
  time: at most ``window_records`` records and about ``window_chars`` characters, so memory does
  not grow with the dataset and the first batch starts after one window's tokenization. Records
  the submission marked failed (too long, not valid Unicode) come refused. On a Ray cluster
  (`ray_dataset`) the records are read by Ray tasks on this node instead (`app.jobs.ray_source`).
- `StoreSink`: each row batch in one transaction under the runner's lease (predictions, a
  ``batches`` row for a model call, counters); a write the store refuses (the job was cancelled
  or taken over) stops the run with `Interrupted`.

Both go through the runner's `call` (`JobRunner._store`), which retries a failing store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from app.jobs.job import Job
from app.jobs.store import BatchWrite, JobStore
from bart_opt.evaluate.core import Pending
from bart_opt.evaluate.rows import RowBatch

T = TypeVar("T")
StoreCall = Callable[..., Any]  # call(function, *args): function(*args), retried while the store fails


class Interrupted(Exception):
    """The job's run stops here without a verdict: cancelled, its lease lost, or the service stopping."""


class StoreSource:
    """The pending records of `job` in `store` (see the module docstring)."""

    def __init__(self, call: StoreCall, store: JobStore, job: Job, window_records: int, window_chars: int):
        self.call, self.store, self.job = call, store, job
        self.window_records, self.window_chars = window_records, window_chars

    def windows(self) -> Iterator[list[Pending]]:
        after = -1
        while True:
            window = self.call(self.store.pending, self.job.id, after, self.window_records, self.window_chars)
            if not window:
                return
            after = window[-1].position
            yield [Pending(stored.position, stored.record, stored.error) for stored in window]

    def texts(self, ids: list[str]) -> dict[str, str | None]:
        """The texts of records `ids` (the sources of the metrics beyond ROUGE when the records travel as a
        Ray dataset, around `windows`); None for an id the job does not hold."""
        found = {}
        for record_id in ids:
            record, _ = self.call(self.store.example, self.job.id, record_id)
            found[record_id] = None if record is None else record.text
        return found

    def ray_dataset(self, replicas: int) -> tuple[Any, int]:
        """The pending records as a Ray Dataset read on this node, and how many there are."""
        from app.jobs.ray_source import pending_dataset

        return pending_dataset(self.store, self.job, replicas)


class StoreSink:
    """Row batches of one run (`number`) of `job`, written under `owner`'s lease (see the module
    docstring). `on_write(rows)` runs after each write (the runner's progress)."""

    done: frozenset[str] = frozenset()  # the source reads only records without a row

    def __init__(self, call: StoreCall, store: JobStore, job: Job, owner: str, number: int,
                 on_write: Callable[[int], None] = lambda rows: None):
        self.call, self.store, self.job, self.owner, self.number = call, store, job, owner, number
        self.on_write = on_write
        self._mark = time.perf_counter()

    def write(self, batch: RowBatch) -> None:
        now = time.perf_counter()
        write = BatchWrite(rows=batch.rows, positions=batch.positions, run=self.number, peak_bytes=batch.peak_bytes,
                           seconds=batch.seconds, active_s=now - self._mark, model_call=batch.model_call)
        self._mark = now
        if not self.call(self.store.write_batch, self.job.id, self.owner, write):
            raise Interrupted
        self.on_write(len(batch.rows))


__all__ = ["Interrupted", "StoreSink", "StoreSource"]
