"""Evaluation jobs: ``POST /evaluate`` on a dataset, persisted in SQLite, resumed after a restart.

- `app.jobs.service.JobService`: what the routes call (validation, the job view).
- `app.jobs.runner.JobRunner`: the thread that runs jobs one batch at a time on the shared worker.
- `app.jobs.store.JobStore`: the SQLite tables (jobs, records, predictions, batches).
- `app.jobs.paths.resolve_data_file`: ``{"file": ...}`` confined to ``BART_OPT_DATA_DIR``.
"""

from app.jobs.service import JobService

__all__ = ["JobService"]
