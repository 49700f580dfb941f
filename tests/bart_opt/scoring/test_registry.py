"""The metric names, their settings (refused by name), the builder, and reading a run's metrics back."""

from __future__ import annotations

import sys

import pytest

from bart_opt.errors import InvalidRequest
from bart_opt.pipeline.rouge import RougeSettings
from bart_opt.scoring import extractive
from bart_opt.scoring.registry import (
    DEFAULT, NAMES, SOURCE_SCORES, MetricSettings, build_metrics, intervals, metric_names, parse_metrics, row_scores,
)


def test_names_and_default_are_the_contracts():
    assert NAMES == ("rouge", "extractive", "length", "bertscore", "consistency")
    assert DEFAULT == ("rouge", "extractive", "length")
    assert SOURCE_SCORES == {"extractive": extractive.SOURCE_SCORES}


def test_parse_metrics_puts_rouge_first_and_keeps_the_order():
    assert parse_metrics("rouge,bertscore") == ("rouge", "bertscore")
    assert parse_metrics(" length , extractive ") == ("rouge", "length", "extractive")
    assert parse_metrics(["extractive", "rouge"]) == ("rouge", "extractive")


@pytest.mark.parametrize(("value", "says"), [
    ("", "empty name"), ("rouge,,length", "empty name"), ([], "empty name"), ("rouge,bleu", "unknown metric 'bleu'"),
    ("length,length", "length given more than once"), ("rouge,ROUGE", "unknown metric 'ROUGE'"),
])
def test_parse_metrics_refuses_empty_unknown_and_repeated_names(value, says):
    with pytest.raises(InvalidRequest) as error:
        parse_metrics(value)
    assert error.value.field == "metrics" and says in error.value.message


@pytest.mark.parametrize(("metrics", "field"), [("rouge,bertscore", "bertscore_model"),
                                                ("consistency", "consistency_model")])
def test_a_model_metric_without_its_model_is_refused_naming_the_flag(metrics, field):
    with pytest.raises(InvalidRequest) as error:
        MetricSettings(metrics)
    assert error.value.field == field and f"--{field.replace('_', '-')}" in error.value.message


def test_a_model_metric_whose_module_is_missing_is_refused_naming_metrics(monkeypatch):
    monkeypatch.setitem(sys.modules, "bart_opt.scoring.bertscore", None)  # not importable, as before part B
    settings = MetricSettings("rouge,bertscore", bertscore_model="some/model")
    with pytest.raises(InvalidRequest) as error:
        build_metrics(settings)
    assert error.value.field == "metrics" and "bertscore needs" in error.value.message


def test_build_metrics_follows_the_settings_and_rouges_language():
    settings = MetricSettings.for_rouge(RougeSettings(tokenizer="script", lang="zh"), "length,extractive")
    assert settings.metrics == ("rouge", "length", "extractive") and settings.tokenizer == "script"
    built = build_metrics(settings, RougeSettings(tokenizer="script", lang="zh"))
    assert [metric.name for metric in built] == ["rouge", "length", "extractive"]
    assert built[0].settings.lang == "zh" and built[1].lang == "zh" and built[2].tokenizer_name == "script"
    assert not settings.models and MetricSettings("bertscore", bertscore_model="m").models


def test_settings_round_trip_and_the_record_holds_every_signature():
    settings = MetricSettings("length", lang="de")
    assert MetricSettings.from_dict(settings.to_dict()) == settings
    record = settings.record(build_metrics(settings))
    assert record["names"] == ["rouge", "length"]
    assert record["signatures"] == {"length": {"tokenizer": "unicode", "lang": "de", "splitter": "punkt+marks",
                                               "version": 1}}


def test_a_runs_metrics_read_back():
    interval = {"low": 1.0, "mid": 2.0, "high": 3.0}
    rouge = {"low": {"precision": 1, "recall": 2, "fmeasure": 10.0}, "mid": {"precision": 1, "recall": 2, "fmeasure": 20.0},
             "high": {"precision": 1, "recall": 2, "fmeasure": 30.0}}
    metrics = {"metrics": ["rouge", "length"], "rouge": {"rouge1": rouge}, "length": {"tokens": interval}}
    assert metric_names(metrics) == ("rouge", "length")
    assert intervals(metrics) == {"rouge": {"rouge1": {"low": 10.0, "mid": 20.0, "high": 30.0}},
                                  "length": {"tokens": interval}}
    old = {"rouge": {"rouge1": rouge}}  # a run from before metrics beyond ROUGE
    assert metric_names(old) == ("rouge",) and list(intervals(old)) == ["rouge"]
    assert intervals({"metrics": ["rouge", "length"], "rouge": None, "length": None}) == {}
    row = {"rouge": {"rouge1": {"precision": 1.0, "recall": 2.0, "fmeasure": 3.0}}, "scores": {"length": {"tokens": 4}}}
    assert row_scores(row) == {"rouge": {"rouge1": 3.0}, "length": {"tokens": 4.0}}
    assert row_scores({"rouge": None}) == {}
