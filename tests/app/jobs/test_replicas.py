"""Three `bart-opt serve` replicas on one PostgreSQL database, one of them SIGKILLed mid-job.

Jobs go to the replicas round-robin; whichever replica claims a job runs it, any replica
answers for it. After the kill, the survivors take the dead replica's job over once its lease
runs out: every example of every job is written exactly once, and each job's ROUGE equals an
uninterrupted single-process run of the same records.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack

import httpx
import torch

from app.jobs.store import JobStore
from bart_opt.bench.service_load import ServerProcess
from bart_opt.pipeline.data import load_records
from bart_opt.evaluate import run_evaluation
from bart_opt.pipeline.summarizer import Summarizer
from tests.app.helpers import samples
from tests.app.jobs.helpers import cnn_rows, poll_server, sql

N = 8  # records a job
GENERATIONS = [{"num_beams": 1, "max_length": 10, "min_length": 2}, {"num_beams": 2, "max_length": 10, "min_length": 2},
               {"num_beams": 1, "max_length": 6, "min_length": 2}]
SETTINGS = {"max_batch_size": 1, "torch_threads": 1, "job_lease_s": 2}


def test_three_replicas_one_killed_mid_job_every_example_once_and_the_same_rouge(demo_checkpoint, tmp_path,
                                                                                  postgres_cluster):
    url = postgres_cluster.create_database()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = data_dir / "cnn.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in cnn_rows(N, seed=60)))
    settings = {**SETTINGS, "db": url, "data_dir": data_dir}
    store = JobStore(url)
    with ExitStack() as stack:
        replicas = [stack.enter_context(ServerProcess(demo_checkpoint, tmp_path / f"{name}.log", settings))
                    for name in "abc"]
        jobs = []
        for k, generation in enumerate(GENERATIONS):  # round-robin
            answer = httpx.post(f"{replicas[k].url}/evaluate", json={"dataset": {"file": "cnn.jsonl"},
                                                                     "generation": generation}, timeout=60)
            assert answer.status_code == 202, answer.text
            jobs.append(answer.json()["id"])
        # The owner and the progress in one read of the table, then the kill at once: a job of N short records
        # can finish between an HTTP view and a later read (it did once, on two workers).
        deadline = time.monotonic() + 240
        while True:
            [(owner, done, status)] = sql(store, "SELECT owner, done, status FROM jobs WHERE id = :job", job=jobs[0])
            if status == "running" and owner is not None and done >= 2:
                break
            assert status in ("queued", "loading", "running") and time.monotonic() < deadline, (status, done)
            time.sleep(0.01)
        victim = next(r for r in replicas if r.process.pid == int(owner.split(":")[1]))
        os.kill(victim.process.pid, signal.SIGKILL)  # mid-job: no shutdown code runs
        victim.process.wait(30)
        survivors = [r for r in replicas if r is not victim]
        views = [poll_server(survivors[k % 2], job_id, lambda view: view["status"] not in ("queued", "running"))
                 for k, job_id in enumerate(jobs)]
        rows = [[json.loads(line) for line in httpx.get(f"{survivors[(k + 1) % 2].url}/evaluate/{job_id}/predictions",
                                                        timeout=30).text.split("\n")[:-1]] for k, job_id in enumerate(jobs)]
        compared = [httpx.get(f"{s.url}/compare", params={"jobs": f"{jobs[0]},{jobs[2]}"}, timeout=60)
                    for s in survivors]
        scraped = [samples(httpx.get(f"{s.url}/metrics", timeout=30).text) for s in survivors]
        shown = [httpx.get(f"{s.url}/", timeout=30).status_code for s in survivors]
    assert done < N, "the job was not killed in the middle"
    assert [view["status"] for view in views] == ["succeeded"] * 3, [view["error"] for view in views]
    assert views[0]["runs"] == 2  # taken over once the dead replica's lease ran out
    ids = [record.id for record in load_records(file=path)]
    assert [[row["id"] for row in job_rows] for job_rows in rows] == [ids] * 3  # every example once, in order
    for job_id in jobs:
        [(predictions, distinct)] = sql(store, "SELECT COUNT(*), COUNT(DISTINCT example_id) FROM predictions"
                                               " WHERE job_id = :job", job=job_id)
        [(batches,)] = sql(store, "SELECT COUNT(*) FROM batches WHERE job_id = :job", job=job_id)
        assert predictions == distinct == batches == N  # one model batch per example, none written twice
    store.close()
    assert compared[0].status_code == 200 and compared[0].json() == compared[1].json()  # any replica compares
    labels = [{labels for (name, labels) in gauges if name == "bart_opt_jobs_queued"} for gauges in scraped]
    assert len(labels[0] | labels[1]) == 2  # each replica reports under its own replica label
    assert shown == [200, 200]

    summarizer = Summarizer.from_pretrained(demo_checkpoint, device="cpu", max_batch_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the replicas ran
    try:
        for k, (view, generation) in enumerate(zip(views, GENERATIONS)):
            alone = run_evaluation(summarizer, load_records(file=path), tmp_path / f"cli-{k}", generation,
                                   progress=False)
            assert view["rouge"] == alone["rouge"], k
    finally:
        torch.set_num_threads(threads)


def test_a_job_cancelled_through_another_replica_stops_on_its_owner(demo_checkpoint, tmp_path, postgres_cluster):
    url = postgres_cluster.create_database()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "cnn.jsonl").write_text("".join(json.dumps(row) + "\n" for row in cnn_rows(60, seed=61)))
    settings = {**SETTINGS, "db": url, "data_dir": data_dir}
    store = JobStore(url)
    with ExitStack() as stack:
        owner, other = (stack.enter_context(ServerProcess(demo_checkpoint, tmp_path / f"{name}.log", settings))
                        for name in "ab")
        answer = httpx.post(f"{owner.url}/evaluate", json={"dataset": {"file": "cnn.jsonl"}, "generation": GENERATIONS[0]},
                            timeout=60)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        poll_server(owner, job_id, lambda view: view["status"] == "running" and view["progress"]["done"] >= 1)
        [(claimed_by,)] = sql(store, "SELECT owner FROM jobs WHERE id = :job", job=job_id)
        assert int(claimed_by.split(":")[1]) == owner.process.pid  # the submitting replica runs it (b is idle)
        cancelled = httpx.delete(f"{other.url}/evaluate/{job_id}", timeout=30)
        again = httpx.delete(f"{owner.url}/evaluate/{job_id}", timeout=30)
        seen = poll_server(owner, job_id, lambda view: view["status"] != "running")
        [(written_then,)] = sql(store, "SELECT COUNT(*) FROM predictions WHERE job_id = :job", job=job_id)
        time.sleep(3 * SETTINGS["job_lease_s"])  # past a lease renewal: the owner has had every chance to write
        [(written_later,)] = sql(store, "SELECT COUNT(*) FROM predictions WHERE job_id = :job", job=job_id)
        later = httpx.get(f"{owner.url}/evaluate/{job_id}", timeout=30).json()
        [(status, claimed_after)] = sql(store, "SELECT status, owner FROM jobs WHERE id = :job", job=job_id)
        log = owner.log()
    store.close()
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
    assert again.status_code == 200 and again.json()["status"] == "cancelled"  # idempotent on any replica
    assert seen["status"] == later["status"] == status == "cancelled"
    assert claimed_after is None
    assert written_later <= written_then + 1 < 60  # at most the batch already on the device lands... or nothing
    assert later["progress"]["done"] == written_later
    assert "stopped" in log  # the owner noticed and let go of the job
