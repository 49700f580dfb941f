"""Compare evaluation runs on the same dataset: ROUGE side by side, per-example deltas, significance.

Input is the per-example prediction rows that ``bart-opt evaluate`` writes (``predictions.jsonl``)
and evaluation jobs store: ``{"id", "prediction", "reference", "rouge", "error", ...}``. Nothing here
does I/O except `load_run`, which reads a run folder.

- Runs must cover the same examples: the same id set and, per id, the same reference. Anything
  else raises `RunMismatch` naming what differs.
- Runs must be scored the same way: their recorded ROUGE settings (`bart_opt.pipeline.rouge.RougeSettings`, in
  ``info["rouge_settings"]``) must agree on every field that changes a score (`bart_opt.pipeline.rouge.SCORE_FIELDS`:
  types, tokenizer, language, stemmer, sentence splitter), or `RunMismatch` names the field. Settings
  that change only the interval or nothing (bootstrap, backend and its version), and runs that
  record none, are compared and marked in ``notes``. Each run's ``signature`` is shown with it.
- The first run is the baseline; every other run is compared with it.
- The paired tests use the examples scored in *every* run (an example that failed or has no
  reference in one run is left out of all comparisons, and counted as unpaired). Examples are
  taken in id order, so the same rows give the same numbers whichever order they were stored in. A run's
  ROUGE is the mean of its examples' F-measures, summed exactly (`bart_opt.pipeline.rouge.mean`): over the same
  examples it is the very float its own metrics report as ``mid``.
- For each ROUGE type (F-measure, 0-100) and each run against the baseline, with the per-example
  differences ``d = run - baseline`` and ``delta = mean(d)``:

  * **paired bootstrap** (Koehn 2004): `resamples` resamples of the examples with replacement;
    the interval is the central 95% of the resampled ``mean(d)``; the two-sided p-value is the share
    of resamples whose mean is at least ``|delta|`` away from ``delta`` (the bootstrap distribution
    shifted to the null hypothesis, as in Berg-Kirkpatrick et al. 2012), counted as ``(k + 1) / (B + 1)``;
  * **approximate randomization** (Noreen 1989; Riezler and Maxwell 2005): each example's two
    outputs are swapped with probability 1/2 (the sign of its difference flipped), and the p-value is
    the share of shuffles with ``|mean| >= |delta|``, again ``(k + 1) / (R + 1)``. When
    ``2 ** n <= trials`` every one of the ``2 ** n`` swaps is enumerated instead: the exact
    permutation p-value ``k / 2 ** n``.

  Both draw from ``numpy.random.default_rng(seed)``, fresh for every test, so the same rows and seed
  always give the same numbers. Identical runs give p = 1; a run that beats the baseline on every
  example by a similar margin gives the smallest p the test can give, ``1 / (B + 1)``.
- The metrics beyond ROUGE (`bart_opt.scoring`, a row's ``scores``) get the same two tests, one row per
  score, under the metric's name as ROUGE's rows are under ``rouge`` (``comparison[name][score]``; their
  names in ``comparison["metrics"]``), over the same paired examples: every score that every
  paired row of both runs holds. A metric whose recorded signature differs between the two runs
  (another tokenizer, another model) is left out with a note; rows from before metrics beyond ROUGE hold
  none, so such runs compare on ROUGE alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bart_opt.errors import InvalidRequest
from bart_opt.evaluate.stored import (
    METRICS_FILE, PREDICTIONS_FILE, RUN_FILE, ComparedRow, MetricsFile, RunFile, read_json_file, read_rows,
)
from bart_opt.pipeline.rouge import CONFIDENCE, DEFAULT_ROUGE_TYPES, INTERVAL_FIELDS, mean, settings_differences
from bart_opt.scoring.registry import row_scores

MEASURE = "fmeasure"
DEFAULT_METRIC = "rougeLsum"
DEFAULT_RESAMPLES = 1000
MAX_RESAMPLES = 100_000
_TIE = 1e-9  # scores are 0-100: differences of means closer than this are equal, not float noise
_CELLS_PER_CHUNK = 2_000_000  # resample this many example draws at a time, whatever the dataset size


class RunMismatch(ValueError):
    """The runs are not on the same dataset (different ids or references), or cannot be paired."""


@dataclass
class Run:
    """One run to compare: a name (folder or job id), its prediction rows, and what to show with it."""

    name: str
    rows: list[dict]
    info: dict = field(default_factory=dict)


# ---- the two tests ------------------------------------------------------------------------------


def paired_bootstrap(
    diffs: Sequence[float], resamples: int = DEFAULT_RESAMPLES, seed: int = 0, confidence: float = CONFIDENCE
) -> dict:
    """Paired bootstrap on per-example differences: ``{"delta", "interval": [low, high], "p"}``.

    The interval holds the central `confidence` share of the resampled means; ``p`` is two-sided
    (see the module docstring).
    """
    d = _check_diffs(diffs)
    _check_count("resamples", resamples)
    delta = float(d.mean())
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)  # (B,)
    chunk = max(1, _CELLS_PER_CHUNK // len(d))
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        idx = rng.integers(0, len(d), size=(stop - start, len(d)))  # (b, N)
        means[start:stop] = d[idx].mean(axis=1)  # (b, N) -> (b,)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    extreme = int(np.count_nonzero(np.abs(means - delta) >= abs(delta) - _TIE))
    return {"delta": delta, "interval": [float(low), float(high)], "p": (extreme + 1) / (resamples + 1)}


def approximate_randomization(diffs: Sequence[float], trials: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict:
    """Approximate randomization on per-example differences: ``{"p", "method"}``.

    ``method`` is ``"exact"`` when all ``2 ** n`` swaps were enumerated (``2 ** n <= trials``),
    else ``"sampled"`` (`trials` random swaps).
    """
    d = _check_diffs(diffs)
    _check_count("trials", trials)
    observed = abs(float(d.mean()))
    if len(d) <= math.log2(trials):  # 2 ** N <= trials: enumerate every swap
        codes = np.arange(2 ** len(d))[:, None] >> np.arange(len(d))  # (2^N, N)
        signs = 1 - 2 * (codes & 1)  # (2^N, N) of +-1: every assignment once
        extreme = int(np.count_nonzero(np.abs((signs * d).mean(axis=1)) >= observed - _TIE))
        return {"p": extreme / 2 ** len(d), "method": "exact"}
    rng = np.random.default_rng(seed)
    extreme = 0
    chunk = max(1, _CELLS_PER_CHUNK // len(d))
    for start in range(0, trials, chunk):
        size = min(chunk, trials - start)
        signs = 1 - 2 * rng.integers(0, 2, size=(size, len(d)))  # (r, N) of +-1
        extreme += int(np.count_nonzero(np.abs((signs * d).mean(axis=1)) >= observed - _TIE))
    return {"p": (extreme + 1) / (trials + 1), "method": "sampled"}


def _check_diffs(diffs: Sequence[float]) -> np.ndarray:
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError("need at least one paired example")
    if not np.isfinite(d).all():
        raise ValueError("per-example differences must be finite numbers")
    return d


def _check_count(name: str, value: int, limit: int = MAX_RESAMPLES) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise InvalidRequest(name, f"must be an integer from 1 to {limit}, got {value!r}")


# ---- comparing runs ----------------------------------------------------------------------------


def compare_runs(
    runs: Sequence[Run],
    *,
    metric: str = DEFAULT_METRIC,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    top: int = 5,
    max_resamples: int = MAX_RESAMPLES,
) -> dict:
    """Compare every run with the first one (the baseline); see the module docstring.

    `metric` is the ROUGE type that ranks the per-example wins and losses (all four types are
    tested); `top` is how many of each to return, with their texts. Raises `RunMismatch` when the
    runs are not on the same dataset or share no scored example, `InvalidRequest` for a bad
    argument (``metric``, ``resamples`` above `max_resamples` (a caller's own cap, at most `MAX_RESAMPLES`),
    ``top``, ``runs``), ValueError for a malformed row.
    """
    if len(runs) < 2:
        raise InvalidRequest("runs", f"compare needs at least two runs, got {len(runs)}")
    if metric not in DEFAULT_ROUGE_TYPES:
        raise InvalidRequest("metric", f"must be one of {', '.join(DEFAULT_ROUGE_TYPES)}, got {metric!r}")
    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 100:
        raise InvalidRequest("top", f"must be an integer from 0 to 100, got {top!r}")
    _check_count("resamples", resamples, min(max_resamples, MAX_RESAMPLES))
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise InvalidRequest("runs", f"the runs need distinct names, got {names}")
    notes = _check_same_scoring(runs)
    by_id = [_rows_by_id(run) for run in runs]
    _check_same_dataset(runs, by_id)
    ids = sorted(by_id[0])
    paired = [i for i in ids if all(rows[i].get("rouge") for rows in by_id)]
    if not paired:
        raise RunMismatch("no example has ROUGE in every run (no references, or every example failed in some run)")
    scores = [_score_matrix(rows, paired) for rows in by_id]  # each (M, types)
    extra = [_metric_scores(rows, paired) for rows in by_id]  # each {(metric, score): (M,)}
    unpaired = [i for i in ids if i not in set(paired)]
    return {
        "metric": metric,
        "measure": MEASURE,
        "confidence": CONFIDENCE,
        "seed": seed,
        "resamples": resamples,
        "examples": len(ids),
        "paired": len(paired),
        "unpaired": len(unpaired),
        "unpaired_ids": unpaired[:10],
        "notes": notes,
        "runs": [_run_summary(run, rows, matrix, found) for run, rows, matrix, found in zip(runs, by_id, scores, extra)],
        "comparisons": [
            _with_metrics(_compare_pair(runs[0], runs[k], by_id[0], by_id[k], scores[0], scores[k], paired,
                                        metric=metric, resamples=resamples, seed=seed, top=top),
                          _compare_metrics(runs[0], runs[k], extra[0], extra[k], resamples, seed, notes))
            for k in range(1, len(runs))
        ],
    }  # fmt: skip


def _check_same_scoring(runs: Sequence[Run]) -> list[str]:
    """Refuse runs scored with other ROUGE settings than the baseline's (`RunMismatch` naming each field);
    the notes on what differs without changing a score, or is not recorded."""
    base = runs[0]
    notes = []
    for run in runs:
        if run.info.get("rouge_settings") is None:
            notes.append(f"{run.name} does not record its ROUGE settings (a run from before they were recorded): "
                         "compared as if scored with the defaults")
    base_settings = base.info.get("rouge_settings")
    for run in runs[1:]:
        settings = run.info.get("rouge_settings")
        if base_settings is None or settings is None:
            continue
        differing = settings_differences(base_settings, settings)
        if differing:
            named = "; ".join(f"rouge.{name}: {old} in {base.name}, {new} in {run.name}" for name, old, new in differing)
            raise RunMismatch(f"{base.name} and {run.name} were scored with other ROUGE settings ({named}), so their "
                              "numbers are not comparable; score both the same way (bart-opt score "
                              "--rouge-tokenizer/--rouge-lang rescoring a run's predictions.jsonl)")
        marked = settings_differences(base_settings, settings, (*INTERVAL_FIELDS, "backend", "backend_version"))
        notes += [f"rouge.{name}: {old} in {base.name}, {new} in {run.name} (the point estimates are comparable)"
                  for name, old, new in marked]
    return notes


def _rows_by_id(run: Run) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for number, row in enumerate(run.rows):
        if not isinstance(row, Mapping) or "id" not in row:
            raise ValueError(f"run {run.name}: row {number} is not a prediction row (no 'id')")
        key = str(row["id"])
        if key in rows:
            raise ValueError(f"run {run.name}: example {key!r} appears twice")
        rows[key] = dict(row)
    if not rows:
        raise ValueError(f"run {run.name} has no prediction rows")
    return rows


def _check_same_dataset(runs: Sequence[Run], by_id: Sequence[dict[str, dict]]) -> None:
    base, base_rows = runs[0].name, by_id[0]
    for run, rows in zip(runs[1:], by_id[1:]):
        only_base = sorted(base_rows.keys() - rows.keys())
        only_run = sorted(rows.keys() - base_rows.keys())
        if only_base or only_run:
            parts = [f"{len(ids)} examples only in {name} (first: {ids[0]!r})"
                     for name, ids in ((base, only_base), (run.name, only_run)) if ids]  # fmt: skip
            raise RunMismatch(f"{base} and {run.name} are not on the same dataset: {'; '.join(parts)}")
        for key in sorted(rows):
            if rows[key].get("reference") != base_rows[key].get("reference"):
                raise RunMismatch(
                    f"{base} and {run.name} are not on the same dataset: example {key!r} has different references"
                )


def _score_matrix(rows: Mapping[str, dict], ids: Sequence[str]) -> np.ndarray:
    """(M, types) F-measures of the examples `ids`."""
    try:
        return np.array([[float(rows[i]["rouge"][t][MEASURE]) for t in DEFAULT_ROUGE_TYPES] for i in ids])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"a prediction row has no usable ROUGE {MEASURE} ({error})") from None


def _metric_scores(rows: Mapping[str, dict], ids: Sequence[str]) -> dict[tuple[str, str], np.ndarray]:
    """Each score beyond ROUGE that every row of `ids` holds, as ``{(metric, score): (M,) values}``."""
    per_row = [row_scores(rows[i]) for i in ids]
    shared = [(name, score) for name, scores in per_row[0].items() if name != "rouge" for score in scores
              if all(score in found.get(name, {}) for found in per_row)]
    return {key: np.array([found[key[0]][key[1]] for found in per_row]) for key in shared}


def _run_summary(run: Run, rows: Mapping[str, dict], matrix: np.ndarray,
                 extra: Mapping[tuple[str, str], np.ndarray]) -> dict:
    metrics: dict[str, dict[str, float]] = {}
    for (name, score), values in extra.items():
        metrics.setdefault(name, {})[score] = mean(values)
    return {
        "name": run.name,
        "info": run.info,
        "examples": len(rows),
        "errors": sum(row.get("error") is not None for row in rows.values()),
        "rouge": {t: mean(matrix[:, j]) for j, t in enumerate(DEFAULT_ROUGE_TYPES)},
        "metrics": metrics,
        "signature": run.info.get("signature"),
        "warnings": list(run.info.get("warnings") or ()),
    }


def _significance(base: np.ndarray, run: np.ndarray, resamples: int, seed: int) -> dict:
    """One significance row: both means, the paired bootstrap's delta, interval and p, and randomization's p."""
    bootstrap = paired_bootstrap(run - base, resamples, seed)
    randomization = approximate_randomization(run - base, resamples, seed)
    return {"baseline": mean(base), "run": mean(run), "delta": bootstrap["delta"], "interval": bootstrap["interval"],
            "p_bootstrap": bootstrap["p"], "p_randomization": randomization["p"],
            "randomization": randomization["method"]}


def _compare_metrics(base: Run, run: Run, base_scores: Mapping[tuple[str, str], np.ndarray],
                     run_scores: Mapping[tuple[str, str], np.ndarray], resamples: int, seed: int,
                     notes: list[str]) -> dict[str, dict[str, dict]]:
    """``{metric: {score: significance row}}`` for every score beyond ROUGE both runs hold on the paired
    examples and score alike (a metric whose signatures differ is left out, and noted in `notes`)."""
    found: dict[str, dict[str, dict]] = {}
    skipped: set[str] = set()
    for name, score in base_scores:
        if (name, score) not in run_scores or name in skipped:
            continue
        before, now = _signature(base, name), _signature(run, name)
        if before is not None and now is not None and before != now:
            skipped.add(name)
            notes.append(f"{name}: scored otherwise in {base.name} and {run.name} ({before} / {now}), so it is "
                         "not compared")
            continue
        found.setdefault(name, {})[score] = _significance(base_scores[name, score], run_scores[name, score],
                                                          resamples, seed)
    return found


def _with_metrics(comparison: dict, metrics: Mapping[str, dict]) -> dict:
    """`comparison` with each metric's significance rows under its name, after ROUGE's, and the names."""
    rouge = comparison.pop("rouge")
    return {"baseline": comparison.pop("baseline"), "run": comparison.pop("run"), "metrics": ["rouge", *metrics],
            "rouge": rouge, **metrics, **comparison}


def _signature(run: Run, name: str) -> dict | None:
    """The recorded signature of metric `name` in `run`: its metrics' ``signatures``, else its run record's
    (None when not recorded)."""
    signatures = run.info.get("signatures") or (run.info.get("metrics") or {}).get("signatures") or {}
    return signatures.get(name)


def _compare_pair(base: Run, run: Run, base_rows: Mapping[str, dict], run_rows: Mapping[str, dict],
                  base_scores: np.ndarray, run_scores: np.ndarray, ids: Sequence[str], *,
                  metric: str, resamples: int, seed: int, top: int) -> dict:  # fmt: skip
    diffs = run_scores - base_scores  # (M, types)
    rouge = {rouge_type: _significance(base_scores[:, j], run_scores[:, j], resamples, seed)
             for j, rouge_type in enumerate(DEFAULT_ROUGE_TYPES)}
    column = diffs[:, DEFAULT_ROUGE_TYPES.index(metric)]  # (M,)
    order = sorted(range(len(ids)), key=lambda m: (-column[m], ids[m]))
    wins = [m for m in order if column[m] > _TIE][:top]
    losses = [m for m in reversed(order) if column[m] < -_TIE][:top]

    def example(m: int) -> dict:
        key, j = ids[m], DEFAULT_ROUGE_TYPES.index(metric)
        return {
            "id": key,
            "delta": float(column[m]),
            "reference": base_rows[key].get("reference"),
            "baseline": {"prediction": base_rows[key].get("prediction"), "score": float(base_scores[m, j])},
            "run": {"prediction": run_rows[key].get("prediction"), "score": float(run_scores[m, j])},
        }

    return {
        "baseline": base.name,
        "run": run.name,
        "rouge": rouge,
        "better": int(np.count_nonzero(column > _TIE)),
        "worse": int(np.count_nonzero(column < -_TIE)),
        "same": int(np.count_nonzero(np.abs(column) <= _TIE)),
        "wins": [example(m) for m in wins],
        "losses": [example(m) for m in losses],
    }


# ---- run folders and the text report -------------------------------------------------------------


def load_run(folder: str | Path) -> Run:
    """A ``bart-opt evaluate`` output folder as a `Run` named after the folder.

    Reads ``predictions.jsonl`` (every line a prediction row, checked by `bart_opt.evaluate.stored`) and, when present,
    ``run.json`` (system, model, generation, ROUGE settings, signature) and ``metrics.json`` (the run's
    own ROUGE intervals, its signature and warnings) into ``info``. Raises FileNotFoundError or
    ValueError naming the file and line at fault.
    """
    path = Path(folder)
    predictions = path / PREDICTIONS_FILE
    if not predictions.is_file():
        raise FileNotFoundError(f"{path} has no {PREDICTIONS_FILE}; give the --out folder of a bart-opt evaluate run")
    rows = read_rows(predictions, ComparedRow)
    info: dict = {"path": str(path)}
    for name, schema, keys in ((RUN_FILE, RunFile, ("system", "model", "generation", "rouge_settings", "metrics",
                                                    "signature")),
                               (METRICS_FILE, MetricsFile, ("rouge", "signature", "signatures", "warnings"))):
        if (path / name).is_file():
            content = read_json_file(path / name, schema)
            info.update({key: content.get(key) for key in keys if content.get(key) is not None or key not in info})
    return Run(name=path.name or str(path), rows=rows, info=info)


def format_report(result: dict) -> str:
    """The comparison as the plain-text tables ``bart-opt compare`` prints."""
    runs = result["runs"]
    lines = [
        f"{len(runs)} runs on the same {result['examples']} examples; {result['paired']} scored in every run"
        + (f" ({result['unpaired']} left out)" if result["unpaired"] else ""),
        f"ROUGE {result['measure']} (0-100), mean over those examples; {result['resamples']} resamples, "
        f"seed {result['seed']}; baseline: {runs[0]['name']}",
        "",
    ]
    width = max(10, *(len(run["name"]) for run in runs))
    lines.append("".join([f"{'run':<{width}}", *(f"{t:>11}" for t in DEFAULT_ROUGE_TYPES)]))
    for run in runs:
        lines.append("".join([f"{run['name']:<{width}}", *(f"{run['rouge'][t]:>11.2f}" for t in DEFAULT_ROUGE_TYPES)]))
    lines += [f"signature {run['name']}: {run['signature'] or 'not recorded'}" for run in runs]
    lines += [f"note: {note}" for note in result.get("notes", ())]
    lines += [f"warning: {run['name']}: {warning}" for run in runs for warning in run.get("warnings", ())]
    for comparison in result["comparisons"]:
        lines += ["", f"{comparison['run']} - {comparison['baseline']}: "
                      f"{comparison['better']} better, {comparison['worse']} worse, {comparison['same']} same "
                      f"on {result['metric']}",
                  f"{'metric':<10}{'delta':>9}  {'95% interval':<19}{'p bootstrap':>12}{'p random.':>12}"]  # fmt: skip
        for rouge_type, row in comparison["rouge"].items():
            low, high = row["interval"]
            interval = f"[{low:+.2f}, {high:+.2f}]"
            lines.append(f"{rouge_type:<10}{row['delta']:>+9.2f}  {interval:<19}"
                         f"{row['p_bootstrap']:>12.4f}{row['p_randomization']:>12.4f}")  # fmt: skip
        for name in comparison.get("metrics", ["rouge"])[1:]:
            for score, row in comparison[name].items():
                low, high = row["interval"]
                lines.append(f"{name}.{score}: {row['baseline']:.4g} -> {row['run']:.4g}, delta {row['delta']:+.4g} "
                             f"[{low:+.4g}, {high:+.4g}], p bootstrap {row['p_bootstrap']:.4f}, p random. "
                             f"{row['p_randomization']:.4f}")
        for title, examples in (("biggest wins", comparison["wins"]), ("biggest losses", comparison["losses"])):
            if examples:
                lines.append(f"{title} ({result['metric']}):")
                lines += [f"  {e['id']}: {e['delta']:+.2f} ({e['baseline']['score']:.2f} -> {e['run']['score']:.2f}) "
                          f"{_short(e['run']['prediction'])}" for e in examples]  # fmt: skip
    return "\n".join(lines)


def _short(text: str | None, limit: int = 80) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
