"""A padded (B, S) batch as packed rows: only real tokens go through the projections.

The encoder's linear layers (projections, feed-forward, layer norms) act on each position
alone, so they may run on the N real tokens of the batch instead of its B*S padded positions
(12,288 positions for 9,537 tokens on the CNN-like benchmark batch). Only attention needs the
inputs apart; `Packing.rows` gives each input's slice of the packed rows, in order.
"""

from __future__ import annotations

import torch

from bart_opt.engine import hardware
from bart_opt.engine.cache import aligned_bias

EXACT_MIN_ROWS = 64
"""Exact mode packs only batches of at least this many real tokens: MKL's float32 GEMM rounds a
row alike for every row count measured from 17 up, but differently below (a matrix-vector kernel)."""


def skips_padded_keys(dtype: torch.dtype, fast: bool = False) -> bool:
    """Whether attention may leave padded keys out instead of masking them: in float32, and in the fast mode.

    Leaving them out changes how the attention kernel rounds. In float32 it changed no ids on
    the parity batches and the CTranslate2 benchmark; in float16 and bfloat16 it changed greedy
    ids on 5 to 7 of the 8 inputs of the d256 parity batch (`tests/bart_opt/engine/test_fidelity.py`),
    so the default mode masks them in half precision as transformers does. The fast mode takes
    the time instead (10% of a bfloat16 generate on the CTranslate2 benchmark's batch).
    """
    return fast or dtype == torch.float32


def attends_per_input(device: torch.device) -> bool:
    """Whether the default mode's attention makes one call per input (on a CPU) rather than one call
    for the whole padded batch with its padded keys masked (on a GPU).

    Per input, a call sees its own keys only, and only the real ones where `skips_padded_keys`
    allows: on a CPU the arithmetic is the cost, and none goes to padding. On a GPU each call is a
    kernel launch of a few microseconds' work, and a decoder step made B of them per layer, which
    made bart_opt slower than transformers there. One call for the batch costs the GPU a little
    arithmetic on padding and saves B - 1 launches per layer and step (measured on an H200:
    docs/benchmarks.md, "GPU: one NVIDIA H200").
    """
    return device.type == "cpu"


def exact_reshapes(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether exact mode may give a matrix product another shape than transformers' (packed rows, a
    fused Q|K|V or K|V product's wider columns) and keep its bits: only where that was measured, float32
    and float16 on a CPU with AVX-512 (rows alike at every row count from 17 up, fused columns as separate
    ones). Not in bfloat16 (the AMX Xeon's GEMM at K 768 rounds a row otherwise at 32 or 200 rows than at
    256, and a wider product's columns otherwise from 800 rows), not below AVX-512 (MKL's AVX2 GEMM: exact
    logits 2.5e-6 apart at the test checkpoints with every library limited to AVX2), not off the CPU
    (another shape may select another GPU kernel; not measured)."""
    return device.type == "cpu" and dtype != torch.bfloat16 and hardware.probe().avx512


def exact_packs(tokens: int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether exact mode may pack a batch of `tokens` real tokens: from `EXACT_MIN_ROWS` up, where
    `exact_reshapes` allows."""
    return tokens >= EXACT_MIN_ROWS and exact_reshapes(device, dtype)


class Packing:
    """Where the real tokens of a (B, S) batch sit among the rows of a packed (N, D) tensor.

    `attention_mask` is the (B, S) 0/1 mask (None: nothing padded). Packed rows follow the batch
    in row-major order, so input i owns the contiguous rows `rows[i]`. With `pack=False` every
    position is a row (N = B*S, padding included, as transformers computes it) and only the key
    masks tell padding apart.
    """

    def __init__(self, attention_mask: torch.Tensor | None, batch: int, length: int, pack: bool = True):
        self.batch, self.length = batch, length
        keep = None if attention_mask is None else attention_mask.bool()  # (B, S)
        if keep is not None and bool(keep.all()):
            keep = None
        self.keep = keep
        packed = pack and keep is not None
        self.index = keep.flatten().nonzero().squeeze(1) if packed else None  # (N,) flat positions
        lengths = keep.sum(dim=1).tolist() if packed else [length] * batch
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        self.rows = [slice(a, b) for a, b in zip(starts, starts[1:])]
        self.tokens = starts[-1]
        self._square: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    @classmethod
    def for_mode(cls, attention_mask: torch.Tensor | None, batch: int, length: int, exact: bool,
                 device: torch.device, dtype: torch.dtype) -> Packing:
        """Packed rows, except in exact mode where `exact_packs` says another row count may round otherwise."""
        tokens = batch * length if attention_mask is None else int(attention_mask.bool().sum())
        return cls(attention_mask, batch, length, pack=not exact or exact_packs(tokens, device, dtype))

    def square_mask(self) -> torch.Tensor | None:
        """(B, 1, S, S) bool mask, materialized as transformers materializes it (built once), or None."""
        if self.keep is not None and self._square is None:
            s = self.length
            self._square = self.keep[:, None, None, :].expand(-1, 1, s, s).contiguous()
        return self._square

    def key_masks(self) -> torch.Tensor | None:
        """(B, 1, 1, S) bool mask of every input's real keys (a view), or None when nothing is padded."""
        return None if self.keep is None else self.keep[:, None, None, :]

    def key_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """`key_masks` as an additive mask in `dtype` (0 at real keys, -inf at padding) in 16-aligned rows,
        made once (`bart_opt.engine.cache.aligned_bias`: the numbers a bool mask converts to, with no copy inside
        every attention call), or None when nothing is padded."""
        if self.keep is None:
            return None
        if self._bias is None or self._bias.dtype != dtype:
            self._bias = aligned_bias(self.keep, dtype)
        return self._bias

    def key_mask(self, i: int) -> torch.Tensor | None:
        """(1, 1, 1, S) bool mask of input i's real keys, or None when nothing is padded."""
        return None if self.keep is None else self.keep[i, None, None, None, :]

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, D) -> (N, D), the real positions only."""
        flat = x.reshape(self.batch * self.length, x.shape[-1])  # (B*S, D)
        return flat if self.index is None else flat.index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (B, S, D), zeros at padding (which attention masks out: its weight there is exactly 0)."""
        if self.index is None:
            return x.view(self.batch, self.length, x.shape[-1])
        out = x.new_zeros(self.batch * self.length, x.shape[-1])  # (B*S, D)
        return out.index_copy_(0, self.index, x).view(self.batch, self.length, x.shape[-1])
