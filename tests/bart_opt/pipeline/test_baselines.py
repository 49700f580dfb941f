"""Baselines: lead-3 against hand-computed cases, its metrics, and its run folder."""

from __future__ import annotations

import json

import pytest

from bart_opt.pipeline.baselines import UnknownBaselineError, baseline_summary, check_baselines, is_baseline, lead_3
from bart_opt.pipeline.data import Record
from bart_opt.evaluate import RUN_FILE, baseline_rows, dataset_fingerprint, run_baseline_evaluation, score_baselines
from bart_opt.pipeline.rouge import RougeScorer

ARTICLE = (
    "BREAKING NEWS\n\n"
    "Mr. Smith went to Washington on Monday. He met Dr. Jones near the U.S. Capitol, aides said. "
    "The meeting lasted an hour.\nNothing was agreed."
)


def test_lead_3_by_hand_keeps_abbreviations_and_splits_lines():
    # The headline line is a sentence of its own; "Mr.", "Dr." and "U.S." end no sentence.
    assert lead_3(ARTICLE) == (
        "BREAKING NEWS\n"
        "Mr. Smith went to Washington on Monday.\n"
        "He met Dr. Jones near the U.S. Capitol, aides said."
    )
    assert lead_3(ARTICLE.removeprefix("BREAKING NEWS\n\n")) == (
        "Mr. Smith went to Washington on Monday.\n"
        "He met Dr. Jones near the U.S. Capitol, aides said.\n"
        "The meeting lasted an hour."
    )


def test_lead_3_of_short_and_empty_texts():
    assert lead_3("One sentence only.   Two.") == "One sentence only.\nTwo."
    assert lead_3("no full stop at all") == "no full stop at all"
    assert lead_3("") == "" and lead_3(" \n\n ") == ""


def test_names_are_checked():
    assert is_baseline("lead-3") and not is_baseline("facebook/bart-large-cnn")
    assert check_baselines(["lead-3", "lead-3"]) == ("lead-3",)
    assert baseline_summary("lead-3", ARTICLE) == lead_3(ARTICLE)
    with pytest.raises(UnknownBaselineError, match=r"unknown baseline 'lead-4'; available: lead-3") as error:
        check_baselines(["lead-3", "lead-4"])
    assert error.value.name == "lead-4" and error.value.available == ["lead-3"]
    with pytest.raises(UnknownBaselineError):
        baseline_summary("random", ARTICLE)


RECORDS = [
    Record("a", ARTICLE, "Mr. Smith met Dr. Jones in Washington.\nNothing was agreed."),
    Record("b", "The river rose. Roads closed. Schools shut. Shops stayed open.", "Roads and schools closed."),
    Record("c", "A text with no reference. It is not scored.", None),
]


def test_score_baselines_is_the_scorers_aggregate_of_lead_3():
    scorer = RougeScorer(bootstrap_samples=200)
    metrics = score_baselines(["lead-3"], RECORDS, scorer)["lead-3"]
    by_hand = [scorer.score(lead_3(r.text), r.reference) for r in RECORDS if r.reference is not None]
    assert metrics["rouge"] == scorer.aggregate(by_hand)
    assert (metrics["model"], metrics["baseline"], metrics["n_obs"], metrics["n_scored"]) == ("lead-3", True, 3, 2)
    # "Roads closed." is in lead-3 of b; unigram recall of the reference "roads and schools closed" is 3/4.
    assert by_hand[1]["rouge1"]["recall"] == pytest.approx(75.0)


def test_score_baselines_with_no_reference_has_no_rouge():
    metrics = score_baselines(["lead-3"], RECORDS[2:])["lead-3"]
    assert metrics["rouge"] is None and metrics["n_scored"] == 0


def test_run_baseline_evaluation_writes_a_run_folder_and_refuses_another_run(tmp_path):
    scorer = RougeScorer(bootstrap_samples=200)
    metrics = run_baseline_evaluation("lead-3", RECORDS, tmp_path, scorer, source="by-hand")
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert [row["prediction"] for row in rows] == [lead_3(r.text) for r in RECORDS]
    assert [row["rouge"] for row in rows] == [row["rouge"] for row in baseline_rows("lead-3", RECORDS, scorer)]
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    fingerprint, count, _ = dataset_fingerprint(RECORDS)
    run = json.loads((tmp_path / RUN_FILE).read_text())
    assert {key: run[key] for key in ("system", "model", "generation", "baseline", "engine", "dataset")} == {
        "system": "baseline", "model": "lead-3", "generation": None, "baseline": True, "engine": None,
        "dataset": {"source": "by-hand", "records": count, "fingerprint": fingerprint},
    }
    assert run["rouge_settings"]["bootstrap_samples"] == 200 and "system:baseline|model:lead-3" in run["signature"]
    again = run_baseline_evaluation("lead-3", RECORDS, tmp_path, scorer)
    assert again["rouge"] == metrics["rouge"]
    assert len((tmp_path / "predictions.jsonl").read_text().splitlines()) == 3
    other = tmp_path / "model-run"
    other.mkdir()
    (other / RUN_FILE).write_text(json.dumps({"model": "some-checkpoint", "generation": {}}))
    with pytest.raises(ValueError, match="holds a run made with other settings"):
        run_baseline_evaluation("lead-3", RECORDS, other, scorer)
    # Another dataset in the same folder is refused, as for a model, unless asked to start over.
    with pytest.raises(ValueError, match="holds a run on another dataset"):
        run_baseline_evaluation("lead-3", RECORDS[1:], tmp_path, scorer)
    fresh = run_baseline_evaluation("lead-3", RECORDS[1:], tmp_path, scorer, overwrite=True)
    assert fresh["n_obs"] == 2 and len((tmp_path / "predictions.jsonl").read_text().splitlines()) == 2
