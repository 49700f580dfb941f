"""`Attention`: BART's multi-head attention (self-attention, and the cached self-attention of a
decoder step); cross-attention's states and kernels are in `bart_opt.engine.cross_attention`,
`bart_opt.engine.el_attention` and `bart_opt.engine.cache`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bart_opt.engine import native
from bart_opt.engine import packing as packing_rules  # patched as a module by the GPU-layout tests and benches
from bart_opt.engine.cache import KVCache, StaticKVCache
from bart_opt.engine.kernels import Linear, linear
from bart_opt.engine.packing import Packing, skips_padded_keys


class Attention(nn.Module):
    """Multi-head attention with BART's projection names; self and cached-self variants here,
    cross-attention in `bart_opt.engine.cross_attention`.

    The projections named in `fused` (Q, K, V for self-attention; K, V for cross-attention) hold
    their weights as row blocks of one concatenated tensor (`fused_weight`, `fused_bias`), so they
    run as one matrix product without a second copy of the weights. Each output column is the same
    dot product either way, but not always rounded alike: in float32 and float16 on an AVX-512 CPU the
    fused product is bit-identical to separate ones (measured with MKL at 1 to 12,288 rows), in bfloat16
    at K 768 from 800 rows and in MKL's AVX2 code it is not, so exact mode fuses only where
    `bart_opt.engine.packing.exact_reshapes` says (`tests/bart_opt/engine/test_kernels.py` checks both).
    """

    exact = False  # set by `Bart.exact`
    fast = False  # set by `Bart.fast`
    static = False  # set by `Bart.static`

    def __init__(self, d_model: int, heads: int, fused: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")):
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        # Passed to SDPA explicitly, as transformers does: its own 1/sqrt(d) differs in the last bit for some d.
        self.scaling = self.head_dim**-0.5
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.out_proj = Linear(d_model, d_model)
        self.fused = fused
        self.fused_int8 = None  # the fused projections as one int8 product (`bart_opt.engine.quantize`); their float weights are gone
        self.fuse()

    @torch.no_grad()
    def fuse(self) -> None:
        """Re-point the `fused` projections' weights and biases at row blocks of one tensor each.
        `Bart` calls it after anything that replaces parameters (loading, `.to`)."""
        if self.fused_int8 is not None:
            return
        projs = [getattr(self, name) for name in self.fused]
        weight = torch.cat([p.weight for p in projs])  # (len(fused)*D, D)
        bias = torch.cat([p.bias for p in projs])  # (len(fused)*D,)
        for part, p in zip(weight.chunk(len(projs)), projs):
            p.weight.data = part
        for part, p in zip(bias.chunk(len(projs)), projs):
            p.bias.data = part
        self.fused_weight, self.fused_bias = weight, bias

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The `fused` projections of `x` (..., D): one (..., D) view each of a single product."""
        if self.fused_int8 is not None:
            return self.fused_int8(x).chunk(len(self.fused), dim=-1)
        if self.exact and not packing_rules.exact_reshapes(x.device, x.dtype):
            return tuple(getattr(self, name)(x) for name in self.fused)
        out = linear(x, self.fused_weight, self.fused_bias, fast=not self.exact)  # (..., len(fused)*D)
        return out.chunk(len(self.fused), dim=-1)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, D) -> (N, H, T, d), a view."""
        n, t, _ = x.shape
        return x.view(n, t, self.heads, self.head_dim).transpose(1, 2)  # (N, H, T, d)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """(N, H, T, d) -> (N, T, D)."""
        n, h, t, d = x.shape
        return x.transpose(1, 2).reshape(n, t, h * d)  # (N, T, D)

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """Full self-attention over `x` (N, T, D), nothing padded."""
        q, k, v = (self.split(t) for t in self.project(x))  # (N, H, T, d) each
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=self.scaling)
        return self.out_proj(self.merge(out))  # (N, T, D)

    def packed(self, x: torch.Tensor, packing: Packing) -> torch.Tensor:
        """Self-attention of each input over its own tokens; `x` (N, D) holds the batch's real
        tokens packed (`bart_opt.engine.packing`), and so does the result.

        Exact mode attends as transformers' padded batch does: every position a query, padded
        keys masked (the CPU kernel blocks the queries by their count, and a block of another
        size rounds differently). Off the CPU the default mode does the same in one call for the
        batch, with a (B, 1, 1, S) key mask (`attends_per_input`). Otherwise only real tokens are
        queries, one call per input, and they get the padded
        keys with the padding mask (masked keys get exactly zero weight, so what stands at padding
        does not matter) or, where `skips_padded_keys` allows, the input's real keys only: then
        nothing at all is computed for padding.
        """
        q, k, v = self.project(x)  # (N, D) each
        if self.exact or self.static or not packing_rules.attends_per_input(x.device):
            # Exact: transformers' materialized (B, 1, S, S) mask; else (off the CPU, or static) one call
            # for the batch, whose queries at padding are computed and dropped by `pack`.
            mask = packing.square_mask() if self.exact else packing.key_bias(x.dtype)
            q, k, v = (self.split(packing.unpack(t)) for t in (q, k, v))  # (B, H, S, d)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
            return self.out_proj(packing.pack(self.merge(out)))  # (N, D)
        skip = skips_padded_keys(x.dtype, self.fast)
        if not skip:
            k, v = packing.unpack(k), packing.unpack(v)  # (B, S, D)
        out = torch.empty_like(x)  # (N, D)
        for i, rows in enumerate(packing.rows):
            qi = self.split(q[None, rows])  # (1, H, n, d)
            if skip:
                ki, vi, mask = self.split(k[None, rows]), self.split(v[None, rows]), None  # (1, H, n, d)
            else:
                ki, vi, mask = self.split(k[i : i + 1]), self.split(v[i : i + 1]), packing.key_mask(i)  # (1, H, S, d)
            attended = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scaling)
            out[rows] = self.merge(attended)[0]  # (n, D)
        return self.out_proj(out)  # (N, D)

    def step(self, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        """Self-attention of new positions `x` (N, T, D) over everything cached so far plus themselves."""
        q, k, v = (self.split(t) for t in self.project(x))  # (N, H, T, d) each
        if isinstance(cache, StaticKVCache):  # the static search: fixed shapes, history through a table
            return self.out_proj(self.merge(cache.attend(layer, q, k, v, self.scaling)))
        k, v = cache.append(layer, k, v)  # (N, H, L, d)
        # T == 1 while decoding: the new token may see every cached position, so no mask is needed.
        if cache.rows is not None:  # indirect (the fast mode): only bart_opt's kernel follows its history table
            if q.shape[2] != 1:
                raise RuntimeError("an indirect KVCache is read one new position at a time")
            out = native.decode_attention(q.to(k.dtype), k, v, self.scaling,
                                          rows=cache.history(k.shape[2])).to(q.dtype)  # (N, H, 1, d)
        else:  # a cache kept in another dtype (the int8 mode's bfloat16): the queries rounded to it, the output back
            out = F.scaled_dot_product_attention(q.to(k.dtype), k, v, is_causal=q.shape[2] > 1,
                                                 scale=self.scaling).to(q.dtype)
        return self.out_proj(self.merge(out))

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of encoder states (B, S, D): two (B, H, S, d) views."""
        k, v = self.project(memory)  # (B, S, D) each
        return self.split(k), self.split(v)
