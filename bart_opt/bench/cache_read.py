"""What reading the decoder's self-attention cache costs a beam step, per layer, on a CPU: the default's
copy of moved rows against the static search's history table (`bart_opt.engine.cache.StaticKVCache`), now and
as it was.

- `default: reorder + attend`: the moved rows' filled positions copied (`KVCache.reorder`, a host sync
  to find them), then attention over the filled positions;
- `static: table inside attention`: what the static search runs (`bart_opt.engine.cache.StaticKVCache.attend`):
  no gather; the beams of an input attend together over the positions of all its beams, read as far as
  the filled part rounded up to `LENGTH_BUCKET`, masked to each beam's own history through the table;
- `static (before issue 37): gather + attend`: every row's history gathered through a table of rows
  over the whole fixed length, then attention with the unwritten positions masked;
- `static, compiled: fused read`: the same read written as reductions (scores = q.k, weights, sum of
  weights x values) with the gather inside them, compiled by inductor, which fuses the indirect loads
  into the reductions: no gathered copy exists;
- `static, compiled: gather + attend`: the static search's read compiled as it is.

Times are interleaved, best of `--repeats`, one thread; ratios to the default's are printed beside them.

    python -m bart_opt.bench.cache_read            # bart-base's heads at 8 inputs x 4 beams, 144 positions
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from bart_opt.engine.cache import LENGTH_BUCKET, StaticKVCache, round_up


BEAMS = 4


def _inputs(rows: int, heads: int, head_dim: int, length: int, filled: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    first = BEAMS * (torch.arange(rows) // BEAMS)  # (N,) each row's input's first row
    parents = torch.randint(0, BEAMS, (rows,), generator=gen) + first  # (N,) within each input
    kv = torch.randn(length, rows, 2, heads, head_dim, generator=gen)  # the old static layout (L, N, 2, H, d)
    history = torch.randint(0, BEAMS, (rows, length), generator=gen) + first[:, None]  # (N, L) rows of the input
    cache = StaticKVCache(1, rows, heads, length, head_dim, torch.float32, "cpu", beams=BEAMS)
    cache.kv[0].copy_(kv.view(length, rows // BEAMS, BEAMS, 2, heads, head_dim).transpose(0, 1))  # (A, L, nb, 2, H, d)
    cache.history.copy_((history % BEAMS).view(rows // BEAMS, BEAMS, length))  # (A, nb, L) beams of the input
    cache.position.fill_(filled - 1)
    cache.span = min(length, round_up(filled, LENGTH_BUCKET))
    return {
        "q": torch.randn(rows, heads, 1, head_dim, generator=gen), "kv": kv, "cache": cache,
        "keys": torch.randn(rows, heads, length, head_dim, generator=gen),  # the default's
        "values": torch.randn(rows, heads, length, head_dim, generator=gen),
        "history": history, "parents": parents, "filled": filled, "position": torch.tensor([filled - 1]),
    }


def table_read(q, cache: StaticKVCache) -> torch.Tensor:
    """`StaticKVCache.attend` as a step runs it: the step's mask, then the read (the new position's keys and
    values written again as they are)."""
    at = cache.kv[0][:, int(cache.position)]  # (A, nb, 2, H, d)
    k, v = (at[:, :, i].flatten(0, 1)[:, :, None] for i in (0, 1))  # (N, H, 1, d)
    cache.begin_step()
    return cache.attend(0, q, k, v, 0.125)


def default_read(x: dict) -> torch.Tensor:
    """`KVCache.reorder` then attention over the filled positions."""
    rows, filled = x["parents"], x["filled"]
    moved = (rows != torch.arange(rows.shape[0])).nonzero().squeeze(1)
    sources = rows.index_select(0, moved)
    for buf in (x["keys"], x["values"]):
        part = buf[:, :, :filled]
        part.index_copy_(0, moved, part.index_select(0, sources))
    return F.scaled_dot_product_attention(x["q"], x["keys"][:, :, :filled], x["values"][:, :, :filled], scale=0.125)


def static_read(q, kv, history, position) -> torch.Tensor:
    """`StaticKVCache.attend`'s read: gather through the table, attend with a mask."""
    length, rows = kv.shape[:2]
    index = (history + torch.arange(length)[None, :] * rows).flatten()  # (N*L,)
    read = kv.view(length * rows, *kv.shape[2:]).index_select(0, index).view(rows, length, *kv.shape[2:])
    read = read.permute(2, 0, 3, 1, 4)  # (2, N, H, L, d)
    bias = torch.zeros(length).masked_fill_(torch.arange(length) > position, -torch.inf).view(1, 1, 1, -1)
    return F.scaled_dot_product_attention(q, read[0], read[1], attn_mask=bias, scale=0.125)


def fused_read(q, kv, history, position) -> torch.Tensor:
    """The same read as reductions over gathered keys/values, for inductor to fuse the gather into."""
    length = kv.shape[0]
    steps = torch.arange(length)
    keys, values = kv[steps[None, :], history, 0], kv[steps[None, :], history, 1]  # (N, L, H, d)
    scores = (q[:, None, :, 0] * keys).sum(-1) * 0.125  # (N, L, H)
    weights = torch.softmax(scores.masked_fill((steps > position)[None, :, None], -torch.inf), dim=1)
    return (weights[..., None] * values).sum(1)[:, :, None]  # (N, H, 1, d)


def measure(repeats: int, rows: int, heads: int, head_dim: int, length: int, filled: int) -> dict[str, float]:
    """Best seconds per call of each read, interleaved."""
    x = _inputs(rows, heads, head_dim, length, filled)
    static_args = (x["q"], x["kv"], x["history"], x["position"])
    with torch.inference_mode():
        compiled_fused = torch.compile(fused_read, fullgraph=True)
        compiled_static = torch.compile(static_read, fullgraph=True)
        reads = {"default: reorder + attend": lambda: default_read(x),
                 "static: table inside attention": lambda: table_read(x["q"], x["cache"]),
                 "static (before issue 37): gather + attend": lambda: static_read(*static_args),
                 "static, compiled: fused read": lambda: compiled_fused(*static_args),
                 "static, compiled: gather + attend": lambda: compiled_static(*static_args)}
        torch.testing.assert_close(compiled_fused(*static_args), static_read(*static_args), atol=1e-4, rtol=1e-4)
        best = dict.fromkeys(reads, float("inf"))
        for _ in range(repeats):
            for name, fn in reads.items():
                fn()
                start = time.perf_counter()
                for _ in range(10):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - start) / 10)
    return best


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bart_opt.bench.cache_read``."""
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.cache_read", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=32, help="beams x inputs (default 32)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--length", type=int, default=144, help="the fixed cache length (default 144: max_length 142)")
    p.add_argument("--filled", type=int, default=72, help="positions written so far (default 72)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = measure(args.repeats, args.rows, args.heads, args.head_dim, args.length, args.filled)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests)
    base = best["default: reorder + attend"]
    print(f"### self-attention cache read, one layer: {args.rows} rows, {args.heads} heads of {args.head_dim}, "
          f"{args.filled} of {args.length} positions written, float32, one thread, best of {args.repeats}\n")
    print("| read | ms | / default |\n|---|---:|---:|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds * 1e3:.3f} | {seconds / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
