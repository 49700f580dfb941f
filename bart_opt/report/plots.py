"""The report's plots, each written as PNG and SVG with matplotlib (the ``report`` extra).

matplotlib is imported inside `write_plots` only, so the command line and the library never load it
otherwise. Figures are `matplotlib.figure.Figure` objects drawn on the Agg canvas, never pyplot's
global state; the SVG's ids are salted with a constant and neither file records a date, so the same
runs give the same bytes.

- ``scores-<metric>``: per-example score distributions, a panel per score, a box per run with its
  examples as points;
- ``length-<metric>``: summary length (words) against each score, a colour per run;
- ``forest``: the paired differences (run - baseline) with their bootstrap intervals, a panel per
  metric, from a `bart_opt.compare.compare_runs` result;
- ``batches``: per row in written order, its batch's memory peak and its seconds (the rows do not
  record batch boundaries: `bart_opt.report.runs`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bart_opt.report.runs import ReportRun, row_costs, score_names, score_points
from bart_opt.report.tables import comparison_rows

FORMATS = ("png", "svg")
DPI = 110
PANEL_IN = (3.6, 3.0)  # inches per panel (width, height)
MAX_COLUMNS = 4
_RC = {"svg.hashsalt": "bart-opt", "font.size": 8, "axes.titlesize": 9}
_METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None}}


def write_plots(runs: Sequence[ReportRun], out: str | Path, comparison: Mapping[str, Any] | None = None) -> list[Path]:
    """Every plot of `runs` (and, given a `compare_runs` result, the forest plot) into `out` as PNG and SVG;
    the paths written, PNG before SVG. A plot with nothing to draw (no run holds that metric) is not written."""
    import matplotlib

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig, stem: str) -> None:
        for fmt in FORMATS:
            path = out / f"{stem}.{fmt}"
            fig.savefig(path, format=fmt, dpi=DPI, metadata=_METADATA[fmt])
            written.append(path)

    with matplotlib.rc_context(_RC):
        for metric, scores in score_names(runs).items():
            save(distributions(runs, metric, scores), f"scores-{slug(metric)}")
            save(length_against_score(runs, metric, scores), f"length-{slug(metric)}")
        if comparison is not None:
            save(forest(comparison), "forest")
        save(costs(runs), "batches")
    return written


def slug(name: str) -> str:
    """A metric's name as a file name part."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "metric"


def _figure(**kwargs):
    """A `matplotlib.figure.Figure` (imported here: only the report draws)."""
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kwargs)


def _panels(count: int, title: str):
    """A figure of `count` panels in rows of at most `MAX_COLUMNS`; the figure and its axes (flat)."""
    columns = min(count, MAX_COLUMNS)
    rows = -(-count // columns)
    fig = _figure(figsize=(PANEL_IN[0] * columns, PANEL_IN[1] * rows + 0.5))
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).ravel()
    for extra in axes[count:]:
        extra.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:count]


def distributions(runs: Sequence[ReportRun], metric: str, scores: Sequence[str]):
    """A panel per score of `metric`: a box per run over its examples, the examples drawn as points."""
    fig, axes = _panels(len(scores), f"{metric}: per-example scores")
    rng = np.random.default_rng(0)  # the points' horizontal jitter: the same every time
    for ax, score in zip(axes, scores):
        values = [score_points(run, metric, score)[1] for run in runs]
        drawn = [(k, v) for k, v in enumerate(values) if v]
        ax.boxplot([v for _, v in drawn], positions=[k for k, _ in drawn], widths=0.5, showfliers=False,
                   medianprops={"color": "black"})
        for k, v in drawn:
            ax.scatter(k + rng.uniform(-0.15, 0.15, len(v)), v, s=9, alpha=0.6, color=f"C{k}", zorder=3)
        ax.set_xticks(range(len(runs)), [run.name for run in runs], rotation=20, ha="right")
        ax.set_xlim(-0.6, len(runs) - 0.4)
        ax.set_title(score)
        ax.grid(axis="y", alpha=0.3)
    return fig


def length_against_score(runs: Sequence[ReportRun], metric: str, scores: Sequence[str]):
    """A panel per score of `metric`: each example's summary length (words) against its score, a colour per run."""
    fig, axes = _panels(len(scores), f"{metric}: summary length against score")
    for ax, score in zip(axes, scores):
        for k, run in enumerate(runs):
            lengths, values = score_points(run, metric, score)
            if values:
                ax.scatter(lengths, values, s=10, alpha=0.7, color=f"C{k}", label=run.name)
        ax.set_xlabel("summary length (words)")
        ax.set_title(score)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return fig


def forest(comparison: Mapping[str, Any]):
    """The paired differences of a `compare_runs` result: a panel per metric (ROUGE's types together), a
    row per compared run and score, the difference as a point and its interval as a bar; 0 marked."""
    groups: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for pair in comparison["comparisons"]:
        for score, row in comparison_rows(pair).items():
            metric, _, name = score.rpartition(".")
            label = f"{pair['run']} - {pair['baseline']}: {name}"
            groups.setdefault(metric or "rouge", []).append((label, row))
    confidence = round(100 * comparison.get("confidence", 0.95))
    tallest = max(len(rows) for rows in groups.values())
    fig = _figure(figsize=(6.5, 0.5 + (0.32 * tallest + 0.7) * len(groups)))
    axes = np.atleast_1d(fig.subplots(len(groups), 1, squeeze=False)).ravel()
    for ax, (metric, rows) in zip(axes, groups.items()):
        ys = np.arange(len(rows))[::-1]  # the first row on top
        deltas = np.array([row["delta"] for _, row in rows])
        lows = np.array([row["interval"][0] for _, row in rows])
        highs = np.array([row["interval"][1] for _, row in rows])
        ax.errorbar(deltas, ys, xerr=[deltas - lows, highs - deltas], fmt="o", color="C0", capsize=3)
        ax.axvline(0.0, color="grey", linestyle="--", linewidth=1)
        ax.set_yticks(ys, [label for label, _ in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel(f"{metric}: difference (run - baseline), {confidence}% paired bootstrap interval")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"paired differences over {comparison['paired']} examples")
    return fig


def costs(runs: Sequence[ReportRun]):
    """Two panels: each row's batch memory peak (MiB) and its seconds, per row in written order, a line per run."""
    fig = _figure(figsize=(7.5, 5.0))
    memory, seconds = fig.subplots(2, 1, sharex=True)
    for k, run in enumerate(runs):
        peaks, times = row_costs(run)
        if peaks:
            memory.plot(range(len(peaks)), peaks, drawstyle="steps-post", color=f"C{k}", label=run.name)
        seconds.plot(range(len(times)), times, marker=".", markersize=3, linewidth=0.8, color=f"C{k}", label=run.name)
    if memory.lines:
        memory.legend(fontsize=7)
    else:
        memory.text(0.5, 0.5, "no run records a memory peak (baselines and scored files have none)",
                    ha="center", va="center", transform=memory.transAxes)
    memory.set_ylabel("batch peak (MiB)")
    memory.set_title("memory peak of each row's batch")
    seconds.set_ylabel("seconds")
    seconds.set_title("each row's share of its batch's time")
    seconds.set_xlabel("row, in the order written (a batch's rows are written together)")
    seconds.legend(fontsize=7)
    for ax in (memory, seconds):
        ax.grid(alpha=0.3)
    return fig


__all__ = ["FORMATS", "costs", "distributions", "forest", "length_against_score", "slug", "write_plots"]
