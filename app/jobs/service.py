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

Errors are the domain's (`app.domain_errors`; `app.errors` gives them their status codes): a
database failure is `Unavailable` saying what is wrong with it (read-only, full, busy,
unreachable) and never a path or host, with a retry delay; a damaged database (corrupt
pages: an error that says so, or the check the upkeep thread runs once the store is open,
`JobStore.verify`) is `DamagedStore`, without one, since retrying cannot help: from then on this process
refuses submissions and ``/ready`` says why (`JobService.damaged`) until it is restarted on a
repaired database. A file's OS error is `Refused`, naming the file as the client gave it.
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

from app.domain_errors import (Busy, Conflict, DamagedStore, NotFound, Refused, ServiceError, SourceUnavailable,
                               Unavailable)
from app.jobs.bodies import EvaluateRequest, JobView
from app.jobs.config import JobsConfig
from app.jobs.database import StoreError
from app.jobs.intake import BoundedPool, Intake, LoadAbandoned, LoadCancelled, PoolBusy
from app.jobs.job import STATUSES, Job
from app.jobs.listing import Cursor, link, page
from app.jobs.migrations import SchemaTooNew
from app.jobs.paths import DataFileMissing, DataFileUnreadable, PathRefused, resolve_data_file, shown, unreadable
from app.jobs.ports import Gauges, JobEngine
from app.jobs.runner import JobRunner
from app.jobs.sources import SourceRefused, check_hub_source, parse_allowlist
from app.jobs.store import ERROR_FILTERS, JobStore, NewJob, describe_store_error
from bart_opt.pipeline.data import HubUnavailable, MissingColumnError, RecordStream, iter_records
from bart_opt.errors import InvalidRequest
from bart_opt.evaluate.core import Executor
from bart_opt.evaluate.record import run_record
from bart_opt.engine.fingerprint import FileChanged, FileWatch
from bart_opt.pipeline.readers import TooLarge
from bart_opt.scoring.registry import build_metrics

logger = logging.getLogger("app.jobs")

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
_UPKEEP_S = 1.0
_STALE_EVERY = 30  # upkeep ticks between looks for submissions whose loader died
_RETRY_AFTER_S = 5


class JobService:
    """Evaluation jobs on the service's shared engine (`JobEngine`): its model, and its device worker or a
    Ray cluster; `config` is what the settings say (`app.settings.Settings.jobs_config`)."""

    def __init__(self, config: JobsConfig, metrics: Gauges, engine: JobEngine) -> None:
        self.config = config
        self.engine = engine
        self.store = JobStore(config.db, pool=config.pool)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._store_ready = threading.Event()
        self.runner = JobRunner(self.store, engine, self._executor, config.runner, self.owner, self._store_ready)
        self.intake = Intake(self.store, config.intake, self.owner, config.runner.lease_s)
        self._hub_allowed = parse_allowlist(config.hub_datasets)
        workers = config.dataset_loaders
        self._pools = {"hub": BoundedPool("bart-opt-hub", workers, workers),
                       "local": BoundedPool("bart-opt-load", workers, workers)}
        self.unavailable: str | None = "the jobs database is being opened"  # why job routes answer `Unavailable`
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
        """What runs the jobs' batches: the engine's (its device worker), or replicas on the Ray cluster of
        ``BART_OPT_RAY_ADDRESS`` (only then is Ray imported)."""
        if self.config.cluster is None:
            return self.engine.executor()
        from bart_opt.distributed import ReplicaPool

        return ReplicaPool(self.config.engine, self.config.cluster, name=self.config.engine.model)

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
        self.runner.stop(timeout=self.config.shutdown_timeout)
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
        every = min(_UPKEEP_S, self.config.runner.lease_s / 3)  # a lease is renewed well before it runs out
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
        """Raise `DamagedStore` while the database is known to be damaged (retrying cannot help)."""
        damage = self.damage()
        if damage is not None:
            raise DamagedStore(damage["code"], damage["message"])

    def _check_available(self) -> None:
        self._check_damaged()
        if self.unavailable is not None:
            raise Unavailable("jobs_unavailable", f"evaluation jobs are unavailable: {self.unavailable}",
                              retry_after=_RETRY_AFTER_S)

    @contextmanager
    def _store_errors(self) -> Iterator[None]:
        """A database failure during a route's work becomes `Unavailable` saying what is wrong (`DamagedStore`
        when the database is damaged)."""
        try:
            yield
        except StoreError as error:
            logger.warning("jobs database error: %s (%r)", error.reason, error.__cause__)
            if error.damaged:
                self._damaged(error)
                self._check_damaged()
            raise Unavailable("jobs_store_unavailable", f"{describe_store_error(error)}; retry later",
                              retry_after=_RETRY_AFTER_S) from error

    # ---- the routes' operations -------------------------------------------------------------

    async def submit(self, body: EvaluateRequest, idempotency_key: str | None) -> tuple[dict, bool]:
        """Create a queued job; returns ``(view, True)``, or ``(existing view, False)`` for a known key.

        Raises `Unavailable` before the model is loaded or while the store cannot be written,
        `Conflict` for a key used with another body (or still being loaded), `Refused` (or
        `InvalidRequest`) for bad options, a refused, missing or unreadable source, a missing
        column, bad records; `Busy` when the loading pool is full; `SourceUnavailable` when a hub
        dataset cannot be read.
        """
        self._check_available()
        self.engine.check_ready()
        if idempotency_key is not None and not _IDEMPOTENCY_KEY.match(idempotency_key):
            raise Refused("invalid_request", "Idempotency-Key: must be 1 to 255 visible ASCII characters",
                          field="Idempotency-Key")
        most = self.config.intake.max_records
        if body.limit is not None and body.limit > most:
            raise Refused("invalid_request", f"limit: at most {most:,} records per "
                          "job (BART_OPT_MAX_JOB_RECORDS)", field="limit")
        spec = body.dataset
        if spec.source == "hub":
            try:
                check_hub_source(spec.hub, spec.config, spec.split, self._hub_allowed)
            except SourceRefused as error:
                raise Refused("dataset_not_allowed", f"{error.field}: {error.message}", field=error.field) from None
        pool = self._pools["hub" if spec.source == "hub" else "local"]
        cancelled = threading.Event()
        try:
            return await pool.run(self._submit, body, idempotency_key, cancelled)
        except asyncio.CancelledError:  # the deadline passed or the client left: stop loading, keep nothing
            cancelled.set()
            raise
        except PoolBusy:
            kind = "hub datasets" if spec.source == "hub" else "datasets"
            raise Busy("loaders_busy", f"the server is loading as many {kind} as it may at once "
                       "(BART_OPT_DATASET_LOADERS); retry shortly", retry_after=_RETRY_AFTER_S) from None

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
        `InvalidRequest` naming ``generation.*``, ``rouge.*`` or ``metrics``."""
        options = body.rouge
        try:
            rouge = self.config.rouge_settings(options and options.tokenizer, options and options.lang)
        except InvalidRequest as error:
            raise error.within("rouge") from None
        try:
            metrics = self.config.metric_settings(rouge, body.metrics)
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
        return self.runner.executor().engine_record() if self.engine.state not in ("loading", "failed") else None

    def _open(self, body: EvaluateRequest) -> tuple[RecordStream, FileWatch | None]:
        """The body's records as a stream, and for a file the watch on it, begun before it is opened
        (nothing is opened for a refused path)."""
        spec, columns = body.dataset, body.columns()
        options = {"text_column": columns["text"], "summary_column": columns["summary"],
                   "id_column": columns["id"], "limit": body.limit}
        if spec.source == "file":
            path = resolve_data_file(self.config.data_dir, spec.file)
            watch = FileWatch(path, spec.file)
            records = iter_records(file=path, name=spec.file, max_line_bytes=self.config.max_line_bytes, **options)
            return records, watch
        if spec.source == "records":
            return iter_records(records=spec.records, **options), None
        return iter_records(hub=spec.hub, config=spec.config, split=spec.split, **options), None

    @contextmanager
    def _dataset_errors(self, body: EvaluateRequest) -> Iterator[str]:
        """Map what opening and copying the dataset raises to domain errors that name the source."""
        spec = body.dataset
        where = f"dataset.{spec.source}"
        try:
            yield where
        except (StoreError, ServiceError, LoadCancelled):
            raise
        except PathRefused as error:
            raise Refused("path_not_allowed", f"{where}: {error}", field=where) from error
        except MissingColumnError as error:
            raise Refused("missing_column", str(error), field=f"{error.role}_column") from error
        except FileNotFoundError as error:
            if not isinstance(error, DataFileMissing) and error.errno is not None:
                raise Refused("dataset_unreadable", f"{where}: {unreadable(spec.file or '', error)}",
                              field=where) from None  # deleted since it was looked up: the OS names the path
            raise Refused("dataset_not_found", f"{where}: {error}", field=where) from error
        except HubUnavailable as error:
            logger.warning("could not load hub dataset %r: %s", spec.hub, error)
            raise SourceUnavailable("dataset_unavailable", f"{where}: {_hub_problem(spec.hub, error)}",
                                    field=where) from None
        except DataFileUnreadable as error:
            raise Refused("dataset_unreadable", f"{where}: {error}", field=where) from error
        except OSError as error:
            logger.warning("could not read dataset file %r: %s", spec.file, error)
            raise Refused("dataset_unreadable", f"{where}: {unreadable(spec.file or '', error)}",
                          field=where) from None
        except FileChanged as error:
            raise Refused("dataset_changed", f"{where}: {error}; the job was not created: submit it again once "
                          "the file is complete", field=where) from error
        except TooLarge as error:
            raise Refused("invalid_dataset", f"{where}: {error} (BART_OPT_MAX_LINE_BYTES)", field=where) from error
        except ValueError as error:
            raise Refused("invalid_dataset", f"{where}: {error}", field=where) from error
        except LoadAbandoned as error:
            logger.error("%s", error)
            raise Unavailable("jobs_store_unavailable", "the submission could not be stored in time; retry",
                              retry_after=_RETRY_AFTER_S) from error

    def get(self, job_id: str) -> dict:
        """The job's detail view (with per-batch memory); `NotFound` when unknown."""
        with self._store_errors():
            return self.view(self._job(job_id), detail=True)

    def list(self, status: str | None = None, limit: int = 100, before: str | None = None,
             after: str | None = None) -> dict:
        """A page of jobs, newest first, optionally only one status, with the links to the pages
        around it (see `app.jobs.listing`); `Refused` for a cursor that is not one."""
        self._check_available()
        if status is not None and status not in STATUSES:
            raise Refused("invalid_request", f"status: must be one of {', '.join(STATUSES)}", field="status")
        before_cursor, after_cursor = Cursor.parse("before", before), Cursor.parse("after", after)
        with self._store_errors():
            found = self.store.list(status, limit + 1, before_cursor and before_cursor.key,
                                    after_cursor and after_cursor.key)
        jobs, older, newer = page(found, limit, before_cursor, after_cursor)
        return {"jobs": [self.view(job) for job in jobs],
                "links": {"next": link(limit, status, "before", older), "prev": link(limit, status, "after", newer)}}

    def cancel(self, job_id: str) -> dict:
        """Cancel a queued or running job (its stored predictions stay); `Conflict` when it already ended.

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
                raise Conflict("job_finished", f"job {job_id} already {job.status}; there is nothing to cancel")
            return self.view(job, detail=True)

    def prediction_lines(self, job_id: str, errors: str = "include") -> Iterator[str]:
        """The job's predictions so far as JSON lines, in record order; `NotFound` when unknown.

        `errors`: ``include`` (every row), ``only`` (failed examples, with their reasons), ``exclude``.
        """
        if errors not in ERROR_FILTERS:
            raise Refused("invalid_request", f"errors: must be one of {', '.join(ERROR_FILTERS)}", field="errors")
        with self._store_errors():
            self._job(job_id)
        return self.store.prediction_lines(job_id, errors)

    def prediction_rows(self, job_id: str) -> list[dict]:
        """The job's prediction rows stored so far, in record order; `NotFound` when unknown."""
        return [json.loads(line) for line in self.prediction_lines(job_id)]

    def example(self, job_id: str, example_id: str) -> dict:
        """One example: its text and reference, and its prediction row (None until it is done); `NotFound` when
        unknown."""
        with self._store_errors():
            self._job(job_id)
            record, row = self.store.example(job_id, example_id)
        if record is None:
            raise NotFound("example_not_found", f"job {job_id} has no example {example_id!r}")
        return {"id": record.id, "text": record.text, "reference": record.reference, "prediction": row}

    # ---- helpers -----------------------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """The job `job_id` as stored; `NotFound` when unknown (or still loading), `Unavailable` while the store
        is down."""
        with self._store_errors():
            return self._job(job_id)

    def _job(self, job_id: str) -> Job:
        self._check_available()
        job = self.store.get(job_id)
        if job is None or job.status == "loading":
            raise NotFound("job_not_found", f"no evaluation job {shown(job_id)}")
        return job

    def _replay(self, job: Job, key: str, request_hash: str) -> dict:
        if job.request_hash != request_hash:
            raise Conflict("idempotency_key_reused",
                           f"Idempotency-Key {key!r} was already used for a different request (job {job.id})",
                           field="Idempotency-Key")
        if job.status == "loading":
            raise Conflict("idempotency_key_in_progress",
                           f"a request with Idempotency-Key {key!r} is still loading its dataset; retry shortly",
                           field="Idempotency-Key", retry_after=1)
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

