"""A real server killed with SIGKILL in the middle of a job, started again: every example once, same ROUGE.

On SQLite and on PostgreSQL (the `backend` fixture): a committed batch survives the kill on both.
"""

from __future__ import annotations

import json

import httpx
import torch

from app.jobs.store import JobStore
from bart_opt.bench.service_load import ServerProcess
from bart_opt.pipeline.data import load_records
from bart_opt.evaluate import run_evaluation
from bart_opt.pipeline.summarizer import Summarizer
from tests.app.jobs.helpers import cnn_rows, poll_server, sql

# One input per model call makes the job long enough to kill halfway and its summaries
# independent of how the batches fall after the restart. The killed server's claim on the job
# holds for the lease, then the new server takes the job over.
SETTINGS = {"max_batch_size": 1, "torch_threads": 1, "job_lease_s": 2}
GENERATION = {"num_beams": 2, "max_length": 12, "min_length": 2}
N = 24


def test_sigkill_mid_job_then_restart_finishes_every_example_once_with_the_same_rouge(demo_checkpoint, tmp_path,
                                                                                      backend):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = data_dir / "cnn.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in cnn_rows(N, seed=20)))
    settings = {**SETTINGS, "db": backend.url, "data_dir": data_dir}
    body = {"dataset": {"file": "cnn.jsonl"}, "generation": GENERATION}
    key = {"Idempotency-Key": "crash-test"}

    with ServerProcess(demo_checkpoint, tmp_path / "first.log", settings) as server:
        submitted = httpx.post(f"{server.url}/evaluate", json=body, headers=key, timeout=30)
        assert submitted.status_code == 202, server.log()
        job_id = submitted.json()["id"]
        poll_server(server, job_id, lambda view: view["progress"]["done"] >= 4)
        server.process.kill()  # SIGKILL: no shutdown code runs
        server.process.wait(30)
    store = JobStore(backend.url)
    [(done_before,)] = sql(store, "SELECT done FROM jobs WHERE id = :job", job=job_id)
    assert 4 <= done_before < N, "the job was not killed in the middle"

    with ServerProcess(demo_checkpoint, tmp_path / "second.log", settings) as server:
        view = poll_server(server, job_id, lambda view: view["status"] not in ("queued", "running"))
        lines = httpx.get(f"{server.url}/evaluate/{job_id}/predictions", timeout=30).text.split("\n")[:-1]
        replay = httpx.post(f"{server.url}/evaluate", json=body, headers=key, timeout=30)
    assert view["status"] == "succeeded", view["error"]
    progress = view["progress"]
    assert view["runs"] == 2 and (progress["done"], progress["failed"], progress["total"]) == (N, 0, N)
    assert replay.status_code == 200 and replay.json()["id"] == job_id

    rows = [json.loads(line) for line in lines]
    records = load_records(file=path)
    assert [row["id"] for row in rows] == [record.id for record in records]  # each example exactly once
    per_run = dict(sql(store, "SELECT run, COUNT(*) FROM predictions WHERE job_id = :job GROUP BY run", job=job_id))
    store.close()
    assert per_run == {1: done_before, 2: N - done_before}  # nothing done before the kill was redone

    summarizer = Summarizer.from_pretrained(demo_checkpoint, device="cpu", max_batch_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(SETTINGS["torch_threads"])  # as the server ran; a tiny model is slower on more
    try:
        uninterrupted = run_evaluation(summarizer, records, tmp_path / "cli", GENERATION, progress=False)
    finally:
        torch.set_num_threads(threads)
    cli_lines = (tmp_path / "cli" / "predictions.jsonl").read_text().splitlines()
    cli_rows = {row["id"]: row for row in map(json.loads, cli_lines)}
    assert {row["id"]: row["prediction"] for row in rows} == {k: row["prediction"] for k, row in cli_rows.items()}
    assert view["rouge"] == uninterrupted["rouge"]
    assert view["tokens"] == uninterrupted["tokens"] and view["generation"] == uninterrupted["generation"]
