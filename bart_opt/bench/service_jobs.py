"""Benchmark: an evaluation job through the service against ``bart-opt evaluate``, side by side in one run.

``python -m bart_opt.bench.service_jobs`` builds the demo checkpoint (or takes ``--model``), writes ``--n``
CNN-like records (token lengths log-normal around ``--median-tokens``, the longer ones cut at
1024) to a JSONL file, then evaluates them

- with ``bart-opt evaluate --data FILE --out DIR`` in a subprocess, and
- with ``POST /evaluate {"dataset": {"file": ...}}`` against ``bart-opt serve`` in a subprocess
  (its own SQLite database and data directory), polling ``GET /evaluate/{id}`` until it succeeds,

with the same model, token budget, batch size and generation settings (the checkpoint's, unless
overridden). Model loading is left out of both: the command's time is the evaluation loop's
wall time (``wall_s_last_run`` of its metrics), the service's the job's ``started_at`` to
``finished_at``. It checks that both wrote the same predictions and ROUGE, and prints a markdown
table with seconds per example and the service's overhead per example against the command:
once on wall time, and once on the time spent outside the model (wall time minus the summed
per-example model work), which a busy machine's noise in model speed does not swamp.

    python -m bart_opt.bench.service_jobs                      # 200 records, the demo model's settings
    python -m bart_opt.bench.service_jobs --n 20 --max-length 12 --repeats 2

**Scale mode** (``--scale``): the same CNN-like records (median 280 tokens unless
``--median-tokens`` says otherwise: about 1.5 KB a line, 155 MB for 100,000), a job of
``--baseline-n`` (1,000) and one of ``--scale-n`` (100,000) records, each on a fresh server
with ``BART_OPT_JOB_WINDOW=--window``. For each it measures how long ``POST /evaluate`` takes
to accept the file (ingestion, records/s), the time from that answer to the first stored
prediction, and the server process's peak RSS (``VmHWM``) while the job runs for ``--watch``
seconds, then its RSS after ``DELETE``:

    python -m bart_opt.bench.service_jobs --scale              # 1,000 vs 100,000 records

**Stores mode** (``--stores``): the jobs store under load, SQLite and PostgreSQL with 1 and 3
replicas (`bart_opt.bench.service_replicas`; the options after ``--stores`` are its own):

    python -m bart_opt.bench.service_jobs --stores --jobs 60 --records 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

from bart_opt.bench.service_load import ServerProcess

DEFAULT_BATCH_TOKENS = 16384
DEFAULT_BATCH_SIZE = 32


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.service_jobs", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="records (default 200)")
    p.add_argument("--median-tokens", type=int,
                   help="median article length in tokens (default 800; 280 with --scale)")
    p.add_argument("--sigma", type=float, default=0.5, help="log-normal spread of the lengths (default 0.5)")
    p.add_argument("--model", help="a checkpoint folder (default: the demo checkpoint, built here)")
    p.add_argument("--max-batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS)
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    p.add_argument("--max-length", type=int, help="summary length cap (default: the checkpoint's)")
    p.add_argument("--num-beams", type=int, help="beams (default: the checkpoint's)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run both arms this many times, alternating; the best time of each is kept")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of both processes (default 1: on a busy machine more threads make the "
                        "timing of a small model mostly noise)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", help="write the results here")
    scale = p.add_argument_group("scale mode")
    scale.add_argument("--scale", action="store_true", help="ingestion, first prediction and RSS at --scale-n records")
    scale.add_argument("--scale-n", type=int, default=100_000, help="records of the large job (default 100000)")
    scale.add_argument("--baseline-n", type=int, default=1_000, help="records of the small job (default 1000)")
    scale.add_argument("--window", type=int, default=64, help="BART_OPT_JOB_WINDOW of both servers (default 64)")
    scale.add_argument("--watch", type=float, default=20.0,
                       help="seconds each job runs after its first prediction before it is cancelled (default 20)")
    args = p.parse_args(argv)
    if args.median_tokens is None:
        args.median_tokens = 280 if args.scale else 800
    return args


def write_records(path: Path, model: str, n: int, median_tokens: int, sigma: float, seed: int,
                  distinct: int | None = None) -> None:
    """CNN/DailyMail-shaped JSONL (id, article, highlights) with CNN-like article lengths.

    With `distinct`, only that many articles are generated and the records cycle through them
    (ids stay unique): 100,000 articles would take minutes to measure out in tokens.
    """
    import random

    from transformers import AutoTokenizer

    from bart_opt.bench.batching import cnn_like_articles
    from bart_opt.demo import random_sentence

    tokenizer = AutoTokenizer.from_pretrained(model)
    articles = cnn_like_articles(tokenizer, min(n, distinct or n), median_tokens, sigma, seed)
    rng = random.Random(seed + 1)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            highlights = "\n".join(random_sentence(rng) for _ in range(3))
            row = {"id": f"cnn-{i:06d}", "article": articles[i % len(articles)], "highlights": highlights}
            f.write(json.dumps(row) + "\n")


def run_cli(model: str, data: Path, out: Path, args: argparse.Namespace, generation: dict) -> dict:
    """``bart-opt evaluate`` into a fresh `out`; its metrics and predictions."""
    command = [sys.executable, "-m", "bart_opt.cli", "evaluate", "--model", model, "--data", str(data),
               "--out", str(out), "--no-progress", "--max-batch-tokens", str(args.max_batch_tokens),
               "--max-batch-size", str(args.max_batch_size)]
    for key, value in generation.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bart-opt evaluate failed:\n{done.stderr}")
    metrics = json.loads(done.stdout)
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return {"seconds": metrics["wall_s_last_run"], "runtime_s": metrics["runtime_s"], "rouge": metrics["rouge"],
            "predictions": {row["id"]: row["prediction"] for row in predictions}}


def run_service(model: str, data_dir: Path, db: Path, log: Path, args: argparse.Namespace, generation: dict) -> dict:
    """One job through a fresh ``bart-opt serve``; the job's wall time, metrics and predictions."""
    settings = {"db": db, "data_dir": data_dir, "max_batch_tokens": args.max_batch_tokens,
                "max_batch_size": args.max_batch_size, "torch_threads": args.threads}
    server = ServerProcess(model, log, settings)
    server.env["OMP_NUM_THREADS"] = str(args.threads)  # as the command gets it
    with server:
        body = {"dataset": {"file": "cnn.jsonl"}, "generation": generation}
        submitted = time.perf_counter()
        response = httpx.post(f"{server.url}/evaluate", json=body, timeout=60)
        response.raise_for_status()
        job_id = response.json()["id"]
        while True:
            view = httpx.get(f"{server.url}/evaluate/{job_id}", timeout=60).json()
            if view["status"] not in ("queued", "running"):
                break
            time.sleep(0.5)
        observed = time.perf_counter() - submitted
        if view["status"] != "succeeded":
            raise RuntimeError(f"job ended {view['status']}: {view['error']}\n{server.log()}")
        lines = httpx.get(f"{server.url}/evaluate/{job_id}/predictions", timeout=60).text.splitlines()
    started, finished = (datetime.fromisoformat(view[key]) for key in ("started_at", "finished_at"))
    predictions = [json.loads(line) for line in lines]
    return {"seconds": (finished - started).total_seconds(), "runtime_s": view["timing"]["runtime_s"],
            "observed_s": observed, "rouge": view["rouge"],
            "predictions": {row["id"]: row["prediction"] for row in predictions}}


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of process `pid` from /proc (``VmRSS`` now, ``VmHWM`` its peak), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024


def run_scale(model: str, data_dir: Path, name: str, root: Path, args: argparse.Namespace, generation: dict) -> dict:
    """One job over `name` on a fresh server: ingestion, first prediction, RSS (see the module docstring)."""
    settings = {"db": root / f"{name}.db", "data_dir": data_dir, "max_batch_tokens": args.max_batch_tokens,
                "max_batch_size": args.max_batch_size, "torch_threads": args.threads, "job_window": args.window}
    server = ServerProcess(model, root / f"{name}.log", settings)
    server.env["OMP_NUM_THREADS"] = str(args.threads)
    with server:
        pid = server.process.pid
        ready = rss_mb(pid)
        body = {"dataset": {"file": name}, "generation": generation}
        started = time.perf_counter()
        response = httpx.post(f"{server.url}/evaluate", json=body, timeout=600)
        accepted = time.perf_counter() - started
        response.raise_for_status()
        job_id = response.json()["id"]
        samples: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                samples.append(rss_mb(pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            queued = time.perf_counter()
            while (view := httpx.get(f"{server.url}/evaluate/{job_id}", timeout=60).json())["progress"]["done"] < 1:
                if view["status"] not in ("queued", "running"):
                    raise RuntimeError(f"job ended {view['status']}: {view['error']}\n{server.log()}")
                time.sleep(0.02)
            first = time.perf_counter() - queued
            time.sleep(args.watch)
            done = httpx.get(f"{server.url}/evaluate/{job_id}", timeout=60).json()["progress"]["done"]
            httpx.delete(f"{server.url}/evaluate/{job_id}", timeout=60)
            time.sleep(1.0)
        finally:
            stop.set()
            sampler.join()
        return {"records": view["progress"]["total"], "file_mb": (data_dir / name).stat().st_size / 1e6,
                "accepted_s": accepted, "records_per_s": view["progress"]["total"] / accepted,
                "first_prediction_s": first, "done_in_watch": done, "rss_ready_mb": ready,
                "rss_peak_mb": rss_mb(pid, "VmHWM"), "rss_max_sampled_mb": max(samples, default=ready),
                "rss_after_cancel_mb": rss_mb(pid)}


def scale_table(runs: list[dict], watch: float) -> str:
    """The markdown table of the scale mode, and the three targets against the first (baseline) run."""
    rows = [
        "| records | file MB | accepted in s | records / s | first prediction s | done in "
        f"{watch:g} s | RSS ready MB | peak RSS MB | RSS after cancel MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        rows.append(f"| {run['records']:,} | {run['file_mb']:.1f} | {run['accepted_s']:.2f} | "
                    f"{run['records_per_s']:,.0f} | {run['first_prediction_s']:.2f} | {run['done_in_watch']} | "
                    f"{run['rss_ready_mb']:.0f} | {run['rss_peak_mb']:.0f} | {run['rss_after_cancel_mb']:.0f} |")
    base, big = runs[0], runs[-1]
    rows += [
        "",
        f"peak RSS, {big['records']:,} vs {base['records']:,} records: "
        f"{big['rss_peak_mb'] - base['rss_peak_mb']:+.0f} MB "
        "(target: within 200 MB)",
        f"{big['records']:,} records accepted in {big['accepted_s']:.1f} s (target: under 10 s)",
        f"first prediction {big['first_prediction_s']:.2f} s after acceptance at {big['records']:,} records, "
        f"{base['first_prediction_s']:.2f} s at {base['records']:,} (target: under 5 s, independent of the size)",
    ]
    return "\n".join(rows)


def _workspace(root: Path, args: argparse.Namespace) -> tuple[str, Path]:
    """The model to run (`--model`, else a random demo checkpoint written under `root`) and an empty data dir."""
    model = args.model
    if model is None:
        from bart_opt.demo import build_checkpoint

        model = str(build_checkpoint(root / "model"))
    data_dir = root / "data"
    data_dir.mkdir()
    return model, data_dir


def main_scale(args: argparse.Namespace, generation: dict) -> int:
    with tempfile.TemporaryDirectory(prefix="bench_jobs_scale_") as tmp:
        root = Path(tmp)
        model, data_dir = _workspace(root, args)
        runs = []
        for n in (args.baseline_n, args.scale_n):
            name = f"cnn-{n}.jsonl"
            write_records(data_dir / name, model, n, args.median_tokens, args.sigma, args.seed, distinct=1000)
            runs.append(run_scale(model, data_dir, name, root, args, generation))
            print(f"{n} records: accepted in {runs[-1]['accepted_s']:.2f} s, first prediction "
                  f"{runs[-1]['first_prediction_s']:.2f} s, peak RSS {runs[-1]['rss_peak_mb']:.0f} MB", file=sys.stderr)
            (data_dir / name).unlink()
    print(f"CNN-like records (median {args.median_tokens} tokens), model {args.model or 'demo (random weights)'}, "
          f"generation {generation or 'checkpoint defaults'}, job window {args.window}, max_batch_size "
          f"{args.max_batch_size}, {args.threads} torch thread(s)\n")
    print(scale_table(runs, args.watch))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"scale": runs, "generation": generation}, indent=2) + "\n")
    return 0


def table(n: int, cli: dict, service: dict) -> str:
    """The markdown table of the best run of each arm, and the two overhead figures."""
    per_cli, per_service = cli["seconds"] / n, service["seconds"] / n
    outside = {arm: (run["seconds"] - run["runtime_s"]) / n for arm, run in (("cli", cli), ("service", service))}
    extra = outside["service"] - outside["cli"]
    rows = [
        "| path | examples | wall s (loop) | model work s | s / example | outside the model, ms / example |",
        "|---|---:|---:|---:|---:|---:|",
        f"| `bart-opt evaluate` | {n} | {cli['seconds']:.2f} | {cli['runtime_s']:.2f} | {per_cli:.4f} "
        f"| {outside['cli'] * 1000:.1f} |",
        f"| `POST /evaluate` job | {n} | {service['seconds']:.2f} | {service['runtime_s']:.2f} | {per_service:.4f} "
        f"| {outside['service'] * 1000:.1f} |",
        "",
        f"service overhead per example, wall time: {per_service / per_cli - 1:+.1%} "
        f"({(per_service - per_cli) * 1000:+.1f} ms)",
        f"service overhead per example outside the model (insensitive to the model's speed on a busy machine): "
        f"{extra / per_cli:+.1%} ({extra * 1000:+.1f} ms)",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--stores"]:
        from bart_opt.bench import service_replicas

        return service_replicas.main(argv[1:])
    args = parse_args(argv)
    generation = {k: v for k, v in (("max_length", args.max_length), ("num_beams", args.num_beams)) if v is not None}
    if args.scale:
        return main_scale(args, generation)
    with tempfile.TemporaryDirectory(prefix="bench_jobs_") as tmp:
        root = Path(tmp)
        model, data_dir = _workspace(root, args)
        write_records(data_dir / "cnn.jsonl", model, args.n, args.median_tokens, args.sigma, args.seed)
        runs: dict[str, list[dict]] = {"cli": [], "service": []}
        for repeat in range(args.repeats):
            runs["cli"].append(run_cli(model, data_dir / "cnn.jsonl", root / f"cli-{repeat}", args, generation))
            db, log = root / f"jobs-{repeat}.db", root / f"serve-{repeat}.log"
            runs["service"].append(run_service(model, data_dir, db, log, args, generation))
            print(f"repeat {repeat + 1}/{args.repeats}: cli {runs['cli'][-1]['seconds']:.2f} s, "
                  f"service {runs['service'][-1]['seconds']:.2f} s", file=sys.stderr)
    cli, service = (min(runs[arm], key=lambda run: run["seconds"]) for arm in ("cli", "service"))
    same = cli["predictions"] == service["predictions"] and cli["rouge"] == service["rouge"]
    print(f"{args.n} CNN-like records, model {args.model or 'demo (random weights)'}, generation "
          f"{generation or 'checkpoint defaults'}, max_batch_tokens {args.max_batch_tokens}, "
          f"max_batch_size {args.max_batch_size}, {args.threads} torch thread(s), best of {args.repeats}\n")
    print(table(args.n, cli, service))
    print(f"\nsame predictions and ROUGE: {same}; job seen by the client (submit to succeeded, 0.5 s polls): "
          f"{service['observed_s']:.2f} s")
    if args.json_path:
        result = {"n": args.n, "generation": generation, "same_output": same,
                  **{arm: [{k: v for k, v in run.items() if k != "predictions"} for run in runs[arm]] for arm in runs}}
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
