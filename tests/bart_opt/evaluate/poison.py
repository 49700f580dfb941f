"""A Summarizer that runs out of memory on one marked record, and records that exercise every rule of the core."""

from __future__ import annotations

import random

from bart_opt.pipeline.data import Record
from bart_opt.demo import random_article, random_sentence
from bart_opt.evaluate.rows import RowBatch
from bart_opt.engine.options import EngineOptions
from bart_opt.pipeline.summarizer import Summarizer

MARK = "Zyxwvutsrqpon"  # a word no generated article holds


class FakeOOM(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError on CPU."""


def load_poisoned(options: EngineOptions, **hooks) -> Summarizer:
    """The Summarizer of `options`, running out of memory (`FakeOOM`) on every model call that holds a
    text with `MARK`, even alone. A module-level function, so Ray replicas load their model with it."""
    summarizer = Summarizer.from_options(options, oom_errors=(FakeOOM,), **hooks)
    with summarizer.tokens.borrow() as tokenizer:
        marker = tokenizer(" " + MARK, add_special_tokens=False)["input_ids"]
    generate = summarizer.model.generate

    def poisoned(input_ids, *args, **kwargs):
        if any(_holds(row.tolist(), marker) for row in input_ids):
            raise FakeOOM("CUDA out of memory (injected)")
        return generate(input_ids, *args, **kwargs)

    summarizer.model.generate = poisoned
    return summarizer


def _holds(ids: list[int], marker: list[int]) -> bool:
    return any(ids[i : i + len(marker)] == marker for i in range(len(ids) - len(marker) + 1))


def hostile_records(n: int = 6, seed: int = 7) -> list[Record]:
    """`n` plain records, then one with the id of the first, one that is not valid text, one marked."""
    rng = random.Random(seed)
    plain = [Record(f"r{i}", random_article(rng, rng.randint(1, 4)), random_sentence(rng)) for i in range(n)]
    return [*plain,
            Record("r0", "A second record with the id of the first one. It must not run.", "Never scored."),
            Record("bad", "A text \ud800 with a lone surrogate.", "A reference."),
            Record("oom", f"{random_article(rng, 2)} {MARK} said so.", random_sentence(rng))]


class MemorySink:
    """Row batches kept in memory, by id, in arrival order."""

    def __init__(self, done=()):
        self.done = set(done)
        self.rows: dict[str, dict] = {}
        self.batches: list[RowBatch] = []

    def write(self, batch: RowBatch) -> None:
        assert not set(self.rows) & {row["id"] for row in batch.rows}, "a row written twice"
        self.batches.append(batch)
        self.rows.update((row["id"], row) for row in batch.rows)


def comparable(rows: dict[str, dict]) -> dict[str, dict]:
    """Rows without what depends on the machine and the batching (time, memory, padding)."""
    machine = ("seconds", "batch_peak_bytes", "padding_computed", "padding_avoided")
    return {key: {k: v for k, v in row.items() if k not in machine} for key, row in rows.items()}
