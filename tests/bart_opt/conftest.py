"""Fixtures of the engine tests: the published fidelity batch, shared by every agreement test of a session."""

from __future__ import annotations

import pytest

from bart_opt.bench.fidelity import SHAPES
from tests.bart_opt.agreement import PublishedBatch


@pytest.fixture(scope="session")
def d256(make_checkpoint) -> str:
    """The published fidelity workload's random checkpoint: d_model 256, 3+3 layers, init_std 0.2 (peaked,
    input-dependent outputs), no EOS bias (outputs run to 40 new tokens)."""
    return make_checkpoint(with_tokenizer=False, init_std=0.2, eos_bias=0.0, **SHAPES["d256"])


@pytest.fixture(scope="session")
def published_batch(d256):
    """`published_batch(dtype)`: the `PublishedBatch` in that dtype, built once per session."""
    cache: dict[str, PublishedBatch] = {}

    def get(dtype: str) -> PublishedBatch:
        if dtype not in cache:
            cache[dtype] = PublishedBatch(d256, dtype)
        return cache[dtype]

    return get
