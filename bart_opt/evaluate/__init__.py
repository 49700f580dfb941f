"""Evaluation: records in, prediction rows and metrics out, resumable.

- `bart_opt.evaluate.core`: the one loop every way of evaluating composes
  (`evaluate_records(source, sink, executor, spec)`), with its rules (dedupe by id, refused and
  failed rows, failure splitting, overlap) and `SummarizerExecutor`;
- `bart_opt.evaluate.rows`: the shape of a prediction row and `RowBatch`;
- `bart_opt.evaluate.metrics`: one aggregation of rows, a model's and a baseline's;
- `bart_opt.evaluate.runs`: run folders (``bart-opt evaluate``): `run_evaluation`,
  `run_baseline_evaluation`;
- `bart_opt.evaluate.record`: the run record every run folder and job holds, and the rule for resuming;
- `bart_opt.evaluate.external`: another system's predictions scored into a run folder (``bart-opt score``);
- `bart_opt.evaluate.stored`: the schemas of a run folder's files, and reading them without following links.
"""

from bart_opt.evaluate.core import (
    MAX_FAILURE_STREAK, FailureStreak, ListSource, Pending, RunControl, SummarizerExecutor, evaluate_records,
    iter_predictions,
)
from bart_opt.evaluate.external import run_scoring
from bart_opt.evaluate.metrics import PackedScores, baseline_rows, compute_metrics, metrics_from_rows, score_baselines
from bart_opt.evaluate.rows import RowBatch, prediction_row, refused_row
from bart_opt.evaluate.runs import (
    METRICS_FILE, PREDICTIONS_FILE, RUN_FILE, JsonlPredictionStore, RunFolder, dataset_fingerprint, run_baseline_evaluation,
    run_evaluation, start_run,
)

__all__ = ["MAX_FAILURE_STREAK", "METRICS_FILE", "PREDICTIONS_FILE", "RUN_FILE", "FailureStreak", "JsonlPredictionStore",
           "ListSource", "PackedScores", "Pending", "RowBatch", "RunControl", "RunFolder", "SummarizerExecutor",
           "baseline_rows", "compute_metrics", "dataset_fingerprint", "evaluate_records", "iter_predictions",
           "metrics_from_rows", "prediction_row", "refused_row", "run_baseline_evaluation", "run_evaluation",
           "run_scoring", "score_baselines", "start_run"]
