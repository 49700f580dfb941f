"""A run folder's stored files are checked before any work, and never followed through a link (issue 40,
items 10 and 11): every bad row or file is one line naming the file, the line and the field, exit 2,
before the model loads; planted symbolic links are refused and their targets left alone."""

from __future__ import annotations

import json
import os
import random

import pytest

from bart_opt.cli import main
from bart_opt.demo import random_article
from bart_opt.evaluate.stored import StoredFileError, write_run_file
from bart_opt.runlock import RunLock

GEN = ["--max-length", "12", "--min-length", "3", "--num-beams", "1"]


@pytest.fixture(scope="module")
def made(demo_checkpoint, tmp_path_factory):
    """A finished two-record run folder and its data file."""
    work = tmp_path_factory.mktemp("stored")
    rng = random.Random(40)
    data = work / "cnn.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "article": random_article(rng, 3), "highlights": "A summary."})
                            + "\n" for i in range(3)))
    out = work / "run"
    assert main(["evaluate", "--model", demo_checkpoint, "--data", str(data), "--out", str(out), *GEN, "--limit", "2",
                 "--no-progress", "--no-memory-count"]) == 0
    return out, data


@pytest.fixture
def folder(made, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("run.json", "predictions.jsonl", "metrics.json"):
        (out / name).write_bytes((made[0] / name).read_bytes())
    return out


def rows_of(folder):
    return [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]


def spoil_row(folder, change):
    rows = rows_of(folder)
    rows[1]["id"] = "second"  # the rows' order is the batches'
    rows[0]["id"] = "r0"
    change(rows[1])
    (folder / "predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def fmeasure(value):
    return lambda row: row["rouge"]["rouge1"].update(fmeasure=value)


ROWS = [
    ("missing field", lambda row: row.pop("error"), "line 2: field 'error': Field required"),
    ("rouge high", lambda row: row.update(rouge="high"), "line 2: field 'rouge': Input should be a valid dictionary"),
    ("seconds null", lambda row: row.update(seconds=None), "line 2: field 'seconds': must be a number"),
    ("nan", fmeasure(float("nan")), "line 2: field 'rouge.rouge1.fmeasure': Input should be a finite number"),
    ("1e9", fmeasure(1e9), "line 2: field 'rouge.rouge1.fmeasure': Input should be less than or equal to 100"),
    ("duplicate id", lambda row: row.update(id="r0"), "line 2: id 'r0' is already on line 1"),
]


def refused(folder, data, capsys, model="no-such-model"):
    """Resume into `folder` with a model that cannot load: the refusal must come before it loads."""
    capsys.readouterr()
    assert main(["evaluate", "--model", model, "--data", str(data), "--out", str(folder), *GEN,
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "no-such-model" not in err, err
    return err


@pytest.mark.parametrize(("case", "change", "message"), ROWS, ids=[case for case, _, _ in ROWS])
def test_a_bad_stored_row_is_refused_before_the_model_loads(folder, made, capsys, case, change, message):
    spoil_row(folder, change)
    before = (folder / "metrics.json").read_bytes()
    err = refused(folder, made[1], capsys)
    assert f"{folder / 'predictions.jsonl'}: {message}" in err, err
    assert (folder / "metrics.json").read_bytes() == before


@pytest.mark.parametrize(("name", "content", "message"), [
    ("run.json", "", "run.json is empty"),
    ("run.json", "[1, 2]", "run.json holds a JSON list, not the object a run writes"),
    ("run.json", '{"model": 3}', "run.json: field 'model': Input should be a valid string"),
    ("metrics.json", '{"model": "m", "n_obs": 2, "n_scored": 2, "rouge": {"rouge1": {"low": 1}}}',
     "metrics.json: field 'rouge.rouge1.low': Input should be a valid dictionary"),
])
def test_a_bad_run_or_metrics_file_is_refused_naming_the_field(folder, made, capsys, name, content, message):
    (folder / name).write_text(content)
    assert message in refused(folder, made[1], capsys)


def test_compare_refuses_a_nan_score_naming_the_line(folder, made, capsys):
    spoil_row(folder, fmeasure(float("nan")))
    assert main(["compare", str(made[0]), str(folder)]) == 2
    assert "predictions.jsonl: line 2: field 'rouge.rouge1.fmeasure'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["run.lock", "metrics.json", "predictions.jsonl", "run.json"])
def test_a_planted_link_is_refused_and_its_target_left_alone(folder, made, capsys, tmp_path, name):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(target)
    err = refused(folder, made[1], capsys)
    assert f"{folder / name} is a symbolic link" in err
    assert target.read_text() == "keep me\n"


def test_a_link_planted_after_the_check_is_not_followed(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (tmp_path / "metrics.json").symlink_to(target)
    with pytest.raises(StoredFileError, match="is a symbolic link"):
        write_run_file(tmp_path / "metrics.json", "{}")
    (tmp_path / "run.lock").symlink_to(target)
    with pytest.raises(ValueError, match="run.lock is a symbolic link"), RunLock(tmp_path):
        pass
    assert target.read_text() == "keep me\n"


def test_an_out_that_is_a_file_or_a_dangling_link_is_one_sentence(made, capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert f"{afile} is a file, not a folder: give --out a folder" in refused(afile, made[1], capsys)
    dangling = tmp_path / "dangling"
    os.symlink(tmp_path / "nowhere", dangling)
    assert f"{dangling} is a symbolic link to" in refused(dangling, made[1], capsys)
    assert main(["score", str(made[0] / "predictions.jsonl"), "--out", str(afile)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
