"""One aggregation of prediction rows: a model's metrics and a baseline's, with the same ROUGE intervals.

`RowTotals` reads rows once, in record order (the bootstrap is order-dependent, so the result
does not depend on how the rows were batched or resumed), holding only counters and the scored
rows' ROUGE packed as floats (12 per row): any number of rows can stream through, from a file or
from a database a page at a time. `model_metrics` and `baseline_metrics` are its two reports.

Metrics beyond ROUGE (`bart_opt.scoring.registry`) are aggregated the same way (`ScoreTotals`: each
score packed as floats, aggregated with ROUGE's bootstrap samples and seed) into
``metrics[name] = {score: {"low", "mid", "high"}}``, beside ``metrics["metrics"]`` (their names, ROUGE
first), ``metrics["signatures"]`` (each one's signature but ROUGE's) and ``metrics["metric_settings"]``
(the run record's ``metrics``: settings and signatures).

The model is described by what a `Summarizer` has (``name``, ``device``, ``count_cpu_tensors``,
``scorer``); a Ray replica pool has the same. Baselines (`bart_opt.pipeline.baselines`) are scored here
too (`baseline_rows`, `score_baselines`), with the model's scorer, so their intervals are
computed the same way.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from bart_opt.pipeline.baselines import BASELINES, check_baselines
from bart_opt.pipeline.data import Record
from bart_opt.evaluate.record import signature
from bart_opt.evaluate.rows import add_scores, baseline_row
from bart_opt.pipeline.rouge import MEASURES, RougeScorer
from bart_opt.pipeline.rouge_text import coverage
from bart_opt.scoring.base import Metric, aggregate_columns
from bart_opt.scoring.registry import SOURCE_SCORES

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
    which it dropped most (`MOSTLY_DROPPED`), predictions and references apart
    (`bart_opt.pipeline.rouge_text.coverage`)."""

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


class ScoreTotals:
    """The per-example scores of metrics beyond ROUGE over the rows scored with ROUGE, in record order,
    each score packed as floats (`add`); `aggregates` gives each metric's intervals.

    A score that some scored rows lack (``extractive``'s source-based scores, for predictions scored
    without their sources) is left out of its metric's aggregate, and `warnings` says so: the others
    stay paired over the same rows as ROUGE.
    """

    def __init__(self, names: Sequence[str], bootstrap_samples: int, seed: int,
                 expected: Mapping[str, Sequence[str]] = SOURCE_SCORES):
        self.names = [name for name in names if name != "rouge"]
        self.bootstrap_samples, self.seed = bootstrap_samples, seed
        self.expected = expected  # scores a metric gives only with a source: warned of when no row has them
        self.rows = 0
        self.values: dict[str, dict[str, array]] = {name: {} for name in self.names}
        self.missing: dict[str, int] = dict.fromkeys(self.names, 0)  # scored rows without the metric at all

    def add(self, scores: Mapping[str, Mapping[str, float]] | None) -> None:
        """One row scored with ROUGE, with its ``scores`` (None: a row without them)."""
        self.rows += 1
        for name in self.names:
            found = (scores or {}).get(name)
            if found is None:
                self.missing[name] += 1
                continue
            columns = self.values[name]
            for score, value in found.items():
                columns.setdefault(score, array("d")).append(float(value))

    def _complete(self, name: str) -> list[str]:
        return [score for score, column in self.values[name].items() if len(column) == self.rows]

    def aggregates(self) -> dict[str, dict[str, dict[str, float]] | None]:
        """``{metric: {score: {"low", "mid", "high"}}}`` over the scores every scored row has (None: none)."""
        found: dict[str, dict[str, dict[str, float]] | None] = {}
        for name in self.names:
            complete = self._complete(name)
            if not complete:
                found[name] = None
                continue
            matrix = np.column_stack([np.frombuffer(self.values[name][score], dtype=np.float64)
                                      for score in complete])  # (N, K)
            found[name] = aggregate_columns(complete, matrix, bootstrap_samples=self.bootstrap_samples,
                                            seed=self.seed)
        return found

    def warnings(self) -> list[str]:
        """One warning per metric that some scored rows lack, or some of whose scores they lack."""
        found = []
        for name in self.names:
            if self.missing[name]:  # then no score is on every row: the metric has no aggregate
                found.append(f"{name}: {self.missing[name]} of {self.rows} scored examples have no {name} scores "
                             "(rows stored before the metric was chosen, or by another scorer); it is left out")
                continue
            counts = {score: 0 for score in self.expected.get(name, ())}
            counts.update((score, len(column)) for score, column in self.values[name].items())
            lacking: dict[int, list[str]] = {}  # examples without the score -> those scores
            for score, count in counts.items():
                if count < self.rows:
                    lacking.setdefault(self.rows - count, []).append(score)
            found += [f"{name}: {', '.join(scores)} left out: {k} of {self.rows} scored examples have no source "
                      "text to score them against (predictions scored without their inputs, as bart-opt score "
                      "reads them)" for k, scores in sorted(lacking.items(), reverse=True)]
            if self.rows and not counts:
                found.append(f"{name}: no scores for any of {self.rows} scored examples")
        return found


class RowTotals:
    """Counters and packed ROUGE over prediction rows added in record order (model or baseline rows), and
    the scores of the metrics of `metrics` (the run record's ``metrics``, `bart_opt.scoring.registry.
    MetricSettings.record`; None: ROUGE only, as a run from before metrics beyond ROUGE)."""

    def __init__(self, scorer: RougeScorer, metrics: Mapping[str, Any] | None = None):
        self.scorer = scorer
        self.metrics = None if metrics is None else dict(metrics)
        names = ("rouge",) if metrics is None else tuple(metrics["names"])
        self.extra = ScoreTotals(names, scorer.settings.bootstrap_samples, scorer.settings.seed)
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
            if self.extra.names:
                self.extra.add(row.get("scores"))
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
        common = {
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
            "warnings": self.coverage.warnings() + self.extra.warnings(),
        }
        if self.metrics is not None:
            common.update({"metrics": ["rouge", *self.extra.names], **self.extra.aggregates(),
                           "signatures": dict(self.metrics.get("signatures") or {}), "metric_settings": self.metrics})
        return common

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
    aggregated with `scorer` (default: the model's); the metrics beyond ROUGE are `record`'s ``metrics``."""
    return RowTotals(scorer or model.scorer, (record or {}).get("metrics")).added(rows).model_metrics(
        model, generation, record)


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


def baseline_rows(name: str, records: Iterable[Record], scorer: RougeScorer,
                  metrics: Sequence[Metric] = ()) -> Iterator[dict]:
    """One row per record of baseline `name`, made as the records are read (`baseline_row`);
    ``rouge`` is None for a record without a reference. `metrics` (beyond ROUGE) score each row
    against its record's text (`bart_opt.evaluate.rows.add_scores`)."""
    (name,) = check_baselines([name])
    summarize = BASELINES[name]
    extra = [metric for metric in metrics if metric.name != "rouge"]
    for record in records:
        start = time.perf_counter()
        prediction = summarize(record.text, scorer.settings.lang)
        rouge = scorer.score_any(prediction, record.reference) if record.reference is not None else None
        row = baseline_row(record, prediction, rouge, time.perf_counter() - start)
        add_scores([row], extra, {record.id: record.text})
        yield row


def score_baselines(names: Iterable[str], records: Iterable[Record] | Callable[[], Iterable[Record]],
                    scorer: RougeScorer | None = None, metrics: Sequence[Metric] = (),
                    metric_record: Mapping[str, Any] | None = None) -> dict:
    """Metrics of each baseline on `records`, by name (`RowTotals.baseline_metrics`).

    `records` is a sequence, or a function returning a fresh iterable of them (read once per
    baseline: a database cursor, a file reader). Pass the model's scorer so that the intervals
    are computed the same way as the model's, and the model run's metrics (`metrics`, the objects,
    and `metric_record`, the run record's ``metrics``) so that the baselines get the same ones.
    """
    scorer = scorer or RougeScorer()
    read = records if callable(records) else (lambda: records)
    return {name: RowTotals(scorer, metric_record).added(baseline_rows(name, read(), scorer, metrics))
            .baseline_metrics(name) for name in check_baselines(names)}


def peak_source(model: ModelInfo) -> str:
    """Where the batch peaks come from (see `bart_opt.engine.memory`)."""
    if model.device.type == "cuda":
        return "cuda_allocator"
    return "live_tensors" if model.count_cpu_tensors else "none"


__all__ = ["ModelInfo", "PackedScores", "RowTotals", "ScoreTotals", "baseline_rows", "compute_metrics", "metrics_from_rows",
           "peak_source", "score_baselines"]
