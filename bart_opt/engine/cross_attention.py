"""The decoder's cross-attention state, and the three ways of computing cross-attention over it.

All three keep every decoder layer's cross-attention keys and values once per input for the
whole of a generate call; inputs that finish may leave the state (`keep`). They differ in how
the arithmetic is shaped:

* `SharedCrossAttention` (the default on a CPU): keys/values are kept per input, so that an input that
  leaves the batch frees its own tensors without copying the others'; in float32 they cover
  its real encoder states only, (1, H, n_i, d), so padding is neither stored nor attended to
  (half precision keeps and masks it, except in the fast mode: `bart_opt.engine.packing.skips_padded_keys`).
  The beams of one
  input are folded into the query axis of one attention call against its single copy: nothing
  is copied per beam. The kernel sees a query length of `beams` instead of 1, which rounds
  differently in the last bits, and beam search can turn such a difference into another
  (near-tied) hypothesis. The fast mode runs those calls through bart_opt's own bfloat16 kernel
  (`bart_opt.engine.native`) where it can.
* `BatchedCrossAttention` (the default, and the fast mode, off the CPU): the same folding of
  beams into queries, in one call for the whole batch against (B, H, S, d) keys/values with the
  padded keys masked, because there a call per input costs a kernel launch per input
  (`bart_opt.engine.packing.attends_per_input`).
* `ExactCrossAttention` (`exact=True`): the kernels get the inputs transformers' BART gives them
  during beam search, which expands the encoder output per beam and caches contiguous per-beam
  keys/values: the projections run on the per-beam copy of the encoder states (same
  matrix-product shape, so the same kernel and rounding) and one beam's rows are kept, (B, H, S, d);
  each attention call copies the one layer it needs to (B*beams, H, S, d), contiguous, into
  buffers all layers share, with a materialized (B*beams, 1, T, S) bool mask. The per-beam copies
  of all layers never exist together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Self

import torch
import torch.nn.functional as F

from bart_opt.engine import native
from bart_opt.engine.buffers import Buffers, FreshBuffers
from bart_opt.engine.cache import aligned_bias
from bart_opt.engine.packing import Packing, skips_padded_keys

InputKeysValues = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
"""One input's keys and values (1, H, n, d) and the (1, 1, 1, n) mask of its real keys (None: all real)."""


class LazyLayers(Sequence):
    """Per-layer state computed when asked for (teacher-forced forward), so that only one layer's
    keys/values exist at a time."""

    def __init__(self, attns: Sequence, project: Callable):
        self.attns, self.project = attns, project

    def __len__(self) -> int:
        return len(self.attns)

    def __getitem__(self, i: int):
        return self.project(self.attns[i])


def stores_compact(memory: torch.Tensor) -> bool:
    """Whether the default mode keeps each input's cross keys/values contiguous rather than as views
    of the fused key/value product (rows 2*D apart): on a CPU, in every dtype.

    The attention kernel reads the same numbers either way (its outputs are bit-identical), but on a
    CPU it is faster on contiguous keys/values. Measured on this 2-core CPU (Sapphire Rapids), a
    decoder step's (1, 12, 4, 64) queries against 1,024 keys of bart-base shape: in half precision, one
    thread, 1.46 ms strided against 0.68 ms contiguous; in float32 on 2 threads inside a generate (4
    CNN-length documents, every library limited to AVX2), 0.64 against 0.30 ms per call, which made
    the int8 mode's generate of the CTranslate2 benchmark's 12 documents 12% faster (14.6 -> 12.8 s)
    and float32's 8% (4 documents). The copy is made once per generate call, layer by layer, and frees
    the fused product it came from.
    """
    return memory.device.type == "cpu"


class SharedCrossAttention:
    """Cross-attention state of B inputs with `beams` decoder rows each (rows of one input adjacent).

    Build it with `build`. `kv[layer][i]` holds decoder layer `layer`'s `InputKeysValues` for input i.
    """

    def __init__(self, kv: Sequence[list[InputKeysValues]], beams: int, native_kernel: bool = False):
        self.kv = kv
        self.beams = beams
        self.native_kernel = native_kernel

    @classmethod
    def build(cls, attns: Sequence, memory: torch.Tensor, attention_mask: torch.Tensor | None, beams: int = 1,
              lazy: bool = False, fast: bool = False, state_dtype: torch.dtype | None = None,
              kernel: bool = False) -> SharedCrossAttention:
        """State for the cross-attention modules `attns` (one per decoder layer) over encoder states
        `memory` (B, S, D) with (B, S) 0/1 `attention_mask` (None: nothing padded). `lazy`: project
        each layer's keys/values only when it runs (a single teacher-forced pass; such a state is
        used once and not shrunk). `fast`: the fast mode's padded-key skipping and kernel.
        `state_dtype`: keep the keys/values in that dtype (the int8 mode's bfloat16), not `memory`'s;
        queries are rounded to it for the attention call (`Bart.state_dtype`). `kernel`: attend with bart_opt's
        kernel (`Bart.uses_kernel`) where no key is masked (padded keys left out)."""
        b, s, _ = memory.shape
        skip = skips_padded_keys(memory.dtype, fast)
        packing = Packing(attention_mask, b, s, pack=skip)
        packed = packing.pack(memory)  # (N, D)
        masks = [None if skip else packing.key_mask(i) for i in range(b)]  # (1, 1, 1, S) or None

        compact = stores_compact(memory)
        stored = None if lazy else state_dtype  # a teacher-forced pass keeps the layers' own arithmetic

        def project(attn) -> list[InputKeysValues]:
            # One product per input, so that each input's tensors can be freed on their own.
            out = []
            for rows, mask in zip(packing.rows, masks):
                k, v = attn.keys_values(packed[None, rows])  # (1, H, n_i, d) views of one fused product
                if stored is not None and stored != k.dtype:
                    k, v = (t.to(stored, memory_format=torch.contiguous_format) for t in (k, v))
                out.append((k.contiguous(), v.contiguous(), mask) if compact else (k, v, mask))
            return out

        kv = LazyLayers(attns, project) if lazy else [project(attn) for attn in attns]
        return cls(kv, beams, native_kernel=kernel and skip and not lazy and bool(attns))

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the inputs `rows` (B',); the others' keys/values are freed, nothing is copied."""
        kept = rows.tolist()
        for layer, per_input in enumerate(self.kv):
            self.kv[layer] = [per_input[i] for i in kept]

    def __call__(self, attn, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Attention module `attn` of decoder layer `layer` applied to queries `x` (B*beams, T, D)."""
        n, t, d_model = x.shape
        per_input = self.kv[layer]
        b = len(per_input)
        # Rows of one input's beams are adjacent, so they fold into the query axis: each query
        # attends independently, and the keys/values are shared without a per-beam copy.
        q = attn.q_proj(x).view(b, self.beams * t, attn.heads, attn.head_dim).transpose(1, 2)  # (B, H, beams*T, d)
        state = per_input[0][0].dtype if per_input else x.dtype  # the keys/values' dtype
        q = q.to(state)  # rounded to the state's dtype where it is another (the int8 mode's bfloat16)
        out = x.new_empty(b, self.beams * t, attn.heads, attn.head_dim, dtype=state)  # (B, beams*T, H, d)
        for i, (k, v, mask) in enumerate(per_input):  # (1, H, n_i, d)
            if self.native_kernel:  # padded keys left out: no mask
                native.decode_attention(q[i : i + 1], k, v, attn.scaling, out=out[i : i + 1].transpose(1, 2))
                continue
            attended = F.scaled_dot_product_attention(q[i : i + 1], k, v, attn_mask=mask, scale=attn.scaling)
            out[i] = attended[0].transpose(0, 1)
        return attn.out_proj(out.view(n, t, d_model).to(x.dtype))  # (B*beams, T, D)


class BatchedCrossAttention:
    """The default (and fast) mode off the CPU: every input in one attention call (`bart_opt.engine.packing.attends_per_input`).

    Build it with `build`. `kv[layer]` holds decoder layer `layer`'s keys and values, (B, H, S, d)
    each (views of the fused key/value product), once per input, padding included; the beams of
    an input are folded into the query axis, as in `SharedCrossAttention`, and padded keys are
    masked by an additive mask made once per call (`bias`, (B, 1, 1, S), 0 at real keys and -inf at
    padding, its rows 16-aligned: `bart_opt.engine.cache.aligned_bias`), not converted from a bool mask, and
    copied into an aligned one, inside every attention call; the numbers are those the conversion
    gives, so the result is the same bit for bit. An input that leaves (`keep`) costs a copy of the
    others' keys/values, one layer at a time: on a GPU that is a fraction of a millisecond, where
    per-input calls cost a kernel launch per input, layer and step.
    """

    bias: torch.Tensor | None = None

    def __init__(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor | None,
                 beams: int, dtype: torch.dtype | None = None):
        self.kv = kv
        self.beams = beams
        self.pad_mask = None if attention_mask is None else attention_mask.bool()  # (B, S) True = token
        if self.pad_mask is not None and dtype is not None:
            self.bias = aligned_bias(self.pad_mask, dtype)  # (B, 1, 1, S)

    @classmethod
    def build(cls, attns: Sequence, memory: torch.Tensor, attention_mask: torch.Tensor | None, beams: int = 1,
              lazy: bool = False) -> Self:
        """As `SharedCrossAttention.build`, with one (B, H, S, d) pair per layer made by `cls.project`."""
        def project(attn) -> tuple[torch.Tensor, torch.Tensor]:
            return cls.project(attn, memory, beams)

        kv = LazyLayers(attns, project) if lazy else [project(attn) for attn in attns]
        return cls(kv, attention_mask, beams, memory.dtype)

    @staticmethod
    def project(attn, memory: torch.Tensor, beams: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values (B, H, S, d) from the encoder states (B, S, D)."""
        return attn.keys_values(memory)

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the inputs `rows` (B',), one layer at a time so the copies stay small."""
        for i, (k, v) in enumerate(self.kv):
            self.kv[i] = (k.index_select(0, rows), v.index_select(0, rows))
        if self.pad_mask is not None:
            self.pad_mask = self.pad_mask.index_select(0, rows)
        if self.bias is not None:
            self.bias = aligned_bias(self.pad_mask, self.bias.dtype)

    def __call__(self, attn, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Attention module `attn` of decoder layer `layer` applied to queries `x` (B*beams, T, D)."""
        n, t, d_model = x.shape
        k, v = self.kv[layer]  # (B, H, S, d)
        b = k.shape[0]
        q = attn.q_proj(x).view(b, self.beams * t, attn.heads, attn.head_dim).transpose(1, 2)  # (B, H, beams*T, d)
        mask = self.key_mask()  # (B, 1, 1, S) or None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)  # (B, H, beams*T, d)
        return attn.out_proj(out.transpose(1, 2).reshape(n, t, d_model))  # (B*beams, T, D)

    def key_mask(self) -> torch.Tensor | None:
        """The additive (B, 1, 1, S) mask of the real keys, or None when nothing is padded."""
        return self.bias


class ExactCrossAttention(BatchedCrossAttention):
    """Cross-attention shaped as transformers shapes it, for bit-identical outputs.

    It keeps its state as `BatchedCrossAttention` does (and reuses its `build` and `keep`); what it
    changes is how the keys/values are projected and how a call reads them.

    Build it with `build`. `kv[layer]` holds decoder layer `layer`'s keys and values, (B, H, S, d)
    each, once per input between calls; a call copies the one layer it needs into a
    (B*beams, H, S, d) pair of buffers, contiguous, that every layer and step reuses (a fresh
    allocation of that size per call costs more in page faults than the copy itself).
    """

    def __init__(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor | None,
                 beams: int, dtype: torch.dtype | None = None):
        super().__init__(kv, attention_mask, beams)  # no additive mask: transformers' bool one, materialized
        self._row_masks: dict[int, torch.Tensor] = {}
        self._per_beam: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def project(attn, memory: torch.Tensor, beams: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values (B, H, S, d), contiguous, from the encoder states (B, S, D)."""
        if beams == 1:
            k, v = attn.keys_values(memory)
            return k.contiguous(), v.contiguous()  # (B, H, S, d), laid out as transformers caches them
        # transformers projects the per-beam copy of the encoder states: a matrix product with
        # beams x the rows, whose kernel (and so rounding) may differ from the un-expanded one's.
        # Its rows for the beams of one input are equal; one beam's are kept.
        expanded = memory.repeat_interleave(beams, dim=0)  # (B*beams, S, D)
        k, v = attn.keys_values(expanded)  # (B*beams, H, S, d)
        return k[::beams].contiguous(), v[::beams].contiguous()  # (B, H, S, d)

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the inputs `rows` (B',), one layer at a time so the copies stay small."""
        super().keep(rows)
        self._row_masks.clear()
        self._per_beam = None

    def _row_mask(self, t: int) -> torch.Tensor | None:
        """(B*beams, 1, T, S) bool mask, materialized as transformers materializes it; built once per T."""
        if self.pad_mask is None:
            return None
        if t not in self._row_masks:
            rows = self.pad_mask.repeat_interleave(self.beams, dim=0)  # (B*beams, S)
            self._row_masks[t] = rows[:, None, None, :].expand(-1, 1, t, -1).contiguous()
        return self._row_masks[t]

    def _expand(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's (B, H, S, d) keys/values copied per beam into the shared (B*beams, H, S, d) buffers."""
        b, h, s, d = k.shape
        if self._per_beam is None:
            self._per_beam = (k.new_empty(b * self.beams, h, s, d), v.new_empty(b * self.beams, h, s, d))
        for source, buffer in zip((k, v), self._per_beam):
            buffer.view(b, self.beams, h, s, d).copy_(source[:, None].expand(b, self.beams, h, s, d))
        return self._per_beam

    def __call__(self, attn, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Attention module `attn` of decoder layer `layer` applied to queries `x` (B*beams, T, D)."""
        k, v = self.kv[layer]  # (B, H, S, d)
        if self.beams > 1:
            k, v = self._expand(k, v)  # (B*beams, H, S, d)
        q = attn.split(attn.q_proj(x))  # (B*beams, H, T, d)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self._row_mask(x.shape[1]), scale=attn.scaling)
        return attn.out_proj(attn.merge(out))  # (B*beams, T, D)


class StaticCrossAttention(BatchedCrossAttention):
    """The static search's cross-attention (`Bart.static`, on any device): `BatchedCrossAttention`'s
    state and single call for the batch, its tensors in the search's buffers (`bart_opt.engine.buffers`): with
    CUDA graphs, persistent ones the graphs read (each layer's keys and values copied in, contiguous,
    as its projection is made, so that one layer's fresh product exists at a time beside them).
    """

    @classmethod
    def build(cls, attns: Sequence, memory: torch.Tensor, attention_mask: torch.Tensor | None, beams: int = 1,
              lazy: bool = False, buffers: Buffers | None = None) -> Self:
        """As `BatchedCrossAttention.build`, each layer's keys/values and the mask placed in `buffers`."""
        b = buffers if buffers is not None else FreshBuffers()
        if lazy:
            return super().build(attns, memory, attention_mask, beams, lazy=True)
        kv = []
        for i, attn in enumerate(attns):
            k, v = cls.project(attn, memory, beams)  # (B, H, S, d)
            kv.append((b.place(f"cross.k.{i}", k), b.place(f"cross.v.{i}", v)))
            del k, v
        state = cls(kv, attention_mask, beams, memory.dtype)
        state.buffers = b
        if state.bias is not None:
            state.bias = b.place("cross.bias", state.bias)
        return state

    buffers: Buffers = FreshBuffers()

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the inputs `rows` (B',), one layer at a time so the copies stay small."""
        b = self.buffers
        for i, (k, v) in enumerate(self.kv):
            self.kv[i] = (b.place(f"cross.k.{i}", k.index_select(0, rows)),
                          b.place(f"cross.v.{i}", v.index_select(0, rows)))
        if self.pad_mask is not None:
            self.pad_mask = self.pad_mask.index_select(0, rows)
        if self.bias is not None:
            self.bias = b.place("cross.bias", aligned_bias(self.pad_mask, self.bias.dtype))


CrossAttention = SharedCrossAttention | BatchedCrossAttention | ExactCrossAttention | StaticCrossAttention
