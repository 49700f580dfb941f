"""EL-attention: the decoder's cross-attention over one copy of the encoder output, shared by every
layer and every beam (FastSeq's EL-attention, ICML 2021).

Standard cross-attention keeps every layer's keys and values, `W_k h_j + b_k` and `W_v h_j + b_v`
for each encoder state `h_j`: 2 x layers copies of the encoder output per input. EL-attention
moves both projections to the query side instead. For head h, with `q_h` the head's query:

* scores: `q_h . (W_k^h h_j + b_k^h) = (W_k^h^T q_h) . h_j + q_h . b_k^h`; the last term is the
  same for every key j, and the softmax cancels it, so `b_k` is never used;
* context: `sum_j a_j (W_v^h h_j + b_v^h) = W_v^h (sum_j a_j h_j) + b_v^h`, since the weights
  `a_j` sum to 1 (every input has at least one real token: `bart_opt.engine.inputs.check_inputs`).

So each layer's attention reads the encoder output `h` itself, (S, d_model) per input: its heads'
queries are taken into d_model space (`W_k^h^T q_h`, heads x beams rows of d_model per input), attend
over `h` in one call per input, and the d_model-wide context is taken back into each head by
`W_v^h`. Nothing is cached per layer; the price is arithmetic: the scores and the weighted sum run
over d_model instead of a head's width, H times the multiply-adds of standard attention.

Two layouts, as for the other modes (`bart_opt.engine.cross_attention`):

* `SharedELCrossAttention` (on a CPU): one (1, 1, n_i, D) tensor per input, so that an input
  leaving the batch frees its own; in float32 (and in the fast mode) only its real rows, so padding
  is neither stored nor attended to; in half precision the padded rows are kept and masked, as the
  default mode does (`bart_opt.engine.packing.skips_padded_keys`).
* `BatchedELCrossAttention` (off the CPU, and in the static search on every device): the padded
  (B, 1, S, D) encoder output and a (B, 1, 1, S) additive key mask made once, one attention call for
  the whole batch; its shapes depend only on the batch's, and neither a call nor `keep` (given the
  rows as a device tensor) makes a host sync, so it serves fixed-shape decoding captured in CUDA
  graphs (`bart_opt.engine.static_generation`).

Only `generate` uses it: a teacher-forced forward pass runs the layers' own projections, one
layer at a time (`Bart.cross_attention`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch
import torch.nn.functional as F

from bart_opt.engine.buffers import Buffers, FreshBuffers
from bart_opt.engine.cache import aligned_bias
from bart_opt.engine.packing import skips_padded_keys


def projection_weights(attn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-attention module `attn`'s key and value weights (D, D) and value bias (D,), in the model's
    floating dtype. The one place EL-attention reads them: a mode that stores the projections
    otherwise (quantized) provides float weights here."""
    return attn.k_proj.weight, attn.v_proj.weight, attn.v_proj.bias


@dataclass(frozen=True)
class HeadWeights:
    """One layer's key and value projections viewed per head (views of the weights: no copy)."""

    keys: torch.Tensor  # (H, d, D): W_k^h, head h's rows of W_k
    values_t: torch.Tensor  # (H, D, d): W_v^h transposed
    value_bias: torch.Tensor  # (H, 1, d): b_v^h

    @classmethod
    def of(cls, attn) -> HeadWeights:
        """The views of cross-attention module `attn`'s weights (see `projection_weights`)."""
        w_k, w_v, b_v = projection_weights(attn)
        h, d = attn.heads, attn.head_dim
        d_model = w_k.shape[1]
        return cls(keys=w_k.view(h, d, d_model), values_t=w_v.view(h, d, d_model).transpose(1, 2),
                   value_bias=b_v.view(h, 1, d))


class ELCrossAttention:
    """What both layouts share: the query-side projections around one attention over the encoder output.

    `weights[layer]` holds decoder layer `layer`'s `HeadWeights`; `beams` rows of the decoder batch
    belong to each input (adjacent). Subclasses keep the encoder output and implement `attend`.
    """

    def __init__(self, weights: Sequence[HeadWeights], beams: int):
        self.weights = weights
        self.beams = beams

    def attend(self, queries: torch.Tensor, scale: float) -> torch.Tensor:
        """softmax(scale * queries . h) h over each input's encoder states h: (B, 1, M, D) -> (B, 1, M, D)."""
        raise NotImplementedError

    def __call__(self, attn, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Attention module `attn` of decoder layer `layer` applied to queries `x` (B*beams, T, D)."""
        n, t, d_model = x.shape
        w = self.weights[layer]
        heads, head_dim = attn.heads, attn.head_dim
        b, r = n // self.beams, self.beams * t  # inputs, and decoder rows per input
        q = attn.q_proj(x).view(n * t, heads, head_dim).transpose(0, 1)  # (H, N*T, d)
        q = torch.bmm(q, w.keys)  # (H, N*T, D): W_k^h^T q_h, every row of a head in one product
        # An input's heads and beams fold into the query axis of one call against its encoder states.
        q = q.view(heads, b, r, d_model).transpose(0, 1).reshape(b, 1, heads * r, d_model)  # (B, 1, H*R, D)
        context = self.attend(q, attn.scaling)  # (B, 1, H*R, D): sum_j a_j h_j per head and row
        context = context.view(b, heads, r, d_model).transpose(0, 1).reshape(heads, n * t, d_model)  # (H, N*T, D)
        out = torch.baddbmm(w.value_bias, context, w.values_t)  # (H, N*T, d): W_v^h context + b_v^h
        return attn.out_proj(out.transpose(0, 1).reshape(n, t, d_model))  # (B*beams, T, D)


class SharedELCrossAttention(ELCrossAttention):
    """EL-attention on a CPU: one call per input against its own encoder states.

    Build it with `build`. `memory[i]` is input i's (1, 1, n_i, D) encoder states, a tensor of its
    own, with the (1, 1, 1, n_i) bool mask of its real rows (None: all rows real).
    """

    def __init__(self, memory: list[tuple[torch.Tensor, torch.Tensor | None]], weights: Sequence[HeadWeights],
                 beams: int):
        super().__init__(weights, beams)
        self.memory = memory

    @classmethod
    def build(cls, attns: Sequence, memory: torch.Tensor, attention_mask: torch.Tensor | None, beams: int = 1,
              fast: bool = False) -> Self:
        """State for the cross-attention modules `attns` (one per decoder layer) over encoder states
        `memory` (B, S, D) with (B, S) 0/1 `attention_mask` (None: nothing padded); `fast`: the fast
        mode's padded-key skipping in half precision."""
        keep = None if attention_mask is None else attention_mask.bool()  # (B, S)
        skip = skips_padded_keys(memory.dtype, fast)
        states = []
        for i in range(memory.shape[0]):
            if keep is None or bool(keep[i].all()):
                states.append((memory[i, None, None].clone(), None))  # (1, 1, S, D)
            elif skip:  # the real rows only: a new tensor of n_i rows
                states.append((memory[i, keep[i]][None, None], None))  # (1, 1, n_i, D)
            else:
                states.append((memory[i, None, None].clone(), keep[i, None, None, None, :]))  # (1, 1, S, D)
        return cls(states, [HeadWeights.of(attn) for attn in attns], beams)

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the inputs `rows` (B',); the others' encoder states are freed, nothing is copied."""
        self.memory = [self.memory[i] for i in rows.tolist()]

    def attend(self, queries: torch.Tensor, scale: float) -> torch.Tensor:
        """See `ELCrossAttention.attend`; one call per input, (1, 1, M, D) against (1, 1, n_i, D)."""
        out = torch.empty_like(queries)  # (B, 1, M, D)
        for i, (h, mask) in enumerate(self.memory):
            out[i] = F.scaled_dot_product_attention(queries[i : i + 1], h, h, attn_mask=mask, scale=scale)[0]
        return out


class BatchedELCrossAttention(ELCrossAttention):
    """EL-attention off the CPU: the whole batch in one call, padded keys masked additively.

    Build it with `build`. `memory` is the (B, 1, S, D) encoder output (a view of it, padding
    included) and `key_bias` the (B, 1, 1, S) additive key mask (0 at tokens, -inf at padding, rows
    16-aligned: `bart_opt.engine.cache.aligned_bias`), made whether or not anything is padded, so that a
    call's work depends on the batch's shape only. An input that leaves (`keep`) costs a copy of the
    others' encoder states (one tensor, not one per layer). In the static search both live in its
    buffers (`bart_opt.engine.buffers`): with CUDA graphs, copied into the persistent ones the graphs read.
    """

    def __init__(self, memory: torch.Tensor, key_bias: torch.Tensor, weights: Sequence[HeadWeights], beams: int,
                 buffers: Buffers | None = None):
        super().__init__(weights, beams)
        self.buffers = buffers if buffers is not None else FreshBuffers()
        self.memory = self.buffers.place("el.memory", memory)
        self.key_bias = self.buffers.place("el.key_bias", key_bias)

    @classmethod
    def build(cls, attns: Sequence, memory: torch.Tensor, attention_mask: torch.Tensor | None,
              beams: int = 1, buffers: Buffers | None = None) -> Self:
        """As `SharedELCrossAttention.build`, over the padded batch; the state placed in `buffers`."""
        b, s, _ = memory.shape
        keep = torch.ones(b, s, dtype=torch.bool, device=memory.device) if attention_mask is None \
            else attention_mask.bool()  # (B, S)
        return cls(memory[:, None], aligned_bias(keep, memory.dtype), [HeadWeights.of(attn) for attn in attns], beams,
                   buffers)

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the inputs `rows` (B',)."""
        self.memory = self.buffers.place("el.memory", self.memory.index_select(0, rows))
        self.key_bias = self.buffers.place("el.key_bias", _realigned(self.key_bias.index_select(0, rows)))

    def attend(self, queries: torch.Tensor, scale: float) -> torch.Tensor:
        """See `ELCrossAttention.attend`; one call, (B, 1, M, D) against (B, 1, S, D)."""
        return F.scaled_dot_product_attention(queries, self.memory, self.memory, attn_mask=self.key_bias, scale=scale)


def _realigned(bias: torch.Tensor) -> torch.Tensor:
    """An additive (B, 1, 1, S) mask copied into 16-aligned rows (`bart_opt.engine.cache.aligned_bias`)."""
    return aligned_bias(bias[:, 0, 0] == 0, bias.dtype)
