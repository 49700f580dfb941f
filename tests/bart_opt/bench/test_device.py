"""The device check (`python -m bart_opt.bench.device`) run on the CPU at the tiny size, as a lent machine
runs it at bart-large: its report's parts, the static search's row, and the commands of the CUDA parts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bart_opt.bench import device


def test_device_check_runs_on_the_cpu_and_writes_its_report(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        status = device.main(["--device", "cpu", "--size", "tiny", "--out", str(tmp_path),
                              "--parts", "ceilings,throughput,profiles"])
    finally:
        torch.set_num_threads(threads)
    assert status == 0
    report = json.loads((tmp_path / "device.json").read_text())
    assert report["ceilings"]["copy_tb_per_s"] > 0 and report["ceilings"]["matmul_tflop_per_s"] > 0
    rows = {(r["engine"], r["inputs"]): r for r in report["throughput"]}
    plan = device.Plan.for_run(torch.device("cpu"), "tiny")
    for inputs in plan.batches:
        for engine in ("transformers", "bart_opt", "bart_opt_static"):
            row = rows[engine, inputs]
            assert "error" not in row and row["docs_per_s"] == inputs / row["seconds"] and row["output_tokens"] > 0
        assert rows["bart_opt_static", inputs]["same_as_transformers"] == inputs  # float32, a tiny batch
    assert {e for e, i in rows if i in plan.larger} == {"bart_opt", "bart_opt_static"}, "the larger batch: ours only"
    assert report["profiles"] == {"bart_opt": None, "bart_opt_static": None}  # no GPU timeline on a CPU
    markdown = (tmp_path / "device.md").read_text()
    assert "| 2 | bart_opt_static |" in markdown and "no GPU timeline off CUDA" in markdown


def test_the_cuda_parts_run_the_cuda_tests_and_the_self_check(tmp_path):
    runs = device.commands(torch.device("cuda"), tmp_path)
    assert runs["tests"][:3] == [sys.executable, "-m", "pytest"] and "cuda" in runs["tests"]
    assert all(Path(f).is_file() for f in device.CUDA_TEST_FILES)
    assert runs["check"][-4:] == ["--device", "cuda", "--out", str(tmp_path / "check")]
    done = device.subprocess_part([sys.executable, "-c", "print('ran')"], timeout_s=60, log=tmp_path / "x.log")
    assert done["rc"] == 0 and "ran" in done["tail"] and (tmp_path / "x.log").read_text().strip() == "ran"
    slow = device.subprocess_part([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=1)
    assert slow["rc"] == "timeout"
