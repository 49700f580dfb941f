"""The cache-read bench (`python -m bart_opt.bench.cache_read`) at a tiny size: its reads agree and it prints them."""

from __future__ import annotations

import torch

from bart_opt.bench import cache_read


def test_the_reads_attend_alike():
    x = cache_read._inputs(rows=8, heads=2, head_dim=4, length=16, filled=5)
    # The default's cache holds, for each row, the history the static table points at.
    steps = torch.arange(16)
    keys, values = x["kv"][steps[None, :], x["history"], 0], x["kv"][steps[None, :], x["history"], 1]  # (N, L, H, d)
    x["keys"], x["values"] = keys.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous()
    x["parents"] = torch.arange(8)  # nothing moves: the default reads its cache as it is
    args = (x["q"], x["kv"], x["history"], x["position"])
    expected = cache_read.default_read(x)
    torch.testing.assert_close(cache_read.static_read(*args), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cache_read.fused_read(*args), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cache_read.table_read(x["q"], x["cache"]), expected, atol=1e-6, rtol=1e-6)


def test_tiny_cache_read_bench_prints_every_read(capsys):
    assert cache_read.main(["--rows", "8", "--heads", "2", "--head-dim", "8", "--length", "16", "--filled", "5",
                            "--repeats", "1"]) == 0
    printed = capsys.readouterr().out
    for name in ("default: reorder + attend", "static: table inside attention",
                 "static (before issue 37): gather + attend", "static, compiled: fused read",
                 "static, compiled: gather + attend"):
        assert f"| {name} |" in printed
    assert "| default: reorder + attend |" in printed and "| 1.00x |" in printed
