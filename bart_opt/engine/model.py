"""BART in plain PyTorch, written for inference memory.

Attribute names follow the Hugging Face checkpoint keys (minus their `model.` prefix), so
`loading.py` needs no renaming table. What differs from transformers' modeling code:

* attention runs through fused `scaled_dot_product_attention`; weights are never materialized,
  and the decoder's causal mask is implicit (`is_causal`);
* the encoder's linear layers run on the real tokens only, packed (`bart_opt.engine.packing`), and
  Q/K/V (cross-attention K/V) are one product over weights stored once (`Attention.fuse`);
* cross-attention keys/values exist once per input and the beams of one input are folded into
  the query-length axis, so nothing of the encoder side is copied per beam
  (`bart_opt.engine.cross_attention`);
* logits come from the shared embedding (no lm_head weight), during generation only for the
  last position;
* the feed-forward block runs in row chunks, so its 4x-wide activation never exists for a whole
  long batch at once;
* in float32 on a CPU the default mode's products run through oneDNN (`bart_opt.engine.kernels`), and
  its attention leaves padded keys out instead of masking them.

`exact=True` keeps what leaves the arithmetic alone and gives every kernel the inputs
transformers gives it instead: MKL's products (on packed rows and as fused projections only where
`packing.exact_reshapes` measured the same bits), padded attention rectangles with a materialized
`(B, 1, S, S)` encoder mask, per-beam cross-attention keys/values (one layer at a time), un-chunked
feed-forward blocks.

`fast=True` goes the other way from the default, on a CPU: half precision leaves padded keys out as
float32 does, and in bfloat16 with AVX512-BF16 decoding attention runs through bart_opt's own
kernel (`bart_opt.engine.native`). Its ids are not transformers' (nor the default's); their agreement
with float32 is measured and published. On a GPU it is the default mode: there attention makes one
call for the whole batch, padded keys masked (`bart_opt.engine.packing.attends_per_input`).

`static=True` (not with `exact`) generates with that layout on every device, at fixed shapes and with no
host syncs between its checks; on CUDA each decoder step is a CUDA graph replay
(`bart_opt.engine.static_generation`, `bart_opt.engine.graphs`, docs/gpu.md).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BartConfig, GenerationConfig

from bart_opt.engine import hardware, native
from bart_opt.engine.attention import Attention
from bart_opt.engine.buffers import Buffers
from bart_opt.engine.cache import KVCache, StaticKVCache
from bart_opt.engine.config import ACTIVATIONS, validate_config
from bart_opt.engine.cross_attention import (
    BatchedCrossAttention,
    CrossAttention,
    ExactCrossAttention,
    SharedCrossAttention,
    StaticCrossAttention,
)
from bart_opt.engine.el_attention import BatchedELCrossAttention, SharedELCrossAttention
from bart_opt.engine.generation import Cancelled, generate
from bart_opt.engine.static_generation import generate_static
from bart_opt.engine.inputs import check_inputs, shift_right
from bart_opt.engine.kernels import Linear, linear, uses_onednn
from bart_opt.engine.loading import Checkpoint, load_pretrained
from bart_opt.engine.memory import LoggingMixin
from bart_opt.engine import packing as packing_rules  # patched as a module by the GPU-layout tests and benches
from bart_opt.engine.packing import Packing
from bart_opt.engine.options import MODE_FIELDS, EngineOptions, check_modes
from bart_opt.engine.quantize import packed_bytes
from bart_opt.engine.spec import GenerationSpec

POSITION_OFFSET = 2  # BART's learned positions start at row 2 of the table (a fairseq legacy)
FFN_CHUNK_TOKENS = 2048  # rows of the feed-forward block computed at once


def feed_forward(x: torch.Tensor, fc1: nn.Linear, fc2: nn.Linear, act, chunked: bool = True) -> torch.Tensor:
    """`fc2(act(fc1(x)))` over (N, T, D); `chunked` computes it in row chunks to bound the 4x-wide
    activation (a matrix product's rounding can depend on its row count, so exact mode does not)."""
    flat = x.reshape(-1, x.shape[-1])  # (N*T, D)
    if not chunked or flat.shape[0] <= FFN_CHUNK_TOKENS:
        return fc2(act(fc1(x)))
    out = torch.empty_like(flat)
    for start in range(0, flat.shape[0], FFN_CHUNK_TOKENS):
        rows = slice(start, start + FFN_CHUNK_TOKENS)
        out[rows] = fc2(act(fc1(flat[rows])))
    return out.view_as(x)


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    """transformers clamps encoder activations that overflowed in fp16; done identically for parity: `x`
    itself unless an activation is not finite, then `x` clamped. Chosen on the device (`torch.where` on
    the 0-d verdict): deciding it on the host read the device once per encoder layer."""
    if x.dtype != torch.float16:
        return x
    limit = torch.finfo(x.dtype).max - 1000
    return torch.where(torch.isfinite(x).all(), x, x.clamp(min=-limit, max=limit))


class EncoderLayer(nn.Module):
    """Post-norm encoder block: self-attention, then feed-forward."""

    def __init__(self, config: BartConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = Linear(d, config.encoder_ffn_dim)
        self.fc2 = Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = ACTIVATIONS[config.activation_function]

    exact = False  # set by `Bart.exact`

    def forward(self, x: torch.Tensor, packing: Packing) -> torch.Tensor:
        """(N, D) packed rows of the batch described by `packing` -> (N, D)."""
        # The attention output is freed once normed, not held through the feed-forward block (the
        # encoder's peak: 160 -> 142 MiB at bart-large shape, 6 x 1,024 tokens, float32).
        x = self.self_attn_layer_norm(self.self_attn.packed(x, packing).add_(x))
        h = feed_forward(x, self.fc1, self.fc2, self.act, chunked=not self.exact)
        return _clamp_fp16(self.final_layer_norm(h.add_(x)))


class DecoderLayer(nn.Module):
    """Post-norm decoder block: causal self-attention, cross-attention, feed-forward."""

    def __init__(self, config: BartConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = Attention(d, config.decoder_attention_heads, fused=("k_proj", "v_proj"))
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = Linear(d, config.decoder_ffn_dim)
        self.fc2 = Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = ACTIVATIONS[config.activation_function]

    exact = False  # set by `Bart.exact`

    def forward(self, x: torch.Tensor, cross: CrossAttention, cache: KVCache | None, index: int) -> torch.Tensor:
        h = self.self_attn(x, causal=True) if cache is None else self.self_attn.step(x, cache, index)
        x = self.self_attn_layer_norm(h.add_(x))
        h = cross(self.encoder_attn, x, index)
        x = self.encoder_attn_layer_norm(h.add_(x))
        h = feed_forward(x, self.fc1, self.fc2, self.act, chunked=not self.exact)
        return self.final_layer_norm(h.add_(x))


class Encoder(nn.Module):
    """Learned positions, embedding layer norm and the encoder stack (token embedding lives in `Bart`)."""

    def __init__(self, config: BartConfig):
        super().__init__()
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))

    def forward(self, embeds: torch.Tensor, packing: Packing) -> torch.Tensor:
        """(B, S, D) scaled token embeddings -> (N, D) encoder states of the rows `packing` keeps."""
        s = embeds.shape[1]
        x = embeds.add_(self.embed_positions.weight[POSITION_OFFSET : POSITION_OFFSET + s])  # (B, S, D)
        x = self.layernorm_embedding(packing.pack(x))  # (N, D)
        for layer in self.layers:
            x = layer(x, packing)
        return x


class Decoder(nn.Module):
    """Learned positions, embedding layer norm and the decoder stack."""

    def __init__(self, config: BartConfig):
        super().__init__()
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))

    def forward(self, embeds: torch.Tensor, cross: CrossAttention, cache: KVCache | None = None) -> torch.Tensor:
        """(B*beams, T, D) embeddings of positions `cache.length ...` -> (B*beams, T, D) decoder states."""
        if isinstance(cache, StaticKVCache):  # one position, read on the device (a CUDA graph replays it)
            positions = self.embed_positions.weight.index_select(0, cache.position + POSITION_OFFSET)  # (1, D)
            cache.begin_step()  # the step's self-attention mask, shared by every layer
        else:
            start = POSITION_OFFSET + (cache.length if cache is not None else 0)
            positions = self.embed_positions.weight[start : start + embeds.shape[1]]  # (T, D)
        x = self.layernorm_embedding(embeds.add_(positions))
        for i, layer in enumerate(self.layers):
            x = layer(x, cross, cache, i)
        if cache is not None:
            cache.advance(embeds.shape[1])
        return x


class Bart(LoggingMixin, nn.Module):
    """BART for conditional generation: `forward` gives logits, `generate` gives token ids.

    Build it with `Bart.from_pretrained(name_or_path, device=..., dtype=..., exact=..., fast=..., static=...,
    el_attention=...,
    quantize=...)`.
    `exact` (settable between calls) shapes the arithmetic as transformers shapes it; `fast` (settable
    too) takes the kernels that are faster in half precision at the price of other ids; at most one
    of the two is on. `static` (settable, not with `exact`) generates with fixed shapes and no host
    syncs between checks, in CUDA graphs on CUDA (`bart_opt.engine.static_generation`). `el_attention`
    (settable, not with `exact`; with any of the others) keeps generate's cross-attention state as one
    copy of the encoder output (`bart_opt.engine.el_attention`). See `from_pretrained` and
    `bart_opt.engine.cross_attention`. `quantize="int8"` (at load only) runs the linear layers on int8 weights
    (`bart_opt.engine.quantize`).
    `fingerprint` is the `bart_opt.engine.fingerprint.Fingerprint` of the files `from_pretrained` read
    (None for a model built otherwise).
    """

    fingerprint = None

    def __init__(self, config: BartConfig, generation_config: GenerationConfig | None = None, exact: bool = False,
                 fast: bool = False, static: bool = False, el_attention: bool = False):
        super().__init__()
        validate_config(config)
        self.config = config
        self.generation_config = generation_config or GenerationConfig.from_model_config(config)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        self.quantize: str | None = None  # "int8" once `bart_opt.engine.quantize` quantized it (at load)
        # The tied embedding quantized (`bart_opt.engine.quantize.Int8Vocabulary`): `shared` is gone.
        self.vocab_int8 = None
        # The dtype of the default search's attention state (cross keys/values, self-attention cache); None: the
        # model's. The int8 mode sets it (`bart_opt.engine.quantize.attention_state_dtype`).
        self.state_dtype: torch.dtype | None = None
        self._exact = self._fast = self._static = self._el_attention = False
        self.exact, self.fast, self.static, self.el_attention = exact, fast, static, el_attention
        # Loading (`load_state_dict(assign=True)`) replaces the fused projections' parameters: fuse again.
        self.register_load_state_dict_post_hook(lambda module, _: module.fuse_projections())

    def fuse_projections(self) -> None:
        """Point every attention's fused projections at one weight tensor again (see `Attention.fuse`)."""
        for module in self.modules():
            if isinstance(module, Attention):
                module.fuse()

    def _apply(self, fn, recurse: bool = True):
        # `.to()`, `.half()` and the like convert each parameter on its own, which unfuses them; and move
        # them, so the static search's graphs (which replay against their addresses) go.
        out = super()._apply(fn, recurse)
        self.fuse_projections()
        self.release_graphs()
        return out

    @property
    def graph_stats(self) -> dict | None:
        """The static search's CUDA graphs on this model (`bart_opt.engine.graphs.StepGraphs.stats`: graphs held,
        captures, capture seconds, their pool's and the persistent buffers' bytes), and what the latest call
        did (`last_call`); None where none were made (off CUDA, or before the first static call)."""
        graphs = getattr(self, "_step_graphs", None)
        return None if graphs is None else {**graphs.stats(), "last_call": dict(graphs.last_call)}

    def release_graphs(self) -> None:
        """Drop the static search's graphs and free their persistent buffers (the next static call on CUDA
        captures again)."""
        graphs = getattr(self, "_step_graphs", None)
        if graphs is not None:
            graphs.release()
            self._step_graphs = None

    @property
    def exact(self) -> bool:
        """Whether generated ids are to equal transformers' bit for bit (see `from_pretrained`)."""
        return self._exact

    @exact.setter
    def exact(self, value: bool) -> None:
        self._set_mode("exact", bool(value))

    @property
    def fast(self) -> bool:
        """Whether the faster half-precision kernels are on, at the price of other ids (see `from_pretrained`)."""
        return self._fast

    @fast.setter
    def fast(self, value: bool) -> None:
        self._set_mode("fast", bool(value))

    @property
    def el_attention(self) -> bool:
        """Whether `generate` runs cross-attention as EL-attention (`bart_opt.engine.el_attention`); not with
        `exact`."""
        return self._el_attention

    @el_attention.setter
    def el_attention(self, value: bool) -> None:
        self._set_mode("el_attention", bool(value))

    @property
    def static(self) -> bool:
        """Whether `generate` runs the static search: fixed shapes, no host syncs between its checks,
        a CUDA graph per row bucket on CUDA (`bart_opt.engine.static_generation`, `bart_opt.engine.graphs`)."""
        return self._static

    @static.setter
    def static(self, value: bool) -> None:
        self._set_mode("static", bool(value))

    @property
    def mode(self) -> str:
        """"default", "exact" or "fast"; setting it turns the other modes off first."""
        return "exact" if self._exact else "fast" if self._fast else "default"

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in ("default", "exact", "fast"):
            raise ValueError(f"mode {value!r} is not one of 'default', 'exact', 'fast'")
        self._set_mode("exact", False)
        self._set_mode("fast", False)
        if value != "default":
            self._set_mode(value, True)

    def _set_mode(self, name: str, value: bool) -> None:
        """Set `exact`, `fast`, `static` or `el_attention` here and on every module that follows it; the
        modes that exclude each other (`bart_opt.engine.options.EXCLUSIONS`: exact and the others, int8 included)
        are refused with an `OptionConflict` naming both."""
        if value:
            check_modes({**{mode: getattr(self, mode, None) for mode in MODE_FIELDS}, name: True}, turning_on=name)
        setattr(self, f"_{name}", value)
        for module in self.modules():
            if module is not self and hasattr(module, name):
                setattr(module, name, value)
        if self._fast and self.dtype == torch.bfloat16 and self.device.type == "cpu":
            native.kernel()  # built (or found cached) now, not inside the first request or a timed call

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike | Checkpoint,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | hardware.DtypeChoice | None = torch.float32,
        exact: bool = False,
        fast: bool = False,
        static: bool = False,
        el_attention: bool = False,
        quantize: str | None = None,
    ) -> Bart:
        """Load a Hugging Face BART checkpoint from a local folder or a hub id (through the hub cache).

        `exact=True`: every kernel gets the inputs transformers' BART gives it (same shapes,
        masks and row counts), so generated ids equal transformers' on the same device, dtype
        and batch. It costs a per-beam copy of one layer's cross-attention keys/values per
        call, un-chunked feed-forward blocks, and finished inputs staying in the working batch.
        The default shares cross-attention keys/values across beams and drops finished inputs:
        less memory and time, the same ids or near-ties resolved differently (rarely on peaked
        distributions in float32, often in half precision or on flat ones; `python -m
        bart_opt.bench.fidelity` measures how often).

        `fast=True` (not with `exact`): the default, plus on a CPU in half precision padded keys left out
        of attention, and in bfloat16 decoding attention through bart_opt's own kernel, built
        here on first use (`bart_opt.engine.native`). Faster, with other ids than transformers' in half
        precision: near-ties as the default's are, but more of them (`python -m bart_opt.bench.fidelity`).

        `quantize="int8"` (a CPU only, not with `exact`; fixed for the model's life): the linear layers
        and the vocabulary projection on int8 weights, quantized here per output channel from the
        float32 checkpoint, activations quantized at each product; attention and cross-attention's
        keys/values stay in float (`dtype`: float32, or bfloat16 with `fast=True` where the CPU runs
        bfloat16 natively). Weights about a third of float32's; ids other than transformers' (its
        agreement: docs/cpu.md, `python -m bart_opt.bench.fidelity`). See `bart_opt.engine.quantize`.

        `dtype` "auto" (or None) resolves through `bart_opt.engine.hardware.choose_dtype`: float16 on CUDA,
        float32 on a CPU; bfloat16 on a CPU without native bfloat16 works, with one warning.
        `name_or_path` and `dtype` resolve here, once: a caller that resolved them already (a
        `bart_opt.engine.loading.Checkpoint`, a `bart_opt.engine.hardware.DtypeChoice`: `Summarizer.from_options`)
        passes them, and they are taken as they are.

        The modes are checked first (`bart_opt.engine.options.EngineOptions.validate`): options that exclude each
        other raise `bart_opt.engine.options.OptionConflict` naming both, before any file is looked at.

        `static=True` (with the default or `fast`, not with `exact`): `generate` runs with fixed
        shapes and no host syncs between its checks of whether every input is done (every
        `bart_opt.engine.static_generation.CHECK_EVERY` steps); on CUDA each decoder step is a CUDA graph
        replay. Its layout is the default's off the CPU on every device (one attention call for the
        batch, padded keys masked), so its ids are the default's there, up to near-ties resolved
        differently (docs/gpu.md publishes how often). `fast` changes nothing in it: the fast
        mode's own kernels read layouts the static search does not use.

        `el_attention=True` (with the default, `fast` or `static`, not with `exact`): `generate` keeps one
        copy of the encoder output per input as the whole cross-attention state, for every layer and beam
        (`bart_opt.engine.el_attention`). Less memory; on a CPU slower; other ids in the last bits, as the
        default's are (`python -m bart_opt.bench.fidelity --modes default,el`; docs/el-attention.md).
        """
        name = name_or_path.name if isinstance(name_or_path, Checkpoint) else str(name_or_path)
        EngineOptions(model=name, device=str(device), exact=exact, fast=fast, static=static,
                      el_attention=el_attention, quantize=quantize).validate()  # before any file is read
        device = torch.device(device)
        checkpoint = Checkpoint.find(name_or_path)
        model = load_pretrained(cls, checkpoint, device, hardware.choose_dtype(dtype, device).dtype,
                               quantize=quantize)
        model.exact, model.fast = exact, fast
        model.static, model.el_attention = static, el_attention
        return model

    @property
    def device(self) -> torch.device:
        return self.final_logits_bias.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the float weights and activations (int8 weights compute on float32 from it)."""
        return self.encoder.layernorm_embedding.weight.dtype

    def weights_bytes(self) -> int:
        """Bytes held by parameters and buffers, and by int8 weights packed outside them (`quantize="int8"`)."""
        return sum(t.numel() * t.element_size() for t in [*self.parameters(), *self.buffers()]) + packed_bytes(self)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, T) ids -> (N, T, D) scaled token embeddings (a fresh tensor, safe to modify in place)."""
        x = F.embedding(ids, self.shared.weight) if self.vocab_int8 is None else self.vocab_int8.embed(ids)
        return x.mul_(self.embed_scale) if self.embed_scale != 1.0 else x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) decoder states -> (..., V) logits from the tied embedding and `final_logits_bias`.

        The default mode in float32 on a CPU lets oneDNN add the bias in the product
        (`bart_opt.engine.kernels`). Otherwise the bias is added afterwards, as transformers adds it (in
        half precision adding it inside the product rounds differently). Exact mode runs the one
        product transformers runs: MKL's product over column blocks of the vocabulary (1.6x faster
        at 48 rows by 50k columns) gave other bits for one row on two threads, and for 48 rows in
        MKL's AVX2 code.
        """
        if self.vocab_int8 is not None:
            return self.vocab_int8(hidden)
        weight, bias = self.shared.weight, self.final_logits_bias[0]  # (V, D), (V,)
        if not self.exact and hidden.dtype == torch.float32 and uses_onednn(hidden):
            return linear(hidden, weight, bias, fast=True)
        out = F.linear(hidden, weight)  # (..., V)
        out += bias
        return out

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Run the encoder once on the un-expanded batch: (B, S) ids -> (B, S, D) states.

        Only real tokens go through the layers (`bart_opt.engine.packing`); padded positions come back
        as zeros, which every later attention masks out.
        """
        b, s = input_ids.shape
        with self.log_phase("encode"):
            hidden = self.embed(input_ids)  # (B, S, D)
            packing = Packing.for_mode(attention_mask, b, s, self.exact, hidden.device, hidden.dtype)
            return packing.unpack(self.encoder(hidden, packing))  # (B, S, D)

    def cross_attention(
        self, memory: torch.Tensor, attention_mask: torch.Tensor | None, beams: int = 1, lazy: bool = False,
        buffers: Buffers | None = None,
    ) -> CrossAttention:
        """The decoder's cross-attention state for encoder states `memory` (B, S, D) and `beams` rows per input.

        Every layer's keys/values are computed now, once per input; `lazy` computes each when
        its layer runs instead (a single teacher-forced pass needs only one layer's at a time).
        With `el_attention` (not `lazy`: a teacher-forced pass keeps the layers' own keys/values) the
        state is the encoder output itself (`bart_opt.engine.el_attention`). `buffers`: where the static search's
        state goes (`bart_opt.engine.buffers`; its persistent ones with CUDA graphs).
        """
        attns = [layer.encoder_attn for layer in self.decoder.layers]
        if self.exact:
            build = ExactCrossAttention.build
        elif self.el_attention and not lazy:
            build = (functools.partial(SharedELCrossAttention.build, fast=self.fast)
                     if packing_rules.attends_per_input(memory.device) and not self.static
                     else functools.partial(BatchedELCrossAttention.build, buffers=buffers))
        elif self.static:
            build = functools.partial(StaticCrossAttention.build, buffers=buffers)
        elif not packing_rules.attends_per_input(memory.device):
            build = BatchedCrossAttention.build
        else:
            build = functools.partial(SharedCrossAttention.build, fast=self.fast, state_dtype=self.state_dtype,
                                      kernel=self.uses_kernel())
        if lazy:
            return build(attns, memory, attention_mask, beams, lazy=True)
        with self.log_phase("cross_kv"):
            return build(attns, memory, attention_mask, beams)

    def decode_step(self, ids: torch.Tensor, cross: CrossAttention, cache: KVCache,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """Feed the last tokens (B*beams, 1) through the decoder; float32 logits (B*beams, V).

        The logits are widened into `out` (B*beams, V) float32 when given (beam search gives it in
        half precision), rather than into a fresh tensor. Fresh (48, 50,265) tensors each step are paid in page faults:
        profiled on this 2-core CPU, one thread, a bfloat16 generate of the CTranslate2 benchmark's
        batch spent 0.42 s widening and 0.47 s in `log_softmax` with fresh tensors, 0.20 and 0.19 s
        with buffers reused across steps (beam search's; the same bits).
        """
        hidden = self.decoder(self.embed(ids), cross, cache)  # (B*beams, 1, D)
        logits = self.logits(hidden[:, -1])  # (B*beams, V)
        return logits.float() if out is None else out.copy_(logits)

    def uses_kernel(self) -> bool:
        """Whether the default search's decoding attention runs through bart_opt's own kernel (`bart_opt.engine.native`):
        in the fast mode, and in the int8 mode, whose attention state is bfloat16 (`Bart.state_dtype`), where the
        kernel is built for this CPU (AVX512-BF16, or AVX2 and FMA)."""
        if not (self.fast or self.state_dtype is not None):
            return False
        c = self.config
        state = torch.empty(0, dtype=self.state_dtype or self.dtype, device=self.device)
        return native.handles(state, c.d_model // c.decoder_attention_heads)

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        """A preallocated decoder self-attention cache for `rows` sequences of up to `max_len` positions."""
        c = self.config
        head_dim = c.d_model // c.decoder_attention_heads
        # bart_opt's kernel reads a beam's history through a row table: beam steps copy no keys/values.
        indirect = self.uses_kernel()
        return KVCache(
            c.decoder_layers, rows, c.decoder_attention_heads, max_len, head_dim,
            dtype=self.state_dtype or self.dtype, device=self.device, indirect=indirect,
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); `decoder_input_ids` defaults to `input_ids` shifted right."""
        input_ids, attention_mask = check_inputs(self, input_ids, attention_mask)
        if decoder_input_ids is None:
            decoder_input_ids = shift_right(input_ids, self.config.pad_token_id, self.config.decoder_start_token_id)
        else:
            decoder_input_ids = torch.as_tensor(decoder_input_ids, device=self.device)
            if decoder_input_ids.dim() != 2 or decoder_input_ids.shape[0] != input_ids.shape[0]:
                raise ValueError(
                    f"decoder_input_ids must have shape (batch={input_ids.shape[0]}, T); got {tuple(decoder_input_ids.shape)}"
                )
            if decoder_input_ids.shape[1] > self.config.max_position_embeddings:
                raise ValueError(
                    f"decoder_input_ids has {decoder_input_ids.shape[1]} positions; the model has "
                    f"{self.config.max_position_embeddings} (max_position_embeddings)"
                )
        memory = self.encode(input_ids, attention_mask)
        cross = self.cross_attention(memory, attention_mask, lazy=True)
        with self.log_phase("decode"):
            hidden = self.decoder(self.embed(decoder_input_ids), cross)
        del memory, cross
        with self.log_phase("logits"):
            return self.logits(hidden)

    def generation_spec(self, overrides: Mapping[str, Any] | None = None, *, max_beams: int | None = None) -> GenerationSpec:
        """`overrides` resolved over this checkpoint's generation config (see `GenerationSpec.resolve`)."""
        return GenerationSpec.resolve(self.config, self.generation_config, overrides, max_beams=max_beams)

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        spec: GenerationSpec | None = None,
        *,
        cancelled: Cancelled | None = None,
        **generation_kwargs,
    ) -> torch.Tensor:
        """Greedy or beam search (B, L) ids; with `exact` the same ids as transformers' `generate`.

        Settings come from `spec`, or default to `self.generation_config` (the checkpoint's
        generation_config.json) with keyword arguments overriding them. Invalid or unsupported
        options raise `bart_opt.InvalidRequest` (a ValueError) naming the option. `cancelled`
        (polled between decoder steps) stops the rows it returns; see `bart_opt.engine.generation.generate`
        (`bart_opt.engine.static_generation.generate_static` with `static`).
        """
        run = generate_static if self.static else generate
        return run(self, input_ids, attention_mask, spec, cancelled=cancelled, **generation_kwargs)
