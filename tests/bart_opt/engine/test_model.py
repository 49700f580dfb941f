"""Teacher-forced logits of bart_opt.Bart against transformers' BartForConditionalGeneration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import BartConfig

from bart_opt import Bart
from bart_opt.engine import native
from bart_opt.bench.fidelity import SHAPES, Workload, make_inputs, padded
from bart_opt.engine.config import UnsupportedConfigError
from bart_opt.engine.attention import Attention
from tests.bart_opt.reference import batch, reference_model

VARIANTS = {
    "default": dict(init_std=0.2),
    "deep_encoder_scaled_relu": dict(
        init_std=0.2, encoder_layers=3, decoder_layers=1, scale_embedding=True, activation_function="relu",
        encoder_attention_heads=8, decoder_attention_heads=2,
    ),
    "gelu_new_uneven_ffn": dict(init_std=0.2, activation_function="gelu_new", encoder_ffn_dim=48, decoder_ffn_dim=80),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, make_checkpoint):
    return make_checkpoint(**VARIANTS[request.param])


def test_logits_match_transformers_on_uneven_batch(variant):
    ids, mask = batch(variant, (1, 4, 2))
    assert (mask == 0).any(), "the batch must contain padding"
    with torch.no_grad():
        expected = reference_model(variant)(input_ids=ids, attention_mask=mask).logits
    got = Bart.from_pretrained(variant)(ids, mask)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_exact_mode_logits_equal_transformers_bit_for_bit(variant, dtype, monkeypatch):
    import bart_opt.engine.model as model_module

    monkeypatch.setattr(model_module, "FFN_CHUNK_TOKENS", 7)  # exact mode must not chunk
    ids, mask = batch(variant, (1, 4, 2))
    with torch.no_grad():
        expected = reference_model(variant, dtype)(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(Bart.from_pretrained(variant, dtype=dtype, exact=True)(ids, mask), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_exact_mode_logits_equal_transformers_at_bart_base_width(make_checkpoint, dtype):
    """At d_model 768 and a fidelity-sized batch (8 inputs of up to 120 tokens: 960 encoder rows), the
    bfloat16 GEMM on an AMX Xeon rounds a fused (K|V or Q|K|V) product's columns otherwise than
    separate products' (measured from 800 rows at K 768), and a packed batch's rows otherwise than the
    padded batch's, so exact mode must run neither there."""
    folder = make_checkpoint(with_tokenizer=False, init_std=0.2, d_model=768, encoder_layers=1, decoder_layers=1,
                             encoder_attention_heads=12, decoder_attention_heads=12, ffn_dim=3072,
                             vocab_size=2000, max_position_embeddings=128)
    inputs = make_inputs(BartConfig.from_pretrained(folder), Workload(n=8, min_len=60))
    ids, mask = padded(inputs, pad_id=1)
    assert ids.numel() >= 800 and (mask == 0).any()
    decoder = ids[:, :24].clone()  # (B, 24) teacher-forced decoder inputs
    with torch.inference_mode():
        expected = reference_model(folder, dtype)(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder).logits
        got = Bart.from_pretrained(folder, dtype=dtype, exact=True)(ids, mask, decoder_input_ids=decoder)
    assert torch.equal(got, expected)


def test_logits_with_explicit_decoder_input_and_no_mask(variant):
    ids, _ = batch(variant, (3,))
    dec = ids[:, :7].flip(1)
    with torch.no_grad():
        expected = reference_model(variant)(input_ids=ids, decoder_input_ids=dec).logits
    got = Bart.from_pretrained(variant)(ids, decoder_input_ids=dec)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_final_logits_bias_is_applied(demo_checkpoint):
    model = Bart.from_pretrained(demo_checkpoint)
    assert model.final_logits_bias.abs().sum() > 0
    ids, mask = batch(demo_checkpoint, (2,))
    with_bias = model(ids, mask)
    model.final_logits_bias.zero_()
    torch.testing.assert_close(model(ids, mask), with_bias - Bart.from_pretrained(demo_checkpoint).final_logits_bias[0])


def test_long_feed_forward_is_chunked_without_changing_results(demo_checkpoint, monkeypatch):
    import bart_opt.engine.model as model_module

    ids, mask = batch(demo_checkpoint, (6, 6, 6))
    model = Bart.from_pretrained(demo_checkpoint)
    whole = model(ids, mask)
    monkeypatch.setattr(model_module, "FFN_CHUNK_TOKENS", 7)
    torch.testing.assert_close(model(ids, mask), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_tracks_fp32(demo_checkpoint, dtype):
    ids, mask = batch(demo_checkpoint, (2, 3))
    half = Bart.from_pretrained(demo_checkpoint, dtype=dtype)
    assert half.dtype == dtype and all(p.dtype == dtype for p in half.parameters())
    full = Bart.from_pretrained(demo_checkpoint)(ids, mask)
    got = half(ids, mask)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert (got.float() - full).abs().max() < 0.15


def test_attention_mask_of_wrong_shape_is_refused(demo_checkpoint):
    model = Bart.from_pretrained(demo_checkpoint)
    ids, mask = batch(demo_checkpoint, (2, 3))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(ids, mask[:, :-1])


def test_input_longer_than_positions_is_refused(make_checkpoint):
    path = make_checkpoint(init_std=0.2, max_position_embeddings=16)
    model = Bart.from_pretrained(path)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.full((1, 17), 5))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(torch.full((1, 17), 5))


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.zeros((0, 5), dtype=torch.long), "empty"),
        (torch.zeros((2, 0), dtype=torch.long), "empty"),
        (torch.tensor([5, 6, 7]), "2-D"),
        (torch.tensor([[5, 100000]]), "outside the vocabulary"),
        (torch.tensor([[0.5, 1.0]]), "integer"),
    ],
)
def test_bad_input_ids_are_refused(demo_checkpoint, ids, message):
    model = Bart.from_pretrained(demo_checkpoint)
    with pytest.raises(ValueError, match=message):
        model(ids)


def test_row_without_tokens_is_refused(demo_checkpoint):
    model = Bart.from_pretrained(demo_checkpoint)
    ids, mask = batch(demo_checkpoint, (2, 3))
    mask[1] = 0
    with pytest.raises(ValueError, match=r"rows \[1\] have no tokens"):
        model.generate(ids, mask)


def test_unsupported_config_is_refused(make_checkpoint, tmp_path):
    import json
    import shutil

    src = make_checkpoint(init_std=0.2)
    for key, value, message in [
        ("activation_function", "softplus", "activation_function"),
        ("normalize_before", True, "normalize_before"),
        ("tie_word_embeddings", False, "tie_word_embeddings"),
    ]:
        dst = tmp_path / key
        shutil.copytree(src, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg[key] = value
        (dst / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(UnsupportedConfigError, match=message):
            Bart.from_pretrained(str(dst))


def test_exact_and_fast_exclude_each_other(demo_checkpoint):
    with pytest.raises(ValueError, match="exact and fast exclude each other: exact mode gives"):
        Bart.from_pretrained(demo_checkpoint, exact=True, fast=True)
    model = Bart.from_pretrained(demo_checkpoint, fast=True)
    with pytest.raises(ValueError, match="exact and fast exclude each other: fast is on"):
        model.exact = True
    assert model.fast and not model.exact
    model.fast, model.exact = False, True
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    assert attns and all(a.exact and not a.fast for a in attns)
    model.mode = "fast"  # the other mode is turned off first
    assert (model.mode, model.exact) == ("fast", False) and all(a.fast and not a.exact for a in attns)
    with pytest.raises(ValueError, match="not one of"):
        model.mode = "quick"


def test_fast_mode_decodes_through_the_kernel_over_real_keys_only(make_checkpoint, monkeypatch):
    """bfloat16 at a real width, a padded batch, beam search: every decoding attention call goes to
    bart_opt's kernel, cross-attention sees each input's real keys only, and no attention call anywhere
    gets a padding mask."""
    if native.kernel() is None:
        pytest.skip("bart_opt's attention kernel is not available here (no AVX512-BF16 or no compiler)")
    work = Workload()
    model = Bart.from_pretrained(make_checkpoint(with_tokenizer=False, init_std=0.2, **SHAPES["d256"]),
                                 dtype=torch.bfloat16, fast=True)
    inputs = make_inputs(model.config, work)[: work.batch_size]
    ids, mask = padded(inputs, model.config.pad_token_id)
    assert (mask == 0).any()
    calls, masks = [], []
    kernel, sdpa = native.decode_attention, F.scaled_dot_product_attention

    def spy_kernel(q, k, v, scale, out=None, rows=None):
        calls.append((tuple(q.shape), tuple(k.shape), rows is not None))
        return kernel(q, k, v, scale, out, rows)

    def spy_sdpa(q, k, v, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(native, "decode_attention", spy_kernel)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy_sdpa)
    out = model.generate(ids, mask, **work.settings(work.num_beams))
    assert out.shape[1] > 40
    layers, heads = model.config.decoder_layers, model.config.decoder_attention_heads
    cross = [c for c in calls if c[0][0] == 1 and c[0][2] == work.num_beams]  # one input's beams: (1, H, beams, d)
    self_attention = [c for c in calls if c not in cross]
    assert {c[1][2] for c in cross} == {len(x) for x in inputs}, "each input's real keys, no padding"
    assert len(cross) >= len(inputs) * layers * 40 and len(self_attention) >= layers * 40
    assert all(q[2] == 1 and q[1] == heads for q, _, _ in self_attention)
    assert all(indirect for _, _, indirect in self_attention), "the cache is read through its history table"
    assert not any(indirect for _, _, indirect in cross)
    assert masks and all(m is None for m in masks), "the encoder's attention leaves padded keys out too"



@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fast_mode_leaves_padded_keys_out_in_half_precision(make_checkpoint, monkeypatch, dtype):
    """On any CPU (kernel or not): no attention call gets a padding mask, and cross-attention keys are each
    input's real tokens (the default masks padded keys in half precision, as transformers does)."""
    model = Bart.from_pretrained(make_checkpoint(init_std=0.2), dtype=dtype, fast=True)
    monkeypatch.setattr(native, "kernel", lambda: None)  # torch's kernel throughout, as without AVX512-BF16
    ids = torch.tensor([[0, 5, 9, 13, 21, 2], [0, 7, 2, 1, 1, 1]])
    mask = (ids != model.config.pad_token_id).long()
    keys, masks = [], []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        keys.append(k.shape[2])
        masks.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    encoder_calls = 2 * model.config.encoder_layers  # the encoder attends input by input, first
    model.generate(ids, mask, num_beams=2, max_new_tokens=4, min_length=0)
    assert masks and all(m is None for m in masks)
    assert keys[:encoder_calls] == [6, 3] * model.config.encoder_layers, "each input's real tokens only"
    model.fast = False
    keys.clear()
    masks.clear()
    model.generate(ids, mask, num_beams=2, max_new_tokens=4, min_length=0)
    assert any(m is not None for m in masks), "the default masks padded keys in half precision"
    assert keys[:encoder_calls] == [6, 6] * model.config.encoder_layers


def test_static_combines_with_the_default_and_fast_but_not_exact(demo_checkpoint):
    with pytest.raises(ValueError, match="exact and static exclude each other: exact mode gives"):
        Bart.from_pretrained(demo_checkpoint, exact=True, static=True)
    model = Bart.from_pretrained(demo_checkpoint, static=True)
    with pytest.raises(ValueError, match="exact and static exclude each other: static is on"):
        model.exact = True
    with pytest.raises(ValueError, match="exact and static exclude each other: static is on"):
        model.mode = "exact"
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    assert model.static and all(a.static for a in attns)
    model.fast = True
    assert (model.mode, model.static) == ("fast", True)
    model.static = False
    assert not any(a.static for a in attns)
    model.fast, model.exact = False, True
    with pytest.raises(ValueError, match="static and exact exclude each other: exact is on"):
        model.static = True
    assert model.exact and not model.static


def test_exact_forward_equals_transformers_under_avx2_limits(make_checkpoint):
    """Exact mode's logits bit for bit with every library limited to AVX2 (`bart_opt.engine.hardware.AVX2_LIMITS`, a
    fresh process): MKL's AVX2 code rounds one fused Q/K/V product otherwise than three, and a row of packed
    inputs otherwise than of the padded batch (7e-7 and 2.5e-6 apart here), so exact mode does neither there."""
    import json
    import os
    import subprocess
    import sys

    from bart_opt.engine.hardware import AVX2_LIMITS

    path = make_checkpoint(init_std=0.2)
    code = f"""
import json, torch
from transformers import BartForConditionalGeneration
from bart_opt import Bart
from bart_opt.engine import hardware
from tests.bart_opt.reference import batch
torch.set_num_threads(1)
ids, mask = batch({path!r}, (2, 9, 4, 6), seed=0)
dec = ids[:, :20]
hf = BartForConditionalGeneration.from_pretrained({path!r}).eval()
ours = Bart.from_pretrained({path!r}, exact=True)
short, short_mask = batch({path!r}, (1, 4, 2), seed=0)  # packed rows in the other modes
with torch.inference_mode():
    same = torch.equal(hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits,
                       ours(ids, attention_mask=mask, decoder_input_ids=dec))
    same = same and torch.equal(hf(input_ids=short, attention_mask=short_mask).logits, ours(short, short_mask))
print(json.dumps({{"isa": hardware.probe().isa, "same": same}}))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **AVX2_LIMITS},
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.splitlines()[-1]) == {"isa": "AVX2", "same": True}


def test_the_fp16_clamp_decides_on_the_device():
    """transformers' clamp of overflowed fp16 encoder activations, with no read of the device (`torch.where` on
    the 0-d verdict): it read the device once per encoder layer."""
    from bart_opt.bench.dispatch import DispatchCounter
    from bart_opt.engine.model import _clamp_fp16

    finite = torch.tensor([[1.0, -65000.0, 3.5]], dtype=torch.float16)
    overflowed = torch.tensor([[1.0, float("inf"), -float("inf")]], dtype=torch.float16)
    with DispatchCounter() as counter:
        kept, clamped = _clamp_fp16(finite), _clamp_fp16(overflowed)
    assert counter.syncs == {}
    limit = torch.finfo(torch.float16).max - 1000
    assert torch.equal(kept, finite) and torch.equal(clamped, overflowed.clamp(-limit, limit))
    assert _clamp_fp16(torch.tensor([float("inf")])).isinf().all(), "float32 is not clamped"
