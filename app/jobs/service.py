"""`JobService`: what the ``/evaluate`` routes call. Validation, the store, the runner, the job view.

Submitting checks everything it can before answering, so a bad request is a 4xx and never a
failed job: the generation options (as ``/summarize`` checks them), the dataset source (a
file inside ``BART_OPT_DATA_DIR``, see `app.jobs.paths`; a hub id on the allowlist, see
`app.jobs.sources`), and the records themselves, which stream from the source into the store
(`app.jobs.intake`). Loading runs on small pools of its own (one for hub datasets, one for
files and inline records), never on the threads that ``/summarize`` uses; a full pool answers
429. The job then waits for a runner: this process's or, on a shared database, another's.

A background upkeep thread opens the store (again and again while it cannot, so the job
routes come back without a restart), renews the running job's lease, caches the job counts
for ``/metrics`` (a scrape runs no SQL) and removes submissions whose loader died.

Several replicas may share one database (PostgreSQL, or one SQLite file on one machine): each
is an owner (`JobService.owner`, the ``replica`` label of its metrics), any of them answers
any job's routes, and the counts it reports are the database's.

Errors: a database failure is a 503 saying what is wrong with it (read-only, full, busy,
unreachable) and never a path or host, with ``Retry-After``; a damaged database (corrupt
pages: an error that says so, or the check the upkeep thread runs once the store is open,
`JobStore.verify`) is a 503 without it, since retrying cannot help: from then on this process refuses
submissions and ``/ready`` says why (`JobService.damaged`) until it is restarted on a
repaired database. A file's OS error is a 422 naming the file as the client gave it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from app.engine import Engine, WorkerDevice
from app.errors import ApiError
from app.jobs.bodies import EvaluateRequest, JobView
from app.jobs.database import PoolLimits, StoreError
from app.jobs.intake import BoundedPool, Intake, IntakeLimits, LoadAbandoned, LoadCancelled, PoolBusy
from app.jobs.job import STATUSES, Job
from app.jobs.listing import Cursor, link, page
from app.jobs.migrations import SchemaTooNew
from app.jobs.paths import DataFileMissing, DataFileUnreadable, PathRefused, resolve_data_file, shown, unreadable
from app.jobs.runner import JobRunner, RunnerConfig
from app.jobs.sources import SourceRefused, check_hub_source, parse_allowlist
from app.jobs.store import ERROR_FILTERS, JobStore, NewJob, describe_store_error
from app.metrics import Metrics
from app.settings import Settings
from bart_opt.data import HubUnavailable, MissingColumnError, RecordStream, iter_records
from bart_opt.errors import InvalidRequest
from bart_opt.evaluate.core import Executor, SummarizerExecutor
from bart_opt.evaluate.record import run_record
from bart_opt.scoring.registry import build_metrics
from bart_opt.fingerprint import FileChanged, FileWatch
from bart_opt.readers import TooLarge

logger = logging.getLogger("app.jobs")

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
_UPKEEP_S = 1.0
_STALE_EVERY = 30  # upkeep ticks between looks for submissions whose loader died
_RETRY_AFTER = {"Retry-After": "5"}


class JobService:
    """Evaluation jobs on the service's shared `Engine`: its model, and its device worker or a Ray cluster."""

    def __init__(self, settings: Settings, metrics: Metrics, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        pool = PoolLimits(size=settings.db_pool_size, overflow=settings.db_max_overflow,
                          timeout_s=settings.db_pool_timeout_s, connect_timeout_s=settings.db_connect_timeout_s)
        self.store = JobStore(settings.db, pool=pool)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._store_ready = threading.Event()
        config = RunnerConfig(lease_s=settings.job_lease_s, window_records=settings.job_window,
                              window_chars=settings.job_window_chars, store_retry_s=settings.store_retry_s,
                              engine_wait_s=settings.job_engine_wait_s)
        self.runner = JobRunner(self.store, engine, self._executor, config, self.owner, self._store_ready)
        limits = IntakeLimits(max_records=settings.max_job_records, max_record_chars=settings.max_record_chars)
        self.intake = Intake(self.store, limits, self.owner, settings.job_lease_s)
        self._hub_allowed = parse_allowlist(settings.hub_datasets)
        workers = settings.dataset_loaders
        self._pools = {"hub": BoundedPool("bart-opt-hub", workers, workers),
                       "local": BoundedPool("bart-opt-load", workers, workers)}
        self.unavailable: str | None = "the jobs database is being opened"  # why job routes answer 503
        self.damaged: str | None = None  # why the database cannot be used again without a repair
        self._counts = dict.fromkeys(STATUSES, 0)  # cached for /metrics, refreshed by the upkeep thread
        self._stop = threading.Event()
        self._changed = threading.Event()  # a job changed state here: refresh the cached counts now
        self.runner.on_change = self._changed.set
        self._upkeep = threading.Thread(target=self._upkeep_loop, name="bart-opt-jobs-upkeep", daemon=True)
        replica = ("replica",)
        metrics.gauge("jobs_running", "Evaluation jobs running now, on every replica (from the database).",
                      replica).labels(self.owner).set_function(lambda: self._counts["running"])
        metrics.gauge("jobs_queued", "Evaluation jobs waiting to run (from the database).",
                      replica).labels(self.owner).set_function(lambda: self._counts["queued"])
        metrics.gauge(
            "job_examples_per_second", "Examples per second of the evaluation job this replica runs (0 when none).",
            replica,
        ).labels(self.owner).set_function(self.runner.rate)

    def _executor(self) -> Executor:
        """What runs the jobs' batches: the engine's device worker, or replicas on the Ray cluster of
        ``BART_OPT_RAY_ADDRESS`` (only then is Ray imported)."""
        s = self.settings
        if s.ray_address is None:
            return SummarizerExecutor(self.engine.summarizer, device=lambda control: WorkerDevice(self.engine, control))
        from bart_opt.distributed import ClusterOptions, ReplicaPool

        cluster = ClusterOptions(address=s.ray_address, replicas=s.ray_replicas, gpus_per_replica=s.ray_gpus_per_replica,
                                 threads_per_replica=s.ray_threads_per_replica, start_timeout_s=s.ray_start_timeout_s,
                                 stall_timeout_s=s.ray_stall_timeout_s)
        return ReplicaPool(s.engine_options(), cluster, name=s.model)

    # ---- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Open the store (or keep trying in the background), start the runner and the upkeep thread."""
        self._open_store()
        self.runner.start()
        self._upkeep.start()

    def stop(self) -> None:
        """Stop loading and running (the batch on the device is written, the job handed back; blocks)."""
        self._stop.set()
        self._changed.set()
        for pool in self._pools.values():
            pool.shutdown()
        self.runner.stop(timeout=self.settings.shutdown_timeout)
        self._upkeep.join(timeout=5)
        self.store.close()

    def _open_store(self) -> bool:
        try:
            self.store.initialize()
        except (StoreError, OSError, SchemaTooNew) as error:
            reason = str(error) if isinstance(error, SchemaTooNew) else (
                describe_store_error(error) if isinstance(error, StoreError) else
                "the jobs database (BART_OPT_DB) cannot be opened (its folder cannot be created)")
            if reason != self.unavailable:
                logger.error("evaluation jobs unavailable: %s (%s: %r)", reason, self.store.shown, error.__cause__ or error)
            self.unavailable = reason
            if isinstance(error, StoreError) and error.damaged:
                self._damaged(error)
            return False
        if self.unavailable is not None:
            logger.info("jobs database %s open; evaluation jobs available", self.store.shown)
        self.unavailable = None
        self._store_ready.set()
        return True

    def _upkeep_loop(self) -> None:
        tick = 0
        every = min(_UPKEEP_S, self.settings.job_lease_s / 3)  # a lease is renewed well before it runs out
        verified = False
        while not self._stop.is_set():
            self._changed.wait(every)
            self._changed.clear()
            if self._stop.is_set():
                return
            if self.damaged is not None or (not self._store_ready.is_set() and not self._open_store()):
                continue
            self.runner.heartbeat()
            try:
                if not verified:  # once a process, here rather than at start: it reads the whole file
                    self.store.verify()
                    verified = True
                self._counts = self.store.counts()
                tick += 1
                if tick % _STALE_EVERY == 0:
                    for job_id in self.store.discard_stale():
                        logger.warning("removed job %s: its loader stopped before its records were all in", job_id)
            except StoreError as error:
                logger.warning("jobs upkeep: %s", describe_store_error(error))
                if error.damaged:
                    self._damaged(error)

    def _damaged(self, error: StoreError) -> None:
        """The database is damaged: stop using it (no claims, no submissions) until a restart."""
        if self.damaged is None:
            logger.error("the jobs database %s is damaged; evaluation jobs are off until it is repaired or restored "
                         "and the server restarted: %r", self.store.shown, error.__cause__)
        self.damaged = error.reason
        self._store_ready.clear()

    def damage(self) -> dict | None:
        """``{"code": "jobs_store_damaged", "message"}`` while the database is known to be damaged
        (``/ready`` lists it and reads ``degraded``), else None."""
        if self.damaged is None:
            return None
        return {"code": "jobs_store_damaged", "message": f"{self.damaged}: evaluation jobs are off; repair or "
                "restore the database (BART_OPT_DB) and restart the server"}

    def store_problem(self) -> dict | None:
        """``{"code": "jobs_unavailable", "message"}`` while the jobs database cannot be opened (``/ready`` lists it
        and reads ``degraded``; the message names the cause: a refused login, a missing right, a server that
        cannot be reached), else None; None too while it is known to be damaged (`damage` says so)."""
        reason = self.unavailable
        if reason is None or self.damaged is not None:
            return None
        return {"code": "jobs_unavailable", "message": f"evaluation jobs are unavailable: {reason}; "
                "the service retries every second"}

    def queue_problem(self) -> dict | None:
        """``{"code": "jobs_queue_unreadable", "message"}`` while this process's runner fails to read the job
        queue (``/ready`` lists it and reads ``degraded``; the cause is in the server log, not shown), else None;
        None too while the database is known to be damaged, which `damage` reports instead."""
        failures, since = self.runner.queue_failures()
        if not failures or self.damaged is not None:
            return None
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
        return {"code": "jobs_queue_unreadable",
                "message": f"the job runner has failed to read the job queue {failures} time(s) in a row since {at} "
                           "and keeps retrying; accepted jobs wait (the server log has the cause)"}

    def _check_damaged(self) -> None:
        """Raise the 503 of a damaged database (no ``Retry-After``); nothing when it is not known to be."""
        damage = self.damage()
        if damage is not None:
            raise ApiError(503, damage["code"], damage["message"])

    def _check_available(self) -> None:
        self._check_damaged()
        if self.unavailable is not None:
            raise ApiError(503, "jobs_unavailable", f"evaluation jobs are unavailable: {self.unavailable}",
                           headers=_RETRY_AFTER)

    @contextmanager
    def _store_errors(self) -> Iterator[None]:
        """A database failure during a route's work becomes a 503 that says what is wrong (with
        ``Retry-After`` unless the database is damaged)."""
        try:
            yield
        except StoreError as error:
            logger.warning("jobs database error: %s (%r)", error.reason, error.__cause__)
            if error.damaged:
                self._damaged(error)
                self._check_damaged()
            raise ApiError(503, "jobs_store_unavailable", f"{describe_store_error(error)}; retry later",
                           headers=_RETRY_AFTER) from error

    # ---- the routes' operations -------------------------------------------------------------

    async def submit(self, body: EvaluateRequest, idempotency_key: str | None) -> tuple[dict, bool]:
        """Create a queued job; returns ``(view, True)``, or ``(existing view, False)`` for a known key.

        Raises ApiError: 503 before the model is loaded or while the store cannot be written,
        409 for a key used with another body (or still being loaded), 422 for bad options, a
        refused, missing or unreadable source, a missing column, bad records; 429 when the
        loading pool is full; 502 when a hub dataset cannot be read.
        """
        self._check_available()
        self.engine.check_ready()
        if idempotency_key is not None and not _IDEMPOTENCY_KEY.match(idempotency_key):
            raise ApiError(422, "invalid_request", "Idempotency-Key: must be 1 to 255 visible ASCII characters",
                           field="Idempotency-Key")
        if body.limit is not None and body.limit > self.settings.max_job_records:
            raise ApiError(422, "invalid_request", f"limit: at most {self.settings.max_job_records:,} records per "
                           "job (BART_OPT_MAX_JOB_RECORDS)", field="limit")
        spec = body.dataset
        if spec.source == "hub":
            try:
                check_hub_source(spec.hub, spec.config, spec.split, self._hub_allowed)
            except SourceRefused as error:
                raise ApiError(422, "dataset_not_allowed", f"{error.field}: {error.message}",
                               field=error.field) from None
        pool = self._pools["hub" if spec.source == "hub" else "local"]
        cancelled = threading.Event()
        try:
            return await pool.run(self._submit, body, idempotency_key, cancelled)
        except asyncio.CancelledError:  # the deadline passed or the client left: stop loading, keep nothing
            cancelled.set()
            raise
        except PoolBusy:
            kind = "hub datasets" if spec.source == "hub" else "datasets"
            raise ApiError(429, "loaders_busy", f"the server is loading as many {kind} as it may at once "
                           "(BART_OPT_DATASET_LOADERS); retry shortly", headers=_RETRY_AFTER) from None

    def _submit(self, body: EvaluateRequest, idempotency_key: str | None,
                cancelled: threading.Event) -> tuple[dict, bool]:
        """The blocking part of `submit`, on a loading pool's thread."""
        with self._store_errors():
            request_hash = _hash(body)
            if idempotency_key is not None:
                existing = self.store.find_by_key(idempotency_key)
                if existing is not None:
                    return self._replay(existing, idempotency_key, request_hash), False
            new = self._new_job(body, request_hash, idempotency_key)
            with self._dataset_errors(body) as where:
                records, watch = self._open(body)
                try:
                    job, created = self.intake.load(new, records, cancelled, watch)
                finally:
                    records.close()
            if not created:
                return self._replay(job, idempotency_key, request_hash), False
            logger.debug("job %s from %s", job.id, where)
        self.runner.wake()
        self._changed.set()
        return self.view(job), True

    def _new_job(self, body: EvaluateRequest, request_hash: str, idempotency_key: str | None) -> NewJob:
        """The job `body` asks for, with its run record: the engine and checkpoint of this server (a model
        job), the ROUGE settings, the metrics, the versions, the processor and the signature. Raises
        `InvalidRequest` (a 422) naming ``generation.*``, ``rouge.*`` or ``metrics``."""
        options = body.rouge
        try:
            rouge = self.settings.rouge_settings(options and options.tokenizer, options and options.lang)
        except InvalidRequest as error:
            raise error.within("rouge") from None
        try:
            metrics = self.settings.metric_settings(rouge, body.metrics)
        except InvalidRequest as error:
            if error.field == "metrics":
                raise
            setting = error.field.upper()  # a model metric whose model this server does not name
            raise InvalidRequest("metrics", f"{error.field.removesuffix('_model')} is not available on this server "
                                 f"(BART_OPT_{setting} is not set)") from None
        built = build_metrics(metrics, rouge)
        metric_record = metrics.record(built)
        common = {"id": uuid.uuid4().hex, "request_hash": request_hash, "dataset": body.dataset.describe(),
                  "columns": body.columns(), "limit": body.limit, "idempotency_key": idempotency_key}
        if body.predictions is not None:
            record = run_record(system="external", model=body.predictions.name, rouge=rouge, metrics=metric_record)
            return NewJob(**common, model=body.predictions.name, generation=None, system="external",
                          rouge_settings=record.pop("rouge_settings"), record=_record_rest(record))
        generation = self.engine.request_spec(body.generation)
        fingerprint = self.engine.fingerprint
        executor = self.runner.executor()
        record = run_record(system="bart", model=self.engine.name,
                            fingerprint=None if fingerprint is None else str(fingerprint),
                            generation=generation.to_dict(), engine=executor.engine_record(), rouge=rouge,
                            processor_info=executor.processor(), metrics=metric_record)
        return NewJob(**common, model=self.engine.name, fingerprint=record["fingerprint"],
                      generation=generation.to_dict(), baselines=tuple(dict.fromkeys(body.baselines)),
                      engine=record["engine"], rouge_settings=record["rouge_settings"], record=_record_rest(record))

    def engine_record(self) -> dict | None:
        """This replica's engine as jobs record it (None before the model is loaded): what ``/ready`` shows."""
        return self.runner.executor().engine_record() if self.engine.summarizer is not None else None

    def _open(self, body: EvaluateRequest) -> tuple[RecordStream, FileWatch | None]:
        """The body's records as a stream, and for a file the watch on it, begun before it is opened
        (nothing is opened for a refused path)."""
        spec, columns = body.dataset, body.columns()
        options = {"text_column": columns["text"], "summary_column": columns["summary"],
                   "id_column": columns["id"], "limit": body.limit}
        if spec.source == "file":
            path = resolve_data_file(self.settings.data_dir, spec.file)
            watch = FileWatch(path, spec.file)
            records = iter_records(file=path, name=spec.file, max_line_bytes=self.settings.max_line_bytes, **options)
            return records, watch
        if spec.source == "records":
            return iter_records(records=spec.records, **options), None
        return iter_records(hub=spec.hub, config=spec.config, split=spec.split, **options), None

    @contextmanager
    def _dataset_errors(self, body: EvaluateRequest) -> Iterator[str]:
        """Map what opening and copying the dataset raises to 4xx/5xx answers that name the source."""
        spec = body.dataset
        where = f"dataset.{spec.source}"
        try:
            yield where
        except (StoreError, ApiError, LoadCancelled):
            raise
        except PathRefused as error:
            raise ApiError(422, "path_not_allowed", f"{where}: {error}", field=where) from error
        except MissingColumnError as error:
            raise ApiError(422, "missing_column", str(error), field=f"{error.role}_column") from error
        except FileNotFoundError as error:
            if not isinstance(error, DataFileMissing) and error.errno is not None:
                raise ApiError(422, "dataset_unreadable", f"{where}: {unreadable(spec.file or '', error)}",
                               field=where) from None  # deleted since it was looked up: the OS names the path
            raise ApiError(422, "dataset_not_found", f"{where}: {error}", field=where) from error
        except HubUnavailable as error:
            logger.warning("could not load hub dataset %r: %s", spec.hub, error)
            raise ApiError(502, "dataset_unavailable", f"{where}: {_hub_problem(spec.hub, error)}",
                           field=where) from None
        except DataFileUnreadable as error:
            raise ApiError(422, "dataset_unreadable", f"{where}: {error}", field=where) from error
        except OSError as error:
            logger.warning("could not read dataset file %r: %s", spec.file, error)
            raise ApiError(422, "dataset_unreadable", f"{where}: {unreadable(spec.file or '', error)}",
                           field=where) from None
        except FileChanged as error:
            raise ApiError(422, "dataset_changed", f"{where}: {error}; the job was not created: submit it again once "
                           "the file is complete", field=where) from error
        except TooLarge as error:
            raise ApiError(422, "invalid_dataset", f"{where}: {error} (BART_OPT_MAX_LINE_BYTES)",
                           field=where) from error
        except ValueError as error:
            raise ApiError(422, "invalid_dataset", f"{where}: {error}", field=where) from error
        except LoadAbandoned as error:
            logger.error("%s", error)
            raise ApiError(503, "jobs_store_unavailable", "the submission could not be stored in time; retry",
                           headers=_RETRY_AFTER) from error

    def get(self, job_id: str) -> dict:
        """The job's detail view (with per-batch memory); 404 when unknown."""
        with self._store_errors():
            return self.view(self._job(job_id), detail=True)

    def list(self, status: str | None = None, limit: int = 100, before: str | None = None,
             after: str | None = None) -> dict:
        """A page of jobs, newest first, optionally only one status, with the links to the pages
        around it (see `app.jobs.listing`); 422 for a cursor that is not one."""
        self._check_available()
        if status is not None and status not in STATUSES:
            raise ApiError(422, "invalid_request", f"status: must be one of {', '.join(STATUSES)}", field="status")
        before_cursor, after_cursor = Cursor.parse("before", before), Cursor.parse("after", after)
        with self._store_errors():
            found = self.store.list(status, limit + 1, before_cursor and before_cursor.key,
                                    after_cursor and after_cursor.key)
        jobs, older, newer = page(found, limit, before_cursor, after_cursor)
        return {"jobs": [self.view(job) for job in jobs],
                "links": {"next": link(limit, status, "before", older), "prev": link(limit, status, "after", newer)}}

    def cancel(self, job_id: str) -> dict:
        """Cancel a queued or running job (its stored predictions stay); 409 when it already ended.

        A job running in another process stops there when its next write or lease renewal is refused.
        """
        with self._store_errors():
            job = self._job(job_id)
            if job.active and self.store.cancel(job_id):
                self.runner.cancel(job_id)
                self._changed.set()
                logger.info("job %s cancelled", job_id)
                job = self._job(job_id)
            if job.status != "cancelled":
                raise ApiError(409, "job_finished", f"job {job_id} already {job.status}; there is nothing to cancel")
            return self.view(job, detail=True)

    def prediction_lines(self, job_id: str, errors: str = "include") -> Iterator[str]:
        """The job's predictions so far as JSON lines, in record order; 404 when unknown.

        `errors`: ``include`` (every row), ``only`` (failed examples, with their reasons), ``exclude``.
        """
        if errors not in ERROR_FILTERS:
            raise ApiError(422, "invalid_request", f"errors: must be one of {', '.join(ERROR_FILTERS)}",
                           field="errors")
        with self._store_errors():
            self._job(job_id)
        return self.store.prediction_lines(job_id, errors)

    def prediction_rows(self, job_id: str) -> list[dict]:
        """The job's prediction rows stored so far, in record order; 404 when unknown."""
        return [json.loads(line) for line in self.prediction_lines(job_id)]

    def example(self, job_id: str, example_id: str) -> dict:
        """One example: its text and reference, and its prediction row (None until it is done); 404 when unknown."""
        with self._store_errors():
            self._job(job_id)
            record, row = self.store.example(job_id, example_id)
        if record is None:
            raise ApiError(404, "example_not_found", f"job {job_id} has no example {example_id!r}")
        return {"id": record.id, "text": record.text, "reference": record.reference, "prediction": row}

    # ---- helpers -----------------------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """The job `job_id` as stored; 404 when unknown (or still loading), 503 while the store is down."""
        with self._store_errors():
            return self._job(job_id)

    def _job(self, job_id: str) -> Job:
        self._check_available()
        job = self.store.get(job_id)
        if job is None or job.status == "loading":
            raise ApiError(404, "job_not_found", f"no evaluation job {shown(job_id)}")
        return job

    def _replay(self, job: Job, key: str, request_hash: str) -> dict:
        if job.request_hash != request_hash:
            raise ApiError(409, "idempotency_key_reused",
                           f"Idempotency-Key {key!r} was already used for a different request (job {job.id})",
                           field="Idempotency-Key")
        if job.status == "loading":
            raise ApiError(409, "idempotency_key_in_progress",
                           f"a request with Idempotency-Key {key!r} is still loading its dataset; retry shortly",
                           field="Idempotency-Key", headers={"Retry-After": "1"})
        return self.view(job)

    def view(self, job: Job, *, detail: bool = False) -> dict:
        """The API view of `job` (`JobView.of`) as a dict; `detail` adds the per-batch memory list."""
        return JobView.of(job, batches=self.store.batches(job.id) if detail else None).model_dump()


def _record_rest(record: dict) -> dict:
    """What a job keeps of its run record beside its own columns: versions, processor, start, signature, metrics."""
    return {key: record[key] for key in ("versions", "processor", "started_at", "signature", "metrics")}


def _hub_problem(hub: str, error: HubUnavailable) -> str:
    """What went wrong loading a hub dataset, in words a client may see (the details are logged)."""
    cause = error.__cause__
    if type(cause).__name__ in ("DatasetNotFoundError", "RepositoryNotFoundError"):
        return f"no dataset {hub!r} on the hub (or it is private)"
    if isinstance(cause, (ConnectionError, TimeoutError, OSError)) or "offline" in str(cause).lower():
        return f"could not reach the hub to load {hub!r}; retry later"
    if isinstance(cause, ValueError):
        return f"could not load {hub!r} with this config and split; check their names"
    return f"could not load {hub!r} from the hub; the server log has the reason"


def _hash(body: EvaluateRequest) -> str:
    """A digest of the request as the client meant it (for Idempotency-Key replays)."""
    canonical = json.dumps(body.model_dump(mode="json", exclude_unset=True), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()

