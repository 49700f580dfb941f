"""Resumable evaluation: summarize records, score them, and write what is done as it goes.

Three layers, so that other runners can reuse the loop with their own storage:

- `iter_predictions(summarizer, records, spec, skip_ids=...)`: the core
  loop. No I/O: it yields one `PredictionBatch` (a list of prediction rows) per planned
  batch, longest inputs first, and holds nothing between yields, so the consumer
  decides where rows go, when to stop (cancel) and what else runs in between.
- `compute_metrics(rows, records, ...)`: pure; the final metrics from the stored rows,
  in record order, so a resumed run gives the same ROUGE as an uninterrupted one.
- `metrics_from_rows(rows, ...)`: the same, streaming: rows in record order from any
  iterable (the service's jobs read them from SQLite a page at a time), holding only the
  per-example ROUGE scores (12 floats each) for the bootstrap.
- `run_evaluation(summarizer, records, out_dir, ...)`: the file-backed runner used by
  ``bart-opt evaluate``: `out_dir/predictions.jsonl` (one line per record, flushed per
  batch; rerunning skips ids already there, a torn last line is dropped),
  `out_dir/run.json` (model, generation settings and the dataset's fingerprint, all
  checked on resume) and `out_dir/metrics.json` at the end.

A prediction row is ``{"id", "prediction", "reference", "rouge", "error",
"input_tokens", "output_tokens", "truncated", "padding_computed", "padding_avoided",
"seconds", "batch_peak_bytes"}``: ``seconds`` is the row's share of its batch's
tokenize/generate/decode/score time, ``batch_peak_bytes`` the memory peak of its batch.
An input that fails even alone (out of memory) gets a row with an ``error`` and an
empty prediction; it is not retried on resume and is left out of ROUGE.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bart_opt.data import Record
from bart_opt.rouge import MEASURES
from bart_opt.spec import GenerationSpec
from bart_opt.summarizer import BatchOutcome, Summarizer

PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
RUN_FILE = "run.json"


Predict = Callable[..., Iterable[list[dict]]]  # predict(records, spec, *, skip_ids) -> lists of prediction rows


@dataclass
class PredictionBatch:
    """One finished batch: its prediction rows and the summarizer's outcome (calls, memory)."""

    rows: list[dict]
    outcome: BatchOutcome


def iter_predictions(
    summarizer: Summarizer,
    records: Sequence[Record],
    spec: GenerationSpec,
    *,
    skip_ids: Iterable[str] = (),
) -> Iterator[PredictionBatch]:
    """Summarize and score every record whose id is not in `skip_ids` with the generation
    settings `spec`, one batch at a time. Yields nothing when every record is skipped."""
    skip = set(skip_ids)
    todo = [record for record in records if record.id not in skip]
    if not todo:
        return
    texts = [record.text for record in todo]
    references = [record.reference for record in todo]
    for outcome in summarizer.iter_batches(texts, references, generation=spec):
        peak = outcome.memory["peak_bytes"] if outcome.memory else 0
        rows = [prediction_row(todo[p], outcome.summaries[p], outcome.items[p], peak) for p in outcome.positions]
        yield PredictionBatch(rows=rows, outcome=outcome)


def prediction_row(record: Record, summary: str, item: Mapping[str, Any], batch_peak_bytes: int) -> dict:
    """The stored row of one record from its summary and its `SummaryResult.items` entry."""
    return {
        "id": record.id,
        "prediction": summary,
        "reference": record.reference,
        "rouge": item["rouge"],
        "error": item["error"],
        "input_tokens": item["input_tokens"],
        "output_tokens": item["output_tokens"],
        "truncated": item["truncated"],
        "padding_computed": item["padding_computed"],
        "padding_avoided": item["padding_avoided"],
        "seconds": sum(item["timing"].values()),
        "batch_peak_bytes": batch_peak_bytes,
    }


def refused_row(record: Record, reason: str) -> dict:
    """The stored row of a record refused before the model (too long, not valid text): the
    reason instead of a summary; left out of ROUGE."""
    return {
        "id": record.id, "prediction": "", "reference": record.reference, "rouge": None, "error": reason,
        "input_tokens": 0, "output_tokens": 0, "truncated": False, "padding_computed": 0, "padding_avoided": 0,
        "seconds": 0.0, "batch_peak_bytes": 0,
    }


def compute_metrics(
    rows: Mapping[str, dict],
    records: Sequence[Record],
    *,
    summarizer: Summarizer,
    generation: Mapping[str, Any],
) -> dict:
    """Metrics over `records` from their prediction rows (`rows` maps id -> row).

    ROUGE is aggregated in record order (the bootstrap is order-dependent), so the
    result does not depend on how the rows were batched or resumed. ``runtime_s`` is
    the sum of the rows' ``seconds`` (work time, model loading excluded), so it
    survives a resume too. Raises ValueError if a record has no row.
    """
    missing = [record.id for record in records if record.id not in rows]
    if missing:
        raise ValueError(f"{len(missing)} records have no prediction (first: {missing[0]!r})")
    return metrics_from_rows((rows[record.id] for record in records), summarizer=summarizer, generation=generation)


def metrics_from_rows(rows: Iterable[dict], *, summarizer: Summarizer, generation: Mapping[str, Any]) -> dict:
    """The metrics of `compute_metrics` from prediction rows given in record order, read once.

    Holds only counters and the scored rows' ROUGE as packed floats, so any number of rows
    can stream through (from a file, or from a database a page at a time).
    """
    types = summarizer.scorer.rouge_types
    scores = PackedScores(types)
    n = errors = padding_computed = padding_avoided = tokens_in = tokens_out = truncated = peak = 0
    runtime = 0.0
    for row in rows:
        n += 1
        errors += row["error"] is not None
        runtime += row["seconds"]
        peak = max(peak, row["batch_peak_bytes"])
        padding_computed += row["padding_computed"]
        padding_avoided += row["padding_avoided"]
        tokens_in += row["input_tokens"]
        tokens_out += row["output_tokens"]
        truncated += bool(row["truncated"])
        if row["rouge"] is not None:
            scores.append(row["rouge"])
    return {
        "model": summarizer.name,
        "n_obs": n,
        "n_errors": errors,
        "n_scored": len(scores),
        "runtime_s": runtime,
        "seconds_per_sample": runtime / n if n else 0.0,
        "rouge": summarizer.scorer.aggregate(scores) if len(scores) else None,
        "memory": {"device": str(summarizer.device), "peak_bytes": peak, "peak_source": _peak_source(summarizer)},
        "padding": {"computed": padding_computed, "avoided": padding_avoided},
        "tokens": {"input": tokens_in, "output": tokens_out, "truncated_inputs": truncated},
        "generation": dict(generation),
    }


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


def dataset_fingerprint(records: Iterable[Record], *, prefix: int | None = None) -> tuple[str, int, str | None]:
    """A digest of the records' ids, texts and references in order, their count, and the
    digest of the first `prefix` of them (None unless there are at least that many).

    Computed as the records stream by: two sequences with the same fingerprint give the same
    examples to evaluate, and a run over the first N records of a dataset is recognised as
    part of a longer run over it (a rerun with a larger ``--limit``).
    """
    digest = hashlib.sha256()
    count = 0
    at_prefix = None
    for record in records:
        digest.update(json.dumps([record.id, record.text, record.reference], ensure_ascii=False).encode() + b"\n")
        count += 1
        if count == prefix:
            at_prefix = f"sha256:{digest.hexdigest()}"
    return f"sha256:{digest.hexdigest()}", count, at_prefix


def _peak_source(summarizer: Summarizer) -> str:
    """Where the batch peaks come from (see `bart_opt.memory`)."""
    if summarizer.device.type == "cuda":
        return "cuda_allocator"
    return "live_tensors" if summarizer.count_cpu_tensors else "none"


class JsonlPredictionStore:
    """Prediction rows in a JSON-lines file, appended one batch at a time.

    Only newline-terminated lines count: `load` drops a torn last line (a run killed
    mid-write) by truncating the file to the last complete line, so appends stay valid.
    A broken line elsewhere is an error naming its line number.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[str, dict]:
        """Rows already written, by id; repairs a torn last line."""
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            with self.path.open("r+b") as f:
                f.truncate(complete)
        rows: dict[str, dict] = {}
        for number, line in enumerate(data[:complete].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{self.path}: line {number} is not valid JSON ({error.msg})") from None
            if not isinstance(row, dict) or "id" not in row:
                raise ValueError(f"{self.path}: line {number} is not a prediction row (no 'id')")
            rows[str(row["id"])] = row
        return rows

    def append(self, rows: Sequence[dict]) -> None:
        """Append rows and push them to disk before returning."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            f.flush()
            os.fsync(f.fileno())


def run_evaluation(
    summarizer: Summarizer,
    records: Sequence[Record],
    out_dir: str | Path,
    generation_kwargs: Mapping[str, Any] | None = None,
    progress: bool = True,
    *,
    on_batch: Callable[[list[dict]], None] | None = None,
    source: str | None = None,
    overwrite: bool = False,
    predict: Predict | None = None,
    baselines: Sequence[str] = (),
) -> dict:
    """Evaluate `records` into `out_dir`, resuming what an earlier run there left.

    Writes predictions.jsonl as it goes, then metrics.json; returns the metrics.
    `progress` shows a tqdm bar on stderr. `on_batch(rows)` runs after each batch is
    on disk (a hook for callers and tests; raising from it stops the run, leaving a
    resumable directory). `source` names the dataset in run.json and in messages.
    `overwrite` deletes an earlier run in `out_dir` and starts over. `baselines` (e.g.
    ``["lead-3"]``, see `bart_opt.baselines`) are scored on the same records with the same
    scorer and reported under ``metrics["baselines"][name]``.
    `predict(records, spec, skip_ids=...)` runs the model elsewhere (default: `iter_predictions`
    on `summarizer`), yielding lists of rows; a row whose id is already stored is dropped (a
    batch run again after a fault). With it, `summarizer` only describes the model (``name``,
    ``scorer``, ``device``, ``count_cpu_tensors``, ``generation_spec``): `bart_opt.distributed`'s
    `ReplicaPool` is both. Raises
    `InvalidRequest` for bad generation options and `UnknownBaselineError` for an unknown
    baseline (both before anything is written), and
    ValueError when `out_dir` holds a run made with another model, other generation
    settings or another dataset (ids, texts and references are fingerprinted).
    """
    from tqdm.auto import tqdm

    from bart_opt.baselines import check_baselines, score_baselines

    baselines = check_baselines(baselines)
    spec = summarizer.generation_spec(generation_kwargs)
    out = Path(out_dir)
    run = {"model": summarizer.name, "generation": spec.to_dict()}
    start_run(out, run, records, source, overwrite=overwrite)
    settings = run["generation"]
    store = JsonlPredictionStore(out / PREDICTIONS_FILE)
    rows = store.load()
    wanted = {record.id for record in records}
    done = len(wanted & rows.keys())
    start = time.perf_counter()
    with tqdm(total=len(records), initial=done, unit="doc", desc="evaluate", disable=not progress) as bar:
        model_calls: list[float] = []  # seconds of each local model call (none with `predict`)
        if predict is None:
            batches = _timed_rows(iter_predictions(summarizer, records, spec, skip_ids=rows.keys()), model_calls)
        else:
            batches = predict(records, spec, skip_ids=rows.keys())
        for batch in batches:
            fresh = list({row["id"]: row for row in batch if row["id"] not in rows}.values())
            if not fresh:
                continue
            store.append(fresh)
            rows.update((row["id"], row) for row in fresh)
            bar.update(len(fresh))
            if on_batch is not None:
                on_batch(fresh)
    metrics = compute_metrics(rows, records, summarizer=summarizer, generation=settings)
    metrics["wall_s_last_run"] = time.perf_counter() - start
    # Inside this process's model calls; the rest of the wall time is tokenizing, decoding, ROUGE and I/O.
    metrics["model_s_last_run"] = sum(model_calls) if predict is None else None
    metrics["resumed_from"] = done
    if baselines:
        metrics["baselines"] = score_baselines(baselines, records, summarizer.scorer)
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


def _timed_rows(batches: Iterable[PredictionBatch], model_calls: list[float]) -> Iterator[list[dict]]:
    """The rows of each batch, noting the seconds of its model calls in `model_calls`."""
    for batch in batches:
        model_calls.extend(call["seconds"] for call in batch.outcome.calls)
        yield batch.rows


def start_run(out: Path, run: dict, records: Sequence[Record], source: str | None, *, overwrite: bool) -> None:
    """Make `out` ready for `run` (its ``model`` and ``generation``) on `records`, before anything is written.

    `overwrite` first deletes an earlier run's files there; otherwise an earlier run must match
    (see `_check_run_file`). Records the run, with its dataset's fingerprint, in run.json.
    """
    if overwrite:
        for name in (RUN_FILE, PREDICTIONS_FILE, METRICS_FILE):
            (out / name).unlink(missing_ok=True)
    _check_run_file(out / RUN_FILE, run, records, source)


def _check_run_file(path: Path, run: dict, records: Sequence[Record], source: str | None) -> None:
    """Check the run's model, settings and dataset against an earlier run's in `path`, then record them.

    The dataset may grow (the earlier run's records must be its start: a rerun with a larger
    ``--limit``); anything else that differs is refused before anything is written.
    """
    earlier = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    where = path.parent
    before = earlier.get("dataset") if earlier is not None else None
    fingerprint, count, prefix = dataset_fingerprint(records, prefix=before.get("records") if before else None)
    dataset = {"source": source, "records": count, "fingerprint": fingerprint}
    current = {**json.loads(json.dumps(run)), "dataset": dataset}
    if earlier is not None:
        settings = {key: current[key] for key in ("model", "generation")}
        earlier_settings = {key: earlier.get(key) for key in settings}
        if earlier_settings != settings:
            raise ValueError(
                f"{where} holds a run with other settings ({json.dumps(earlier_settings)}), not "
                f"{json.dumps(settings)}; use another output directory, or --overwrite to start over"
            )
        if before is None:
            raise ValueError(f"{where} holds a run that does not record its dataset, so resuming it could mix two "
                             "datasets; use another output directory, or --overwrite to start over")
        if prefix != before.get("fingerprint"):
            shorter = " (fewer records than it evaluated)" if prefix is None else ""
            raise ValueError(
                f"{where} holds a run on another dataset ({_describe(before)}), not this one ({_describe(dataset)})"
                f"{shorter}; rerun with that dataset to resume, use another output directory, or --overwrite to "
                "start over"
            )
    where.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")


def _describe(dataset: Mapping[str, Any]) -> str:
    source = f"{dataset['source']}, " if dataset.get("source") else ""
    return f"{source}{dataset.get('records')} records, {str(dataset.get('fingerprint'))[:19]}"
