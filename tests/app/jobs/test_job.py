"""`Job`: the frozen value the store returns, and the API view built from it."""

from __future__ import annotations

import dataclasses

import pytest

from app.jobs.job import Job
from app.jobs.bodies import JobView
from app.jobs.store import JobStore, NewJob
from bart_opt.pipeline.data import Record


@pytest.fixture
def job(tmp_path) -> Job:
    store = JobStore(tmp_path / "jobs.db")
    store.initialize()
    created, _ = store.create(NewJob(id="j1", request_hash="h", model="/srv/models/demo", dataset={"file": "a.jsonl"},
                                     columns={"text": "article", "summary": "highlights", "id": "id"}, limit=3,
                                     generation={"num_beams": 2}, baselines=("lead-3",)),
                              [Record("a", "one text", "a summary"), Record("b", "another", None)])
    store.close()
    return created


def test_the_store_returns_a_frozen_job_with_decoded_columns(job):
    assert isinstance(job, Job) and job.status == "queued" and job.active and job.pending == 2
    assert (job.total, job.done, job.record_limit, job.baselines) == (2, 0, 3, ("lead-3",))
    assert job.generation == {"num_beams": 2} and job.metrics is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.status = "running"  # type: ignore[misc]


def test_from_row_takes_the_fields_it_knows_and_needs_every_one(job):
    row = {**dataclasses.asdict(job), "a_column_added_later": 1, "baselines": ["lead-3"]}
    assert Job.from_row(row) == job
    del row["runs"]
    with pytest.raises(KeyError, match="runs"):
        Job.from_row(row)


def test_the_view_shows_a_server_folder_by_name_and_metrics_once_finished(job):
    view = JobView.of(job)
    assert view.model == "demo" and view.limit == 3 and view.progress.total == 2 and view.memory.batches is None
    assert view.baselines[0].model_dump() == {"name": "lead-3", "rouge": None, "n_scored": None, "scores": {}}
    done = dataclasses.replace(job, status="succeeded", done=2, work_s=3.0, active_s=4.0, metrics={
        "rouge": {"rouge1": {}}, "runtime_s": 2.5, "memory": {"device": "cpu", "peak_source": "none"},
        "baselines": {"lead-3": {"rouge": {"rouge1": {}}, "n_scored": 1}}})
    view = JobView.of(done, batches=[])
    assert view.rouge == {"rouge1": {}} and view.timing.runtime_s == 2.5 and view.timing.seconds_per_sample == 1.25
    assert view.progress.rate == 0.5 and view.progress.eta_s is None and view.memory.device == "cpu"
    assert view.baselines[0].n_scored == 1 and view.memory.batches == []
