"""BART in plain PyTorch, written for inference memory.

Attribute names follow the Hugging Face checkpoint keys (minus their `model.` prefix), so
`loading.py` needs no renaming table. What differs from transformers' modeling code:

* attention runs through fused `scaled_dot_product_attention`; weights are never materialized;
* the encoder padding mask stays a `(B, 1, 1, S)` bool mask and the decoder's causal mask is
  implicit (`is_causal`), never a combined `(B, 1, T, S)` float mask;
* cross-attention keys/values exist once per input: the beams of one input are folded into the
  query-length axis, so nothing of the encoder side is copied per beam;
* logits come from the shared embedding (no lm_head weight) with `final_logits_bias` added in
  place, and during generation only for the last position;
* the feed-forward block runs in row chunks, so its 4x-wide activation never exists for a whole
  long batch at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BartConfig, GenerationConfig

from bart_opt.cache import KVCache
from bart_opt.config import ACTIVATIONS, validate_config
from bart_opt.generation import Cancelled, generate
from bart_opt.inputs import check_inputs, encoder_mask, shift_right
from bart_opt.loading import load_pretrained
from bart_opt.memory import LoggingMixin
from bart_opt.spec import GenerationSpec

POSITION_OFFSET = 2  # BART's learned positions start at row 2 of the table (a fairseq legacy)
FFN_CHUNK_TOKENS = 2048  # rows of the feed-forward block computed at once


class Attention(nn.Module):
    """Multi-head attention with BART's projection names; self, cached-self and cross variants."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        return x.view(n, t, self.heads, self.head_dim).transpose(1, 2)  # (N, H, T, d)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        n, h, t, d = x.shape
        return x.transpose(1, 2).reshape(n, t, h * d)  # (N, T, D)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """Full self-attention over `x` (N, T, D); `mask` (N, 1, 1, T) bool keeps True keys."""
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)  # (N, H, T, d)
        return self.out_proj(self._merge(out))

    def step(self, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        """Self-attention of new positions `x` (N, T, D) over everything cached so far plus themselves."""
        q = self._split(self.q_proj(x))  # (N, H, T, d)
        k, v = cache.append(layer, self._split(self.k_proj(x)), self._split(self.v_proj(x)))  # (N, H, L, d)
        # T == 1 while decoding: the new token may see every cached position, so no mask is needed.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1)
        return self.out_proj(self._merge(out))

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of encoder states (B, S, D): two (B, H, S, d) tensors."""
        return self._split(self.k_proj(memory)), self._split(self.v_proj(memory))

    def cross(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, beams: int
    ) -> torch.Tensor:
        """Attend `x` (B*beams, T, D) to one copy of keys/values (B, H, S, d) per input."""
        n, t, d_model = x.shape
        b = n // beams
        # Rows of one input's beams are adjacent, so they fold into the query axis: each query
        # attends independently, and the keys/values are shared without a per-beam copy.
        q = self.q_proj(x).view(b, beams * t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, beams*T, d)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, beams*T, d)
        return self.out_proj(out.transpose(1, 2).reshape(n, t, d_model))  # (B*beams, T, D)


def feed_forward(x: torch.Tensor, fc1: nn.Linear, fc2: nn.Linear, act) -> torch.Tensor:
    """`fc2(act(fc1(x)))` over (N, T, D), computed in row chunks to bound the 4x-wide activation."""
    flat = x.reshape(-1, x.shape[-1])  # (N*T, D)
    if flat.shape[0] <= FFN_CHUNK_TOKENS:
        return fc2(act(fc1(x)))
    out = torch.empty_like(flat)
    for start in range(0, flat.shape[0], FFN_CHUNK_TOKENS):
        rows = slice(start, start + FFN_CHUNK_TOKENS)
        out[rows] = fc2(act(fc1(flat[rows])))
    return out.view_as(x)


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    # transformers clamps encoder activations that overflowed in fp16; done identically for parity.
    if x.dtype == torch.float16 and not torch.isfinite(x).all():
        limit = torch.finfo(x.dtype).max - 1000
        x = x.clamp(min=-limit, max=limit)
    return x


class EncoderLayer(nn.Module):
    """Post-norm encoder block: self-attention, then feed-forward."""

    def __init__(self, config: BartConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = ACTIVATIONS[config.activation_function]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        h = self.self_attn(x, mask)
        x = self.self_attn_layer_norm(h.add_(x))
        h = feed_forward(x, self.fc1, self.fc2, self.act)
        return _clamp_fp16(self.final_layer_norm(h.add_(x)))


class DecoderLayer(nn.Module):
    """Post-norm decoder block: causal self-attention, cross-attention, feed-forward."""

    def __init__(self, config: BartConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = Attention(d, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = ACTIVATIONS[config.activation_function]

    def forward(
        self,
        x: torch.Tensor,
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        enc_mask: torch.Tensor | None,
        beams: int,
        cache: KVCache | None,
        index: int,
    ) -> torch.Tensor:
        h = self.self_attn(x, causal=True) if cache is None else self.self_attn.step(x, cache, index)
        x = self.self_attn_layer_norm(h.add_(x))
        h = self.encoder_attn.cross(x, *cross_kv, enc_mask, beams)
        x = self.encoder_attn_layer_norm(h.add_(x))
        h = feed_forward(x, self.fc1, self.fc2, self.act)
        return self.final_layer_norm(h.add_(x))


class Encoder(nn.Module):
    """Learned positions, embedding layer norm and the encoder stack (token embedding lives in `Bart`)."""

    def __init__(self, config: BartConfig):
        super().__init__()
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """(B, S, D) scaled token embeddings -> (B, S, D) encoder states."""
        s = embeds.shape[1]
        x = self.layernorm_embedding(embeds.add_(self.embed_positions.weight[POSITION_OFFSET : POSITION_OFFSET + s]))
        for layer in self.layers:
            x = layer(x, mask)
        return x


class Decoder(nn.Module):
    """Learned positions, embedding layer norm and the decoder stack."""

    def __init__(self, config: BartConfig):
        super().__init__()
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))

    def forward(
        self,
        embeds: torch.Tensor,
        cross_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        enc_mask: torch.Tensor | None,
        beams: int = 1,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """(B*beams, T, D) embeddings of positions `cache.length ...` -> (B*beams, T, D) decoder states."""
        start = POSITION_OFFSET + (cache.length if cache is not None else 0)
        x = self.layernorm_embedding(embeds.add_(self.embed_positions.weight[start : start + embeds.shape[1]]))
        for i, layer in enumerate(self.layers):
            x = layer(x, cross_kv[i], enc_mask, beams, cache, i)
        if cache is not None:
            cache.advance(embeds.shape[1])
        return x


class LazyCrossKV(Sequence):
    """Cross-attention keys/values computed per layer when asked for (teacher-forced forward),
    so that only one layer's pair exists at a time."""

    def __init__(self, decoder: Decoder, memory: torch.Tensor):
        self.decoder, self.memory = decoder, memory

    def __len__(self) -> int:
        return len(self.decoder.layers)

    def __getitem__(self, i):
        return self.decoder.layers[i].encoder_attn.keys_values(self.memory)


class Bart(LoggingMixin, nn.Module):
    """BART for conditional generation: `forward` gives logits, `generate` gives token ids.

    Build it with `Bart.from_pretrained(name_or_path, device=..., dtype=...)`.
    """

    def __init__(self, config: BartConfig, generation_config: GenerationConfig | None = None):
        super().__init__()
        validate_config(config)
        self.config = config
        self.generation_config = generation_config or GenerationConfig.from_model_config(config)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, device: str | torch.device = "cpu", dtype: torch.dtype | str | None = torch.float32
    ) -> Bart:
        """Load a Hugging Face BART checkpoint from a local folder or a hub id (through the hub cache)."""
        return load_pretrained(cls, name_or_path, device=device, dtype=dtype)

    @property
    def device(self) -> torch.device:
        return self.shared.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.shared.weight.dtype

    def weights_bytes(self) -> int:
        """Bytes held by parameters and buffers."""
        return sum(t.numel() * t.element_size() for t in [*self.parameters(), *self.buffers()])

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, T) ids -> (N, T, D) scaled token embeddings (a fresh tensor, safe to modify in place)."""
        x = F.embedding(ids, self.shared.weight)
        return x.mul_(self.embed_scale) if self.embed_scale != 1.0 else x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) decoder states -> (..., V) logits from the tied embedding, bias added in place."""
        out = F.linear(hidden, self.shared.weight)
        out += self.final_logits_bias[0]
        return out

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the encoder once on the un-expanded batch; returns states (B, S, D) and the SDPA mask."""
        mask = encoder_mask(attention_mask)
        with self.log_phase("encode"):
            memory = self.encoder(self.embed(input_ids), mask)
        return memory, mask

    def cross_keys_values(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every decoder layer's cross-attention keys/values, (B, H, S, d) each, one copy per input."""
        with self.log_phase("cross_kv"):
            return [layer.encoder_attn.keys_values(memory) for layer in self.decoder.layers]

    def decode_step(
        self,
        ids: torch.Tensor,
        cross_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        enc_mask: torch.Tensor | None,
        beams: int,
        cache: KVCache,
    ) -> torch.Tensor:
        """Feed the last tokens (B*beams, 1) through the decoder; float32 logits (B*beams, V)."""
        hidden = self.decoder(self.embed(ids), cross_kv, enc_mask, beams, cache)  # (B*beams, 1, D)
        return self.logits(hidden[:, -1]).float()

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        """A preallocated decoder self-attention cache for `rows` sequences of up to `max_len` positions."""
        c = self.config
        return KVCache(
            c.decoder_layers, rows, c.decoder_attention_heads, max_len, c.d_model // c.decoder_attention_heads,
            dtype=self.dtype, device=self.device,
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
        memory, mask = self.encode(input_ids, attention_mask)
        with self.log_phase("decode"):
            hidden = self.decoder(self.embed(decoder_input_ids), LazyCrossKV(self.decoder, memory), mask)
        del memory
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
        """Greedy or beam search; returns the same (B, L) ids as transformers' `generate` for these weights.

        Settings come from `spec`, or default to `self.generation_config` (the checkpoint's
        generation_config.json) with keyword arguments overriding them. Invalid or unsupported
        options raise `bart_opt.InvalidRequest` (a ValueError) naming the option. `cancelled`
        (polled between decoder steps) stops the rows it returns; see `bart_opt.generation.generate`.
        """
        return generate(self, input_ids, attention_mask, spec, cancelled=cancelled, **generation_kwargs)
