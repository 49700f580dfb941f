"""`bart-opt check` on CPU, at the reduced size CI runs: every check must pass."""

from __future__ import annotations

import json

import torch

from bart_opt.cli import main


def test_check_passes_on_cpu_and_writes_its_report(tmp_path, capsys):
    threads = torch.get_num_threads()
    # One thread: small models on a shared 2-core machine run far faster that way.
    assert main(["check", "--device", "cpu", "--threads", "1", "--out", str(tmp_path)]) == 0
    assert torch.get_num_threads() == threads
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["passed"] is True and report["device"] == "cpu"
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {"parity small float32", "parity small bfloat16", "out-of-memory split (injected: no CUDA)",
                           "memory tiny float32", "service"}
    for name in ("parity small float32", "parity small bfloat16"):
        beam, greedy = checks[name]["data"]["beam"], checks[name]["data"]["greedy"]
        assert beam["exact"]["identical"] == beam["exact"]["total"] == 4
        assert greedy["exact"]["identical"] == greedy["exact"]["total"] == 4
        assert 0 <= beam["default"]["identical"] <= 4
    assert checks["out-of-memory split (injected: no CUDA)"]["data"]["oom_splits"] >= 1
    memory = checks["memory tiny float32"]["data"]["ratios"]
    assert memory["generate_9"]["exact"]["outputs_equal"] is True and memory["generate_9"]["peak"] < 1
    assert checks["service"]["data"]["status"] == 200
    printed = capsys.readouterr().out
    assert "| parity small float32 | pass |" in printed and "| service | pass |" in printed
