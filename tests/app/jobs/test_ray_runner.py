"""Evaluation jobs on a Ray cluster (``BART_OPT_RAY_ADDRESS``), on the session's local Ray instance."""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.jobs.store import JobStore
from app.device.engine import load_summarizer
from bart_opt.pipeline.data import load_records
from tests.app.helpers import FAST, serving
from tests.app.jobs.helpers import cnn_rows, evaluate_directly, prediction_rows, wait_for_job

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")

REPO = Path(__file__).resolve().parents[3]


def submit_file(client, name: str) -> str:
    response = client.post("/evaluate", json={"dataset": {"file": name}, "generation": FAST})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_a_job_on_ray_succeeds_with_the_rouge_of_a_local_job_and_leaves_the_device_to_summarize(
        ray_cluster, make_jobs_app, write_jsonl):
    write_jsonl("cnn.jsonl", cnn_rows(24, seed=20))
    with serving(make_jobs_app()) as client:
        local_id = submit_file(client, "cnn.jsonl")
        local = wait_for_job(client, local_id)
        local_rows = prediction_rows(client, local_id)
    calls: list[list[int]] = []  # model calls of the service's own summarizer
    app = make_jobs_app(load=functools.partial(load_summarizer, before_model_call=calls.append),
                        ray_address=ray_cluster, ray_replicas=2)
    with serving(app) as client:
        job_id = submit_file(client, "cnn.jsonl")
        view = wait_for_job(client, job_id, timeout=240)
        rows = prediction_rows(client, job_id)
        assert client.post("/summarize", json={"texts": ["A short text to summarize."]}).status_code == 200
    assert view["status"] == "succeeded" and view["rouge"] == local["rouge"] and view["rouge"] is not None
    assert [row["id"] for row in rows] == [row["id"] for row in local_rows]  # each once, in record order
    assert [row["prediction"] for row in rows] == [row["prediction"] for row in local_rows]
    assert sum(batch["size"] for batch in view["memory"]["batches"]) == 24 and view["status_detail"] is None
    assert view["memory"]["device"] == "cpu" and view["memory"]["peak_bytes"] > 0
    assert len(calls) == 1  # the /summarize request: no job batch ran on the service's device thread


def test_a_job_on_ray_resumes_after_a_restart_and_cancel_stops_one(ray_cluster, make_jobs_app, write_jsonl,
                                                                   direct, tmp_path):
    path = write_jsonl("big.jsonl", cnn_rows(200, seed=21))
    settings = {"ray_address": ray_cluster, "ray_replicas": 2}
    with serving(make_jobs_app(**settings)) as client:
        job_id = submit_file(client, "big.jsonl")
        running = wait_for_job(client, job_id, until=lambda view: view["progress"]["done"] > 0, timeout=240)
    assert running["status_detail"] == "running on 2 replicas of 1 CPU each"
    stopped = JobStore(tmp_path / "jobs.db").get(job_id)  # the service stopped: the job went back to the queue
    assert stopped.status == "queued" and 0 < stopped.done < 200 and stopped.status_detail is None

    with serving(make_jobs_app(**settings)) as client:
        view = wait_for_job(client, job_id, timeout=240)
        rows = prediction_rows(client, job_id)
        other = submit_file(client, "big.jsonl")
        wait_for_job(client, other, until=lambda view: view["progress"]["done"] > 0, timeout=240)
        cancelled = client.delete(f"/evaluate/{other}").json()
        time.sleep(3)
        later = client.get(f"/evaluate/{other}").json()
    assert view["status"] == "succeeded" and view["runs"] == 2
    assert [row["id"] for row in rows] == [f"doc-{i}" for i in range(200)]  # every example exactly once
    expected_rows, metrics = evaluate_directly(direct, load_records(file=path), FAST)
    assert {row["id"]: row["prediction"] for row in rows} == {k: v["prediction"] for k, v in expected_rows.items()}
    assert view["rouge"] == metrics["rouge"]
    assert cancelled["status"] == later["status"] == "cancelled"
    assert later["progress"]["done"] == cancelled["progress"]["done"] < 200  # nothing written after the cancel
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < 2:  # the cancelled job's replicas are freed
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


@ray.remote(num_cpus=2)
class Hog:
    """Holds both CPUs of the session's cluster."""

    def ready(self) -> bool:
        return True


def test_a_job_waits_for_room_visibly_then_fails_with_the_reason(ray_cluster, make_jobs_app, write_jsonl):
    write_jsonl("cnn.jsonl", cnn_rows(3, seed=22))
    hog = Hog.remote()
    try:
        assert ray.get(hog.ready.remote(), timeout=120)
        with serving(make_jobs_app(ray_address=ray_cluster, ray_start_timeout_s=4)) as client:
            job_id = submit_file(client, "cnn.jsonl")
            waiting = wait_for_job(client, job_id, until=lambda view: view["status_detail"] is not None)
            view = wait_for_job(client, job_id, timeout=60)
    finally:
        ray.kill(hog)
    assert waiting["status"] == "running"
    assert waiting["status_detail"] == "waiting for room on the Ray cluster: a replica needs 1 CPU, 0 CPU free"
    assert view["status"] == "failed" and view["status_detail"] is None and view["progress"]["done"] == 0
    assert view["error"] == ("no room on the Ray cluster for a replica (a replica needs 1 CPU, 0 CPU free) for 4 s; "
                             "try again when it is less busy; submit the job again")


# One job in a fresh process: whether it imported Ray, and how the job ended.
JOB_IN_A_FRESH_PROCESS = """
import json, sys, time
from fastapi.testclient import TestClient
from app.main import create_app
from app.settings import Settings

model, db, address = sys.argv[1:4]
settings = Settings(model=model, db=db, data_dir=".", ray_address=address or None, torch_threads=1)
with TestClient(create_app(settings)) as client:
    assert client.app.state.engine.worker.wait_ready(120)
    records = [{"id": str(i), "text": "The council met on Monday to vote.", "reference": "Council votes."}
               for i in range(3)]
    job = client.post("/evaluate", json={"dataset": {"records": records}, "generation": {"max_length": 8}}).json()
    deadline = time.monotonic() + 120
    while (view := client.get(f"/evaluate/{job['id']}").json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, view
        time.sleep(0.05)
print(json.dumps({"ray_imported": "ray" in sys.modules, "status": view["status"], "error": view["error"]}))
"""


def run_job_in_a_fresh_process(model: str, db: Path, address: str) -> dict:
    done = subprocess.run([sys.executable, "-c", JOB_IN_A_FRESH_PROCESS, model, str(db), address], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_ray_address_ray_is_not_imported_and_an_unreachable_cluster_fails_the_job(demo_checkpoint,
                                                                                           tmp_path):
    local = run_job_in_a_fresh_process(demo_checkpoint, tmp_path / "local.db", "")
    assert local == {"ray_imported": False, "status": "succeeded", "error": None}
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    unreachable = run_job_in_a_fresh_process(demo_checkpoint, tmp_path / "ray.db", f"127.0.0.1:{port}")
    assert unreachable == {
        "ray_imported": True, "status": "failed",
        "error": f"no Ray cluster answers at 127.0.0.1:{port} (connection refused); start one with `ray start "
                 "--head` or check the address; submit the job again",
    }
