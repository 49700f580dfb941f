"""The shared interval: `aggregate` of dicts and `aggregate_columns` of a packed matrix agree."""

from __future__ import annotations

import numpy as np
import pytest

from bart_opt.scoring.base import aggregate, aggregate_columns


def test_aggregate_columns_is_aggregate_of_the_same_scores():
    rng = np.random.default_rng(1)
    matrix = rng.random((57, 3)) * 10  # (N, K)
    per_example = [{"a": row[0], "b": row[1], "c": row[2]} for row in matrix]
    assert aggregate(per_example, bootstrap_samples=300, seed=4) == aggregate_columns(
        ["a", "b", "c"], matrix, bootstrap_samples=300, seed=4)
    found = aggregate(per_example, bootstrap_samples=300, seed=4)["b"]
    assert found["low"] < found["mid"] < found["high"] and found["mid"] == pytest.approx(matrix[:, 1].mean())


def test_zero_examples_are_refused():
    with pytest.raises(ValueError, match="zero examples"):
        aggregate_columns(["a"], np.empty((0, 1)))
