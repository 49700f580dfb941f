"""The projection kernels: fused Q/K/V without a second weight copy (in exact mode only where bit-identical),
oneDNN only in the default mode, exact mode's logits transformers' one product then the bias, and oneDNN's
primitive caches bounded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from bart_opt import Bart
from bart_opt.engine import hardware
from bart_opt.bench.fidelity import SHAPES
from bart_opt.engine.kernels import ONEDNN, PRIMITIVE_CACHE_VARIABLES, linear, uses_onednn
from bart_opt.engine.packing import exact_reshapes


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint) -> str:
    return make_checkpoint(with_tokenizer=False, init_std=0.2, **SHAPES["small"])


@pytest.mark.parametrize("rows", [1, 2, 7, 64, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_exact_mode_fuses_projections_only_where_they_equal_separate_ones_bit_for_bit(checkpoint, rows, dtype):
    """Where exact mode fuses (float32 and float16 on AVX-512) the fused product is the separate ones';
    in bfloat16 (AMX rounds a wider product otherwise at K 768: test_model's bart-base-width test) and
    below AVX-512 it runs the separate ones."""
    model = Bart.from_pretrained(checkpoint, dtype=dtype, exact=True)
    x = torch.randn(1, rows, model.config.d_model, dtype=dtype)
    assert exact_reshapes(x.device, dtype) == (hardware.probe().avx512 and dtype != torch.bfloat16)
    with torch.inference_mode():
        for attn, names in ((model.encoder.layers[0].self_attn, ("q_proj", "k_proj", "v_proj")),
                            (model.decoder.layers[1].encoder_attn, ("k_proj", "v_proj"))):
            fused = attn.project(x)
            separate = [F.linear(x, getattr(attn, n).weight, getattr(attn, n).bias) for n in names]
            assert len(fused) == len(names) and all(torch.equal(a, b) for a, b in zip(fused, separate))


def test_fused_weights_are_views_of_one_tensor_and_survive_conversion(checkpoint):
    model = Bart.from_pretrained(checkpoint)
    attn = model.decoder.layers[0].self_attn
    before = model.weights_bytes()
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.fused_weight.untyped_storage().data_ptr()
    # 4 self-attentions: 6 tensors in 2 storages each; 2 cross-attentions: 4 tensors in 2 each.
    assert len(storages) == len(list(model.parameters())) - 4 * 4 - 2 * 2, "fused, not copied"
    model.to(torch.bfloat16)
    assert attn.fused_weight.dtype == torch.bfloat16 and model.weights_bytes() == before // 2
    assert attn.v_proj.weight.untyped_storage().data_ptr() == attn.fused_weight.untyped_storage().data_ptr()
    with torch.no_grad():
        attn.v_proj.weight.zero_()  # writes through to the fused weight
    assert bool((attn.fused_weight[-attn.v_proj.weight.shape[0]:] == 0).all())


def test_loading_a_state_dict_fuses_the_projections_again(checkpoint):
    model, other = Bart.from_pretrained(checkpoint), Bart.from_pretrained(checkpoint)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    model.load_state_dict(other.state_dict(), assign=True)
    attn = model.encoder.layers[1].self_attn
    assert torch.equal(attn.fused_weight[: attn.q_proj.weight.shape[0]], other.encoder.layers[1].self_attn.q_proj.weight)
    assert attn.k_proj.weight.untyped_storage().data_ptr() == attn.fused_weight.untyped_storage().data_ptr()


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN")
def test_fast_linear_is_onednn_in_float32_and_bfloat16_and_close_to_f_linear():
    x, w, b = torch.randn(5, 48, 256), torch.randn(512, 256), torch.randn(512)
    assert uses_onednn(x) and not uses_onednn(x.half())
    assert uses_onednn(x.bfloat16()) == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    with torch.inference_mode():
        fast, plain = linear(x, w, b, fast=True), linear(x, w, b, fast=False)
        torch.testing.assert_close(fast, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
        assert torch.equal(plain, F.linear(x, w, b))
        for rows in (1, 7, 48, 300):  # bfloat16: oneDNN's inner product (or F.linear itself) gives F.linear's bits
            half = x[0, :rows].bfloat16(), w.bfloat16(), b.bfloat16()
            assert torch.equal(linear(*half, fast=True), F.linear(*half))
            assert torch.equal(linear(*half[:2], None, fast=True), F.linear(*half[:2]))


# In a fresh process: the RSS (MB) that 500 new row counts through the default mode's oneDNN kernel add.
NEW_SHAPES = """
import torch
from bart_opt.engine.kernels import linear
from bart_opt.engine.memory import rss_bytes
torch.set_num_threads(1)
weight, bias = torch.randn(64, 32), torch.randn(64)
with torch.no_grad():
    linear(torch.randn(8, 32), weight, bias, fast=True)
    start = rss_bytes()
    for rows in range(16, 516):
        linear(torch.randn(rows, 32), weight, bias, fast=True)
print((rss_bytes() - start) / 1e6)
"""


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN")
def test_new_shapes_grow_memory_only_up_to_the_primitive_cache_bound():
    """Each new shape leaves a primitive in oneDNN's and ideep's caches (about 0.6 MB whatever the weight):
    at their own 1,024 entries 500 shapes add about 290 MB; at bart_opt's bound (64) they stop near 50 MB."""
    def growth(capacity: str | None) -> float:
        env = {k: v for k, v in os.environ.items() if k not in PRIMITIVE_CACHE_VARIABLES}
        env.update({name: capacity for name in PRIMITIVE_CACHE_VARIABLES} if capacity else {})
        done = subprocess.run([sys.executable, "-c", NEW_SHAPES], env={**env, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return float(done.stdout)

    bounded, unbounded = growth(None), growth("1024")
    assert bounded < 90 and unbounded > 200, (bounded, unbounded)


def test_default_bfloat16_logits_add_the_bias_after_the_product_as_transformers(checkpoint):
    model = Bart.from_pretrained(checkpoint, dtype=torch.bfloat16)
    with torch.no_grad():
        model.final_logits_bias.normal_()
    hidden = torch.randn(48, model.config.d_model, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(model.logits(hidden), F.linear(hidden, model.shared.weight) + model.final_logits_bias[0])


@pytest.mark.parametrize("rows", [1, 3, 48])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_logits_are_transformers_one_product_then_the_bias(checkpoint, rows, dtype):
    """On the suite's two threads too: column blocks of the vocabulary gave other bits for one row there."""
    model = Bart.from_pretrained(checkpoint, dtype=dtype, exact=True)
    with torch.no_grad():
        model.final_logits_bias.normal_()
    hidden = torch.randn(rows, model.config.d_model, dtype=dtype)
    with torch.inference_mode():
        expected = F.linear(hidden, model.shared.weight) + model.final_logits_bias[0]  # transformers' order
        assert torch.equal(model.logits(hidden), expected)
        model.exact = False
        torch.testing.assert_close(model.logits(hidden), expected, atol=1e-3, rtol=1e-3)
