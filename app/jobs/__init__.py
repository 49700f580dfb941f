"""Evaluation jobs: ``POST /evaluate`` on a dataset, persisted in SQLite or PostgreSQL, resumed after a restart.

- `app.jobs.service.JobService`: what the routes call (validation, the job view, the upkeep thread).
- `app.jobs.intake.Intake`: a submission's records streamed into the store in bounded transactions.
- `app.jobs.runner.JobRunner`: the thread that runs jobs a window and a batch at a time on the shared worker.
- `app.jobs.store.JobStore`: the tables, leases and counts; `app.jobs.database` the URL, pool and errors;
  `app.jobs.migrations` versions and migrates the schema (Alembic).
- `app.jobs.listing`: the cursors and links of ``GET /evaluate``'s pages.
- `app.jobs.paths.resolve_data_file`: ``{"file": ...}`` confined to ``BART_OPT_DATA_DIR``.
- `app.jobs.sources.check_hub_source`: ``{"hub": ...}`` confined to hub ids on ``BART_OPT_HUB_DATASETS``.
"""

from app.jobs.service import JobService

__all__ = ["JobService"]
