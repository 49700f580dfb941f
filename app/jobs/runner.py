"""The job runner: one thread per process that runs evaluation jobs, one batch at a time, on the shared worker.

How a job runs (``JobRunner._run``):

1. The job is claimed from the store under this process's lease (`JobStore.claim_next`); the
   service renews the lease while the job runs (`heartbeat`), and every write checks it, so
   no two processes ever run one job and a dead owner's job is taken over once its lease expires.
2. The job's pending records (no prediction yet: this is the whole resume) are read a
   **window** at a time: at most `RunnerConfig.window_records` records and about
   `window_chars` characters. Only the window is tokenized (on this thread, with a private
   copy of the tokenizer) and planned into length-sorted batches under the service's token
   budget, so memory does not grow with the dataset and the first batch starts after one
   window's tokenization, whatever the dataset's size.
3. Records the submission marked failed (too long, not valid Unicode), or that the tokenizer
   refuses, get an error row without a model call. Each planned batch becomes one
   ``Kind.JOB`` work item on the device worker that also serves ``POST /summarize`` (which
   goes first, up to its burst limit).
4. A finished batch is written in one transaction (predictions, batch stats, counters). The
   next batch is handed to the worker just before that write, so the device does not wait
   for the store: at most one batch of a job is on the device, and one more queued behind it
   while a write is under way (taken back if the write ends the job's run).
5. When every record has a row, the job ends: ``failed`` with the first reasons when every
   example failed, else ``succeeded`` with metrics computed from all stored rows, streamed
   in record order (`bart_opt.evaluate.metrics_from_rows`), so ROUGE is the same however
   many times the job was interrupted.

Failures never loop and never strand a job: a batch that raises is split into single
records; a record that still fails alone is stored with its reason; `MAX_FAILURE_STREAK`
model failures in a row fail the job. A store error is retried with backoff for
`store_retry_s`; then the job is failed with the reason, or, when even that cannot be
written, left to its lease: this process (or another) claims it again once the store is
back, and it resumes. Cancelling (``DELETE``), losing the lease, or stopping ends the job's
run within the batch on the device (its result is dropped, or on stop written); a clean stop
hands the job back to the queue (`JobStore.release`), which is not counted as a stall.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from app.jobs.job import Job
from app.jobs.store import BatchWrite, JobStore, StoreConflict, StoredRecord, StoreError, describe_store_error
from app.service import shown_model
from app.worker import Kind, NotAccepting, QueueFull, State, WorkItem
from bart_opt.baselines import score_baselines
from bart_opt.errors import InvalidRequest
from bart_opt.evaluate import metrics_from_rows, prediction_row, refused_row
from bart_opt.spec import GenerationSpec
from bart_opt.summarizer import Encoded, Summarizer

if TYPE_CHECKING:
    from app.runner import ItemResult
    from app.service import SummarizeService

logger = logging.getLogger("app.jobs")

MAX_FAILURE_STREAK = 5
FIRST_REASONS = 3
T = TypeVar("T")


@dataclass(frozen=True)
class RunnerConfig:
    """The runner's settings: lease length, window size, and how long a store error is retried."""

    lease_s: float = 30.0
    window_records: int = 512
    window_chars: int = 2_000_000
    store_retry_s: float = 60.0


class _Interrupted(Exception):
    """The job's run stops here without a verdict: cancelled, its lease lost, or the service stopping."""


class _StoreDown(Exception):
    """The store kept failing for `RunnerConfig.store_retry_s`; the message says how (client-safe)."""


@dataclass
class _Entry:
    """One record of a planned batch: its position in the job, the record, its tokens."""

    position: int
    stored: StoredRecord
    encoded: Encoded


class JobRunner:
    """Runs jobs from `store` on the worker of `summarize` as `owner` (see the module docstring).

    `store_ready` is set once the store is open and migrated; the runner claims nothing before.
    """

    queue_full_wait_s = 0.05  # how long to wait before offering a batch to a full job queue again
    idle_poll_s = 1.0  # how often an idle runner looks for jobs queued by other processes

    def __init__(self, store: JobStore, summarize: SummarizeService, config: RunnerConfig, owner: str,
                 store_ready: threading.Event):
        self.store = store
        self.summarize = summarize
        self.config = config
        self.owner = owner
        self._store_ready = store_ready
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._attention = threading.Event()  # rung when the batch waited on is done, or on cancel / stop
        self._lock = threading.Lock()
        self._current: str | None = None  # the job being run
        self._current_cancelled = False  # cancelled, or its lease lost
        self._encoder: Summarizer | None = None
        self._live: tuple[float, int] | None = None  # start of the current run, examples done in it
        self._renewed = 0.0  # when the current job's lease was last claimed or renewed (monotonic)
        self.on_change: Callable[[], None] = lambda: None  # called when this runner starts or ends a job
        self._thread = threading.Thread(target=self._main, name="bart-opt-jobs", daemon=True)

    # ---- control (any thread) ------------------------------------------------------------

    def start(self) -> None:
        """Start the runner thread; it waits for the model and the store, then works through the queue."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the batch on the device (if any) is written; the job goes back to the queue."""
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

    def heartbeat(self) -> None:
        """Renew the lease of the job being run; stop running it when it is no longer ours.

        Called by the service every second or so; renews once a third of the lease has passed
        (a write transaction, so not every second). A store error is logged and the next call
        tries again (the lease outlives a few missed renewals).
        """
        job_id = self._current
        if job_id is None or time.monotonic() - self._renewed < self.config.lease_s / 3:
            return
        try:
            mine = self.store.renew(job_id, self.owner, self.config.lease_s)
        except StoreError as error:
            logger.warning("could not renew the lease of job %s: %s", job_id, describe_store_error(error))
            return
        self._renewed = time.monotonic()
        if not mine:
            logger.info("job %s is no longer ours (cancelled, or taken over after a stall)", job_id)
            self.cancel(job_id)

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
        delay = 0.0
        while not self._stop.is_set():
            self._kick.clear()
            if not self._store_ready.is_set():
                self._stop.wait(0.2)
                continue
            try:
                job = self.store.claim_next(self.owner, self.config.lease_s)
            except StoreError as error:
                delay = min(max(2 * delay, 0.1), 5.0)
                logger.warning("could not read the job queue (%s); retrying in %.1f s",
                               describe_store_error(error), delay)
                self._stop.wait(delay)
                continue
            delay = 0.0
            if job is None:
                self._kick.wait(self.idle_poll_s)
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

    def _run(self, job: Job) -> None:
        job_id = job.id
        summarizer = self.summarize.summarizer
        with self._lock:
            self._current, self._current_cancelled = job_id, False
        self._renewed = time.monotonic()
        self.on_change()
        logger.info("job %s: run %d, %d of %d examples done", job_id, job.runs, job.done, job.total)
        try:
            if job.model != summarizer.name:
                self._store(self.store.fail, job_id, f"the job was submitted for model {shown_model(job.model)!r} but the "
                            f"server now runs {shown_model(summarizer.name)!r}; submit it again", self.owner)
                return
            spec = GenerationSpec.from_dict(job.generation)
            if self._process(job, spec):
                self._conclude(job_id, job.generation)
        except _Interrupted:
            self._interrupted(job_id)
        except _StoreDown as down:
            self._store_down(job_id, str(down))
        except Exception:  # noqa: BLE001 - a broken job is failed, the runner goes on
            logger.exception("job %s failed", job_id)
            self._fail_once(job_id, f"internal error while running the job; the server log has the details "
                                    f"(job {job_id})")
        finally:
            with self._lock:
                self._current = None
            self._live = None
            self.on_change()

    def _interrupted(self, job_id: str) -> None:
        if self._is_cancelled():
            logger.info("job %s stopped (cancelled, or no longer ours)", job_id)
            return
        try:
            if self.store.release(job_id, self.owner):
                logger.info("job %s handed back to the queue (the service is stopping)", job_id)
            else:
                logger.info("job %s stopped: it is no longer ours (cancelled or taken over)", job_id)
        except StoreError as error:
            logger.warning("could not hand job %s back (%s); it is taken up again once its lease runs out",
                           job_id, describe_store_error(error))

    def _store_down(self, job_id: str, reason: str) -> None:
        message = (f"{reason} for more than {self.config.store_retry_s:g} s while the job ran; "
                   "submit it again once the database works")
        if self._fail_once(job_id, message):
            return
        logger.error("job %s: %s; it stays claimed and resumes when the database works again", job_id, reason)

    def _fail_once(self, job_id: str, reason: str) -> bool:
        """One attempt to mark the job failed; False when the store refuses."""
        try:
            return self.store.fail(job_id, reason, self.owner)
        except StoreError:
            logger.exception("could not mark job %s failed (%s)", job_id, reason)
            return False

    # ---- windows and batches -----------------------------------------------------------

    def _process(self, job: Job, spec: GenerationSpec) -> bool:
        """Run and store every pending record, a window at a time; True when all are stored,
        False when the job was failed."""
        self._live = (time.perf_counter(), 0)
        run = _Run(job.id, job.runs)
        after = -1
        while True:
            self._check()
            window = self._store(self.store.pending, run.job_id, after, self.config.window_records,
                                 self.config.window_chars)
            if not window:
                return True
            after = window[-1].position
            if not self._window(run, spec, window):
                return False

    def _window(self, run: _Run, spec: GenerationSpec, window: list[StoredRecord]) -> bool:
        """Tokenize and plan one window, then run its batches (see `_drain`)."""
        refused = [stored for stored in window if stored.error is not None]
        entries, unencodable = self._encode([stored for stored in window if stored.error is None])
        rows = [_error_row(stored, stored.error, None) for stored in refused]
        rows += [_error_row(stored, reason, None) for stored, reason in unencodable]
        if rows:
            positions = [stored.position for stored in refused] + [stored.position for stored, _ in unencodable]
            self._write(run, BatchWrite(rows=rows, positions=positions, run=run.number, model_call=False))
        if not entries:
            return True
        plan = self._encoder.plan([entry.encoded for entry in entries], spec.num_beams)
        return self._drain(run, spec, deque([[entries[k] for k in positions] for positions in plan]))

    def _encode(self, stored: list[StoredRecord]) -> tuple[list[_Entry], list[tuple[StoredRecord, str]]]:
        """Token ids of each record; a text the tokenizer refuses is set apart with the reason."""
        if not stored:
            return [], []
        try:
            encoded = self._encoder.encode([s.record.text for s in stored])
            return [_Entry(s.position, s, e) for s, e in zip(stored, encoded)], []
        except InvalidRequest:
            pass
        entries, refused = [], []
        for s in stored:
            try:
                entries.append(_Entry(s.position, s, self._encoder.encode([s.record.text])[0]))
            except InvalidRequest as error:
                refused.append((s, error.message))
        return entries, refused

    def _drain(self, run: _Run, spec: GenerationSpec, pending: deque[list[_Entry]]) -> bool:
        """Work through `pending` batches, splitting a failed one into single records; False
        when `MAX_FAILURE_STREAK` model failures in a row failed the job.

        The next batch is handed to the worker as soon as one is done, before that one is
        written, so the device does not wait for the store: a job has at most one batch on the
        device and, while a batch is being written, one more queued behind it.
        """
        queued: tuple[list[_Entry], WorkItem] | None = None
        while queued is not None or pending:
            if queued is None:  # a queued batch is `_wait`'s: it knows cancel and stop
                self._check()
                batch = pending.popleft()
                queued = (batch, self._submit(self._work_item(spec, batch)))
            batch, item = queued
            queued = None
            try:
                write = self._collect(run, batch, item, self._wait(item))
            except (_Interrupted, concurrent.futures.CancelledError):
                raise _Interrupted from None
            except Exception as error:  # noqa: BLE001 - isolate the record at fault
                if len(batch) > 1:
                    logger.warning("job %s: batch of %d failed (%s); retrying its records one by one",
                                   run.job_id, len(batch), error)
                    pending.extendleft([entry] for entry in reversed(batch))
                    continue
                logger.warning("job %s: example %r failed alone", run.job_id, batch[0].stored.record.id,
                               exc_info=True)
                reason = error.message if isinstance(error, InvalidRequest) else (
                    "the model failed on this example (internal error; the server log has the details)")
                row = _error_row(batch[0].stored, reason, batch[0].encoded)
                write = BatchWrite(rows=[row], positions=[batch[0].position], run=run.number)
            queued = self._prefetch(spec, pending)
            try:
                self._write(run, write)
                healthy = self._tally(run, write.rows)
            except BaseException:
                self._withdraw(queued)
                raise
            if not healthy:
                self._withdraw(queued)
                return False
        return True

    def _tally(self, run: _Run, rows: list[dict]) -> bool:
        """Count failures in a row; False when `MAX_FAILURE_STREAK` of them failed the job."""
        for row in rows:
            if row["error"] is None:
                run.streak = 0
            else:
                run.streak, run.last_error = run.streak + 1, row["error"]
        if run.streak >= MAX_FAILURE_STREAK:
            self._store(self.store.fail, run.job_id, f"{run.streak} examples in a row failed on the model; "
                        f"the last one: {run.last_error}", self.owner)
            return False
        return True

    def _write(self, run: _Run, write: BatchWrite) -> None:
        now = time.perf_counter()
        write.active_s, run.mark = now - run.mark, now
        if not self._store(self.store.write_batch, run.job_id, self.owner, write):
            raise _Interrupted
        run.done += len(write.rows)
        self._live = (run.started, run.done)

    def _work_item(self, spec: GenerationSpec, batch: list[_Entry]) -> WorkItem:
        """The worker's item for one batch (its encoded ids travel with it: no second tokenization)."""
        references = [entry.stored.record.reference for entry in batch]
        return WorkItem(
            texts=[entry.stored.record.text for entry in batch],
            generation=spec,
            longest=max(len(entry.encoded.ids) for entry in batch),
            references=references if any(ref is not None for ref in references) else None,
            encoded=[entry.encoded for entry in batch],
            kind=Kind.JOB,
        )

    def _collect(self, run: _Run, batch: list[_Entry], item: WorkItem, result: ItemResult) -> BatchWrite:
        """A finished batch's prediction rows, as one write."""
        summary = result.result
        peak = summary.memory["peak_bytes"]
        rows = [prediction_row(entry.stored.record, text, details, peak)
                for entry, text, details in zip(batch, summary.summaries, summary.items)]
        return BatchWrite(rows=rows, positions=[entry.position for entry in batch], run=run.number,
                          peak_bytes=peak, seconds=summary.timing["total"], queue_s=item.queue_seconds)

    def _submit(self, item: WorkItem) -> WorkItem:
        """Hand `item` to the worker, waiting while its queue is full."""
        worker = self.summarize.worker
        while True:
            self._check()
            try:
                worker.submit(item)
                return item
            except QueueFull:
                self._stop.wait(self.queue_full_wait_s)
            except NotAccepting:
                raise _Interrupted from None

    def _wait(self, item: WorkItem) -> ItemResult:
        """`item`'s result; `_Interrupted` when the job is cancelled, or the runner stops before
        the item reached the device."""
        worker = self.summarize.worker
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

    def _prefetch(self, spec: GenerationSpec, pending: deque[list[_Entry]]) -> tuple[list[_Entry], WorkItem] | None:
        """Hand the next pending batch to the worker now if it takes it at once; not while the
        job is stopping or cancelled, nor into a full queue (then it goes the usual way, later)."""
        if not pending or self._stop.is_set() or self._is_cancelled():
            return None
        item = self._work_item(spec, pending[0])
        try:
            self.summarize.worker.submit(item)
        except (QueueFull, NotAccepting):
            return None
        return pending.popleft(), item

    def _withdraw(self, queued: tuple[list[_Entry], WorkItem] | None) -> None:
        """Take a batch handed to the worker ahead of time back (its result would not be written)."""
        if queued is not None:
            self.summarize.worker.cancel(queued[1])

    # ---- the end of a job ----------------------------------------------------------------

    def _conclude(self, job_id: str, generation: dict) -> None:
        """Every record has a row: ``failed`` when all failed, else ``succeeded`` with the metrics."""
        job = self._store(self.store.get, job_id)
        if job.done != job.total:
            raise RuntimeError(f"job {job_id} has {job.done} rows for {job.total} records")
        if job.failed == job.total:
            firsts = self._store(self.store.first_failures, job_id, FIRST_REASONS)
            reasons = "; ".join(f"{example_id!r}: {error}" for example_id, error in firsts)
            self._store(self.store.fail, job_id, f"all {job.total} examples failed; the first: {reasons}",
                        self.owner)
            logger.info("job %s failed: every example failed", job_id)
            return
        model = self._model()
        metrics = self._store(lambda: metrics_from_rows(self.store.iter_rows(job_id), summarizer=model,
                                                        generation=generation))
        if job.baselines:  # on this thread, on the CPU: the device goes on with other work
            metrics["baselines"] = self._store(lambda: score_baselines(
                job.baselines, lambda: self.store.iter_records(job_id), model.scorer))
        if self._store(self.store.finish, job_id, self.owner, metrics):
            logger.info("job %s succeeded (%d of %d examples failed)", job_id, job.failed, job.total)

    # ---- helpers ---------------------------------------------------------------------------

    def _model(self) -> Summarizer:
        """What the final metrics name as the model and its device: the summarizer the batches ran on."""
        return self.summarize.summarizer

    def _store(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)`, retried with backoff while the store fails, for up to `store_retry_s`.

        Raises `_StoreDown` when it still fails then, `_Interrupted` when stopping meanwhile.
        A constraint violation is a bug, not a fault: it is raised at once.
        """
        deadline = time.monotonic() + self.config.store_retry_s
        delay = 0.05
        while True:
            try:
                return call(*args)
            except StoreConflict:
                raise
            except StoreError as error:
                reason = describe_store_error(error)
                if time.monotonic() + delay > deadline:
                    raise _StoreDown(reason) from error
                logger.warning("job store error (%s); retrying in %.2f s", reason, delay)
                if self._stop.wait(delay):
                    raise _Interrupted from error
                delay = min(2 * delay, 2.0)

    def _is_cancelled(self) -> bool:
        with self._lock:
            return self._current_cancelled

    def _check(self) -> None:
        if self._stop.is_set() or self._is_cancelled():
            raise _Interrupted


@dataclass
class _Run:
    """Bookkeeping of one run of a job: its number, progress, timing marks, failure streak."""

    job_id: str
    number: int
    done: int = 0
    streak: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        self.started = self.mark = time.perf_counter()


def _error_row(stored: StoredRecord, reason: str, encoded: Encoded | None) -> dict:
    """The row of a record that has no summary: the reason (with its token count once tokenized)."""
    row = refused_row(stored.record, reason)
    if encoded is not None:
        row.update(input_tokens=len(encoded.ids), truncated=encoded.truncated)
    return row
