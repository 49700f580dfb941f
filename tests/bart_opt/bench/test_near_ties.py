"""The near-tie check (`bart_opt.bench.near_ties`) can fail: a mode that takes the second-best token once, where
the reference's margin between the two is beyond rounding, is caught, greedy and beam; one that bans other tokens
or loses an output's end is caught too."""

from __future__ import annotations

import pytest
import torch

import bart_opt.engine.generation as generation
from bart_opt import Bart
from bart_opt.bench.near_ties import BeamTrace, check_greedy, token_bound
from tests.bart_opt.agreement import generate_agreeing, rows, sources

STEP = 3  # the decoder step (tokens so far) at which the mutant first looks for a decisive row
SCALE = 20.0  # a logits scale above the d256 checkpoint's (about 15): the margin it needs is generous


def second_best_once(monkeypatch, row: int = 0):
    """Patch the default search's logits processing so that, from `STEP` on, at the first step where working row
    `row`'s best score leads its second by more than four float32 budgets, the two swap: the mode then prefers
    the second-best token there, once. Returns a list that holds that step once it happened."""
    original, happened = generation.process_scores, []

    def mutated(seqs, scores, spec):
        scores = original(seqs, scores, spec)
        if not happened and seqs.shape[1] >= STEP:
            top = scores[row].topk(2)
            if float(top.values[0] - top.values[1]) > 4 * token_bound("float32", SCALE):
                scores[row, top.indices[0]], scores[row, top.indices[1]] = top.values[1], top.values[0]
                happened.append(seqs.shape[1])
        return scores

    monkeypatch.setattr(generation, "process_scores", mutated)
    return happened


@pytest.fixture(scope="module")
def model(published_batch) -> Bart:
    return Bart.from_pretrained(published_batch("float32").path)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_the_unmutated_default_mode_passes(published_batch, model, search):
    outcome = published_batch("float32").run(model, search)
    outcome.report.assert_holds(search)
    assert outcome.report.rows > 0 and outcome.report.worst < 1


def test_a_greedy_mode_that_takes_the_second_best_token_once_is_caught(published_batch, model, monkeypatch):
    batch = published_batch("float32")
    happened = second_best_once(monkeypatch)
    with pytest.raises(AssertionError, match="no near-tie.*input 0, after") as caught:
        generate_agreeing(model, batch.ids, batch.mask, batch.hf, **batch.settings("greedy"))
    assert happened, "the mutant changed a step"
    assert f"input 0, after {happened[0]} tokens" in str(caught.value)


def test_a_beam_mode_that_prefers_the_second_best_token_once_is_caught(published_batch, model, monkeypatch):
    """In beam search both tokens may survive into the beams, so the output need not change: the check holds
    every step, and the swapped row is caught there."""
    batch = published_batch("float32")
    happened = second_best_once(monkeypatch)
    outcome = batch.run(model, "beam")
    assert happened
    with pytest.raises(AssertionError, match="no near-tie"):
        outcome.report.assert_holds("mutant")
    assert [v.position for v in outcome.report.violations if v.input == 0] == happened


def test_a_mode_that_bans_a_token_the_reference_allows_is_caught(published_batch, model, monkeypatch):
    batch = published_batch("float32")
    original = generation.process_scores

    def banning(seqs, scores, spec):
        scores = original(seqs, scores, spec)
        if seqs.shape[1] == STEP:
            scores[1, scores[1].topk(5).indices[4]] = -torch.inf  # row 1's fifth-best token, banned
        return scores

    monkeypatch.setattr(generation, "process_scores", banning)
    settings = batch.settings("beam")
    with BeamTrace() as trace:
        model.generate(batch.ids, batch.mask, **settings)
    report = trace.check(batch.hf, batch.inputs, model.generation_spec(settings), "float32")
    assert any("banned by one and not the other" in str(v) for v in report.violations), report.violations[:3]


def test_an_output_that_stops_short_is_caught(published_batch, model):
    batch = published_batch("float32")
    settings = batch.settings("greedy")
    got = rows(model.generate(batch.ids, batch.mask, **settings), model.config.pad_token_id)
    spec = model.generation_spec(settings)
    assert check_greedy(batch.hf, sources(batch.ids, batch.mask), got, spec, "float32").violations == []
    cut = [got[0][:10], *got[1:]]  # no EOS, not at the maximum length
    report = check_greedy(batch.hf, sources(batch.ids, batch.mask), cut, spec, "float32")
    assert [str(v) for v in report.violations] == ["input 0, after 10 tokens: the output ends with neither EOS nor "
                                                   "the maximum length"]
