"""The run folders a report reads, and the per-example values its plots draw.

A report run is a finished ``bart-opt evaluate`` or ``bart-opt score`` folder: ``predictions.jsonl``
(read and checked as `bart_opt.compare.load_run` reads it), ``metrics.json`` (required: the tables come
from it) and ``run.json`` when there. Per-example scores come from the rows: ROUGE's F-measures
(``row["rouge"][type]["fmeasure"]``) and every other metric's under ``row["scores"]``, nested
(``{"bertscore": {"f1": 0.91}}``) or flat (``{"bertscore.f1": 0.91}``); a row without a metric's
score (failed, no reference, or a run made before that metric) is left out of that metric's plots.

The rows do not record which batch each came from: a batch's rows are written together and carry its
memory peak (``batch_peak_bytes``) and each its share of the batch's time (``seconds``), so the memory
and time plot draws them per row, in the order they were written.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bart_opt.compare import Run, load_run
from bart_opt.evaluate.stored import METRICS_FILE, RUN_FILE, MetricsFile, RunFile, read_json_file

ROUGE = "rouge"
ROUGE_MEASURE = "fmeasure"


@dataclass
class ReportRun:
    """One run folder as a report reads it: its name (the folder's), rows, run record, metrics, and the
    ``info`` that ``bart-opt compare`` reads from them (`bart_opt.compare.load_run`)."""

    name: str
    path: Path
    rows: list[dict]
    record: dict
    metrics: dict
    info: dict

    @property
    def system(self) -> str:
        """``bart`` (a model), ``baseline`` or ``external`` (``bart-opt score``), as run.json says."""
        return str(self.record.get("system") or ("baseline" if self.metrics.get("baseline") else "bart"))

    def compared(self) -> Run:
        """The run as `bart_opt.compare.compare_runs` takes it (as ``bart-opt compare`` reads it, with the
        other metrics' signatures)."""
        signatures = self.metrics.get("signatures")
        return Run(name=self.name, rows=self.rows, info={**self.info, **({"signatures": signatures} if signatures else {})})


def load_report_run(folder: str | Path) -> ReportRun:
    """The run in `folder`; FileNotFoundError or ValueError naming the folder and what is missing or wrong."""
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder; give the --out folder of a bart-opt evaluate or score run")
    run = load_run(path)
    if not (path / METRICS_FILE).is_file():
        raise ValueError(f"{path} has no {METRICS_FILE}: the run has not finished (rerun its bart-opt evaluate "
                         "command to finish it)")
    metrics = read_json_file(path / METRICS_FILE, MetricsFile)
    record = read_json_file(path / RUN_FILE, RunFile) if (path / RUN_FILE).is_file() else {}
    return ReportRun(name=run.name, path=path, rows=run.rows, record=record, metrics=metrics, info=run.info)


def load_report_runs(folders: Sequence[str | Path]) -> list[ReportRun]:
    """Each folder's run (`load_report_run`), refusing two with the same name: the plots and tables name
    runs by folder name."""
    runs = [load_report_run(folder) for folder in folders]
    seen: dict[str, Path] = {}
    for run in runs:
        if run.name in seen:
            raise ValueError(f"{seen[run.name]} and {run.path} have the same folder name {run.name!r}; the report "
                             "names runs by their folders: give them distinct names")
        seen[run.name] = run.path
    return runs


def example_scores(row: Mapping[str, Any]) -> Iterator[tuple[str, str, float]]:
    """``(metric, score, value)`` of every per-example score of `row`, ROUGE's F-measures first."""
    for rouge_type, measures in (row.get("rouge") or {}).items():
        yield ROUGE, rouge_type, float(measures[ROUGE_MEASURE])
    for key, value in (row.get("scores") or {}).items():
        if isinstance(value, Mapping):
            yield from ((key, score, float(v)) for score, v in value.items() if _number(v))
        elif _number(value):
            metric, _, score = key.rpartition(".")
            yield metric or "scores", score, float(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def score_names(runs: Sequence[ReportRun]) -> dict[str, list[str]]:
    """The per-example scores the runs' rows hold, by metric, in the order first seen."""
    found: dict[str, dict[str, None]] = {}
    for run in runs:
        for row in run.rows:
            for metric, score, _ in example_scores(row):
                found.setdefault(metric, {})[score] = None
    return {metric: list(scores) for metric, scores in found.items()}


def score_points(run: ReportRun, metric: str, score: str) -> tuple[list[int], list[float]]:
    """``(summary lengths in words, values)`` of the rows of `run` that hold `metric`'s `score`."""
    lengths, values = [], []
    for row in run.rows:
        for name, key, value in example_scores(row):
            if (name, key) == (metric, score):
                lengths.append(len(str(row.get("prediction") or "").split()))
                values.append(value)
    return lengths, values


def row_costs(run: ReportRun) -> tuple[list[float], list[float]]:
    """Per row in written order: its batch's memory peak in MiB (rows without one left out: a baseline's)
    and its seconds."""
    peaks = [row["batch_peak_bytes"] / 2**20 for row in run.rows if row.get("batch_peak_bytes")]
    seconds = [float(row.get("seconds") or 0.0) for row in run.rows]
    return peaks, seconds


def describe_dataset(run: ReportRun) -> dict[str, str | None]:
    """Where the run's records came from, as a model card names a dataset: ``type`` (a hub id, or a local
    file's name without extension), ``name``, ``config`` and ``split`` (None where unknown)."""
    source = str((run.record.get("dataset") or {}).get("source") or "").strip()
    if not source:
        return {"type": "unknown", "name": "unknown", "config": None, "split": None}
    if Path(source).suffix.lower() in (".jsonl", ".json", ".csv", ".parquet"):
        return {"type": Path(source).stem, "name": Path(source).name, "config": None, "split": None}
    parts = source.split()  # ``bart-opt evaluate --dataset NAME [--dataset-config CONFIG] --split SPLIT``
    config = parts[1] if len(parts) == 3 else None
    split = parts[-1] if len(parts) >= 2 else None
    return {"type": parts[0], "name": parts[0], "config": config, "split": split}


__all__ = ["ReportRun", "describe_dataset", "example_scores", "load_report_run", "load_report_runs", "row_costs",
           "score_names", "score_points"]
