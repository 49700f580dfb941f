"""One aggregation of prediction rows: a model's metrics and a baseline's, with the same ROUGE intervals.

`RowTotals` reads rows once, in record order (the bootstrap is order-dependent, so the result
does not depend on how the rows were batched or resumed), holding only counters and the scored
rows' ROUGE packed as floats (12 per row): any number of rows can stream through, from a file or
from a database a page at a time. `model_metrics` and `baseline_metrics` are its two reports.

The model is described by what a `Summarizer` has (``name``, ``device``, ``count_cpu_tensors``,
``scorer``); a Ray replica pool has the same. Baselines (`bart_opt.baselines`) are scored here
too (`baseline_rows`, `score_baselines`), with the model's scorer, so their intervals are
computed the same way.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from bart_opt.baselines import BASELINES, check_baselines
from bart_opt.data import Record
from bart_opt.evaluate.rows import baseline_row
from bart_opt.rouge import MEASURES, RougeScorer


class ModelInfo(Protocol):
    """What the metrics say about the model: its name, device, memory counting and ROUGE scorer."""

    name: str
    scorer: RougeScorer

    @property
    def device(self) -> torch.device: ...

    @property
    def count_cpu_tensors(self) -> bool: ...


class PackedScores(Sequence):
    """Per-example ROUGE scores packed as floats (rouge type x measure), read back as the scorer's dicts."""

    def __init__(self, rouge_types: Sequence[str]):
        self._types = list(rouge_types)
        self._width = len(self._types) * len(MEASURES)
        self._values = array("d")

    def append(self, score: Mapping[str, Mapping[str, float]]) -> None:
        self._values.extend(float(score[t][m]) for t in self._types for m in MEASURES)

    def __len__(self) -> int:
        return len(self._values) // self._width

    def __getitem__(self, index: int) -> dict[str, dict[str, float]]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self._width
        values = iter(self._values[start : start + self._width])
        return {t: {m: next(values) for m in MEASURES} for t in self._types}


class RowTotals:
    """Counters and packed ROUGE over prediction rows added in record order (model or baseline rows)."""

    def __init__(self, scorer: RougeScorer):
        self.scorer = scorer
        self.scores = PackedScores(scorer.rouge_types)
        self.n = self.errors = self.padding_computed = self.padding_avoided = 0
        self.tokens_in = self.tokens_out = self.truncated = self.peak = 0
        self.runtime = 0.0

    def add(self, row: Mapping[str, Any]) -> None:
        self.n += 1
        self.errors += row["error"] is not None
        self.runtime += row["seconds"]
        self.peak = max(self.peak, row.get("batch_peak_bytes", 0))
        self.padding_computed += row.get("padding_computed", 0)
        self.padding_avoided += row.get("padding_avoided", 0)
        self.tokens_in += row.get("input_tokens", 0)
        self.tokens_out += row.get("output_tokens", 0)
        self.truncated += bool(row.get("truncated"))
        if row["rouge"] is not None:
            self.scores.append(row["rouge"])

    def added(self, rows: Iterable[Mapping[str, Any]]) -> RowTotals:
        """These totals with every row of `rows` added."""
        for row in rows:
            self.add(row)
        return self

    def _common(self, name: str) -> dict:
        return {
            "model": name,
            "n_obs": self.n,
            "n_errors": self.errors,
            "n_scored": len(self.scores),
            "runtime_s": self.runtime,
            "seconds_per_sample": self.runtime / self.n if self.n else 0.0,
            "rouge": self.scorer.aggregate(self.scores) if len(self.scores) else None,
        }

    def model_metrics(self, model: ModelInfo, generation: Mapping[str, Any]) -> dict:
        """``model``, ``n_obs``, ``n_errors``, ``n_scored``, ``runtime_s``, ``seconds_per_sample``,
        ``rouge`` (bootstrap intervals, None when nothing was scored), ``memory``, ``padding``,
        ``tokens`` and ``generation``."""
        return {
            **self._common(model.name),
            "memory": {"device": str(model.device), "peak_bytes": self.peak, "peak_source": peak_source(model)},
            "padding": {"computed": self.padding_computed, "avoided": self.padding_avoided},
            "tokens": {"input": self.tokens_in, "output": self.tokens_out, "truncated_inputs": self.truncated},
            "generation": dict(generation),
        }

    def baseline_metrics(self, name: str) -> dict:
        """The model's metrics without its model-only parts, and ``"baseline": True``."""
        common = self._common(name)
        return {"model": name, "baseline": True, **{key: common[key] for key in list(common)[1:]}}


def metrics_from_rows(rows: Iterable[Mapping[str, Any]], *, model: ModelInfo, generation: Mapping[str, Any]) -> dict:
    """The metrics of prediction rows given in record order, read once (see `RowTotals.model_metrics`)."""
    return RowTotals(model.scorer).added(rows).model_metrics(model, generation)


def compute_metrics(rows: Mapping[str, dict], records: Sequence[Record], *, model: ModelInfo,
                    generation: Mapping[str, Any]) -> dict:
    """Metrics over `records` from their prediction rows (`rows` maps id -> row), in record order;
    a repeated id counts once. Raises ValueError if a record has no row."""
    missing = [record.id for record in records if record.id not in rows]
    if missing:
        raise ValueError(f"{len(missing)} records have no prediction (first: {missing[0]!r})")
    ids = dict.fromkeys(record.id for record in records)
    return metrics_from_rows((rows[record_id] for record_id in ids), model=model, generation=generation)


def baseline_rows(name: str, records: Iterable[Record], scorer: RougeScorer) -> Iterator[dict]:
    """One row per record of baseline `name`, made as the records are read (`baseline_row`);
    ``rouge`` is None for a record without a reference."""
    (name,) = check_baselines([name])
    summarize = BASELINES[name]
    for record in records:
        start = time.perf_counter()
        prediction = summarize(record.text)
        rouge = scorer.score(prediction, record.reference) if record.reference is not None else None
        yield baseline_row(record, prediction, rouge, time.perf_counter() - start)


def score_baselines(names: Iterable[str], records: Iterable[Record] | Callable[[], Iterable[Record]],
                    scorer: RougeScorer | None = None) -> dict:
    """Metrics of each baseline on `records`, by name (`RowTotals.baseline_metrics`).

    `records` is a sequence, or a function returning a fresh iterable of them (read once per
    baseline: a database cursor, a file reader). Pass the model's scorer so that the intervals
    are computed the same way as the model's.
    """
    scorer = scorer or RougeScorer()
    read = records if callable(records) else (lambda: records)
    return {name: RowTotals(scorer).added(baseline_rows(name, read(), scorer)).baseline_metrics(name)
            for name in check_baselines(names)}


def peak_source(model: ModelInfo) -> str:
    """Where the batch peaks come from (see `bart_opt.memory`)."""
    if model.device.type == "cuda":
        return "cuda_allocator"
    return "live_tensors" if model.count_cpu_tensors else "none"


__all__ = ["ModelInfo", "PackedScores", "RowTotals", "baseline_rows", "compute_metrics", "metrics_from_rows",
           "peak_source", "score_baselines"]
