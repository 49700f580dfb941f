"""`bart-opt check` on CPU, at the reduced size CI runs: every check must pass."""

from __future__ import annotations

import json

import torch

from bart_opt import extras
from bart_opt.engine import hardware
from bart_opt.bench import check
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
    cpu = hardware.probe()
    assert f"CPU: {cpu.describe()}" in printed and f"torch ISA {torch.backends.cpu.get_cpu_capability()}" in printed
    assert "avx512_bf16 " in printed and "amx_bf16 " in printed
    for mode, verdict in hardware.fast_modes(cpu).items():
        assert f"| {mode} | {verdict} |" in printed
    assert report["cpu"]["torch_isa"] == torch.backends.cpu.get_cpu_capability()
    assert report["cpu"]["modes"] == hardware.fast_modes(cpu) and report["cpu"]["isa"] == cpu.isa


def test_cuda_memory_cap_accepts_a_device_without_an_index(monkeypatch):
    """`--device cuda` (no index) capped the memory with a device torch's setter refuses (seen on an H200)."""
    from types import SimpleNamespace

    from bart_opt.bench import check

    fractions = []

    def set_fraction(fraction, device=None):
        if isinstance(device, torch.device) and device.index is None:  # what torch's setter raises
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        fractions.append(fraction)

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1000)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=10**6))
    calls = []

    class Summarizer:
        def summarize(self, texts, **settings):
            calls.append(len(texts))
            capped = len(fractions) % 2 == 1
            return SimpleNamespace(memory={"peak_bytes": 4000}, errors=[None] * len(texts), oom_splits=int(capped),
                                   batches=[{"size": len(texts)}])

    outcome = check._real_cuda_oom(Summarizer(), ["a", "b"], {}, torch.device("cuda"))
    assert outcome.ok, outcome.detail
    assert fractions == [(1000 + 3000) / 10**6, 1.0], "capped at the weights plus 3/4 of the batch, then restored"
    assert calls == [2, 2]


def test_without_the_serve_extra_the_service_line_is_skipped_and_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(extras, "missing", lambda extra: ["fastapi", "uvicorn"] if extra == "serve" else [])
    outcome = check.check_service(torch.device("cpu"), tmp_path)
    assert outcome.ok and outcome.data == {"skipped": True} and not list(tmp_path.iterdir())
    assert outcome.detail == ("skipped: the service check needs fastapi, uvicorn, which this installation lacks: "
                              "pip install 'bart-opt[serve]'")
    assert f"| service | skipped | {outcome.detail} |" in check.format_table(torch.device("cpu"), [outcome])
