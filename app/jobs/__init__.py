"""Evaluation jobs: ``POST /evaluate`` on a dataset, persisted in SQLite or PostgreSQL, resumed after a restart.

- `app.jobs.service.JobService`: what the routes call (validation, the job view, the upkeep thread); it raises
  the domain's errors (`app.domain_errors`), which `app.errors` alone turns into answers.
- `app.jobs.ports`: what the jobs need of the engine (`JobEngine`) and the metrics (`Gauges`), as interfaces;
  `app.jobs.config.JobsConfig`: what they take from the settings, built by `app.settings.Settings.jobs_config`.
- `app.jobs.bodies`: the routes' request and response bodies (`EvaluateRequest`, `JobView`).
- `app.jobs.job.Job`: a job as the store returns it, a frozen value.
- `app.jobs.intake.Intake`: a submission's records streamed into the store in bounded transactions.
- `app.jobs.runner.JobRunner`: the thread that runs jobs through the evaluation core
  (`bart_opt.evaluate`), on the shared engine's worker or on a Ray cluster (`app.jobs.ray_source`).
- `app.jobs.storage`: the store as the core's source and sink.
- `app.jobs.store.JobStore`: the tables, leases and counts; `app.jobs.database` the URL, pool and errors;
  `app.jobs.migrations` versions and migrates the schema (Alembic).
- `app.jobs.listing`: the cursors and links of ``GET /evaluate``'s pages.
- `app.jobs.paths.resolve_data_file`: ``{"file": ...}`` confined to ``BART_OPT_DATA_DIR``.
- `app.jobs.sources.check_hub_source`: ``{"hub": ...}`` confined to hub ids on ``BART_OPT_HUB_DATASETS``.
"""

from app.jobs.service import JobService

__all__ = ["JobService"]
