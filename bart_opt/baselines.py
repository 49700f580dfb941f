"""Baselines that every summarization score is read against, computed on the CPU with no model.

``lead-3``: the first three sentences of the article, split by the same sentence splitter
rougeLsum uses (`bart_opt.rouge.split_sentences`) and written one per line. On CNN/DailyMail
it scores about 40.4 / 17.6 / 36.7 ROUGE-1/2/L, the number published systems are compared to.

Public API, for the CLI and the service's evaluation jobs:

- `BASELINES`, `is_baseline(name)`, `check_baselines(names)`: which names exist;
- `baseline_summary(name, text)`: one summary;
- `baseline_rows(name, records, scorer)`: prediction rows shaped like `bart_opt.evaluate`'s;
- `baseline_metrics(rows, name, scorer)` and `score_baselines(names, records, scorer)`:
  ROUGE with the same bootstrap intervals as a model's metrics;
- `run_baseline_evaluation(name, records, out_dir)`: the run folder ``bart-opt evaluate --model
  lead-3`` writes (predictions.jsonl, run.json, metrics.json).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from bart_opt.data import Record
from bart_opt.rouge import RougeScorer, split_sentences


def lead(text: str, n: int) -> str:
    """The first `n` sentences of `text`, one per line (rougeLsum's sentence splitter)."""
    return "\n".join(split_sentences(text)[:n])


def lead_3(text: str) -> str:
    """The first three sentences of `text`, one per line."""
    return lead(text, 3)


BASELINES: dict[str, Callable[[str], str]] = {"lead-3": lead_3}


class UnknownBaselineError(ValueError):
    """A baseline name that does not exist; `.name` is the one asked for, `.available` those that do."""

    def __init__(self, name: object):
        self.name = name
        self.available = sorted(BASELINES)
        super().__init__(f"unknown baseline {name!r}; available: {', '.join(self.available)}")


def is_baseline(name: str) -> bool:
    """Whether `name` names a baseline rather than a checkpoint."""
    return name in BASELINES


def check_baselines(names: Iterable[str]) -> tuple[str, ...]:
    """The names in order, duplicates dropped; raises UnknownBaselineError at the first unknown one."""
    checked: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in BASELINES:
            raise UnknownBaselineError(name)
        if name not in checked:
            checked.append(name)
    return tuple(checked)


def baseline_summary(name: str, text: str) -> str:
    """The summary baseline `name` writes for `text`."""
    (name,) = check_baselines([name])
    return BASELINES[name](text)


def baseline_rows(name: str, records: Iterable[Record], scorer: RougeScorer) -> Iterator[dict]:
    """One prediction row per record, made as the records are read: ``id``, ``prediction``,
    ``reference``, ``rouge``, ``error``, ``seconds``.

    ``rouge`` is None for a record without a reference. The model-only fields of a model's
    rows (tokens, padding, memory) are left out: a baseline has none of them.
    """
    (name,) = check_baselines([name])
    summarize = BASELINES[name]
    for record in records:
        start = time.perf_counter()
        prediction = summarize(record.text)
        rouge = scorer.score(prediction, record.reference) if record.reference is not None else None
        yield {"id": record.id, "prediction": prediction, "reference": record.reference, "rouge": rouge,
               "error": None, "seconds": time.perf_counter() - start}


def baseline_metrics(rows: Iterable[dict], name: str, scorer: RougeScorer) -> dict:
    """``model``, ``baseline``, ``n_obs``, ``n_errors``, ``n_scored``, ``runtime_s``,
    ``seconds_per_sample`` and ``rouge`` (bootstrap intervals, or None when nothing has a reference).

    `rows` are read once and only their scores are kept (packed), so any number can stream through.
    """
    from bart_opt.evaluate import PackedScores

    scored = PackedScores(scorer.rouge_types)
    n, runtime = 0, 0.0
    for row in rows:
        n += 1
        runtime += row["seconds"]
        if row["rouge"] is not None:
            scored.append(row["rouge"])
    return {
        "model": name,
        "baseline": True,
        "n_obs": n,
        "n_errors": 0,
        "n_scored": len(scored),
        "runtime_s": runtime,
        "seconds_per_sample": runtime / n if n else 0.0,
        "rouge": scorer.aggregate(scored) if len(scored) else None,
    }


def score_baselines(names: Iterable[str], records: Iterable[Record] | Callable[[], Iterable[Record]],
                    scorer: RougeScorer | None = None) -> dict:
    """Metrics of each baseline on `records`, by name (see `baseline_metrics`).

    `records` is a sequence, or a function returning a fresh iterable of them (read once per
    baseline: a database cursor, a file reader). Pass the model's scorer so that the intervals
    are computed the same way as the model's.
    """
    scorer = scorer or RougeScorer()
    read = records if callable(records) else (lambda: records)
    return {name: baseline_metrics(baseline_rows(name, read(), scorer), name, scorer)
            for name in check_baselines(names)}


def run_baseline_evaluation(name: str, records: Sequence[Record], out_dir: str | Path,
                            scorer: RougeScorer | None = None, *, source: str | None = None,
                            overwrite: bool = False) -> dict:
    """Evaluate baseline `name` into `out_dir` like `bart_opt.evaluate.run_evaluation` does a model.

    Writes run.json (model `name`, no generation settings, ``"baseline": true`` and the dataset's
    fingerprint, checked against an earlier run there as for a model), predictions.jsonl
    (rewritten whole: a baseline takes milliseconds, so there is nothing to resume) and
    metrics.json; returns the metrics. `source` and `overwrite` are run_evaluation's. Raises
    ValueError when `out_dir` holds another run (another model, baseline or dataset).
    """
    from bart_opt.evaluate import METRICS_FILE, PREDICTIONS_FILE, start_run

    (name,) = check_baselines([name])
    scorer = scorer or RougeScorer()
    out = Path(out_dir)
    start_run(out, {"model": name, "generation": None, "baseline": True}, records, source, overwrite=overwrite)
    start = time.perf_counter()
    rows = list(baseline_rows(name, records, scorer))
    (out / PREDICTIONS_FILE).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows),
                                        encoding="utf-8")
    metrics = baseline_metrics(rows, name, scorer)
    metrics["wall_s_last_run"] = time.perf_counter() - start
    metrics["resumed_from"] = 0
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics
