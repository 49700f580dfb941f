"""The evaluate-overlap benchmark script runs end to end and reports both paths."""

from __future__ import annotations

import re

from bart_opt.bench import evaluation as bench_evaluate


def test_bench_evaluate_prints_wall_and_model_time_of_both_paths(capsys):
    assert bench_evaluate.main(["--records", "3", "--repeats", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^\| (serial|evaluate) \| [\d.]+ \| [\d.]+ \| ([\d.]+)x \|$", out, flags=re.M))
    assert set(rows) == {"serial", "evaluate"}
    assert all(float(ratio) >= 1.0 for ratio in rows.values())  # wall time includes the model calls
