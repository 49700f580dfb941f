"""The decoder's preallocated self-attention cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Keys and values of every decoder layer, allocated once for `max_len` positions.

    One (N, H, max_len, d) tensor per layer and per side; `append` writes new positions in
    place, `reorder` permutes rows after a beam step, `keep` shrinks the batch when inputs
    leave it. Only self-attention lives here: cross-attention state is per input, not per beam.

    `indirect=True` (the fast mode, read by bart_opt's own kernel only: `bart_opt.native`):
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

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i becomes old row `rows[i]` (N,), for the filled positions only.

        Indirect: the history table's rows are permuted. Direct: only the rows that change are
        copied: most beams continue their own parent's hypothesis (`rows[i] == i`) and stay where they are.
        """
        if self.rows is not None:
            self.rows[:, : self.length] = self.rows[:, : self.length].index_select(0, rows)
            return
        moved = (rows != torch.arange(rows.shape[0], device=rows.device)).nonzero().squeeze(1)  # (M,)
        if moved.numel() == 0:
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
"""`StaticKVCache` rounds its length up to a multiple of this: the fused attention kernels of CUDA
want a mask whose last dimension is 16-aligned, and copy an unaligned one at every call."""


class StaticKVCache:
    """The static decoder's self-attention cache: fixed shapes, a position on the device, beams
    through a history table (cache indirection) instead of moved rows.

    Per layer one (L, N, 2, H, d) tensor holds the keys (`[:, :, 0]`) and values (`[:, :, 1]`) of
    `L` positions (position-major: a step writes one contiguous (N, 2, H, d) slab) for N rows.
    `position` (1,) is the position the next step writes, on the device, so that a CUDA graph can
    replay a step: nothing about the step is read on the host. `history` (N, L) says which row holds
    each position of row i's hypothesis; a beam step permutes the table (N x L integers), not the
    keys/values. Attention reads every row's history through it with one gather of the layer's
    keys/values (a copy of (N, H, L, d) x 2) and then attends over all L positions with an additive
    mask that hides the ones not written yet (`bias`, (1, 1, 1, L), 0 or -inf).

    Between `keep` calls every tensor a step reads is updated in place, so that a CUDA graph of the
    step (`bart_opt.graphs`) finds each step's table, index and mask where it was captured.

    The gather reads the whole cache each step, where the default copies only the rows a beam step
    moved (it needs a host sync to know them): `docs/gpu.md` has the measured costs.
    """

    def __init__(self, layers: int, rows: int, heads: int, max_len: int, head_dim: int, dtype, device):
        length = -(-max_len // STATIC_ALIGN) * STATIC_ALIGN
        self.max_len = max_len
        self.kv = [torch.zeros(length, rows, 2, heads, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.position = torch.zeros(1, dtype=torch.long, device=device)  # (1,)
        self._steps = torch.arange(length, device=device)  # (L,)
        self.bias = torch.full((1, 1, 1, length), -torch.inf, dtype=dtype, device=device)  # (1, 1, 1, L)
        self.bias[..., 0] = 0  # the first step attends to position 0
        self._rows(torch.arange(rows, device=device)[:, None].expand(rows, length).contiguous())

    def _rows(self, history: torch.Tensor) -> None:
        """Take `history` (N, L) and make the tensors sized by the row count N."""
        rows = history.shape[0]
        self.history = history
        self._own = torch.arange(rows, device=history.device)[:, None].expand_as(history)  # (N, L) the unwritten part
        self._offsets = self._steps[None, :] * rows  # (1, L) where position t's rows start in a flat layer
        self._index = torch.empty(history.shape, dtype=torch.long, device=history.device)  # (N, L)
        self._reindex()

    def _reindex(self) -> None:
        """The flat index of every row's history into a layer's (L*N, 2, H, d) rows, after `history` changed."""
        torch.add(self.history, self._offsets, out=self._index)  # (N, L)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Write the new position's k, v (N, H, 1, d), then attend q (N, H, 1, d) over every written
        position of each row's history: (N, H, 1, d)."""
        kv = self.kv[layer]  # (L, N, 2, H, d)
        length, rows = kv.shape[:2]
        kv.index_copy_(0, self.position, torch.stack((k, v), 3).permute(2, 0, 3, 1, 4))  # (1, N, 2, H, d) at `position`
        read = kv.view(length * rows, *kv.shape[2:]).index_select(0, self._index.view(-1))  # (N*L, 2, H, d)
        read = read.view(rows, length, *kv.shape[2:]).permute(2, 0, 3, 1, 4)  # (2, N, H, L, d)
        return F.scaled_dot_product_attention(q, read[0], read[1], attn_mask=self.bias, scale=scale)

    def advance(self, steps: int) -> None:
        """Mark the position as written (after every layer wrote it): the next step attends to one more."""
        if steps != 1:
            raise RuntimeError("a StaticKVCache is written one position a step")
        self.position += 1
        self.bias.view(-1).index_fill_(0, self.position, 0)

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i continues old row `rows[i]` (N,): the written part of its history becomes that row's."""
        written = self._steps[None, :] < self.position  # (1, L)
        torch.where(written, self.history.index_select(0, rows), self._own, out=self.history)
        self._reindex()

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the rows `rows` (N',), one layer at a time; a kept row's history lies in kept rows
        (beams exchange history only within their input, and inputs are kept or dropped whole)."""
        for i, kv in enumerate(self.kv):
            self.kv[i] = kv.index_select(1, rows)
        kept = torch.arange(rows.shape[0], device=rows.device)  # (N',)
        place = torch.zeros(self.history.shape[0], dtype=torch.long, device=rows.device).index_copy_(0, rows, kept)
        self._rows(place[self.history.index_select(0, rows)])  # (N', L): old row -> its new place
