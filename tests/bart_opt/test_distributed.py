"""Evaluation on a Ray cluster: placement, the replica, and ``bart-opt evaluate --ray`` on a local instance.

The cluster tests share the session's Ray instance (`ray_cluster`: 2 CPUs); each pipeline starts
its replicas afresh (a few seconds: a worker process, torch, the demo model).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from bart_opt import InvalidRequest
from bart_opt.cli import main
from bart_opt.evaluate.record import resume_differences
from bart_opt.pipeline.data import Record, load_records
from bart_opt.demo import random_article, random_sentence
from bart_opt.evaluate import compute_metrics, iter_predictions, run_evaluation
from bart_opt.engine.options import EngineOptions
from bart_opt.pipeline.summarizer import Summarizer

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")

from bart_opt.distributed import (  # noqa: E402 - only with Ray installed
    ClusterError,
    ClusterOptions,
    Placement,
    Replica,
    ReplicaPool,
    disconnect,
    place,
    records_per_call,
)

REPO = Path(__file__).resolve().parents[2]
GEN = {"max_length": 12, "min_length": 3}
GEN_ARGS = ["--max-length", "12", "--min-length", "3"]


def cnn_file(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(
        json.dumps({"id": f"doc-{i}", "article": random_article(rng, rng.randint(1, 7)),
                    "highlights": "\n".join(random_sentence(rng) for _ in range(2))}) + "\n"
        for i in range(n)
    ))
    return path


def predictions(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def expected(checkpoint: str, records: list[Record]) -> tuple[dict, dict]:
    """Rows by id and metrics as one process computes them."""
    summarizer = Summarizer.from_pretrained(checkpoint)
    spec = summarizer.generation_spec(GEN)
    rows = {row["id"]: row for batch in iter_predictions(summarizer, records, spec) for row in batch.rows}
    return rows, compute_metrics(rows, records, model=summarizer, generation=spec.to_dict())


# ---- without a cluster ---------------------------------------------------------------------


def test_placement_fills_the_cluster_and_refuses_what_cannot_fit():
    nodes = [{"CPU": 8, "GPU": 2}, {"CPU": 4, "GPU": 4}]
    assert place(ClusterOptions(gpus_per_replica=1), nodes) == Placement(replicas=6, cpus=1, gpus=1)
    assert place(ClusterOptions(gpus_per_replica=0.5, threads_per_replica=2), nodes).replicas == 4 + 2
    assert place(ClusterOptions(threads_per_replica=3), nodes) == Placement(replicas=2 + 1, cpus=3, gpus=0)
    assert place(ClusterOptions(replicas=2), [{"CPU": 2}]) == Placement(replicas=2, cpus=1, gpus=0)
    with pytest.raises(ClusterError, match=r"no node of the Ray cluster can hold a replica: each needs 1 CPU and "
                                           r"1 GPU \(1 node, 2 CPUs, 0 GPUs in all\)"):
        place(ClusterOptions(gpus_per_replica=1), [{"CPU": 2}])
    with pytest.raises(ClusterError, match="holds 2 replicas of 1 CPU, not 3"):
        place(ClusterOptions(replicas=3), [{"CPU": 2}])


def test_records_per_call_gives_every_replica_several_calls_and_caps_them():
    assert records_per_call(200, 2) == 25
    assert records_per_call(3, 8) == 1
    assert records_per_call(1_000_000, 4) == 256


@pytest.mark.parametrize(("field", "value"), [("replicas", 0), ("gpus_per_replica", -1.0),
                                              ("threads_per_replica", 0), ("stall_timeout_s", 0)])
def test_cluster_options_name_a_bad_value(field, value):
    with pytest.raises(InvalidRequest) as caught:
        ClusterOptions(**{field: value})
    assert caught.value.field == field


def test_a_replica_runs_the_pipeline_of_one_process_and_passes_refused_records_through(demo_checkpoint):
    rng = random.Random(4)
    records = [Record(f"r{i}", random_article(rng, rng.randint(1, 5)), None) for i in range(5)]
    summarizer = Summarizer.from_pretrained(demo_checkpoint)
    spec = summarizer.generation_spec(GEN)
    threads = torch.get_num_threads()
    try:
        replica = Replica(EngineOptions(model=demo_checkpoint, torch_threads=1), spec)
    finally:
        torch.set_num_threads(threads)
    # No reference and no refusal anywhere: all-null columns, which a NumPy batch would turn into NaN.
    batch = pa.table({"position": [10, 11, 12, 13, 14], "id": [r.id for r in records],
                      "text": [r.text for r in records], "reference": pa.nulls(5, pa.string()),
                      "error": pa.nulls(5, pa.string())})
    out = replica(batch).to_pylist()
    assert all(item["model_call"] and item["replica"] == replica.name for item in out)
    assert all(item["call_started_at"] == out[0]["call_started_at"] < item["finished_at"] for item in out)
    rows = {row["id"]: row for item in out for row in json.loads(item["rows"])}
    positions = {row["id"]: p for item in out for row, p in zip(json.loads(item["rows"]), json.loads(item["positions"]))}
    direct = {row["id"]: row for b in iter_predictions(summarizer, records, spec) for row in b.rows}
    assert {k: row["prediction"] for k, row in rows.items()} == {k: row["prediction"] for k, row in direct.items()}
    assert positions == {f"r{i}": 10 + i for i in range(5)} and all(row["error"] is None for row in rows.values())

    refused = batch.set_column(4, "error", pa.array([None, "too long", None, None, None], pa.string()))
    out = replica(refused).to_pylist()
    assert not out[0]["model_call"] and out[0]["peak_bytes"] == 0
    (row,) = json.loads(out[0]["rows"])
    assert (row["id"], row["error"], row["prediction"], json.loads(out[0]["positions"])) == ("r1", "too long", "", [11])
    assert sum(len(json.loads(item["rows"])) for item in out) == 5


def test_a_replica_loads_the_model_in_exact_or_fast_mode_when_asked(demo_checkpoint):
    spec = Summarizer.from_pretrained(demo_checkpoint).generation_spec(GEN)
    threads = torch.get_num_threads()
    try:
        replicas = [Replica(EngineOptions(model=demo_checkpoint, exact=exact, fast=fast, torch_threads=1), spec)
                    for exact, fast in ((False, False), (True, False), (False, True))]
    finally:
        torch.set_num_threads(threads)
    assert [(r.summarizer.model.exact, r.summarizer.model.fast) for r in replicas] == [(False, False), (True, False),
                                                                                      (False, True)]


def test_evaluate_without_ray_does_not_import_ray(demo_checkpoint, tmp_path):
    data = cnn_file(tmp_path / "cnn.jsonl", 2, seed=1)
    script = ("import sys; from bart_opt.cli import main; "
              "code = main(sys.argv[1:]); print('ray imported:', 'ray' in sys.modules); sys.exit(code)")
    done = subprocess.run(
        [sys.executable, "-c", script, "evaluate", "--model", demo_checkpoint, "--data", str(data), "--out",
         str(tmp_path / "run"), *GEN_ARGS, "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "ray imported: False"
    assert len(predictions(tmp_path / "run")) == 2


def test_an_unreachable_cluster_is_reported_at_once_in_one_line(demo_checkpoint, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = cnn_file(tmp_path / "cnn.jsonl", 2, seed=1)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bart_opt.cli", "evaluate", "--model", demo_checkpoint, "--data", str(data), "--out",
         str(tmp_path / "run"), "--ray", f"127.0.0.1:{port}", "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and time.monotonic() - started < 60
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bart-opt evaluate: error: no Ray cluster answers at 127.0.0.1:{port} (connection "
                           "refused); start one with `ray start --head` or check the address"), done.stderr
    assert "Traceback" not in done.stderr


def test_ray_options_need_ray_and_device_does_not_apply(demo_checkpoint, tmp_path, capsys):
    data = cnn_file(tmp_path / "cnn.jsonl", 2, seed=1)
    base = ["evaluate", "--model", demo_checkpoint, "--data", str(data), "--out", str(tmp_path / "run")]
    assert main([*base, "--replicas", "2"]) == 2
    assert "--replicas needs --ray" in capsys.readouterr().err
    assert main([*base, "--ray", "--device", "cpu"]) == 2
    assert "--device does not apply with --ray" in capsys.readouterr().err
    assert main([*base, "--ray", "--threads-per-replica", "0"]) == 2
    assert "error: --threads-per-replica: must be >= 1, got 0" in capsys.readouterr().err


# ---- on the session's local Ray instance ----------------------------------------------------


def test_cli_ray_run_equals_the_single_process_run(ray_cluster, demo_checkpoint, tmp_path, capsys):
    data = cnn_file(tmp_path / "cnn.jsonl", 30, seed=2)
    base = ["evaluate", "--model", demo_checkpoint, "--data", str(data), *GEN_ARGS, "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    single = json.loads(capsys.readouterr().out)
    assert main([*base, "--out", str(tmp_path / "ray"), "--ray", ray_cluster, "--replicas", "2",
                 "--threads-per-replica", "1"]) == 0
    captured = capsys.readouterr()
    on_ray = json.loads(captured.out)
    assert "running on 2 replicas of 1 CPU each" in captured.err
    one, ray_rows = predictions(tmp_path / "one"), predictions(tmp_path / "ray")
    assert len(ray_rows) == 30 and len({row["id"] for row in ray_rows}) == 30
    fields = ("prediction", "reference", "rouge", "error", "input_tokens", "output_tokens", "truncated")
    by_id = {row["id"]: row for row in ray_rows}
    assert all({k: row[k] for k in fields} == {k: by_id[row["id"]][k] for k in fields} for row in one)
    assert on_ray["rouge"] == single["rouge"] and on_ray["rouge"] is not None
    for key in ("model", "n_obs", "n_errors", "n_scored", "tokens", "generation", "metrics", "extractive", "length"):
        assert on_ray[key] == single[key], key
    assert all(row["scores"] == by_id[row["id"]]["scores"] for row in one)  # the sources reach the core on Ray too
    assert on_ray["memory"]["device"] == "cpu" and on_ray["memory"]["peak_bytes"] > 0
    run_files = [json.loads((tmp_path / name / "run.json").read_text()) for name in ("one", "ray")]
    same = ("model", "fingerprint", "generation", "engine", "rouge_settings", "dataset")
    assert [{key: run[key] for key in same} for run in run_files[1:]] == [{key: run_files[0][key] for key in same}]
    assert resume_differences(*run_files)[0] == [] and resume_differences(*run_files[::-1])[0] == []  # either resumes
    assert run_files[1]["processor"] == {"ray": "cpu"}  # each node's own; the driver's is the single run's


def test_a_replica_killed_mid_run_is_replaced_and_every_example_is_written_once(ray_cluster, demo_checkpoint,
                                                                                 tmp_path):
    records = load_records(file=cnn_file(tmp_path / "cnn.jsonl", 48, seed=3))
    pool = ReplicaPool(EngineOptions(model=demo_checkpoint), ClusterOptions(address=ray_cluster, replicas=2))
    replicas: list[int] = []  # the pid of the replica of each finished batch, in arrival order
    killed: list[int] = []

    class Killing:
        """The pool, killing the replica that finished the first batch while it runs its next one."""

        def __getattr__(self, name):
            return getattr(pool, name)

        def run(self, source, spec, control, rouge=None):
            for batch in pool.run(source, spec, control, rouge):
                replicas.append(int(batch.replica.rsplit(":", 1)[1]))
                if not killed:
                    os.kill(replicas[0], signal.SIGKILL)
                    killed.append(replicas[0])
                yield batch

    metrics = run_evaluation(Killing(), records, tmp_path / "run", GEN, progress=False)
    rows = predictions(tmp_path / "run")
    assert len(replicas) > 1 and set(replicas[1:]) - set(killed)  # the run went on after the kill ...
    assert len(set(replicas) - set(killed)) == 2  # ... on the other replica and on the one that replaced it
    assert sorted(row["id"] for row in rows) == sorted(record.id for record in records)  # each exactly once
    direct_rows, direct_metrics = expected(demo_checkpoint, records)
    assert {row["id"]: row["prediction"] for row in rows} == {k: v["prediction"] for k, v in direct_rows.items()}
    assert metrics["rouge"] == direct_metrics["rouge"] and metrics["n_obs"] == 48


def test_a_killed_driver_resumes_with_every_example_once_and_the_same_metrics(ray_cluster, demo_checkpoint,
                                                                              tmp_path):
    data = cnn_file(tmp_path / "cnn.jsonl", 64, seed=4)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "bart_opt.cli", "evaluate", "--model", demo_checkpoint, "--data", str(data),
               "--out", str(out), *GEN_ARGS, "--no-progress", "--ray", ray_cluster, "--replicas", "2"]
    driver = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not ((out / "predictions.jsonl").exists() and (out / "predictions.jsonl").read_text()):
            assert driver.poll() is None and time.monotonic() < deadline, driver.stderr.read() if driver.poll() else ""
            time.sleep(0.02)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.wait(60)
    done_before = len(predictions(out))
    assert 0 < done_before < 64 and not (out / "metrics.json").exists()
    rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert rerun.returncode == 0, rerun.stderr
    metrics = json.loads(rerun.stdout)
    rows = predictions(out)
    assert sorted(row["id"] for row in rows) == sorted(f"doc-{i}" for i in range(64))  # each exactly once
    assert metrics["resumed_from"] == done_before
    direct_rows, direct_metrics = expected(demo_checkpoint, load_records(file=data))
    assert {row["id"]: row["prediction"] for row in rows} == {k: v["prediction"] for k, v in direct_rows.items()}
    assert metrics["rouge"] == direct_metrics["rouge"]


def test_replicas_the_cluster_cannot_hold_are_refused_before_anything_starts(ray_cluster, demo_checkpoint,
                                                                            tmp_path, capsys):
    data = cnn_file(tmp_path / "cnn.jsonl", 3, seed=5)
    base = ["evaluate", "--model", demo_checkpoint, "--data", str(data), "--out", str(tmp_path / "run"),
            "--ray", ray_cluster, "--no-progress"]
    assert main([*base, "--gpus-per-replica", "1"]) == 2
    assert ("no node of the Ray cluster can hold a replica: each needs 1 CPU and 1 GPU (1 node, 2 CPUs, 0 GPUs in "
            "all)") in capsys.readouterr().err
    assert main([*base, "--replicas", "3"]) == 2
    assert "the Ray cluster holds 2 replicas of 1 CPU, not 3" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def test_disconnect_waits_for_a_hung_ray_shutdown_at_most_its_bound(ray_cluster, monkeypatch):
    release = threading.Event()
    calls: list[str] = []

    def hung_shutdown():
        calls.append("hung")
        release.wait()

    monkeypatch.setattr(ray, "shutdown", hung_shutdown)  # the session's instance stays up
    started = time.monotonic()
    try:
        assert disconnect(timeout_s=0.5) is False
    finally:
        release.set()
    assert 0.5 <= time.monotonic() - started < 5 and calls == ["hung"]
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("done"))
    assert disconnect(timeout_s=5) is True and calls == ["hung", "done"]


def hung_ray(bound_s: float) -> str:
    """The start of a script in which Ray's shutdown hangs for good, whoever calls it (`disconnect`,
    or Ray's own exit handler), and `disconnect` waits `bound_s` for it."""
    return ("import threading, ray._private.worker as worker, bart_opt.distributed as d\n"
            f"worker.disconnect = lambda *args, **kwargs: threading.Event().wait(); d.SHUTDOWN_TIMEOUT_S = {bound_s}\n")


def test_the_command_exits_with_its_status_when_ray_never_shuts_down(ray_cluster, demo_checkpoint, tmp_path):
    data = cnn_file(tmp_path / "cnn.jsonl", 4, seed=6)
    out = tmp_path / "run"
    script = hung_ray(2.0) + "from bart_opt.cli import entry; entry()\n"
    done = subprocess.run(
        [sys.executable, "-c", script, "evaluate", "--model", demo_checkpoint, "--data", str(data), "--out", str(out),
         *GEN_ARGS, "--no-progress", "--ray", ray_cluster, "--replicas", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False)  # without the bound: forever
    assert done.returncode == 0, done.stderr
    assert "bart-opt: Ray did not shut down within 2 s; exiting without it" in done.stderr.splitlines()
    assert json.loads(done.stdout)["n_obs"] == 4  # the output, flushed before the exit
    assert len(predictions(out)) == 4 and (out / "metrics.json").exists()


@pytest.mark.parametrize(("ending", "status"), [("raise RuntimeError('boom')", 1), ("raise SystemExit(15)", 15),
                                                ("raise KeyboardInterrupt", 130)])
def test_a_command_that_joined_ray_exits_with_its_status_however_it_ends(ray_cluster, tmp_path, ending, status):
    # Ray's shutdown hangs; `main` joins the cluster, then ends by an exception (a crash; Ray's
    # SIGTERM handler raises SystemExit(15)) instead of returning a status.
    script = (hung_ray(1.0) + "import bart_opt.cli as cli\n"
              "def main():\n"
              f"    d.connect(d.ClusterOptions(address={ray_cluster!r}))\n"
              f"    {ending}\n"
              "cli.main = main\n"
              "cli.entry()\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)  # without the bound: forever
    assert done.returncode == status, done.stderr
    assert done.stderr.splitlines()[-1] == "bart-opt: Ray did not shut down within 1 s; exiting without it"
    assert ("RuntimeError: boom" in done.stderr) == (status == 1)  # a crash keeps its traceback


def test_engine_options_that_exclude_each_other_are_refused_on_the_driver_and_on_a_replica(tmp_path):
    from bart_opt.engine.options import OptionConflict

    with pytest.raises(OptionConflict, match="quantize and device exclude each other: int8 runs on a CPU only"):
        ReplicaPool(EngineOptions(model="m", quantize="int8"), ClusterOptions(gpus_per_replica=1))  # before Ray starts
    with pytest.raises(OptionConflict, match="exact and static exclude each other"):
        ReplicaPool(EngineOptions(model="m", exact=True, static=True), ClusterOptions())
    with pytest.raises(OptionConflict, match="exact and fast exclude each other"):  # a replica, before its load
        Replica(EngineOptions(model=str(tmp_path / "no-such-checkpoint"), exact=True, fast=True), spec=None)
