"""The default mode's cross-attention state: compact per-input keys/values in half precision on a
CPU, computing the same bits as the strided views they are copied from; and the batched layout
used off the CPU, run here."""

from __future__ import annotations

import pytest
import torch

import bart_opt.engine.cross_attention as cross_attention
from bart_opt import Bart
from bart_opt.bench.fidelity import SHAPES
from tests.bart_opt.reference import batch
from tests.bart_opt.agreement import generate_agreeing
from tests.bart_opt.engine.test_packing import padded_batch


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint) -> str:
    return make_checkpoint(with_tokenizer=False, init_std=0.2, eos_bias=1.5, **SHAPES["small"])


def first_steps_logits(model, ids, mask, beams: int, steps: int = 3) -> list[torch.Tensor]:
    """Logits of `steps` decoder steps fed the same tokens, through a freshly built cross state."""
    with torch.inference_mode():
        memory = model.encode(ids, mask)  # (B, S, D)
        cross = model.cross_attention(memory, mask, beams)
        cache = model.new_cache(ids.shape[0] * beams, steps + 1)
        tokens = torch.full((ids.shape[0] * beams, 1), model.config.decoder_start_token_id)
        out = []
        for step in range(steps):
            out.append(model.decode_step(tokens, cross, cache))  # (B*beams, V)
            tokens = out[-1].argmax(dim=-1, keepdim=True)
        return out


@pytest.mark.parametrize("dtype,quantize", [(torch.bfloat16, None), (torch.float16, None), (torch.float32, None),
                                            (torch.float32, "int8")])
def test_the_cpu_keeps_contiguous_keys_values_with_the_same_bits(checkpoint, dtype, quantize, monkeypatch):
    model = Bart.from_pretrained(checkpoint, dtype=dtype, quantize=quantize)
    ids, mask = padded_batch()
    with torch.inference_mode():
        cross = model.cross_attention(model.encode(ids, mask), mask, beams=3)
    assert all(k.is_contiguous() and v.is_contiguous() for layer in cross.kv for k, v, _ in layer)
    compact = first_steps_logits(model, ids, mask, beams=3)
    generated = model.generate(ids, mask, num_beams=3, max_length=24, min_length=0)

    monkeypatch.setattr(cross_attention, "stores_compact", lambda memory: False)
    with torch.inference_mode():
        views = model.cross_attention(model.encode(ids, mask), mask, beams=3)
    if model.state_dtype is None:
        assert not any(k.is_contiguous() for layer in views.kv for k, _, _ in layer), "views of the fused product"
    else:  # the int8 mode's bfloat16 state is a converted copy either way
        assert {k.dtype for layer in views.kv for k, _, _ in layer} == {model.state_dtype}
    assert all(torch.equal(a, b) for a, b in zip(compact, first_steps_logits(model, ids, mask, beams=3)))
    assert torch.equal(generated, model.generate(ids, mask, num_beams=3, max_length=24, min_length=0))


def test_only_the_cpu_stores_compact_keys_values():
    assert cross_attention.stores_compact(torch.zeros(1, 2, 4))
    assert cross_attention.stores_compact(torch.zeros(1, 2, 4, dtype=torch.bfloat16))
    assert not cross_attention.stores_compact(torch.zeros(1, 2, 4, dtype=torch.bfloat16, device="meta"))


@pytest.fixture
def batched(monkeypatch):
    """The default mode with the layout it takes off the CPU: one attention call for the whole batch."""
    import bart_opt.engine.model as model_module

    monkeypatch.setattr(model_module.packing_rules, "attends_per_input", lambda device: False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_layout_attends_like_the_per_input_calls(checkpoint, dtype, monkeypatch):
    model = Bart.from_pretrained(checkpoint, dtype=dtype)
    ids, mask = padded_batch()
    per_input = first_steps_logits(model, ids, mask, beams=3)
    import bart_opt.engine.model as model_module

    monkeypatch.setattr(model_module.packing_rules, "attends_per_input", lambda device: False)
    with torch.inference_mode():
        cross = model.cross_attention(model.encode(ids, mask), mask, beams=3)
    assert type(cross) is cross_attention.BatchedCrossAttention
    assert [k.shape for k, _ in cross.kv] == [(ids.shape[0], model.config.decoder_attention_heads, ids.shape[1],
                                                model.config.d_model // model.config.decoder_attention_heads)] * len(cross.kv)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for a, b in zip(per_input, first_steps_logits(model, ids, mask, beams=3)):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_batched_layout_shrinks_to_the_kept_inputs(checkpoint, batched):
    """After `keep`, the state attends for the kept inputs as a state built for them alone does."""
    model = Bart.from_pretrained(checkpoint)
    ids, mask = padded_batch()
    kept = torch.tensor([0, 2])
    with torch.inference_mode():
        memory = model.encode(ids, mask)  # (B, S, D)
        shrunk = model.cross_attention(memory, mask, beams=2)
        shrunk.keep(kept)
        alone = model.cross_attention(memory[kept], mask[kept], beams=2)
        assert torch.equal(shrunk.pad_mask, mask[kept].bool())
        x = torch.randn(4, 1, model.config.d_model, generator=torch.Generator().manual_seed(0))  # (B'*beams, 1, D)
        for layer, attn in enumerate(model.decoder.layers):
            assert torch.equal(shrunk(attn.encoder_attn, x, layer), alone(attn.encoder_attn, x, layer))


def test_batched_layout_matches_transformers_as_inputs_leave(make_checkpoint, monkeypatch, batched):
    """Beams ending at different steps make inputs leave the batch (`keep`) during generation."""
    path = make_checkpoint(init_std=0.2, eos_bias=5.0)  # ends sequences at varied, input-dependent lengths
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    kept = []
    keep = cross_attention.BatchedCrossAttention.keep
    monkeypatch.setattr(cross_attention.BatchedCrossAttention, "keep",
                        lambda self, rows: kept.append(len(rows)) or keep(self, rows))
    generate_agreeing(Bart.from_pretrained(path), ids, mask, path, num_beams=4, min_length=0)
    assert kept and kept[-1] < ids.shape[0], "inputs left the batch before the last step"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_static_layout_attends_bit_for_bit_like_the_batched_one_with_its_mask_made_once(checkpoint, dtype):
    """The static search's state: the batched layout with the additive mask made once per call, not per attention call."""
    model = Bart.from_pretrained(checkpoint, dtype=dtype)
    ids, mask = padded_batch()
    with torch.inference_mode():
        memory = model.encode(ids, mask)  # (B, S, D)
        batched = cross_attention.BatchedCrossAttention.build([l.encoder_attn for l in model.decoder.layers], memory,
                                                              mask, beams=2)
        model.static = True
        static = model.cross_attention(memory, mask, beams=2)
        assert type(static) is cross_attention.StaticCrossAttention
        assert static.bias.dtype == dtype and static.bias.shape == (ids.shape[0], 1, 1, ids.shape[1])
        assert torch.equal(static.bias[:, 0, 0] == 0, mask.bool()) and torch.isinf(static.bias[:, 0, 0][mask == 0]).all()
        bias = static.bias
        x = torch.randn(ids.shape[0] * 2, 1, model.config.d_model, generator=torch.Generator().manual_seed(0)).to(dtype)
        for layer, attn in enumerate(model.decoder.layers):
            assert torch.equal(static(attn.encoder_attn, x, layer), batched(attn.encoder_attn, x, layer))
        assert static.bias is bias, "made once, reused by every layer and call"
        kept = torch.tensor([3, 1])
        static.keep(kept)
        batched.keep(kept)
        assert torch.equal(static.bias, bias[kept])
        for layer, attn in enumerate(model.decoder.layers):
            assert torch.equal(static(attn.encoder_attn, x[:4], layer), batched(attn.encoder_attn, x[:4], layer))
