"""The dispatch-count bench (`python -m bart_opt.bench.dispatch`) at a tiny size: its table's rows hold."""

from __future__ import annotations

import json

import torch

from bart_opt.bench import dispatch
from bart_opt.static_generation import CHECK_EVERY


def test_tiny_dispatch_bench_counts_ops_and_syncs_per_mode(tmp_path, capsys):
    out = tmp_path / "dispatch.json"
    assert dispatch.main(["--shape", "tiny", "--inputs", "3", "--max-len", "16", "--min-length", "10",
                          "--max-length", "24", "--json", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == list(dispatch.MODES)
    static, gpu, cpu = (rows[m] for m in dispatch.MODES)
    assert gpu["steps"] == cpu["steps"] >= 10
    assert gpu["steps"] <= static["steps"] < gpu["steps"] + CHECK_EVERY, "steps past the end: until the next check"
    assert static["ids"] == gpu["ids"], "the static search gives the default's ids here"
    assert gpu["loop_syncs_per_step"] >= 3.5 and cpu["loop_syncs_per_step"] >= 3.5  # 4 a step, minus the last
    assert static["loop_syncs"] <= static["steps"] // CHECK_EVERY + 2
    for r in rows.values():
        assert r["decode_ops_per_step"] > 0 and r["search_ops_per_step"] > 0
        assert r["ops_per_step"] == r["decode_ops_per_step"] + r["search_ops_per_step"]
        assert r["syncs"] == sum(r["sync_ops"].values()) >= r["loop_syncs"]
    assert "nonzero" not in str([k for k in static["sync_ops"] if not k.startswith("prepare")])
    printed = capsys.readouterr().out
    for mode in dispatch.MODES:
        assert f"| {mode} | {rows[mode]['steps']} |" in printed


def test_the_counter_sees_syncs_and_skips_views():
    with torch.inference_mode(), dispatch.DispatchCounter() as counter:
        x = torch.arange(6).view(2, 3).t()
        int(x.sum())
        bool((x > 2).any())
        x.nonzero()
    ops = counter.ops["prepare"]
    assert "view" not in ops and "t" not in ops and ops["arange"] == 1
    assert counter.syncs == {"prepare: item": 1, "prepare: is_nonzero": 1, "prepare: nonzero": 1}
