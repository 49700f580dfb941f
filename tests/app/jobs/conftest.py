"""Fixtures of the evaluation-job tests (defined in helpers.py, shared with the route tests)."""

from tests.app.jobs.helpers import backend, data_dir, faulty_store, make_jobs_app, write_jsonl  # noqa: F401
