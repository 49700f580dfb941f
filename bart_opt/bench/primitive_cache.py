"""Benchmark: the default mode's RSS and speed with oneDNN's primitive caches bounded and unbounded.

``python -m bart_opt.bench.primitive_cache`` writes ``--docs`` CNN-like articles for a random
checkpoint with a tokenizer (``--size demo``: the demo model's shape; ``base``: bart-base's; or
``--model``, a checkpoint folder), then
summarizes them in batches of ``--batch`` with the default mode, once with both caches at
`bart_opt.engine.kernels.PRIMITIVE_CACHE_CAPACITY` entries (what bart_opt sets) and once at oneDNN's own
1,024, each in a fresh process, ``--repeats`` times in turns (ABAB), so that a busy machine's drift
hits both alike. It prints the CPU beside a markdown table of each run's seconds, its RSS once loaded
and at the end, and whether both capacities wrote the same summaries, then the speed ratio of the
best runs:

    python -m bart_opt.bench.primitive_cache                      # demo shape, 640 articles
    python -m bart_opt.bench.primitive_cache --size base --docs 64
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONEDNN_DEFAULT = 1024  # oneDNN's and ideep's own capacity
SHAPES = {"demo": {}, "base": {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
                               "decoder_attention_heads": 12, "ffn_dim": 3072}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.primitive_cache", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a checkpoint folder with its tokenizer (default: a random one of --size)")
    p.add_argument("--size", choices=sorted(SHAPES), default="demo", help="the random checkpoint's shape (default demo)")
    p.add_argument("--docs", type=int, default=640, help="articles (default 640)")
    p.add_argument("--batch", type=int, default=32, help="articles per call (default 32, the service's batch size)")
    p.add_argument("--median-tokens", type=int, default=280, help="median article length in tokens (default 280)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each capacity, in turns (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "TEXTS"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(model: str, texts_path: str, batch: int, threads: int) -> None:
    """Summarize the texts in batches with the default mode; print one JSON line of what it measured."""
    import torch

    from bart_opt.engine.memory import rss_bytes
    from bart_opt.pipeline.summarizer import Summarizer

    torch.set_num_threads(threads)
    texts = json.loads(Path(texts_path).read_text())
    summarizer = Summarizer.from_pretrained(model)
    loaded = rss_bytes() / 1e6
    digest = hashlib.sha256()
    start = time.perf_counter()
    for i in range(0, len(texts), batch):
        for summary in summarizer.summarize(texts[i:i + batch]).summaries:
            digest.update(summary.encode() + b"\0")
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "rss_loaded_mb": loaded, "rss_end_mb": rss_bytes() / 1e6,
                      "summaries": digest.hexdigest()}))


def run_once(capacity: int, model: str, texts: Path, args: argparse.Namespace) -> dict:
    """One worker process with both caches at `capacity` entries."""
    from bart_opt.engine.kernels import PRIMITIVE_CACHE_VARIABLES

    env = {**os.environ, **{name: str(capacity) for name in PRIMITIVE_CACHE_VARIABLES},
           "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "bart_opt.bench.primitive_cache", "--worker", model, str(texts),
               "--batch", str(args.batch), "--threads", str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the worker at capacity {capacity} failed:\n{done.stderr[-2000:]}")
    return {"capacity": capacity, **json.loads(done.stdout.splitlines()[-1])}


def table(runs: list[dict], bound: int) -> str:
    """The markdown table of the runs, then the best-run speed ratio and whether the summaries agree."""
    rows = ["| capacity | run | seconds | RSS loaded MB | RSS at the end MB | growth MB |", "|---:|---:|---:|---:|---:|---:|"]
    for index, run in enumerate(runs):
        rows.append(f"| {run['capacity']} | {index // 2 + 1} | {run['seconds']:.2f} | {run['rss_loaded_mb']:.0f} | "
                    f"{run['rss_end_mb']:.0f} | {run['rss_end_mb'] - run['rss_loaded_mb']:+.0f} |")
    best = {c: min(r["seconds"] for r in runs if r["capacity"] == c) for c in (bound, ONEDNN_DEFAULT)}
    same = len({r["summaries"] for r in runs}) == 1
    rows += ["", f"best run at {bound} entries against {ONEDNN_DEFAULT}: {best[ONEDNN_DEFAULT] / best[bound]:.2f}x "
             f"the speed; the same summaries in every run: {'yes' if same else 'NO'}"]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(*args.worker, args.batch, args.threads)
        return 0
    from transformers import AutoTokenizer

    from bart_opt.engine import hardware
    from bart_opt.bench.batching import cnn_like_articles
    from bart_opt.demo import build_checkpoint
    from bart_opt.engine.kernels import PRIMITIVE_CACHE_CAPACITY

    with tempfile.TemporaryDirectory(prefix="bart_opt_primitives_") as tmp:
        model = args.model or str(build_checkpoint(Path(tmp, "model"), **SHAPES[args.size]))
        articles = cnn_like_articles(AutoTokenizer.from_pretrained(model), args.docs, args.median_tokens, 0.5, 0)
        texts = Path(tmp, "texts.json")
        texts.write_text(json.dumps(articles))
        runs = []
        for repeat in range(args.repeats):
            for capacity in (PRIMITIVE_CACHE_CAPACITY, ONEDNN_DEFAULT):
                runs.append(run_once(capacity, model, texts, args))
                print(f"run {repeat + 1}, capacity {capacity}: {runs[-1]['seconds']:.2f} s", file=sys.stderr, flush=True)
    print(f"CPU: {hardware.probe().describe()}")
    print(f"{args.docs} CNN-like articles (median {args.median_tokens} tokens), "
          f"{args.model or f'{args.size} shape, random weights'}, "
          f"the checkpoint's generation settings, batches of {args.batch}, {args.threads} thread(s)\n")
    print(table(runs, PRIMITIVE_CACHE_CAPACITY))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
