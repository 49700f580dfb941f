"""The job runner: one thread per process that runs evaluation jobs through the evaluation core.

How a job runs (``JobRunner._run``):

1. The job is claimed from the store under this process's lease (`JobStore.claim_next`); the
   service renews the lease while the job runs (`heartbeat`), and every write checks it, so
   no two processes ever run one job and a dead owner's job is taken over once its lease expires.
2. Its run is `bart_opt.evaluate.core.evaluate_records` over the job's pending records
   (`app.jobs.storage.StoreSource`: no prediction yet, this is the whole resume, a window at a
   time) into the jobs database (`app.jobs.storage.StoreSink`: one transaction per row batch),
   with the runner's executor: the engine's (`app.jobs.ports.JobEngine.executor`; the service's is
   its device worker, `SummarizerExecutor` on a `app.device.engine.WorkerDevice`: each planned batch one
   ``Kind.JOB`` item, which ``POST /summarize`` goes before up to its burst limit, the next batch
   queued while one is written) or, with
   ``BART_OPT_RAY_ADDRESS``, the replicas of a `bart_opt.distributed.ReplicaPool`. The core holds
   the rules: refused and failed rows, dedupe by id, failure splitting, the failure streak.
3. When every record has a row, the job ends: ``failed`` with the first reasons when every
   example failed, else ``succeeded`` with metrics computed from all stored rows, streamed in
   record order (`bart_opt.evaluate.metrics`), so ROUGE is the same however many times the job
   was interrupted, and the baselines it asked for. Scores use the job's own ROUGE settings
   (``rouge_settings``) and metrics (its record's ``metrics``; a job from before them: ROUGE
   only), and the metrics carry the job's signature. With ``BART_OPT_MLFLOW_URI``
   the finished job is logged to MLflow first (`app.jobs.tracking`; a failure is a warning of the job).

A job carries its engine (``engine_key``, `bart_opt.evaluate.record.engine_key`): a runner claims only
jobs of its own engine (`JobStore.claim_next`), so two replicas with other ``BART_OPT_*`` engine
settings on one database, or a server restarted with other ones, never finish a job another engine
began; a job no replica of its engine has claimed for `RunnerConfig.engine_wait_s` is failed naming
both engines (`JobStore.fail_foreign`). A job of another system's predictions (``system``
``external``) runs on any replica, through `bart_opt.evaluate.external.ScoringExecutor`: no model.

Failures never loop and never strand a job: a record the model fails on alone is stored with
its reason; `bart_opt.evaluate.core.MAX_FAILURE_STREAK` such failures in a row fail the job; a
cluster that cannot run the job fails it with the reason. A store error is retried with backoff
for `store_retry_s`; then the job is failed with the reason, or, when even that cannot be
written, left to its lease: this process (or another) claims it again once the store is back,
and it resumes. Cancelling (``DELETE``) or losing the lease ends the job's run within the batch
on the device (its result is dropped); stopping writes the batch on the device and hands the
job back to the queue (`JobStore.release`), which is not counted as a stall.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from app.jobs.job import Job
from app.jobs.paths import shown_model
from app.jobs.ports import GIVEN_UP, JobEngine
from app.jobs.storage import Interrupted, StoreSink, StoreSource
from app.jobs.store import JobStore, StoreConflict, StoreError, describe_store_error
from bart_opt.evaluate.core import Executor, FailureStreak, RunControl, evaluate_records
from bart_opt.evaluate.external import ScoringExecutor
from bart_opt.evaluate.metrics import RowTotals, metrics_from_rows, score_baselines
from bart_opt.evaluate.record import engine_key
from bart_opt.pipeline.rouge import RougeSettings
from bart_opt.scoring.base import Metric
from bart_opt.scoring.registry import MetricSettings, build_metrics
from bart_opt.engine.spec import GenerationSpec
from bart_opt.surfaces import surfaced

logger = logging.getLogger("app.jobs")

FIRST_REASONS = 3
T = TypeVar("T")


@dataclass(frozen=True)
class RunnerConfig:
    """The runner's settings: lease length, window size, how long a store error is retried, how long
    a job of another engine waits for a replica of its engine before this runner fails it, and the MLflow
    tracking URI finished jobs are logged to (None: none). Each field is also a service setting
    (`bart_opt.surfaces`: ``BART_OPT_JOB_LEASE_S``, ...)."""

    lease_s: float = surfaced(30.0, "seconds a process's claim on a job holds unrenewed; a dead owner's job is taken "
                                    "over after it", setting="job_lease_s", gt=0)
    window_records: int = surfaced(512, "records a running job tokenizes and plans at a time", setting="job_window",
                                   ge=1)
    window_chars: int = surfaced(2_000_000, "characters a running job tokenizes at a time (about)",
                                 setting="job_window_chars", ge=1)
    store_retry_s: float = surfaced(60.0, "seconds a running job retries a failing jobs database before it is failed",
                                    setting="store_retry_s", ge=0)
    engine_wait_s: float = surfaced(300.0, "seconds a job submitted to another engine (other dtype, mode, static, "
                                           "EL-attention, quantize or device) waits for a replica with that engine "
                                           "before this one fails it, naming both", setting="job_engine_wait_s", gt=0)
    mlflow_uri: str | None = surfaced(None, "log each finished evaluation job as a run in MLflow at this tracking URI "
                                      "(http://HOST:PORT, sqlite:///PATH, ...; the tracking extra): params, metrics and "
                                      "artifacts as bart-opt evaluate --mlflow logs them. A failure to log is one of the "
                                      "job's warnings, never a failed job. Unset: MLflow is not imported",
                                      setting="mlflow_uri")


class _StoreDown(Exception):
    """The store kept failing for `RunnerConfig.store_retry_s`; the message says how (client-safe)."""


class JobRunner:
    """Runs jobs from `store` as `owner` with the executor `executor()` makes once the engine's
    model is loaded (see the module docstring).

    `store_ready` is set once the store is open and migrated; the runner claims nothing before.
    """

    idle_poll_s = 1.0  # how often an idle runner looks for jobs queued by other processes

    def __init__(self, store: JobStore, engine: JobEngine, executor: Callable[[], Executor], config: RunnerConfig,
                 owner: str, store_ready: threading.Event):
        self.store = store
        self.engine = engine
        self.config = config
        self.owner = owner
        self._make_executor = executor
        self._executor: Executor | None = None
        self._executor_lock = threading.Lock()
        self._foreign_checked = 0.0  # when jobs of other engines were last looked for (monotonic)
        self._store_ready = store_ready
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._lock = threading.Lock()
        self._current: str | None = None  # the job being run
        self._control = RunControl()  # the current job's run
        self._live: tuple[float, int] | None = None  # start of the current run, examples done in it
        self._renewed = 0.0  # when the current job's lease was last claimed or renewed (monotonic)
        self.on_change: Callable[[], None] = lambda: None  # called when this runner starts or ends a job
        # Failed reads of the job queue in a row, and the wall-clock time of the first (0: the last read worked).
        self._queue_failures: tuple[int, float] = (0, 0.0)
        self._thread = threading.Thread(target=self._main, name="bart-opt-jobs", daemon=True)

    # ---- control (any thread) ------------------------------------------------------------

    def start(self) -> None:
        """Start the runner thread; it waits for the model and the store, then works through the queue."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the batch on the device (if any) is written; the job goes back to the queue."""
        self._stop.set()
        self._kick.set()
        with self._lock:
            self._control.stop()
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
                self._control.cancel()

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

    def executor(self) -> Executor:
        """The executor of this process's model jobs, made once (after the model is loaded)."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = self._make_executor()
            return self._executor

    @property
    def engine_key(self) -> str | None:
        """This replica's engine as jobs record it (`bart_opt.evaluate.record.engine_key`)."""
        return engine_key(self.executor().engine_record())

    def queue_failures(self) -> tuple[int, float]:
        """How many reads of the job queue failed in a row (0 once one works), and the wall-clock time of the first."""
        return self._queue_failures

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
        mine = self.engine_key
        delay = 0.0
        while not self._stop.is_set():
            self._kick.clear()
            if not self._store_ready.is_set():
                self._stop.wait(0.2)
                continue
            try:
                self._fail_foreign(mine)
                job = self.store.claim_next(self.owner, self.config.lease_s, mine)
            except Exception as error:  # noqa: BLE001 - the runner thread never dies: accepted jobs wait for it
                failures, since = self._queue_failures
                self._queue_failures = (failures + 1, since or time.time())
                delay = min(max(2 * delay, 0.1), 5.0)
                if isinstance(error, StoreError):
                    logger.warning("could not read the job queue (%s); retrying in %.1f s",
                                   describe_store_error(error), delay)
                else:
                    logger.exception("reading the job queue failed unexpectedly; retrying in %.1f s", delay)
                self._stop.wait(delay)
                continue
            delay = 0.0
            self._queue_failures = (0, 0.0)
            if job is None:
                self._kick.wait(self.idle_poll_s)
                continue
            self._run(job)

    def _fail_foreign(self, mine: str | None) -> None:
        """Every few seconds, fail the jobs of other engines that waited `engine_wait_s` for a replica of theirs."""
        if mine is None or time.monotonic() - self._foreign_checked < min(5.0, self.config.engine_wait_s / 2):
            return
        self._foreign_checked = time.monotonic()
        for job_id in self.store.fail_foreign(mine, self.config.engine_wait_s):
            logger.warning("job %s failed: no replica with its engine took it within %g s (this one runs %s)",
                           job_id, self.config.engine_wait_s, mine)

    def _wait_for_model(self) -> bool:
        while not self._stop.is_set():
            if self.engine.wait_ready(0.2):
                return True
            if self.engine.state in GIVEN_UP:
                return False
            self._stop.wait(0.1)
        return False

    def _run(self, job: Job) -> None:
        control = RunControl(on_status=functools.partial(self._detail, job.id))
        with self._lock:
            self._current, self._control = job.id, control
            if self._stop.is_set():
                control.stop()
        self._renewed = time.monotonic()
        self.on_change()
        logger.info("job %s: run %d, %d of %d examples done", job.id, job.runs, job.done, job.total)
        try:
            if job.system == "bart" and (self._claimed_for_another_model(job) or
                                         self._claimed_for_another_checkpoint(job) or
                                         self._claimed_for_another_engine(job)):
                return
            self._process(job, control)
            self._conclude(job.id)
        except Interrupted:
            self._interrupted(job.id, control)
        except _StoreDown as down:
            self._store_down(job.id, str(down))
        except FailureStreak as streak:
            self._store(self.store.fail, job.id, str(streak), self.owner)
        except Exception as error:  # noqa: BLE001 - a broken job is failed, the runner goes on
            self._failed(job.id, error)
        finally:
            with self._lock:
                self._current = None
            self._live = None
            self.on_change()

    def _claimed_for_another_model(self, job: Job) -> bool:
        """Fail `job` when it was submitted for another model than the executor's (True)."""
        if {"model": job.model} == self._executor.identity():
            return False
        self._store(self.store.fail, job.id, f"the job was submitted for model {shown_model(job.model)!r} but the "
                    f"server now runs {shown_model(self.engine.name)!r}; submit it again", self.owner)
        return True

    def _claimed_for_another_checkpoint(self, job: Job) -> bool:
        """Fail `job` when the checkpoint loaded now is not the one it was submitted to (True): the
        same path refilled with other weights must not finish a job half made by the first ones.

        A job from before fingerprints (none stored) takes this checkpoint's if no row is stored
        yet; with rows stored it cannot be told what made them, so it is failed.
        """
        found = self._executor.fingerprint
        if job.fingerprint is None:
            if found is None or self._store(self.store.adopt_fingerprint, job.id, self.owner, found):
                return False
            reason = (f"the job has {job.done} stored predictions but no record of the checkpoint that made them "
                      f"(it predates checkpoint fingerprints), and the server now runs {found}; submit it again")
        elif found == job.fingerprint:
            return False
        else:
            reason = (f"the job was submitted to checkpoint {job.fingerprint}, but {shown_model(self.engine.name)!r} "
                      f"is now checkpoint {found}; its {job.done} stored predictions are kept, and nothing is mixed: "
                      "submit it again to run it on this checkpoint")
        logger.warning("job %s not resumed: %s", job.id, reason)
        self._store(self.store.fail, job.id, reason, self.owner)
        return True

    def _claimed_for_another_engine(self, job: Job) -> bool:
        """Fail `job` when this replica's engine is not the one it was submitted to (True). A job from
        before schema 7 (no engine recorded) takes this one if no row is stored yet; with rows stored it
        cannot be told what made them, so it is failed."""
        mine = self._executor.engine_record()
        if job.engine_key == engine_key(mine):
            return False
        if job.engine_key is None:
            if self._store(self.store.adopt_engine, job.id, self.owner, mine):
                return False
            reason = (f"the job has {job.done} stored predictions but no record of the engine that made them (it "
                      f"predates engine records), and this server runs {engine_key(mine)}; submit it again")
        else:
            reason = (f"the job was submitted to engine {job.engine_key}, but this server runs {engine_key(mine)}; "
                      f"its {job.done} stored predictions are kept and nothing is mixed: submit it again to run it "
                      "on this engine")
        logger.warning("job %s not resumed: %s", job.id, reason)
        self._store(self.store.fail, job.id, reason, self.owner)
        return True

    def _executor_of(self, job: Job) -> Executor:
        """What runs `job`: this process's model executor, or a `ScoringExecutor` for another system's predictions."""
        if job.system == "external":
            return ScoringExecutor(job.model, _rouge(job))
        return self._executor

    def _process(self, job: Job, control: RunControl) -> None:
        """Store a row for every pending record; `Interrupted` when the run ends before."""
        self._live = (time.perf_counter(), 0)

        def written(rows: int) -> None:
            started, done = self._live
            self._live = (started, done + rows)

        source = StoreSource(self._store, self.store, job, self.config.window_records, self.config.window_chars)
        sink = StoreSink(self._store, self.store, job, self.owner, job.runs, on_write=written)
        spec = GenerationSpec.from_dict(job.generation) if job.generation is not None else None
        evaluate_records(source, sink, self._executor_of(job), spec, control=control, rouge=_rouge(job),
                         metrics=_metrics(job))
        if control.stopping:
            raise Interrupted

    def _failed(self, job_id: str, error: Exception) -> None:
        """Fail the job with what a client may see: a cluster's reason, else an internal error."""
        from_cluster = type(error).__name__ == "ClusterError"  # bart_opt.distributed, imported only with Ray
        if from_cluster:
            logger.error("job %s: %s", job_id, error, exc_info=error.__cause__)
            reason = f"{error}; submit the job again"
        else:
            logger.exception("job %s failed", job_id)
            reason = f"internal error while running the job; the server log has the details (job {job_id})"
        self._fail_once(job_id, reason)

    def _detail(self, job_id: str, message: str) -> None:
        """Show what the job waits for or runs on (a failed write only loses the message)."""
        logger.info("job %s: %s", job_id, message)
        try:
            self.store.set_detail(job_id, self.owner, message)
        except Exception:  # noqa: BLE001 - a status line is not worth failing the job for
            logger.warning("could not store the status of job %s", job_id, exc_info=True)

    def _interrupted(self, job_id: str, control: RunControl) -> None:
        if control.cancelled:
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

    # ---- the end of a job ----------------------------------------------------------------

    def _conclude(self, job_id: str) -> None:
        """Every record has a row: ``failed`` when all failed, else ``succeeded`` with the metrics.
        `Interrupted` when some record has none (the executor stopped early: the service is stopping)."""
        job = self._store(self.store.get, job_id)
        if job.done < job.total:
            raise Interrupted
        if job.failed == job.total:
            firsts = self._store(self.store.first_failures, job_id, FIRST_REASONS)
            reasons = "; ".join(f"{example_id!r}: {error}" for example_id, error in firsts)
            self._store(self.store.fail, job_id, f"all {job.total} examples failed; the first: {reasons}", self.owner)
            logger.info("job %s failed: every example failed", job_id)
            return
        rouge, record = _rouge(job), job_record(job)
        if job.system == "external":
            metrics = self._store(lambda: RowTotals(rouge.scorer(), record.get("metrics"))
                                  .added(self.store.iter_rows(job_id)).external_metrics(record))
        else:
            model = self._executor.model
            metrics = self._store(lambda: metrics_from_rows(self.store.iter_rows(job_id), model=model,
                                                            generation=job.generation, scorer=rouge.scorer(),
                                                            record=record))
        if job.baselines:  # on this thread, on the CPU: the device goes on with other work
            built = _metrics(job)
            metrics["baselines"] = self._store(lambda: score_baselines(
                job.baselines, lambda: self.store.iter_records(job_id), rouge.scorer(), built, record.get("metrics")))
        if self.config.mlflow_uri is not None:  # before it finishes: the job's view says where it went, or why not
            from app.jobs.tracking import tracked

            metrics = tracked(self.config.mlflow_uri, self.store, job, record, metrics)
        if self._store(self.store.finish, job_id, self.owner, metrics):
            logger.info("job %s succeeded (%d of %d examples failed)", job_id, job.failed, job.total)

    # ---- helpers ---------------------------------------------------------------------------

    def _store(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)`, retried with backoff while the store fails, for up to `store_retry_s`.

        Raises `_StoreDown` when it still fails then, `Interrupted` when stopping meanwhile.
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
                    raise Interrupted from error
                delay = min(2 * delay, 2.0)


def _rouge(job: Job) -> RougeSettings:
    """The job's ROUGE settings (the defaults for a job from before schema 7)."""
    return RougeSettings.from_dict(job.rouge_settings) if job.rouge_settings is not None else RougeSettings()


def _metrics(job: Job) -> list[Metric]:
    """The job's metrics built (`bart_opt.scoring.registry`); none beyond ROUGE for a job from before them."""
    recorded = (job.record or {}).get("metrics")
    return [] if recorded is None else build_metrics(MetricSettings.from_dict(recorded), _rouge(job))


def job_record(job: Job) -> dict:
    """The job's run record, as a run folder's run.json holds it (`bart_opt.evaluate.record.run_record`)."""
    extra = job.record or {}
    record = {"system": job.system, "model": job.model, "fingerprint": job.fingerprint, "generation": job.generation,
              "engine": job.engine, "rouge_settings": job.rouge_settings or RougeSettings().to_dict(),
              **{key: extra.get(key) for key in ("versions", "processor", "started_at")}}
    if extra.get("metrics") is not None:
        record["metrics"] = extra["metrics"]
    return record
