"""A job's pending records on a Ray cluster (``BART_OPT_RAY_ADDRESS`` set): `pending_dataset`.

With Ray the job runner composes `bart_opt.distributed.ReplicaPool` as its executor instead of
the service's device worker (which then serves ``POST /summarize`` alone); everything else
about a job (claims, leases, cancel, stop, the store, the failure streak, the metrics) is the
same runner and the same evaluation core. Only the records travel differently: they are read
from the jobs database by Ray Data read tasks pinned to this node (a SQLite database is a
file here), one per span of about a replica call's records, two at a time, in record order; they
ask Ray for no CPU, so the replicas may have them all. Ray Data's backpressure bounds what is
read ahead, and a resume reads only what earlier runs did not write.

Only this module, and `bart_opt.distributed`, import Ray; the service imports them only when
``BART_OPT_RAY_ADDRESS`` is set.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator

import pyarrow as pa
import ray
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from app.jobs.job import Job
from app.jobs.store import JobStore
from bart_opt.distributed import records_per_call

NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label of every node
READ_TASKS = 2  # read tasks at a time (they ask for no CPU, so Ray would not bound them)


class PendingRecords(Datasource):
    """A job's records without a prediction, read from the jobs database `db` (``BART_OPT_DB``): one read task per
    `span` positions (``0 .. total - 1``), each one block of the pending records in its span.

    Ray Data gives a block to one replica call (adding blocks until the call has its batch size),
    so spans of about a call keep every replica busy; the spans of a resumed job hold fewer records.
    """

    def __init__(self, db: str, job_id: str, total: int, span: int):
        super().__init__()
        self.db, self.job_id, self.total, self.span = db, job_id, total, span

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: object | None = None) -> list[ReadTask]:
        metadata = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
        return [
            ReadTask(functools.partial(_read_span, self.db, self.job_id, start, min(start + self.span, self.total)),
                     metadata, per_task_row_limit=per_task_row_limit)
            for start in range(0, self.total, self.span)
        ]

    def estimate_inmemory_data_size(self) -> None:
        return None


def _read_span(db: str, job_id: str, start: int, stop: int) -> Iterator[pa.Table]:
    """The pending records at positions ``start .. stop - 1`` as one block (nothing when none is left)."""
    store = JobStore(db)
    try:
        found = [stored for stored in store.pending(job_id, start - 1, stop - start, max_chars=sys.maxsize)
                 if stored.position < stop]
    finally:
        store.close()
    if found:
        yield pa.table({
            "position": pa.array([stored.position for stored in found], pa.int64()),
            "id": pa.array([stored.record.id for stored in found], pa.string()),
            "text": pa.array([stored.record.text for stored in found], pa.string()),
            "reference": pa.array([stored.record.reference for stored in found], pa.string()),
            "error": pa.array([stored.error for stored in found], pa.string()),
        })


def pending_dataset(store: JobStore, job: Job, replicas: int) -> tuple[ray.data.Dataset, int]:
    """The pending records of `job` as a Ray Dataset of the replicas' input columns, read on this
    node two spans at a time, and how many there are (spans of about a replica call's records)."""
    source = PendingRecords(store.location, job.id, job.total, records_per_call(job.total, replicas))
    here = {NODE_ID_LABEL: ray.get_runtime_context().get_node_id()}
    return ray.data.read_datasource(source, num_cpus=0, concurrency=READ_TASKS, label_selector=here), job.pending
