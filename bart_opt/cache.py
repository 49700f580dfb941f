"""The decoder's preallocated self-attention cache."""

from __future__ import annotations

import torch


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
