"""Score processors: transformers' numbers, computed in place on the caller's scores."""

from __future__ import annotations

import pytest
import torch
from transformers import MinLengthLogitsProcessor, NoRepeatNGramLogitsProcessor

from bart_opt.engine.processors import DeviceProcessors, ban_repeated_ngrams, ban_repeated_ngrams_dense, process_scores
from bart_opt.engine.spec import GenerationSpec


def spec(**overrides) -> GenerationSpec:
    values = dict(num_beams=4, max_length=40, min_length=12, length_penalty=2.0, no_repeat_ngram_size=3,
                  early_stopping=True, forced_bos_token_id=None, forced_eos_token_id=None, decoder_start_token_id=2,
                  eos_token_id=(2,), pad_token_id=1)
    return GenerationSpec(**{**values, **overrides})


@pytest.mark.parametrize("ngram", [1, 2, 3, 5])
@pytest.mark.parametrize("cur_len", [1, 3, 8, 20])
def test_masking_processors_equal_transformers_and_work_in_place(cur_len, ngram):
    gen = torch.Generator().manual_seed(cur_len)
    alphabet = 6 if ngram <= 3 else 2  # small enough for many repeated n-grams
    seqs = torch.randint(3, 3 + alphabet, (6, cur_len), generator=gen)
    scores = torch.log_softmax(torch.randn(6, 50, generator=gen), dim=-1)  # (N, V)
    expected = NoRepeatNGramLogitsProcessor(ngram)(seqs, scores.clone())
    expected = MinLengthLogitsProcessor(12, eos_token_id=2)(seqs, expected)
    got = process_scores(seqs, scores, spec(no_repeat_ngram_size=ngram))
    assert torch.equal(got, expected)
    assert got.data_ptr() == scores.data_ptr(), "masked in place, no (N, V) copy"
    if cur_len >= 8:
        assert bool(torch.isinf(got[:, 3:]).any()), "the case bans some repeated n-gram"


@pytest.mark.parametrize("forced", [dict(forced_eos_token_id=(2,)), dict(forced_bos_token_id=0)])
def test_forced_tokens_replace_every_score_in_place(forced):
    scores = torch.zeros(2, 10)
    cur_len = 39 if "forced_eos_token_id" in forced else 1
    got = process_scores(torch.full((2, cur_len), 5), scores, spec(no_repeat_ngram_size=0, min_length=0, **forced))
    token = 2 if "forced_eos_token_id" in forced else 0
    assert got[:, token].eq(0).all() and torch.isinf(got).sum() == 2 * 9
    assert got.data_ptr() == scores.data_ptr(), "overwritten in place, no (N, V) copy"


def _buffer(seqs: torch.Tensor, length: int, fill: int) -> torch.Tensor:
    """`seqs` (N, T) at the start of a fixed (N, length) buffer, the rest `fill`."""
    out = torch.full((seqs.shape[0], length), fill)
    out[:, : seqs.shape[1]] = seqs
    return out


@pytest.mark.parametrize("ngram", [1, 2, 3, 5])
@pytest.mark.parametrize("cur_len", [1, 2, 3, 8, 20, 39])
def test_dense_ngram_ban_equals_the_default_at_fixed_shapes(cur_len, ngram):
    """Over a fixed 40-token buffer whose tail holds tokens that would match (so the window mask must work)."""
    gen = torch.Generator().manual_seed(cur_len * 7 + ngram)
    alphabet = 6 if ngram <= 3 else 2
    seqs = torch.randint(3, 3 + alphabet, (6, cur_len), generator=gen)
    scores = torch.log_softmax(torch.randn(6, 50, generator=gen), dim=-1)
    expected = ban_repeated_ngrams(seqs, scores.clone(), ngram)
    buffer = _buffer(seqs, 40, fill=3)  # the fill token is part of the alphabet: stale windows would match
    got = ban_repeated_ngrams_dense(buffer, torch.tensor([cur_len]), scores, ngram)
    assert torch.equal(got, expected) and got.data_ptr() == scores.data_ptr()


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(forced_bos_token_id=0, forced_eos_token_id=(2, 5)),
    dict(forced_bos_token_id=0, forced_eos_token_id=(2,), max_length=2, min_length=0),
    dict(eos_token_id=(2, 7), min_length=12),
    dict(eos_token_id=None, no_repeat_ngram_size=0),
])
def test_device_processors_equal_process_scores_at_every_length(overrides):
    s = spec(**overrides)
    processors = DeviceProcessors(s, 50, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    full = torch.randint(3, 9, (6, s.max_length), generator=gen)  # (N, L) fixed buffer
    for cur_len in range(1, s.max_length):
        scores = torch.log_softmax(torch.randn(6, 50, generator=gen), dim=-1)
        expected = process_scores(full[:, :cur_len], scores.clone(), s)
        got = processors(full, torch.tensor([cur_len]), scores)
        assert torch.equal(got, expected), (overrides, cur_len)
