"""Time and memory of the model-based metrics on demo records, with tiny random models (docs/evaluation.md).

``python3 -m tests.bart_opt.scoring.measure_cost [N [THREADS]]`` (N records, 1,000 by default; torch
THREADS, 1 by default: on a shared machine two spinning threads run the tiny models 40x slower): N stories of the
demo corpus's ``sample`` split, their lead-3 as the predictions, the highlights as references and the
articles as sources; a random BERT (3 layers, hidden 32, a WordPiece vocabulary of the corpus's words,
512 positions) as BERTScore's encoder and as a 3-label NLI classifier. Prints one Markdown row per
metric: seconds for one `score` call over all N, records per second, the call's tensor peak
(`cost["peak_bytes"]`) and the process's peak RSS growth.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from bart_opt.pipeline.baselines import lead_3
from bart_opt.demo.corpus import stories
from bart_opt.engine.memory import format_bytes, peak_rss_bytes, reset_peak_rss
from bart_opt.pipeline.rouge_text import split_sentences
from bart_opt.scoring.base import Example
from bart_opt.scoring.bertscore import BertScoreMetric
from bart_opt.scoring.consistency import ConsistencyMetric
from tests.bart_opt.scoring.tiny import bert_folder


def main(n: int, threads: int) -> None:
    torch.set_num_threads(threads)
    records = [story.record() for story in stories("sample", n)]
    examples = [Example(lead_3(r["article"]), r["highlights"], r["article"]) for r in records]
    words = sorted({w for r in records for w in re.findall(r"\w+|[^\w\s]", (r["article"] + r["highlights"]).lower())})
    pairs = sum(len(split_sentences(e.source)) * len(split_sentences(e.prediction)) for e in examples)
    print(f"{n} records, {pairs} sentence pairs, torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        encoder = bert_folder(Path(tmp) / "bert", words=words, max_length=512)
        nli = bert_folder(Path(tmp) / "nli", words=words, max_length=512,
                          labels={0: "entailment", 1: "neutral", 2: "contradiction"})
        print("| metric | records | seconds | records/s | tensor peak | peak RSS growth |")
        print("|---|--:|--:|--:|--:|--:|")
        for metric in (BertScoreMetric(str(encoder)), ConsistencyMetric(str(nli))):
            metric.score(examples[:4])  # warm: the first call imports what the memory log needs
            reset_peak_rss()
            before = peak_rss_bytes()
            start = time.perf_counter()
            metric.score(examples)
            seconds = time.perf_counter() - start
            print(f"| {metric.name} (batch {metric.batch_size}) | {n:,} | {seconds:.1f} | {n / seconds:.0f} | "
                  f"{format_bytes(metric.cost['peak_bytes'])} | {format_bytes(peak_rss_bytes() - before)} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, int(sys.argv[2]) if len(sys.argv) > 2 else 1)
