"""generate() of bart_opt.Bart is token-for-token equal to transformers' generate(), in both modes,
on tiny checkpoints (wide ones in every dtype: test_fidelity.py)."""

from __future__ import annotations

import pytest
import torch

from bart_opt import Bart
from bart_opt.engine import generation
from bart_opt.engine.cache import KVCache
from bart_opt.bench.near_ties import BeamTrace
from bart_opt.engine.memory import LiveTensorCounter
from tests.bart_opt.agreement import assert_agrees, generate_agreeing
from tests.bart_opt.reference import batch, reference_model

# eos_bias makes random weights end their sequences at varied, input-dependent lengths.
CHECKPOINTS = {
    "base": dict(init_std=0.2, eos_bias=5.0),
    "distil_scaled": dict(
        init_std=0.2, eos_bias=5.0, encoder_layers=3, decoder_layers=1, scale_embedding=True,
        activation_function="relu", encoder_attention_heads=8, decoder_attention_heads=2,
    ),
}

CASES = {
    "greedy": dict(num_beams=1, min_length=0),
    "greedy_ngram_min_length": dict(num_beams=1, no_repeat_ngram_size=2, min_length=6),
    "checkpoint_defaults": dict(),
    "negative_length_penalty": dict(num_beams=3, length_penalty=-1.0, early_stopping=False, min_length=0),
    "early_stopping_never": dict(num_beams=4, length_penalty=0.5, early_stopping="never", min_length=2),
    "never_negative_penalty": dict(num_beams=4, length_penalty=-0.5, early_stopping="never", min_length=0),
    "early_stopping_true": dict(num_beams=3, length_penalty=1.0, early_stopping=True, no_repeat_ngram_size=2),
    "early_stopping_false": dict(num_beams=5, length_penalty=2.0, early_stopping=False, min_length=3),
    "long_min_length": dict(num_beams=4, min_length=14, max_length=20),
    "max_new_tokens": dict(num_beams=4, max_new_tokens=6, min_length=3),
    "no_forced_tokens": dict(num_beams=2, forced_bos_token_id=None, forced_eos_token_id=None, min_length=0),
    "greedy_forced_eos_short": dict(num_beams=1, max_length=9, min_length=0),
}


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request, make_checkpoint):
    return make_checkpoint(**CHECKPOINTS[request.param])


def reference_generate(path, ids, mask, **kwargs):
    with torch.no_grad():
        return reference_model(path).generate(input_ids=ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_uneven_batch_matches_transformers(checkpoint, case):
    ids, mask = batch(checkpoint, (1, 5, 2, 3, 1), seed=3)
    expected = reference_generate(checkpoint, ids, mask, **CASES[case])
    model = Bart.from_pretrained(checkpoint)
    for exact in (False, True):  # exact: bit for bit; the default: the same ids or near-ties (agreement.py)
        model.exact = exact
        generate_agreeing(model, ids, mask, checkpoint, expected=expected, **CASES[case])


@pytest.mark.parametrize("case", ["greedy", "checkpoint_defaults", "negative_length_penalty"])
def test_batch_of_one_matches_transformers(checkpoint, case):
    ids, mask = batch(checkpoint, (3,), seed=5)
    expected = reference_generate(checkpoint, ids, mask, **CASES[case])
    for exact in (False, True):
        generate_agreeing(Bart.from_pretrained(checkpoint, exact=exact), ids, mask, checkpoint, expected=expected,
                          **CASES[case])


def test_finished_inputs_leave_the_working_batch(make_checkpoint, monkeypatch):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    kept_rows = []
    original_keep = KVCache.keep
    monkeypatch.setattr(KVCache, "keep", lambda self, rows: (kept_rows.append(len(rows)), original_keep(self, rows)))
    generate_agreeing(Bart.from_pretrained(path), ids, mask, path, num_beams=4, min_length=0)
    assert kept_rows, "no input left the batch early"
    assert kept_rows == sorted(kept_rows, reverse=True) and kept_rows[-1] < 5 * 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_beam_search_widens_logits_into_one_buffer_for_the_whole_call(make_checkpoint, monkeypatch, dtype):
    """Half-precision logits are widened into one float32 buffer reused by every step (rows leaving
    the batch use its first rows), with the same ids as widening into fresh tensors; float32 logits
    are used as they come."""
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    model = Bart.from_pretrained(path, dtype=dtype)
    original, original_process = Bart.decode_step, generation.process_scores
    buffers, results, log_probs = [], [], []

    def recording(self, tokens, cross, cache, out=None):
        logits = original(self, tokens, cross, cache, out=out)
        buffers.append(out)
        results.append(logits)
        return logits

    def processing(seqs, scores, s):
        log_probs.append(scores)
        return original_process(seqs, scores, s)

    monkeypatch.setattr(Bart, "decode_step", recording)
    monkeypatch.setattr(generation, "process_scores", processing)
    got = model.generate(ids, mask, num_beams=4, min_length=0)
    rows = [r.shape[0] for r in results]
    assert len(rows) > 2 and rows[-1] < rows[0], "inputs left the batch during the call"
    assert all(r.dtype == torch.float32 for r in results + log_probs)
    assert len({p.data_ptr() for p in log_probs}) == 1, "every step's log-probs in one buffer"
    if dtype == torch.float32:
        assert buffers == [None] * len(rows)
    else:
        assert len({b.untyped_storage().data_ptr() for b in buffers}) == 1
        assert all(r.data_ptr() == buffers[0].data_ptr() for r in results)

    monkeypatch.setattr(Bart, "decode_step", lambda self, tokens, cross, cache, out=None: original(self, tokens, cross, cache))
    monkeypatch.setattr(generation, "process_scores", original_process)
    assert torch.equal(got, model.generate(ids, mask, num_beams=4, min_length=0))


def test_beam_search_buffers_do_not_follow_torchs_default_dtype(make_checkpoint):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    model = Bart.from_pretrained(path)
    expected = model.generate(ids, mask, num_beams=4, min_length=0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = model.generate(ids, mask, num_beams=4, min_length=0)
    finally:
        torch.set_default_dtype(previous)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_exact_mode_keeps_finished_inputs_in_the_batch(make_checkpoint, monkeypatch, num_beams):
    """As transformers does: a matrix product's rounding may depend on its row count."""
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    kept_rows = []
    original_keep = KVCache.keep
    monkeypatch.setattr(KVCache, "keep", lambda self, rows: (kept_rows.append(len(rows)), original_keep(self, rows)))
    got = Bart.from_pretrained(path, exact=True).generate(ids, mask, num_beams=num_beams, min_length=0)
    expected = reference_generate(path, ids, mask, num_beams=num_beams, min_length=0)
    assert (expected == 1).any(), "some inputs finished before others"
    assert kept_rows == [] and torch.equal(got, expected)


def test_checkpoint_generation_config_is_the_default(demo_checkpoint):
    model = Bart.from_pretrained(demo_checkpoint)
    gc = model.generation_config
    assert (gc.num_beams, gc.length_penalty, gc.no_repeat_ngram_size, gc.early_stopping) == (4, 2.0, 3, True)
    ids, mask = batch(demo_checkpoint, (2, 1))
    explicit = model.generate(ids, mask, num_beams=4, length_penalty=2.0, max_length=40, min_length=8,
                              no_repeat_ngram_size=3, early_stopping=True)
    assert torch.equal(model.generate(ids, mask), explicit)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(do_sample=True), "do_sample"),
        (dict(num_return_sequences=2), "num_return_sequences"),
        (dict(temperature=0.7), "unsupported generation option"),
        (dict(early_stopping="sometimes"), "early_stopping"),
        (dict(num_beams=0), "num_beams"),
        (dict(max_length=1), "max_length"),
        (dict(max_length=5000), "max_position_embeddings"),
    ],
)
def test_unsupported_options_raise(demo_checkpoint, kwargs, message):
    model = Bart.from_pretrained(demo_checkpoint)
    ids, mask = batch(demo_checkpoint, (2,))
    with pytest.raises(ValueError, match=message):
        model.generate(ids, mask, **kwargs)


def _decode_state_bytes(model, ids, mask, num_beams):
    """Largest live-tensor total seen at any decoder step of one generate call."""
    seen = []
    original = model.decode_step

    def spy(*args, **kwargs):
        seen.append(counter.current_bytes)
        return original(*args, **kwargs)

    model.decode_step = spy
    with LiveTensorCounter() as counter:
        model.generate(ids, mask, num_beams=num_beams, max_new_tokens=4, min_length=0)
    del model.decode_step
    return max(seen)


def test_cross_attention_state_does_not_grow_with_beams(make_checkpoint):
    path = make_checkpoint(init_std=0.2, d_model=64, decoder_layers=4, encoder_layers=1, ffn_dim=64)
    model = Bart.from_pretrained(path)
    ids = torch.randint(4, 500, (2, 400))
    mask = torch.ones_like(ids)
    cfg = model.config
    cross_bytes = cfg.decoder_layers * 2 * ids.numel() * cfg.d_model * 4  # one K and one V per layer, per input
    one = _decode_state_bytes(model, ids, mask, 1)
    eight = _decode_state_bytes(model, ids, mask, 8)
    assert one >= cross_bytes, "the cross-attention state should be part of what is live while decoding"
    # Per-beam copies would add 7 x cross_bytes; the self-attention cache and logits of 8 beams are far smaller.
    assert eight - one < 0.25 * cross_bytes, (one, eight, cross_bytes)


def test_exact_mode_holds_per_beam_cross_attention_state_for_one_layer_only(make_checkpoint):
    path = make_checkpoint(init_std=0.2, d_model=64, decoder_layers=4, encoder_layers=1, ffn_dim=64)
    model = Bart.from_pretrained(path, exact=True)
    ids = torch.randint(4, 500, (2, 400))
    mask = torch.ones_like(ids)
    cfg = model.config
    cross_bytes = cfg.decoder_layers * 2 * ids.numel() * cfg.d_model * 4  # all layers, once per input
    one_layer_per_beam = 2 * 8 * ids.numel() * cfg.d_model * 4  # one layer's K and V for 8 beams
    grown = _decode_state_bytes(model, ids, mask, 8) - _decode_state_bytes(model, ids, mask, 1)
    # transformers holds every layer per beam (7 x cross_bytes more than one copy); exact mode one layer's.
    assert one_layer_per_beam <= grown < one_layer_per_beam + 0.25 * cross_bytes, (grown, one_layer_per_beam)


def _steps_and_ids(model, ids, mask, cancelled, **options):
    """Working rows fed to each decoder step, the generated ids, and the `BeamTrace` of one generate call."""
    rows = []
    original = model.decode_step

    def spy(tokens, *args, **kwargs):
        rows.append(tokens.shape[0])
        return original(tokens, *args, **kwargs)

    model.decode_step = spy
    try:
        with BeamTrace() as trace:
            got = model.generate(ids, mask, cancelled=cancelled, **options)
        return rows, got, trace
    finally:
        del model.decode_step


def _unpadded(row: torch.Tensor, pad: int) -> list[int]:
    tokens = row.tolist()
    while tokens and tokens[-1] == pad:
        tokens.pop()
    return tokens


def _assert_rows_1_and_3_cancelled(model, ids, mask, got: torch.Tensor, trace, path: str, expected: torch.Tensor,
                                   **options) -> None:
    """Rows 0, 2 and 4 of `got` agree with transformers' `expected` (`assert_agrees`); rows 1 and 3 hold the
    start token alone."""
    pad, start = model.config.pad_token_id, model.generation_config.decoder_start_token_id
    assert_agrees(model, ids, mask, got, path, trace=trace, expected=expected, compare=[0, 2, 4], **options)
    for row in (1, 3):
        assert _unpadded(got[row], pad) == [start]


@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("lengths", [dict(min_length=12, max_length=12), dict(min_length=0, max_length=20)])
def test_cancelled_rows_leave_after_the_step_and_the_others_match_transformers(make_checkpoint, beams, lengths):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    model = Bart.from_pretrained(path)
    options = dict(num_beams=beams, **lengths)
    expected = reference_generate(path, ids, mask, **options)
    polls = []

    def cancelled():  # rows 1 and 3 are withdrawn once two decoder steps have run
        polls.append(len(polls))
        return {1, 3} if len(polls) >= 2 else set()

    rows, got, trace = _steps_and_ids(model, ids, mask, cancelled, **options)
    assert len(polls) == len(rows)  # polled once per decoder step
    assert rows[:2] == [5 * beams] * 2
    assert rows[2] <= 3 * beams  # gone from the very next step
    _assert_rows_1_and_3_cancelled(model, ids, mask, got, trace, path, expected, **options)


@pytest.mark.parametrize("beams", [1, 3])
def test_exact_mode_keeps_cancelled_rows_in_the_batch_and_the_others_bit_for_bit(make_checkpoint, beams):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    options = dict(num_beams=beams, min_length=0, max_length=20)
    expected = reference_generate(path, ids, mask, **options)
    model = Bart.from_pretrained(path, exact=True)
    rows, got, trace = _steps_and_ids(model, ids, mask, lambda: {1, 3}, **options)
    assert set(rows) == {5 * beams}  # nobody left the batch
    _assert_rows_1_and_3_cancelled(model, ids, mask, got, trace, path, expected, **options)


def test_cancelling_every_row_ends_the_call(make_checkpoint):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (2, 3), seed=4)
    model = Bart.from_pretrained(path)
    rows, got, _ = _steps_and_ids(model, ids, mask, lambda: {0, 1}, num_beams=2, min_length=30, max_length=30)
    assert rows == [4]
    assert got.shape == (2, 1)
