"""Evaluation jobs on a Ray cluster (``BART_OPT_RAY_ADDRESS`` set): `RayJobRunner`.

It is the `JobRunner` (claims under a lease, renewals, cancel, stop and hand-back, store retries,
the end of a job and its metrics: all as there) with one difference: a job's pending records go
to the replicas of a `bart_opt.distributed.ReplicaPool` on the cluster instead of the service's
device thread, which then serves ``POST /summarize`` alone.

- **Records** are read from the jobs database by Ray Data read tasks pinned to this node (a
  SQLite database is a file here), one per span of about a replica call's records, two at a time, in
  record order; they ask Ray for no CPU, so the replicas may have them all. Ray Data's
  backpressure bounds what is read ahead.
- **Results** come back as each replica call returns, a planned batch at a time; each is written in one
  transaction under the lease, exactly as the local runner writes a batch (so cancel, losing the
  lease and the failure streak behave the same). A row whose record this run already wrote (a
  batch run again after its replica died) is dropped, so every example is written once; on a
  resume, the read skips what earlier runs wrote.
- **Waiting** is visible and bounded: the job's ``status_detail`` says what it waits for ("waiting
  for room on the Ray cluster: ...", "starting 2 replicas ...") or runs on, and a cluster that
  cannot be reached or hold the replicas, no room within ``BART_OPT_RAY_START_TIMEOUT_S``, no
  progress for ``BART_OPT_RAY_STALL_TIMEOUT_S`` or a replica that keeps failing fail the job with
  the reason (the details go to the log).
- A thread of its own pulls the results, so the runner sees a cancel or a stop at once; the
  pipeline shuts down (its replicas freed) as soon as the batch it is waiting for returns.
"""

from __future__ import annotations

import functools
import logging
import queue
import sys
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import ray
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from app.jobs.job import Job
from app.jobs.runner import JobRunner, RunnerConfig, _Run
from app.jobs.store import BatchWrite, JobStore
from bart_opt.distributed import (
    ClusterError, ClusterOptions, ReplicaBatch, ReplicaConfig, ReplicaPool, records_per_call,
)
from bart_opt.spec import GenerationSpec

if TYPE_CHECKING:
    from app.service import SummarizeService
    from app.settings import Settings

logger = logging.getLogger("app.jobs")

NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label of every node
FEED_DEPTH = 4  # finished batches waiting for the runner, at most
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


class RayJobRunner(JobRunner):
    """A `JobRunner` whose batches run on the replicas of `pool` (see the module docstring)."""

    def __init__(self, store: JobStore, summarize: SummarizeService, config: RunnerConfig, owner: str,
                 store_ready: threading.Event, pool: ReplicaPool):
        super().__init__(store, summarize, config, owner, store_ready)
        self.pool = pool

    @classmethod
    def from_settings(cls, settings: Settings, store: JobStore, summarize: SummarizeService, config: RunnerConfig,
                      owner: str, store_ready: threading.Event) -> RayJobRunner:
        """The runner of `settings`: replicas of the service's model with its dtype and budgets."""
        model = Path(settings.model).expanduser()
        replica = ReplicaConfig(
            # Replicas start in other folders: a local checkpoint goes to them by its absolute path.
            model=str(model.resolve()) if model.is_dir() else settings.model,
            dtype=None if settings.dtype == "auto" else settings.dtype,
            max_batch_tokens=settings.max_batch_tokens, max_batch_size=settings.max_batch_size,
            max_beams=settings.max_beams, exact=settings.exact, fast=settings.fast,
        )
        options = ClusterOptions(
            address=settings.ray_address, replicas=settings.ray_replicas,
            gpus_per_replica=settings.ray_gpus_per_replica, threads_per_replica=settings.ray_threads_per_replica,
            start_timeout_s=settings.ray_start_timeout_s, stall_timeout_s=settings.ray_stall_timeout_s,
        )
        return cls(store, summarize, config, owner, store_ready, ReplicaPool(replica, options, name=settings.model))

    def _model(self) -> ReplicaPool:
        return self.pool

    def _process(self, job: Job, spec: GenerationSpec) -> bool:
        """Run every pending record on the cluster and store the results; False when the job failed."""
        run = _Run(job.id, job.runs)
        self._live = (run.started, 0)
        pending = job.pending
        if pending <= 0:
            return True
        try:
            placement = self.pool.start()
        except ClusterError as error:
            return self._cluster_failed(run, error)
        source = PendingRecords(self.store.location, run.job_id, job.total,
                                records_per_call(job.total, placement.replicas))
        here = {NODE_ID_LABEL: ray.get_runtime_context().get_node_id()}
        dataset = ray.data.read_datasource(source, num_cpus=0, concurrency=READ_TASKS, label_selector=here)
        feed = _Feed(self._attention)
        feed.start(self.pool.run(dataset, spec, records=pending, stopped=feed.stopping.is_set,
                                 on_status=functools.partial(self._detail, run.job_id)))
        written = bytearray(job.total)  # 1 at the positions this run has written
        try:
            while (batch := self._next(feed)) is not None:
                fresh = [k for k, position in enumerate(batch.positions) if not written[position]]
                if not fresh:
                    continue
                rows = [batch.rows[k] for k in fresh]
                positions = [batch.positions[k] for k in fresh]
                self._write(run, BatchWrite(rows=rows, positions=positions, run=run.number,
                                            peak_bytes=batch.peak_bytes, seconds=batch.seconds,
                                            model_call=batch.model_call))
                for position in positions:
                    written[position] = 1
                if not self._tally(run, rows):
                    return False
        except ClusterError as error:
            return self._cluster_failed(run, error)
        finally:
            feed.close()
        return True

    def _next(self, feed: _Feed) -> ReplicaBatch | None:
        """The next finished batch (None at the end); raises `_Interrupted` on cancel or stop and
        the pipeline's `ClusterError`."""
        while True:
            self._check()
            try:
                return feed.get()
            except queue.Empty:
                self._attention.wait()
                self._attention.clear()

    def _cluster_failed(self, run: _Run, error: ClusterError) -> bool:
        logger.error("job %s: %s", run.job_id, error, exc_info=error.__cause__)
        self._store(self.store.fail, run.job_id, f"{error}; submit the job again", self.owner)
        return False

    def _detail(self, job_id: str, message: str) -> None:
        """Show what the job waits for or runs on (a failed write only loses the message)."""
        logger.info("job %s: %s", job_id, message)
        try:
            self.store.set_detail(job_id, self.owner, message)
        except Exception:  # noqa: BLE001 - a status line is not worth failing the job for
            logger.warning("could not store the status of job %s", job_id, exc_info=True)


class _Feed:
    """Finished batches pulled from a pipeline by a thread of their own into a small queue.

    `ring` is set whenever a batch or the end arrives. `close` stops pulling: the pipeline is
    shut down (its replicas freed) by that thread once the batch it waits for has returned.
    """

    _END = object()

    def __init__(self, ring: threading.Event):
        self._ring = ring
        self._queue: queue.Queue = queue.Queue(maxsize=FEED_DEPTH)
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, results: Generator[ReplicaBatch, None, None]) -> None:
        self._thread = threading.Thread(target=self._pull, args=(results,), name="bart-opt-ray-feed", daemon=True)
        self._thread.start()

    def get(self) -> ReplicaBatch | None:
        """The next batch, None at the end; raises the pipeline's error, or `queue.Empty` when nothing is there."""
        item = self._queue.get_nowait()
        if item is _Feed._END:
            self._queue.put(item)  # the end stays the end
            return None
        if isinstance(item, BaseException):
            self._queue.put(item)
            raise item
        return item

    def close(self) -> None:
        self.stopping.set()

    def _pull(self, results: Generator[ReplicaBatch, None, None]) -> None:
        end: object = _Feed._END
        try:
            for batch in results:
                if not self._put(batch):
                    return
        except ClusterError as error:
            end = error
        except Exception as error:  # noqa: BLE001 - reported to the runner, which fails the job with it
            logger.exception("the Ray pipeline failed")
            end = ClusterError("the Ray pipeline failed (the server log has the details)")
            end.__cause__ = error
        finally:
            results.close()
        self._put(end)

    def _put(self, item: object) -> bool:
        """Queue `item` when there is room; False when closed first."""
        while not self.stopping.is_set():
            try:
                self._queue.put(item, timeout=0.5)
            except queue.Full:
                continue
            self._ring.set()
            return True
        return False
