"""Finished jobs logged to MLflow (BART_OPT_MLFLOW_URI), and a tracker that fails without failing the job."""

from __future__ import annotations

import socket
from pathlib import Path

from mlflow.tracking import MlflowClient

from bart_opt.pipeline.data import load_records
from bart_opt.evaluate import dataset_fingerprint
from tests.app.helpers import FAST, serving
from tests.app.jobs.helpers import cnn_rows, wait_for_job


def submit(client, name: str) -> str:
    response = client.post("/evaluate", json={"dataset": {"file": name}, "generation": FAST, "baselines": ["lead-3"]})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_a_finished_job_is_logged_to_mlflow_as_a_run(make_jobs_app, write_jsonl, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants it for a file: store
    store = (tmp_path / "mlruns").as_uri()
    path = write_jsonl("three.jsonl", cnn_rows(3, seed=38))
    with serving(make_jobs_app(mlflow_uri=store)) as client:
        job_id = submit(client, "three.jsonl")
        view = wait_for_job(client, job_id)
        lines = client.get(f"/evaluate/{job_id}/predictions").content
    assert view["status"] == "succeeded", view
    tracking = view["tracking"]
    assert tracking["tracking_uri"] == store and not any("MLflow" in warning for warning in view["warnings"])

    mlflow = MlflowClient(store)
    run = mlflow.get_run(tracking["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == f"job-{job_id}"
    assert run.info.experiment_id == tracking["experiment_id"] and run.data.tags["bart_opt.job"] == job_id
    params, metrics = run.data.params, run.data.metrics
    assert params["generation.num_beams"] == str(FAST["num_beams"]) and params["system"] == "bart"
    assert params["dataset.fingerprint"] == dataset_fingerprint(load_records(file=path))[0]
    assert params["dataset.source.file"] == "three.jsonl" and params["signature.rouge"] == view["signature"]
    assert metrics["rouge1"] == view["rouge"]["rouge1"]["mid"]["fmeasure"]
    assert metrics["lead-3.rouge1"] == view["baselines"][0]["rouge"]["rouge1"]["mid"]["fmeasure"]
    downloaded = mlflow.download_artifacts(run.info.run_id, "predictions.jsonl", str(tmp_path))
    assert Path(downloaded).read_bytes() == lines


def test_a_job_whose_tracking_fails_succeeds_and_says_why(make_jobs_app, write_jsonl):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    write_jsonl("two.jsonl", cnn_rows(2, seed=39))
    with serving(make_jobs_app(mlflow_uri=f"http://jobs:hunter2@127.0.0.1:{port}")) as client:
        view = wait_for_job(client, submit(client, "two.jsonl"))
    assert view["status"] == "succeeded" and view["rouge"] is not None
    (warning,) = [warning for warning in view["warnings"] if warning.startswith("MLflow")]
    assert warning.startswith(f"MLflow: the job was not logged to http://jobs:***@127.0.0.1:{port} (")
    assert "Connection refused" in view["tracking"]["error"]
    assert "hunter2" not in warning + view["tracking"]["error"]
