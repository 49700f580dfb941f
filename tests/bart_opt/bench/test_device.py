"""The device check (`python -m bart_opt.bench.device`) run on the CPU at the tiny size, as a lent machine
runs it at bart-large: its report's parts, the static search's and EL-attention's rows, each mode's
largest-batch probe, and the commands of the CUDA parts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import BartConfig

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
        for engine in ("transformers", *device.MODES):
            row = rows[engine, inputs]
            assert "error" not in row and row["docs_per_s"] == inputs / row["seconds"] and row["output_tokens"] > 0
        for engine in device.MODES:  # float32, a tiny batch: the static search and EL-attention give transformers' ids
            assert rows[engine, inputs]["same_as_transformers"] == inputs, engine
    probes = [r for r in report["throughput"] if r.get("probe")]
    # The tiny model's peaks predict far more than the plan's cap fits in its 1 GiB: every mode runs at the cap.
    assert [(r["engine"], r["inputs"], r.get("largest")) for r in probes] == [
        (name, plan.probe_cap, True) for name in device.PROBE_ORDER]
    assert report["profiles"] == {name: None for name in device.MODES}  # no GPU timeline on a CPU
    markdown = (tmp_path / "device.md").read_text()
    assert "| 2 | bart_opt_el_static |" in markdown and "no GPU timeline off CUDA" in markdown
    assert f"| {plan.probe_cap} | bart_opt_el (largest) |" in markdown
    el = rows["bart_opt_el", 2]["docs_per_s"] / rows["bart_opt", 2]["docs_per_s"]
    assert f"| 2 | {rows['bart_opt_static', 2]['docs_per_s'] / rows['bart_opt', 2]['docs_per_s']:.2f}x | {el:.2f}x |" \
        in markdown


def test_the_predicted_largest_batch_follows_the_peaks_line():
    plan = device.Plan.for_run(torch.device("cuda"), "large")
    rows = [{"inputs": 48, "peak_bytes": 1_000}, {"inputs": 128, "peak_bytes": 2_600}]  # 20 bytes an input
    assert device.predicted_batch(rows, 10_000, plan) == 128 + (9_000 - 2_600) // 20  # 448, a multiple of 8
    assert device.predicted_batch(rows, 10_100, plan) == 448  # 452 rounded down to a multiple of 8
    assert device.predicted_batch(rows, 10**9, plan) == plan.probe_cap
    assert device.predicted_batch(rows, 2_800, plan) is None  # no larger than 128 fits
    assert device.predicted_batch([rows[0], {"inputs": 128, "error": "OutOfMemoryError"}], 10**9, plan) is None


def test_a_probe_that_does_not_fit_retries_at_four_fifths(monkeypatch):
    plan = device.Plan.for_run(torch.device("cpu"), "tiny")  # batches (1, 2), cap 4
    tried = []

    def throughput(name, model, mode, batch, dev, plan, reference):
        inputs = batch["input_ids"].shape[0]
        tried.append(inputs)
        return {"engine": name, "inputs": inputs, **({"error": "OutOfMemoryError"} if inputs > 3 else {})}

    monkeypatch.setattr(device, "throughput", throughput)
    model = type("Model", (), {"config": BartConfig(vocab_size=100)})()  # what `make_batch` reads
    rows = [{"engine": "bart_opt", "inputs": n, "peak_bytes": 100 * n} for n in plan.batches]
    got = device.probe("bart_opt", model, rows, torch.device("cpu"), plan, deadline=float("inf"))
    assert tried == [4, 3]
    assert [(r["inputs"], "error" in r, r.get("largest")) for r in got] == [(4, True, None), (3, False, True)]
    assert device.probe("bart_opt", model, rows, torch.device("cpu"), plan, deadline=0.0) == []  # time is up


def test_the_cuda_parts_run_the_cuda_tests_and_the_self_check(tmp_path):
    runs = device.commands(torch.device("cuda"), tmp_path)
    assert runs["tests"][:3] == [sys.executable, "-m", "pytest"] and "cuda" in runs["tests"]
    assert all(Path(f).is_file() for f in device.CUDA_TEST_FILES)
    assert runs["check"][-4:] == ["--device", "cuda", "--out", str(tmp_path / "check")]
    done = device.subprocess_part([sys.executable, "-c", "print('ran')"], timeout_s=60, log=tmp_path / "x.log")
    assert done["rc"] == 0 and "ran" in done["tail"] and (tmp_path / "x.log").read_text().strip() == "ran"
    slow = device.subprocess_part([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=1)
    assert slow["rc"] == "timeout"
