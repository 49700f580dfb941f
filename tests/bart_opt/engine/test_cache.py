"""The decoder's self-attention cache: beam reordering copies only moved rows, with the same result."""

from __future__ import annotations

import pytest
import torch

import torch.nn.functional as F

from bart_opt.engine.cache import STATIC_ALIGN, KVCache, StaticKVCache


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


def _histories(cache: KVCache, layer: int) -> torch.Tensor:
    """(N, H, length, d): every row's keys as attention reads them, through the history table if indirect."""
    keys = cache.keys[layer][:, :, : cache.length]  # (N, H, L, d)
    if cache.rows is None:
        return keys
    table = cache.history(cache.length).long()  # (N, L)
    positions = torch.arange(cache.length)
    return keys[table, :, positions[None, :]].permute(0, 2, 1, 3)  # (N, L, H, d) -> (N, H, L, d)


def test_an_indirect_cache_reads_the_same_histories_as_a_copying_one():
    """Beam steps (reorders), inputs leaving (keep) and appends, applied to both kinds of cache alike."""
    gen = torch.Generator().manual_seed(0)
    beams, inputs = 3, 4
    caches = [KVCache(layers=2, rows=beams * inputs, heads=2, max_len=9, head_dim=4, dtype=torch.float32,
                      device="cpu", indirect=indirect) for indirect in (False, True)]
    live = inputs
    for step in range(8):
        n = live * beams
        k, v = torch.randn(n, 2, 1, 4, generator=gen), torch.randn(n, 2, 1, 4, generator=gen)
        for cache in caches:
            for layer in range(2):
                cache.append(layer, k, v)
            cache.advance(1)
        # each input's beams continue from parents among its own beams
        parents = (torch.randint(0, beams, (live, beams), generator=gen) + beams * torch.arange(live)[:, None]).flatten()
        for cache in caches:
            cache.reorder(parents)
        if step in (3, 5):  # the second input leaves, then the last one
            kept = [i for i in range(live) if i != (1 if step == 3 else live - 1)]
            rows = (torch.tensor(kept)[:, None] * beams + torch.arange(beams)).flatten()
            for cache in caches:
                cache.keep(rows)
            live -= 1
        for layer in range(2):
            assert torch.equal(_histories(caches[0], layer), _histories(caches[1], layer)), (step, layer)
    assert caches[1].rows.shape[0] == live * beams and caches[1].keys[0].shape[0] == live * beams


def test_an_indirect_cache_refuses_to_drop_a_row_a_kept_history_lives_in():
    cache = KVCache(layers=1, rows=4, heads=1, max_len=3, head_dim=2, dtype=torch.float32, device="cpu", indirect=True)
    cache.append(0, torch.randn(4, 1, 1, 2), torch.randn(4, 1, 1, 2))
    cache.advance(1)
    cache.reorder(torch.tensor([3, 1, 2, 3]))  # row 0 now continues row 3's history
    with pytest.raises(RuntimeError, match="history lies in a row that is dropped"):
        cache.keep(torch.tensor([0, 1]))


def _static_histories(cache: StaticKVCache, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, H, length, d) keys and values of every row's history as the static cache's table says."""
    kv = cache.kv[layer]  # (A, L, nb, 2, H, d)
    a, _, nb = kv.shape[:3]
    inputs = torch.arange(a)[:, None, None].expand(a, nb, length)
    positions = torch.arange(length)[None, None, :].expand(a, nb, length)
    read = kv[inputs, positions, cache.history[:, :, :length]]  # (A, nb, length, 2, H, d)
    read = read.flatten(0, 1)  # (N, length, 2, H, d)
    return read[:, :, 0].transpose(1, 2), read[:, :, 1].transpose(1, 2)


def test_a_static_cache_holds_the_histories_of_a_copying_one_and_attends_over_them():
    """Beam steps, inputs leaving and appends applied to both caches; the static one's position lives on the
    device, a beam step permutes its table only, and its attention (an input's beams together over all their
    positions, masked through the table) equals attention over each row's gathered history."""
    gen = torch.Generator().manual_seed(0)
    beams, inputs, heads, d = 3, 4, 2, 4
    direct = KVCache(layers=2, rows=beams * inputs, heads=heads, max_len=9, head_dim=d, dtype=torch.float32, device="cpu")
    static = StaticKVCache(layers=2, rows=beams * inputs, heads=heads, max_len=9, head_dim=d, dtype=torch.float32,
                           device="cpu", beams=beams)
    assert static.kv[0].shape[1] % STATIC_ALIGN == 0 and static.kv[0].shape[1] >= 9
    live = inputs
    for step in range(8):
        n = live * beams
        q, k, v = (torch.randn(n, heads, 1, d, generator=gen) for _ in range(3))
        static.span = static.length if step % 2 else STATIC_ALIGN  # reading more than the filled part changes nothing
        for layer in range(2):
            keys, values = direct.append(layer, k, v)
            expected = F.scaled_dot_product_attention(q, keys, values, scale=0.5)
            torch.testing.assert_close(static.attend(layer, q, k, v, 0.5), expected, atol=1e-6, rtol=1e-6)
        direct.advance(1)
        static.advance(1)
        assert int(static.position) == direct.length == step + 1
        parents = (torch.randint(0, beams, (live, beams), generator=gen) + beams * torch.arange(live)[:, None]).flatten()
        direct.reorder(parents)
        kv = [t.clone() for t in static.kv]
        static.reorder(parents)
        assert all(torch.equal(a, b) for a, b in zip(kv, static.kv)), "a beam step moves no keys or values"
        if step in (3, 5):  # the second input leaves, then the last one
            kept = [i for i in range(live) if i != (1 if step == 3 else live - 1)]
            rows = (torch.tensor(kept)[:, None] * beams + torch.arange(beams)).flatten()
            direct.keep(rows)
            static.keep(rows)
            live -= 1
        for layer in range(2):
            keys, values = _static_histories(static, layer, direct.length)
            assert torch.equal(keys, direct.keys[layer][:, :, : direct.length]), (step, layer)
            assert torch.equal(values, direct.values[layer][:, :, : direct.length]), (step, layer)
    assert static.history.shape == (live, beams, static.kv[0].shape[1])


def test_a_greedy_static_cache_has_no_table_and_reads_its_filled_part():
    cache = StaticKVCache(layers=1, rows=3, heads=2, max_len=40, head_dim=4, dtype=torch.float32, device="cpu")
    assert cache.history is None and cache.length == 48
    gen = torch.Generator().manual_seed(1)
    keys = []
    for _ in range(5):
        q, k, v = (torch.randn(3, 2, 1, 4, generator=gen) for _ in range(3))
        keys.append(k)
        cache.span = 32
        got = cache.attend(0, q, k, v, 0.5)
        expected = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(
            [cache.kv[0][:, t, 0, 1].unsqueeze(2) for t in range(len(keys))], 2), scale=0.5)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
        assert cache._bias.shape == (1, 1, 1, 32), "the mask covers the span read, not the whole length"
        cache.advance(1)
    with pytest.raises(RuntimeError, match="no beams"):
        cache.reorder(torch.arange(3))


def test_a_static_cache_step_updates_its_tensors_in_place():
    """A CUDA graph replays a step against the tensors it was captured with: nothing a step reads may be rebound."""
    cache = StaticKVCache(layers=1, rows=4, heads=1, max_len=5, head_dim=2, dtype=torch.float32, device="cpu", beams=2)
    read = {name: getattr(cache, name) for name in ("position", "history", "_steps", "_beam_ids")}
    kv = cache.kv[0]
    for _ in range(3):
        cache.attend(0, *(torch.randn(4, 1, 1, 2) for _ in range(3)), scale=1.0)
        cache.advance(1)
        cache.reorder(torch.tensor([1, 1, 3, 2]))
    assert all(getattr(cache, name) is tensor for name, tensor in read.items()) and cache.kv[0] is kv
    # rows 0 and 1 (input 0) continue beam 1; rows 2 and 3 (input 1) swap: the table holds beam numbers.
    assert cache.history[:, :, :3].tolist() == [[[1, 1, 1], [1, 1, 1]], [[1, 0, 1], [0, 1, 0]]]
    assert cache.history[:, :, 3:].tolist() == [[[0] * 13, [1] * 13]] * 2  # unwritten (L = 16): their own
    cache.begin_step()  # position 3: keys (t, j) visible for query i where t <= 3 and history[i, t] == j
    visible = (cache._bias == 0).view(2, 2, 16, 2)[:, :, :5]  # (A, nb, t, j)
    assert visible[1, 0].tolist() == [[False, True], [True, False], [False, True], [True, False], [False, False]]
