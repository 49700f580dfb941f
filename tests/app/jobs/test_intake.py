"""Intake of a file job (`app.jobs.intake`): a file rewritten while it is read refuses the job; a job records its file's fingerprint."""

from __future__ import annotations

import hashlib
import os

from tests.app.helpers import FAST, serving

RECORDS = 2500  # intake writes 1,000 records a transaction: the file is rewritten after the first


def rows(tag: str) -> list[dict]:
    return [{"id": str(i), "article": f"story number {i} about the town hall", "highlights": f"{tag} {i:05d}"}
            for i in range(RECORDS)]


def test_a_file_rewritten_during_intake_refuses_the_job_and_keeps_nothing(make_jobs_app, write_jsonl):
    path = write_jsonl("d.jsonl", rows("old"))
    size, before = path.stat().st_size, path.stat()
    app = make_jobs_app()
    with serving(app) as client:
        store = app.state.jobs.intake.store
        add_records, rewritten = store.add_records, []

        def rewrite_after_the_first_chunk(*args, **kwargs):
            stored = add_records(*args, **kwargs)
            if not rewritten:  # in place, at the same size, its mtime put back: only the ctime tells
                write_jsonl("d.jsonl", rows("new"))
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
                rewritten.append(path.stat().st_size)
            return stored

        store.add_records = rewrite_after_the_first_chunk
        refused = client.post("/evaluate", json={"dataset": {"file": "d.jsonl"}, "generation": FAST})
        listing = client.get("/evaluate").json()["jobs"]
    assert rewritten == [size] and path.stat().st_mtime_ns == before.st_mtime_ns
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "dataset_changed" and error["field"] == "dataset.file"
    assert error["message"].startswith("dataset.file: d.jsonl changed while it was being read")
    assert listing == []  # the job that mixed two versions of the file never became visible


def test_a_job_records_the_fingerprint_of_the_file_it_read(make_jobs_app, write_jsonl):
    path = write_jsonl("d.jsonl", rows("old")[:20])
    with serving(make_jobs_app()) as client:
        job = client.post("/evaluate", json={"dataset": {"file": "d.jsonl"}, "generation": FAST})
        shown = client.get(job.headers["location"]).json()["dataset"]
    assert job.status_code == 202 and job.json()["dataset"] == shown
    assert shown["file"] == "d.jsonl"
    assert shown["fingerprint"]["size"] == path.stat().st_size
    assert shown["fingerprint"]["sha256"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert shown["fingerprint"]["mtime"].endswith("+00:00")


def test_a_file_truncated_and_rewritten_mid_line_is_named_as_changed_not_as_bad_data(make_jobs_app, write_jsonl):
    path = write_jsonl("d.jsonl", rows("old"))
    app = make_jobs_app()
    with serving(app) as client:
        store = app.state.jobs.intake.store
        add_records = store.add_records

        def truncate_after_the_first_chunk(*args, **kwargs):
            stored = add_records(*args, **kwargs)
            with path.open("r+b") as handle:  # the reader is past line 1,000: what follows is now torn
                handle.seek(path.stat().st_size // 2 + 7)
                handle.truncate()
            return stored

        store.add_records = truncate_after_the_first_chunk
        refused = client.post("/evaluate", json={"dataset": {"file": "d.jsonl"}, "generation": FAST})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "dataset_changed", refused.text
