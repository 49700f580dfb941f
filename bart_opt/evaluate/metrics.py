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
from bart_opt.evaluate.record import signature
from bart_opt.evaluate.rows import baseline_row
from bart_opt.rouge import MEASURES, RougeScorer
from bart_opt.rouge_text import coverage

MOSTLY_DROPPED = 0.5  # a text of which the tokenizer keeps less than this share of letters and digits is flagged


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


class Coverage:
    """What the tokenizer kept of the scored texts: letters and digits in all, kept, and the texts of
    which it dropped most (`MOSTLY_DROPPED`), predictions and references apart (`bart_opt.rouge_text.coverage`)."""

    def __init__(self, tokenizer: str):
        self.tokenizer = tokenizer
        self.texts = {"predictions": 0, "references": 0}
        self.dropped = {"predictions": 0, "references": 0}
        self.total = self.kept = 0

    def add(self, prediction: str, reference: str | Sequence[str]) -> None:
        references = [reference] if isinstance(reference, str) else list(reference)
        for kind, texts in (("predictions", [prediction]), ("references", references)):
            for text in texts:
                kept, total = coverage(self.tokenizer, text)
                self.texts[kind] += 1
                self.total += total
                self.kept += kept
                self.dropped[kind] += total > 0 and kept < MOSTLY_DROPPED * total

    def to_dict(self) -> dict:
        return {"tokenizer": self.tokenizer, "letters_and_digits": self.total, "kept": self.kept,
                "mostly_dropped": {kind: {"texts": self.dropped[kind], "of": self.texts[kind]} for kind in self.texts}}

    def warnings(self) -> list[str]:
        """One warning when the tokenizer dropped most of some text's characters, with the counts; else none."""
        if not any(self.dropped.values()):
            return []
        counts = " and ".join(f"{self.dropped[kind]} of {self.texts[kind]} {kind}" for kind in self.texts
                              if self.dropped[kind])
        return [f"ROUGE's {self.tokenizer} tokenizer dropped most of the letters and digits of {counts} (it kept "
                f"{self.kept:,} of {self.total:,}): those texts score near 0 whatever they say; score them with "
                "--rouge-tokenizer unicode or script (and --rouge-lang)"]


class RowTotals:
    """Counters and packed ROUGE over prediction rows added in record order (model or baseline rows)."""

    def __init__(self, scorer: RougeScorer):
        self.scorer = scorer
        self.scores = PackedScores(scorer.rouge_types)
        self.coverage = Coverage(scorer.settings.tokenizer)
        self.refs: tuple[int, int] | None = None  # fewest and most references of a scored row
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
            reference = row["reference"]
            count = 1 if isinstance(reference, str) else len(reference)
            self.refs = (count, count) if self.refs is None else (min(self.refs[0], count), max(self.refs[1], count))
            self.coverage.add(row["prediction"], reference)

    def added(self, rows: Iterable[Mapping[str, Any]]) -> RowTotals:
        """These totals with every row of `rows` added."""
        for row in rows:
            self.add(row)
        return self

    @property
    def nrefs(self) -> str:
        """References per scored example, as the signature shows them: ``1``, ``4`` or ``1-4``."""
        if self.refs is None:
            return "0"
        low, high = self.refs
        return str(low) if low == high else f"{low}-{high}"

    def _common(self, name: str, record: Mapping[str, Any]) -> dict:
        return {
            "model": name,
            "signature": signature(record, self.nrefs),
            "n_obs": self.n,
            "n_errors": self.errors,
            "n_scored": len(self.scores),
            "runtime_s": self.runtime,
            "seconds_per_sample": self.runtime / self.n if self.n else 0.0,
            "rouge": self.scorer.aggregate(self.scores) if len(self.scores) else None,
            "rouge_settings": self.scorer.settings.to_dict(),
            "rouge_coverage": self.coverage.to_dict(),
            "warnings": self.coverage.warnings(),
        }

    def model_metrics(self, model: ModelInfo, generation: Mapping[str, Any],
                      record: Mapping[str, Any] | None = None) -> dict:
        """``model``, ``signature`` (of `record`, the run's `bart_opt.evaluate.record.run_record`, with the
        references counted here), ``n_obs``, ``n_errors``, ``n_scored``, ``runtime_s``, ``seconds_per_sample``,
        ``rouge`` (mean and bootstrap interval, None when nothing was scored), ``rouge_settings``,
        ``rouge_coverage``, ``warnings``, ``memory``, ``padding``, ``tokens`` and ``generation``."""
        record = record or {"system": "bart", "model": model.name}
        return {
            **self._common(model.name, {**record, "rouge_settings": self.scorer.settings.to_dict()}),
            "memory": {"device": str(model.device), "peak_bytes": self.peak, "peak_source": peak_source(model)},
            "padding": {"computed": self.padding_computed, "avoided": self.padding_avoided},
            "tokens": {"input": self.tokens_in, "output": self.tokens_out, "truncated_inputs": self.truncated},
            "generation": dict(generation),
        }

    def baseline_metrics(self, name: str) -> dict:
        """The model's metrics without its model-only parts, and ``"baseline": True``."""
        common = self._common(name, {"system": "baseline", "model": name,
                                     "rouge_settings": self.scorer.settings.to_dict()})
        return {"model": name, "baseline": True, **{key: common[key] for key in list(common)[1:]}}

    def external_metrics(self, record: Mapping[str, Any]) -> dict:
        """The metrics of another system's predictions (``bart-opt score``): the baseline's shape, ``"system":
        "external"`` and the file's fingerprint in the signature (`record`)."""
        common = self._common(record["model"], {**record, "rouge_settings": self.scorer.settings.to_dict()})
        return {**common, "system": "external"}


def metrics_from_rows(rows: Iterable[Mapping[str, Any]], *, model: ModelInfo, generation: Mapping[str, Any],
                      scorer: RougeScorer | None = None, record: Mapping[str, Any] | None = None) -> dict:
    """The metrics of prediction rows given in record order, read once (see `RowTotals.model_metrics`),
    aggregated with `scorer` (default: the model's)."""
    return RowTotals(scorer or model.scorer).added(rows).model_metrics(model, generation, record)


def compute_metrics(rows: Mapping[str, dict], records: Sequence[Record], *, model: ModelInfo,
                    generation: Mapping[str, Any], scorer: RougeScorer | None = None,
                    run: Mapping[str, Any] | None = None) -> dict:
    """Metrics over `records` from their prediction rows (`rows` maps id -> row), in record order;
    a repeated id counts once. Raises ValueError if a record has no row."""
    missing = [record.id for record in records if record.id not in rows]
    if missing:
        raise ValueError(f"{len(missing)} records have no prediction (first: {missing[0]!r})")
    ids = dict.fromkeys(record.id for record in records)
    return metrics_from_rows((rows[record_id] for record_id in ids), model=model, generation=generation,
                             scorer=scorer, record=run)


def baseline_rows(name: str, records: Iterable[Record], scorer: RougeScorer) -> Iterator[dict]:
    """One row per record of baseline `name`, made as the records are read (`baseline_row`);
    ``rouge`` is None for a record without a reference."""
    (name,) = check_baselines([name])
    summarize = BASELINES[name]
    for record in records:
        start = time.perf_counter()
        prediction = summarize(record.text, scorer.settings.lang)
        rouge = scorer.score_any(prediction, record.reference) if record.reference is not None else None
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
