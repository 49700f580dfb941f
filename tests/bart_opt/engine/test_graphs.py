"""CUDA graphs of the static search's step (`bart_opt.engine.graphs`): eager and untouched off CUDA; on CUDA
(the tests named *cuda*, run by `python -m bart_opt.bench.device`) graph replays that give the eager
static search's ids bit for bit (in the graphs' own shapes and buffers: `EagerSteps`), without a host
sync, kept from call to call, and the default's length-penalty rounding; at what the benchmark runs
(float16, a 50,265-token vocabulary whose beam `topk` spans 201,060 scores, heads of 64, EL-attention's
1,024-wide attention) as well as at the tiny float32 checkpoints."""

from __future__ import annotations

import pytest
import torch

import bart_opt.engine.graphs as graphs
from bart_opt import Bart
from bart_opt.engine.generation import HostLength
from bart_opt.engine.graphs import EagerSteps, StepGraphs, strict_replays, uses_graphs
from bart_opt.engine.static_generation import DeviceLength
from tests.bart_opt.reference import batch
from tests.bart_opt.engine.test_generation import CASES, CHECKPOINTS

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_off_cuda_the_step_runs_eagerly_once_per_run():
    calls = []
    steps = StepGraphs(torch.device("cpu"), backend=EagerSteps())
    steps.begin_call()
    with strict_replays():
        for key in (4, 4, 2, 2, 2):
            steps.run(key, lambda: calls.append(1))
    assert calls == [1] * 5 and steps.last_call["keys"] == [4, 2] and steps.last_call["replays"] == 3
    assert uses_graphs(torch.device("cuda", 0)) and not uses_graphs(torch.device("cpu"))


def test_strict_replays_is_scoped():
    assert not graphs._STRICT.get()
    with strict_replays():
        assert graphs._STRICT.get()
        with strict_replays():
            assert graphs._STRICT.get()
        assert graphs._STRICT.get()
    assert not graphs._STRICT.get()


@needs_cuda
@pytest.mark.parametrize("penalty", [2.0, 1.0, 0.5, -1.0, -0.5, 1.7])
def test_cuda_device_length_penalizes_as_a_python_scalar_division_does(penalty):
    """On CUDA torch multiplies by the reciprocal of a Python-scalar divisor; the device-side table must match."""
    from bart_opt.engine.spec import GenerationSpec

    spec = GenerationSpec(num_beams=4, max_length=150, min_length=0, length_penalty=penalty, no_repeat_ngram_size=0,
                          early_stopping=True, forced_bos_token_id=None, forced_eos_token_id=None,
                          decoder_start_token_id=2, eos_token_id=(2,), pad_token_id=1)
    scores = -torch.rand(64, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 50
    host, device = HostLength(spec), DeviceLength(spec, torch.device("cuda"))
    for _ in range(spec.max_length - 2):
        host.advance()
        device.advance()
        assert torch.equal(device.finished_scores(scores), host.finished_scores(scores)), host.value
        assert torch.equal(device.best_running(scores), host.best_running(scores)), host.value


def _cuda_model(path: str, static: bool, dtype=torch.float32, el_attention: bool = False):
    return Bart.from_pretrained(path, device="cuda", dtype=dtype, static=static, el_attention=el_attention)


@needs_cuda
@pytest.mark.parametrize("el_attention", [False, True], ids=["standard", "el"])
@pytest.mark.parametrize("beams", [1, 4])
def test_cuda_graph_replays_equal_the_eager_static_search_across_buckets(make_checkpoint, beams, el_attention):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = (t.cuda() for t in batch(path, (1, 6, 2, 5, 1, 4, 3, 2), seed=3))
    model = _cuda_model(path, static=True, el_attention=el_attention)
    options = dict(num_beams=beams, min_length=0)
    with strict_replays():  # a host sync inside a warm-up or a replay raises
        got = model.generate(ids, mask, **options)
        call = model.graph_stats["last_call"]
        rows = [key[2] for key in call["keys"]]
        assert call["captures"] >= 2 and rows == sorted(rows, reverse=True), "largest bucket first, then smaller"
        again = model.generate(ids, mask, **options)
    assert model.graph_stats["last_call"]["captures"] == 0 and torch.equal(again, got), "the graphs outlive a call"
    model._step_graphs = StepGraphs(model.device, backend=EagerSteps())  # the same shapes and buffers, eagerly
    assert torch.equal(got, model.generate(ids, mask, **options))


@needs_cuda
def test_cuda_a_step_that_syncs_fails_under_strict_replays():
    flag = torch.ones(1, device="cuda")
    steps = StepGraphs(torch.device("cuda"))
    steps.begin_call()
    with strict_replays(), pytest.raises(RuntimeError):
        steps.run("key", lambda: bool(flag.sum() > 0))  # the warm-up step reads the device on the host


@needs_cuda
@pytest.mark.parametrize("case", ["greedy", "checkpoint_defaults", "early_stopping_never", "greedy_ngram_min_length"])
def test_cuda_static_search_matches_transformers_in_float32(make_checkpoint, case):
    from transformers import BartForConditionalGeneration

    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = (t.cuda() for t in batch(path, (1, 5, 2, 3, 1), seed=3))
    reference = BartForConditionalGeneration.from_pretrained(path).cuda().eval()
    with torch.no_grad():
        expected = reference.generate(input_ids=ids, attention_mask=mask, **CASES[case])
    with strict_replays():
        got = _cuda_model(path, static=True).generate(ids, mask, **CASES[case])
    assert torch.equal(got, expected)


# What the benchmark runs: half precision, bart-large's vocabulary (beam search's `topk` over 4 x 50,265
# scores), heads of 64 (d_model 128, 2 heads), and EL-attention attending at the model's full width (its
# queries are d_model wide: 1,024 at bart-large, where the memory-efficient kernel takes no such head).
BENCH_SHAPES = {
    "heads_64": dict(init_std=0.05, eos_bias=1.5, with_tokenizer=False, vocab_size=50265, d_model=128,
                     encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                     ffn_dim=256, max_position_embeddings=256),
    "width_1024": dict(init_std=0.02, eos_bias=1.5, with_tokenizer=False, vocab_size=50265, d_model=1024,
                       encoder_layers=1, decoder_layers=1, encoder_attention_heads=16, decoder_attention_heads=16,
                       ffn_dim=1024, max_position_embeddings=256),
}


def _bench_batch(config, inputs: int, length: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, config.vocab_size, (inputs, length), generator=gen)
    mask = torch.ones_like(ids)
    for i, n in enumerate(torch.randint(length // 3, length + 1, (inputs,), generator=gen).tolist()):
        mask[i, n:] = 0
        ids[i, n:] = config.pad_token_id
    return ids.cuda(), mask.cuda()


@needs_cuda
@pytest.mark.parametrize("shape, el_attention", [("heads_64", False), ("heads_64", True), ("width_1024", True)],
                         ids=["heads_64", "heads_64-el", "width_1024-el"])
def test_cuda_float16_graphs_equal_the_eager_search_at_the_benchmarks_widths(make_checkpoint, shape, el_attention):
    """float16, 4 beams over a 50,265-token vocabulary, the CNN settings shortened: graph replays (two calls,
    the second capturing nothing) equal the same shapes run eagerly bit for bit, and the static search's
    output lengths stay the default's within a token a document (near-ties resolve otherwise in fp16)."""
    path = make_checkpoint(**BENCH_SHAPES[shape])
    model = _cuda_model(path, static=True, dtype=torch.float16, el_attention=el_attention)
    ids, mask = _bench_batch(model.config, 6, 75, seed=0)
    options = dict(num_beams=4, min_length=8, max_length=30, no_repeat_ngram_size=3, length_penalty=2.0)
    with strict_replays():
        got = model.generate(ids, mask, **options)
        assert model.graph_stats["last_call"]["captures"] >= 1
        assert torch.equal(model.generate(ids, mask, **options), got)
        assert model.graph_stats["last_call"]["captures"] == 0
    model._step_graphs = StepGraphs(model.device, backend=EagerSteps())
    assert torch.equal(model.generate(ids, mask, **options), got)
    model.static = False
    default = model.generate(ids, mask, **options)
    pad = model.config.pad_token_id
    lengths = lambda out: [int((row != pad).sum()) for row in out]  # noqa: E731
    assert abs(sum(lengths(got)) - sum(lengths(default))) <= len(lengths(got)), (lengths(got), lengths(default))


@needs_cuda
def test_cuda_float32_static_search_equals_the_default_at_bart_large_vocabulary(make_checkpoint):
    """The device check's second gate at a test's size: in float32 the static search (graphs) gives the
    default's ids."""
    path = make_checkpoint(**BENCH_SHAPES["heads_64"])
    model = _cuda_model(path, static=True)
    ids, mask = _bench_batch(model.config, 8, 75, seed=1)
    options = dict(num_beams=4, min_length=8, max_length=30, no_repeat_ngram_size=3, length_penalty=2.0)
    with strict_replays():
        got = model.generate(ids, mask, **options)
    model.static = False
    assert torch.equal(got, model.generate(ids, mask, **options))
