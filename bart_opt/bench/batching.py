"""Benchmark: evaluate's batching against the seed's baseline, side by side in one run.

Workload: `--n` CNN-like articles (token lengths drawn from a log-normal with a median
of `--median-tokens`, so most are several hundred tokens and many are cut at the model's
1024 positions) summarized by a small random BART at the demo checkpoint's CNN-like
generation settings (4 beams, length_penalty 2.0, no_repeat_ngram_size 3).

- **baseline** (the seed's evaluation script): fixed batches of `--baseline-batch-size`
  in input order, every batch padded to 1024 columns, no trim;
- **evaluate** (`Summarizer`): inputs sorted by length, batches filled up to
  `max_batch_tokens` (beams counted) and `max_batch_size`, all-padding columns trimmed.

Both arms run the same `Bart` with the CPU memory counter off. The script prints a
markdown table with the padding each arm computed, its process CPU seconds and wall
seconds (the speed ratio is taken on CPU seconds, which other processes on a shared
machine disturb far less than wall time; `--threads 1` makes them cleaner still),
checks that both arms wrote identical summaries, and can write the numbers as JSON.

    python -m bart_opt.bench.batching --n 48
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from bart_opt.pipeline.batching import collate, fixed_batches
from bart_opt.demo import build_checkpoint, random_sentence
from bart_opt.pipeline.summarizer import Summarizer

# One layer of bart-large-cnn on each side, with the vocabulary scaled by the same 1/12 as the
# depth: per layer and per token the costs are bart-large's, so the share of the work that
# grows with the padded input length (encoder, cross-attention) is close to bart-large's.
MODEL_SHAPE = {"d_model": 1024, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 16,
               "decoder_attention_heads": 16, "ffn_dim": 4096, "vocab_size": 4200, "init_std": 0.02}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=48, help="articles (default 48)")
    p.add_argument("--median-tokens", type=int, default=800, help="median article length in tokens (default 800)")
    p.add_argument("--sigma", type=float, default=0.5, help="log-normal spread of the lengths (default 0.5)")
    p.add_argument("--baseline-batch-size", type=int, default=8)
    p.add_argument("--max-batch-tokens", type=int, default=None, help="default: the Summarizer's default")
    p.add_argument("--max-batch-size", type=int, default=None, help="default: the Summarizer's default")
    p.add_argument("--max-length", type=int, default=40, help="summary length cap in tokens (default 40)")
    p.add_argument("--model", help="a checkpoint folder (default: a random one of MODEL_SHAPE, built here)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run both arms this many times, alternating; the best time of each is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--json", dest="json_path", help="write the results here")
    return p.parse_args(argv)


def cnn_like_articles(tokenizer, n: int, median_tokens: int, sigma: float, seed: int) -> list[str]:
    """Articles whose token counts follow a log-normal; the longer ones exceed 1024 tokens."""
    rng = random.Random(seed)
    articles = []
    for _ in range(n):
        target = max(20, int(rng.lognormvariate(math.log(median_tokens), sigma)))
        sentences: list[str] = []
        tokens = 0
        while tokens < target:
            sentence = random_sentence(rng)
            sentences.append(sentence)
            tokens += len(tokenizer(" " + sentence, add_special_tokens=False)["input_ids"])
        articles.append(" ".join(sentences))
    return articles


def run_baseline(summarizer: Summarizer, texts: list[str], batch_size: int, generation: dict) -> tuple[list[str], dict]:
    """The seed's loop: consecutive fixed batches, padded to the model's length, untrimmed."""
    encoded = summarizer.encode(texts)
    summaries, columns, padding = [], 0, 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for batch in fixed_batches(len(texts), batch_size):
        ids, mask = collate([encoded[i].ids for i in batch], summarizer.pad_id, pad_to=summarizer.max_input_tokens)
        with torch.inference_mode():
            out = summarizer.model.generate(ids, attention_mask=mask, **generation)
        summaries.extend(summarizer.tokenizer.batch_decode(out, skip_special_tokens=True,
                                                           clean_up_tokenization_spaces=False))
        columns += ids.numel()
        padding += int(mask.numel() - mask.sum())
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    calls = math.ceil(len(texts) / batch_size)
    return summaries, {"seconds": seconds, "cpu_seconds": cpu_seconds, "calls": calls, "input_positions": columns,
                       "padding_computed": padding}


def run_evaluate(summarizer: Summarizer, texts: list[str], generation: dict) -> tuple[list[str], dict]:
    """evaluate's path: `Summarizer.summarize` (sorted, token budget, trimmed)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    result = summarizer.summarize(texts, **generation)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    positions = sum(call["size"] * call["columns"] for call in result.batches)
    padding = sum(call["padding_computed"] for call in result.batches)
    return result.summaries, {"seconds": seconds, "cpu_seconds": cpu_seconds, "calls": len(result.batches),
                              "input_positions": positions, "padding_computed": padding}


def main(argv: list[str] | None = None) -> int:
    """Run both arms and print the table; exit status 1 when the summaries differ."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.model or str(build_checkpoint(Path(tmp) / "model", seed=args.seed, **MODEL_SHAPE))
        budgets = {k: v for k, v in (("max_batch_tokens", args.max_batch_tokens),
                                     ("max_batch_size", args.max_batch_size)) if v is not None}
        summarizer = Summarizer.from_pretrained(checkpoint, device="cpu", dtype=torch.float32,
                                                count_cpu_tensors=False, **budgets)
    texts = cnn_like_articles(summarizer.tokenizer, args.n, args.median_tokens, args.sigma, args.seed)
    generation = {"max_length": args.max_length}
    lengths = [len(e.ids) for e in summarizer.encode(texts)]
    summarizer.summarize(texts[:2], **generation)  # warm-up: first-call costs go to neither arm
    runs = []
    for _ in range(max(1, args.repeats)):
        runs.append((run_baseline(summarizer, texts, args.baseline_batch_size, generation),
                     run_evaluate(summarizer, texts, generation)))
    (base_summaries, base), _ = min(runs, key=lambda run: run[0][1]["cpu_seconds"])
    _, (eval_summaries, ours) = min(runs, key=lambda run: run[1][1]["cpu_seconds"])
    identical = sum(a == b for a, b in zip(base_summaries, eval_summaries))
    report = {
        "n": args.n, "median_input_tokens": sorted(lengths)[len(lengths) // 2],
        "truncated_at_1024": sum(length >= summarizer.max_input_tokens for length in lengths),
        "model_shape": MODEL_SHAPE if args.model is None else args.model,
        "max_batch_tokens": summarizer.max_batch_tokens, "max_batch_size": summarizer.max_batch_size,
        "baseline": base, "evaluate": ours,
        "speedup_cpu": base["cpu_seconds"] / ours["cpu_seconds"], "speedup_wall": base["seconds"] / ours["seconds"],
        "positions_ratio": base["input_positions"] / ours["input_positions"],
        "identical_summaries": identical, "threads": torch.get_num_threads(), "repeats": len(runs),
    }
    print_table(report)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0 if identical == args.n else 1


def print_table(r: dict) -> None:
    """The markdown table of one run."""
    print(f"{r['n']} CNN-like articles: median {r['median_input_tokens']} tokens, "
          f"{r['truncated_at_1024']} cut at 1024; {r['threads']} CPU threads; best of {r['repeats']}")
    print()
    print("| batching | model calls | input positions | padding computed | CPU s | wall s | speed-up (CPU s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, key in (("seed baseline: fixed 8, padded to 1024, input order", "baseline"),
                      (f"evaluate: sorted, budget {r['max_batch_tokens']} tokens x beams, trimmed", "evaluate")):
        row = r[key]
        print(f"| {name} | {row['calls']} | {row['input_positions']} | {row['padding_computed']} | "
              f"{row['cpu_seconds']:.1f} | {row['seconds']:.1f} | "
              f"{r['baseline']['cpu_seconds'] / row['cpu_seconds']:.2f}x |")
    print()
    print(f"speed-up: {r['speedup_cpu']:.2f}x in CPU time, {r['speedup_wall']:.2f}x in wall time; "
          f"input positions {r['positions_ratio']:.2f}x fewer; identical summaries: {r['identical_summaries']}/{r['n']}")


if __name__ == "__main__":
    sys.exit(main())
