"""Resumable evaluation: summarize records, score them, and write what is done as it goes.

Three layers, so that other runners can reuse the loop with their own storage:

- `iter_predictions(summarizer, records, spec, skip_ids=...)`: the core
  loop. No I/O: it yields one `PredictionBatch` (a list of prediction rows) per planned
  batch, longest inputs first, and holds nothing between yields, so the consumer
  decides where rows go, when to stop (cancel) and what else runs in between.
- `compute_metrics(rows, records, ...)`: pure; the final metrics from the stored rows,
  in record order, so a resumed run gives the same ROUGE as an uninterrupted one.
- `run_evaluation(summarizer, records, out_dir, ...)`: the file-backed runner used by
  ``bart-opt evaluate``: `out_dir/predictions.jsonl` (one line per record, flushed per
  batch; rerunning skips ids already there, a torn last line is dropped),
  `out_dir/run.json` (model and generation settings, checked on resume) and
  `out_dir/metrics.json` at the end.

A prediction row is ``{"id", "prediction", "reference", "rouge", "error",
"input_tokens", "output_tokens", "truncated", "padding_computed", "padding_avoided",
"seconds", "batch_peak_bytes"}``: ``seconds`` is the row's share of its batch's
tokenize/generate/decode/score time, ``batch_peak_bytes`` the memory peak of its batch.
An input that fails even alone (out of memory) gets a row with an ``error`` and an
empty prediction; it is not retried on resume and is left out of ROUGE.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bart_opt.data import Record
from bart_opt.spec import GenerationSpec
from bart_opt.summarizer import BatchOutcome, Summarizer

PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
RUN_FILE = "run.json"


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
    ordered = [rows[record.id] for record in records]
    scored = [row["rouge"] for row in ordered if row["rouge"] is not None]
    runtime = sum(row["seconds"] for row in ordered)
    return {
        "model": summarizer.name,
        "n_obs": len(ordered),
        "n_errors": sum(row["error"] is not None for row in ordered),
        "n_scored": len(scored),
        "runtime_s": runtime,
        "seconds_per_sample": runtime / len(ordered) if ordered else 0.0,
        "rouge": summarizer.scorer.aggregate(scored) if scored else None,
        "memory": {
            "device": str(summarizer.device),
            "peak_bytes": max((row["batch_peak_bytes"] for row in ordered), default=0),
            "peak_source": _peak_source(summarizer),
        },
        "padding": {
            "computed": sum(row["padding_computed"] for row in ordered),
            "avoided": sum(row["padding_avoided"] for row in ordered),
        },
        "tokens": {
            "input": sum(row["input_tokens"] for row in ordered),
            "output": sum(row["output_tokens"] for row in ordered),
            "truncated_inputs": sum(bool(row["truncated"]) for row in ordered),
        },
        "generation": dict(generation),
    }


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
) -> dict:
    """Evaluate `records` into `out_dir`, resuming what an earlier run there left.

    Writes predictions.jsonl as it goes, then metrics.json; returns the metrics.
    `progress` shows a tqdm bar on stderr. `on_batch(rows)` runs after each batch is
    on disk (a hook for callers and tests; raising from it stops the run, leaving a
    resumable directory). Raises `InvalidRequest` for bad generation options (before
    anything is written) and ValueError when `out_dir` holds a run made with another
    model or other generation settings.
    """
    from tqdm.auto import tqdm

    spec = summarizer.generation_spec(generation_kwargs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = spec.to_dict()
    _check_run_file(out / RUN_FILE, {"model": summarizer.name, "generation": settings})
    store = JsonlPredictionStore(out / PREDICTIONS_FILE)
    rows = store.load()
    wanted = {record.id for record in records}
    done = len(wanted & rows.keys())
    start = time.perf_counter()
    with tqdm(total=len(records), initial=done, unit="doc", desc="evaluate", disable=not progress) as bar:
        for batch in iter_predictions(summarizer, records, spec, skip_ids=rows.keys()):
            store.append(batch.rows)
            rows.update((row["id"], row) for row in batch.rows)
            bar.update(len(batch.rows))
            if on_batch is not None:
                on_batch(batch.rows)
    metrics = compute_metrics(rows, records, summarizer=summarizer, generation=settings)
    metrics["wall_s_last_run"] = time.perf_counter() - start
    metrics["resumed_from"] = done
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


def _check_run_file(path: Path, run: dict) -> None:
    """Record the run's model and settings, or check them against an earlier run's."""
    run = json.loads(json.dumps(run))
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        if earlier != run:
            raise ValueError(
                f"{path.parent} holds a run with other settings ({json.dumps(earlier)}), not "
                f"{json.dumps(run)}; use another output directory"
            )
        return
    path.write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
