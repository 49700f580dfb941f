"""Another system's predictions scored into a run folder: ``bart-opt score PREDICTIONS --out DIR``.

A PEGASUS, T5 or LLM run, or any other, is a file of predictions: JSON lines, a JSON array, CSV or
Parquet (by extension, read a bounded piece at a time by `bart_opt.pipeline.readers`) with an id, a
prediction and a reference per example (`Columns` names them), or an id and a prediction with the
references in another file (`references`, joined by id: each prediction needs one, and each
reference a prediction). A reference is a string, or a list of strings for several references
(Multi-News, DUC): it is then scored as rouge-score's ``score_multi`` does, the best reference
per type (`bart_opt.pipeline.rouge.RougeScorer.score_multi`). CSV holds strings only: one reference each.

`ScoringExecutor` is the same scoring as an executor of the evaluation core (`bart_opt.evaluate.core`),
for the service's jobs of another system's predictions: each record's text is its prediction.

`run_scoring` writes the same run folder as ``bart-opt evaluate`` (`bart_opt.evaluate.runs`):
``run.json`` (a run record with ``"system": "external"``, the file's name, size and sha256 and the
dataset's fingerprint), ``predictions.jsonl`` (a baseline's row shape: ``id``, ``prediction``,
``reference``, ``rouge``, ``error``, ``seconds``) and ``metrics.json`` (``rouge.<type>.{low,mid,high}``
as ``evaluate``'s, with the signature). So ``bart-opt compare`` reads it beside a model's run and a
lead-3 run on the same examples. The metrics beyond ROUGE (`bart_opt.scoring.registry`) score each
prediction too, each row's ``scores``; a predictions file holds no source text, so a metric that
needs one (``extractive``) scores only what it can without (its repeated trigrams), and the metrics
warn of what they left out. Scoring takes milliseconds an example: the folder is rewritten
whole each time; a folder that holds another system's run (another name, other ROUGE settings or
other examples) is refused unless `overwrite`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bart_opt.pipeline.data import MissingColumnError, Record, check_id
from bart_opt.evaluate.metrics import RowTotals
from bart_opt.evaluate.record import run_record
from bart_opt.evaluate.rows import REFUSED, SCORED, RowBatch, add_scores, baseline_row, refused_row
from bart_opt.evaluate.runs import METRICS_FILE, PREDICTIONS_FILE, json_line, start_run
from bart_opt.evaluate.stored import check_out, write_run_file
from bart_opt.pipeline.readers import DEFAULT_MAX_LINE_BYTES, file_format, file_rows
from bart_opt.pipeline.rouge import RougeSettings
from bart_opt.runlock import RunLock
from bart_opt.scoring.registry import MetricSettings, build_metrics

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Columns:
    """The column names of a predictions file (and of a references file: `id` and `reference`)."""

    id: str = "id"
    prediction: str = "prediction"
    reference: str = "reference"


def file_fingerprint(path: Path) -> dict:
    """``{"name", "bytes", "fingerprint": "sha256:<hex>"}`` of a file, streamed a MiB at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return {"name": path.name, "bytes": path.stat().st_size, "fingerprint": f"sha256:{digest.hexdigest()}"}


def _rows(path: Path, needed: Mapping[str, str], max_line_bytes: int) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The rows of `path` with their positions; MissingColumnError for a column of `needed`
    (column -> its role: ``id``, ``prediction``, ``reference``) that it lacks."""
    file_format(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    declared, rows = file_rows(path, str(path), list(needed), max_line_bytes)
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"{path} row {index} is {type(row).__name__}, expected an object with named fields")
        found = declared if declared is not None else list(row)
        for column, role in needed.items():
            if column not in found:
                raise MissingColumnError(column, role, found, f"{path} row {index}")
        yield index, row


def _reference(value: Any, record_id: str, column: str) -> str | tuple[str, ...]:
    """One reference (a non-empty string) or several (a non-empty list of them)."""
    if isinstance(value, str):
        values = [value]
    elif isinstance(value, (list, tuple)) and value:
        values = list(value)
    else:
        raise ValueError(f"record {record_id!r}: column {column!r} holds {type(value).__name__}; expected a string "
                         "or a list of strings (several references)")
    for k, text in enumerate(values):
        if not isinstance(text, str) or not text.strip():
            where = repr(column) if isinstance(value, str) else f"{column!r}[{k}]"
            raise ValueError(f"record {record_id!r}: column {where} is empty or not a string")
    return value if isinstance(value, str) else tuple(values)


def read_predictions(path: str | Path, columns: Columns = Columns(), references: str | Path | None = None,
                     max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> list[tuple[Record, str]]:
    """``(Record(id, "", reference), prediction)`` per row of `path`, in its order (see the module docstring).

    Raises MissingColumnError for a missing column, ValueError (naming the row or id) for a duplicate
    or bad id, a prediction that is not a string, an empty reference, or ids the two files do not share.
    """
    path = Path(path)
    needed = {columns.id: "id", columns.prediction: "prediction"}
    if references is None:
        needed[columns.reference] = "reference"
    found: dict[str, tuple[str, Any]] = {}
    for index, row in _rows(path, needed, max_line_bytes):
        record_id = check_id(row[columns.id], index, columns.id)
        if record_id in found:
            raise ValueError(f"{path}: duplicate id {record_id!r} (row {index}); ids must be unique")
        prediction = row[columns.prediction]
        if not isinstance(prediction, str):
            raise ValueError(f"{path}: record {record_id!r}: column {columns.prediction!r} holds "
                             f"{type(prediction).__name__}, expected a string (an empty one scores 0)")
        reference = None if references is not None else _reference(row[columns.reference], record_id,
                                                                     columns.reference)
        found[record_id] = (prediction, reference)
    if not found:
        raise ValueError(f"{path} holds no predictions")
    if references is not None:
        joined = _join(found, Path(references), columns, max_line_bytes)
        found = {record_id: (found[record_id][0], joined[record_id]) for record_id in found}
    return [(Record(record_id, "", reference), prediction) for record_id, (prediction, reference) in found.items()]


def _join(found: Mapping[str, Any], path: Path, columns: Columns, max_line_bytes: int) -> dict[str, Any]:
    references: dict[str, Any] = {}
    for index, row in _rows(path, {columns.id: "id", columns.reference: "reference"}, max_line_bytes):
        record_id = check_id(row[columns.id], index, columns.id)
        if record_id in references:
            raise ValueError(f"{path}: duplicate id {record_id!r} (row {index}); ids must be unique")
        references[record_id] = _reference(row[columns.reference], record_id, columns.reference)
    unmatched = [i for i in found if i not in references]
    if unmatched:
        raise ValueError(f"{len(unmatched)} predictions have no reference in {path} (first: {unmatched[0]!r}); "
                         "the two files must hold the same ids")
    extra = [i for i in references if i not in found]
    if extra:
        raise ValueError(f"{len(extra)} references of {path} have no prediction (first: {extra[0]!r}); the two "
                         "files must hold the same ids")
    return references


def run_scoring(predictions: str | Path, out_dir: str | Path, *, rouge: RougeSettings | None = None,
                columns: Columns = Columns(), references: str | Path | None = None, name: str | None = None,
                overwrite: bool = False, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                metrics: MetricSettings | None = None) -> dict:
    """Score the predictions file into `out_dir` (see the module docstring) and return the metrics.

    `name` is how reports call the system (default: the file's name without its extension); `metrics`
    the metrics beyond ROUGE (default: `bart_opt.scoring.registry.DEFAULT`). Raises what
    `read_predictions` raises, `InvalidRequest` for metrics that cannot be built, and ValueError when
    `out_dir` holds another run (as `bart_opt.evaluate.runs.start_run` decides).
    """
    rouge = rouge or RougeSettings()
    settings = metrics or MetricSettings.for_rouge(rouge)
    built = [metric for metric in build_metrics(settings, rouge) if metric.name != "rouge"]
    path = Path(predictions)
    pairs = read_predictions(path, columns, references, max_line_bytes)
    scorer = rouge.scorer()
    extra = {"file": file_fingerprint(path)}
    if references is not None:
        extra["references_file"] = file_fingerprint(Path(references))
    run = run_record(system="external", model=name or path.stem, rouge=rouge, metrics=settings.record(built),
                     **extra)
    out = Path(out_dir)
    check_out(out)
    with RunLock(out):
        notes = start_run(out, run, [record for record, _ in pairs], str(path), overwrite=overwrite)
        rows = []
        for record, prediction in pairs:
            start = time.perf_counter()
            score = scorer.score_any(prediction, record.reference)
            rows.append(baseline_row(record, prediction, score, time.perf_counter() - start))
        add_scores(rows, built, {})  # a predictions file holds no source texts
        write_run_file(out / PREDICTIONS_FILE, "".join(json_line(row) for row in rows))
        found = RowTotals(scorer, run["metrics"]).added(rows).external_metrics(run)
        found["warnings"] = notes + found["warnings"]
        found["resumed_from"] = 0
        write_run_file(out / METRICS_FILE, json.dumps(found, indent=2) + "\n")
        return found


class ScoringExecutor:
    """An executor of the evaluation core that scores predictions instead of running a model: each
    pending record's text is a prediction, scored against its reference (one `SCORED` batch a window;
    records refused before, `REFUSED`). `name` names the system. The core scores the metrics beyond
    ROUGE without source texts (`texts_are_sources`: the record texts are the predictions)."""

    in_process = True
    fingerprint = None
    texts_are_sources = False

    def __init__(self, name: str = "external", rouge: RougeSettings | None = None):
        self.name = name
        self.rouge = rouge or RougeSettings()

    @property
    def model(self) -> ScoringExecutor:
        return self

    @property
    def scorer(self):
        return self.rouge.scorer()

    def identity(self) -> dict[str, Any]:
        return {"model": self.name}

    def engine_record(self) -> None:
        return None

    def processor(self) -> None:
        return None

    def run(self, source: Any, spec: Any, control: Any, rouge: RougeSettings | None = None) -> Iterator[RowBatch]:
        scorer = (rouge or self.rouge).scorer()
        for window in source.windows():
            if control.stopping:
                return
            refused = [p for p in window if p.refused is not None]
            if refused:
                yield RowBatch([refused_row(p.record, p.refused) for p in refused], [p.position for p in refused],
                               REFUSED)
            kept = [p for p in window if p.refused is None]
            if kept:
                yield RowBatch(list(_scored(kept, scorer)), [p.position for p in kept], SCORED)


def _scored(pending: Sequence[Any], scorer: Any) -> Iterator[dict]:
    for p in pending:
        start = time.perf_counter()
        rouge = scorer.score_any(p.record.text, p.record.reference) if p.record.reference is not None else None
        yield baseline_row(p.record, p.record.text, rouge, time.perf_counter() - start)


__all__ = ["Columns", "ScoringExecutor", "file_fingerprint", "read_predictions", "run_scoring"]
