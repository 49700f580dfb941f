"""What the ``bart-opt`` commands share besides parsing: their one-line error (`CliError`), how they print a
run's metrics (`print_metrics`: JSON and the ROUGE lines, or one table in a ``--format``), and their MLflow run
(``--mlflow``: `start_tracking`, `finish_tracking`). Light to import: tabulate and MLflow load on use."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path


class CliError(Exception):
    """A problem with the user's input, printed as one line."""


FORMATS = ("text", "json", "markdown", "csv", "latex")  # bart_opt.report.tables.FORMATS, without importing tabulate


def format_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--format`` (`FORMATS`) to a command that prints a run's metrics."""
    parser.add_argument("--format", choices=FORMATS,
                        help="print the scores on stdout as one table (a row per system, a column per metric score: "
                             "the mean [95%% interval]) in text, markdown, csv or latex, or the metrics as JSON "
                             "(default: the metrics as JSON on stdout and the ROUGE lines on stderr)")


def print_metrics(metrics: dict, fmt: str | None, ensure_ascii: bool = True) -> None:
    """A run's metrics as `fmt` asks (`bart_opt.report.tables`); no `fmt`: the JSON on stdout and the ROUGE
    lines on stderr."""
    if fmt is None or fmt == "json":
        print(json.dumps(metrics, indent=2, ensure_ascii=ensure_ascii))
        if fmt is None:
            print(rouge_lines(metrics), file=sys.stderr)
        return
    from bart_opt.report.tables import render, score_table, systems

    table = score_table(systems(metrics))
    print(render(table, fmt))
    if fmt == "csv":  # a CSV holds the signatures in a column, and nothing else
        for note in table.notes:
            print(note, file=sys.stderr)


def tracking_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--mlflow URI`` to a command that writes a run folder."""
    group = parser.add_argument_group("experiment tracking (pip install 'bart-opt[tracking]')")
    group.add_argument("--mlflow", metavar="URI",
                       help="log the run to MLflow at URI (http://HOST:PORT, sqlite:///PATH, ...; default: "
                            "MLFLOW_TRACKING_URI when set, else no tracking); experiment: MLFLOW_EXPERIMENT_NAME, "
                            "else bart-opt")


def start_tracking(args: argparse.Namespace):
    """The command's `bart_opt.tracking.MlflowRun` for its ``--out``, started (None without ``--mlflow`` or
    ``MLFLOW_TRACKING_URI``); a tracker that cannot be used is a `CliError` before any work."""
    from bart_opt.tracking import MlflowRun, TrackingError, tracking_uri

    uri = tracking_uri(args.mlflow)
    if uri is None:
        return None
    try:
        run = MlflowRun.for_folder(uri, args.out, args.command, on_warning=lambda message: print(
            f"bart-opt {args.command}: warning: {message}", file=sys.stderr))
    except TrackingError as error:
        raise CliError(str(error)) from None
    print(f"bart-opt {args.command}: logging to MLflow at {run.shown_uri} (experiment {run.experiment_id}, "
          f"run {run.run_id})", file=sys.stderr)
    return run


def finish_tracking(run, args: argparse.Namespace) -> None:
    """Log the finished run folder (``--out``) to the command's MLflow run, if any, with the run's plots
    (`bart_opt.report.plots`, where matplotlib is installed: the report extra); a failure is a warning."""
    if run is None:
        return
    with tempfile.TemporaryDirectory(prefix="bart-opt-plots-") as plots:
        failed = run.finish(args.out, run_plots(args.out, plots))
    if failed is None:
        print(f"bart-opt {args.command}: logged run {run.run_id} to MLflow", file=sys.stderr)
    else:
        print(f"bart-opt {args.command}: warning: MLflow at {run.shown_uri}: run {run.run_id} could not be logged "
              f"({failed}); {args.out} is complete: rerun the same command to log it again", file=sys.stderr)


def run_plots(folder: str | Path, out: str | Path) -> list[Path]:
    """The plots of one run folder (`bart_opt.report.plots.write_plots`) written into `out`; none without
    matplotlib (the report extra), which tracking does not require."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    from bart_opt.report.plots import write_plots
    from bart_opt.report.runs import load_report_runs

    return write_plots(load_report_runs([folder]), out)


ROUGE_LABELS = {"rouge1": "R1", "rouge2": "R2", "rougeL": "RL", "rougeLsum": "RLsum"}


def rouge_lines(metrics: dict) -> str:
    """The F-measures of a run and of its baselines, one line each (``R1 45.10 [43.02-47.31] ...``: the
    mean over examples and the 95% bootstrap interval), each run's signature and the warnings."""
    runs = [(metrics["model"], metrics)]
    runs += list(metrics.get("baselines", {}).items())
    width = max(len(name) for name, _ in runs)
    lines = [f"ROUGE F1, mean over examples [95% bootstrap interval], {metrics['n_scored']} of {metrics['n_obs']} "
             "records scored:"]
    for name, run in runs:
        rouge = run["rouge"]
        if rouge is None:
            lines.append(f"  {name:<{width}}  no references to score")
        else:
            cells = [_rouge_cell(label, rouge[key]) for key, label in ROUGE_LABELS.items() if key in rouge]
            lines.append(f"  {name:<{width}}  " + "  ".join(cells))
    lines += [f"  signature {name}: {run['signature']}" for name, run in runs if run.get("signature")]
    warnings = dict.fromkeys(w for _, run in runs for w in run.get("warnings", ()))
    lines += [f"warning: {warning}" for warning in warnings]
    return "\n".join(lines)


def _rouge_cell(label: str, interval: dict) -> str:
    low, mid, high = (interval[bound]["fmeasure"] for bound in ("low", "mid", "high"))
    return f"{label} {mid:5.2f} [{low:.2f}-{high:.2f}]"
