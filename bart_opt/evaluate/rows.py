"""The one shape of a stored prediction row, and `RowBatch`: rows written together.

A prediction row is ``{"id", "prediction", "reference", "rouge", "error", "input_tokens",
"output_tokens", "truncated", "padding_computed", "padding_avoided", "seconds",
"batch_peak_bytes"}``: ``seconds`` is the row's share of its batch's tokenize/generate/decode/
score time, ``batch_peak_bytes`` the memory peak of its batch. A record without a summary (refused
before the model, or failed by it) has the reason as its ``error``, an empty prediction and no
ROUGE; once tokenized it keeps its token count. A baseline's rows have only ``id``,
``prediction``, ``reference``, ``rouge``, ``error`` and ``seconds``.

A row scored with ROUGE also carries, when the run scores metrics beyond ROUGE (`add_scores`),
``scores``: ``{metric name: {score name: value}}``, e.g. ``{"extractive": {"coverage": 0.93, ...},
"length": {"tokens": 41.0, "sentences": 3.0}}``. ROUGE itself stays in ``rouge``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bart_opt.pipeline.data import Record
from bart_opt.pipeline.results import Encoded
from bart_opt.scoring.base import Example, Metric

MODEL, FAILED, REFUSED, SCORED = "model", "failed", "refused", "scored"  # the kinds of `RowBatch`


def prediction_row(record: Record, summary: str, item: Mapping[str, Any], batch_peak_bytes: int,
                   extra_seconds: float = 0.0) -> dict:
    """The stored row of one record from its summary and its `SummaryResult.items` entry
    (`extra_seconds`: work on it outside the batch, such as its share of tokenizing)."""
    return {
        "id": record.id,
        "prediction": summary,
        "reference": record.reference,
        "rouge": item["rouge"],
        "error": item["error"],
        "input_tokens": item["input_tokens"],
        "output_tokens": item["output_tokens"],
        "truncated": item["truncated"],
        "padding_computed": item["padding_computed"],
        "padding_avoided": item["padding_avoided"],
        "seconds": sum(item["timing"].values()) + extra_seconds,
        "batch_peak_bytes": batch_peak_bytes,
    }


def refused_row(record: Record, reason: str, encoded: Encoded | None = None) -> dict:
    """The stored row of a record without a summary: refused before the model (too long, not
    valid text) or failed by it (`encoded`: its tokens, once tokenized). Left out of ROUGE."""
    return {
        "id": record.id, "prediction": "", "reference": record.reference, "rouge": None, "error": reason,
        "input_tokens": len(encoded.ids) if encoded is not None else 0, "output_tokens": 0,
        "truncated": encoded.truncated if encoded is not None else False, "padding_computed": 0,
        "padding_avoided": 0, "seconds": 0.0, "batch_peak_bytes": 0,
    }


def baseline_row(record: Record, prediction: str, rouge: dict | None, seconds: float) -> dict:
    """The stored row of a baseline's summary (a baseline has no tokens, padding or memory)."""
    return {"id": record.id, "prediction": prediction, "reference": record.reference, "rouge": rouge,
            "error": None, "seconds": seconds}


def add_scores(rows: Sequence[dict], metrics: Sequence[Metric], sources: Mapping[str, str | None]) -> None:
    """Score the rows that have ROUGE with each of `metrics` (not ROUGE: the pipeline scored it), in place:
    ``row["scores"][metric.name]``, each row's share of the time added to its ``seconds``. `sources` maps a
    row's id to its source text (None, or absent: not known, as for another system's predictions)."""
    scored = [row for row in rows if row.get("rouge") is not None]
    if not metrics or not scored:
        return
    start = time.perf_counter()
    examples = [Example(row["prediction"], row["reference"] if isinstance(row["reference"], str)
                        else tuple(row["reference"]), sources.get(row["id"])) for row in scored]
    for metric in metrics:
        for row, scores in zip(scored, metric.score(examples), strict=True):
            row.setdefault("scores", {})[metric.name] = scores
    share = (time.perf_counter() - start) / len(scored)
    for row in scored:
        row["seconds"] += share


@dataclass
class RowBatch:
    """Prediction rows stored together, and where they come from.

    kind: `MODEL` (the rows of one model call), `FAILED` (one record the model failed on alone),
        `REFUSED` (records refused before the model) or `SCORED` (another system's predictions,
        scored without a model: `bart_opt.evaluate.external.ScoringExecutor`).
    positions: each row's record position in its source.
    peak_bytes / seconds: the memory peak of the planned batch the call was in, and the call's
        device seconds (`MODEL` only).
    replica / started_at / finished_at: the Ray replica that ran it (``ip:pid``), when its call
        began and when this batch ended (``time.time()`` there); None in one process.
    """

    rows: list[dict]
    positions: list[int]
    kind: str = MODEL
    peak_bytes: int = 0
    seconds: float = 0.0
    replica: str | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def model_call(self) -> bool:
        """Whether the rows came out of a model call (a batch the store counts as one)."""
        return self.kind == MODEL

    def subset(self, keep: list[int]) -> RowBatch:
        """The batch with only the rows at indexes `keep`."""
        return replace(self, rows=[self.rows[k] for k in keep], positions=[self.positions[k] for k in keep])


__all__ = ["FAILED", "MODEL", "REFUSED", "SCORED", "RowBatch", "add_scores", "baseline_row", "prediction_row",
           "refused_row"]
