"""Experiment tracking in MLflow: the round trip through a real tracking server on loopback, a local file store,
the refusal of a server that cannot be reached, and an evaluation that outlives a tracker failing mid-run."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from bart_opt.cli import main
from bart_opt.demo import random_article
from bart_opt.tracking import folder_metrics, folder_params

REPO = Path(__file__).resolve().parents[2]
GEN = ["--max-length", "12", "--min-length", "3", "--num-beams", "2"]
SERVER_START_S = 240  # the server's imports alone take seconds on a busy 2-core machine


def free_port() -> int:
    """A loopback port nobody listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on loopback: runs in SQLite, artifacts uploaded through the server
    (``--artifacts-destination``: the client sends them over HTTP). Yields its URL; killed at teardown."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job workers beside the server
    log = (root / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                tail = (root / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"mlflow server did not start (exit {server.poll()}):\n{tail}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture
def cnn_file(tmp_path) -> Path:
    rng = random.Random(38)
    path = tmp_path / "cnn.jsonl"
    path.write_text("".join(
        json.dumps({"id": f"doc-{i}", "article": random_article(rng, 3), "highlights": random_article(rng, 1)}) + "\n"
        for i in range(4)
    ))
    return path


@pytest.fixture
def predictions_file(tmp_path) -> Path:
    rows = [{"id": "a", "prediction": "the cat sat on the mat", "reference": "the cat sat on a mat"},
            {"id": "b", "prediction": "rain fell all day", "reference": "snow fell all day long"},
            {"id": "c", "prediction": "the market rose", "reference": "markets rose sharply"}]
    path = tmp_path / "other.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def file_store(tmp_path, monkeypatch) -> str:
    """A local ``file:`` store (MLflow 3 wants MLFLOW_ALLOW_FILE_STORE=true for one)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return (tmp_path / "mlruns").as_uri()


def only_run(client: MlflowClient, out: Path):
    """The one run logged for run folder `out` (found by its tag, as a user would search for it)."""
    experiment = client.get_experiment_by_name("bart-opt")
    runs = client.search_runs([experiment.experiment_id], f"tags.`bart_opt.out` = '{out.resolve()}'")
    assert len(runs) == 1, runs
    return runs[0]


def test_evaluate_logs_its_run_to_a_real_tracking_server(mlflow_server, demo_checkpoint, cnn_file, tmp_path, capsys,
                                                        monkeypatch):
    """The Must show: params, metrics and artifacts read back from the server through MlflowClient."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "tracked"
    argv = ["evaluate", "--model", demo_checkpoint, "--data", str(cnn_file), "--out", str(out), *GEN, "--limit", "3",
            "--baselines", "lead-3", "--no-progress", "--no-memory-count", "--mlflow", mlflow_server]
    assert main(argv) == 0
    err = capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    record = json.loads((out / "run.json").read_text())

    client = MlflowClient(mlflow_server)
    run = only_run(client, out)
    assert f"run {run.info.run_id}" in err and f"logged run {run.info.run_id} to MLflow" in err
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    params, logged = run.data.params, run.data.metrics
    assert params["generation.num_beams"] == "2" and params["generation.max_length"] == "12"
    assert params["engine.dtype"] == record["engine"]["dtype"] and params["system"] == "bart"
    assert params["dataset.fingerprint"] == record["dataset"]["fingerprint"] and params["dataset.records"] == "3"
    assert params["signature.rouge"] == metrics["signature"]
    assert params["signature.lead-3"] == metrics["baselines"]["lead-3"]["signature"]
    for kind in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        interval = metrics["rouge"][kind]
        assert logged[kind] == interval["mid"]["fmeasure"]
        assert logged[f"{kind}_low"] == interval["low"]["fmeasure"]
        assert logged[f"{kind}_high"] == interval["high"]["fmeasure"]
        assert logged[f"lead-3.{kind}"] == metrics["baselines"]["lead-3"]["rouge"][kind]["mid"]["fmeasure"]
    assert logged["n_scored"] == metrics["n_scored"] == 3 and logged["tokens.output"] == metrics["tokens"]["output"]
    progress = client.get_metric_history(run.info.run_id, "progress.records")
    assert progress[-1].step == progress[-1].value == 3
    assert [point.step for point in progress] == sorted(point.step for point in progress)

    assert {item.path for item in client.list_artifacts(run.info.run_id)} == {"predictions.jsonl", "metrics.json",
                                                                            "run.json", "plots"}
    plots = {item.path for item in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/scores-rouge.png", "plots/scores-rouge.svg", "plots/batches.png"} <= plots, plots
    png = Path(client.download_artifacts(run.info.run_id, "plots/scores-rouge.png", str(tmp_path)))
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    downloaded = client.download_artifacts(run.info.run_id, "predictions.jsonl", str(tmp_path))
    assert Path(downloaded).read_bytes() == (out / "predictions.jsonl").read_bytes()


def test_score_logs_to_a_local_file_store_named_by_mlflow_tracking_uri(file_store, predictions_file, tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", file_store)
    out = tmp_path / "scored"
    assert main(["score", str(predictions_file), "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    client = MlflowClient(file_store)
    run = only_run(client, out)
    assert run.info.status == "FINISHED" and run.data.params["system"] == "external"
    assert run.data.metrics["rouge1"] == metrics["rouge"]["rouge1"]["mid"]["fmeasure"]
    assert run.data.tags["bart_opt.command"] == "score"
    downloaded = client.download_artifacts(run.info.run_id, "metrics.json", str(tmp_path))
    assert Path(downloaded).read_bytes() == (out / "metrics.json").read_bytes()


def test_the_flag_wins_over_mlflow_tracking_uri(file_store, predictions_file, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nobody there
    out = tmp_path / "scored"
    assert main(["score", str(predictions_file), "--out", str(out), "--mlflow", file_store]) == 0
    assert only_run(MlflowClient(file_store), out).info.status == "FINISHED"


def test_an_unreachable_server_is_refused_before_any_work(demo_checkpoint, cnn_file, tmp_path, capsys):
    """Exit 2 in one line naming the URI with its password hidden, at once (MLflow's own retries would take
    minutes), before the model loads or the run folder is made."""
    uri = f"http://ana:s3cret-pw@127.0.0.1:{free_port()}"
    out = tmp_path / "never"
    started = time.monotonic()
    assert main(["evaluate", "--model", demo_checkpoint, "--data", str(cnn_file), "--out", str(out), *GEN,
                 "--no-progress", "--mlflow", uri]) == 2
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert err.startswith("bart-opt evaluate: error: MLflow at http://ana:***@127.0.0.1:") and "cannot be used" in err
    assert "Connection refused" in err and "s3cret" not in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()
    assert elapsed < 60, f"{elapsed:.0f} s: the reachability check retried"


def test_tracking_without_mlflow_installed_says_how_to_install_it(predictions_file, tmp_path, capsys, monkeypatch):
    for module in ("mlflow.exceptions", "mlflow.tracking"):
        monkeypatch.setitem(sys.modules, module, None)  # an import of it fails as for a missing package
    assert main(["score", str(predictions_file), "--out", str(tmp_path / "o"), "--mlflow", "http://mlflow:5000"]) == 2
    assert capsys.readouterr().err == ("bart-opt score: error: tracking in MLflow (http://mlflow:5000) needs MLflow: "
                                       "pip install 'bart-opt[tracking]'\n")
    assert not (tmp_path / "o").exists()


def test_a_tracking_failure_mid_run_keeps_the_evaluation(file_store, demo_checkpoint, cnn_file, tmp_path, capsys,
                                                          monkeypatch):
    """The tracker breaks once the run has started: two warnings (progress, then the run), a complete run folder,
    and the MLflow run ended as FAILED."""
    def broken(self, *args, **kwargs):
        raise MlflowException("the tracking server went away")

    monkeypatch.setattr(MlflowClient, "log_batch", broken)
    out = tmp_path / "kept"
    assert main(["evaluate", "--model", demo_checkpoint, "--data", str(cnn_file), "--out", str(out), *GEN,
                 "--no-progress", "--no-memory-count", "--mlflow", file_store]) == 0
    err = capsys.readouterr().err
    assert err.count("progress is no longer logged (the tracking server went away); the evaluation goes on") == 1
    assert "could not be logged (the tracking server went away); " in err and "rerun the same command" in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_scored"] == 4 and len((out / "predictions.jsonl").read_text().splitlines()) == 4
    assert only_run(MlflowClient(file_store), out).info.status == "FAILED"


def test_params_and_metrics_take_every_metric_of_metrics_json():
    """Another metric beside ROUGE (``metrics.json[name][score]`` with low/mid/high) is logged as
    ``name.score`` with its bounds, and its signature as a param; settings and lists are not metrics."""
    interval = {"low": {"fmeasure": 0.1}, "mid": {"fmeasure": 0.2}, "high": {"fmeasure": 0.3}}
    metrics = {
        "signature": "rouge-sig", "n_scored": 7, "model_s_last_run": None, "flag": True,
        "rouge": {"rouge1": interval},
        "bertscore": {"f1": {"low": 0.8, "mid": 0.85, "high": 0.9}, "signature": "bertscore-sig"},
        "baselines": {"lead-3": {"rouge": {"rouge1": interval}, "signature": "lead-sig",
                                 "bertscore": {"f1": {"low": 0.7, "mid": 0.75, "high": 0.8}}}},
        "generation": {"num_beams": 4}, "tokens": {"input": 10}, "warnings": ["x"],
    }
    assert folder_metrics(metrics) == {
        "rouge1": 0.2, "rouge1_low": 0.1, "rouge1_high": 0.3, "lead-3.rouge1": 0.2, "lead-3.rouge1_low": 0.1,
        "lead-3.rouge1_high": 0.3, "lead-3.bertscore.f1": 0.75, "lead-3.bertscore.f1_low": 0.7,
        "lead-3.bertscore.f1_high": 0.8, "bertscore.f1": 0.85, "bertscore.f1_low": 0.8, "bertscore.f1_high": 0.9,
        "n_scored": 7.0, "tokens.input": 10.0,
    }
    run = {"system": "bart", "generation": {"num_beams": 4, "eos_token_id": [2], "early_stopping": True},
           "engine": {"quantize": None}, "signature": "rouge-sig", "history": [{"started_at": "earlier"}]}
    assert folder_params(run, metrics) == {
        "system": "bart", "generation.num_beams": "4", "generation.eos_token_id": "[2]",
        "generation.early_stopping": "true", "engine.quantize": "null", "signature.rouge": "rouge-sig",
        "signature.lead-3": "lead-sig", "signature.bertscore": "bertscore-sig",
    }


def test_help_never_imports_mlflow(tmp_path):
    code = ("import sys\nfrom bart_opt.cli import main\n"
            "for argv in (['evaluate', '--help'], ['score', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('mlflow' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False" and "--mlflow URI" in proc.stdout
