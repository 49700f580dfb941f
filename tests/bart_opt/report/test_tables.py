"""The tables of --format: every metric a run holds, each format parsed back, the same bytes every time."""

from __future__ import annotations

import copy
import csv
import io
import json

import pytest

from bart_opt.report.tables import (
    Interval, comparison_table, metric_intervals, render, score_table, signature_lines, systems,
)


def rouge(mid: float, low: float, high: float) -> dict:
    return {t: {bound: {"precision": v - 1, "recall": v + 1, "fmeasure": v}
                for bound, v in (("low", low), ("mid", mid), ("high", high))}
            for t in ("rouge1", "rouge2", "rougeL", "rougeLsum")}


@pytest.fixture
def metrics() -> dict:
    """A run's metrics.json: ROUGE as stored today, two other metrics as name -> score -> {low, mid, high},
    dicts that are not metrics, and a baseline without the other metrics."""
    return {
        "model": "demo-model", "signature": "nrefs:1|rouge:1,2,L,Lsum|system:bart", "n_obs": 6, "n_scored": 5,
        "rouge": rouge(41.23456, 39.5, 43.25),
        "bertscore": {"f1": {"low": 0.8712, "mid": 0.88125, "high": 0.8913}},
        "extractive": {"novel_1gram": {"low": 0.05, "mid": 0.0625, "high": 0.071},
                       "density": {"low": 3.1, "mid": 3.25, "high": 3.5}},
        "padding": {"computed": 10, "avoided": 3}, "tokens": {"input": 5, "output": 2, "truncated_inputs": 0},
        "memory": {"device": "cpu", "peak_bytes": 4, "peak_source": "none"}, "generation": {"num_beams": 4},
        "signatures": {"bertscore": {"model": "tiny-roberta", "layer": 2}},
        "warnings": ["a warning"],
        "baselines": {"lead-3": {"model": "lead-3", "signature": "nrefs:1|system:baseline|model:lead-3", "n_obs": 6,
                                 "n_scored": 6, "rouge": rouge(30.0, 28.0, 32.0), "warnings": ["a warning"]}},
    }


COLUMNS = ["rouge1", "rouge2", "rougeL", "rougeLsum", "bertscore.f1", "extractive.novel_1gram", "extractive.density"]


def test_every_metric_of_the_run_is_a_column_and_nothing_else(metrics):
    found = metric_intervals(metrics)
    assert list(found) == COLUMNS
    assert found["rouge2"] == Interval(41.23456, 39.5, 43.25)  # the F-measure of each bound
    assert found["extractive.density"] == Interval(3.25, 3.1, 3.5)
    assert [name for name, _ in systems(metrics)] == ["demo-model", "lead-3"]
    assert systems(metrics, name="run-a")[0][0] == "run-a"


def test_the_score_table_has_a_row_per_system_and_a_column_per_score(metrics):
    table = score_table(systems(metrics))
    assert table.columns == ["system", "scored", *COLUMNS]
    assert [row[:2] for row in table.rows] == [["demo-model", "5/6"], ["lead-3", "6/6"]]
    assert table.rows[1][2:] == [Interval(30.0, 28.0, 32.0)] * 4 + [None] * 3  # the baseline has only ROUGE
    assert table.signatures == [("demo-model", "nrefs:1|rouge:1,2,L,Lsum|system:bart"),
                                ("demo-model bertscore", "model:tiny-roberta|layer:2"),
                                ("lead-3", "nrefs:1|system:baseline|model:lead-3")]
    assert table.notes == ["warning: a warning"]  # once, though both systems carry it


def markdown_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert set("".join(cells[1])) <= set("-:")  # the header's rule
    return [cells[0], *cells[2:]]


def test_markdown_parses_back_to_the_rounded_scores(metrics):
    text = render(score_table(systems(metrics)), "markdown")
    header, model, baseline = markdown_rows(text)
    assert header == ["system", "scored", *COLUMNS]
    # 2 decimals from 10 up, 3 from 1, 4 below: the scale of each column
    assert model[2:] == ["41.23 [39.50, 43.25]"] * 4 + ["0.8812 [0.8712, 0.8913]", "0.0625 [0.0500, 0.0710]",
                                                         "3.250 [3.100, 3.500]"]
    assert baseline[-1] == "-"
    assert "- signature demo-model: `nrefs:1|rouge:1,2,L,Lsum|system:bart`" in text.splitlines()
    assert "- signature demo-model bertscore: `model:tiny-roberta|layer:2`" in text.splitlines()
    assert text.splitlines()[-1] == "- warning: a warning"


def test_csv_parses_back_to_the_exact_floats_and_signatures(metrics):
    rows = list(csv.DictReader(io.StringIO(render(score_table(systems(metrics)), "csv"))))
    model, baseline = rows
    assert float(model["rouge1"]) == metrics["rouge"]["rouge1"]["mid"]["fmeasure"]
    assert float(model["rouge1_low"]) == 39.5 and float(model["rouge1_high"]) == 43.25
    assert float(model["bertscore.f1"]) == 0.88125 and float(model["extractive.density_high"]) == 3.5
    assert model["signature"] == metrics["signature"] and baseline["signature"].endswith("model:lead-3")
    assert (baseline["system"], baseline["scored"], baseline["bertscore.f1"]) == ("lead-3", "6/6", "")


def test_latex_is_a_booktabs_tabular_with_escaped_names_and_commented_signatures(metrics):
    text = render(score_table(systems(metrics)), "latex")
    assert text.startswith("\\begin{tabular}") and "\\end{tabular}" in text and "\\toprule" in text
    assert "novel\\_1gram" in text and "novel_1gram" not in text.replace("novel\\_1gram", "")
    after = text.split("\\end{tabular}\n", 1)[1].splitlines()
    assert after and all(line.startswith("% ") for line in after)
    assert "% signature lead-3: nrefs:1|system:baseline|model:lead-3" in after


def test_text_is_a_plain_table_with_the_signatures_under_it(metrics):
    lines = render(score_table(systems(metrics)), "text").splitlines()
    assert lines[0].split() == ["system", "scored", *COLUMNS]
    assert set(lines[1]) == {"-", " "}
    assert lines[2].startswith("demo-model") and "41.23 [39.50, 43.25]" in lines[2]
    assert "signature demo-model: nrefs:1|rouge:1,2,L,Lsum|system:bart" in lines


@pytest.mark.parametrize("fmt", ["text", "markdown", "csv", "latex"])
def test_the_same_metrics_give_the_same_bytes(metrics, fmt):
    reread = json.loads(json.dumps(metrics))  # as read back from metrics.json
    first = render(score_table(systems(metrics)), fmt)
    assert render(score_table(systems(copy.deepcopy(reread))), fmt) == first
    assert first == render(score_table(systems(metrics)), fmt)


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="no table format 'html'"):
        render(score_table([]), "html")


def test_a_dict_signature_is_shown_as_key_value_pairs():
    assert signature_lines("a", {"signature": "s", "signatures": {"x": "v:1", "y": {"k": 1}}}) == [
        ("a", "s"), ("a x", "v:1"), ("a y", "k:1")]


def comparison_result() -> dict:
    """A compare_runs result with ROUGE's rows and, as another metric would add them, BERTScore's."""
    def row(base, run, low, high):
        return {"baseline": base, "run": run, "delta": run - base, "interval": [low, high], "p_bootstrap": 0.001,
                "p_randomization": 0.03125, "randomization": "exact"}

    comparison = {"baseline": "a", "run": "b", "rouge": {"rouge1": row(40.0, 42.5, 1.25, 3.75),
                                                         "rougeLsum": row(38.0, 37.0, -2.0, 0.5)},
                  "bertscore": {"f1": row(0.875, 0.8875, 0.00625, 0.0188)}, "better": 3, "worse": 1, "same": 0,
                  "wins": [], "losses": []}
    return {"metric": "rougeLsum", "measure": "fmeasure", "confidence": 0.95, "seed": 0, "resamples": 1000,
            "examples": 5, "paired": 4, "unpaired": 1, "unpaired_ids": ["x"], "notes": ["a note"],
            "runs": [{"name": "a", "signature": "sig-a", "info": {}, "warnings": []},
                     {"name": "b", "signature": "sig-b", "info": {"signatures": {"bertscore": "bs"}}, "warnings": []}],
            "comparisons": [comparison]}


def test_the_comparison_table_has_a_row_per_metric_score():
    table = comparison_table(comparison_result())
    header, *rows = markdown_rows(render(table, "markdown"))
    assert header == ["run", "baseline", "score", "baseline mean", "run mean", "delta", "p bootstrap",
                      "p randomization"]
    assert rows == [["b", "a", "rouge1", "40.00", "42.50", "+2.50 [+1.25, +3.75]", "0.0010", "0.0312"],
                    ["b", "a", "rougeLsum", "38.00", "37.00", "-1.00 [-2.00, +0.50]", "0.0010", "0.0312"],
                    ["b", "a", "bertscore.f1", "0.8750", "0.8875", "+0.0125 [+0.0063, +0.0188]", "0.0010", "0.0312"]]
    assert table.signatures == [("a", "sig-a"), ("b", "sig-b"), ("b bertscore", "bs")]
    assert "note: a note" in table.notes and any("4 of 5 examples" in note for note in table.notes)
    parsed = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert [(r["score"], float(r["delta"]), float(r["delta_low"])) for r in parsed] == [
        ("rouge1", 2.5, 1.25), ("rougeLsum", -1.0, -2.0), ("bertscore.f1", 0.8875 - 0.875, 0.00625)]
