"""Metrics beyond ROUGE through the one evaluation core: each row's ``scores``, ``metrics.json[name][score]``
with ROUGE's bootstrap, the same metrics for lead-3, run.json's record and the refusal of a resume that
differs, and predictions scored without sources."""

from __future__ import annotations

import json
import random

import pytest

from bart_opt.pipeline.data import load_records
from bart_opt.demo import random_article, random_sentence
from bart_opt.evaluate import run_baseline_evaluation, run_evaluation, run_scoring
from bart_opt.evaluate.metrics import RowTotals
from bart_opt.evaluate.record import ResumeRefused
from bart_opt.pipeline.rouge import RougeScorer, RougeSettings
from bart_opt.scoring.base import Example, aggregate
from bart_opt.scoring.extractive import SOURCE_SCORES, ExtractiveMetric
from bart_opt.scoring.length import LengthMetric
from bart_opt.scoring.registry import MetricSettings
from bart_opt.pipeline.summarizer import Summarizer

GEN = {"max_length": 14, "min_length": 3}


@pytest.fixture(scope="module")
def summarizer(demo_checkpoint) -> Summarizer:
    return Summarizer.from_pretrained(demo_checkpoint, device="cpu", max_batch_size=3)


@pytest.fixture(scope="module")
def records():
    rng = random.Random(8)
    return load_records(records=[{"id": f"doc-{i}", "article": random_article(rng, rng.randint(2, 8)),
                                  "highlights": " ".join(random_sentence(rng) for _ in range(2))} for i in range(7)])


@pytest.fixture(scope="module")
def run(summarizer, records, tmp_path_factory):
    out = tmp_path_factory.mktemp("metrics")
    metrics = run_evaluation(summarizer, records, out, GEN, progress=False, baselines=["lead-3"])
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return out, metrics, {row["id"]: row for row in rows}


def test_each_row_holds_the_scores_of_every_metric_beyond_rouge(run, records):
    _, _, rows = run
    extractive, length = ExtractiveMetric(), LengthMetric()
    for record in records:
        row = rows[record.id]
        example = Example(row["prediction"], record.reference, record.text)  # the source is the record's text
        assert set(row["scores"]) == {"extractive", "length"}
        assert row["scores"]["extractive"] == extractive.score([example])[0]
        assert row["scores"]["length"] == length.score([example])[0]


def test_metrics_json_holds_each_metric_under_its_name_with_rouges_bootstrap(run, records):
    out, metrics, rows = run
    assert metrics == json.loads((out / "metrics.json").read_text())
    assert metrics["metrics"] == ["rouge", "extractive", "length"]
    in_order = [rows[record.id]["scores"] for record in records]
    for name in ("extractive", "length"):
        assert metrics[name] == aggregate([scores[name] for scores in in_order], bootstrap_samples=1000, seed=0)
    assert set(metrics["extractive"]["coverage"]) == {"low", "mid", "high"}
    assert set(metrics["rouge"]["rouge1"]) == {"low", "mid", "high"}  # ROUGE where it was
    assert metrics["metric_settings"]["signatures"]["extractive"]["fragments"] == "grusky2018-greedy"
    recorded = json.loads((out / "run.json").read_text())["metrics"]
    assert recorded == metrics["metric_settings"] and recorded["names"] == metrics["metrics"]


def test_lead_3_beside_the_model_gets_the_same_metrics(run, records):
    _, metrics, _ = run
    lead = metrics["baselines"]["lead-3"]
    assert lead["metrics"] == metrics["metrics"] and lead["n_scored"] == len(records)
    assert lead["extractive"]["coverage"]["mid"] == 1.0  # its first sentences are copied whole
    assert lead["extractive"]["novel_1"]["mid"] == 0.0
    alone = run_baseline_evaluation("lead-3", records, run[0].parent / "lead-alone", RougeScorer())
    assert alone["extractive"] == lead["extractive"] and alone["length"] == lead["length"]


def test_the_metrics_are_chosen_and_rouge_only_adds_nothing(summarizer, records, tmp_path):
    metrics = run_evaluation(summarizer, records[:3], tmp_path / "length", GEN, progress=False,
                             metrics=MetricSettings("length"))
    assert metrics["metrics"] == ["rouge", "length"] and "extractive" not in metrics
    only = run_evaluation(summarizer, records[:3], tmp_path / "rouge", GEN, progress=False,
                          metrics=MetricSettings("rouge"))
    rows = [json.loads(line) for line in (tmp_path / "rouge" / "predictions.jsonl").read_text().splitlines()]
    assert only["metrics"] == ["rouge"] and all("scores" not in row for row in rows)
    assert only["rouge"] == metrics["rouge"]


@pytest.mark.parametrize(("metrics", "field"), [
    (MetricSettings("length"), "metrics"),
    (MetricSettings(lang="de"), "metrics.extractive.lang"),
    (MetricSettings(tokenizer="script"), "metrics.extractive.tokenizer"),
])
def test_a_resume_with_other_metrics_is_refused_naming_the_field(summarizer, records, tmp_path, metrics, field):
    run_evaluation(summarizer, records[:2], tmp_path, GEN, progress=False)
    before = (tmp_path / "predictions.jsonl").read_text()
    with pytest.raises(ResumeRefused) as error:
        run_evaluation(summarizer, records[:3], tmp_path, GEN, progress=False, metrics=metrics)
    assert field in error.value.fields and "other settings" in str(error.value)
    assert (tmp_path / "predictions.jsonl").read_text() == before
    resumed = run_evaluation(summarizer, records[:3], tmp_path, GEN, progress=False)
    assert resumed["resumed_from"] == 2 and resumed["extractive"] is not None


def test_a_run_from_before_metrics_resumes_with_rouge_only(summarizer, records, tmp_path):
    run_evaluation(summarizer, records[:2], tmp_path, GEN, progress=False, metrics=MetricSettings("rouge"))
    record = json.loads((tmp_path / "run.json").read_text())
    del record["metrics"]  # as bart-opt wrote it before metrics beyond ROUGE
    (tmp_path / "run.json").write_text(json.dumps(record))
    with pytest.raises(ResumeRefused, match=r"metrics: rouge \(not recorded.*-> rouge,extractive,length"):
        run_evaluation(summarizer, records[:3], tmp_path, GEN, progress=False)
    resumed = run_evaluation(summarizer, records[:3], tmp_path, GEN, progress=False, metrics=MetricSettings("rouge"))
    assert resumed["resumed_from"] == 2 and resumed["metrics"] == ["rouge"]


def test_predictions_without_sources_score_what_is_defined_and_warn(tmp_path):
    rng = random.Random(2)
    rows = [{"id": f"p{i}", "prediction": random_sentence(rng), "reference": random_sentence(rng)} for i in range(4)]
    path = tmp_path / "system.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    metrics = run_scoring(path, tmp_path / "out")
    assert set(metrics["extractive"]) == {"repeated_trigrams"} and set(metrics["length"]) == {"tokens", "sentences"}
    (warning,) = [w for w in metrics["warnings"] if w.startswith("extractive:")]
    assert ", ".join(SOURCE_SCORES) in warning and "4 of 4 scored examples have no source text" in warning


def test_row_totals_leave_out_a_score_some_rows_lack_and_say_so():
    scorer = RougeSettings(bootstrap_samples=50).scorer()
    rouge = scorer.score("a b c", "a b c")
    rows = [{"id": str(k), "prediction": "a b c", "reference": "a b c", "rouge": rouge, "error": None, "seconds": 0.0,
             "scores": {"extractive": {"coverage": 1.0, "repeated_trigrams": 0.0} if k else {"repeated_trigrams": 0.5}}}
            for k in range(3)]
    record = {"names": ["rouge", "extractive"], "signatures": {}}
    metrics = RowTotals(scorer, record).added(rows).baseline_metrics("x")
    assert set(metrics["extractive"]) == {"repeated_trigrams"}
    assert metrics["extractive"]["repeated_trigrams"]["mid"] == 0.5 / 3
    assert any("coverage" in w and "1 of 3" in w for w in metrics["warnings"])


def test_a_metric_some_rows_lack_has_no_aggregate_and_a_warning():
    scorer = RougeSettings(bootstrap_samples=50).scorer()
    rouge = scorer.score("a b", "a b")
    rows = [{"id": str(k), "prediction": "a b", "reference": "a b", "rouge": rouge, "error": None, "seconds": 0.0,
             **({"scores": {"length": {"tokens": 2.0}}} if k else {})} for k in range(3)]
    metrics = RowTotals(scorer, {"names": ["rouge", "length"], "signatures": {}}).added(rows).baseline_metrics("x")
    assert metrics["length"] is None and metrics["rouge"] is not None
    assert any(w.startswith("length: 1 of 3 scored examples have no length scores") for w in metrics["warnings"])


def test_the_model_metrics_run_through_the_same_core(records, tmp_path):
    """bertscore and consistency (on tiny random BERTs) chosen by name, scored on every row and on lead-3."""
    from tests.bart_opt.scoring.tiny import bert_folder

    bert = str(bert_folder(tmp_path / "bert", layers=2, init_std=0.2))
    nli = str(bert_folder(tmp_path / "nli", labels={0: "entailment", 1: "neutral", 2: "contradiction"}))
    settings = MetricSettings("rouge,bertscore,consistency,length", bertscore_model=bert, consistency_model=nli)
    metrics = run_baseline_evaluation("lead-3", records[:3], tmp_path / "lead", RougeScorer(), metrics=settings)
    assert metrics["metrics"] == ["rouge", "bertscore", "consistency", "length"]
    assert set(metrics["bertscore"]) == {"precision", "recall", "f1"} and set(metrics["consistency"]) == {"summac_zs"}
    assert set(metrics["signatures"]) == {"bertscore", "consistency", "length"}
    rows = [json.loads(line) for line in (tmp_path / "lead" / "predictions.jsonl").read_text().splitlines()]
    assert all(set(row["scores"]) == {"bertscore", "consistency", "length"} for row in rows)
