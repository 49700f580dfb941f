"""CompareService without HTTP: jobs in, the comparison or the right domain error (and its status) out."""

from __future__ import annotations

import pytest

from datetime import datetime, timezone

from app.compare import MAX_JOBS, CompareService
from app.domain_errors import NotFound, ServiceError
from app.errors import status_of
from app.jobs.job import Job
from bart_opt.compare import Run, compare_runs
from bart_opt.errors import InvalidRequest
from tests.bart_opt.test_compare import row, scores


class Jobs:
    """The two JobService methods CompareService uses, over fixed jobs and rows."""

    def __init__(self, jobs: dict[str, tuple[Job, list[dict]]]) -> None:
        self.jobs = jobs

    def job(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise NotFound("job_not_found", f"no evaluation job {job_id!r}")
        return self.jobs[job_id][0]

    def prediction_rows(self, job_id: str) -> list[dict]:
        return self.jobs[job_id][1]


CREATED = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()


def view(status: str = "succeeded", total: int = 8, generation: dict | None = None) -> Job:
    return Job(id="j", idempotency_key=None, request_hash="h", status=status, model="demo", fingerprint=None,
               dataset={"file": "a.jsonl"}, columns={}, record_limit=None, generation=generation or {"num_beams": 1},
               baselines=(), total=total, done=total, failed=0, work_s=0.0, active_s=0.0, runs=1, stalled_runs=0,
               done_at_start=0, peak_bytes=0, owner=None, lease_until=None, created_at=CREATED, started_at=None,
               finished_at=None, error=None, status_detail=None, metrics=None)  # fmt: skip


def info(generation: dict) -> dict:
    """What the comparison shows with a job made by `view`."""
    return {"system": "bart", "model": "demo", "dataset": {"file": "a.jsonl"}, "generation": generation, "rouge": None,
            "rouge_settings": None, "signature": None, "warnings": [], "created_at": "2026-01-01T00:00:00.000+00:00"}


@pytest.fixture
def service() -> CompareService:
    a = [row(f"d{i}", s) for i, s in enumerate(scores(8, seed=1))]
    b = [row(f"d{i}", s) for i, s in enumerate(scores(8, seed=2))]
    other = [row(f"x{i}", s) for i, s in enumerate(scores(8, seed=3))]
    return CompareService(Jobs({"a": (view(), a), "b": (view(generation={"num_beams": 4}), b),
                                "other": (view(), other), "busy": (view("running"), a[:3]),
                                "big": (view(total=9), a)}), max_examples=8, max_resamples=10_000)  # fmt: skip


def test_the_comparison_is_the_library_one_with_the_jobs_settings(service):
    result = service.compare(["a", "b"], seed=4, resamples=300)
    runs = [Run(job_id, service.jobs.prediction_rows(job_id), info(service.jobs.job(job_id).generation))
            for job_id in ("a", "b")]
    assert result == compare_runs(runs, seed=4, resamples=300)
    assert result["runs"][1]["info"]["generation"] == {"num_beams": 4}


@pytest.mark.parametrize(
    ("ids", "kwargs", "field", "message"),
    [
        (["a"], {}, "jobs", "give 2 to 8 job ids"),
        (["a"] + [f"j{i}" for i in range(MAX_JOBS)], {}, "jobs", "(got 9)"),
        (["a", "b", "a"], {}, "jobs", "'a' is given twice"),
        (["a", "b"], {"metric": "bleu"}, "metric", "must be one of rouge1"),
        (["a", "b"], {"resamples": 10_001}, "resamples", "from 1 to 10000"),
        (["a", "b"], {"top": 101}, "top", "must be an integer from 0 to 100"),
        (["a", "big"], {}, "jobs", "job big has 9 examples; the service compares jobs of up to 8"),
    ],
)  # fmt: skip
def test_caller_mistakes_name_their_field(service, ids, kwargs, field, message):
    with pytest.raises(InvalidRequest) as caught:
        service.compare(ids, **kwargs)
    assert caught.value.field == field and message in caught.value.message


@pytest.mark.parametrize(
    ("ids", "status", "code", "field", "message"),
    [
        (["a", "nope"], 404, "job_not_found", None, "no evaluation job 'nope'"),
        (["a", "busy"], 409, "job_not_finished", "jobs", "job busy is running"),
        (["a", "other"], 422, "datasets_differ", "jobs", "a and other are not on the same dataset"),
    ],
)  # fmt: skip
def test_jobs_that_cannot_be_compared(service, ids, status, code, field, message):
    with pytest.raises(ServiceError) as caught:
        service.compare(ids)
    error = caught.value
    assert (status_of(error), error.code, error.field) == (status, code, field)
    assert message in error.message
