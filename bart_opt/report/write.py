"""``bart-opt report RUN... --out DIR``: the plots, ``report.md`` and ``model-index.yaml`` of run folders.

`write_report` reads every run first (`bart_opt.report.runs`), compares them when there are two or
more (`bart_opt.compare.compare_runs`: the first run is the baseline, and runs on other datasets are
refused naming them) and builds the model card, so that a bad input fails before anything is
written; then it draws the plots (`bart_opt.report.plots`) and writes the Markdown summary, whose
images are links relative to it (the folder can be moved or committed whole).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bart_opt.compare import DEFAULT_RESAMPLES, compare_runs
from bart_opt.report.card import card_run, model_index_yaml
from bart_opt.report.plots import write_plots
from bart_opt.report.runs import ReportRun, load_report_runs
from bart_opt.report.tables import Table, comparison_table, metric_intervals, render, score_table, systems

REPORT_FILE = "report.md"
MODEL_INDEX_FILE = "model-index.yaml"


def write_report(folders: Sequence[str | Path], out: str | Path, *, model_name: str | None = None,
                 resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> list[Path]:
    """Write the report of the runs in `folders` into `out`; the paths written (report.md,
    model-index.yaml, then the plots). Raises FileNotFoundError or ValueError (`bart_opt.compare.RunMismatch`
    for runs on different datasets) naming the run at fault, before anything is written."""
    runs = load_report_runs(folders)
    comparison = (compare_runs([run.compared() for run in runs], resamples=resamples, seed=seed, top=0)
                  if len(runs) > 1 else None)
    described = card_run(runs)
    card = model_index_yaml(described, model_name)
    out = Path(out)
    plots = write_plots(runs, out, comparison)
    (out / REPORT_FILE).write_text(report_markdown(runs, comparison, plots, described, card), encoding="utf-8")
    (out / MODEL_INDEX_FILE).write_text(card, encoding="utf-8")
    return [out / REPORT_FILE, out / MODEL_INDEX_FILE, *plots]


def report_systems(runs: Sequence[ReportRun]) -> list[tuple[str, Mapping[str, Any]]]:
    """Each run's model under its folder's name, then each baseline scored beside a run unless the same
    system with the same scores is already there (a baseline's own run, or the same baseline beside an
    earlier run); a baseline with other scores under a name already taken is named after its run too
    (``lead-3 (run-b)``)."""
    found: list[tuple[str, Mapping[str, Any]]] = [(run.name, run.metrics) for run in runs]
    seen = {_identity(metrics) for _, metrics in found}
    for run in runs:
        for name, metrics in systems(run.metrics)[1:]:
            if _identity(metrics) in seen:
                continue
            seen.add(_identity(metrics))
            taken = any(name == other for other, _ in found)
            found.append((f"{name} ({run.name})" if taken else name, metrics))
    return found


def _identity(metrics: Mapping[str, Any]) -> tuple:
    return str(metrics.get("model")), tuple(metric_intervals(metrics).items())


def report_markdown(runs: Sequence[ReportRun], comparison: Mapping[str, Any] | None, plots: Sequence[Path],
                    described: ReportRun, card: str) -> str:
    """The text of report.md: the runs, the score table, the paired differences, the plots, the card."""
    images = {path.stem for path in plots if path.suffix == ".png"}
    lines = ["# Evaluation report", "", _runs_table(runs), "", "## Scores", "",
             "Mean over examples [95% bootstrap interval]; scored: examples with a reference and a summary.", "",
             render(score_table(report_systems(runs)), "markdown"), ""]
    if comparison is not None:
        lines += ["## Paired differences", "",
                  f"Every run against the first, **{runs[0].name}**, on the examples scored in every run: the "
                  "difference of the means, its paired bootstrap interval and the p-values of the paired bootstrap "
                  "and approximate randomization tests (`bart-opt compare`).", "",
                  render(comparison_table(comparison), "markdown"), "", _image("forest", "paired differences"), ""]
    for stem in sorted(images):
        if stem.startswith("scores-"):
            metric = stem.removeprefix("scores-")
            lines += [f"## Per-example scores: {metric}", "", _image(stem, f"{metric}: per-example scores"), ""]
            if f"length-{metric}" in images:
                lines += [_image(f"length-{metric}", f"{metric}: summary length against score"), ""]
    lines += ["## Memory and time", "",
              "The rows do not record which batch each came from: each row holds its batch's memory peak and its "
              "share of the batch's time, drawn here per row in the order the rows were written (a batch's rows "
              "are written together).", "", _image("batches", "memory and time per row"), "",
              "## Model card", "", f"`{MODEL_INDEX_FILE}`, the `model-index` of **{described.name}** "
              "(huggingface_hub's `ModelCardData`), for a model card's front matter:", "", "```yaml", card.rstrip("\n"),
              "```", "", "Each plot is also written as SVG beside its PNG.", ""]
    return "\n".join(lines)


def _runs_table(runs: Sequence[ReportRun]) -> str:
    rows = []
    for run in runs:
        dataset = run.record.get("dataset") or {}
        rows.append([run.name, str(run.path), run.system, str(run.metrics.get("model")), dataset.get("source") or "-",
                     str(dataset.get("records", run.metrics.get("n_obs")))])
    return render(Table(columns=["run", "folder", "system", "model", "dataset", "records"], rows=rows), "markdown")


def _image(stem: str, title: str) -> str:
    return f"![{title}]({stem}.png)"


__all__ = ["MODEL_INDEX_FILE", "REPORT_FILE", "report_markdown", "report_systems", "write_report"]
