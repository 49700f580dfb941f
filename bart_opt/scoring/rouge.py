"""ROUGE as one `bart_opt.scoring.base.Metric`, over `bart_opt.pipeline.rouge.RougeSettings` and its `RougeScorer`.

ROUGE keeps its own place in every file (contract): a row's ``rouge`` holds ``{type: {precision,
recall, fmeasure}}`` and ``metrics.json``'s ``rouge`` holds ``{type: {low, mid, high}}`` of those,
scored inside the summarizer's pipeline as before. `RougeMetric` is the same scorer behind the
metric interface, for what reads every metric alike: its flat per-example scores are
``{"rouge1.fmeasure": ..., "rouge1.precision": ..., ...}`` (`flat`), and `aggregate` gives exactly
`RougeScorer.aggregate`'s numbers (the same matrix, the same bootstrap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bart_opt.pipeline.rouge import MEASURES, RougeSettings
from bart_opt.scoring.base import Example


def flat(score: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """A row's nested ROUGE (``{type: {measure: value}}``) as flat scores ``{"type.measure": value}``."""
    return {f"{rouge_type}.{measure}": float(values[measure]) for rouge_type, values in score.items()
            for measure in MEASURES}


def nested(scores: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """`flat`'s inverse: ``{"type.measure": value}`` back to ``{type: {measure: value}}``."""
    found: dict[str, dict[str, float]] = {}
    for key, value in scores.items():
        rouge_type, measure = key.split(".")
        found.setdefault(rouge_type, {})[measure] = value
    return found


class RougeMetric:
    """ROUGE of `settings` (default: `RougeSettings()`) as a metric; references as `RougeScorer.score_any` takes them."""

    name = "rouge"
    needs_model = False

    def __init__(self, settings: RougeSettings | None = None):
        self.settings = settings or RougeSettings()
        self.scorer = self.settings.scorer()

    def signature(self) -> dict[str, Any]:
        """The ROUGE settings as run records hold them (`RougeSettings.to_dict`) and their signature line."""
        return {**self.settings.to_dict(), "signature": self.settings.signature()}

    def score(self, examples: Sequence[Example]) -> list[dict[str, float]]:
        return [flat(self.scorer.score_any(e.prediction, e.reference)) for e in examples]

    def aggregate(self, per_example: Sequence[Mapping[str, float]]) -> dict[str, dict[str, dict[str, float]]]:
        """``metrics.json``'s ``rouge`` (``{type: {low, mid, high}}``) of flat per-example scores: `RougeScorer.aggregate`."""
        return self.scorer.aggregate([nested(scores) for scores in per_example])


__all__ = ["RougeMetric", "flat", "nested"]
