"""Benchmark: ``bart-opt evaluate`` in one process against the same run on a local Ray instance, side by side.

``python -m bart_opt.bench.cluster`` builds the demo checkpoint (or takes ``--model``), makes ``--n``
CNN-like records (token lengths log-normal around ``--median-tokens``) and evaluates them into
fresh run folders, alternating ``--repeats`` times,

- in this process: `run_evaluation` on a loaded `Summarizer` with ``--threads`` torch threads;
- on a Ray instance started here: `run_evaluation` with a `ReplicaPool` of ``--replicas``
  replicas of ``--threads-per-replica`` threads (``bart-opt evaluate --ray --replicas 2
  --threads-per-replica 1``), and with one replica: the CPU of the single process, so that
  the difference is Ray's own cost and not two workers sharing the machine.

It checks that every path wrote the same predictions and ROUGE, and prints a markdown table with,
per path: wall seconds from nothing loaded to ``metrics.json`` and examples per second; the
start-up cost (one process: loading the model; Ray: from the start of the run until the first
replica call began: worker processes, imports, model loading; starting the Ray instance itself,
once per process, is printed apart); the cost per example once started, measured the same way on
every path: each worker's busy span, from the start of its first call (tokenizing included) to the
end of its last batch, summed over workers, divided by the examples; and the part of that outside
the model (the span minus the batches' own seconds: scheduling, transfers, gaps), which the noise
of a busy machine in model speed does not swamp.

    python -m bart_opt.bench.cluster                  # 200 records, 2 replicas x 1 thread vs 1 process x 1 thread
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from bart_opt.pipeline.data import Record
from bart_opt.evaluate import SummarizerExecutor, run_evaluation
from bart_opt.pipeline.summarizer import Summarizer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="records (default 200)")
    p.add_argument("--median-tokens", type=int, default=800, help="median article length in tokens (default 800)")
    p.add_argument("--sigma", type=float, default=0.5, help="log-normal spread of the lengths (default 0.5)")
    p.add_argument("--model", help="a checkpoint folder (default: the demo checkpoint, built here)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--threads-per-replica", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the single process (default 1)")
    p.add_argument("--max-length", type=int, help="summary length cap (default: the checkpoint's)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each path, alternating; the best of each is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", help="write the results here")
    return p.parse_args(argv)


def make_records(model: str, n: int, median_tokens: int, sigma: float, seed: int) -> list[Record]:
    """CNN/DailyMail-shaped records: article lengths as in `bart_opt.bench.batching`, three highlights."""
    from transformers import AutoTokenizer

    from bart_opt.bench.batching import cnn_like_articles
    from bart_opt.demo import random_sentence

    articles = cnn_like_articles(AutoTokenizer.from_pretrained(model), n, median_tokens, sigma, seed)
    rng = random.Random(seed + 1)
    return [Record(f"cnn-{i:04d}", article, "\n".join(random_sentence(rng) for _ in range(3)))
            for i, article in enumerate(articles)]


class _Recorded:
    """An executor that notes every row batch it hands on, with the time it arrived."""

    def __init__(self, executor):
        self.executor = executor
        self.batches: list[tuple[float, object]] = []

    def __getattr__(self, name: str):
        return getattr(self.executor, name)

    def run(self, source, spec, control, rouge=None):
        for batch in self.executor.run(source, spec, control, rouge):
            self.batches.append((time.time(), batch))
            yield batch


def _work_s(batches) -> float:
    """The batches' work: their rows' tokenize/generate/decode/score seconds."""
    return sum(row["seconds"] for _, batch in batches for row in batch.rows)


def run_single(summarizer: Summarizer, load_s: float, records: list[Record], out: Path, generation: dict) -> dict:
    recorded = _Recorded(SummarizerExecutor(summarizer))
    began = time.time()
    metrics = run_evaluation(recorded, records, out, generation, progress=False)
    wall = time.time() - began + load_s  # from nothing loaded, as on Ray
    return {"wall_s": wall, "startup_s": load_s, "busy_s": recorded.batches[-1][0] - began,
            "work_s": _work_s(recorded.batches), "workers": 1, "rouge": metrics["rouge"],
            "predictions": _predictions(out)}


def run_ray(pool, records: list[Record], out: Path, generation: dict) -> dict:
    recorded = _Recorded(pool)
    began = time.time()
    metrics = run_evaluation(recorded, records, out, generation, progress=False)
    wall = time.time() - began
    spans: dict[str, list[float]] = defaultdict(list)
    for _, batch in recorded.batches:
        spans[batch.replica] += [batch.started_at, batch.finished_at]
    busy = sum(max(times) - min(times) for times in spans.values())
    startup = min(min(times) for times in spans.values()) - began
    return {"wall_s": wall, "startup_s": startup, "busy_s": busy, "work_s": _work_s(recorded.batches),
            "workers": len(spans), "rouge": metrics["rouge"], "predictions": _predictions(out)}


def _predictions(out: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return {row["id"]: row["prediction"] for row in rows}


def report(n: int, results: dict[str, dict], init_s: float) -> str:
    """The markdown table, then each Ray path against the single process (the first result)."""
    single_name, single = next(iter(results.items()))
    header = ("| path | workers used | examples | wall s | examples/s | start-up s | busy s / example once started "
              "| model work s / example | outside the model, ms / example |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, result in results.items():
        outside = (result["busy_s"] - result["work_s"]) / n * 1000
        lines.append(f"| {name} | {result['workers']} | {n} | {result['wall_s']:.2f} | {n / result['wall_s']:.2f} | "
                     f"{result['startup_s']:.2f} | {result['busy_s'] / n:.4f} | {result['work_s'] / n:.4f} | "
                     f"{outside:.1f} |")
    lines += ["", f"Starting the local Ray instance: {init_s:.2f} s (once per process; not in the table)."]
    for name, result in list(results.items())[1:]:
        extra = (result["busy_s"] - result["work_s"] - single["busy_s"] + single["work_s"]) / n * 1000
        lines.append(
            f"{name}: cost per example once started {result['busy_s'] / single['busy_s'] - 1:+.1%} against "
            f"{single_name} ({extra:+.1f} ms per example outside the model); throughput "
            f"{single['wall_s'] / result['wall_s']:.2f}x with its start-up, "
            f"{(single['wall_s'] - single['startup_s']) / (result['wall_s'] - result['startup_s']):.2f}x once started.")
    return "\n".join(lines)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bart_opt.distributed import ClusterOptions, ReplicaPool, connect
    from bart_opt.engine.options import EngineOptions

    root = Path(tempfile.mkdtemp(prefix="bart-opt-bench-cluster-"))
    try:
        if args.model is None:
            from bart_opt.demo import build_checkpoint

            args.model = str(build_checkpoint(root / "demo-model", init_std=0.2))
        records = make_records(args.model, args.n, args.median_tokens, args.sigma, args.seed)
        generation = {} if args.max_length is None else {"max_length": args.max_length}
        torch.set_num_threads(args.threads)
        tick = time.perf_counter()
        summarizer = Summarizer.from_pretrained(args.model)
        load_s = time.perf_counter() - tick
        tick = time.perf_counter()
        connect(ClusterOptions())
        init_s = time.perf_counter() - tick
        paths = {f"one process, {_plural(args.threads, 'thread')}":
                 functools.partial(run_single, summarizer, load_s)}
        for replicas in dict.fromkeys((args.replicas, 1)):  # one replica: the CPU of one process, Ray's cost alone
            options = ClusterOptions(replicas=replicas, threads_per_replica=args.threads_per_replica)
            name = f"Ray, {_plural(replicas, 'replica')} x {_plural(args.threads_per_replica, 'thread')}"
            paths[name] = functools.partial(run_ray, ReplicaPool(EngineOptions(model=args.model), options))
        best: dict[str, dict] = {}
        for repeat in range(args.repeats):
            for number, (name, run) in enumerate(paths.items()):
                result = run(records, root / f"run-{repeat}-{number}", generation)
                print(f"{name} (run {repeat + 1}): {result['wall_s']:.2f} s", flush=True)
                if name not in best or result["busy_s"] < best[name]["busy_s"]:
                    best[name] = result
        first = next(iter(best.values()))
        same = all(result["predictions"] == first["predictions"] and result["rouge"] == first["rouge"]
                   for result in best.values())
        print(f"\nidentical predictions and ROUGE on every path: {same} ({args.n} records)\n")
        print(report(args.n, best, init_s))
        if args.json_path:
            Path(args.json_path).write_text(json.dumps({
                "n": args.n, "init_s": init_s, "identical": same,
                "paths": {name: {k: v for k, v in result.items() if k != "predictions"} for name, result in best.items()},
            }, indent=2) + "\n")
        return 0 if same else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    from bart_opt.distributed import exit_process

    exit_process(main(), "bart_opt.bench.cluster")  # Ray's shutdown can hang: bounded, as the command's
