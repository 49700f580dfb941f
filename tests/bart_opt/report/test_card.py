"""The model-index block: built with huggingface_hub's classes, read back by huggingface_hub's own parsers."""

from __future__ import annotations

import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

from bart_opt.report.card import card_name, card_run, model_index_yaml
from bart_opt.report.runs import load_report_run


def test_the_model_index_validates_and_holds_every_score_of_the_run(report_runs):
    run = load_report_run(report_runs["model"])
    text = model_index_yaml(run, model_name="tiny-bart")
    name, results = model_index_to_eval_results(yaml.safe_load(text)["model-index"])
    assert name == "tiny-bart"
    rouge = run.metrics["rouge"]
    assert [(r.metric_type, r.metric_name, r.metric_config, r.metric_value) for r in results] == [
        ("rouge", label, t, round(rouge[t]["mid"]["fmeasure"], 4))
        for t, label in (("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"), ("rougeL", "ROUGE-L"), ("rougeLsum", "ROUGE-Lsum"))]
    assert {(r.task_type, r.dataset_type, r.dataset_name) for r in results} == {("summarization", "data", "data.jsonl")}
    card = ModelCard(f"---\n{text}---\n\n# tiny-bart\n", ignore_metadata_errors=False)  # the hub's own front matter parse
    assert card.data.model_name == "tiny-bart" and card.data.eval_results == results
    assert card.data.to_yaml().rstrip("\n") == text.rstrip("\n")  # the round trip changes nothing


def test_other_metrics_become_their_own_entries(report_runs):
    run = load_report_run(report_runs["model"])
    run.metrics["extractive"] = {"density": {"low": 2.5, "mid": 3.14159, "high": 3.5}}
    _, results = model_index_to_eval_results(yaml.safe_load(model_index_yaml(run))["model-index"])
    assert (results[-1].metric_type, results[-1].metric_name, results[-1].metric_value) == (
        "extractive", "extractive density", 3.1416)


def test_the_card_describes_the_first_model_run_named_by_its_checkpoint(report_runs):
    lead, model = load_report_run(report_runs["lead"]), load_report_run(report_runs["model"])
    assert card_run([lead, model]) is model and card_run([lead]) is lead
    model.metrics["model"] = "/abs/path/to/tiny-bart"
    assert card_name(model) == "tiny-bart"
    model.metrics["model"] = "facebook/bart-large-cnn"
    assert card_name(model) == "facebook/bart-large-cnn"
