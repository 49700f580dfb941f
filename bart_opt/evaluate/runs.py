"""Run folders: what ``bart-opt evaluate`` writes, resumed where an earlier run left it.

`run_evaluation(model, records, out_dir, ...)` is the command line's adapter over the evaluation
core (`bart_opt.evaluate.core.evaluate_records`): the records in memory (`ListSource`), the run
folder as the sink (`RunFolder`) and the model's executor (a `Summarizer` runs in this process; a
`bart_opt.distributed.ReplicaPool` on a Ray cluster). The folder holds

- ``predictions.jsonl``: one line per record (see `bart_opt.evaluate.rows`), appended and pushed
  to disk per batch; rerunning skips ids already there, and a torn last line is dropped;
- ``run.json``: the run record (`bart_opt.evaluate.record`: the model, its checkpoint's content
  fingerprint (`bart_opt.engine.fingerprint`), the engine as resolved, the generation and ROUGE settings,
  the versions, the processor, the start time and the signature) and the dataset's fingerprint, all
  checked on resume (`start_run`: the one place a run folder is matched to a run): a folder refilled
  with another checkpoint under the same name, or resumed with another dtype, mode, quantization,
  generation or ROUGE setting, is refused naming each field, never mixed; a version or processor
  that changed is recorded (``history``) and warned of;
- ``metrics.json``: at the end (`bart_opt.evaluate.metrics`), with the baselines asked for.

A record that fails even alone (out of memory, or the model failing on it) gets a row with an
``error`` and an empty prediction; it is not retried on resume and is left out of ROUGE.
`run_baseline_evaluation` writes the same folder for a baseline (``--model lead-3``).

A run holds the folder's `bart_opt.runlock.RunLock` from start to end: a second run on the
same folder fails at once naming the first one's pid. Predictions with no run.json beside them
(written by something else) are refused rather than resumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bart_opt.pipeline.baselines import check_baselines
from bart_opt.pipeline.data import Record
from bart_opt.evaluate.core import Executor, ListSource, SummarizerExecutor, evaluate_records
from bart_opt.evaluate.metrics import RowTotals, baseline_rows, compute_metrics, score_baselines
from bart_opt.evaluate.record import check_resume, run_record
from bart_opt.evaluate.rows import RowBatch
from bart_opt.evaluate.stored import (
    METRICS_FILE, PREDICTIONS_FILE, RUN_FILE, RunFile, check_out, check_run_folder, open_run_file, parse_rows, read_json_file,
    write_run_file,
)
from bart_opt.pipeline.rouge import RougeScorer, RougeSettings
from bart_opt.runlock import RunLock
from bart_opt.scoring.base import Metric
from bart_opt.scoring.registry import MetricSettings, build_metrics
from bart_opt.engine.spec import GenerationSpec
from bart_opt.pipeline.summarizer import Summarizer


logger = logging.getLogger("bart_opt.evaluate")


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
        line = json.dumps([record.id, record.text, record.reference], ensure_ascii=False)
        digest.update(line.encode("utf-8", "surrogatepass") + b"\n")  # a text that is not valid Unicode too
        count += 1
        if count == prefix:
            at_prefix = f"sha256:{digest.hexdigest()}"
    return f"sha256:{digest.hexdigest()}", count, at_prefix


class JsonlPredictionStore:
    """Prediction rows in a JSON-lines file, appended one batch at a time.

    Only newline-terminated lines count: `load` drops a torn last line (a run killed
    mid-write) by truncating the file to the last complete line, so appends stay valid.
    Every other line is checked (`bart_opt.evaluate.stored.PredictionRow`, ids unique): a broken
    one is a `bart_opt.evaluate.stored.StoredFileError` naming its line and field. The file is
    never opened through a symbolic link.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[str, dict]:
        """Rows already written, by id; repairs a torn last line."""
        if not self.path.exists() and not self.path.is_symlink():
            return {}
        with open_run_file(self.path, os.O_RDWR) as f:
            data = f.read()
            complete = data.rfind(b"\n") + 1
            if complete < len(data):
                f.truncate(complete)
        return {row["id"]: row for _, row in parse_rows(data[:complete], self.path)}

    def append(self, rows: Sequence[dict]) -> None:
        """Append rows and push them to disk before returning."""
        with open_run_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT) as f:
            f.write("".join(json_line(row) for row in rows).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())


class RunFolder:
    """The sink of a run folder: rows appended to ``predictions.jsonl`` a batch at a time (see the
    module docstring). `done` holds the ids stored before; `on_write(rows)` runs after each batch
    is on disk (raising from it stops the run, leaving a resumable folder)."""

    def __init__(self, out: Path, on_write: Callable[[list[dict]], None] = lambda rows: None):
        self.store = JsonlPredictionStore(out / PREDICTIONS_FILE)
        self.rows = self.store.load()
        self.done = self.rows.keys()
        self.on_write = on_write

    def write(self, batch: RowBatch) -> None:
        self.store.append(batch.rows)
        self.rows.update((row["id"], row) for row in batch.rows)
        self.on_write(batch.rows)


def json_line(row: Mapping[str, Any]) -> str:
    """`row` as one JSON line: UTF-8 as is, or escaped where a value is not valid text (a lone
    surrogate in an id, which JSON can carry but UTF-8 cannot)."""
    line = json.dumps(row, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(row)
    return line + "\n"


def run_evaluation(
    model: Summarizer | Executor,
    records: Sequence[Record],
    out_dir: str | Path,
    generation_kwargs: Mapping[str, Any] | None = None,
    progress: bool = True,
    *,
    on_batch: Callable[[list[dict]], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    source: str | None = None,
    overwrite: bool = False,
    baselines: Sequence[str] = (),
    rouge: RougeSettings | None = None,
    metrics: MetricSettings | None = None,
) -> dict:
    """Evaluate `records` into `out_dir`, resuming what an earlier run there left.

    `model` is a `Summarizer` (run in this process) or an executor such as
    `bart_opt.distributed.ReplicaPool`. Writes predictions.jsonl as it goes, then metrics.json;
    returns the metrics. `progress` shows a tqdm bar on stderr. `on_batch(rows)` runs after each
    batch is on disk (a hook for callers and tests; raising from it stops the run, leaving a
    resumable directory). `on_progress(done, total)` is told what the progress bar shows, as it moves:
    the records with a row (resumed ones first) of all of them (an experiment tracker's hook,
    `bart_opt.tracking`). `source` names the dataset in run.json and in messages. `overwrite`
    deletes an earlier run in `out_dir` and starts over. `baselines` (e.g. ``["lead-3"]``, see
    `bart_opt.pipeline.baselines`) are scored on the same records with the same scorer and reported under
    ``metrics["baselines"][name]``. `rouge` are the ROUGE settings (default: the model's scorer's),
    recorded in run.json and metrics.json with the signature. `metrics` are the metrics beyond ROUGE
    (default: `bart_opt.scoring.registry.DEFAULT`, words and sentences in ROUGE's language), scored on
    every row and on the baselines, recorded in run.json and checked on resume like the ROUGE settings.
    Raises `InvalidRequest` for bad generation options or metrics and
    `UnknownBaselineError` for an unknown baseline (both before anything is written),
    `bart_opt.evaluate.core.FailureStreak` when the model fails on record after record, and
    ValueError when `out_dir` holds a run made with another model, another checkpoint (by content),
    another engine (`bart_opt.evaluate.record.ResumeRefused`, naming each field), other generation or
    ROUGE settings or another dataset (ids, texts and references are fingerprinted), or
    predictions without a run.json; `bart_opt.runlock.RunFolderBusy` (a ValueError) when another run
    holds the folder.
    """
    baselines = check_baselines(baselines)
    executor = SummarizerExecutor(model) if isinstance(model, Summarizer) else model
    spec = executor.generation_spec(generation_kwargs)
    rouge = rouge or executor.model.scorer.settings
    metrics = metrics or MetricSettings.for_rouge(rouge)
    built = build_metrics(metrics, rouge)
    out = Path(out_dir)
    check_out(out)
    with RunLock(out):
        run = run_record(system="bart", model=executor.identity()["model"], fingerprint=executor.fingerprint,
                         generation=spec.to_dict(), engine=executor.engine_record(), rouge=rouge,
                         processor_info=executor.processor(), metrics=metrics.record(built))
        notes = start_run(out, run, records, source, overwrite=overwrite)
        return _evaluate_into(out, executor, records, spec, progress, on_batch, on_progress, baselines, run, notes,
                              built)


def _evaluate_into(out: Path, executor: Executor, records: Sequence[Record], spec: GenerationSpec, progress: bool,
                   on_batch: Callable[[list[dict]], None] | None, on_progress: Callable[[int, int], None] | None,
                   baselines: Sequence[str], run: dict, notes: list[str], metrics: Sequence[Metric]) -> dict:
    """`run_evaluation`'s work once the folder is locked and matched to the run (`run`, the record; `metrics`,
    its metrics built)."""
    rouge = RougeSettings.from_dict(run["rouge_settings"])
    from tqdm.auto import tqdm

    start = time.perf_counter()
    stored = 0  # records with a row, resumed ones included (a disabled bar counts none)
    with tqdm(total=len(records), unit="doc", desc="evaluate", disable=not progress) as bar:
        def moved(rows: int) -> None:
            nonlocal stored
            stored += rows
            bar.update(rows)
            if on_progress is not None:
                on_progress(stored, len(records))

        def written(rows: list[dict]) -> None:
            moved(len(rows))
            if on_batch is not None:
                on_batch(rows)

        folder = RunFolder(out, written)
        done = len({record.id for record in records} & folder.done)
        moved(done)
        report = evaluate_records(ListSource(records), folder, executor, spec, rouge=rouge, metrics=metrics)
    found = compute_metrics(folder.rows, records, model=executor.model, generation=spec.to_dict(),
                            scorer=rouge.scorer(), run=run)
    found["warnings"] = notes + found["warnings"]
    found["wall_s_last_run"] = time.perf_counter() - start
    # Inside this process's model calls; the rest of the wall time is tokenizing, decoding, ROUGE and I/O.
    found["model_s_last_run"] = report.model_seconds if executor.in_process else None
    found["resumed_from"] = done
    if baselines:
        found["baselines"] = score_baselines(baselines, records, rouge.scorer(), metrics, run.get("metrics"))
    write_run_file(out / METRICS_FILE, json.dumps(found, indent=2) + "\n")
    return found


def run_baseline_evaluation(name: str, records: Sequence[Record], out_dir: str | Path,
                            scorer: RougeScorer | None = None, *, source: str | None = None,
                            overwrite: bool = False, metrics: MetricSettings | None = None) -> dict:
    """Evaluate baseline `name` into `out_dir` as `run_evaluation` does a model, scored with `scorer`
    (default: `RougeScorer()`; its settings are recorded).

    Writes run.json (model `name`, no generation settings, ``"system": "baseline"``, ``"baseline": true``,
    the ROUGE settings and the dataset's fingerprint, checked against an earlier run there as for a
    model), predictions.jsonl
    (rewritten whole: a baseline takes milliseconds, so there is nothing to resume) and
    metrics.json; returns the metrics. `source`, `overwrite` and `metrics` are run_evaluation's. Raises
    ValueError when `out_dir` holds another run (another model, baseline or dataset).
    """
    (name,) = check_baselines([name])
    scorer = scorer or RougeScorer()
    settings = metrics or MetricSettings.for_rouge(scorer.settings)
    built = build_metrics(settings, scorer.settings)
    out = Path(out_dir)
    check_out(out)
    with RunLock(out):
        run = run_record(system="baseline", model=name, rouge=scorer.settings, baseline=True,
                         metrics=settings.record(built))
        notes = start_run(out, run, records, source, overwrite=overwrite)
        start = time.perf_counter()
        rows = list(baseline_rows(name, records, scorer, built))
        write_run_file(out / PREDICTIONS_FILE, "".join(json_line(row) for row in rows))
        found = RowTotals(scorer, run["metrics"]).added(rows).baseline_metrics(name)
        found["warnings"] = notes + found["warnings"]
        found["wall_s_last_run"] = time.perf_counter() - start
        found["resumed_from"] = 0
        write_run_file(out / METRICS_FILE, json.dumps(found, indent=2) + "\n")
        return found


def start_run(out: Path, run: dict, records: Sequence[Record], source: str | None, *, overwrite: bool) -> list[str]:
    """Make `out` ready for `run` (a `bart_opt.evaluate.record.run_record`) on `records`, before anything is written.

    `overwrite` first deletes an earlier run's files there; otherwise an earlier run must match
    (see `_check_run_file`), and predictions without a run.json are refused. Records the run, with
    its dataset's fingerprint, in run.json, and returns the warnings of resuming it (versions or
    processor that changed: also logged). The caller holds the folder's `RunLock`.
    """
    check_run_folder(out, overwrite=overwrite, rows=False)  # the rows are checked as `RunFolder` loads them
    if overwrite:
        for name in (RUN_FILE, PREDICTIONS_FILE, METRICS_FILE):
            (out / name).unlink(missing_ok=True)
    notes = _check_run_file(out / RUN_FILE, run, records, source)
    for note in notes:
        logger.warning("%s", note)
    return notes


def _check_run_file(path: Path, run: dict, records: Sequence[Record], source: str | None) -> list[str]:
    """Check the run's record and dataset against an earlier run's in `path`, then record them; the
    warnings of resuming it.

    The dataset may grow (the earlier run's records must be its start: a rerun with a larger
    ``--limit``); the versions, the processor and the batch budgets may change (warned, and the
    earlier run's kept under ``history``); anything else that differs is refused before anything is
    written (`bart_opt.evaluate.record.check_resume`).
    """
    earlier = read_json_file(path, RunFile) if path.exists() else None
    where = path.parent
    before = earlier.get("dataset") if earlier is not None else None
    fingerprint, count, prefix = dataset_fingerprint(records, prefix=before.get("records") if before else None)
    dataset = {"source": source, "records": count, "fingerprint": fingerprint}
    current = {**json.loads(json.dumps(run)), "dataset": dataset}
    notes: list[str] = []
    if earlier is not None:
        changed = check_resume(str(where), earlier, current)
        _check_checkpoint(where, earlier, current)
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
        notes = [f"{where} was started otherwise ({'; '.join(changed)}); resumed, and the earlier run's record "
                 f"kept in {RUN_FILE} under history"] if changed else []
        earlier_start = {key: earlier.get(key) for key in ("started_at", "versions", "processor", "engine")}
        current["history"] = [*earlier.get("history", []), earlier_start]
    where.mkdir(parents=True, exist_ok=True)
    write_run_file(path, json.dumps(current, indent=2) + "\n")
    return notes


def _check_checkpoint(where: Path, earlier: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume a model's run on a checkpoint with other contents than the one it was made with."""
    if "fingerprint" not in current or earlier.get("fingerprint") == current["fingerprint"]:
        return
    if earlier.get("fingerprint") is None:
        raise ValueError(f"{where} holds a run that does not record its checkpoint's fingerprint, so resuming it "
                         f"with checkpoint {current['fingerprint']} could mix two checkpoints; use another output "
                         "directory, or --overwrite to start over")
    raise ValueError(f"{where} holds a run made with checkpoint {earlier['fingerprint']}, but the checkpoint loaded "
                     f"now is {current['fingerprint']} (same name, other contents); resuming would mix two "
                     "checkpoints: use another output directory, or --overwrite to start over")


def _describe(dataset: Mapping[str, Any]) -> str:
    source = f"{dataset['source']}, " if dataset.get("source") else ""
    return f"{source}{dataset.get('records')} records, {str(dataset.get('fingerprint'))[:19]}"
