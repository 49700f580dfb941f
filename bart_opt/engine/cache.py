"""The decoder's preallocated self-attention caches: `KVCache` (the default search's: rows moved on a beam
step, or read through a table by bart_opt's CPU kernel in the fast mode) and `StaticKVCache` (the static
search's: fixed shapes, a beam's history read through a table inside attention, as far as it is filled);
and the 16-aligned attention masks of the batched layouts (`aligned_bias`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bart_opt.engine.buffers import Buffers, FreshBuffers


class KVCache:
    """Keys and values of every decoder layer, allocated once for `max_len` positions.

    One (N, H, max_len, d) tensor per layer and per side; `append` writes new positions in
    place, `reorder` permutes rows after a beam step, `keep` shrinks the batch when inputs
    leave it. Only self-attention lives here: cross-attention state is per input, not per beam.

    `indirect=True` (the fast mode, read by bart_opt's own kernel only: `bart_opt.engine.native`):
    `reorder` copies no keys or values. A row's new position is still written in the row itself,
    and an (N, max_len) int32 table `rows` says in which row each earlier position of its
    history lives; a beam step permutes the table's rows (a few kB) instead of the cache's
    (12 layers x 2 x 48 rows x 12 heads x 64 x the filled positions, at bart-base shape).
    """

    def __init__(self, layers: int, rows: int, heads: int, max_len: int, head_dim: int, dtype, device,
                 indirect: bool = False):
        shape = (rows, heads, max_len, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0
        self.max_len = max_len
        # (N, max_len): row i's position t lives in row rows[i, t]; each row's own until a reorder.
        self.rows = (torch.arange(rows, dtype=torch.int32, device=device)[:, None].expand(rows, max_len).contiguous()
                     if indirect else None)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (N, H, T, d) after the cached positions; return views (N, H, length+T, d)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise RuntimeError(f"KVCache holds {self.max_len} positions; {end} were asked for")
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def history(self, end: int) -> torch.Tensor | None:
        """(N, end) int32: the row holding each of the first `end` positions of every row's history;
        None for a direct cache, whose rows hold their own history."""
        return None if self.rows is None else self.rows[:, :end]

    def advance(self, steps: int) -> None:
        """Mark `steps` more positions as filled (after every layer appended them)."""
        self.length += steps

    def reorder(self, rows: torch.Tensor, moved: int | None = None) -> None:
        """Row i becomes old row `rows[i]` (N,), for the filled positions only.

        Indirect: the history table's rows are permuted. Direct: only the rows that change are
        copied: most beams continue their own parent's hypothesis (`rows[i] == i`) and stay where they are.
        `moved`: how many rows change, when the caller has read it (the beam search reads it with its
        other count, in one read of the device); else `nonzero` finds them (a read of its own).
        """
        if self.rows is not None:
            self.rows[:, : self.length] = self.rows[:, : self.length].index_select(0, rows)
            return
        changed = rows != torch.arange(rows.shape[0], device=rows.device)  # (N,)
        if moved is None:
            moved = changed.nonzero().squeeze(1)  # (M,)
        elif moved:
            moved = torch.argsort((~changed).to(torch.uint8), stable=True)[:moved]  # (M,) in order, no read
        if not isinstance(moved, torch.Tensor) or moved.numel() == 0:
            return
        sources = rows.index_select(0, moved)  # (M,)
        for buffers in (self.keys, self.values):
            for buf in buffers:
                filled = buf[:, :, : self.length]  # (N, H, length, d)
                filled.index_copy_(0, moved, filled.index_select(0, sources))

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the given rows (N',), one layer at a time so the copy stays small.

        Indirect: the kept rows' histories must lie within the kept rows (beam search keeps or drops
        all beams of an input, and beams exchange history only within their input); the table is
        renumbered to the rows' new places.
        """
        for buffers in (self.keys, self.values):
            for i, buf in enumerate(buffers):
                buffers[i] = buf.index_select(0, rows)
        if self.rows is not None:
            place = torch.full((self.rows.shape[0],), -1, dtype=torch.int32, device=rows.device)  # old row -> new
            place[rows] = torch.arange(rows.shape[0], dtype=torch.int32, device=rows.device)
            table = place[self.rows.index_select(0, rows).long()]  # (N', max_len)
            if bool((table < 0).any()):
                raise RuntimeError("KVCache.keep: a kept row's history lies in a row that is dropped")
            self.rows = table


STATIC_ALIGN = 16
"""`StaticKVCache` rounds its length up to a multiple of this, and so does every attention mask the
batched layouts make (`aligned_bias`): the fused attention kernels of CUDA want a mask whose rows start
16-aligned, and copy an unaligned one into a padded tensor at every call, in every layer and step."""

LENGTH_BUCKET = 32
"""A static decoder step reads its cache as far as the bucket of this many positions that holds the
filled part (the host knows how many steps it queued): at most 31 unfilled positions are read, where a
read of the whole fixed length reads up to 140 at the CNN settings. Each bucket is a shape of its own,
so a CUDA graph of its own (`bart_opt.engine.graphs`); 32 keeps them at 5 for max_length 142."""


def round_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple`."""
    return -(-n // multiple) * multiple


def aligned_bias(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive key mask of `keep` (B, S) bool (0 at kept keys, -inf at the others), (B, 1, 1, S), in
    rows whose storage is `STATIC_ALIGN`-aligned (a view of a (B, 1, 1, S') tensor, S' = S rounded up),
    so that no attention kernel copies it. The keys attended to, and so the numbers, are the same."""
    b, s = keep.shape
    bias = torch.zeros(b, 1, 1, round_up(s, STATIC_ALIGN), dtype=dtype, device=keep.device)  # (B, 1, 1, S')
    bias = bias[..., :s]  # (B, 1, 1, S)
    return bias.masked_fill_(~keep[:, None, None, :], -torch.inf)


class StaticKVCache:
    """The static decoder's self-attention cache: fixed shapes, the position on the device, beams through
    a history table read inside attention (cache indirection): a beam step moves no keys or values, and
    a step reads the cache only as far as it is filled (rounded up to `LENGTH_BUCKET`).

    Per layer one (A, L, nb, 2, H, d) tensor holds the keys (`[..., 0, :, :]`) and values (`[..., 1, :, :]`)
    of `L` positions for the `nb` beams of each of A inputs (L = max_len rounded up to `STATIC_ALIGN`); a
    step writes one (A, 1, nb, 2, H, d) slab at `position` ((1,), on the device, so that a CUDA graph
    can replay a step: nothing about the step is read on the host).

    Beams (nb > 1): `history` (A, nb, L) says which beam of the same input holds each position of beam
    i's hypothesis; a beam step permutes the table (A x nb x L integers), not the keys/values. Attention
    does not gather a row's history out of the cache: the nb queries of an input attend together over
    the positions of all its nb beams, one (Lb * nb)-key axis that is a view of the layer's tensor (the
    input's beams are adjacent, position-major), with an additive mask made once per step that keeps,
    for query i, key (t, j) when t is written and `history[a, i, t] == j`. A masked key gets exactly zero
    weight, so each query attends over its own history only, as it would over gathered keys; the price
    is arithmetic (nb times the dot products of a memory-bound kernel), where a gather costs a copy of
    the filled cache per layer and step. Greedy (nb = 1) has no table: the mask only hides the
    positions not written yet.

    `span` (a multiple of `LENGTH_BUCKET`, or L; set by the search on the host before each step) is how
    many positions a step reads: every shape of the step follows from it and the row count.

    Between `keep` calls every tensor a step reads is updated in place, so that a CUDA graph of the
    step (`bart_opt.engine.graphs`) finds each step's table and position where it was captured. With
    persistent `buffers` (`bart_opt.engine.buffers.StaticBuffers`) they also live at the same addresses in
    every call.
    """

    def __init__(self, layers: int, rows: int, heads: int, max_len: int, head_dim: int, dtype, device,
                 beams: int = 1, buffers: Buffers | None = None):
        if rows % beams:
            raise ValueError(f"a StaticKVCache of {rows} rows cannot hold {beams} beams an input")
        self.buffers = buffers if buffers is not None else FreshBuffers()
        length = round_up(max_len, STATIC_ALIGN)
        self.max_len, self.beams, self.dtype = max_len, beams, dtype
        inputs = rows // beams
        b = self.buffers
        self.kv = [b.zeros(f"cache.kv.{i}", (inputs, length, beams, 2, heads, head_dim), dtype, device)
                   for i in range(layers)]
        self.position = b.zeros("cache.position", (1,), torch.long, device)  # (1,)
        self._steps = b.place("cache.steps", torch.arange(length, device=device))  # (L,)
        self._beam_ids = b.place("cache.beam_ids", torch.arange(beams, device=device))  # (nb,)
        own = self._beam_ids[None, :, None].expand(inputs, beams, length)  # (A, nb, L) each beam its own
        self.history = b.place("cache.history", own.contiguous()) if beams > 1 else None  # (A, nb, L)
        self.span = length
        self._bias: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Positions the cache holds (L)."""
        return self._steps.shape[0]

    def begin_step(self) -> None:
        """Make the step's attention mask (every layer reads it): (A, 1, nb, span*nb), 0 where a query
        may attend, -inf elsewhere."""
        span, nb = self.span, self.beams
        written = self._steps[:span] <= self.position  # (span,) the positions written, this step's included
        if self.history is None:
            visible = written[None, None, None, :]  # (1, 1, 1, span)
        else:
            a = self.history.shape[0]
            visible = (self.history[:, :, :span, None] == self._beam_ids) & written[:, None]  # (A, nb, span, nb)
            visible = visible.view(a, 1, nb, span * nb)
        bias = torch.zeros(visible.shape, dtype=self.dtype, device=visible.device)
        self._bias = bias.masked_fill_(~visible, -torch.inf)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Write the new position's k, v (N, H, 1, d), then attend q (N, H, 1, d) over every written
        position of each row's history: (N, H, 1, d)."""
        if self._bias is None:
            self.begin_step()
        kv = self.kv[layer]  # (A, L, nb, 2, H, d)
        a, _, nb, _, h, d = kv.shape
        span = self.span
        slab = torch.stack((k[:, :, 0], v[:, :, 0]), 1).view(a, 1, nb, 2, h, d)  # (A, 1, nb, 2, H, d)
        kv.index_copy_(1, self.position, slab)
        read = kv[:, :span]  # (A, span, nb, 2, H, d): views, the filled part rounded up
        keys = read[:, :, :, 0].reshape(a, span * nb, h, d).transpose(1, 2)  # (A, H, span*nb, d), a view
        values = read[:, :, :, 1].reshape(a, span * nb, h, d).transpose(1, 2)
        queries = q[:, :, 0].view(a, nb, h, d).transpose(1, 2)  # (A, H, nb, d): an input's beams together
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self._bias, scale=scale)  # (A, H, nb, d)
        return out.transpose(1, 2).reshape(a * nb, h, 1, d)  # (N, H, 1, d)

    def advance(self, steps: int) -> None:
        """Mark the position as written (after every layer wrote it): the next step attends to one more."""
        if steps != 1:
            raise RuntimeError("a StaticKVCache is written one position a step")
        self.position += 1
        self._bias = None

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i continues old row `rows[i]` (N,), a beam of the same input: the written part of its
        history becomes that row's."""
        if self.history is None:
            raise RuntimeError("a StaticKVCache of one beam an input has no beams to reorder")
        a, nb, length = self.history.shape
        parents = (rows.view(a, nb) % nb)[:, :, None].expand(a, nb, length)  # (A, nb, L) beams within the input
        written = self._steps < self.position  # (L,)
        own = self._beam_ids[None, :, None]  # (1, nb, 1)
        torch.where(written, self.history.gather(1, parents), own, out=self.history)

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the rows `rows` (N'), every beam of the inputs kept, one layer at a time; the history
        table's beam numbers stay valid (beams exchange history only within their input)."""
        inputs = rows.view(-1, self.beams)[:, 0] // self.beams  # (A',)
        b = self.buffers
        for i, kv in enumerate(self.kv):
            self.kv[i] = b.place(f"cache.kv.{i}", kv.index_select(0, inputs))
        if self.history is not None:
            self.history = b.place("cache.history", self.history.index_select(0, inputs))
