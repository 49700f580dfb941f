"""How busy `bart-opt evaluate` keeps the model: wall time against the time inside model calls.

Two paths over the same records, taking turns, best of `--repeats`:

- **serial**: `Summarizer.summarize` (each batch is generated, then decoded and scored, on one
  thread: how the evaluate runner worked before its batches overlapped);
- **evaluate**: `bart_opt.evaluate.run_evaluation` (what ``bart-opt evaluate`` runs: a batch is
  decoded and scored on a worker thread while the next one is on the model), into a fresh folder.

For each it prints the wall time, the summed seconds of the model calls, and their ratio
(1.00x: the model was never idle). Both paths tokenize every record before the first batch.

    python -m bart_opt.bench.evaluation                      # the demo model on 200 of its held-out records
    python -m bart_opt.bench.evaluation --model DIR --data records.jsonl --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bart_opt.pipeline.data import load_records
from bart_opt.demo import write_demo_model, write_sample_records
from bart_opt.evaluate import run_evaluation
from bart_opt.pipeline.summarizer import Summarizer


def serial(summarizer: Summarizer, records) -> tuple[float, float]:
    """Wall seconds and model seconds of one `summarize` call over `records`."""
    start = time.perf_counter()
    result = summarizer.summarize([r.text for r in records], [r.reference for r in records])
    return time.perf_counter() - start, sum(batch["seconds"] for batch in result.batches)


def evaluate(summarizer: Summarizer, records, out: Path) -> tuple[float, float]:
    """Wall seconds and model seconds of one `run_evaluation` into the new folder `out`."""
    start = time.perf_counter()
    metrics = run_evaluation(summarizer, records, out, progress=False)
    return time.perf_counter() - start, metrics["model_s_last_run"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint folder (default: the trained demo model)")
    parser.add_argument("--data", help="JSONL records (default: the demo model's held-out stories)")
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_demo_model(Path(tmp) / "demo-model", n_samples=1))
        data = args.data or str(write_sample_records(Path(tmp) / "records.jsonl", n=args.records))
        records = load_records(file=data, limit=args.records)
        summarizer = Summarizer.from_pretrained(model, device="cpu")  # as bart-opt evaluate loads it
        runs: dict[str, list[tuple[float, float]]] = {"serial": [], "evaluate": []}
        for repeat in range(args.repeats):
            runs["serial"].append(serial(summarizer, records))
            runs["evaluate"].append(evaluate(summarizer, records, Path(tmp) / f"run-{repeat}"))
            for name, timings in runs.items():
                wall, model_s = timings[-1]
                print(f"repeat {repeat} {name:8s} wall {wall:7.2f} s  model {model_s:7.2f} s  "
                      f"ratio {wall / model_s:.3f}x", flush=True)
    print(f"\n{len(records)} records, {torch.get_num_threads()} threads, best ratio of {args.repeats}:\n")
    print("| path | wall s | inside model calls s | wall / model |")
    print("|---|---:|---:|---:|")
    for name, timings in runs.items():
        wall, model_s = min(timings, key=lambda timing: timing[0] / timing[1])
        print(f"| {name} | {wall:.2f} | {model_s:.2f} | {wall / model_s:.3f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
