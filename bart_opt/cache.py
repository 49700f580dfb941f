"""The decoder's preallocated self-attention cache."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every decoder layer, allocated once for `max_len` positions.

    One (N, H, max_len, d) tensor per layer and per side; `append` writes new positions in
    place, `reorder` permutes rows after a beam step, `keep` shrinks the batch when inputs
    leave it. Only self-attention lives here: cross-attention state is per input, not per beam.
    """

    def __init__(self, layers: int, rows: int, heads: int, max_len: int, head_dim: int, dtype, device):
        shape = (rows, heads, max_len, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0
        self.max_len = max_len

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (N, H, T, d) after the cached positions; return views (N, H, length+T, d)."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise RuntimeError(f"KVCache holds {self.max_len} positions; {end} were asked for")
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, steps: int) -> None:
        """Mark `steps` more positions as filled (after every layer appended them)."""
        self.length += steps

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i becomes old row `rows[i]` (N,), for the filled positions only.

        Only the rows that change are copied: most beams continue their own parent's hypothesis
        (`rows[i] == i`) and stay where they are.
        """
        moved = (rows != torch.arange(rows.shape[0], device=rows.device)).nonzero().squeeze(1)  # (M,)
        if moved.numel() == 0:
            return
        sources = rows.index_select(0, moved)  # (M,)
        for buffers in (self.keys, self.values):
            for buf in buffers:
                filled = buf[:, :, : self.length]  # (N, H, length, d)
                filled.index_copy_(0, moved, filled.index_select(0, sources))

    def keep(self, rows: torch.Tensor) -> None:
        """Shrink to the given rows (N',), one layer at a time so the copy stays small."""
        for buffers in (self.keys, self.values):
            for i, buf in enumerate(buffers):
                buffers[i] = buf.index_select(0, rows)
