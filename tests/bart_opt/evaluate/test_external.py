"""``bart-opt score``: another system's predictions (CSV, JSONL, Parquet; references beside them or in
another file, one or several) scored into a run folder that ``bart-opt compare`` reads beside a model's
run and lead-3's."""

from __future__ import annotations

import csv
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bart_opt.cli import main
from bart_opt.demo import random_article, random_sentence
from bart_opt.pipeline.rouge import RougeScorer

GEN = ["--max-length", "12", "--min-length", "3", "--num-beams", "1"]


@pytest.fixture
def data(tmp_path):
    rng = random.Random(36)
    rows = [{"id": f"r{i}", "article": random_article(rng, 4), "highlights": random_sentence(rng)} for i in range(5)]
    path = tmp_path / "cnn.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path, rows


def other_system(rows):
    """A hand-made system: each article's second sentence."""
    return [{"id": row["id"], "prediction": row["article"].split(". ")[1], "reference": row["highlights"]}
            for row in rows]


def write_csv(path, rows, columns):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows([{k: row[k] for k in columns} for row in rows])
    return path


def test_score_a_csv_then_compare_it_with_the_model_and_lead_3(demo_checkpoint, data, tmp_path, capsys):
    path, rows = data
    predictions = write_csv(tmp_path / "pegasus.csv", other_system(rows), ["id", "prediction", "reference"])
    assert main(["score", str(predictions), "--out", str(tmp_path / "pegasus")]) == 0
    scored = json.loads(capsys.readouterr().out)
    run = json.loads((tmp_path / "pegasus" / "run.json").read_text())
    assert run["system"] == "external" and run["model"] == "pegasus"
    assert run["file"]["name"] == "pegasus.csv" and run["file"]["fingerprint"].startswith("sha256:")
    assert "system:external|file:" + run["file"]["fingerprint"][7:19] in scored["signature"]
    scorer = RougeScorer()
    expected = [scorer.score(r["prediction"], r["reference"]) for r in other_system(rows)]
    assert scored["rouge"]["rouge1"]["mid"]["fmeasure"] == scorer.aggregate(expected)["rouge1"]["mid"]["fmeasure"]
    assert set(scored["rouge"]["rouge2"]) == {"low", "mid", "high"}

    assert main(["evaluate", "--model", demo_checkpoint, "--data", str(path), "--out", str(tmp_path / "bart"), *GEN,
                 "--no-progress", "--no-memory-count"]) == 0
    assert main(["evaluate", "--model", "lead-3", "--data", str(path), "--out", str(tmp_path / "lead")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "bart"), str(tmp_path / "lead"), str(tmp_path / "pegasus"), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert [run["name"] for run in compared["runs"]] == ["bart", "lead", "pegasus"] and compared["paired"] == 5
    assert compared["runs"][2]["rouge"]["rouge1"] == scored["rouge"]["rouge1"]["mid"]["fmeasure"]
    assert {"p_bootstrap", "p_randomization", "interval"} <= set(compared["comparisons"][1]["rouge"]["rouge1"])
    assert compared["runs"][2]["signature"] == scored["signature"]


def test_jsonl_parquet_and_references_in_another_file(data, tmp_path, capsys):
    _, rows = data
    system = other_system(rows)
    jsonl = tmp_path / "t5.jsonl"
    jsonl.write_text("".join(json.dumps({"id": r["id"], "summary": r["prediction"]}) + "\n" for r in system))
    refs = write_csv(tmp_path / "refs.csv", system, ["id", "reference"])
    assert main(["score", str(jsonl), "--out", str(tmp_path / "a"), "--prediction-column", "summary",
                 "--references", str(refs)]) == 0
    first = json.loads(capsys.readouterr().out)
    table = pa.table({"key": [r["id"] for r in system], "out": [r["prediction"] for r in system],
                      "gold": [r["reference"] for r in system]})
    pq.write_table(table, tmp_path / "t5.parquet")
    assert main(["score", str(tmp_path / "t5.parquet"), "--out", str(tmp_path / "b"), "--id-column", "key",
                 "--prediction-column", "out", "--reference-column", "gold"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["rouge"] == second["rouge"] and first["n_scored"] == 5
    assert json.loads((tmp_path / "a" / "run.json").read_text())["references_file"]["name"] == "refs.csv"


def test_several_references_per_example(tmp_path, capsys):
    rows = [{"id": "a", "prediction": "the cat sat on the mat", "reference": ["a dog ran", "the cat sat on a mat"]},
            {"id": "b", "prediction": "rain fell all day", "reference": ["rain fell", "snow fell all day"]}]
    path = tmp_path / "multi.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["score", str(path), "--out", str(tmp_path / "out")]) == 0
    metrics = json.loads(capsys.readouterr().out)
    scorer = RougeScorer()
    expected = scorer.aggregate([scorer.score_multi(r["prediction"], r["reference"]) for r in rows])
    assert metrics["rouge"] == expected
    assert metrics["signature"].startswith("nrefs:2|")
    stored = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert stored[0]["reference"] == rows[0]["reference"]


@pytest.mark.parametrize(("rows", "flags", "message"), [
    ([{"id": "a", "prediction": "x"}], [], "reference column 'reference' not found"),
    ([{"id": "a", "prediction": "x", "reference": "y"}, {"id": "a", "prediction": "x", "reference": "y"}], [],
     "duplicate id 'a'"),
    ([{"id": "a", "prediction": "x", "reference": ""}], [], "column 'reference' is empty"),
    ([{"id": "a", "prediction": 3, "reference": "y"}], [], "holds int"),
    ([{"id": "a", "prediction": "x", "reference": "y"}], ["--rouge-lang", "ru"], "--rouge-lang: "),
])
def test_bad_predictions_are_one_line_and_exit_2(tmp_path, capsys, rows, flags, message):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["score", str(path), "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bart-opt score: error:") and message in err and err.count("\n") == 1, err


def test_ids_the_two_files_do_not_share_are_refused(tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "prediction": "x"}) + "\n")
    (tmp_path / "r.jsonl").write_text(json.dumps({"id": "b", "reference": "y"}) + "\n")
    assert main(["score", str(tmp_path / "p.jsonl"), "--references", str(tmp_path / "r.jsonl"),
                 "--out", str(tmp_path / "out")]) == 2
    assert "1 predictions have no reference" in capsys.readouterr().err


def test_compare_refuses_runs_scored_with_other_rouge_settings(data, tmp_path, capsys):
    _, rows = data
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in other_system(rows)))
    assert main(["score", str(path), "--out", str(tmp_path / "a")]) == 0
    assert main(["score", str(path), "--out", str(tmp_path / "b"), "--rouge-tokenizer", "unicode"]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "other ROUGE settings (rouge.tokenizer: default in a, unicode in b)" in err
