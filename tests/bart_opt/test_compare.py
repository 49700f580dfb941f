"""bart_opt.compare: the significance tests on known cases, dataset checks, and ``bart-opt compare``."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from bart_opt.cli import main
from bart_opt.compare import (
    Run,
    RunMismatch,
    approximate_randomization,
    compare_runs,
    load_run,
    paired_bootstrap,
)
from bart_opt.errors import InvalidRequest
from bart_opt.pipeline.rouge import DEFAULT_ROUGE_TYPES


def row(example_id: str, score: float | None, prediction: str = "", reference: str = "ref", error: str | None = None):
    """A prediction row whose every ROUGE type scores `score` (None: no ROUGE)."""
    rouge = None if score is None else {t: {"precision": score, "recall": score, "fmeasure": score}
                                        for t in DEFAULT_ROUGE_TYPES}  # fmt: skip
    return {"id": example_id, "prediction": prediction or f"summary of {example_id}", "reference": reference,
            "rouge": rouge, "error": error}  # fmt: skip


def run(name: str, scores: list[float | None], **kwargs) -> Run:
    return Run(name, [row(f"doc-{i}", s, **kwargs) for i, s in enumerate(scores)])


def scores(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(0, 60) for _ in range(n)]


# ---- the tests on known cases -------------------------------------------------------------------


def test_identical_runs_have_p_1_and_a_zero_interval():
    base = scores(30)
    result = compare_runs([run("a", base), run("b", base)])
    (comparison,) = result["comparisons"]
    for rouge_type in DEFAULT_ROUGE_TYPES:
        stats = comparison["rouge"][rouge_type]
        assert stats["delta"] == 0.0 and stats["interval"] == [0.0, 0.0]
        assert stats["p_bootstrap"] == 1.0 and stats["p_randomization"] == 1.0
    assert (comparison["better"], comparison["worse"], comparison["same"]) == (0, 0, 30)
    assert comparison["wins"] == comparison["losses"] == []


def test_a_run_better_on_every_example_gets_the_smallest_p_either_test_can_give():
    base = scores(40)
    rng = random.Random(1)
    better = [s + rng.uniform(1, 3) for s in base]
    result = compare_runs([run("a", base), run("b", better)], resamples=2000)
    stats = result["comparisons"][0]["rouge"]["rouge1"]
    assert stats["p_bootstrap"] == pytest.approx(1 / 2001) and stats["p_randomization"] == pytest.approx(1 / 2001)
    assert stats["randomization"] == "sampled"
    assert 1 < stats["interval"][0] < stats["delta"] < stats["interval"][1] < 3
    assert stats["delta"] == pytest.approx(np.mean(np.array(better) - np.array(base)))
    assert result["comparisons"][0]["better"] == 40


def test_randomization_enumerates_every_swap_of_a_small_case():
    # d = (1, 2, 3), mean 2: of the 8 sign flips only (+,+,+) and (-,-,-) reach |mean| >= 2.
    assert approximate_randomization([1.0, 2.0, 3.0], trials=1000) == {"p": 2 / 8, "method": "exact"}
    # d = (1, 1, 1, 1): again only the two uniform flips, of 16.
    assert approximate_randomization([1.0] * 4, trials=16) == {"p": 2 / 16, "method": "exact"}
    assert approximate_randomization([1.0] * 5, trials=16)["method"] == "sampled"


def test_bootstrap_on_a_binomial_case():
    # d = (0, 0, 0, 1): a resample's mean is X / 4 with X ~ Binomial(4, 1/4), so the 95% interval
    # is [0, 0.75] and |X/4 - 1/4| >= 1/4 fails only for X = 1: p = 1 - 4 (1/4)(3/4)^3 = 0.578125.
    result = paired_bootstrap([0.0, 0.0, 0.0, 1.0], resamples=20_000, seed=3)
    assert result["delta"] == 0.25 and result["interval"] == [0.0, 0.75]
    assert result["p"] == pytest.approx(0.578125, abs=0.015)


def test_the_same_seed_gives_the_same_numbers_and_another_seed_other_ones():
    runs = [run("a", scores(25, seed=1)), run("b", scores(25, seed=2))]
    assert compare_runs(runs, seed=7) == compare_runs(runs, seed=7)
    first = compare_runs(runs, seed=7)["comparisons"][0]["rouge"]["rouge2"]
    other = compare_runs(runs, seed=8)["comparisons"][0]["rouge"]["rouge2"]
    assert first["delta"] == other["delta"] and first["p_bootstrap"] != other["p_bootstrap"]


def test_row_order_does_not_change_the_result():
    a, b = run("a", scores(20, seed=3)), run("b", scores(20, seed=4))
    shuffled = Run("b", random.Random(0).sample(b.rows, len(b.rows)))
    assert compare_runs([a, b]) == compare_runs([a, shuffled])


# ---- what is compared ---------------------------------------------------------------------------


def test_runs_on_different_datasets_are_refused():
    a = run("a", scores(5))
    other_ids = Run("b", [row(f"x-{i}", 1.0) for i in range(3)] + a.rows[:3])
    with pytest.raises(RunMismatch, match=r"a and b are not on the same dataset: 2 examples only in a .*'doc-3'.*; "
                                          r"3 examples only in b \(first: 'x-0'\)"):  # fmt: skip
        compare_runs([a, other_ids])
    other_references = run("b", scores(5), reference="another reference")
    with pytest.raises(RunMismatch, match="example 'doc-0' has different references"):
        compare_runs([a, other_references])


def test_examples_without_rouge_in_some_run_are_left_out_and_counted():
    base = scores(6)
    failed = run("b", base)
    failed.rows[2] = row("doc-2", None, error="out of memory")
    result = compare_runs([run("a", base), failed])
    assert (result["examples"], result["paired"], result["unpaired"]) == (6, 5, 1)
    assert result["unpaired_ids"] == ["doc-2"] and result["runs"][1]["errors"] == 1
    assert result["comparisons"][0]["rouge"]["rougeL"]["p_bootstrap"] == 1.0
    with pytest.raises(RunMismatch, match="no example has ROUGE in every run"):
        compare_runs([run("a", [None] * 3), run("b", [1.0] * 3)])


def test_wins_and_losses_are_ranked_by_the_metric_and_carry_the_texts():
    base = [10.0, 10.0, 10.0, 10.0, 10.0]
    other = [15.0, 30.0, 10.0, 4.0, 9.0]
    a = run("a", base)
    b = Run("b", [row(f"doc-{i}", s, prediction=f"b says {i}") for i, s in enumerate(other)])
    comparison = compare_runs([a, b], top=5)["comparisons"][0]
    assert [(w["id"], w["delta"]) for w in comparison["wins"]] == [("doc-1", 20.0), ("doc-0", 5.0)]
    assert [(w["id"], w["delta"]) for w in comparison["losses"]] == [("doc-3", -6.0), ("doc-4", -1.0)]
    win = comparison["wins"][0]
    assert win["run"] == {"prediction": "b says 1", "score": 30.0}
    assert win["baseline"] == {"prediction": "summary of doc-1", "score": 10.0} and win["reference"] == "ref"
    assert (comparison["better"], comparison["worse"], comparison["same"]) == (2, 2, 1)
    assert len(compare_runs([a, b], top=1)["comparisons"][0]["wins"]) == 1


def test_three_runs_are_each_compared_with_the_first():
    base = scores(10)
    result = compare_runs([run("a", base), run("b", [s + 1 for s in base]), run("c", [s - 2 for s in base])])
    assert [(c["baseline"], c["run"]) for c in result["comparisons"]] == [("a", "b"), ("a", "c")]
    assert [c["rouge"]["rouge1"]["delta"] for c in result["comparisons"]] == pytest.approx([1.0, -2.0])
    assert [r["name"] for r in result["runs"]] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"metric": "rouge3"}, "metric"), ({"resamples": 0}, "resamples"), ({"resamples": 10**6}, "resamples"),
     ({"top": -1}, "top"), ({"top": 1.5}, "top")],
)  # fmt: skip
def test_bad_options_name_their_field(kwargs, field):
    with pytest.raises(InvalidRequest) as caught:
        compare_runs([run("a", [1.0]), run("b", [2.0])], **kwargs)
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")


def test_malformed_inputs_are_refused_by_name():
    with pytest.raises(InvalidRequest, match="at least two runs"):
        compare_runs([run("a", [1.0])])
    with pytest.raises(InvalidRequest, match="distinct names"):
        compare_runs([run("a", [1.0]), run("a", [1.0])])
    with pytest.raises(ValueError, match="example 'doc-0' appears twice"):
        compare_runs([run("a", [1.0]), Run("b", [row("doc-0", 1.0), row("doc-0", 2.0)])])
    with pytest.raises(ValueError, match="per-example differences must be finite"):
        paired_bootstrap([1.0, float("nan")])


# ---- run folders and the command ------------------------------------------------------------------


def write_run(folder, rows, generation=None):
    folder.mkdir(parents=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "run.json").write_text(json.dumps({"model": "demo", "generation": generation or {"num_beams": 1}}))
    return folder


def test_bart_opt_compare_prints_tables_and_json(tmp_path, capsys):
    base = scores(12, seed=5)
    a = write_run(tmp_path / "a", run("a", base).rows)
    b = write_run(tmp_path / "b", run("b", [s + 2 for s in reversed(base)]).rows, {"num_beams": 4})
    assert main(["compare", str(a), str(b), "--resamples", "500", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    expected = compare_runs([load_run(a), load_run(b)], resamples=500, seed=3)
    stats = expected["comparisons"][0]["rouge"]["rougeLsum"]
    assert "2 runs on the same 12 examples; 12 scored in every run" in text
    assert f"rougeLsum {stats['delta']:>+9.2f}" in text and f"{stats['p_bootstrap']:>12.4f}" in text
    assert "biggest wins (rougeLsum):" in text
    assert main(["compare", str(a), str(b), "--resamples", "500", "--seed", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(expected))
    assert printed["runs"][1]["info"]["generation"] == {"num_beams": 4}


def test_bart_opt_compare_refuses_other_datasets_and_missing_folders(tmp_path, capsys):
    a = write_run(tmp_path / "a", run("a", [1.0, 2.0]).rows)
    b = write_run(tmp_path / "b", [row("other", 1.0)])
    assert main(["compare", str(a), str(b)]) == 2
    assert "a and b are not on the same dataset" in capsys.readouterr().err
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "has no predictions.jsonl" in capsys.readouterr().err
    assert main(["compare", str(a)]) == 2
    assert "give at least two run folders" in capsys.readouterr().err
    (tmp_path / "a" / "predictions.jsonl").write_text('{"id": "x"}\n{"id": \n')
    assert main(["compare", str(a), str(b)]) == 2
    assert "line 2 is not valid JSON" in capsys.readouterr().err


# ---- metrics beyond ROUGE -----------------------------------------------------------------------------


def with_scores(base: Run, coverage: list[float], tokens: list[float]) -> Run:
    rows = [{**r, "scores": {"extractive": {"coverage": c}, "length": {"tokens": t}}}
            for r, c, t in zip(base.rows, coverage, tokens)]
    return Run(base.name, rows, dict(base.info))


def test_every_score_of_every_metric_gets_its_significance_row():
    n = 20
    base = with_scores(run("base", scores(n, 1)), [0.9] * n, [30.0 + i for i in range(n)])
    other = with_scores(run("other", scores(n, 2)), [0.5 + 0.01 * i for i in range(n)], [30.0 + i for i in range(n)])
    result = compare_runs([base, other], resamples=300, seed=2)
    (comparison,) = result["comparisons"]
    assert comparison["metrics"] == ["rouge", "extractive", "length"]  # each under its name, as ROUGE's
    coverage = comparison["extractive"]["coverage"]
    order = sorted(range(n), key=lambda i: f"doc-{i}")  # compared in id order
    diffs = np.array([0.5 + 0.01 * i for i in order]) - np.array([0.9] * n)  # run - baseline
    assert coverage == {**paired_bootstrap_row(diffs, 300, 2), "baseline": pytest.approx(0.9),
                        "run": pytest.approx(np.mean([0.5 + 0.01 * i for i in range(n)]))}
    tokens = comparison["length"]["tokens"]
    assert tokens["delta"] == 0.0 and tokens["p_bootstrap"] == 1.0 and tokens["p_randomization"] == 1.0
    assert result["runs"][1]["metrics"]["length"]["tokens"] == np.mean([30.0 + i for i in range(n)])
    assert comparison["rouge"] == compare_runs([run("base", scores(n, 1)), run("other", scores(n, 2))],
                                               resamples=300, seed=2)["comparisons"][0]["rouge"]


def paired_bootstrap_row(diffs, resamples, seed):
    bootstrap = paired_bootstrap(diffs, resamples, seed)
    randomization = approximate_randomization(diffs, resamples, seed)
    return {"delta": bootstrap["delta"], "interval": bootstrap["interval"], "p_bootstrap": bootstrap["p"],
            "p_randomization": randomization["p"], "randomization": randomization["method"]}


def test_runs_without_scores_compare_on_rouge_only_and_other_signatures_are_left_out():
    n = 10
    old = run("old", scores(n, 3))  # rows from before metrics beyond ROUGE
    new = with_scores(run("new", scores(n, 4)), [0.7] * n, [20.0] * n)
    (comparison,) = compare_runs([old, new], resamples=100)["comparisons"]
    assert comparison["metrics"] == ["rouge"] and set(comparison["rouge"]) == set(DEFAULT_ROUGE_TYPES)
    assert "extractive" not in comparison and "length" not in comparison

    signed = {"metrics": {"signatures": {"extractive": {"tokenizer": "unicode"}, "length": {"tokenizer": "unicode"}}}}
    other = {"metrics": {"signatures": {"extractive": {"tokenizer": "script"}, "length": {"tokenizer": "unicode"}}}}
    a = with_scores(run("a", scores(n, 5)), [0.7] * n, [20.0] * n)
    b = with_scores(run("b", scores(n, 6)), [0.6] * n, [21.0] * n)
    a.info, b.info = signed, other
    result = compare_runs([a, b], resamples=100)
    assert result["comparisons"][0]["metrics"] == ["rouge", "length"] and "extractive" not in result["comparisons"][0]
    assert any(note.startswith("extractive: scored otherwise in a and b") for note in result["notes"])


def test_bart_opt_compare_prints_a_row_per_metric_score(tmp_path, capsys):
    n = 8
    a = write_run(tmp_path / "a", with_scores(run("a", scores(n, 7)), [0.9] * n, [25.0] * n).rows)
    b = write_run(tmp_path / "b", with_scores(run("b", scores(n, 8)), [0.8] * n, [27.0] * n).rows)
    assert main(["compare", str(a), str(b), "--resamples", "200", "--metric", "rouge2"]) == 0
    text = capsys.readouterr().out
    row = compare_runs([load_run(a), load_run(b)], resamples=200)["comparisons"][0]["length"]["tokens"]
    assert f"length.tokens: 25 -> 27, delta {row['delta']:+.4g}" in text and "extractive.coverage: 0.9 -> 0.8" in text
    assert "biggest wins (rouge2):" in text or "biggest losses (rouge2):" in text
    assert main(["compare", str(a), str(b), "--resamples", "200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["comparisons"][0]["length"]["tokens"]["delta"] == 2.0


def test_the_report_table_reads_a_row_per_metric_score():
    from bart_opt.report.tables import comparison_rows

    n = 6
    a = with_scores(run("a", scores(n, 9)), [0.9] * n, [25.0] * n)
    b = with_scores(run("b", scores(n, 10)), [0.8] * n, [27.0] * n)
    (comparison,) = compare_runs([a, b], resamples=100)["comparisons"]
    assert list(comparison_rows(comparison)) == [*DEFAULT_ROUGE_TYPES, "extractive.coverage", "length.tokens"]
