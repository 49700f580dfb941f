"""Reading run folders for a report: what is a run, the per-example scores of every metric, the dataset's names."""

from __future__ import annotations

import shutil

import pytest

from bart_opt.report.runs import (
    describe_dataset, example_scores, load_report_run, load_report_runs, row_costs, score_names, score_points,
)


def test_a_model_run_reads_its_rows_record_and_metrics(report_runs):
    run = load_report_run(report_runs["model"])
    assert (run.name, run.system, len(run.rows)) == ("model", "bart", 5)
    assert run.metrics["baselines"]["lead-3"]["baseline"] is True
    assert load_report_run(report_runs["lead"]).system == "baseline"
    assert score_names([run]) == {"rouge": ["rouge1", "rouge2", "rougeL", "rougeLsum"]}
    lengths, values = score_points(run, "rouge", "rouge2")
    assert lengths == [len(row["prediction"].split()) for row in run.rows]
    assert values == [row["rouge"]["rouge2"]["fmeasure"] for row in run.rows]
    peaks, seconds = row_costs(run)
    assert len(peaks) == len(seconds) == 5 and all(peak > 0 for peak in peaks)
    assert row_costs(load_report_run(report_runs["lead"]))[0] == []  # a baseline's rows have no memory peak


def test_other_metrics_per_example_scores_are_read_nested_or_flat():
    row = {"rouge": {"rouge1": {"precision": 1.0, "recall": 2.0, "fmeasure": 1.5}},
           "scores": {"bertscore": {"f1": 0.9, "model": "not a number"}, "length.tokens": 12, "flag": True}}
    assert list(example_scores(row)) == [("rouge", "rouge1", 1.5), ("bertscore", "f1", 0.9),
                                         ("length", "tokens", 12.0)]
    assert list(example_scores({"rouge": None, "error": "failed"})) == []


def test_datasets_are_named_from_the_recorded_source(report_runs):
    run = load_report_run(report_runs["model"])
    assert describe_dataset(run) == {"type": "data", "name": "data.jsonl", "config": None, "split": None}
    for source, expected in (("abisee/cnn_dailymail 3.0.0 test", ("abisee/cnn_dailymail", "3.0.0", "test")),
                             ("xsum validation", ("xsum", None, "validation"))):
        run.record = {"dataset": {"source": source}}
        found = describe_dataset(run)
        assert (found["type"], found["config"], found["split"]) == expected


def test_folders_that_are_not_finished_runs_are_refused_by_name(report_runs, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'} is not a folder"):
        load_report_run(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="has no predictions.jsonl"):
        load_report_run(tmp_path)
    unfinished = shutil.copytree(report_runs["lead"], tmp_path / "unfinished")
    (unfinished / "metrics.json").unlink()
    with pytest.raises(ValueError, match=f"{unfinished} has no metrics.json: the run has not finished"):
        load_report_run(unfinished)
    twin = shutil.copytree(report_runs["lead"], tmp_path / "x" / "lead")
    with pytest.raises(ValueError, match="have the same folder name 'lead'"):
        load_report_runs([report_runs["lead"], twin])
