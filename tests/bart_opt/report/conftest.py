"""Run folders the report tests read, made once per session by the command line: a tiny random model with
lead-3 beside it and a lead-3 run on the same records, and a lead-3 run on other records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bart_opt.cli import main
from bart_opt.demo import random_article

GEN = ["--max-length", "12", "--min-length", "3", "--num-beams", "2"]


def write_records(path: Path, seed: int, count: int) -> Path:
    rng = random.Random(seed)
    rows = [{"id": f"doc-{i}", "article": random_article(rng, 4 + i % 3), "highlights": random_article(rng, 2)}
            for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def report_runs(demo_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """``model`` (the random demo checkpoint, 5 records in batches of 2, lead-3 beside it), ``lead`` (lead-3 on
    the same records) and ``other`` (lead-3 on other records)."""
    root = tmp_path_factory.mktemp("report-runs")
    data = write_records(root / "data.jsonl", seed=3, count=5)
    other = write_records(root / "other.jsonl", seed=4, count=3)
    runs = {"model": root / "model", "lead": root / "lead", "other": root / "other"}
    argv = {
        "model": ["--model", demo_checkpoint, "--data", str(data), *GEN, "--max-batch-size", "2", "--device", "cpu",
                  "--no-progress", "--baselines", "lead-3"],
        "lead": ["--model", "lead-3", "--data", str(data)],
        "other": ["--model", "lead-3", "--data", str(other)],
    }
    for name, args in argv.items():  # ROUGE only: the tests add the other metrics they need by hand
        assert main(["evaluate", *args, "--metrics", "rouge", "--out", str(runs[name])]) == 0
    return runs
