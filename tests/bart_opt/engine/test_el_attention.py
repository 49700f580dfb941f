"""EL-attention (`bart_opt.engine.el_attention`): the algebra against the standard layer, its state, its
refusal with exact mode, generate's parity and its behaviour as inputs leave, are cancelled or split."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import AutoTokenizer

import bart_opt.engine.model as model_module
from bart_opt import Bart, InvalidRequest
from bart_opt.bench.fidelity import SHAPES, parse_args, strip
from bart_opt.demo import random_article
from bart_opt.engine.el_attention import BatchedELCrossAttention, SharedELCrossAttention
from bart_opt.pipeline.summarizer import Summarizer
from bart_opt.bench.near_ties import BeamTrace
from tests.bart_opt.agreement import assert_agrees, generate_agreeing
from tests.bart_opt.reference import batch
from tests.bart_opt.engine.test_generation import CASES, CHECKPOINTS, reference_generate
from tests.bart_opt.engine.test_packing import LENGTHS, padded_batch

# The largest |error| of the EL layer's output against the standard layer's, as a fraction of the
# largest |output|: float64 shows the algebra itself, the others the rounding of each dtype.
LAYER_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
BEAMS = 3


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint) -> str:
    return make_checkpoint(with_tokenizer=False, init_std=0.2, eos_bias=1.5, **SHAPES["small"])


@pytest.fixture(params=["per_input", "batched"])
def layout(request, monkeypatch) -> str:
    """The layout `Bart.cross_attention` picks: per input (a CPU) or the whole batch at once (off the
    CPU, forced here as the other modes' tests force it)."""
    if request.param == "batched":
        monkeypatch.setattr(model_module.packing_rules, "attends_per_input", lambda device: False)
    return request.param


def with_biases(model: Bart) -> Bart:
    """`model` with random non-zero biases on every cross-attention projection (checkpoints have zeros)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.decoder.layers:
            for proj in (layer.encoder_attn.q_proj, layer.encoder_attn.k_proj, layer.encoder_attn.v_proj,
                         layer.encoder_attn.out_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * 0.5)  # in place: stays fused
    return model


def load(path: str, dtype: torch.dtype = torch.float32, **modes) -> Bart:
    """`Bart.from_pretrained`, in float64 too (loaded in float32, then converted)."""
    if dtype == torch.float64:
        return Bart.from_pretrained(path, **modes).to(torch.float64)
    return Bart.from_pretrained(path, dtype=dtype, **modes)


def both_states(model: Bart, memory: torch.Tensor, mask: torch.Tensor, beams: int = BEAMS):
    """The standard and the EL cross-attention states of `model` over `memory` (B, S, D)."""
    with torch.inference_mode():
        standard = model.cross_attention(memory, mask, beams)
        model.el_attention = True
        try:
            return standard, model.cross_attention(memory, mask, beams)
        finally:
            model.el_attention = False


def layer_outputs(model: Bart, state, x: torch.Tensor) -> list[torch.Tensor]:
    """Every decoder layer's cross-attention output for queries `x` (B*beams, T, D), in float64."""
    with torch.inference_mode():
        return [state(layer.encoder_attn, x, i).double() for i, layer in enumerate(model.decoder.layers)]


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("dtype", list(LAYER_TOLERANCE), ids=str)
def test_el_layer_output_equals_the_standard_layers(checkpoint, layout, dtype, t):
    """With non-zero biases (b_k must cancel, b_v come through), a padded batch and several beams."""
    model = with_biases(load(checkpoint, dtype))
    ids, mask = padded_batch()
    with torch.inference_mode():
        memory = model.encode(ids, mask)  # (B, S, D)
    standard, el = both_states(model, memory, mask)
    assert type(el) is (SharedELCrossAttention if layout == "per_input" else BatchedELCrossAttention)
    x = torch.randn(ids.shape[0] * BEAMS, t, model.config.d_model, generator=torch.Generator().manual_seed(2))
    x = x.to(dtype)  # (B*beams, T, D)
    expected, got = layer_outputs(model, standard, x), layer_outputs(model, el, x)
    for a, b in zip(expected, got):
        assert (a - b).abs().max() <= LAYER_TOLERANCE[dtype] * a.abs().max(), (a - b).abs().max() / a.abs().max()
    if dtype in (torch.float16, torch.bfloat16):
        # Each against the float64 arithmetic on the same rounded weights and inputs: EL's rounding is the
        # standard layer's size, not larger.
        wide = copy.deepcopy(model).to(torch.float64)
        exact, _ = both_states(wide, memory.double(), mask)
        for truth, a, b in zip(layer_outputs(wide, exact, x.double()), expected, got):
            assert (b - truth).abs().max() <= 2 * (a - truth).abs().max()


def test_the_state_is_the_encoder_output_once_and_the_weights_are_views(checkpoint):
    ids, mask = padded_batch()
    for dtype in (torch.float32, torch.bfloat16):
        model = load(checkpoint, dtype)
        with torch.inference_mode():
            memory = model.encode(ids, mask)  # (B, S, D)
        _, el = both_states(model, memory, mask)
        d_model, s = model.config.d_model, ids.shape[1]
        if dtype == torch.float32:  # each input's real rows only, nothing to mask
            assert [(h.shape, m) for h, m in el.memory] == [((1, 1, n, d_model), None) for n in LENGTHS]
        else:  # half precision keeps and masks padding, as the default mode does
            assert [h.shape for h, _ in el.memory] == [(1, 1, s, d_model)] * len(LENGTHS)
            assert [s if m is None else int(m.sum()) for _, m in el.memory] == list(LENGTHS)  # None: no padding
        for i, (h, _) in enumerate(el.memory):
            assert torch.equal(h[0, 0, : LENGTHS[i]], memory[i, : LENGTHS[i]])
        assert len({h.untyped_storage().data_ptr() for h, _ in el.memory}) == len(LENGTHS), "one tensor per input"
        for layer, w in zip(model.decoder.layers, el.weights):
            fused = layer.encoder_attn.fused_weight.untyped_storage().data_ptr()
            assert {w.keys.untyped_storage().data_ptr(), w.values_t.untyped_storage().data_ptr()} == {fused}


def test_the_batched_state_is_the_padded_encoder_output_and_an_additive_mask(checkpoint, monkeypatch):
    monkeypatch.setattr(model_module.packing_rules, "attends_per_input", lambda device: False)
    model = load(checkpoint)
    ids, mask = padded_batch()
    with torch.inference_mode():
        memory = model.encode(ids, mask)  # (B, S, D)
    _, el = both_states(model, memory, mask)
    assert el.memory.shape == (len(LENGTHS), 1, ids.shape[1], model.config.d_model)
    assert el.memory.untyped_storage().data_ptr() == memory.untyped_storage().data_ptr(), "a view, not a copy"
    assert el.key_bias.shape == (len(LENGTHS), 1, 1, ids.shape[1]) and el.key_bias.dtype == memory.dtype
    bias = el.key_bias[:, 0, 0]  # (B, S)
    assert torch.equal(bias == 0, mask.bool()) and bool((bias[mask == 0] == -torch.inf).all())


def test_keep_attends_for_the_kept_inputs_as_a_state_built_for_them(checkpoint, layout):
    model = load(checkpoint)
    ids, mask = padded_batch()
    kept = torch.tensor([0, 2])
    with torch.inference_mode():
        memory = model.encode(ids, mask)  # (B, S, D)
        _, shrunk = both_states(model, memory, mask, beams=2)
        shrunk.keep(kept)
        _, alone = both_states(model, memory[kept], mask[kept], beams=2)
        x = torch.randn(4, 1, model.config.d_model, generator=torch.Generator().manual_seed(0))  # (B'*beams, 1, D)
        for a, b in zip(layer_outputs(model, shrunk, x), layer_outputs(model, alone, x)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))


def test_the_batched_call_compiles_as_one_graph(checkpoint, monkeypatch):
    """No graph break (no host sync, no data-dependent Python) in a batched call: fit for captured decoding.
    Compiled and eager agree to float32 rounding, not bit for bit: the compiled graph may pick other kernels
    for the same products (it did on an AMD EPYC, by up to 2.9e-5 of outputs of size ~1)."""
    monkeypatch.setattr(model_module.packing_rules, "attends_per_input", lambda device: False)
    model = load(checkpoint)
    ids, mask = padded_batch()
    with torch.inference_mode():
        memory = model.encode(ids, mask)
    _, el = both_states(model, memory, mask)
    attn = model.decoder.layers[1].encoder_attn
    x = torch.randn(len(LENGTHS) * BEAMS, 1, model.config.d_model, generator=torch.Generator().manual_seed(3))
    compiled = torch.compile(lambda x: el(attn, x, 1), backend="eager", fullgraph=True)
    with torch.inference_mode():
        expected = el(attn, x, 1)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_el_attention_and_exact_refuse_each_other_by_name(checkpoint):
    with pytest.raises(InvalidRequest, match="exact and el_attention exclude each other.*rounds differently") as error:
        Bart.from_pretrained(checkpoint, exact=True, el_attention=True)
    assert error.value.names == ("exact", "el_attention")
    model = Bart.from_pretrained(checkpoint, el_attention=True)
    for turn_exact_on in (lambda: setattr(model, "exact", True), lambda: setattr(model, "mode", "exact")):
        with pytest.raises(InvalidRequest, match="exclude each other"):
            turn_exact_on()
        assert model.el_attention and not model.exact
    model.el_attention = False
    model.exact = True
    with pytest.raises(InvalidRequest, match="exclude each other"):
        model.el_attention = True
    assert model.exact and not model.el_attention


def test_it_combines_with_the_fast_mode(checkpoint):
    model = Bart.from_pretrained(checkpoint, dtype=torch.float16, fast=True, el_attention=True)
    assert model.fast and model.el_attention
    ids, mask = padded_batch()
    with torch.inference_mode():
        state = model.cross_attention(model.encode(ids, mask), mask, BEAMS)
    # The fast mode leaves padded keys out in half precision: real rows only.
    assert [h.shape[2] for h, _ in state.memory] == list(LENGTHS) and all(m is None for _, m in state.memory)
    out = model.generate(ids, mask, num_beams=BEAMS, max_new_tokens=8, min_length=0)
    assert out.shape[0] == len(LENGTHS) and out.shape[1] > 1


def test_teacher_forced_forward_is_unchanged(checkpoint):
    model = Bart.from_pretrained(checkpoint)
    ids, mask = padded_batch()
    logits = model(ids, mask)
    model.el_attention = True
    assert torch.equal(model(ids, mask), logits)


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def parity_checkpoint(request, make_checkpoint):
    return make_checkpoint(**CHECKPOINTS[request.param])


GREEDY = sorted(case for case, options in CASES.items() if options.get("num_beams") == 1)
BEAM = sorted(set(CASES) - set(GREEDY))


@pytest.mark.parametrize("case", GREEDY + BEAM)
def test_it_agrees_with_transformers(parity_checkpoint, case):
    """The same ids as transformers' or near-ties (tests/bart_opt/agreement.py): EL computes cross-attention
    with other products than the standard layer's, so its rounding is its own."""
    ids, mask = batch(parity_checkpoint, (1, 5, 2, 3, 1), seed=3)
    model = Bart.from_pretrained(parity_checkpoint, el_attention=True)
    generate_agreeing(model, ids, mask, parity_checkpoint, **CASES[case])


@pytest.mark.parametrize("beams", [1, 4])
def test_inputs_leave_the_batch_as_they_finish(make_checkpoint, monkeypatch, layout, beams):
    path = make_checkpoint(**CHECKPOINTS["base"])  # ends sequences at varied, input-dependent lengths
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    cls = SharedELCrossAttention if layout == "per_input" else BatchedELCrossAttention
    kept, keep = [], cls.keep
    monkeypatch.setattr(cls, "keep", lambda self, rows: kept.append(len(rows)) or keep(self, rows))
    generate_agreeing(Bart.from_pretrained(path, el_attention=True), ids, mask, path, num_beams=beams, min_length=0)
    assert kept and kept[-1] < ids.shape[0], "inputs left the batch before the last step"


@pytest.mark.parametrize("beams", [1, 3])
def test_cancelled_inputs_leave_and_the_others_match_transformers(make_checkpoint, layout, beams):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    options = dict(num_beams=beams, min_length=12, max_length=12)
    expected = reference_generate(path, ids, mask, **options)
    model = Bart.from_pretrained(path, el_attention=True)
    polls = []

    def cancelled():  # rows 1 and 3 are withdrawn once two decoder steps have run
        polls.append(len(polls))
        return {1, 3} if len(polls) >= 2 else set()

    with BeamTrace() as trace:
        got = model.generate(ids, mask, cancelled=cancelled, **options)
    assert_agrees(model, ids, mask, got, path, trace=trace, expected=expected, compare=[0, 2, 4], **options)
    pad, start = model.config.pad_token_id, model.generation_config.decoder_start_token_id
    for row in (1, 3):
        assert strip(got[row], pad) == (start,)


class FakeOOM(RuntimeError):
    """Stands in for an out-of-memory error on a CPU."""


def test_micro_batches_and_oom_splits_give_the_summaries_of_one_batch(demo_checkpoint):
    rng = random.Random(1)
    texts = [random_article(rng, n) for n in (1, 8, 3, 14, 5, 2, 6)]
    model = Bart.from_pretrained(demo_checkpoint, el_attention=True)
    tokenizer = AutoTokenizer.from_pretrained(demo_checkpoint)
    gen = {"max_length": 16, "min_length": 4}
    whole = Summarizer(model, tokenizer, count_cpu_tensors=False).summarize(texts, **gen)
    model.el_attention = False
    assert whole.summaries == Summarizer(model, tokenizer, count_cpu_tensors=False).summarize(texts, **gen).summaries
    model.el_attention = True
    small = Summarizer(model, tokenizer, max_batch_size=2, count_cpu_tensors=False).summarize(texts, **gen)
    assert len(small.batches) > 2 and small.summaries == whole.summaries

    def inject(positions):
        if len(positions) > 2:
            raise FakeOOM("out of memory (injected)")

    split = Summarizer(model, tokenizer, count_cpu_tensors=False, oom_errors=(FakeOOM,),
                       before_model_call=inject).summarize(texts, **gen)
    assert split.oom_splits >= 2 and split.errors == [None] * len(texts)
    assert split.summaries == whole.summaries


def test_the_fidelity_bench_takes_el_as_a_mode():
    assert parse_args(["--modes", "default,el"]).modes == ["default", "el"]
    assert "el" in parse_args([]).modes
    with pytest.raises(SystemExit):
        parse_args(["--modes", "el,quantum"])


# ---------------------------------------------------------------- agreement at d_model 256


@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_el_attention_differs_from_transformers_only_by_near_ties_at_d256(published_batch, dtype, search):
    """The published batch (tests/bart_opt/agreement.py), every beam step checked; the identical counts are
    figures (`python -m bart_opt.bench.fidelity --shape d256 --modes default,el`, docs/el-attention.md)."""
    batch = published_batch(dtype)
    model = Bart.from_pretrained(batch.path, dtype=getattr(torch, dtype), el_attention=True)
    batch.run(model, search).report.assert_holds(f"EL-attention {dtype} {search}")
