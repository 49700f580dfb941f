"""The static search (`Bart.static`): transformers' ids or near-ties (tests/bart_opt/agreement.py) on the
generation parity suite, fixed shapes
(finished inputs leave only with their bucket), cancellation, host syncs counted, and a decoder step
that `torch.compile(fullgraph=True)` takes."""

from __future__ import annotations

import os

import pytest
import torch

from bart_opt import Bart
from bart_opt.engine import static_generation
from bart_opt.bench.dispatch import counting
from bart_opt.engine.cache import StaticKVCache
from bart_opt.engine.static_generation import CHECK_EVERY, bucket
from tests.bart_opt.agreement import assert_agrees, generate_agreeing
from tests.bart_opt.reference import batch
from tests.bart_opt.engine.test_generation import (CASES, CHECKPOINTS, _assert_rows_1_and_3_cancelled, _steps_and_ids,
                                            reference_generate)

# transformers' own settings the default's suite does not cover, against transformers too.
STATIC_CASES = {
    **CASES,
    "several_eos_ids": dict(num_beams=3, eos_token_id=[2, 7, 11], min_length=4),
    "greedy_several_eos_ids": dict(num_beams=1, eos_token_id=[2, 7, 11], min_length=0),
    "several_forced_eos_ids": dict(num_beams=2, forced_eos_token_id=[2, 9], max_length=12, min_length=0),
    "no_eos": dict(num_beams=3, eos_token_id=None, forced_eos_token_id=None, max_length=15, min_length=0),
    "ngram_1": dict(num_beams=2, no_repeat_ngram_size=1, min_length=0, max_length=18),
    "ngram_3_greedy": dict(num_beams=1, no_repeat_ngram_size=3, min_length=10),
    "max_length_2": dict(num_beams=3, max_length=2, min_length=0),
}


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request, make_checkpoint):
    return make_checkpoint(**CHECKPOINTS[request.param])


@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_uneven_batch_matches_transformers(checkpoint, case):
    ids, mask = batch(checkpoint, (1, 5, 2, 3, 1), seed=3)
    generate_agreeing(Bart.from_pretrained(checkpoint, static=True), ids, mask, checkpoint, **STATIC_CASES[case])


@pytest.mark.parametrize("case", ["greedy", "checkpoint_defaults", "negative_length_penalty", "several_eos_ids"])
def test_batch_of_one_matches_transformers(checkpoint, case):
    ids, mask = batch(checkpoint, (3,), seed=5)
    generate_agreeing(Bart.from_pretrained(checkpoint, static=True), ids, mask, checkpoint, **STATIC_CASES[case])


@pytest.mark.parametrize("beams", [1, 4])
def test_finished_inputs_leave_only_when_the_batch_drops_to_a_smaller_bucket(make_checkpoint, monkeypatch, beams):
    """Every step runs at a bucket's rows; the batch shrinks only at checks, to a power of two of inputs."""
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 6, 2, 5, 1, 4, 3, 2), seed=3)
    kept = []
    keep = StaticKVCache.keep
    monkeypatch.setattr(StaticKVCache, "keep", lambda self, rows: (kept.append(len(rows)), keep(self, rows)))
    model = Bart.from_pretrained(path, static=True)
    options = dict(num_beams=beams, min_length=0)
    rows, got, trace = _steps_and_ids(model, ids, mask, None, **options)
    assert_agrees(model, ids, mask, got, path, trace=trace, **options)
    assert kept, "inputs finished at different steps: the batch should have shrunk"
    assert [k // beams for k in kept] == sorted({k // beams for k in kept}, reverse=True)
    assert all(k // beams in (4, 2, 1) for k in kept), kept  # buckets below the batch of 8
    changes = [i for i in range(1, len(rows)) if rows[i] != rows[i - 1]]
    assert changes and all((i - 1) % CHECK_EVERY == 0 for i in changes), (rows, changes)  # right after a check
    assert set(rows) == {8 * beams, *kept}


def test_buckets_are_powers_of_two_below_the_batch():
    assert [bucket(n, 48) for n in (48, 33, 32, 17, 9, 5, 3, 2, 1, 0)] == [48, 48, 32, 32, 16, 8, 4, 2, 1, 1]
    assert [bucket(n, 5) for n in (5, 4, 3, 1)] == [5, 4, 4, 1]


@pytest.mark.parametrize("beams", [1, 3])
def test_cancelled_rows_stop_after_the_step_and_the_others_match_transformers(make_checkpoint, beams):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    model = Bart.from_pretrained(path, static=True)
    options = dict(num_beams=beams, min_length=12, max_length=20)
    expected = reference_generate(path, ids, mask, **options)
    polls = []

    def cancelled():  # rows 1 and 3 are withdrawn once two decoder steps have run
        polls.append(len(polls))
        return {1, 3, 99} if len(polls) >= 2 else set()

    rows, got, trace = _steps_and_ids(model, ids, mask, cancelled, **options)
    assert len(polls) == len(rows)  # polled once per decoder step
    _assert_rows_1_and_3_cancelled(model, ids, mask, got, trace, path, expected, **options)
    assert rows[0] == 5 * beams and rows[-1] < 5 * beams, "the cancelled rows left with a bucket"


@pytest.mark.parametrize("beams", [1, 2])
def test_cancelling_every_row_ends_the_call_as_the_default_does(make_checkpoint, beams):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (2, 3), seed=4)
    model = Bart.from_pretrained(path)
    options = dict(num_beams=beams, min_length=30, max_length=30)
    _, expected, _ = _steps_and_ids(model, ids, mask, lambda: {0, 1}, **options)
    model.static = True
    rows, got, _ = _steps_and_ids(model, ids, mask, lambda: {0, 1}, **options)
    assert rows == [2 * beams]
    assert torch.equal(got, expected) and got.shape[1] == (1 if beams > 1 else 2)


def counted_before_and_after(make_checkpoint, switch: str, **modes):
    """The dispatch counts (`bart_opt.bench.dispatch.counting`) of one beam search on a padded batch of 4 in
    the modes `modes`, then with `switch` turned on too; asserts both agree with transformers (a second call
    each, outside the count: the agreement check's recording would be counted)."""
    path = make_checkpoint(init_std=0.2, eos_bias=2.0, decoder_layers=2)
    ids, mask = batch(path, (1, 5, 2, 3), seed=3)
    model = Bart.from_pretrained(path, **modes)
    options = dict(num_beams=4, min_length=0, max_length=40, no_repeat_ngram_size=3)
    with counting(model) as before:
        model.generate(ids, mask, **options)
    generate_agreeing(model, ids, mask, path, **options)
    setattr(model, switch, True)
    with counting(model) as after:
        model.generate(ids, mask, **options)
    generate_agreeing(model, ids, mask, path, **options)
    return before, after


def test_host_syncs_are_one_per_check_plus_a_constant(make_checkpoint):
    """Counted on the CPU: the default reads the device once a step (and its n-gram ban's `nonzero`, on a
    CPU), the static search once a check."""
    default, static = counted_before_and_after(make_checkpoint, "static")
    steps = static.steps
    assert steps == default.steps > 2 * CHECK_EVERY
    loop = lambda c: sum(n for key, n in c.syncs.items() if not key.startswith("prepare"))  # noqa: E731
    prepare = lambda c: sum(n for key, n in c.syncs.items() if key.startswith("prepare"))  # noqa: E731
    assert default.syncs["search: tolist"] == steps and loop(default) >= 2 * (steps - 1), default.syncs
    assert loop(static) <= steps // CHECK_EVERY + 2, static.syncs  # the checks, and reading the output's length
    assert prepare(static) <= 10, "checking the inputs and packing the encoder's rows"
    assert all(name.split(": ")[1] == "item" for name in static.syncs if not name.startswith("prepare"))


@pytest.mark.parametrize("short", [False, True], ids=["articles", "six-tokens"])
@pytest.mark.parametrize("el_attention", [False, True], ids=["standard", "el"])
def test_static_decoder_step_compiles_fullgraph_with_the_same_logits(make_checkpoint, monkeypatch, el_attention,
                                                                     short):
    """`torch.compile(fullgraph=True)` (inductor, on the CPU) of the static decoder step, over either
    cross-attention state (`bart_opt.engine.el_attention`): no graph break, the same logits as eager over
    several steps, and the same cache state. `six-tokens`: a (2, 6) batch, where inductor's code for the
    cache write as two `index_copy_` into strided views of the layer's tensor corrupted the heap
    ("malloc(): unaligned tcache chunk detected"); the cache writes one (1, N, 2, H, d) slab instead."""
    if "ATEN_CPU_CAPABILITY" in os.environ:
        # Under the AVX2 emulation (bart_opt.engine.hardware.AVX2_LIMITS) on an AVX-512 machine inductor emits AVX2
        # code over linear weights oneDNN packed for the machine's AVX-512: every logit is NaN (with
        # ATEN_CPU_CAPABILITY=avx2 alone too), while eager and inductor without prepacking agree to 2e-6.
        # The emulation is not faithful there; prepacking is inductor's choice, not a property of the step.
        monkeypatch.setattr(torch._inductor.config.cpp, "weight_prepack", False)
    path = make_checkpoint(init_std=0.2, d_model=32, encoder_layers=1, decoder_layers=2)
    model = Bart.from_pretrained(path, static=True, el_attention=el_attention)
    if short:
        ids = torch.randint(4, 100, (2, 6), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        mask[1, 4:] = 0
    else:
        ids, mask = batch(path, (2, 4), seed=1)
    beams = 2
    c = model.config

    def state():
        with torch.inference_mode():
            cross = model.cross_attention(model.encode(ids, mask), mask, beams=beams)
        cache = StaticKVCache(c.decoder_layers, ids.shape[0] * beams, c.decoder_attention_heads, 12,
                              c.d_model // c.decoder_attention_heads, dtype=model.dtype, device=model.device)
        return cross, cache

    def step(tokens, cross, cache):
        return model.decode_step(tokens, cross, cache)

    compiled = torch.compile(step, fullgraph=True)
    eager_state, compiled_state = state(), state()
    tokens = torch.full((ids.shape[0] * beams, 1), c.decoder_start_token_id)
    with torch.inference_mode():
        for _ in range(4):
            expected = step(tokens, *eager_state)
            got = compiled(tokens, *compiled_state)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            # compiled kernels may round otherwise: the token it picks is eager's best, or within rounding of it
            chosen = expected.gather(-1, got.argmax(-1, keepdim=True))[:, 0]  # (N,)
            assert bool((expected.max(-1).values - chosen <= 2e-5 * expected.abs().max()).all())
            tokens = expected.argmax(-1, keepdim=True)
    assert torch.equal(eager_state[1].position, compiled_state[1].position)
    torch.testing.assert_close(eager_state[1].kv[0], compiled_state[1].kv[0], atol=1e-5, rtol=1e-5)


def test_the_static_search_takes_no_graphs_off_cuda(make_checkpoint, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a CUDA graph API was called on a CPU run")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", refuse)
    monkeypatch.setattr(torch.cuda, "graph", refuse)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", refuse)
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (2, 3), seed=4)
    model = Bart.from_pretrained(path, static=True)
    generate_agreeing(model, ids, mask, path, num_beams=2, min_length=0)
    assert static_generation.step_graphs(model) is None and model.graph_stats is None


@pytest.mark.parametrize("search", ["beam", "greedy"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_static_search_differs_from_transformers_only_by_near_ties_at_d256(published_batch, dtype, search):
    """The published batch (tests/bart_opt/agreement.py), every beam step checked; identical counts against the
    default and transformers are figures (`python -m bart_opt.bench.fidelity --static --shape d256`, docs/gpu.md)."""
    batch = published_batch(dtype)
    model = Bart.from_pretrained(batch.path, dtype=getattr(torch, dtype), static=True)
    batch.run(model, search).report.assert_holds(f"static {dtype} {search}")
