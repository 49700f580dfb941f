"""`JobService`: what the ``/evaluate`` routes call. Validation, the store, the runner, the job view.

Submitting checks everything it can before answering, so a bad request is a 4xx and never a
failed job: the generation options (as ``/summarize`` checks them), the dataset path (inside
``BART_OPT_DATA_DIR``, see `app.jobs.paths`), and the records themselves, which are loaded,
checked (columns, ids, texts) and copied into the store. The job then waits for the runner.

Its methods block (SQLite, file and dataset reads); the routes call them off the event loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from app.errors import ApiError
from app.jobs.paths import DataFileMissing, PathRefused, resolve_data_file
from app.jobs.runner import JobRunner
from app.jobs.schemas import EvaluateRequest
from app.jobs.store import ACTIVE, STATUSES, JobStore, NewJob
from app.metrics import Metrics
from app.settings import Settings
from bart_opt.data import MissingColumnError, Record, load_records

if TYPE_CHECKING:
    from app.service import SummarizeService

logger = logging.getLogger("app.jobs")

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


class JobService:
    """Evaluation jobs on top of the summarize service's model and device worker."""

    def __init__(self, settings: Settings, metrics: Metrics, summarize: SummarizeService) -> None:
        self.settings = settings
        self.summarize = summarize
        self.store = JobStore(settings.db)
        self.runner = JobRunner(self.store, summarize)
        self._started = False
        self.unavailable: str | None = None  # why the job routes answer 503, when the database cannot be opened
        metrics.gauge("jobs_running", "Evaluation jobs running now.").set_function(lambda: self._count("running"))
        metrics.gauge("jobs_queued", "Evaluation jobs waiting to run.").set_function(lambda: self._count("queued"))
        metrics.gauge(
            "job_examples_per_second", "Examples per second of the running evaluation job (0 when none)."
        ).set_function(self.runner.rate)

    # ---- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Open the store, requeue the jobs a stopped or killed process left running, start the runner.

        A database that cannot be opened disables the job routes (503 with the reason) but not
        the rest of the service.
        """
        try:
            self.store.initialize()
            resumed = self.store.requeue_interrupted()
        except (sqlite3.Error, OSError) as error:
            self.unavailable = f"the jobs database {str(self.store.path)!r} (BART_OPT_DB) cannot be opened: {error}"
            logger.error("evaluation jobs disabled: %s", self.unavailable)
            return
        if resumed:
            logger.info("resuming %d interrupted job(s): %s", len(resumed), ", ".join(resumed))
        self.runner.start()
        self._started = True

    def stop(self) -> None:
        """Stop the runner after the batch on the device is written (blocks; run it off the event loop)."""
        self.runner.stop(timeout=self.settings.shutdown_timeout)

    def _count(self, status: str) -> int:
        return self.store.counts()[status] if self._started else 0

    def _check_available(self) -> None:
        if self.unavailable is not None:
            raise ApiError(503, "jobs_unavailable", self.unavailable)

    # ---- the routes' operations -------------------------------------------------------------

    def submit(self, body: EvaluateRequest, idempotency_key: str | None) -> tuple[dict, bool]:
        """Create a queued job; returns ``(view, True)``, or ``(existing view, False)`` for a known key.

        Raises ApiError: 503 before the model is loaded, 409 for a key used with another body,
        422 for bad generation options, a refused or missing file, a missing column, bad records.
        """
        self._check_available()
        self.summarize.check_ready()
        if idempotency_key is not None and not _IDEMPOTENCY_KEY.match(idempotency_key):
            raise ApiError(422, "invalid_request", "Idempotency-Key: must be 1 to 255 visible ASCII characters",
                           field="Idempotency-Key")
        request_hash = _hash(body)
        if idempotency_key is not None:
            existing = self.store.find_by_key(idempotency_key)
            if existing is not None:
                return self._replay(existing, idempotency_key, request_hash), False
        summarizer = self.summarize.summarizer
        generation = self.summarize.generation_spec(body.generation)
        records = self._records(body)
        new = NewJob(id=uuid.uuid4().hex, request_hash=request_hash, model=summarizer.name,
                     dataset=body.dataset.describe(), columns=body.columns(), limit=body.limit,
                     generation=generation.to_dict(), idempotency_key=idempotency_key)
        job, created = self.store.create(new, records)
        if not created:
            return self._replay(job, idempotency_key, request_hash), False
        logger.info("job %s queued: %d examples", job["id"], job["total"])
        self.runner.wake()
        return self.view(job), True

    def get(self, job_id: str) -> dict:
        """The job's detail view (with per-batch memory); 404 when unknown."""
        return self.view(self._job(job_id), detail=True)

    def list(self, status: str | None = None, limit: int = 100) -> dict:
        """Jobs, newest first, optionally only one status."""
        self._check_available()
        if status is not None and status not in STATUSES:
            raise ApiError(422, "invalid_request", f"status: must be one of {', '.join(STATUSES)}", field="status")
        return {"jobs": [self.view(job) for job in self.store.list(status, limit)]}

    def cancel(self, job_id: str) -> dict:
        """Cancel a queued or running job (its stored predictions stay); 409 when it already ended."""
        job = self._job(job_id)
        if job["status"] in ACTIVE and self.store.cancel(job_id):
            self.runner.cancel(job_id)
            logger.info("job %s cancelled", job_id)
            job = self._job(job_id)
        if job["status"] != "cancelled":
            raise ApiError(409, "job_finished", f"job {job_id} already {job['status']}; there is nothing to cancel")
        return self.view(job, detail=True)

    def prediction_lines(self, job_id: str) -> Iterator[str]:
        """The job's predictions so far as JSON lines, in record order; 404 when unknown."""
        self._job(job_id)
        return self.store.prediction_lines(job_id)

    def prediction_rows(self, job_id: str) -> list[dict]:
        """The job's prediction rows stored so far, in record order; 404 when unknown."""
        return [json.loads(line) for line in self.prediction_lines(job_id)]

    def example(self, job_id: str, example_id: str) -> dict:
        """One example: its text and reference, and its prediction row (None until it is done); 404 when unknown."""
        self._job(job_id)
        record, row = self.store.example(job_id, example_id)
        if record is None:
            raise ApiError(404, "example_not_found", f"job {job_id} has no example {example_id!r}")
        return {"id": record.id, "text": record.text, "reference": record.reference, "prediction": row}

    # ---- helpers -----------------------------------------------------------------------------

    def _job(self, job_id: str) -> dict:
        self._check_available()
        job = self.store.get(job_id)
        if job is None:
            raise ApiError(404, "job_not_found", f"no evaluation job {job_id!r}")
        return job

    def _replay(self, job: dict, key: str, request_hash: str) -> dict:
        if job["request_hash"] != request_hash:
            raise ApiError(409, "idempotency_key_reused",
                           f"Idempotency-Key {key!r} was already used for a different request (job {job['id']})",
                           field="Idempotency-Key")
        return self.view(job)

    def _records(self, body: EvaluateRequest) -> list[Record]:
        """Load and check the records the body names (nothing is opened for a refused path)."""
        spec, columns = body.dataset, body.columns()
        options = {"text_column": columns["text"], "summary_column": columns["summary"],
                   "id_column": columns["id"], "limit": body.limit}
        where = f"dataset.{spec.source}"
        try:
            if spec.source == "file":
                return load_records(file=resolve_data_file(self.settings.data_dir, spec.file), **options)
            if spec.source == "records":
                return load_records(records=spec.records, **options)
            return load_records(hub=spec.hub, config=spec.config, split=spec.split, **options)
        except PathRefused as error:
            raise ApiError(422, "path_not_allowed", f"{where}: {error}", field=where) from error
        except MissingColumnError as error:
            raise ApiError(422, "missing_column", str(error), field=f"{error.role}_column") from error
        except (DataFileMissing, FileNotFoundError) as error:
            raise ApiError(422, "dataset_not_found", f"{where}: {error}", field=where) from error
        except ValueError as error:
            raise ApiError(422, "invalid_dataset", f"{where}: {error}", field=where) from error
        except Exception as error:  # noqa: BLE001 - network and hub failures: tell the client, keep running
            if spec.source != "hub":
                raise
            logger.warning("could not load hub dataset %r: %s", spec.hub, error)
            message = f"could not load dataset {spec.hub!r}: {type(error).__name__}: {error}"
            raise ApiError(502, "dataset_unavailable", message, field=where) from error

    def view(self, job: dict, *, detail: bool = False) -> dict:
        """The API view of a store row (`detail` adds the per-batch memory list)."""
        metrics = job["metrics"] or {}
        done, total, active = job["done"], job["total"], job["active_s"]
        rate = done / active if done and active > 0 else None
        eta = (total - done) / rate if rate and job["status"] in ACTIVE else None
        final_memory = metrics.get("memory", {})
        memory = {"peak_bytes": job["peak_bytes"], "device": final_memory.get("device"),
                  "peak_source": final_memory.get("peak_source")}
        if detail:
            memory["batches"] = self.store.batches(job["id"])
        runtime = metrics.get("runtime_s", job["work_s"])
        return {
            "id": job["id"],
            "status": job["status"],
            "model": job["model"],
            "dataset": job["dataset"],
            "columns": job["columns"],
            "limit": job["record_limit"],
            "generation": job["generation"],
            "created_at": _iso(job["created_at"]),
            "started_at": _iso(job["started_at"]),
            "finished_at": _iso(job["finished_at"]),
            "progress": {"done": done, "failed": job["failed"], "total": total, "rate": rate, "eta_s": eta},
            "rouge": metrics.get("rouge"),
            "memory": memory,
            "timing": {
                "runtime_s": runtime,
                "seconds_per_sample": metrics.get("seconds_per_sample", runtime / done if done else None),
                "active_s": active,
                "queue_s": job["started_at"] - job["created_at"] if job["started_at"] is not None else None,
            },
            "tokens": metrics.get("tokens"),
            "padding": metrics.get("padding"),
            "error": job["error"],
            "runs": job["runs"],
            "links": {"self": f"/evaluate/{job['id']}", "predictions": f"/evaluate/{job['id']}/predictions"},
        }


def _hash(body: EvaluateRequest) -> str:
    """A digest of the request as the client meant it (for Idempotency-Key replays)."""
    canonical = json.dumps(body.model_dump(mode="json", exclude_unset=True), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="milliseconds")
