"""The job runner: one thread that runs queued evaluation jobs, one batch at a time, on the shared worker.

How a job runs (``JobRunner._run``):

1. The job's records come from the store; ids that already have a prediction are skipped
   (this is the whole resume: a restarted job continues where its last committed batch ended).
2. The rest are tokenized on this thread (a private copy of the tokenizer) and planned into
   length-sorted batches under the service's token budget, exactly as ``bart-opt evaluate`` plans them.
3. Each planned batch becomes one ``Kind.JOB`` work item on the device worker that also serves
   ``POST /summarize``. Only one batch of a job is ever in the worker, and the worker runs
   waiting interactive requests before a waiting job batch (up to its burst limit), so a
   request waits for at most the one job batch already on the device.
4. The finished batch is written in one transaction (predictions, batch stats, counters);
   the next batch is submitted only after that commit.
5. When every record has a row, the final metrics are computed from *all stored rows* with
   `bart_opt.evaluate.compute_metrics`, in record order, so ROUGE is the same however many
   times the job was interrupted.

Failures never loop: a batch that raises is split into single records; a record that still
fails alone is stored with its ``error`` (as the pipeline stores an input that runs out of
memory alone); after `MAX_FAILURE_STREAK` failed records in a row the job itself is failed with
the last reason. Cancelling drops the job's waiting batch (a batch already on the device is
abandoned and its result discarded). Stopping the service lets the batch on the device finish
and be written, then leaves the job ``running`` in the store, to be resumed on the next start.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.jobs.store import BatchWrite, JobStore
from app.worker import Kind, NotAccepting, QueueFull, State, WorkItem
from bart_opt.data import Record
from bart_opt.evaluate import compute_metrics, prediction_row
from bart_opt.spec import GenerationSpec
from bart_opt.summarizer import Encoded, Summarizer

if TYPE_CHECKING:
    from app.runner import ItemResult
    from app.service import SummarizeService

logger = logging.getLogger("app.jobs")

MAX_FAILURE_STREAK = 5


class _Interrupted(Exception):
    """The job stops here without a verdict: cancelled, or the service is stopping."""


@dataclass
class _Entry:
    """One record of a planned batch: its position in the job, the record, its tokens."""

    position: int
    record: Record
    encoded: Encoded


class JobRunner:
    """Runs jobs from `store` on the worker of `summarize` (see the module docstring)."""

    queue_full_wait_s = 0.05  # how long to wait before offering a batch to a full job queue again
    retry_seconds = 5.0

    def __init__(self, store: JobStore, summarize: SummarizeService):
        self.store = store
        self.summarize = summarize
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._attention = threading.Event()  # rung when the batch waited on is done, or on cancel / stop
        self._lock = threading.Lock()
        self._current: str | None = None  # the job being run
        self._current_cancelled = False
        self._encoder: Summarizer | None = None
        self._live: tuple[float, int] | None = None  # start of the current run, examples done in it
        self._thread = threading.Thread(target=self._main, name="bart-opt-jobs", daemon=True)

    # ---- control (any thread) ------------------------------------------------------------

    def start(self) -> None:
        """Start the runner thread; it waits for the model, then works through the queue."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the batch on the device (if any) is written; the job stays resumable."""
        self._stop.set()
        self._kick.set()
        self._attention.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wake(self) -> None:
        """A job was queued: look at the queue now rather than at the next poll."""
        self._kick.set()

    def cancel(self, job_id: str) -> None:
        """Stop working on `job_id` if it is the job being run (it is already cancelled in the store).

        A job cancelled just as the runner claims it is caught by the store instead: its first
        batch write is refused because the job is no longer running.
        """
        with self._lock:
            if job_id == self._current:
                self._current_cancelled = True
        self._attention.set()

    def rate(self) -> float:
        """Examples per second of the job running now (0 when none)."""
        live = self._live
        if live is None:
            return 0.0
        started, done = live
        return done / max(time.perf_counter() - started, 1e-9)

    # ---- the runner thread -------------------------------------------------------------

    def _main(self) -> None:
        if not self._wait_for_model():
            return
        summarizer = self.summarize.summarizer
        # The device thread uses the summarizer's tokenizer; planning here needs its own copy.
        self._encoder = copy.copy(summarizer)
        self._encoder.tokenizer = copy.deepcopy(summarizer.tokenizer)
        while not self._stop.is_set():
            self._kick.clear()
            try:
                job = self.store.claim_next()
            except Exception:  # noqa: BLE001 - a database hiccup must not end the runner
                logger.exception("could not read the job queue; retrying in %s s", self.retry_seconds)
                self._stop.wait(self.retry_seconds)
                continue
            if job is None:
                self._kick.wait(1.0)
                continue
            self._run(job)

    def _wait_for_model(self) -> bool:
        while not self._stop.is_set():
            worker = self.summarize.worker
            if worker is not None and worker.wait_ready(0.2):
                return True
            if worker is not None and worker.state in (State.FAILED, State.STOPPED):
                return False
            self._stop.wait(0.1)
        return False

    def _run(self, job: dict) -> None:
        job_id = job["id"]
        summarizer = self.summarize.summarizer
        with self._lock:
            self._current, self._current_cancelled = job_id, False
        try:
            if job["model"] != summarizer.name:
                self._fail(job_id, f"the job was submitted for model {job['model']!r} but the server now "
                                   f"runs {summarizer.name!r}; submit it again")
                return
            records = self.store.records(job_id)
            done = self.store.done_ids(job_id)
            todo = [(i, record) for i, record in enumerate(records) if record.id not in done]
            logger.info("job %s: run %d, %d of %d examples to do", job_id, job["runs"], len(todo), len(records))
            if self._process(job, GenerationSpec.from_dict(job["generation"]), todo):
                rows = self.store.rows(job_id)
                metrics = compute_metrics(rows, records, summarizer=summarizer, generation=job["generation"])
                self.store.finish(job_id, metrics)
                logger.info("job %s succeeded", job_id)
        except _Interrupted:
            logger.info("job %s interrupted (cancelled or stopping)", job_id)
        except Exception as error:  # noqa: BLE001 - a broken job is failed, the runner goes on
            logger.exception("job %s failed", job_id)
            self._fail(job_id, f"internal error: {type(error).__name__}: {error}")
        finally:
            with self._lock:
                self._current = None

    def _fail(self, job_id: str, reason: str) -> None:
        try:
            self.store.fail(job_id, reason)
        except Exception:  # noqa: BLE001 - the job stays "running" and is retried on the next start
            logger.exception("could not mark job %s failed (%s)", job_id, reason)

    def _process(self, job: dict, spec: GenerationSpec, todo: list[tuple[int, Record]]) -> bool:
        """Run and store every batch; True when all are stored, False when the job was failed."""
        pending = deque(self._plan(spec, todo))
        self._live = (time.perf_counter(), 0)
        try:
            return self._drain(job, spec, pending)
        finally:
            self._live = None

    def _drain(self, job: dict, spec: GenerationSpec, pending: deque[list[_Entry]]) -> bool:
        """Work through `pending` batches (splitting failed ones); see `_process`."""
        job_id = job["id"]
        streak, last_error = 0, ""
        started = mark = time.perf_counter()
        done_in_run = 0
        while pending:
            self._check()
            batch = pending.popleft()
            try:
                write = self._execute(job, spec, batch)
            except (_Interrupted, concurrent.futures.CancelledError):
                raise _Interrupted from None
            except Exception as error:  # noqa: BLE001 - isolate the record at fault
                if len(batch) > 1:
                    logger.warning("job %s: batch of %d failed (%s); retrying its records one by one",
                                   job_id, len(batch), error)
                    pending.extendleft([entry] for entry in reversed(batch))
                    continue
                write = _error_write(job, batch[0], f"{type(error).__name__}: {error}")
            now = time.perf_counter()
            write.active_s, mark = now - mark, now
            if not self.store.write_batch(job_id, write):
                raise _Interrupted
            done_in_run += len(write.rows)
            self._live = (started, done_in_run)
            for row in write.rows:
                if row["error"] is None:
                    streak = 0
                else:
                    streak, last_error = streak + 1, row["error"]
            if streak >= MAX_FAILURE_STREAK:
                self.store.fail(job_id, f"{streak} examples in a row failed; the last one: {last_error}")
                return False
        return True

    def _plan(self, spec: GenerationSpec, todo: list[tuple[int, Record]]) -> list[list[_Entry]]:
        """Length-sorted batches under the token budget, as the evaluate command plans them."""
        if not todo:
            return []
        encoded = self._encoder.encode([record.text for _, record in todo])
        plan = self._encoder.plan(encoded, spec.num_beams)
        return [[_Entry(todo[k][0], todo[k][1], encoded[k]) for k in positions] for positions in plan]

    def _execute(self, job: dict, spec: GenerationSpec, batch: list[_Entry]) -> BatchWrite:
        """One batch through the worker, as prediction rows."""
        references = [entry.record.reference for entry in batch]
        item = WorkItem(
            texts=[entry.record.text for entry in batch],
            generation=spec,
            longest=max(len(entry.encoded.ids) for entry in batch),
            references=references if any(ref is not None for ref in references) else None,
            encoded=[entry.encoded for entry in batch],
            kind=Kind.JOB,
        )
        done = self._submit_and_wait(item)
        result = done.result
        peak = result.memory["peak_bytes"]
        rows = [
            prediction_row(entry.record, summary, details, peak)
            for entry, summary, details in zip(batch, result.summaries, result.items)
        ]
        return BatchWrite(rows=rows, positions=[entry.position for entry in batch], run=job["runs"],
                          peak_bytes=peak, seconds=result.timing["total"], queue_s=item.queue_seconds, active_s=0.0)

    def _submit_and_wait(self, item: WorkItem) -> ItemResult:
        worker = self.summarize.worker
        while True:
            self._check()
            try:
                worker.submit(item)
                break
            except QueueFull:
                self._stop.wait(self.queue_full_wait_s)
            except NotAccepting:
                raise _Interrupted from None
        # Sleep until the batch is done or `cancel`/`stop` ring: no polling, which would take the
        # GIL from the device thread many times a second.
        item.future.add_done_callback(lambda _: self._attention.set())
        while not item.future.done():
            self._attention.wait()
            self._attention.clear()
            if self._is_cancelled():
                worker.cancel(item)  # a batch already on the device runs on; its result is dropped
                raise _Interrupted
            if self._stop.is_set() and worker.cancel(item):
                raise _Interrupted
        return item.future.result()

    def _is_cancelled(self) -> bool:
        with self._lock:
            return self._current_cancelled

    def _check(self) -> None:
        if self._stop.is_set() or self._is_cancelled():
            raise _Interrupted


def _error_write(job: dict, entry: _Entry, reason: str) -> BatchWrite:
    """The row of a record that failed alone: no summary, the reason, left out of ROUGE."""
    row = {
        "id": entry.record.id, "prediction": "", "reference": entry.record.reference, "rouge": None,
        "error": reason, "input_tokens": len(entry.encoded.ids), "output_tokens": 0,
        "truncated": entry.encoded.truncated, "padding_computed": 0, "padding_avoided": 0,
        "seconds": 0.0, "batch_peak_bytes": 0,
    }
    return BatchWrite(rows=[row], positions=[entry.position], run=job["runs"], peak_bytes=0, seconds=0.0,
                      queue_s=0.0, active_s=0.0)
