"""The decoder's self-attention cache: beam reordering copies only moved rows, with the same result."""

from __future__ import annotations

import torch

from bart_opt.cache import KVCache


def test_reorder_equals_a_full_gather_and_leaves_unfilled_positions():
    cache = KVCache(layers=2, rows=6, heads=2, max_len=5, head_dim=3, dtype=torch.float32, device="cpu")
    for layer in range(2):
        cache.append(layer, torch.randn(6, 2, 3, 3), torch.randn(6, 2, 3, 3))
    cache.advance(3)
    for buf in (*cache.keys, *cache.values):
        buf[:, :, 3:] = -7.0
    before = [buf.clone() for buf in (*cache.keys, *cache.values)]
    rows = torch.tensor([0, 0, 2, 1, 4, 4])  # rows 0, 2, 4 stay; 1, 3, 5 take other parents
    cache.reorder(rows)
    for old, new in zip(before, (*cache.keys, *cache.values)):
        assert torch.equal(new[:, :, :3], old[:, :, :3].index_select(0, rows))
        assert bool((new[:, :, 3:] == -7.0).all())
    cache.reorder(torch.arange(6))  # nothing moved: nothing changes
    assert torch.equal(cache.keys[0][:, :, :3], before[0][:, :, :3].index_select(0, rows))
