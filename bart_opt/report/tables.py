"""The tables of ``--format text|markdown|csv|latex``: a run's scores and a comparison's differences.

One `Table` is built from the dicts the commands already print as JSON, then rendered in any
format (`render`); nothing here reads files.

- `score_table`: rows are systems (a run's model and each baseline scored beside it, as
  ``metrics.json`` holds them), columns are metric scores, each cell the mean with its 95%
  bootstrap interval. The scores are whatever the metrics hold (`metric_intervals`): ROUGE's
  F-measures (``metrics["rouge"][type][bound]["fmeasure"]``, ``rouge1`` ... ``rougeLsum``) and
  every other metric stored as ``metrics[name][score] = {"low", "mid", "high"}`` (``bertscore.f1``).
- `comparison_table`: one row per compared run and metric score of a `bart_opt.compare.compare_runs`
  result: both means, the difference, its interval and both p-values.

Under each table go the signature lines (``signature <system>: ...``: the run's ROUGE and system
signature, then each other metric's, from ``metrics["signatures"]``) and the warnings. Text and
Markdown print them as lines, LaTeX as ``%`` comments after the tabular; CSV has a ``signature``
column instead (its warnings are the caller's to print elsewhere). Display formats round (2 decimals
for scores of 10 and more, 3 from 1, else 4: one rule for 0-100 and 0-1 scales alike); CSV holds
the full floats, ``mid``, ``low`` and ``high`` in three columns. The same dict always renders to the
same bytes.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

FORMATS = ("text", "json", "markdown", "csv", "latex")  # json is the commands' own dict, printed as it is
ROUGE_MEASURE = "fmeasure"
BOUNDS = ("low", "mid", "high")
_TABLEFMT = {"text": "simple", "markdown": "github", "latex": "latex_booktabs"}


@dataclass(frozen=True)
class Interval:
    """A corpus score: its mean and 95% bootstrap interval."""

    mid: float
    low: float
    high: float


@dataclass(frozen=True)
class Delta:
    """A paired difference (run - baseline) with its bootstrap interval."""

    delta: float
    low: float
    high: float


Cell = str | int | float | Interval | Delta | None


@dataclass
class Table:
    """Rows of cells under named columns, and the lines that go under it.

    signatures: ``(system, signature)`` pairs, shown under the table (CSV: the ``signature`` column
        of the row whose first cell is that system).
    notes: warnings and notes, shown under the signatures (not in CSV).
    by_row: round each row to its own magnitude (a row per metric score) rather than each column.
    """

    columns: list[str]
    rows: list[list[Cell]]
    signatures: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    by_row: bool = False


# ---- reading the metrics ------------------------------------------------------------------------


def is_interval(value: Any) -> bool:
    """Whether `value` is a ``{"low", "mid", "high"}`` dict of numbers."""
    return (isinstance(value, Mapping) and all(bound in value for bound in BOUNDS)
            and all(isinstance(value[b], (int, float)) and not isinstance(value[b], bool) for b in BOUNDS))


def metric_intervals(metrics: Mapping[str, Any]) -> dict[str, Interval]:
    """Every corpus score of one system's metrics, by column name, in stored order: ROUGE's F-measures
    by type (``rouge1``), then each other metric's scores as ``name.score`` (``extractive.density``).
    A metric dict that is not all ``{low, mid, high}`` intervals (``padding``, ``tokens``) is no metric."""
    found: dict[str, Interval] = {}
    for rouge_type, bounds in (metrics.get("rouge") or {}).items():
        found[rouge_type] = Interval(*(float(bounds[b][ROUGE_MEASURE]) for b in ("mid", "low", "high")))
    for name, scores in metrics.items():
        if name == "rouge" or not isinstance(scores, Mapping) or not scores:
            continue
        if all(is_interval(value) for value in scores.values()):
            for score, value in scores.items():
                found[f"{name}.{score}"] = Interval(float(value["mid"]), float(value["low"]), float(value["high"]))
    return found


def systems(metrics: Mapping[str, Any], name: str | None = None) -> list[tuple[str, Mapping[str, Any]]]:
    """``(name, metrics)`` of a run's model (named `name`, default: its ``model``) and of each baseline
    scored beside it (``metrics["baselines"]``)."""
    found = [(name or str(metrics["model"]), metrics)]
    return found + [(str(baseline), values) for baseline, values in (metrics.get("baselines") or {}).items()]


def signature_lines(name: str, metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(label, signature)`` of one system: the run's own signature (ROUGE settings and system), then
    each other metric's from ``metrics["signatures"]`` (a string, or a dict shown as ``key:value|...``)."""
    found = [(name, str(metrics["signature"]))] if metrics.get("signature") else []
    for metric, signature in (metrics.get("signatures") or {}).items():
        if isinstance(signature, Mapping):
            signature = "|".join(f"{key}:{value}" for key, value in signature.items())
        found.append((f"{name} {metric}", str(signature)))
    return found


# ---- the two tables ---------------------------------------------------------------------------


def score_table(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> Table:
    """Systems (``(name, metrics)``, as `systems` gives them) against their metric scores, with how many
    examples each scored, its signature lines and its warnings (each once)."""
    scores = [metric_intervals(metrics) for _, metrics in rows]
    columns = list(dict.fromkeys(column for found in scores for column in found))
    table = Table(columns=["system", "scored", *columns], rows=[])
    for (name, metrics), found in zip(rows, scores):
        scored = f"{metrics['n_scored']}/{metrics['n_obs']}" if "n_scored" in metrics else None
        table.rows.append([name, scored, *(found.get(column) for column in columns)])
        table.signatures += signature_lines(name, metrics)
        table.notes += [f"warning: {warning}" for warning in metrics.get("warnings") or ()]
    table.notes = list(dict.fromkeys(table.notes))
    return table


def comparison_rows(comparison: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The tested scores of one comparison, by column name: ROUGE's types (``comparison["rouge"]``), then
    every other metric whose scores carry a ``delta`` and an ``interval`` (as ``name.score``)."""
    found = dict(comparison.get("rouge") or {})
    for name, scores in comparison.items():
        if name == "rouge" or not isinstance(scores, Mapping) or not scores:
            continue
        if all(isinstance(row, Mapping) and "delta" in row and "interval" in row for row in scores.values()):
            found.update({f"{name}.{score}": row for score, row in scores.items()})
    return found


def comparison_table(result: Mapping[str, Any]) -> Table:
    """One row per compared run and metric score of a `bart_opt.compare.compare_runs` result: the
    baseline's and the run's means, the difference with its interval, and both p-values; then every
    run's signature, the examples left out and the notes."""
    table = Table(columns=["run", "baseline", "score", "baseline mean", "run mean", "delta", "p bootstrap",
                           "p randomization"], rows=[], by_row=True)
    for comparison in result["comparisons"]:
        for score, row in comparison_rows(comparison).items():
            low, high = row["interval"]
            table.rows.append([comparison["run"], comparison["baseline"], score, row.get("baseline"), row.get("run"),
                               Delta(float(row["delta"]), float(low), float(high)), row.get("p_bootstrap"),
                               row.get("p_randomization")])
    for run in result["runs"]:
        table.signatures += signature_lines(run["name"], {"signature": run.get("signature"),
                                                          "signatures": (run.get("info") or {}).get("signatures")})
    confidence = round(100 * result.get("confidence", 0.95))
    table.notes.append(f"delta: run - baseline [{confidence}% paired bootstrap interval]; {result['paired']} of "
                       f"{result['examples']} examples scored in every run; {result['resamples']} resamples, "
                       f"seed {result['seed']}")
    table.notes += [f"note: {note}" for note in result.get("notes") or ()]
    table.notes += [f"warning: {run['name']}: {warning}" for run in result["runs"] for warning in run.get("warnings") or ()]
    return table


# ---- rendering --------------------------------------------------------------------------------


def render(table: Table, fmt: str) -> str:
    """`table` as ``text``, ``markdown``, ``csv`` or ``latex`` (no trailing newline)."""
    if fmt == "csv":
        return _csv(table)
    if fmt not in _TABLEFMT:
        raise ValueError(f"no table format {fmt!r}; choose one of {', '.join(f for f in FORMATS if f != 'json')}")
    cells = [[_display(cell, 4 if column.startswith("p ") else decimals)
              for column, cell, decimals in zip(table.columns, row, places)]
             for row, places in zip(table.rows, _decimals(table))]
    body = tabulate(cells, headers=table.columns, tablefmt=_TABLEFMT[fmt], disable_numparse=True)
    quote = "`" if fmt == "markdown" else ""
    lines = [f"signature {name}: {quote}{signature}{quote}" for name, signature in table.signatures] + table.notes
    if fmt == "latex":
        return "\n".join([body, *(f"% {' '.join(line.splitlines())}" for line in lines)])
    if fmt == "markdown":
        return "\n".join([body, "", *(f"- {line}" for line in lines)]) if lines else body
    return "\n".join([body, "", *lines]) if lines else body


def _decimals(table: Table) -> list[list[int]]:
    """Decimals of each cell: 2 where the largest magnitude among its column's (or, `Table.by_row`, its
    row's) scores is 10 or more, 3 from 1, else 4; p-values are left out of the magnitudes."""
    def places(cells: list[Cell]) -> int:
        largest = max((abs(v) for cell in cells for v in _numbers(cell)), default=0.0)
        return 2 if largest >= 10 else 3 if largest >= 1 else 4

    scored = [j for j, column in enumerate(table.columns) if not column.startswith("p ")]
    if table.by_row:
        return [[places([row[j] for j in scored])] * len(row) for row in table.rows]
    by_column = [places([row[j] for row in table.rows]) for j in range(len(table.columns))]
    return [by_column for _ in table.rows]


def _numbers(cell: Cell) -> list[float]:
    if isinstance(cell, Interval):
        return [cell.mid, cell.low, cell.high]
    if isinstance(cell, Delta):
        return [cell.delta, cell.low, cell.high]
    if isinstance(cell, (int, float)) and not isinstance(cell, bool) and math.isfinite(cell):
        return [float(cell)]
    return []


def _display(cell: Cell, decimals: int) -> str:
    if cell is None:
        return "-"
    if isinstance(cell, Interval):
        return f"{cell.mid:.{decimals}f} [{cell.low:.{decimals}f}, {cell.high:.{decimals}f}]"
    if isinstance(cell, Delta):
        return f"{cell.delta:+.{decimals}f} [{cell.low:+.{decimals}f}, {cell.high:+.{decimals}f}]"
    if isinstance(cell, float):
        return f"{cell:.{decimals}f}"
    return str(cell)


def _csv(table: Table) -> str:
    """One header row and one row per table row; an interval or a difference takes three columns
    (``name``, ``name_low``, ``name_high``), full floats; the row's signature last."""
    widths = [3 if any(isinstance(row[j], (Interval, Delta)) for row in table.rows) else 1
              for j in range(len(table.columns))]
    header = []
    for column, width in zip(table.columns, widths):
        header += [column, f"{column}_low", f"{column}_high"] if width == 3 else [column]
    signature_of = dict(table.signatures)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*header, "signature"])
    for row in table.rows:
        cells: list[Any] = []
        for cell, width in zip(row, widths):
            if width == 1:
                cells.append("" if cell is None else repr(cell) if isinstance(cell, float) else cell)
            elif cell is None:
                cells += ["", "", ""]
            else:
                first = cell.mid if isinstance(cell, Interval) else cell.delta
                cells += [repr(first), repr(cell.low), repr(cell.high)]
        writer.writerow([*cells, signature_of.get(str(row[0]), "")])
    return out.getvalue().rstrip("\n")


__all__ = ["FORMATS", "Delta", "Interval", "Table", "comparison_rows", "comparison_table", "is_interval",
           "metric_intervals", "render", "score_table", "signature_lines", "systems"]
