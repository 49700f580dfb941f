"""Run folders are owned: one checkpoint per run (by content), one run at a time, no foreign rows.

Issue 25's findings 1 (a resumed run mixing two checkpoints under one path), 4 (a foreign
predictions.jsonl resumed as if it were the run's own) and 5 (two runs on one folder), through
the command line as a user meets them.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import textwrap

import pytest

from bart_opt.cli import main
from bart_opt.demo import build_checkpoint, random_article
from bart_opt.runlock import RunLock

GEN = ["--max-length", "12", "--min-length", "3", "--num-beams", "1"]


@pytest.fixture
def data(tmp_path):
    rng = random.Random(25)
    path = tmp_path / "cnn.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "article": random_article(rng, 3), "highlights": "A summary."})
                            + "\n" for i in range(6)))
    return path


def evaluate(model, data, out, *extra):
    generation = [] if model == "lead-3" else GEN
    return main(["evaluate", "--model", str(model), "--data", str(data), "--out", str(out), *generation, "--no-progress",
                 "--no-memory-count", "--device", "cpu", *extra])


def ids(out):
    return [json.loads(line)["id"] for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_a_run_is_not_resumed_on_a_folder_refilled_with_another_checkpoint(tmp_path, data, capsys):
    model = tmp_path / "model"
    build_checkpoint(model, seed=1)
    out = tmp_path / "run"
    assert evaluate(model, data, out, "--limit", "2") == 0
    first = json.loads((out / "run.json").read_text())["fingerprint"]
    assert first.startswith("sha256:")
    rows = (out / "predictions.jsonl").read_text()
    capsys.readouterr()

    shutil.rmtree(model)
    build_checkpoint(model, seed=2)  # same path, same config and tokenizer, other weights
    capsys.readouterr()
    assert evaluate(model, data, out) == 2
    err = capsys.readouterr().err
    assert f"made with checkpoint {first}" in err and "--overwrite" in err and "mix two checkpoints" in err
    second = err.split("the checkpoint loaded now is ")[1].split(" ")[0]
    assert second.startswith("sha256:") and second != first
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (out / "predictions.jsonl").read_text() == rows  # nothing written by the second checkpoint

    assert evaluate(model, data, out, "--overwrite") == 0
    assert json.loads((out / "run.json").read_text())["fingerprint"] == second
    assert sorted(ids(out)) == [f"r{i}" for i in range(6)]


def test_an_older_run_without_a_checkpoint_fingerprint_is_not_resumed(tmp_path, data, demo_checkpoint, capsys):
    out = tmp_path / "run"
    assert evaluate(demo_checkpoint, data, out, "--limit", "2") == 0
    run = json.loads((out / "run.json").read_text())
    del run["fingerprint"]
    (out / "run.json").write_text(json.dumps(run))
    capsys.readouterr()
    assert evaluate(demo_checkpoint, data, out) == 2
    err = capsys.readouterr().err
    assert "does not record its checkpoint's fingerprint" in err and "--overwrite" in err
    assert len(ids(out)) == 2


def test_predictions_without_a_run_file_are_refused_unless_overwrite(tmp_path, data, demo_checkpoint, capsys):
    out = tmp_path / "run"
    out.mkdir()
    planted = [{"id": f"r{i}", "prediction": "A summary.", "reference": "A summary."} for i in range(3)]
    (out / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in planted))
    assert evaluate(demo_checkpoint, data, out) == 2
    err = capsys.readouterr().err
    assert "holds predictions.jsonl but no run.json" in err and "--overwrite" in err
    assert not (out / "run.json").exists() and not (out / "metrics.json").exists()

    assert evaluate(demo_checkpoint, data, out, "--overwrite") == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == [f"r{i}" for i in range(6)]
    assert all(row["prediction"] != "A summary." for row in rows)  # the planted rows are gone
    assert json.loads((out / "metrics.json").read_text())["resumed_from"] == 0


def test_a_second_run_on_a_folder_in_use_fails_at_once_naming_the_first(tmp_path, data, demo_checkpoint, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from bart_opt.runlock import RunLock
        with RunLock(sys.argv[1]):
            print("locked", flush=True)
            time.sleep(60)
    """), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert evaluate(demo_checkpoint, data, out) == 2
        assert evaluate("lead-3", data, out) == 2  # a baseline run too
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(f"in use by another run (pid {holder.pid})" in line for line in err)
    assert not (out / "predictions.jsonl").exists() and not (out / "run.json").exists()
    assert evaluate(demo_checkpoint, data, out) == 0  # the holder is gone: the lock went with it
    assert len(ids(out)) == 6


def test_the_lock_is_held_for_the_whole_run(tmp_path, data, demo_checkpoint):
    from bart_opt.evaluate import run_evaluation
    from bart_opt.pipeline.data import load_records
    from bart_opt.runlock import RunFolderBusy
    from bart_opt.pipeline.summarizer import Summarizer

    out = tmp_path / "run"
    seen = []

    def during(rows):
        with pytest.raises(RunFolderBusy):
            with RunLock(out):
                pass
        seen.append(len(rows))

    summarizer = Summarizer.from_pretrained(demo_checkpoint, device="cpu", max_batch_size=2)
    run_evaluation(summarizer, load_records(file=data), out, {"max_length": 12, "min_length": 3}, progress=False,
                   on_batch=during)
    assert sum(seen) == 6
    with RunLock(out):  # released at the end
        pass
