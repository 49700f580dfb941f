"""The device check (`python -m bart_opt.bench.device`) on the CPU at the tiny size, as a lent machine runs it
at bart-large: its gates, speed rows and probe written as they end, and what it does when a task raises,
crashes, hangs past its timeout or meets the end of the budget (the JSON keeps every row that finished)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bart_opt.bench import device, device_tasks


def test_the_check_runs_on_the_cpu_and_writes_each_row_as_it_ends(tmp_path, capsys):
    status = device.main(["--device", "cpu", "--size", "tiny", "--out", str(tmp_path), "--parts", "gates,speed,probes",
                          "--engines", "bart_opt_static"])
    assert status == 0
    report = json.loads((tmp_path / "device.json").read_text())
    rows = report["rows"]
    assert [r["task"] for r in rows][:1] == ["checkpoints"] and report["failed"] == []
    gates = {r["gate"]: r for r in rows if "gate" in r}
    assert set(gates) == {"graphs", "lengths", "float32"} and all(g["passed"] for g in gates.values()), gates
    assert gates["graphs"]["captures"] >= 1 and gates["float32"]["same"] == gates["float32"]["inputs"] == 2
    assert set(gates["lengths"]["totals"]) == {"static", "default", "transformers"}
    plan = device.Plan.for_run("cpu", "tiny")
    speed = [r for r in rows if r["task"] == "speed:bart_opt_static"]
    assert [r["inputs"] for r in speed] == list(plan.batches)
    for r in speed:
        assert r["docs_per_s"] == r["inputs"] / r["seconds"] and r["output_tokens"] > 0
        assert r["steps"] > 0 and "captures" not in r, "steps counted; no graphs off CUDA"
    probe = next(r for r in rows if r["task"] == "probe:bart_opt_static")
    assert probe["inputs"] == plan.probe_cap and probe["largest"] is True  # 1 GiB holds far more than the cap
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line.startswith("speed:bart_opt_static at ")][-1].startswith(
        f"speed:bart_opt_static at {plan.batches[-1]}: ")
    assert printed[-1].startswith("device check: every part passed")
    markdown = (tmp_path / "device.md").read_text()
    assert "| graphs | yes |" in markdown and f"| {plan.batches[-1]} | bart_opt_static |" in markdown
    assert {p.name for p in tmp_path.iterdir()} == {"device.json", "device.md", "workers.log"}


def test_a_task_that_raises_keeps_its_traceback_and_fails_the_run(tmp_path):
    runner = _runner(tmp_path, faults={"speed:bart_opt": "raise"})
    rows = runner.run("speed:bart_opt", "speed")
    assert len(rows) == 1 and rows[0]["error"] == "RuntimeError: injected failure in speed:bart_opt"
    assert rows[0]["traceback"].startswith("Traceback") and "device_tasks.py" in rows[0]["traceback"]
    saved = json.loads((runner.report.out / "device.json").read_text())
    assert saved["failed"] == [f"speed:bart_opt: {rows[0]['error']}"]
    assert "**FAILED**: speed:bart_opt" in (runner.report.out / "device.md").read_text()
    assert device.failures([{"task": "gates", "gate": "graphs", "passed": False}]) == ["gate graphs FAILED"]


def _runner(tmp_path: Path, budget_s: float = 60.0, timeout_s: float | None = None, faults=None) -> device.Runner:
    out = tmp_path / "out"
    out.mkdir()
    (out / "workers.log").write_text("")
    report = device.Report(out, {"device": "cpu", "budget_s": budget_s, "plan": {"size": "tiny", "dtype": "float32"},
                                 "parts": []})
    work = tmp_path / "work"
    work.mkdir()
    return device.Runner(report, device.Plan.for_run("cpu", "tiny"), "cpu", work, time.monotonic() + budget_s,
                         faults or {}, timeout_s)


def test_a_task_that_crashes_keeps_its_traceback(tmp_path):
    runner = _runner(tmp_path, faults={"speed:bart_opt": "crash"})
    rows = runner.run("speed:bart_opt", "speed")
    assert rows == runner.report.rows and rows[0]["error"] == "exit status 1"
    assert "RuntimeError: injected crash in speed:bart_opt" in rows[0]["traceback"]
    assert "Traceback" in (runner.report.out / "workers.log").read_text()


def test_a_task_that_hangs_is_killed_at_its_timeout_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "MIN_TASK_S", 0.5)
    runner = _runner(tmp_path, timeout_s=2, faults={"speed:bart_opt": "hang", "speed:bart_opt_static": "raise"})
    start = time.monotonic()
    hung = runner.run("speed:bart_opt", "speed")
    assert 2 <= time.monotonic() - start < 10
    assert [r["error"].split(" after")[0] for r in hung] == ["timeout"]
    after = runner.run("speed:bart_opt_static", "speed")
    assert "injected failure" in after[0]["error"], "the next task starts in a process of its own"
    saved = json.loads((runner.report.out / "device.json").read_text())["rows"]
    assert [r["task"] for r in saved] == ["speed:bart_opt", "speed:bart_opt_static"]


def test_a_budget_that_runs_out_keeps_the_rows_that_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "MIN_TASK_S", 0.5)
    runner = _runner(tmp_path, budget_s=3, faults={"speed:bart_opt": "row-then-hang"})
    start = time.monotonic()
    rows = runner.run("speed:bart_opt", "speed")  # its cap is 240 s: the budget's end stops it
    assert time.monotonic() - start < 8
    assert rows[0] == {"task": "speed:bart_opt", "injected": True, "finished": True} and "timeout" in rows[1]["error"]
    skipped = runner.run("speed:bart_opt_static", "speed")
    runner.tests()
    assert skipped[0]["skipped"].startswith("budget") and runner.report.rows[-1]["skipped"].startswith("budget")
    saved = json.loads((runner.report.out / "device.json").read_text())
    assert saved["rows"][0]["finished"] is True and len(saved["rows"]) == 4
    assert saved["failed"] == [f"speed:bart_opt: {rows[1]['error']}"]


def test_the_environment_block_and_the_ceilings(tmp_path):
    spec = {"task": "env", "device": "cpu", "plan": vars(device.Plan.for_run("cpu", "tiny")),
            "rows": str(tmp_path / "rows.jsonl")}
    device_tasks.environment(spec)
    row = json.loads((tmp_path / "rows.jsonl").read_text())
    assert row["transformers_tested"] == device.TESTED_TRANSFORMERS and row["torch"] and row["cuda"] is None
    assert row["ceilings"]["copy_tb_per_s"] > 0 and row["ceilings"]["matmul_tflop_per_s"] > 0
    assert f"transformers {row['transformers']} (tested {device.TESTED_TRANSFORMERS})" in device.line(row)
    assert "transformers 5" in device.format_report({"device": "cpu", "budget_s": 1, "plan": spec["plan"],
                                                     "failed": [], "rows": [row]})


def test_the_tested_transformers_is_the_one_installed_here():
    import transformers

    assert transformers.__version__ == device.TESTED_TRANSFORMERS, "update TESTED_TRANSFORMERS and pyproject's note"


def test_the_predicted_largest_batch_follows_the_peaks_line():
    peaks = [(48, 1_000), (128, 2_600)]  # 20 bytes an input
    assert device_tasks.predicted_batch(peaks, 10_000, 2048) == 128 + (9_000 - 2_600) // 20  # 448, a multiple of 8
    assert device_tasks.predicted_batch(peaks, 10_100, 2048) == 448  # 452 rounded down to a multiple of 8
    assert device_tasks.predicted_batch(peaks, 10**9, 2048) == 2048
    assert device_tasks.predicted_batch(peaks, 2_800, 2048) is None  # no larger than 128 fits


def test_the_parts_and_the_cuda_tests_named():
    assert device.PARTS == ("env", "gates", "speed", "profiles", "probes", "tests")
    assert all(Path(f).is_file() for f in device.CUDA_TEST_FILES)
    with pytest.raises(SystemExit):
        device.main(["--out", "/tmp/x", "--fault", "speed:bart_opt=explode"])
    import torch

    if not torch.cuda.is_available():
        assert device.main(["--out", "/tmp/x"]) == 2  # no CUDA here: said so, nothing run
