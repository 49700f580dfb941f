"""Finished jobs logged to MLflow (``BART_OPT_MLFLOW_URI``), as ``bart-opt evaluate --mlflow`` logs a run folder.

`tracked(uri, store, job, record, metrics)` writes the job as a run folder in a temporary directory
(predictions.jsonl from the store, metrics.json, and run.json: the job's run record with its signature
and its dataset's fingerprint, `bart_opt.evaluate.runs.dataset_fingerprint`, computed as the CLI's) and
logs it through `bart_opt.tracking.MlflowRun`: the same params, metrics and artifacts. It returns the
metrics to finish the job with, with ``tracking``: where the run went, or why it did not; a failure is
also one of the job's ``warnings`` and a line in the server log, and never fails the job.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from app.jobs.job import Job
from app.jobs.store import JobStore
from bart_opt import __version__
from bart_opt.evaluate.runs import dataset_fingerprint
from bart_opt.evaluate.stored import METRICS_FILE, PREDICTIONS_FILE, RUN_FILE
from bart_opt.redaction import redacted
from bart_opt.tracking import MlflowRun, TrackingError

logger = logging.getLogger("app.jobs")


def tracked(uri: str, store: JobStore, job: Job, record: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` with ``tracking`` (``run_id``, ``experiment_id``, ``tracking_uri`` with its password
    hidden; or ``error``) once `job`, run record `record` (`app.jobs.runner.job_record`), is logged at `uri`."""
    shown = redacted(uri)
    tags = {"bart_opt.command": "job", "bart_opt.job": job.id, "bart_opt.version": __version__}
    try:
        run = MlflowRun.start(uri, name=f"job-{job.id}", tags=tags)
    except TrackingError as error:
        failed = str(error)
    else:
        failed = _logged(run, store, job, record, metrics)
    if failed is None:
        logger.info("job %s logged to MLflow at %s as run %s", job.id, shown, run.run_id)
        where = {"run_id": run.run_id, "experiment_id": run.experiment_id, "tracking_uri": shown}
        return {**metrics, "tracking": where}
    logger.warning("job %s was not logged to MLflow: %s", job.id, failed)
    warning = f"MLflow: the job was not logged to {shown} ({failed})"
    return {**metrics, "warnings": [*metrics.get("warnings", []), warning], "tracking": {"error": failed}}


def _logged(run: MlflowRun, store: JobStore, job: Job, record: dict[str, Any], metrics: dict[str, Any]) -> str | None:
    """Log the job as a run folder to `run`; None once logged, else why not."""
    with tempfile.TemporaryDirectory(prefix="bart-opt-job-") as folder:
        try:
            _write_folder(Path(folder), store, job, record, metrics)
        except Exception as error:  # noqa: BLE001 - reading the job back failed; the job itself is done
            logger.warning("job %s: could not be written out for MLflow", job.id, exc_info=True)
            run.end("FAILED")
            return f"the job could not be read back ({type(error).__name__})"
        return run.finish(folder)


def _write_folder(folder: Path, store: JobStore, job: Job, record: dict[str, Any], metrics: dict[str, Any]) -> None:
    """The job as a run folder: its prediction rows, its metrics, and its run record with its dataset."""
    with (folder / PREDICTIONS_FILE).open("w", encoding="utf-8") as f:
        f.writelines(store.prediction_lines(job.id))
    fingerprint, count, _ = dataset_fingerprint(store.iter_records(job.id))
    signature = metrics.get("signature") or (job.record or {}).get("signature")
    run = {**record, "signature": signature, "dataset": {"source": job.dataset, "records": count,
                                                         "fingerprint": fingerprint}}
    (folder / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
    (folder / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


__all__ = ["tracked"]
