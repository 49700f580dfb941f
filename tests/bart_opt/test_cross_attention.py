"""The default mode's cross-attention state: compact per-input keys/values in half precision on a
CPU, computing the same bits as the strided views they are copied from."""

from __future__ import annotations

import pytest
import torch

import bart_opt.cross_attention as cross_attention
from bart_opt import Bart
from bart_opt.bench_fidelity import SHAPES
from tests.bart_opt.test_packing import padded_batch


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_contiguous_keys_values_with_the_same_bits(checkpoint, dtype, monkeypatch):
    model = Bart.from_pretrained(checkpoint, dtype=dtype)
    ids, mask = padded_batch()
    with torch.inference_mode():
        cross = model.cross_attention(model.encode(ids, mask), mask, beams=3)
    assert all(k.is_contiguous() and v.is_contiguous() for layer in cross.kv for k, v, _ in layer)
    compact = first_steps_logits(model, ids, mask, beams=3)
    generated = model.generate(ids, mask, num_beams=3, max_length=24, min_length=0)

    monkeypatch.setattr(cross_attention, "stores_compact", lambda memory: False)
    with torch.inference_mode():
        views = model.cross_attention(model.encode(ids, mask), mask, beams=3)
    assert not any(k.is_contiguous() for layer in views.kv for k, _, _ in layer), "views of the fused product"
    assert all(torch.equal(a, b) for a, b in zip(compact, first_steps_logits(model, ids, mask, beams=3)))
    assert torch.equal(generated, model.generate(ids, mask, num_beams=3, max_length=24, min_length=0))


def test_float32_and_other_devices_keep_the_views():
    assert not cross_attention.stores_compact(torch.zeros(1, 2, 4))
    assert cross_attention.stores_compact(torch.zeros(1, 2, 4, dtype=torch.bfloat16))
    assert not cross_attention.stores_compact(torch.zeros(1, 2, 4, dtype=torch.bfloat16, device="meta"))
