"""The one interface every metric implements, and the one interval they all share.

A metric scores examples (`Example`: a prediction, its reference or references, and the source
where it is known) into per-example scores, a flat mapping of score names to floats
(``{"coverage": 0.91, "density": 3.2}``). Every metric's corpus figure is then `aggregate`'s:
the mean over examples (``mid``, summed exactly) and the 2.5th and 97.5th percentiles of seeded
bootstrap means (``low``, ``high``), the same arithmetic ROUGE's interval uses
(`bart_opt.pipeline.rouge.RougeScorer.aggregate` calls `bootstrap_interval`).

A metric also says what decides its numbers (`Metric.signature`: its settings and the versions
of what it runs on, recorded with every run as ROUGE's settings are) and whether it runs a model
(`Metric.needs_model`: those run on the device and are off by default).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

CONFIDENCE = 0.95
_CHUNK_FLOATS = 2_000_000  # bootstrap resamples are drawn in chunks of about this many floats


@dataclass(frozen=True)
class Example:
    """One scored example: the prediction, its reference (a str) or references (a tuple), and the
    source text where it is known (``None`` for predictions scored without their inputs)."""

    prediction: str
    reference: str | tuple[str, ...]
    source: str | None = None


class Metric(Protocol):
    """What every metric implements (ROUGE, length, extractive, BERTScore, consistency).

    name: the metric's key in ``metrics.json`` and in ``--metrics`` (``rouge``, ``bertscore``, ...).
    needs_model: whether scoring runs a model (on the device, with its memory logged).
    """

    name: str
    needs_model: bool

    def signature(self) -> dict[str, Any]:
        """The settings and versions that decide this metric's numbers, as recorded with a run."""
        ...

    def score(self, examples: Sequence[Example]) -> list[dict[str, float]]:
        """One flat ``{score name: value}`` per example, in order; a batch so a model metric batches."""
        ...


def mean(values: Sequence[float] | np.ndarray) -> float:
    """The point estimate of per-example scores: their mean, summed exactly (order does not matter)."""
    return math.fsum(float(v) for v in values) / len(values)


def bootstrap_interval(matrix: np.ndarray, samples: int, seed: int,
                       confidence: float = CONFIDENCE) -> np.ndarray:
    """Percentiles (low, high) of `samples` bootstrap means of each column; returns shape (2, K).

    matrix: (N, K) per-example scores. Draws from a fresh `numpy.random.default_rng(seed)`, so a
    call is reproducible; resamples go in chunks so memory stays near a few million floats for any N.
    """
    n, k = matrix.shape
    rng = np.random.default_rng(seed)
    means = np.empty((samples, k))  # (S, K)
    chunk = max(1, _CHUNK_FLOATS // (n * k))
    for start in range(0, samples, chunk):
        stop = min(start + chunk, samples)
        idx = rng.integers(0, n, size=(stop - start, n))  # (s, N)
        means[start:stop] = matrix[idx].mean(axis=1)  # (s, N, K) -> (s, K)
    tail = 100 * (1 - confidence) / 2
    return np.percentile(means, [tail, 100 - tail], axis=0)  # (2, K)


def aggregate(per_example: Sequence[Mapping[str, float]], *, bootstrap_samples: int = 1000,
              seed: int = 0) -> dict[str, dict[str, float]]:
    """``{score name: {"low", "mid", "high"}}`` over per-example scores (as `Metric.score` returns).

    Every example must carry the same score names (those of the first). Raises ValueError for
    zero examples or an example that lacks a score.
    """
    if len(per_example) == 0:
        raise ValueError("cannot aggregate a metric over zero examples")
    names = list(per_example[0])
    for i, item in enumerate(per_example):
        missing = [name for name in names if name not in item]
        if missing:
            raise ValueError(f"example {i} lacks the scores {missing}; it has {sorted(item)}")
    matrix = np.asarray([[float(item[name]) for name in names] for item in per_example],
                        dtype=np.float64)  # (N, K)
    return aggregate_columns(names, matrix, bootstrap_samples=bootstrap_samples, seed=seed)


def aggregate_columns(names: Sequence[str], matrix: np.ndarray, *, bootstrap_samples: int = 1000,
                      seed: int = 0) -> dict[str, dict[str, float]]:
    """`aggregate` of per-example scores already packed as a (N, K) matrix, column k holding score ``names[k]``
    (what a run's streamed aggregation holds); the same numbers as `aggregate` of the same scores."""
    if matrix.shape[0] == 0:
        raise ValueError("cannot aggregate a metric over zero examples")
    low, high = bootstrap_interval(matrix, bootstrap_samples, seed)  # each (K,)
    return {name: {"low": float(low[k]), "mid": mean(matrix[:, k]), "high": float(high[k])}
            for k, name in enumerate(names)}


__all__ = ["CONFIDENCE", "Example", "Metric", "aggregate", "aggregate_columns", "bootstrap_interval", "mean"]
